//! Where the bytes of a one-sided round trip go: `n` bytes as `blocks` equal spans of
//! one request ([`BlockLayout`]).
//!
//! The client's two regions (its source and its landing region) hold the blocks side by
//! side: block `i` at `i·b` (`b = n / blocks`). The server's region scatters them with a
//! gap after each, in reverse order: block `i` at `(blocks − 1 − i)·2·b`, so that with more
//! than one block the server registers `2·n` bytes and every block is followed by `b`
//! bytes nothing may write. With one block both sides hold the `n` bytes at offset 0 and
//! the server registers `n` bytes.
//!
//! Both directions of a round trip are one batch of `blocks` spans: the client's
//! transfer has its local offsets side by side and its remote offsets scattered
//! ([`BlockLayout::client_spans`]), the server's the other way round
//! ([`BlockLayout::server_spans`]); put or get, the offsets are the same.

use ferrylink::transport::Span;
use std::ops::Range;

/// `n` bytes moved as `blocks` equal spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockLayout {
    n: usize,
    blocks: usize,
}

impl BlockLayout {
    /// `n` bytes in `blocks` blocks; an error (for the user) when `blocks` is 0 or does
    /// not divide `n`.
    pub fn new(n: usize, blocks: usize) -> Result<BlockLayout, String> {
        if blocks == 0 {
            return Err("--blocks must be at least 1".into());
        }
        if !n.is_multiple_of(blocks) {
            let below = n / blocks * blocks;
            let above = below.saturating_add(blocks);
            let nearest = if below == 0 { format!("{above}") } else { format!("{below} or {above}") };
            return Err(format!(
                "{n} bytes is not a multiple of --blocks {blocks}: the blocks are equal (nearest sizes: {nearest})"
            ));
        }
        Ok(BlockLayout { n, blocks })
    }

    /// Bytes per round-trip direction.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Spans per request.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Bytes per block.
    pub fn block_len(&self) -> usize {
        self.n / self.blocks
    }

    /// Bytes of the server's region: `n` for one block, `2·n` (a gap after every block)
    /// for more.
    pub fn server_len(&self) -> usize {
        if self.blocks == 1 {
            self.n
        } else {
            2 * self.n
        }
    }

    /// Where block `i` lies in the client's regions.
    pub fn client_offset(&self, i: usize) -> usize {
        i * self.block_len()
    }

    /// Where block `i` lies in the server's region.
    pub fn server_offset(&self, i: usize) -> usize {
        (self.blocks - 1 - i) * 2 * self.block_len()
    }

    /// The client's transfer (put from its source, or get into its landing region):
    /// local offsets side by side, remote offsets scattered over the server's region.
    pub fn client_spans(&self) -> Vec<Span> {
        self.spans(|i| (self.client_offset(i), self.server_offset(i)))
    }

    /// The server's transfer (put from its region into the client's landing region, or
    /// get from the client's source into its region): local offsets scattered, remote
    /// offsets side by side.
    pub fn server_spans(&self) -> Vec<Span> {
        self.spans(|i| (self.server_offset(i), self.client_offset(i)))
    }

    fn spans(&self, offsets: impl Fn(usize) -> (usize, usize)) -> Vec<Span> {
        let len = self.block_len() as u64;
        (0..self.blocks)
            .map(|i| {
                let (local, remote) = offsets(i);
                Span { local_offset: local as u64, remote_offset: remote as u64, len }
            })
            .collect()
    }

    /// The server region's bytes no block covers (the gap after each block; none with one
    /// block), in ascending order.
    pub fn server_gaps(&self) -> Vec<Range<usize>> {
        if self.blocks == 1 {
            return Vec::new();
        }
        let b = self.block_len();
        (0..self.blocks).rev().map(|i| self.server_offset(i) + b..self.server_offset(i) + 2 * b).collect()
    }

    /// The server's region laid out from `blocks_side_by_side` (`n` bytes as the client
    /// holds them): each block at its scattered offset, `gap` in every gap.
    pub fn scatter(&self, blocks_side_by_side: &[u8], gap: u8) -> Vec<u8> {
        let b = self.block_len();
        let mut out = vec![gap; self.server_len()];
        for i in 0..self.blocks {
            let (c, s) = (self.client_offset(i), self.server_offset(i));
            out[s..s + b].copy_from_slice(&blocks_side_by_side[c..c + b]);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every span of `spans` is `len` bytes, within `local_len` / `remote_len`, and the
    /// ranges on each side are pairwise disjoint.
    fn check_fit(spans: &[Span], local_len: usize, remote_len: usize) {
        let mut local: Vec<(u64, u64)> = spans.iter().map(|s| (s.local_offset, s.len)).collect();
        let mut remote: Vec<(u64, u64)> = spans.iter().map(|s| (s.remote_offset, s.len)).collect();
        for (side, ranges, len) in [("local", &mut local, local_len), ("remote", &mut remote, remote_len)] {
            ranges.sort_unstable();
            for w in ranges.windows(2) {
                assert!(w[0].0 + w[0].1 <= w[1].0, "{side} ranges overlap: {ranges:?}");
            }
            let (last, l) = ranges[ranges.len() - 1];
            assert!(last + l <= len as u64, "{side} range past {len}: {ranges:?}");
        }
    }

    #[test]
    fn one_block_is_the_whole_message_at_offset_zero() {
        let l = BlockLayout::new(1000, 1).unwrap();
        assert_eq!(l.server_len(), 1000);
        assert_eq!(l.client_spans(), vec![Span { local_offset: 0, remote_offset: 0, len: 1000 }]);
        assert_eq!(l.server_spans(), l.client_spans());
        assert!(l.server_gaps().is_empty());
        assert_eq!(l.scatter(&[7; 1000], 0), vec![7; 1000]);
    }

    #[test]
    fn blocks_are_scattered_in_reverse_with_a_gap_after_each() {
        let l = BlockLayout::new(400, 4).unwrap();
        assert_eq!((l.block_len(), l.server_len()), (100, 800));
        let offsets: Vec<(u64, u64)> = l.client_spans().iter().map(|s| (s.local_offset, s.remote_offset)).collect();
        assert_eq!(offsets, [(0, 600), (100, 400), (200, 200), (300, 0)]);
        let back: Vec<(u64, u64)> = l.server_spans().iter().map(|s| (s.local_offset, s.remote_offset)).collect();
        assert_eq!(back, [(600, 0), (400, 100), (200, 200), (0, 300)]);
        assert_eq!(l.server_gaps(), [100..200, 300..400, 500..600, 700..800]);
        check_fit(&l.client_spans(), 400, 800);
        check_fit(&l.server_spans(), 800, 400);
    }

    #[test]
    fn the_issue_15_batch_fits() {
        // 1000 blocks of 64 KiB: -n 64000KiB.
        let n = crate::size::parse_size("64000KiB").unwrap() as usize;
        assert_eq!(n, 65_536_000);
        let l = BlockLayout::new(n, 1000).unwrap();
        assert_eq!((l.block_len(), l.server_len()), (64 << 10, 2 * n));
        let spans = l.client_spans();
        assert_eq!(spans.len(), 1000);
        assert!(spans.iter().all(|s| s.len == 64 << 10));
        check_fit(&spans, n, 2 * n);
        check_fit(&l.server_spans(), 2 * n, n);
        // Blocks and gaps tile the server's region exactly.
        let covered: usize = spans.len() * l.block_len() + l.server_gaps().iter().map(|g| g.len()).sum::<usize>();
        assert_eq!(covered, l.server_len());
    }

    #[test]
    fn scatter_puts_each_block_where_the_spans_say() {
        let l = BlockLayout::new(12, 3).unwrap();
        let client: Vec<u8> = (1..=12).collect();
        let server = l.scatter(&client, 0xee);
        let gap: &[u8] = &[0xee; 4];
        assert_eq!(server, [&[9, 10, 11, 12][..], gap, &[5, 6, 7, 8], gap, &[1, 2, 3, 4], gap].concat());
        for s in l.client_spans() {
            let (c, r, len) = (s.local_offset as usize, s.remote_offset as usize, s.len as usize);
            assert_eq!(server[r..r + len], client[c..c + len]);
        }
        for g in l.server_gaps() {
            assert!(server[g].iter().all(|&b| b == 0xee));
        }
    }

    #[test]
    fn blocks_that_do_not_divide_n_are_refused() {
        assert!(BlockLayout::new(100, 0).unwrap_err().contains("at least 1"));
        let e = BlockLayout::new(1000, 3).unwrap_err();
        assert!(e.contains("1000 bytes is not a multiple of --blocks 3") && e.contains("999 or 1002"), "{e}");
        assert!(BlockLayout::new(2, 3).unwrap_err().ends_with("(nearest sizes: 3)"));
        assert!(BlockLayout::new(1000, 1000).is_ok());
        assert!(BlockLayout::new(999, 1000).is_err());
    }
}
