//! The tiered store: [`SpillStore`]'s operations.
//!
//! - `config`: [`SpillConfig`], [`DeviceAllocator`], [`SpillStats`], [`TierStats`];
//! - `copy_out`: [`SpillStore::read`], a copy of an entry that stays in place;
//! - `state`: the index, LRU orders and byte counts, guarded by one mutex;
//! - `evict`: where a new entry goes and how room is made (the eviction policy);
//! - `files`: the entry files of the disk tier;
//! - `aside`: the store's threads for work its callers need not wait for: `remover`
//!   (large files of departed entries) and `releaser` (large evicted host copies);
//! - `unspill`: bringing host frames back to their device.
//!
//! Every operation, its copies and its file I/O included, runs with the mutex held (see
//! the crate documentation, "Concurrency").

mod aside;
mod config;
mod copy_out;
mod evict;
mod files;
mod releaser;
mod remover;
mod state;
mod unspill;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::Hash;
use std::path::Path;
use std::sync::Mutex;

use ferrylink_memory::serialize::FrameOrigin;
use ferrylink_memory::{MakeRoom, Message, NoRoom};

pub use config::{DeviceAllocator, SpillConfig, SpillStats, TierStats};
use releaser::HostReleaser;
pub use releaser::RELEASE_ASIDE_MIN;
use remover::FileRemover;
pub use remover::REMOVE_ASIDE_MIN;
use state::{lock, usage_of, Entry, Place, Shared, State};
use unspill::{host_message, split_host, Unspill};

use crate::disk::SpillDir;
use crate::{Rejected, SpillError, Tier};

/// A tiered device → host → disk store of [`Message`]s.
///
/// See the [crate documentation](crate) for semantics.
pub struct SpillStore<K> {
    state: Mutex<State<K>>,
    shared: Shared,
}

impl<K: Eq + Hash + Clone + Send + 'static> SpillStore<K> {
    /// Creates the store's directory (removing directories of dead processes first).
    pub fn new(config: SpillConfig) -> Result<Self, SpillError> {
        let dir = SpillDir::create(&config.disk_dir)?;
        tracing::debug!(dir = %dir.path().display(), ?config, "spill store created");
        Ok(Self {
            state: Mutex::new(State {
                entries: HashMap::new(),
                lru: [BTreeMap::new(), BTreeMap::new(), BTreeMap::new()],
                device_used: HashMap::new(),
                host_used: 0,
                disk_used: 0,
                tick: 0,
                next_file: 0,
                stats: SpillStats::default(),
                evicted: config.record_evictions.then(Vec::new),
            }),
            shared: Shared {
                device_budget: config.device_budget,
                host_budget: config.host_budget,
                pool: config.pinned_pool,
                alloc: config.device_allocator,
                remover: FileRemover::new(config.disk_io.clone()),
                releaser: HostReleaser::new(),
                io: config.disk_io,
                dir,
            },
        })
    }

    /// The store's own directory (removed on drop).
    pub fn dir(&self) -> &Path {
        self.shared.dir.path()
    }

    /// Inserts (or replaces) an entry in the highest tier it fits, evicting least recently
    /// used entries down a tier as needed. On failure the message comes back in the
    /// [`Rejected`] (possibly with its device frames already copied to host frames) and
    /// the store is as consistent as before (evictions already done stay done). A replaced
    /// entry is dropped first, even if the insert then fails.
    pub fn insert(&self, key: K, message: Message) -> Result<(), Rejected> {
        let mut st = lock(&self.state);
        if let Some(old) = st.detach(&key) {
            self.shared.drop_place(old.place);
        }
        self.shared.place_new(&mut st, key, message)
    }

    /// Removes the entry and returns it, unspilled: read back from disk (checksum
    /// verified), and its device frames copied back to their devices when a device
    /// allocator is configured and the device budget can hold them (evicting others);
    /// otherwise those frames come back as host frames. On error the entry stays where it
    /// was.
    pub fn take(&self, key: &K) -> Result<Option<Message>, SpillError> {
        self.take_inner(key, true)
    }

    /// Like [`take`](Self::take), but device frames that were evicted stay host frames
    /// (no device allocation).
    pub fn take_host(&self, key: &K) -> Result<Option<Message>, SpillError> {
        self.take_inner(key, false)
    }

    fn take_inner(&self, key: &K, device: bool) -> Result<Option<Message>, SpillError> {
        let mut st = lock(&self.state);
        let sh = &self.shared;
        let Some(entry) = st.entries.get(key) else { return Ok(None) };
        let hm = match &entry.place {
            Place::Device { .. } => {
                return Ok(st.detach(key).and_then(|e| match e.place {
                    Place::Device { msg, .. } => Some(msg),
                    _ => None,
                }));
            }
            Place::Host { .. } => {
                let Some(Entry { tick, place: Place::Host { msg, origins } }) = st.detach(key) else {
                    return Ok(None);
                };
                if !device {
                    return Ok(Some(msg));
                }
                match sh.to_device(&mut st, host_message(msg, origins)) {
                    Unspill::Device(m) => return Ok(Some(m)),
                    Unspill::Host(hm) => return Ok(Some(hm.into_message())),
                    Unspill::Failed(e, hm) => {
                        let (msg, origins) = split_host(hm);
                        st.attach(key.clone(), Place::Host { msg, origins }, Some(tick));
                        return Err(e);
                    }
                }
            }
            Place::Disk { path, file_len, .. } => {
                let (path, file_len) = (path.clone(), *file_len);
                let hm = sh.read(&mut st, &path, file_len)?;
                (hm, path, file_len)
            }
        };
        let (hm, path, file_len) = hm;
        let msg = if device {
            match sh.to_device(&mut st, hm) {
                Unspill::Device(m) => m,
                Unspill::Host(hm) => hm.into_message(),
                Unspill::Failed(e, _) => return Err(e), // the file is still there
            }
        } else {
            hm.into_message()
        };
        st.detach(key);
        sh.remove_file(path, file_len);
        Ok(Some(msg))
    }

    /// Gives `f` access to the entry without removing it, after bringing it up: from disk
    /// to host (or device), from host to device when it came from a device and a device
    /// allocator is configured, evicting others as needed. An entry that fits no higher
    /// tier is read for `f` and stays where it is. Marks the entry most recently used.
    ///
    /// `f` runs with the store locked: it must not call the store.
    pub fn with<R>(&self, key: &K, f: impl FnOnce(&Message) -> R) -> Result<Option<R>, SpillError> {
        let mut st = lock(&self.state);
        let sh = &self.shared;
        let Some(entry) = st.entries.get(key) else { return Ok(None) };
        match &entry.place {
            Place::Device { .. } => st.touch(key),
            Place::Host { origins, .. } => {
                let promotable = sh.alloc.is_some() && origins.iter().any(|o| matches!(o, FrameOrigin::Device { .. }));
                if promotable {
                    let Some(Entry { tick, place: Place::Host { msg, origins } }) = st.detach(key) else {
                        return Ok(None);
                    };
                    match sh.to_device(&mut st, host_message(msg, origins)) {
                        Unspill::Device(m) => {
                            let usage = usage_of(&m);
                            st.attach(key.clone(), Place::Device { msg: m, usage }, None);
                        }
                        Unspill::Host(hm) | Unspill::Failed(_, hm) => {
                            let (msg, origins) = split_host(hm);
                            st.attach(key.clone(), Place::Host { msg, origins }, Some(tick));
                            st.touch(key);
                        }
                    }
                } else {
                    st.touch(key);
                }
            }
            Place::Disk { path, file_len, bytes } => {
                let (path, file_len, bytes) = (path.clone(), *file_len, *bytes);
                let hm = sh.read(&mut st, &path, file_len)?;
                let hm = match sh.to_device(&mut st, hm) {
                    Unspill::Device(m) => {
                        st.detach(key);
                        sh.remove_file(path, file_len);
                        let usage = usage_of(&m);
                        st.attach(key.clone(), Place::Device { msg: m, usage }, None);
                        return Ok(Some(self.apply(&st, key, f)));
                    }
                    Unspill::Host(hm) | Unspill::Failed(_, hm) => hm,
                };
                if bytes <= sh.host_budget && sh.make_room_host(&mut st, bytes).is_ok() {
                    st.detach(key);
                    sh.remove_file(path, file_len);
                    let (msg, origins) = split_host(hm);
                    st.attach(key.clone(), Place::Host { msg, origins }, None);
                } else {
                    st.touch(key);
                    return Ok(Some(f(&hm.into_message())));
                }
            }
        }
        Ok(Some(self.apply(&st, key, f)))
    }

    fn apply<R>(&self, st: &State<K>, key: &K, f: impl FnOnce(&Message) -> R) -> R {
        match st.entries.get(key).map(|e| &e.place) {
            Some(Place::Device { msg, .. }) | Some(Place::Host { msg, .. }) => f(msg),
            _ => f(&Message::default()), // not reached: callers just placed it in memory
        }
    }

    /// Drops the entry (deleting its file). Whether it was there.
    pub fn remove(&self, key: &K) -> bool {
        let mut st = lock(&self.state);
        match st.detach(key) {
            Some(e) => {
                self.shared.drop_place(e.place);
                true
            }
            None => false,
        }
    }

    /// Moves the least recently used entry of `tier` one tier down (device → host, or
    /// disk when it is larger than the host budget; host → disk), as a caller under
    /// memory pressure asks for: its key and the bytes it freed in `tier`, or `None` when
    /// the tier is empty (and for the disk tier, which has nothing below it). Those bytes
    /// are freed when it returns (an evicted copy is not left to the store's thread). On
    /// error the entry stays where it was.
    pub fn evict_lru(&self, tier: Tier) -> Result<Option<(K, usize)>, SpillError> {
        let mut st = lock(&self.state);
        let Some(key) = st.lru[tier as usize].values().next().cloned() else { return Ok(None) };
        let bytes = match st.entries.get(&key).map(|e| &e.place) {
            Some(Place::Device { usage, .. }) => usage.iter().map(|u| u.1).sum(),
            Some(Place::Host { msg, .. }) => msg.payload_len(),
            Some(Place::Disk { .. }) | None => return Ok(None),
        };
        match tier {
            Tier::Device => self.shared.evict_device(&mut st, &key)?,
            Tier::Host => self.shared.evict_host(&mut st, &key)?,
            Tier::Disk => return Ok(None),
        }
        // The caller is under memory pressure: the bytes are freed when this returns.
        self.shared.releaser.wait_until_freed();
        Ok(Some((key, bytes)))
    }

    /// The keys of the entries moved down a tier (by any operation) since the last call,
    /// oldest first; always empty unless the store was configured with
    /// [`SpillConfig::record_evictions`]. A key can appear more than once.
    pub fn drain_evicted(&self) -> Vec<K> {
        lock(&self.state).evicted.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Whether the key has an entry.
    pub fn contains(&self, key: &K) -> bool {
        lock(&self.state).entries.contains_key(key)
    }

    /// The tier the entry is in.
    pub fn tier(&self, key: &K) -> Option<Tier> {
        lock(&self.state).entries.get(key).map(|e| e.place.tier())
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        lock(&self.state).entries.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Device bytes counted on `device_ordinal`.
    pub fn device_bytes(&self, device_ordinal: usize) -> usize {
        lock(&self.state).device_used(device_ordinal)
    }

    /// Counters and per-tier sizes.
    pub fn stats(&self) -> SpillStats {
        let st = lock(&self.state);
        let mut s = st.stats.clone();
        s.device = TierStats { entries: st.lru[0].len(), bytes: st.device_used.values().sum() };
        s.host = TierStats { entries: st.lru[1].len(), bytes: st.host_used };
        s.host_releasing = self.shared.releaser.releasing();
        s.disk = TierStats { entries: st.lru[2].len(), bytes: st.disk_used };
        s
    }
}

impl<K: Eq + Hash + Clone + Send + 'static> MakeRoom for SpillStore<K> {
    /// Evicts least recently used device entries with bytes on `device_ordinal` (to host,
    /// or disk) until `bytes` more fit under the device budget. Room is not reserved: the
    /// caller lands its frame and inserts it, and a concurrent insert may take the room.
    fn make_room(&self, device_ordinal: usize, bytes: usize) -> Result<(), NoRoom> {
        let mut st = lock(&self.state);
        self.shared.make_room_device(&mut st, device_ordinal, bytes).map_err(|e| NoRoom {
            device_ordinal,
            requested: bytes,
            reason: e.to_string(),
        })
    }
}

impl<K> fmt::Debug for SpillStore<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpillStore").field("dir", &self.shared.dir.path()).finish_non_exhaustive()
    }
}
