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
//!
//! Files: `opener` (the CUDA side), `config` (limits and counters), `state` (the
//! bookkeeping), `lease` ([`MappingLease`]); this one holds [`MappingCache`] itself.

mod config;
mod lease;
mod opener;
mod state;

use super::descriptor::IpcMemDescriptor;
use super::error::CudaIpcError;
use state::{Entry, Inner, Key, State};
use std::fmt;
use std::sync::{Arc, Mutex};

pub use config::{CacheConfig, CacheStats};
pub use lease::MappingLease;
pub use opener::{CudaOpener, MappingOpener, OpenedMapping};

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
        if let Err(e) = check_mapping(&mapping, desc.alloc_len) {
            inner.opener.close(&mapping);
            st.stats.closes_total += 1;
            return Err(e);
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

/// Checks what the opener mapped for an allocation the peer says is `alloc_len` bytes:
/// a non-null mapping that does not wrap around the address space (leases add offsets to
/// its base) and holds at least `alloc_len` bytes.
fn check_mapping(mapping: &OpenedMapping, alloc_len: u64) -> Result<(), CudaIpcError> {
    if mapping.ptr == 0 || mapping.ptr.checked_add(mapping.len).is_none() {
        return Err(CudaIpcError::Cuda(ferrylink_memory::cuda::CudaError::InvalidArgument {
            call: "cuIpcOpenMemHandle",
            reason: format!("the mapping {:#x}+{:#x} is unusable", mapping.ptr, mapping.len),
        }));
    }
    if mapping.len < alloc_len {
        return Err(CudaIpcError::InvalidDescriptor(format!(
            "allocation length {alloc_len} exceeds the mapped {}",
            mapping.len
        )));
    }
    Ok(())
}

impl<O: MappingOpener> fmt::Debug for MappingCache<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MappingCache").field("stats", &self.stats()).finish()
    }
}

#[cfg(test)]
mod tests;
