//! First-fit sub-allocation of one slab, with coalescing of free neighbours. Pure
//! bookkeeping over offsets: no CUDA here, tested everywhere.

use std::collections::{BTreeMap, HashMap};

/// Offsets into a slab of `size` bytes, handed out in multiples of `align`.
#[derive(Debug)]
pub(crate) struct SubAllocator {
    size: u64,
    align: u64,
    /// Free ranges: offset → length, never adjacent (coalesced).
    free: BTreeMap<u64, u64>,
    /// Live ranges: offset → rounded length.
    used: HashMap<u64, u64>,
    in_use: u64,
}

/// `len` rounded up to a multiple of `align` (at least one `align`); `None` on overflow.
pub(crate) fn round_up(len: u64, align: u64) -> Option<u64> {
    let len = len.max(1);
    len.checked_add(align - 1).map(|v| v / align * align)
}

impl SubAllocator {
    /// A slab of `size` bytes; `align` must be a power of two.
    pub(crate) fn new(size: u64, align: u64) -> Self {
        debug_assert!(align.is_power_of_two());
        let mut free = BTreeMap::new();
        let usable = size / align * align;
        if usable > 0 {
            free.insert(0, usable);
        }
        SubAllocator { size, align, free, used: HashMap::new(), in_use: 0 }
    }

    /// First fit: the lowest free offset that holds `len` bytes (rounded up).
    pub(crate) fn alloc(&mut self, len: u64) -> Option<u64> {
        let need = round_up(len, self.align)?;
        let (&off, &flen) = self.free.iter().find(|(_, &flen)| flen >= need)?;
        self.free.remove(&off);
        if flen > need {
            self.free.insert(off + need, flen - need);
        }
        self.used.insert(off, need);
        self.in_use += need;
        Some(off)
    }

    /// Frees the range that starts at `offset`; returns its rounded length, or `None` if no
    /// live range starts there (double free, foreign offset: ignored).
    pub(crate) fn free(&mut self, offset: u64) -> Option<u64> {
        let len = self.used.remove(&offset)?;
        self.in_use -= len;
        let mut start = offset;
        let mut end = offset + len;
        if let Some((&poff, &plen)) = self.free.range(..offset).next_back() {
            if poff + plen == start {
                self.free.remove(&poff);
                start = poff;
            }
        }
        if let Some(&nlen) = self.free.get(&end) {
            self.free.remove(&end);
            end += nlen;
        }
        self.free.insert(start, end - start);
        Some(len)
    }

    /// Bytes handed out (rounded).
    pub(crate) fn in_use(&self) -> u64 {
        self.in_use
    }
    /// Number of live ranges.
    pub(crate) fn live(&self) -> usize {
        self.used.len()
    }
    /// Slab size.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }
    /// Whether nothing is handed out.
    pub(crate) fn is_empty(&self) -> bool {
        self.used.is_empty()
    }
    /// Number of free ranges (fragmentation).
    #[cfg(test)]
    pub(crate) fn free_ranges(&self) -> usize {
        self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn first_fit_and_alignment() {
        let mut s = SubAllocator::new(4096, 256);
        assert_eq!(s.alloc(1), Some(0));
        assert_eq!(s.alloc(256), Some(256));
        assert_eq!(s.alloc(257), Some(512));
        assert_eq!(s.in_use(), 1024);
        assert_eq!(s.alloc(0), Some(1024)); // zero-length still gets a distinct range
        assert_eq!(s.alloc(4096), None);
        assert_eq!(s.free(256), Some(256));
        assert_eq!(s.alloc(100), Some(256)); // reuse of the hole, first fit
    }

    #[test]
    fn coalesces_both_sides() {
        let mut s = SubAllocator::new(1024, 256);
        let a = s.alloc(256).unwrap();
        let b = s.alloc(256).unwrap();
        let c = s.alloc(256).unwrap();
        let d = s.alloc(256).unwrap();
        assert_eq!(s.alloc(1), None);
        s.free(a);
        s.free(c);
        assert_eq!(s.free_ranges(), 2);
        s.free(b);
        assert_eq!(s.free_ranges(), 1);
        s.free(d);
        assert!(s.is_empty());
        assert_eq!(s.free_ranges(), 1);
        assert_eq!(s.alloc(1024), Some(0));
    }

    #[test]
    fn double_free_is_ignored() {
        let mut s = SubAllocator::new(1024, 256);
        let a = s.alloc(10).unwrap();
        assert_eq!(s.free(a), Some(256));
        assert_eq!(s.free(a), None);
        assert_eq!(s.free(999), None);
        assert_eq!(s.in_use(), 0);
    }

    #[test]
    fn overflow_is_refused() {
        let mut s = SubAllocator::new(1024, 256);
        assert_eq!(s.alloc(u64::MAX), None);
    }

    proptest! {
        #[test]
        fn never_overlaps_and_frees_back_to_one_range(ops in proptest::collection::vec((0u64..3000, any::<bool>()), 1..200)) {
            let mut s = SubAllocator::new(64 * 1024, 256);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (len, free_one) in ops {
                if free_one && !live.is_empty() {
                    let (off, _) = live.remove(len as usize % live.len());
                    prop_assert!(s.free(off).is_some());
                } else if let Some(off) = s.alloc(len) {
                    prop_assert_eq!(off % 256, 0);
                    let r = round_up(len, 256).unwrap();
                    prop_assert!(off + r <= 64 * 1024);
                    for &(o, l) in &live {
                        prop_assert!(off + r <= o || o + l <= off, "overlap");
                    }
                    live.push((off, r));
                }
                prop_assert_eq!(s.in_use(), live.iter().map(|x| x.1).sum::<u64>());
            }
            for (off, _) in live {
                s.free(off);
            }
            prop_assert_eq!(s.free_ranges(), 1);
            prop_assert_eq!(s.alloc(64 * 1024), Some(0));
        }
    }
}
