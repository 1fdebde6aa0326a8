//! The server of a one-sided round trip: registers its region, answers each round trip's
//! notification with its own transfer, and at the end checks that its gaps were left alone.

use super::buffers::{complement, Placement, RegisteredBuffer, GAP_BYTE};
use super::layout::BlockLayout;
use super::protocol::{self, Incoming, Issuer, DONE, SKIPPED};
use super::{OneSided, Side, SkipTransfer};
use crate::digest::source_pattern;
use crate::roundtrip::RoundTripOptions;
use crate::BenchError;
use ferrylink::transport::{Access, Context, Endpoint};

/// Serves one client's one-sided run on `ep`: registers the server's region (the
/// complement of the source pattern in its blocks, [`GAP_BYTE`] in its gaps), the setup,
/// then for each round trip waits for the client's notification and answers with its own
/// transfer and notification (keeping the next round trip's wait posted meanwhile). Waits
/// for the client's end (its checks may read this region until then), then checks the
/// gaps.
pub fn serve(ctx: &Context, ep: &Endpoint, o: &RoundTripOptions) -> Result<(), BenchError> {
    let op = o.op.one_sided().ok_or_else(|| BenchError::Usage("--op send is not a one-sided round trip".into()))?;
    let layout = BlockLayout::new(o.n_bytes, o.blocks).map_err(BenchError::Usage)?;
    let placement = Placement { object_type: o.object_type, memory: o.memory, dev: o.server_dev };
    let initial = layout.scatter(&complement(&source_pattern(o.n_bytes)), GAP_BYTE);
    // The client writes this region (put) or reads it (get).
    let access = match op {
        OneSided::Put => Access::Write,
        OneSided::Get => Access::Read,
    };
    let region = RegisteredBuffer::new(ctx, placement, &initial, access, "the server's region")?;
    drop(initial);
    let client = protocol::server_setup(ep, op, &layout, region.registration().key())?;
    let issuer = Issuer::new(ep, op, (region.registration(), &client), layout.server_spans(), o.prepared)?;
    let skip = o.skip_transfer;
    let post = |i: usize| Incoming::post(ep, SkipTransfer::skips(skip, Side::Client, i));
    let mut posted = (o.total() > 0).then(|| post(0));
    for i in 0..o.total() {
        let incoming = posted.take().unwrap_or_else(|| post(i));
        incoming.wait(i)?;
        // The answer goes first; the next round trip's wait is posted while it runs.
        let issued = if SkipTransfer::skips(skip, Side::Server, i) {
            protocol::send_header(ep, SKIPPED)
                .map_err(|e| BenchError::Transport(format!("round trip {i}: test hook: telling the client: {e}")))?;
            None
        } else {
            Some(issuer.issue(ep, op, (region.registration(), &client), Some(protocol::note(i))))
        };
        if i + 1 < o.total() {
            posted = Some(post(i + 1));
        }
        if let Some(request) = issued {
            request.wait().map_err(|e| BenchError::Transport(format!("round trip {i}: the server's {op}: {e}")))?;
        }
    }
    let end = ep.recv().wait().map_err(|e| BenchError::Transport(format!("waiting for the client's end: {e}")))?;
    if end.header != DONE {
        return Err(BenchError::Transport(format!("the client ended with {:?}, not {DONE:?}", end.header)));
    }
    check_gaps(&layout, &region.read()?)
}

/// An error naming the first byte of a gap of the server's region that no longer holds
/// [`GAP_BYTE`]: a transfer wrote outside its blocks.
fn check_gaps(layout: &BlockLayout, region: &[u8]) -> Result<(), BenchError> {
    for gap in layout.server_gaps() {
        if let Some(at) = region[gap.clone()].iter().position(|&b| b != GAP_BYTE) {
            let offset = gap.start + at;
            return Err(BenchError::Transport(format!(
                "the server's region was written outside its blocks: byte {offset} (in the gap {}..{}) holds {:#04x}, \
                 not {GAP_BYTE:#04x}",
                gap.start, gap.end, region[offset]
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_byte_written_into_a_gap_is_found() {
        let layout = BlockLayout::new(40, 4).unwrap();
        let mut region = layout.scatter(&source_pattern(40), GAP_BYTE);
        check_gaps(&layout, &region).unwrap();
        // Blocks of 10 bytes at 60, 40, 20 and 0; gaps at 10, 30, 50 and 70.
        region[25] = 7; // inside a block: fine
        check_gaps(&layout, &region).unwrap();
        region[35] = 7;
        let e = check_gaps(&layout, &region).unwrap_err().to_string();
        assert!(e.contains("byte 35 (in the gap 30..40)"), "{e}");
        assert!(e.contains("holds 0x07"), "{e}");
        // One block: no gaps to check.
        let one = BlockLayout::new(40, 1).unwrap();
        check_gaps(&one, &source_pattern(40)).unwrap();
    }
}
