//! The store's bookkeeping: where each entry is ([`Place`]), the per-tier LRU orders and
//! byte counts ([`State`], guarded by the store's mutex), and the fixed set-up every
//! operation reads ([`Shared`]).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use ferrylink_memory::serialize::FrameOrigin;
use ferrylink_memory::{Frame, HostBuffer, Message, PinnedPool};

use super::config::{DeviceAllocator, SpillStats};
use super::releaser::HostReleaser;
use super::remover::FileRemover;
use crate::disk::{DiskIo, SpillDir};
use crate::{SpillError, Tier};

pub(super) enum Place {
    Device { msg: Message, usage: Vec<(usize, usize)> },
    Host { msg: Message, origins: Vec<FrameOrigin> },
    Disk { path: PathBuf, bytes: usize, file_len: u64 },
}

impl Place {
    pub(super) fn tier(&self) -> Tier {
        match self {
            Place::Device { .. } => Tier::Device,
            Place::Host { .. } => Tier::Host,
            Place::Disk { .. } => Tier::Disk,
        }
    }
}

pub(super) struct Entry {
    pub(super) tick: u64,
    pub(super) place: Place,
}

pub(super) struct State<K> {
    pub(super) entries: HashMap<K, Entry>,
    pub(super) lru: [BTreeMap<u64, K>; 3],
    pub(super) device_used: HashMap<usize, usize>,
    pub(super) host_used: usize,
    pub(super) disk_used: usize,
    pub(super) tick: u64,
    pub(super) next_file: u64,
    pub(super) stats: SpillStats,
    /// Keys moved down a tier since the last drain, when the store records them
    /// ([`SpillConfig::record_evictions`](super::SpillConfig::record_evictions)).
    pub(super) evicted: Option<Vec<K>>,
}

pub(super) struct Shared {
    pub(super) device_budget: usize,
    pub(super) host_budget: usize,
    pub(super) pool: Option<PinnedPool>,
    pub(super) alloc: Option<Arc<dyn DeviceAllocator>>,
    pub(super) io: Arc<dyn DiskIo>,
    /// Before `dir`: dropped first, it waits for the removals it queued.
    pub(super) remover: FileRemover,
    pub(super) releaser: HostReleaser,
    pub(super) dir: SpillDir,
}

pub(super) fn usage_of(msg: &Message) -> Vec<(usize, usize)> {
    let mut usage: Vec<(usize, usize)> = Vec::new();
    for d in msg.frames.iter().filter_map(Frame::as_device) {
        match usage.iter_mut().find(|u| u.0 == d.device_ordinal()) {
            Some(u) => u.1 += d.len(),
            None => usage.push((d.device_ordinal(), d.len())),
        }
    }
    usage
}

pub(super) fn usage_of_origins(frames: &[HostBuffer], origins: &[FrameOrigin]) -> Vec<(usize, usize)> {
    let mut usage: Vec<(usize, usize)> = Vec::new();
    for (f, o) in frames.iter().zip(origins) {
        if let FrameOrigin::Device { ordinal } = *o {
            match usage.iter_mut().find(|u| u.0 == ordinal) {
                Some(u) => u.1 += f.len(),
                None => usage.push((ordinal, f.len())),
            }
        }
    }
    usage
}

impl<K: Eq + Hash + Clone> State<K> {
    pub(super) fn attach(&mut self, key: K, place: Place, tick: Option<u64>) {
        let tick = tick.unwrap_or_else(|| {
            self.tick += 1;
            self.tick
        });
        match &place {
            Place::Device { usage, .. } => {
                for &(d, b) in usage {
                    *self.device_used.entry(d).or_default() += b;
                }
            }
            Place::Host { msg, .. } => self.host_used += msg.payload_len(),
            Place::Disk { bytes, .. } => self.disk_used += bytes,
        }
        self.lru[place.tier() as usize].insert(tick, key.clone());
        self.entries.insert(key, Entry { tick, place });
    }

    pub(super) fn detach(&mut self, key: &K) -> Option<Entry> {
        let e = self.entries.remove(key)?;
        self.lru[e.place.tier() as usize].remove(&e.tick);
        match &e.place {
            Place::Device { usage, .. } => {
                for &(d, b) in usage {
                    if let Some(u) = self.device_used.get_mut(&d) {
                        *u -= b;
                    }
                }
            }
            Place::Host { msg, .. } => self.host_used -= msg.payload_len(),
            Place::Disk { bytes, .. } => self.disk_used -= bytes,
        }
        Some(e)
    }

    pub(super) fn touch(&mut self, key: &K) {
        if let Some(e) = self.entries.get_mut(key) {
            let lru = &mut self.lru[e.place.tier() as usize];
            lru.remove(&e.tick);
            self.tick += 1;
            e.tick = self.tick;
            lru.insert(e.tick, key.clone());
        }
    }

    /// Notes that `key` moved down a tier (when the store records evictions).
    pub(super) fn record_eviction(&mut self, key: &K) {
        if let Some(evicted) = &mut self.evicted {
            evicted.push(key.clone());
        }
    }

    pub(super) fn device_used(&self, ordinal: usize) -> usize {
        self.device_used.get(&ordinal).copied().unwrap_or(0)
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    pub(super) fn no_room(&self, tier: Tier, requested: usize, reason: impl Into<String>) -> SpillError {
        let budget = match tier {
            Tier::Device => self.device_budget,
            Tier::Host => self.host_budget,
            Tier::Disk => usize::MAX,
        };
        SpillError::NoRoom { tier, requested, budget, reason: reason.into() }
    }
}
