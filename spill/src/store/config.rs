//! How a store is set up ([`SpillConfig`], [`DeviceAllocator`]) and what it reports
//! ([`SpillStats`], [`TierStats`]).

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use ferrylink_memory::serialize::SerializeError;
use ferrylink_memory::{DeviceBuffer, PinnedPool};

use crate::disk::{DiskIo, RealDiskIo};

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

/// How a [`SpillStore`](crate::SpillStore) is set up.
#[derive(Clone)]
#[non_exhaustive]
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
    /// Record the key of every entry moved down a tier, for
    /// [`SpillStore::drain_evicted`](crate::SpillStore::drain_evicted) (a caller that
    /// keeps its own view of what is in memory, such as a Python mapping holding the
    /// original objects). Off by default: nothing is recorded, so nothing grows.
    pub record_evictions: bool,
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
            record_evictions: false,
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
    /// Records evicted keys for [`SpillStore::drain_evicted`](crate::SpillStore::drain_evicted).
    pub fn with_recorded_evictions(mut self) -> Self {
        self.record_evictions = true;
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
            .field("record_evictions", &self.record_evictions)
            .finish_non_exhaustive()
    }
}

/// Entries and bytes of one tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TierStats {
    /// Entries.
    pub entries: usize,
    /// Bytes counted against the tier (device: device frames, summed over devices;
    /// host and disk: payload bytes).
    pub bytes: usize,
}

/// Counters of a [`SpillStore`](crate::SpillStore).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SpillStats {
    /// Device tier.
    pub device: TierStats,
    /// Host tier.
    pub host: TierStats,
    /// Disk tier.
    pub disk: TierStats,
    /// Payload bytes of an evicted host copy still being freed by the store's thread (not
    /// counted in `host`): at most one entry, freed before the next eviction hands over
    /// another (see [`RELEASE_ASIDE_MIN`](crate::RELEASE_ASIDE_MIN)).
    pub host_releasing: usize,
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
