//! The tiered store.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::Hash;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use ferrylink_memory::serialize::{
    assemble_host, device_frames_to_host, host_to_device, FrameOrigin, HostMessage, SerializeError,
};
use ferrylink_memory::{DeviceBuffer, Frame, HostBuffer, MakeRoom, Message, NoRoom, PinnedPool};

use crate::crc::Crc32c;
use crate::disk::{encode_meta, file_len, read_entry, DiskIo, RealDiskIo, SpillDir};
use crate::{Rejected, SpillError};

/// Where an entry lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    /// Device memory (the message has device frames).
    Device = 0,
    /// Host memory.
    Host = 1,
    /// A file in the store's directory.
    Disk = 2,
}

/// Device memory for entries brought back to the device (unspill).
pub trait DeviceAllocator: Send + Sync {
    /// `len` bytes on device `device_ordinal`.
    fn alloc(&self, device_ordinal: usize, len: usize) -> Result<DeviceBuffer, SerializeError>;
}

impl<F> DeviceAllocator for F
where
    F: Fn(usize, usize) -> Result<DeviceBuffer, SerializeError> + Send + Sync,
{
    fn alloc(&self, device_ordinal: usize, len: usize) -> Result<DeviceBuffer, SerializeError> {
        self(device_ordinal, len)
    }
}

/// How a [`SpillStore`] is set up.
#[derive(Clone)]
pub struct SpillConfig {
    /// Device bytes allowed per device (device frames of device-tier entries).
    pub device_budget: usize,
    /// Host bytes allowed (payload bytes of host-tier entries).
    pub host_budget: usize,
    /// Parent of the store's own directory (`<disk_dir>/ferrylink-spill-<pid>-<n>`).
    pub disk_dir: PathBuf,
    /// Host memory for evicted and unspilled frames; fresh memory when `None`.
    pub pinned_pool: Option<PinnedPool>,
    /// Device memory for unspilled device frames; without it, entries that were evicted
    /// from the device come back as host frames.
    pub device_allocator: Option<Arc<dyn DeviceAllocator>>,
    /// File I/O of the disk tier.
    pub disk_io: Arc<dyn DiskIo>,
}

impl SpillConfig {
    /// Budgets and directory; no pool, no device allocator, real disk I/O.
    pub fn new(device_budget: usize, host_budget: usize, disk_dir: impl Into<PathBuf>) -> Self {
        Self {
            device_budget,
            host_budget,
            disk_dir: disk_dir.into(),
            pinned_pool: None,
            device_allocator: None,
            disk_io: Arc::new(RealDiskIo::default()),
        }
    }
    /// Uses `pool` for host copies.
    pub fn with_pinned_pool(mut self, pool: PinnedPool) -> Self {
        self.pinned_pool = Some(pool);
        self
    }
    /// Uses `alloc` to bring device frames back.
    pub fn with_device_allocator(mut self, alloc: Arc<dyn DeviceAllocator>) -> Self {
        self.device_allocator = Some(alloc);
        self
    }
    /// Uses `io` for the disk tier.
    pub fn with_disk_io(mut self, io: Arc<dyn DiskIo>) -> Self {
        self.disk_io = io;
        self
    }
}

impl fmt::Debug for SpillConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpillConfig")
            .field("device_budget", &self.device_budget)
            .field("host_budget", &self.host_budget)
            .field("disk_dir", &self.disk_dir)
            .field("pinned_pool", &self.pinned_pool.is_some())
            .field("device_allocator", &self.device_allocator.is_some())
            .finish_non_exhaustive()
    }
}

/// Entries and bytes of one tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Entries.
    pub entries: usize,
    /// Bytes counted against the tier (device: device frames, summed over devices;
    /// host and disk: payload bytes).
    pub bytes: usize,
}

/// Counters of a [`SpillStore`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpillStats {
    /// Device tier.
    pub device: TierStats,
    /// Host tier.
    pub host: TierStats,
    /// Disk tier.
    pub disk: TierStats,
    /// Evictions device → host.
    pub device_to_host: u64,
    /// Evictions (or inserts) device → disk, for entries larger than the host budget.
    pub device_to_disk: u64,
    /// Evictions host → disk.
    pub host_to_disk: u64,
    /// Entries read back from disk (unspill).
    pub unspilled_from_disk: u64,
    /// Entries copied back to the device (unspill).
    pub unspilled_to_device: u64,
    /// Bytes written to spill files (whole files).
    pub disk_bytes_written: u64,
    /// Bytes read from spill files.
    pub disk_bytes_read: u64,
    /// Failed disk writes (the entry stayed where it was).
    pub disk_write_errors: u64,
}

impl SpillStats {
    /// All evictions.
    pub fn evictions(&self) -> u64 {
        self.device_to_host + self.device_to_disk + self.host_to_disk
    }
    /// All unspills.
    pub fn unspills(&self) -> u64 {
        self.unspilled_from_disk + self.unspilled_to_device
    }
}

enum Place {
    Device { msg: Message, usage: Vec<(usize, usize)> },
    Host { msg: Message, origins: Vec<FrameOrigin> },
    Disk { path: PathBuf, bytes: usize, file_len: u64 },
}

impl Place {
    fn tier(&self) -> Tier {
        match self {
            Place::Device { .. } => Tier::Device,
            Place::Host { .. } => Tier::Host,
            Place::Disk { .. } => Tier::Disk,
        }
    }
}

struct Entry {
    tick: u64,
    place: Place,
}

struct State<K> {
    entries: HashMap<K, Entry>,
    lru: [BTreeMap<u64, K>; 3],
    device_used: HashMap<usize, usize>,
    host_used: usize,
    disk_used: usize,
    tick: u64,
    next_file: u64,
    stats: SpillStats,
}

struct Shared {
    device_budget: usize,
    host_budget: usize,
    pool: Option<PinnedPool>,
    alloc: Option<Arc<dyn DeviceAllocator>>,
    io: Arc<dyn DiskIo>,
    dir: SpillDir,
}

/// A tiered device → host → disk store of [`Message`]s.
///
/// See the [crate documentation](crate) for semantics.
pub struct SpillStore<K> {
    state: Mutex<State<K>>,
    shared: Shared,
}

fn usage_of(msg: &Message) -> Vec<(usize, usize)> {
    let mut usage: Vec<(usize, usize)> = Vec::new();
    for d in msg.frames.iter().filter_map(Frame::as_device) {
        match usage.iter_mut().find(|u| u.0 == d.device_ordinal()) {
            Some(u) => u.1 += d.len(),
            None => usage.push((d.device_ordinal(), d.len())),
        }
    }
    usage
}

fn usage_of_origins(frames: &[HostBuffer], origins: &[FrameOrigin]) -> Vec<(usize, usize)> {
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
    fn attach(&mut self, key: K, place: Place, tick: Option<u64>) {
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

    fn detach(&mut self, key: &K) -> Option<Entry> {
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

    fn touch(&mut self, key: &K) {
        if let Some(e) = self.entries.get_mut(key) {
            let lru = &mut self.lru[e.place.tier() as usize];
            lru.remove(&e.tick);
            self.tick += 1;
            e.tick = self.tick;
            lru.insert(e.tick, key.clone());
        }
    }

    fn device_used(&self, ordinal: usize) -> usize {
        self.device_used.get(&ordinal).copied().unwrap_or(0)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn no_room(&self, tier: Tier, requested: usize, reason: impl Into<String>) -> SpillError {
        let budget = match tier {
            Tier::Device => self.device_budget,
            Tier::Host => self.host_budget,
            Tier::Disk => usize::MAX,
        };
        SpillError::NoRoom { tier, requested, budget, reason: reason.into() }
    }

    /// Writes one entry file (temp + rename). Nothing is left behind on failure.
    fn write_file<K>(
        &self,
        st: &mut State<K>,
        header: &[u8],
        frames: &[&[u8]],
        origins: &[FrameOrigin],
    ) -> Result<(PathBuf, u64), SpillError> {
        st.next_file += 1;
        let n = st.next_file;
        let path = self.dir.path().join(format!("{n}.spill"));
        let tmp = self.dir.path().join(format!("{n}.tmp"));
        let layout: Vec<(usize, FrameOrigin)> = frames.iter().map(|f| f.len()).zip(origins.iter().copied()).collect();
        let meta = encode_meta(header, &layout);
        let mut crc = Crc32c::new();
        crc.update(&meta);
        crc.update(header);
        frames.iter().for_each(|f| crc.update(f));
        let trailer = crc.finish().to_le_bytes();
        let mut parts: Vec<&[u8]> = Vec::with_capacity(frames.len() + 3);
        parts.push(&meta);
        parts.push(header);
        parts.extend_from_slice(frames);
        parts.push(&trailer);
        let len = file_len(header.len(), &layout);
        let result = self
            .io
            .write_file(&tmp, &parts)
            .map_err(|source| SpillError::Io { op: "write", path: tmp.clone(), source })
            .and_then(|()| {
                self.io.rename(&tmp, &path).map_err(|source| SpillError::Io {
                    op: "rename",
                    path: path.clone(),
                    source,
                })
            });
        match result {
            Ok(()) => {
                st.stats.disk_bytes_written += len;
                Ok((path, len))
            }
            Err(e) => {
                st.stats.disk_write_errors += 1;
                if let Err(r) = self.io.remove_file(&tmp) {
                    if r.kind() != std::io::ErrorKind::NotFound {
                        tracing::warn!(path = %tmp.display(), "could not remove partial spill file: {r}");
                    }
                }
                tracing::warn!("spill to disk failed, entry kept in memory: {e}");
                Err(e)
            }
        }
    }

    fn remove_file(&self, path: &Path) {
        if let Err(e) = self.io.remove_file(path) {
            tracing::warn!(path = %path.display(), "could not remove spill file: {e}");
        }
    }

    fn drop_place(&self, place: Place) {
        if let Place::Disk { path, .. } = place {
            self.remove_file(&path);
        }
    }

    /// Evicts host LRU entries to disk until `bytes` more fit in the host budget.
    fn make_room_host<K: Eq + Hash + Clone>(&self, st: &mut State<K>, bytes: usize) -> Result<(), SpillError> {
        if bytes > self.host_budget {
            return Err(self.no_room(Tier::Host, bytes, "larger than the host budget"));
        }
        while st.host_used + bytes > self.host_budget {
            let Some(key) = st.lru[Tier::Host as usize].values().next().cloned() else {
                return Err(self.no_room(Tier::Host, bytes, "nothing left to evict"));
            };
            self.evict_host(st, &key)?;
        }
        Ok(())
    }

    fn evict_host<K: Eq + Hash + Clone>(&self, st: &mut State<K>, key: &K) -> Result<(), SpillError> {
        let Some(Entry { tick, place: Place::Host { msg, origins } }) = st.detach(key) else {
            return Ok(());
        };
        let slices: Vec<&[u8]> = msg.frames.iter().filter_map(Frame::as_host).map(HostBuffer::as_slice).collect();
        match self.write_file(st, &msg.header, &slices, &origins) {
            Ok((path, file_len)) => {
                let bytes = msg.payload_len();
                drop(slices);
                drop(msg);
                st.attach(key.clone(), Place::Disk { path, bytes, file_len }, Some(tick));
                st.stats.host_to_disk += 1;
                Ok(())
            }
            Err(e) => {
                drop(slices);
                st.attach(key.clone(), Place::Host { msg, origins }, Some(tick));
                Err(e)
            }
        }
    }

    /// Evicts device LRU entries with bytes on `ordinal` until `bytes` more fit.
    fn make_room_device<K: Eq + Hash + Clone>(
        &self,
        st: &mut State<K>,
        ordinal: usize,
        bytes: usize,
    ) -> Result<(), SpillError> {
        if bytes > self.device_budget {
            return Err(self.no_room(Tier::Device, bytes, "larger than the device budget"));
        }
        while st.device_used(ordinal) + bytes > self.device_budget {
            let victim = st.lru[Tier::Device as usize].values().find(|k| {
                matches!(&st.entries[*k].place, Place::Device { usage, .. } if usage.iter().any(|u| u.0 == ordinal && u.1 > 0))
            });
            let Some(key) = victim.cloned() else {
                return Err(self.no_room(Tier::Device, bytes, "nothing left to evict on this device"));
            };
            self.evict_device(st, &key)?;
        }
        Ok(())
    }

    /// Moves a device entry to host (or disk when it is larger than the host budget).
    /// The device copy is dropped only once the host/disk copy is in place.
    fn evict_device<K: Eq + Hash + Clone>(&self, st: &mut State<K>, key: &K) -> Result<(), SpillError> {
        let Some(Entry { tick, place: Place::Device { msg, usage } }) = st.detach(key) else {
            return Ok(());
        };
        let restore = |st: &mut State<K>, msg: Message, usage| {
            st.attach(key.clone(), Place::Device { msg, usage }, Some(tick));
        };
        let weight = msg.payload_len();
        if weight <= self.host_budget {
            if let Err(e) = self.make_room_host(st, weight) {
                restore(st, msg, usage);
                return Err(e);
            }
            let copies = match device_frames_to_host(&msg, self.pool.as_ref()) {
                Ok(c) => c,
                Err(e) => {
                    restore(st, msg, usage);
                    return Err(e.into());
                }
            };
            match assemble_host(msg, copies) {
                Ok(hm) => {
                    let HostMessage { header, frames, origins } = hm;
                    let msg = Message::new(header, frames.into_iter().map(Frame::Host).collect());
                    st.attach(key.clone(), Place::Host { msg, origins }, Some(tick));
                    st.stats.device_to_host += 1;
                    Ok(())
                }
                Err(f) => {
                    restore(st, f.value, usage);
                    Err(f.error.into())
                }
            }
        } else {
            match self.write_device_message(st, &msg) {
                Ok((path, file_len)) => {
                    drop(msg);
                    st.attach(key.clone(), Place::Disk { path, bytes: weight, file_len }, Some(tick));
                    st.stats.device_to_disk += 1;
                    Ok(())
                }
                Err(e) => {
                    restore(st, msg, usage);
                    Err(e)
                }
            }
        }
    }

    /// Writes a message with device frames to disk through host copies; `msg` stays intact.
    fn write_device_message<K>(&self, st: &mut State<K>, msg: &Message) -> Result<(PathBuf, u64), SpillError> {
        let copies = device_frames_to_host(msg, self.pool.as_ref())?;
        let mut slices: Vec<&[u8]> = Vec::with_capacity(msg.frames.len());
        let mut origins = Vec::with_capacity(msg.frames.len());
        for (f, c) in msg.frames.iter().zip(&copies) {
            match (f, c) {
                (Frame::Host(h), _) => {
                    slices.push(h.as_slice());
                    origins.push(FrameOrigin::Host);
                }
                (Frame::Device(d), Some(c)) => {
                    slices.push(c.as_slice());
                    origins.push(FrameOrigin::Device { ordinal: d.device_ordinal() });
                }
                (Frame::Device(_), None) => {
                    return Err(SerializeError::Layout("device frame without host copy".into()).into())
                }
            }
        }
        self.write_file(st, &msg.header, &slices, &origins)
    }

    /// Places a new entry in the highest tier it fits, making room there.
    fn place_new<K: Eq + Hash + Clone>(&self, st: &mut State<K>, key: K, msg: Message) -> Result<(), Rejected> {
        let usage = usage_of(&msg);
        if !usage.is_empty() && usage.iter().all(|u| u.1 <= self.device_budget) {
            for &(d, b) in &usage {
                if let Err(error) = self.make_room_device(st, d, b) {
                    return Err(Rejected { error, message: msg });
                }
            }
            st.attach(key, Place::Device { msg, usage }, None);
            return Ok(());
        }
        let weight = msg.payload_len();
        if weight <= self.host_budget {
            if let Err(error) = self.make_room_host(st, weight) {
                return Err(Rejected { error, message: msg });
            }
            let copies = match device_frames_to_host(&msg, self.pool.as_ref()) {
                Ok(c) => c,
                Err(e) => return Err(Rejected { error: e.into(), message: msg }),
            };
            match assemble_host(msg, copies) {
                Ok(hm) => {
                    if hm.has_device_origin() {
                        st.stats.device_to_host += 1;
                    }
                    let HostMessage { header, frames, origins } = hm;
                    let msg = Message::new(header, frames.into_iter().map(Frame::Host).collect());
                    st.attach(key, Place::Host { msg, origins }, None);
                    Ok(())
                }
                Err(f) => Err(Rejected { error: f.error.into(), message: f.value }),
            }
        } else {
            match self.write_device_message(st, &msg) {
                Ok((path, file_len)) => {
                    if !usage.is_empty() {
                        st.stats.device_to_disk += 1;
                    }
                    drop(msg);
                    st.attach(key, Place::Disk { path, bytes: weight, file_len }, None);
                    Ok(())
                }
                Err(error) => Err(Rejected { error, message: msg }),
            }
        }
    }

    /// Brings host frames back to the device when they came from one and an allocator is
    /// configured and the device budget can take them (making room). `Unspill::Host(hm)`: they
    /// stay on the host (no allocator, or larger than the budget).
    fn to_device<K: Eq + Hash + Clone>(&self, st: &mut State<K>, hm: HostMessage) -> Unspill {
        let Some(alloc) = self.alloc.as_ref().filter(|_| hm.has_device_origin()) else {
            return Unspill::Host(hm);
        };
        let usage = usage_of_origins(&hm.frames, &hm.origins);
        if usage.iter().any(|u| u.1 > self.device_budget) {
            return Unspill::Host(hm);
        }
        for &(d, b) in &usage {
            if let Err(e) = self.make_room_device(st, d, b) {
                return Unspill::Failed(e, hm);
            }
        }
        match host_to_device(hm, |d, l| alloc.alloc(d, l)) {
            Ok(m) => {
                st.stats.unspilled_to_device += 1;
                Unspill::Device(m)
            }
            Err(f) => Unspill::Failed(f.error.into(), f.value),
        }
    }

    fn read<K>(&self, st: &mut State<K>, path: &Path, file_len: u64) -> Result<HostMessage, SpillError> {
        let d = read_entry(&*self.io, path, file_len, self.pool.as_ref())?;
        st.stats.disk_bytes_read += file_len;
        st.stats.unspilled_from_disk += 1;
        Ok(HostMessage { header: d.header, frames: d.frames, origins: d.origins })
    }
}

/// Outcome of bringing host frames back to the device.
enum Unspill {
    /// On the device now.
    Device(Message),
    /// Staying on the host (nothing to do, no allocator, or over the device budget).
    Host(HostMessage),
    /// Copy or allocation failed; the host message is intact.
    Failed(SpillError, HostMessage),
}

fn host_message(msg: Message, origins: Vec<FrameOrigin>) -> HostMessage {
    let frames = msg
        .frames
        .into_iter()
        .filter_map(|f| match f {
            Frame::Host(h) => Some(h),
            Frame::Device(_) => None,
        })
        .collect();
    HostMessage { header: msg.header, frames, origins }
}

fn split_host(hm: HostMessage) -> (Message, Vec<FrameOrigin>) {
    let HostMessage { header, frames, origins } = hm;
    (Message::new(header, frames.into_iter().map(Frame::Host).collect()), origins)
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
            }),
            shared: Shared {
                device_budget: config.device_budget,
                host_budget: config.host_budget,
                pool: config.pinned_pool,
                alloc: config.device_allocator,
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
                (hm, path)
            }
        };
        let (hm, path) = hm;
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
        sh.remove_file(&path);
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
                        sh.remove_file(&path);
                        let usage = usage_of(&m);
                        st.attach(key.clone(), Place::Device { msg: m, usage }, None);
                        return Ok(Some(self.apply(&st, key, f)));
                    }
                    Unspill::Host(hm) | Unspill::Failed(_, hm) => hm,
                };
                if bytes <= sh.host_budget && sh.make_room_host(&mut st, bytes).is_ok() {
                    st.detach(key);
                    sh.remove_file(&path);
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
