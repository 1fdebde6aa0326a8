//! The checks every transfer passes, on the initiator before it asks and on the owner
//! before it runs it (a lying peer gets a refusal, never a copy outside a region).

use super::registration::RegistrationInner;
use crate::error::TransportError;
use crate::payload::Payload;
use crate::remote_key::Access;
use crate::wire::{TransferOp, WireSpan, MAX_SPANS};

/// Why the initiator refuses a transfer of `spans` from or into `local` and a remote
/// region of `remote_len` bytes granting `remote_access`, device memory when
/// `remote_device`: memory of two kinds, or [`check_spans`]'s reasons. The core runs it
/// on transfers given with their spans, the user's thread on a transfer it prepares.
pub fn check_initiator_transfer<P: Payload>(
    op: TransferOp,
    spans: &[WireSpan],
    local: &RegistrationInner<P>,
    (remote_len, remote_access, remote_device): (u64, Access, bool),
) -> Result<(), TransportError> {
    if remote_device != local.is_device() {
        return Err(TransportError::Unsupported("a transfer between host and device memory".into()));
    }
    check_spans(op, spans, local.len(), remote_len, remote_access).map_err(TransportError::InvalidMessage)
}

/// Why a transfer's spans are refused: none or too many, empty, outside either memory,
/// not allowed by the grant's access, or destinations that overlap.
pub fn check_spans(
    op: TransferOp,
    spans: &[WireSpan],
    local_len: u64,
    remote_len: u64,
    remote_access: Access,
) -> Result<(), String> {
    if spans.is_empty() || spans.len() > MAX_SPANS {
        return Err(format!("a transfer has 1 to {MAX_SPANS} spans, not {}", spans.len()));
    }
    match op {
        TransferOp::Put if !remote_access.allows_write() => {
            return Err("the remote region is not writable (its key grants read access)".into())
        }
        TransferOp::Get if !remote_access.allows_read() => {
            return Err("the remote region is not readable (its key grants write access)".into())
        }
        _ => {}
    }
    for (i, s) in spans.iter().enumerate() {
        if s.len == 0 {
            return Err(format!("span {i} is empty"));
        }
        if s.local_offset.checked_add(s.len).is_none_or(|end| end > local_len) {
            return Err(format!(
                "span {i} ({}+{}) lies outside the local memory of {local_len} bytes",
                s.local_offset, s.len
            ));
        }
        if s.remote_offset.checked_add(s.len).is_none_or(|end| end > remote_len) {
            return Err(format!(
                "span {i} ({}+{}) lies outside the remote region of {remote_len} bytes",
                s.remote_offset, s.len
            ));
        }
    }
    // Destinations must not overlap: the bytes of a batch land in one defined place.
    let destination = |s: &WireSpan| match op {
        TransferOp::Put => (s.remote_offset, s.len),
        TransferOp::Get => (s.local_offset, s.len),
    };
    // Blocks listed in either order of their destinations (the common case) need no
    // sorted copy: each next one after (or before) the last is enough. Every end was
    // checked above, so the sums cannot overflow.
    let ascending = spans.windows(2).all(|w| {
        let ((a, a_len), (b, _)) = (destination(&w[0]), destination(&w[1]));
        a + a_len <= b
    });
    let descending = || {
        spans.windows(2).all(|w| {
            let ((a, _), (b, b_len)) = (destination(&w[0]), destination(&w[1]));
            b + b_len <= a
        })
    };
    // Either order only shortcuts the sorted check below, which answers the same for any
    // spans: `&&` here would be an equivalent mutant (.cargo/mutants.toml).
    if ascending || descending() {
        return Ok(());
    }
    let mut destinations: Vec<(u64, u64, usize)> = spans
        .iter()
        .enumerate()
        .map(|(i, s)| match op {
            TransferOp::Put => (s.remote_offset, s.len, i),
            TransferOp::Get => (s.local_offset, s.len, i),
        })
        .collect();
    destinations.sort_unstable();
    for pair in destinations.windows(2) {
        let ((a_off, a_len, a), (b_off, _, b)) = (pair[0], pair[1]);
        if a_off + a_len > b_off {
            let side = if op == TransferOp::Put { "remote" } else { "local" };
            return Err(format!("spans {a} and {b} overlap in the {side} memory they write"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(local_offset: u64, remote_offset: u64, len: u64) -> WireSpan {
        WireSpan { local_offset, remote_offset, len }
    }

    #[test]
    fn spans_at_every_edge_are_taken_and_one_byte_past_refused() {
        let ok = |spans: &[WireSpan]| check_spans(TransferOp::Put, spans, 100, 200, Access::Write);
        assert!(ok(&[span(0, 0, 100)]).is_ok());
        assert!(ok(&[span(99, 199, 1)]).is_ok());
        assert!(ok(&[span(0, 100, 100)]).is_ok());
        assert!(ok(&[span(1, 0, 100)]).unwrap_err().contains("outside the local memory"));
        assert!(ok(&[span(0, 101, 100)]).unwrap_err().contains("outside the remote region"));
        assert!(ok(&[span(0, u64::MAX, 1)]).unwrap_err().contains("outside the remote region"));
        assert!(ok(&[span(u64::MAX, 0, 2)]).unwrap_err().contains("outside the local memory"));
        assert!(ok(&[span(0, 0, 0)]).unwrap_err().contains("empty"));
        assert!(ok(&[]).unwrap_err().contains("1 to"));
    }

    #[test]
    fn a_transfer_of_the_most_spans_is_taken_and_one_more_refused() {
        let spans = |n: u64| (0..n).map(|i| span(i, i, 1)).collect::<Vec<_>>();
        let check = |n| check_spans(TransferOp::Put, &spans(n), 1 << 20, 1 << 20, Access::Write);
        assert_eq!(check(MAX_SPANS as u64), Ok(()));
        let expected = format!("a transfer has 1 to {MAX_SPANS} spans, not {}", MAX_SPANS + 1);
        assert_eq!(check(MAX_SPANS as u64 + 1), Err(expected));
    }

    #[test]
    fn access_is_checked_by_direction() {
        let s = [span(0, 0, 8)];
        assert!(check_spans(TransferOp::Put, &s, 8, 8, Access::Read).unwrap_err().contains("not writable"));
        assert!(check_spans(TransferOp::Get, &s, 8, 8, Access::Write).unwrap_err().contains("not readable"));
        assert!(check_spans(TransferOp::Put, &s, 8, 8, Access::ReadWrite).is_ok());
        assert!(check_spans(TransferOp::Get, &s, 8, 8, Access::ReadWrite).is_ok());
    }

    #[test]
    fn spans_in_any_order_are_checked_alike() {
        let block = 4096u64;
        // Destinations in order, in reverse order and shuffled (every 7th of 1000).
        let orders: [Vec<u64>; 3] =
            [(0..1000).collect(), (0..1000).rev().collect(), (0..1000).map(|i| i * 7 % 1000).collect()];
        for order in orders {
            let spans: Vec<WireSpan> = order.iter().map(|&d| span(d * block, d * 2 * block, block)).collect();
            assert!(check_spans(TransferOp::Put, &spans, 1000 * block, 2000 * block, Access::Write).is_ok());
            let mut overlapping = spans.clone();
            overlapping[500].remote_offset = overlapping[0].remote_offset + 1;
            let e = check_spans(TransferOp::Put, &overlapping, 1000 * block, 2000 * block, Access::Write);
            assert!(e.unwrap_err().contains("overlap"), "{:?}", &order[..3]);
        }
        // Starts in order, one byte of overlap: the one-pass check must not take it.
        let mut spans: Vec<WireSpan> = (0..1000).map(|d| span(d * block, d * 2 * block, block)).collect();
        spans[1].remote_offset = spans[0].remote_offset + block - 1;
        let e = check_spans(TransferOp::Put, &spans, 1000 * block, 2000 * block, Access::Write).unwrap_err();
        assert!(e.contains("spans 0 and 1 overlap"), "{e}");
        spans.reverse();
        let e = check_spans(TransferOp::Put, &spans, 1000 * block, 2000 * block, Access::Write).unwrap_err();
        assert!(e.contains("overlap"), "{e}");
    }

    #[test]
    fn destinations_that_touch_out_of_order_are_taken() {
        // Neither ascending nor descending, so the sorted check decides: each destination
        // ends exactly where the next begins, which is no overlap.
        let touching = [span(0, 100, 100), span(100, 0, 100), span(200, 200, 100)];
        assert_eq!(check_spans(TransferOp::Put, &touching, 300, 300, Access::Write), Ok(()));
        let swapped: Vec<WireSpan> = touching.iter().map(|s| span(s.remote_offset, s.local_offset, s.len)).collect();
        assert_eq!(check_spans(TransferOp::Get, &swapped, 300, 300, Access::Read), Ok(()));
        let mut one_byte_over = touching;
        one_byte_over[1].len = 101;
        let e = check_spans(TransferOp::Put, &one_byte_over, 301, 301, Access::Write).unwrap_err();
        assert!(e.contains("spans 1 and 0 overlap"), "{e}");
    }

    #[test]
    fn a_span_at_offset_zero_overlapping_its_neighbour_is_refused_in_either_order() {
        // [0, 200) holds [100, 150): two spans, so each order is one the shortcuts look at.
        for spans in [[span(0, 0, 200), span(200, 100, 50)], [span(200, 100, 50), span(0, 0, 200)]] {
            let e = check_spans(TransferOp::Put, &spans, 250, 200, Access::Write).unwrap_err();
            assert!(e.contains("overlap in the remote memory"), "{e}");
        }
    }

    #[test]
    fn a_thousand_spans_with_gaps_pass_and_any_overlap_is_refused() {
        let block = 64 << 10;
        let spans: Vec<WireSpan> = (0..1000u64).map(|i| span(i * block, (999 - i) * 2 * block, block)).collect();
        let (local, remote) = (1000 * block, 2000 * block);
        assert!(check_spans(TransferOp::Put, &spans, local, remote, Access::Write).is_ok());
        // Destinations that touch are fine; one byte of overlap is not, wherever it is.
        let mut touching = spans.clone();
        touching[500].remote_offset = touching[501].remote_offset + block;
        assert!(check_spans(TransferOp::Put, &touching, local, remote, Access::Write).is_ok());
        let mut overlapping = spans.clone();
        overlapping[10].remote_offset = overlapping[11].remote_offset + block - 1;
        let e = check_spans(TransferOp::Put, &overlapping, local, remote, Access::Write).unwrap_err();
        assert!(e.contains("overlap in the remote memory"), "{e}");
        // A get writes the local side: overlapping local ranges are refused, remote ones read twice are fine.
        let mut reads_twice = spans.clone();
        reads_twice[3].remote_offset = reads_twice[4].remote_offset;
        assert!(check_spans(TransferOp::Get, &reads_twice, local, remote, Access::Read).is_ok());
        let mut writes_twice = spans;
        writes_twice[3].local_offset = writes_twice[4].local_offset;
        assert!(check_spans(TransferOp::Get, &writes_twice, local, remote, Access::Read)
            .unwrap_err()
            .contains("local"));
    }

    /// Whether two of `spans`' destinations share a byte, pair by pair.
    fn overlap_by_pairs(spans: &[WireSpan]) -> bool {
        spans.iter().enumerate().any(|(i, a)| {
            spans[i + 1..]
                .iter()
                .any(|b| a.remote_offset < b.remote_offset + b.len && b.remote_offset < a.remote_offset + a.len)
        })
    }

    proptest::proptest! {
        /// Listed in order, in reverse or shuffled, touching or one byte over: the
        /// check (with its one-pass shortcut for ordered lists) refuses exactly the
        /// lists in which two destinations share a byte.
        #[test]
        fn overlaps_are_refused_exactly(
            lens in proptest::collection::vec(1u64..64, 2..40),
            gaps in proptest::collection::vec(-1i64..3, 40),
            order in 0u8..3,
            swap in (0usize..40, 0usize..40),
        ) {
            let mut at = 0u64;
            let mut spans: Vec<WireSpan> = lens
                .iter()
                .zip(&gaps)
                .map(|(&len, &gap)| {
                    at = at.saturating_add_signed(gap);
                    let s = span(0, at, len);
                    at += len;
                    s
                })
                .collect();
            match order {
                0 => {}
                1 => spans.reverse(),
                _ => spans.swap(swap.0 % lens.len(), swap.1 % lens.len()),
            }
            let got = check_spans(TransferOp::Put, &spans, 64, at + 64, Access::Write);
            proptest::prop_assert_eq!(got.is_err(), overlap_by_pairs(&spans), "{:?}: {:?}", spans, got);
        }
    }
}
