//! The client of a one-sided round trip: its two registered regions, made before the
//! server is started ([`Client::prepare`]), the setup, the timed round trips and their
//! checks ([`Client::run`]).

use super::buffers::{complement, stamped, Placement, RegisteredBuffer};
use super::layout::BlockLayout;
use super::protocol::{self, Incoming, Issuer, DONE, SKIPPED};
use super::{OneSided, Side, SkipTransfer};
use crate::digest::source_pattern;
use crate::echo_check::first_difference;
use crate::roundtrip::{ClientTimes, RoundTripOptions};
use crate::BenchError;
use ferrylink::transport::{Access, Context, Endpoint, RemoteRegion, Span};
use std::time::Instant;

/// The client's side of a one-sided run: its source (what it puts, or the server gets)
/// and its landing region (what the server puts into, or its own gets land in).
pub struct Client {
    op: OneSided,
    layout: BlockLayout,
    source: RegisteredBuffer,
    landing: RegisteredBuffer,
    /// The source pattern, unstamped.
    base: Vec<u8>,
}

fn transport(i: usize, what: &str, e: impl std::fmt::Display) -> BenchError {
    BenchError::Transport(format!("round trip {i}: {what}: {e}"))
}

/// An error unless `got` equals `expected`, naming round trip `i`, `what` differs and the
/// first differing byte.
fn compare(i: usize, what: &str, expected: &[u8], got: &[u8]) -> Result<(), BenchError> {
    let Some(at) = first_difference(expected, got) else { return Ok(()) };
    let byte = |s: &[u8]| s.get(at).map_or_else(|| "nothing".to_string(), |x| format!("{x:#04x}"));
    Err(BenchError::Transport(format!(
        "round trip {i}: {what}: first difference at byte offset {at} (expected {}, found {}; {} and {} bytes)",
        byte(expected),
        byte(got),
        expected.len(),
        got.len()
    )))
}

impl Client {
    /// Allocates and registers the client's regions for `o` (`--op put` or `get`): the
    /// source holding the pattern, the landing region its complement. Memory the transport
    /// will not register is [`BenchError::Unsupported`], before any server is started.
    pub fn prepare(ctx: &Context, o: &RoundTripOptions) -> Result<Client, BenchError> {
        let op = o.op.one_sided().ok_or_else(|| BenchError::Usage("--op send is not a one-sided round trip".into()))?;
        let layout = BlockLayout::new(o.n_bytes, o.blocks).map_err(BenchError::Usage)?;
        let placement = Placement { object_type: o.object_type, memory: o.memory, dev: o.client_dev };
        let base = source_pattern(o.n_bytes);
        // Peers read the source (get) and write the landing region (put).
        let source = RegisteredBuffer::new(ctx, placement, &base, Access::Read, "the client's source")?;
        let landing =
            RegisteredBuffer::new(ctx, placement, &complement(&base), Access::Write, "the client's landing region")?;
        Ok(Client { op, layout, source, landing, base })
    }

    /// The setup on `ep` (keys exchanged, the server's region imported), then
    /// `n_warmup_iter + n_iter` round trips, checked as [`super`] says; returns their
    /// times. Tells the server the end once every check is done.
    pub fn run(mut self, ep: &Endpoint, o: &RoundTripOptions) -> Result<ClientTimes, BenchError> {
        // The server writes the landing region (put) or reads the source (get).
        let for_server = match self.op {
            OneSided::Put => self.landing.registration().key(),
            OneSided::Get => self.source.registration().key(),
        };
        let remote = protocol::client_setup(ep, self.op, &self.layout, for_server)?;
        let spans = self.layout.client_spans();
        let local = match self.op {
            OneSided::Put => self.source.registration(),
            OneSided::Get => self.landing.registration(),
        };
        let issuer = Issuer::new(ep, self.op, (local, &remote), spans.clone(), o.prepared)?;
        let mut timed = Vec::with_capacity(o.n_iter);
        let mut first = None;
        // The stamp of the source (every round trip 0 is checked, so stamped from then on).
        let mut stamp = None;
        for i in 0..o.total() {
            let lands = if o.checks(i) { Some(self.before_check(i, stamp.replace(i))?) } else { None };
            let start = Instant::now();
            tracing::trace!("{}", crate::timeline::ROUND_TRIP_STARTS);
            self.round_trip(ep, (&remote, &issuer), i, o.skip_transfer)?;
            let elapsed = start.elapsed();
            if let Some(lands) = lands {
                self.after_check(ep, &remote, &spans, i, &lands)?;
            }
            first.get_or_insert(elapsed);
            if i >= o.n_warmup_iter {
                timed.push(elapsed);
            }
        }
        protocol::send_header(ep, DONE)
            .map_err(|e| BenchError::Transport(format!("telling the server the end: {e}")))?;
        let first = first.ok_or_else(|| BenchError::Usage("no round trip to time".into()))?;
        Ok(ClientTimes { timed, first })
    }

    /// One timed round trip: the client's transfer with its notification, then the
    /// server's notification (or, with the test hook, the message standing in for one).
    fn round_trip(
        &self,
        ep: &Endpoint,
        (remote, issuer): (&RemoteRegion, &Issuer),
        i: usize,
        skip: Option<SkipTransfer>,
    ) -> Result<(), BenchError> {
        // The transfer goes first, the wait for the answer is posted while it runs (a
        // notification that comes before its receive waits for it).
        let issued = if SkipTransfer::skips(skip, Side::Client, i) {
            protocol::send_header(ep, SKIPPED).map_err(|e| transport(i, "test hook: telling the server", e))?;
            None
        } else {
            let local = match self.op {
                OneSided::Put => self.source.registration(),
                OneSided::Get => self.landing.registration(),
            };
            Some(issuer.issue(ep, self.op, (local, remote), Some(protocol::note(i))))
        };
        let answer = Incoming::post(ep, SkipTransfer::skips(skip, Side::Server, i));
        if let Some(request) = issued {
            request.wait().map_err(|e| transport(i, &self.op.to_string(), e))?;
        }
        answer.wait(i)
    }

    /// Before checked round trip `i`: stamps the source with `i` and fills the landing
    /// region with the complement of what the round trip must land there, which it returns:
    /// the stamped source (put), or what the server's region holds (get: the source as of
    /// `last_stamp`, the round trip the server last read it in; its initial bytes, the
    /// complement of the pattern, before round trip 0).
    fn before_check(&mut self, i: usize, last_stamp: Option<usize>) -> Result<Vec<u8>, BenchError> {
        let blocks = self.layout.blocks();
        let source = stamped(&self.base, blocks, i);
        self.source.write(&source)?;
        let lands = match (self.op, last_stamp) {
            (OneSided::Put, _) => source,
            (OneSided::Get, Some(s)) => stamped(&self.base, blocks, s),
            (OneSided::Get, None) => complement(&self.base),
        };
        self.landing.write(&complement(&lands))?;
        Ok(lands)
    }

    /// After checked round trip `i`: the landing region must hold `lands`. After a get,
    /// the server's region must hold the stamped source the server's get read: the client
    /// gets it once more (untimed, no notification) into its landing region, filled with
    /// the complement first, and compares.
    fn after_check(
        &mut self,
        ep: &Endpoint,
        remote: &RemoteRegion,
        spans: &[Span],
        i: usize,
        lands: &[u8],
    ) -> Result<(), BenchError> {
        let what = match self.op {
            OneSided::Put => "the bytes the server put back differ from what the client put",
            OneSided::Get => "the bytes the client's get brought differ from what the server's region held",
        };
        compare(i, what, lands, &self.landing.read()?)?;
        if self.op == OneSided::Get {
            let source = stamped(&self.base, self.layout.blocks(), i);
            self.landing.write(&complement(&source))?;
            protocol::transfer(ep, self.op, self.landing.registration(), remote, spans, None)
                .wait()
                .map_err(|e| transport(i, "getting the server's region again to check it", e))?;
            let what = "the server's region differs from the client's source its get read";
            compare(i, what, &source, &self.landing.read()?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparisons_name_the_round_trip_and_the_first_difference() {
        assert!(compare(3, "x", &[1, 2, 3], &[1, 2, 3]).is_ok());
        let e = compare(3, "the landing region", &[1, 2, 3], &[1, 9, 3]).unwrap_err().to_string();
        assert!(e.contains("round trip 3: the landing region: first difference at byte offset 1"), "{e}");
        assert!(e.contains("expected 0x02, found 0x09"), "{e}");
    }

    /// What a transfer that moved nothing leaves: the landing region as the client filled
    /// it before the round trip (the complement of what must land), or a server region
    /// holding an earlier stamp. Each differs from what the check expects, at every byte
    /// or at every block's stamp.
    #[test]
    fn what_a_transfer_that_moved_nothing_leaves_fails_the_comparison() {
        let base = source_pattern(4096);
        for (blocks, i) in [(1, 0), (1, 5), (4, 255), (64, 1)] {
            let expected = stamped(&base, blocks, i);
            let untouched = complement(&expected);
            let e = compare(i, "put", &expected, &untouched).unwrap_err().to_string();
            assert!(e.contains("byte offset 0"), "{e}");
            // A server region left from an earlier round trip (or its initial bytes).
            for stale in [stamped(&base, blocks, i ^ 1), complement(&base)] {
                assert!(compare(i, "stale", &expected, &stale).is_err(), "{blocks} blocks, round trip {i}");
            }
            // Each block carries the stamp: one stale block fails too.
            let mut one_stale = expected.clone();
            let b = 4096 / blocks;
            let last = (blocks - 1) * b;
            one_stale[last..last + b].copy_from_slice(&stamped(&base, blocks, i + 1)[last..last + b]);
            let e = compare(i, "block", &expected, &one_stale).unwrap_err().to_string();
            assert!(e.contains(&format!("byte offset {last}")), "{e}");
        }
    }
}
