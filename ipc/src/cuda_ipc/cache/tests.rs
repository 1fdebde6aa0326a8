//! The cache's bookkeeping against a fake opener (no CUDA needed).

use super::*;
use ferrylink_memory::cuda::{codes, CudaError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Maps nothing: hands out fake addresses, records opens and closes, and can be told to
/// answer ALREADY_MAPPED while a given handle is open.
#[derive(Default)]
struct FakeOpener {
    next: AtomicU64,
    open: Mutex<HashMap<u64, [u8; 64]>>,
    already_mapped_if_open: Mutex<Option<[u8; 64]>>,
    /// Repeated opens of one handle return the same address, refcounted.
    refcount_same_handle: std::sync::atomic::AtomicBool,
    refs: Mutex<HashMap<u64, usize>>,
    fail_with: Mutex<Option<i32>>,
    short_by: AtomicU64,
    /// Maps at this address instead of a fresh one (a driver answering nonsense).
    at: Mutex<Option<u64>>,
}

impl MappingOpener for Arc<FakeOpener> {
    fn open(&self, desc: &IpcMemDescriptor, on: Option<usize>) -> Result<OpenedMapping, CudaError> {
        let device_ordinal = on.unwrap_or(0);
        if let Some(code) = *self.fail_with.lock().unwrap() {
            return Err(CudaError::Driver { call: "cuIpcOpenMemHandle", code, message: "fake".into() });
        }
        let mut open = self.open.lock().unwrap();
        if let Some(h) = *self.already_mapped_if_open.lock().unwrap() {
            if open.values().any(|v| *v == h) {
                return Err(CudaError::Driver {
                    call: "cuIpcOpenMemHandle",
                    code: codes::ALREADY_MAPPED,
                    message: "fake".into(),
                });
            }
        }
        if self.refcount_same_handle.load(Ordering::SeqCst) {
            if let Some((&ptr, _)) = open.iter().find(|(_, h)| **h == desc.handle) {
                *self.refs.lock().unwrap().entry(ptr).or_insert(1) += 1;
                return Ok(OpenedMapping { ptr, len: desc.alloc_len, device_ordinal });
            }
        }
        let fresh = 0x1000_0000 * (self.next.fetch_add(1, Ordering::SeqCst) + 1);
        let ptr = self.at.lock().unwrap().unwrap_or(fresh);
        open.insert(ptr, desc.handle);
        let len = desc.alloc_len - self.short_by.load(Ordering::SeqCst);
        Ok(OpenedMapping { ptr, len, device_ordinal })
    }
    fn close(&self, m: &OpenedMapping) {
        let mut refs = self.refs.lock().unwrap();
        let r = refs.entry(m.ptr).or_insert(1);
        if *r > 1 {
            *r -= 1;
            return;
        }
        refs.remove(&m.ptr);
        drop(refs);
        assert!(self.open.lock().unwrap().remove(&m.ptr).is_some(), "double close");
    }
}

fn desc(h: u8, buffer_id: u64, alloc_len: u64) -> IpcMemDescriptor {
    IpcMemDescriptor { handle: [h; 64], buffer_id, alloc_len, offset: 0, len: alloc_len, device_uuid: [0; 16] }
}

fn cache(limit: u64) -> (MappingCache<Arc<FakeOpener>>, Arc<FakeOpener>) {
    let f = Arc::new(FakeOpener::default());
    (MappingCache::new(f.clone(), CacheConfig { max_mapped_bytes: limit }), f)
}

#[test]
fn one_allocation_mapped_on_two_devices_is_two_entries() {
    let (c, f) = cache(1 << 30);
    let d = desc(1, 1, 4096);
    let on0 = c.acquire_on(5, &d, Some(0)).unwrap();
    let on1 = c.acquire_on(5, &d, Some(1)).unwrap();
    assert_eq!((on0.device_ordinal(), on1.device_ordinal()), (0, 1));
    assert_ne!(on0.base_ptr(), on1.base_ptr());
    drop(c.acquire_on(5, &d, Some(1)).unwrap());
    assert_eq!(c.stats().opens_total, 2);
    drop((on0, on1));
    assert_eq!(c.close_peer(5), 2);
    assert!(f.open.lock().unwrap().is_empty());
}

#[test]
fn hundred_acquires_open_once() {
    let (c, f) = cache(1 << 30);
    let d = desc(1, 1, 4096);
    for _ in 0..100 {
        let l = c.acquire(77, &d).unwrap();
        assert_eq!(l.range_ptr(10, 20).unwrap(), l.base_ptr() + 10);
    }
    let s = c.stats();
    assert_eq!((s.opens_total, s.hits, s.misses, s.open_mappings), (1, 99, 1, 1));
    assert_eq!(s.leased_mappings, 0);
    assert_eq!(f.open.lock().unwrap().len(), 1);
}

#[test]
fn key_includes_pid_and_buffer_id() {
    let (c, _) = cache(1 << 30);
    let a = c.acquire(1, &desc(1, 1, 100)).unwrap();
    let b = c.acquire(1, &desc(1, 2, 100)).unwrap(); // same handle, reallocated: new id
    let d = c.acquire(2, &desc(1, 1, 100)).unwrap(); // other peer
    assert_ne!(a.base_ptr(), b.base_ptr());
    assert_ne!(a.base_ptr(), d.base_ptr());
    assert_eq!(c.stats().opens_total, 3);
}

#[test]
fn lru_eviction_respects_limit_and_leases() {
    let (c, f) = cache(300);
    let l1 = c.acquire(1, &desc(1, 1, 100)).unwrap();
    drop(c.acquire(1, &desc(2, 2, 100)).unwrap());
    drop(c.acquire(1, &desc(3, 3, 100)).unwrap());
    // touch 2 so 3 is the least recently used unused mapping
    drop(c.acquire(1, &desc(2, 2, 100)).unwrap());
    drop(c.acquire(1, &desc(4, 4, 100)).unwrap());
    let s = c.stats();
    assert_eq!(s.open_mappings, 3);
    assert_eq!(s.mapped_bytes, 300);
    assert_eq!(s.evictions, 1);
    assert!(!f.open.lock().unwrap().values().any(|h| *h == [3; 64]));
    // 1 is leased: never evicted even when everything else must go
    drop(c.acquire(1, &desc(5, 5, 300)).unwrap());
    assert!(f.open.lock().unwrap().values().any(|h| *h == [1; 64]));
    assert_eq!(l1.range_ptr(0, 100).unwrap(), l1.base_ptr());
    // over the soft limit while leased; shrinks back when leases drop
    drop(l1);
    assert!(c.stats().mapped_bytes <= 300);
}

#[test]
fn clones_hold_the_mapping() {
    let (c, _) = cache(100);
    let l = c.acquire(1, &desc(1, 1, 100)).unwrap();
    let l2 = l.clone();
    drop(l);
    assert_eq!(c.stats().leased_mappings, 1);
    drop(c.acquire(1, &desc(2, 2, 100)).unwrap()); // needs room; 1 is still leased
    assert_eq!(c.stats().opens_total, 2);
    drop(l2);
    assert_eq!(c.stats().leased_mappings, 0);
}

#[test]
fn already_mapped_evicts_and_retries() {
    let (c, f) = cache(1 << 30);
    drop(c.acquire(1, &desc(9, 1, 100)).unwrap());
    *f.already_mapped_if_open.lock().unwrap() = Some([9; 64]);
    // same handle, new buffer id: the stale unused mapping is evicted, the open retried
    let l = c.acquire(1, &desc(9, 2, 100)).unwrap();
    assert_eq!(l.buffer_id(), 2);
    let s = c.stats();
    assert_eq!((s.open_mappings, s.evictions, s.opens_total), (1, 1, 2));
    // while leased it cannot be evicted: the error comes back
    let e = c.acquire(1, &desc(9, 3, 100)).unwrap_err();
    assert_eq!(
        e,
        CudaIpcError::Cuda(CudaError::Driver {
            call: "cuIpcOpenMemHandle",
            code: codes::ALREADY_MAPPED,
            message: "fake".into()
        })
    );
}

#[test]
fn refcounted_reopen_of_a_stale_mapping_is_not_reused() {
    let (c, f) = cache(1 << 30);
    f.refcount_same_handle.store(true, Ordering::SeqCst);
    let old = c.acquire(1, &desc(9, 1, 100)).unwrap();
    let old_ptr = old.base_ptr();
    // in use under the old id: refused, and the extra driver reference is dropped
    assert!(matches!(c.acquire(1, &desc(9, 2, 100)), Err(CudaIpcError::InvalidDescriptor(_))));
    drop(old);
    let new = c.acquire(1, &desc(9, 2, 100)).unwrap();
    assert_ne!(new.base_ptr(), old_ptr);
    assert_eq!(c.stats().open_mappings, 1);
    assert_eq!(f.open.lock().unwrap().len(), 1);
}

#[test]
fn close_peer_closes_now_or_at_last_lease() {
    let (c, f) = cache(1 << 30);
    drop(c.acquire(1, &desc(1, 1, 100)).unwrap());
    let leased = c.acquire(1, &desc(2, 2, 100)).unwrap();
    drop(c.acquire(2, &desc(3, 3, 100)).unwrap());
    assert_eq!(c.close_peer(1), 1);
    assert_eq!(c.stats().open_mappings, 2);
    assert!(matches!(c.acquire(1, &desc(2, 2, 100)), Err(CudaIpcError::PeerClosed { pid: 1 })));
    drop(leased);
    assert_eq!(c.stats().open_mappings, 1);
    assert_eq!(f.open.lock().unwrap().len(), 1);
    drop(c);
    assert_eq!(f.open.lock().unwrap().len(), 0, "dropping the cache closes the rest");
}

#[test]
fn untrusted_descriptors_are_refused() {
    let (c, f) = cache(1 << 30);
    let mut d = desc(1, 1, 100);
    d.offset = 90;
    d.len = 20;
    assert!(matches!(c.acquire(1, &d), Err(CudaIpcError::InvalidDescriptor(_))));
    let l = c.acquire(1, &desc(1, 1, 100)).unwrap();
    assert!(l.range_ptr(50, 51).is_err());
    assert!(l.range_ptr(u64::MAX, 2).is_err());
    // same key, a different allocation length than mapped
    assert!(matches!(c.acquire(1, &desc(1, 1, 200)), Err(CudaIpcError::InvalidDescriptor(_))));
    // a peer claiming more than the driver mapped
    f.short_by.store(10, Ordering::SeqCst);
    assert!(matches!(c.acquire(1, &desc(2, 2, 100)), Err(CudaIpcError::InvalidDescriptor(_))));
    assert_eq!(f.open.lock().unwrap().len(), 1);
    f.short_by.store(0, Ordering::SeqCst);
    *f.fail_with.lock().unwrap() = Some(1);
    assert!(matches!(c.acquire(1, &desc(3, 3, 100)), Err(CudaIpcError::Cuda(_))));
}

/// A mapping at address 0, or one whose end wraps around the address space, is closed
/// and refused: leases would add offsets to it.
#[test]
fn unusable_mappings_are_closed_and_refused() {
    let (c, f) = cache(1 << 30);
    for (i, at) in [0, u64::MAX - 50].into_iter().enumerate() {
        *f.at.lock().unwrap() = Some(at);
        let h = i as u8 + 1;
        let e = c.acquire(1, &desc(h, h.into(), 100)).unwrap_err();
        assert!(matches!(e, CudaIpcError::Cuda(CudaError::InvalidArgument { .. })), "{e:?}");
        assert!(f.open.lock().unwrap().is_empty(), "the mapping at {at:#x} was closed");
    }
    assert_eq!(c.stats().open_mappings, 0);
    *f.at.lock().unwrap() = None;
    let l = c.acquire(1, &desc(3, 3, 100)).unwrap();
    assert_eq!(l.range_ptr(100, 0).unwrap(), l.base_ptr() + 100);
}
