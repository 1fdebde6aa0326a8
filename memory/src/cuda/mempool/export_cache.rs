//! The export data of pool allocations, remembered per allocation.
//!
//! `cuMemPoolExportPointer` is not cheap and its cost grows with the allocation: on the
//! H200 (driver 580) 19 µs for 1 MB, 33–41 µs for 64 MB and 400–540 µs for 1 GB, paid again
//! for every export of the same allocation. A buffer sent again, or received into and then
//! sent on (a server echoing what it received), is exported again. [`export_allocation`]
//! keeps the 64 bytes per allocation, keyed by (base, size, buffer id): the buffer id
//! (`CU_POINTER_ATTRIBUTE_BUFFER_ID`) is unique per allocation for the process' life, so an
//! allocation freed and made again at the same address is a new key and never gets the old
//! allocation's data. Entries of freed allocations are never looked up again; the table is
//! bounded ([`MAX_REMEMBERED`], oldest first out).

use super::share::export_pointer;
use crate::cuda::context::Gpu;
use crate::cuda::error::CudaResult;
use crate::cuda::pointer::{address_range, attribute};
use cudarc::driver::sys;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Allocations whose export data is remembered at most.
pub const MAX_REMEMBERED: usize = 4096;

/// One pool allocation as another process can open it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolPointerExport {
    /// The allocation's base address (what was exported).
    pub base: u64,
    /// The allocation's size.
    pub alloc_len: usize,
    /// `cuMemPoolExportPointer`'s 64 bytes.
    pub data: [u8; 64],
}

/// Identifies one allocation for the process' life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct AllocationKey {
    base: u64,
    alloc_len: usize,
    buffer_id: u64,
}

/// A bounded table of export data, oldest first out.
#[derive(Default)]
struct ExportTable {
    data: HashMap<AllocationKey, [u8; 64]>,
    order: VecDeque<AllocationKey>,
}

impl ExportTable {
    fn get(&self, key: &AllocationKey) -> Option<[u8; 64]> {
        self.data.get(key).copied()
    }

    fn insert(&mut self, key: AllocationKey, data: [u8; 64], bound: usize) {
        if self.data.insert(key, data).is_some() {
            return;
        }
        self.order.push_back(key);
        while self.order.len() > bound {
            if let Some(old) = self.order.pop_front() {
                self.data.remove(&old);
            }
        }
    }
}

fn table() -> &'static Mutex<ExportTable> {
    static TABLE: OnceLock<Mutex<ExportTable>> = OnceLock::new();
    TABLE.get_or_init(Default::default)
}

static HITS: AtomicU64 = AtomicU64::new(0);

/// Exports served from the table so far, in this process.
pub fn export_cache_hits() -> u64 {
    HITS.load(Ordering::Relaxed)
}

/// The allocation holding `ptr` (memory of an exportable pool) as an importer opens it:
/// its base, size and export data, from the table when this allocation was exported
/// before, else [`export_pointer`] of its base. Two driver queries on a hit (the address
/// range and the buffer id). A buffer id of 0 (a driver that does not report one) is not
/// remembered.
pub fn export_allocation(gpu: &Gpu, ptr: u64) -> CudaResult<PoolPointerExport> {
    let (base, alloc_len) = address_range(gpu, ptr)?;
    let buffer_id = attribute(sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr)?;
    let key = AllocationKey { base, alloc_len, buffer_id };
    if buffer_id != 0 {
        if let Some(data) = table().lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            HITS.fetch_add(1, Ordering::Relaxed);
            return Ok(PoolPointerExport { base, alloc_len, data });
        }
    }
    let data = export_pointer(gpu, base)?;
    if buffer_id != 0 {
        table().lock().unwrap_or_else(|p| p.into_inner()).insert(key, data, MAX_REMEMBERED);
    }
    Ok(PoolPointerExport { base, alloc_len, data })
}

/// [`export_allocation`] of `buf`'s allocation, remembered with the buffer: asked once
/// per buffer (see `memo.rs`).
pub fn export_buffer_allocation(gpu: &Gpu, buf: &crate::DeviceBuffer) -> CudaResult<PoolPointerExport> {
    if let Some(known) = buf.export_memo.pool_export() {
        return Ok(known);
    }
    let exported = export_allocation(gpu, buf.device_ptr())?;
    buf.export_memo.remember_pool_export(exported);
    Ok(exported)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(base: u64, buffer_id: u64) -> AllocationKey {
        AllocationKey { base, alloc_len: 4096, buffer_id }
    }

    #[test]
    fn an_allocation_made_again_at_the_same_address_is_a_new_entry() {
        let mut t = ExportTable::default();
        t.insert(key(0x1000, 1), [1; 64], 8);
        assert_eq!(t.get(&key(0x1000, 1)), Some([1; 64]));
        assert_eq!(t.get(&key(0x1000, 2)), None, "a new buffer id never reads the old data");
        assert_eq!(t.get(&AllocationKey { alloc_len: 8192, ..key(0x1000, 1) }), None);
    }

    #[test]
    fn past_the_bound_the_oldest_goes_first() {
        let mut t = ExportTable::default();
        for i in 0..4 {
            t.insert(key(i << 20, i + 1), [i as u8; 64], 3);
        }
        assert_eq!(t.get(&key(0, 1)), None, "the oldest went");
        for i in 1..4 {
            assert_eq!(t.get(&key(i << 20, i + 1)), Some([i as u8; 64]));
        }
        assert_eq!((t.data.len(), t.order.len()), (3, 3));
        // Inserting a known key again neither grows nor reorders the table.
        t.insert(key(1 << 20, 2), [9; 64], 3);
        assert_eq!((t.data.len(), t.order.len()), (3, 3));
        assert_eq!(t.get(&key(1 << 20, 2)), Some([9; 64]));
    }
}
