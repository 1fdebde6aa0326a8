//! The receiver's mapping cache: one `cuIpcOpenMemHandle` per exported allocation, reused
//! by every frame that lives in it.
//!
//! - Key: exporter pid + handle bytes + CUDA buffer id (never the address alone).
//! - Mappings are reference-counted while copies use them ([`MappingLease`]).
//! - Bounded by a mapped-bytes limit: unused mappings are closed least-recently-used
//!   first. The limit is soft for leased mappings: a copy in progress is never broken, and
//!   the cache shrinks back as leases drop.
//! - `CUDA_ERROR_ALREADY_MAPPED` on open: unused mappings of the same peer (first those
//!   with the same handle, a stale buffer id; then all) are closed and the open retried.
//! - [`MappingCache::close_peer`] closes every mapping of a peer; leased ones close when
//!   their last lease drops.
//!
//! The bookkeeping is generic over a [`MappingOpener`] so it is tested without CUDA; the
//! real opener is [`CudaOpener`].

use super::descriptor::{check_range, IpcMemDescriptor};
use super::error::CudaIpcError;
use ferrylink_memory::cuda::{self, codes, CudaError, Gpu};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

/// A mapping made by a [`MappingOpener`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenedMapping {
    /// Base address of the mapping in this process.
    pub ptr: u64,
    /// Size of the mapped allocation as the driver reports it here.
    pub len: u64,
    /// Ordinal (in this process) of the device the mapping was opened on.
    pub device_ordinal: usize,
}

/// Opens and closes mappings; the cache's only contact with CUDA.
pub trait MappingOpener: Send + Sync + 'static {
    /// Maps the allocation `desc` names into device `on`'s context (`None`: the device
    /// the allocation lives on).
    fn open(&self, desc: &IpcMemDescriptor, on: Option<usize>) -> Result<OpenedMapping, CudaError>;
    /// Unmaps. Called once per successful open, when nothing uses the mapping. Errors are
    /// the opener's to log.
    fn close(&self, mapping: &OpenedMapping);
}

/// The real opener: `cuIpcOpenMemHandle` with lazy peer access, on the requested device or
/// else the one whose UUID the descriptor names; `cuIpcCloseMemHandle` to close. Opened on
/// the device that copies, a peer device's allocation is mapped for direct (NVLink)
/// access from it: measured on two H200s, a copy through a mapping opened on the
/// allocation's own device and `cuMemcpyPeerAsync` ran at 37 GB/s.
#[derive(Debug, Default, Clone, Copy)]
pub struct CudaOpener;

impl MappingOpener for CudaOpener {
    fn open(&self, desc: &IpcMemDescriptor, on: Option<usize>) -> Result<OpenedMapping, CudaError> {
        let gpu = match on {
            Some(ordinal) => Gpu::get(ordinal)?,
            None => Gpu::by_uuid(&desc.device_uuid)?,
        };
        let ptr = cuda::ipc::open_mem_handle(&gpu, &desc.handle)?;
        let len = match cuda::address_range(&gpu, ptr) {
            Ok((_, size)) => size as u64,
            Err(e) => {
                // SAFETY: `ptr` was just mapped here and nothing uses it yet.
                if let Err(ce) = unsafe { cuda::ipc::close_mem_handle(&gpu, ptr) } {
                    tracing::warn!(error = %ce, "cuIpcCloseMemHandle failed");
                }
                return Err(e);
            }
        };
        Ok(OpenedMapping { ptr, len, device_ordinal: gpu.ordinal() })
    }

    fn close(&self, m: &OpenedMapping) {
        let res = Gpu::get(m.device_ordinal).and_then(|gpu| {
            // SAFETY: the cache closes a mapping once, when no lease (and so no copy the
            // transport still tracks) uses it.
            unsafe { cuda::ipc::close_mem_handle(&gpu, m.ptr) }
        });
        if let Err(e) = res {
            tracing::warn!(error = %e, ptr = m.ptr, "cuIpcCloseMemHandle failed");
        }
    }
}

/// Limits of a [`MappingCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// Unused mappings are closed (LRU) while the mapped bytes exceed this.
    pub max_mapped_bytes: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig { max_mapped_bytes: 64 << 30 }
    }
}

/// What a cache holds and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Mappings open now.
    pub open_mappings: usize,
    /// Bytes of those mappings.
    pub mapped_bytes: u64,
    /// Mappings with at least one lease.
    pub leased_mappings: usize,
    /// Successful opens since the cache was made.
    pub opens_total: u64,
    /// Closes since the cache was made.
    pub closes_total: u64,
    /// Acquisitions served by an open mapping.
    pub hits: u64,
    /// Acquisitions that opened a mapping.
    pub misses: u64,
    /// Mappings closed to respect the limit or after `CUDA_ERROR_ALREADY_MAPPED`.
    pub evictions: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    pid: u32,
    handle: [u8; 64],
    buffer_id: u64,
    /// The device whose context holds the mapping (`None`: the allocation's own).
    on: Option<usize>,
}

struct Entry {
    mapping: OpenedMapping,
    alloc_len: u64,
    refs: usize,
    last_use: u64,
    doomed: bool,
}

#[derive(Default)]
struct State {
    entries: HashMap<Key, Entry>,
    tick: u64,
    mapped_bytes: u64,
    stats: CacheStats,
}

struct Inner<O: MappingOpener> {
    opener: O,
    config: CacheConfig,
    state: Mutex<State>,
}

/// The receiver's cache of peers' mappings. Cheap to clone (shared).
pub struct MappingCache<O: MappingOpener = CudaOpener> {
    inner: Arc<Inner<O>>,
}

impl<O: MappingOpener> Clone for MappingCache<O> {
    fn clone(&self) -> Self {
        MappingCache { inner: self.inner.clone() }
    }
}

impl MappingCache<CudaOpener> {
    /// A cache that maps through CUDA.
    pub fn cuda(config: CacheConfig) -> Self {
        MappingCache::new(CudaOpener, config)
    }
}

impl<O: MappingOpener> MappingCache<O> {
    /// A cache over `opener`.
    pub fn new(opener: O, config: CacheConfig) -> Self {
        MappingCache { inner: Arc::new(Inner { opener, config, state: Mutex::new(State::default()) }) }
    }

    /// A lease on the mapping of `desc`'s allocation exported by process `pid`: from the
    /// cache, or opened now. The descriptor is validated first (untrusted input).
    pub fn acquire(&self, pid: u32, desc: &IpcMemDescriptor) -> Result<MappingLease, CudaIpcError> {
        self.acquire_on(pid, desc, None)
    }

    /// As [`MappingCache::acquire`], mapped into device `on`'s context (the device that
    /// will copy; `None`: the allocation's own device). One allocation mapped on two
    /// devices is two entries.
    pub fn acquire_on(
        &self,
        pid: u32,
        desc: &IpcMemDescriptor,
        on: Option<usize>,
    ) -> Result<MappingLease, CudaIpcError> {
        desc.validate()?;
        let key = Key { pid, handle: desc.handle, buffer_id: desc.buffer_id, on };
        let inner = &self.inner;
        let mut st = inner.lock();
        st.tick += 1;
        let tick = st.tick;
        if let Some(e) = st.entries.get_mut(&key) {
            if e.doomed {
                return Err(CudaIpcError::PeerClosed { pid });
            }
            if e.alloc_len != desc.alloc_len {
                return Err(CudaIpcError::InvalidDescriptor(format!(
                    "allocation length {} differs from the mapped {}",
                    desc.alloc_len, e.alloc_len
                )));
            }
            e.refs += 1;
            e.last_use = tick;
            let (mapping, alloc_len) = (e.mapping, e.alloc_len);
            st.stats.hits += 1;
            drop(st);
            return Ok(self.lease(key, mapping, alloc_len));
        }
        // Miss: make room, then open.
        let want = st.mapped_bytes.saturating_add(desc.alloc_len);
        if want > inner.config.max_mapped_bytes {
            let excess = want - inner.config.max_mapped_bytes;
            inner.evict_lru(&mut st, excess);
        }
        let mut mapping = inner.open_with_retry(&mut st, pid, desc, on)?;
        // A driver that refcounts repeated opens of one allocation hands back an address
        // we already hold under another key (a stale buffer id): drop both references and
        // open again, or refuse while the other key is in use.
        if let Some(alias) = inner.alias_of(&st, &mapping) {
            inner.opener.close(&mapping);
            let in_use = st.entries.get(&alias).is_some_and(|e| e.refs > 0);
            if in_use {
                return Err(CudaIpcError::InvalidDescriptor(
                    "the handle maps onto a mapping in use under another buffer id".into(),
                ));
            }
            inner.close_entry(&mut st, &alias);
            st.stats.evictions += 1;
            mapping = inner.open_with_retry(&mut st, pid, desc, on)?;
            if inner.alias_of(&st, &mapping).is_some() {
                inner.opener.close(&mapping);
                return Err(CudaIpcError::InvalidDescriptor("the handle keeps aliasing another mapping".into()));
            }
        }
        if mapping.len < desc.alloc_len {
            inner.opener.close(&mapping);
            st.stats.closes_total += 1;
            return Err(CudaIpcError::InvalidDescriptor(format!(
                "allocation length {} exceeds the mapped {}",
                desc.alloc_len, mapping.len
            )));
        }
        st.entries
            .insert(key.clone(), Entry { mapping, alloc_len: desc.alloc_len, refs: 1, last_use: tick, doomed: false });
        st.mapped_bytes += desc.alloc_len;
        st.stats.opens_total += 1;
        st.stats.misses += 1;
        drop(st);
        tracing::debug!(pid, buffer_id = desc.buffer_id, bytes = desc.alloc_len, "opened an IPC mapping");
        Ok(self.lease(key, mapping, desc.alloc_len))
    }

    fn lease(&self, key: Key, mapping: OpenedMapping, alloc_len: u64) -> MappingLease {
        MappingLease { cache: self.inner.clone(), key, mapping, alloc_len }
    }

    /// Closes every mapping of process `pid` (it went away). Leased mappings close when
    /// their last lease drops, and new acquisitions for them fail meanwhile. Returns the
    /// number closed now.
    pub fn close_peer(&self, pid: u32) -> usize {
        let inner = &self.inner;
        let mut st = inner.lock();
        let keys: Vec<Key> = st.entries.keys().filter(|k| k.pid == pid).cloned().collect();
        let mut closed = 0;
        for k in keys {
            let unused = st.entries.get(&k).is_some_and(|e| e.refs == 0);
            if unused {
                inner.close_entry(&mut st, &k);
                closed += 1;
            } else if let Some(e) = st.entries.get_mut(&k) {
                e.doomed = true;
            }
        }
        closed
    }

    /// Closes every unused mapping; the number closed.
    pub fn evict_unused(&self) -> usize {
        let inner = &self.inner;
        let mut st = inner.lock();
        inner.evict_lru(&mut st, u64::MAX)
    }

    /// What the cache holds and did.
    pub fn stats(&self) -> CacheStats {
        let st = self.inner.lock();
        let mut s = st.stats;
        s.open_mappings = st.entries.len();
        s.mapped_bytes = st.mapped_bytes;
        s.leased_mappings = st.entries.values().filter(|e| e.refs > 0).count();
        s
    }

    /// The configuration.
    pub fn config(&self) -> CacheConfig {
        self.inner.config
    }
}

impl<O: MappingOpener> fmt::Debug for MappingCache<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MappingCache").field("stats", &self.stats()).finish()
    }
}

impl<O: MappingOpener> Inner<O> {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn alias_of(&self, st: &State, m: &OpenedMapping) -> Option<Key> {
        st.entries
            .iter()
            .find(|(_, e)| e.mapping.ptr == m.ptr && e.mapping.device_ordinal == m.device_ordinal)
            .map(|(k, _)| k.clone())
    }

    fn close_entry(&self, st: &mut State, key: &Key) {
        if let Some(e) = st.entries.remove(key) {
            self.opener.close(&e.mapping);
            st.mapped_bytes -= e.alloc_len;
            st.stats.closes_total += 1;
        }
    }

    /// Closes unused mappings, least recently used first, until `bytes` were freed or none
    /// is left. Returns the number closed.
    fn evict_lru(&self, st: &mut State, bytes: u64) -> usize {
        let mut unused: Vec<(u64, Key, u64)> =
            st.entries.iter().filter(|(_, e)| e.refs == 0).map(|(k, e)| (e.last_use, k.clone(), e.alloc_len)).collect();
        unused.sort_by_key(|(t, _, _)| *t);
        let (mut freed, mut n) = (0u64, 0usize);
        for (_, k, len) in unused {
            if freed >= bytes {
                break;
            }
            self.close_entry(st, &k);
            st.stats.evictions += 1;
            freed = freed.saturating_add(len);
            n += 1;
        }
        n
    }

    fn evict_matching(&self, st: &mut State, pred: impl Fn(&Key) -> bool) -> usize {
        let keys: Vec<Key> =
            st.entries.iter().filter(|(k, e)| e.refs == 0 && pred(k)).map(|(k, _)| k.clone()).collect();
        let n = keys.len();
        for k in keys {
            self.close_entry(st, &k);
            st.stats.evictions += 1;
        }
        n
    }

    fn open_with_retry(
        &self,
        st: &mut State,
        pid: u32,
        desc: &IpcMemDescriptor,
        on: Option<usize>,
    ) -> Result<OpenedMapping, CudaIpcError> {
        let mut step = 0;
        loop {
            match self.opener.open(desc, on) {
                Ok(m) => return Ok(m),
                Err(e) if e.is_code(codes::ALREADY_MAPPED) && step < 3 => {
                    let evicted = match step {
                        0 => self.evict_matching(st, |k| k.pid == pid && k.handle == desc.handle),
                        1 => self.evict_matching(st, |k| k.pid == pid),
                        _ => self.evict_matching(st, |_| true),
                    };
                    tracing::debug!(pid, step, evicted, "CUDA_ERROR_ALREADY_MAPPED: evicted unused mappings, retrying");
                    step += 1;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn release(&self, key: &Key) {
        let mut st = self.lock();
        st.tick += 1;
        let tick = st.tick;
        let close_now = match st.entries.get_mut(key) {
            Some(e) => {
                e.refs = e.refs.saturating_sub(1);
                e.last_use = tick;
                e.refs == 0 && e.doomed
            }
            None => false,
        };
        if close_now {
            self.close_entry(&mut st, key);
        } else if st.mapped_bytes > self.config.max_mapped_bytes {
            let excess = st.mapped_bytes - self.config.max_mapped_bytes;
            self.evict_lru(&mut st, excess);
        }
    }
}

impl<O: MappingOpener> Drop for Inner<O> {
    fn drop(&mut self) {
        // No lease is left (each holds the Arc): close everything.
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for (_, e) in st.entries.drain() {
            self.opener.close(&e.mapping);
        }
    }
}

trait Release: Send + Sync {
    fn retain(&self, key: &Key);
    fn release(&self, key: &Key);
}

impl<O: MappingOpener> Release for Inner<O> {
    fn retain(&self, key: &Key) {
        if let Some(e) = self.lock().entries.get_mut(key) {
            e.refs += 1;
        }
    }
    fn release(&self, key: &Key) {
        Inner::release(self, key)
    }
}

/// A use of a mapping: while any lease lives, the mapping stays open. Hold it until the
/// copies reading through it completed.
pub struct MappingLease {
    cache: Arc<dyn Release>,
    key: Key,
    mapping: OpenedMapping,
    alloc_len: u64,
}

impl MappingLease {
    /// Base address of the mapping in this process.
    pub fn base_ptr(&self) -> u64 {
        self.mapping.ptr
    }
    /// Address of `offset..offset+len` of the mapped allocation, checked against its size.
    pub fn range_ptr(&self, offset: u64, len: u64) -> Result<u64, CudaIpcError> {
        check_range(offset, len, self.alloc_len)?;
        Ok(self.mapping.ptr + offset)
    }
    /// Size of the mapped allocation.
    pub fn alloc_len(&self) -> u64 {
        self.alloc_len
    }
    /// The device (ordinal in this process) the mapping was opened on.
    pub fn device_ordinal(&self) -> usize {
        self.mapping.device_ordinal
    }
    /// The exporter's pid.
    pub fn peer_pid(&self) -> u32 {
        self.key.pid
    }
    /// The exporter's buffer id of the allocation.
    pub fn buffer_id(&self) -> u64 {
        self.key.buffer_id
    }
}

impl Clone for MappingLease {
    fn clone(&self) -> Self {
        // A clone is one more reference; the entry exists while `self` holds one.
        self.cache.retain(&self.key);
        MappingLease {
            cache: self.cache.clone(),
            key: self.key.clone(),
            mapping: self.mapping,
            alloc_len: self.alloc_len,
        }
    }
}

impl Drop for MappingLease {
    fn drop(&mut self) {
        self.cache.release(&self.key);
    }
}

impl fmt::Debug for MappingLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MappingLease")
            .field("pid", &self.key.pid)
            .field("buffer_id", &self.key.buffer_id)
            .field("ptr", &format_args!("{:#x}", self.mapping.ptr))
            .field("alloc_len", &self.alloc_len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
            let ptr = 0x1000_0000 * (self.next.fetch_add(1, Ordering::SeqCst) + 1);
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
}
