//! The cache's bookkeeping: entries keyed by exporter pid + handle + buffer id + device,
//! reference counts, least-recently-used eviction under the mapped-bytes limit, the
//! `CUDA_ERROR_ALREADY_MAPPED` retry, and the retain/release interface leases call.

use super::config::{CacheConfig, CacheStats};
use super::opener::{MappingOpener, OpenedMapping};
use crate::cuda_ipc::descriptor::IpcMemDescriptor;
use crate::cuda_ipc::error::CudaIpcError;
use ferrylink_memory::cuda::codes;
use std::collections::HashMap;
use std::sync::Mutex;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Key {
    pub(super) pid: u32,
    pub(super) handle: [u8; 64],
    pub(super) buffer_id: u64,
    /// The device whose context holds the mapping (`None`: the allocation's own).
    pub(super) on: Option<usize>,
}

pub(super) struct Entry {
    pub(super) mapping: OpenedMapping,
    pub(super) alloc_len: u64,
    pub(super) refs: usize,
    pub(super) last_use: u64,
    pub(super) doomed: bool,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) entries: HashMap<Key, Entry>,
    pub(super) tick: u64,
    pub(super) mapped_bytes: u64,
    pub(super) stats: CacheStats,
}

pub(super) struct Inner<O: MappingOpener> {
    pub(super) opener: O,
    pub(super) config: CacheConfig,
    pub(super) state: Mutex<State>,
}

impl<O: MappingOpener> Inner<O> {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn alias_of(&self, st: &State, m: &OpenedMapping) -> Option<Key> {
        st.entries
            .iter()
            .find(|(_, e)| e.mapping.ptr == m.ptr && e.mapping.device_ordinal == m.device_ordinal)
            .map(|(k, _)| k.clone())
    }

    pub(super) fn close_entry(&self, st: &mut State, key: &Key) {
        if let Some(e) = st.entries.remove(key) {
            self.opener.close(&e.mapping);
            st.mapped_bytes -= e.alloc_len;
            st.stats.closes_total += 1;
        }
    }

    /// Closes unused mappings, least recently used first, until `bytes` were freed or none
    /// is left. Returns the number closed.
    pub(super) fn evict_lru(&self, st: &mut State, bytes: u64) -> usize {
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

    pub(super) fn evict_matching(&self, st: &mut State, pred: impl Fn(&Key) -> bool) -> usize {
        let keys: Vec<Key> =
            st.entries.iter().filter(|(k, e)| e.refs == 0 && pred(k)).map(|(k, _)| k.clone()).collect();
        let n = keys.len();
        for k in keys {
            self.close_entry(st, &k);
            st.stats.evictions += 1;
        }
        n
    }

    pub(super) fn open_with_retry(
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

    pub(super) fn release(&self, key: &Key) {
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

pub(super) trait Release: Send + Sync {
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
