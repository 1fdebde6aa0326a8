//! `ferrylink-spill`: a tiered device → host → disk store of [`Message`]s with byte
//! budgets and least-recently-used eviction, co-located with the transport through
//! [`MakeRoom`](ferrylink_memory::MakeRoom).
//!
//! # Tiers
//! - **Device**: entries with device frames. Each device has the same budget
//!   ([`SpillConfig::device_budget`]), counted in device-frame bytes (host frames of a mixed
//!   message ride along uncounted while it is on the device).
//! - **Host**: host-only entries, and device entries after eviction (their frames copied
//!   into the [`PinnedPool`](ferrylink_memory::PinnedPool) when one is given, with
//!   pipelined chunk copies). Budget [`SpillConfig::host_budget`], counted in payload bytes.
//! - **Disk**: one checksummed file per entry (format in [`disk`]) in the store's own
//!   directory `<disk_dir>/ferrylink-spill-<pid>-<n>`, removed on drop; directories of
//!   dead processes are removed when a store starts. No budget.
//!
//! An entry larger than a tier's budget goes straight to the tier below. Inserting over
//! budget evicts the least recently used entries one tier down (device → host → disk,
//! cascading). Recency is global: an evicted entry keeps its place in the order.
//!
//! # Access
//! [`Message`] is not `Clone` (frames own memory), so the store offers:
//! - [`SpillStore::take`]: removes the entry and returns it unspilled (back on its device
//!   when a [`DeviceAllocator`] is configured and the budget can hold it — the transport's
//!   operation);
//! - [`SpillStore::with`]: borrows it without removing it, after bringing it up a tier or
//!   two (dask/zict's `get`); it becomes most recently used;
//! - [`SpillStore::remove`] drops it; [`contains`](SpillStore::contains),
//!   [`len`](SpillStore::len), [`tier`](SpillStore::tier), [`stats`](SpillStore::stats).
//!
//! # Failures never lose an entry
//! A failed copy or a failed disk write (I/O error, full disk) leaves the entry in the
//! tier it was in and returns the error: files are written to a temporary name and renamed
//! into place, and the copy above is dropped only after that. A failed `insert` hands the
//! message back in [`Rejected`]. A spill file whose checksum does not match gives
//! [`SpillError::Corrupt`] and stays on disk (the caller may [`remove`](SpillStore::remove)
//! it).
//!
//! # Concurrency
//! One mutex guards the index; operations (including their copies and file I/O) run under
//! it, so they are linearizable and budgets hold after every operation. Moving I/O out of
//! the lock (in-transit states) is future work.

pub mod crc;
pub mod disk;
mod store;

use std::path::PathBuf;

use ferrylink_memory::serialize::SerializeError;
use ferrylink_memory::Message;
use thiserror::Error;

pub use disk::{DiskIo, FaultyDiskIo, RealDiskIo};
pub use store::{DeviceAllocator, SpillConfig, SpillStats, SpillStore, Tier, TierStats};

/// Spill failures.
#[derive(Debug, Error)]
pub enum SpillError {
    /// A tier cannot make room.
    #[error("no room for {requested} bytes in the {tier:?} tier (budget {budget}): {reason}")]
    NoRoom {
        /// The tier.
        tier: Tier,
        /// Bytes asked for.
        requested: usize,
        /// The tier's budget.
        budget: usize,
        /// Why.
        reason: String,
    },
    /// Copying between device and host failed (or CUDA is absent for device frames).
    #[error("serialization failed: {0}")]
    Serialize(#[from] SerializeError),
    /// A file operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A spill file is damaged.
    #[error("corrupt spill file {path}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// A failed insert: the error and the message, handed back.
#[derive(Debug, Error)]
#[error("insert rejected: {error}")]
pub struct Rejected {
    /// Why.
    #[source]
    pub error: SpillError,
    /// The message (device frames may have become host frames).
    pub message: Message,
}
