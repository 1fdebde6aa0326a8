//! `ferrylink-spill`: a tiered device → host → disk store of
//! [`Message`](ferrylink_memory::Message)s with byte budgets and least-recently-used
//! eviction, co-located with the transport through [`MakeRoom`](ferrylink_memory::MakeRoom).
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
//! [`Message`](ferrylink_memory::Message) is not `Clone` (frames own memory), so the store offers:
//! - [`SpillStore::take`]: removes the entry and returns it unspilled (back on its device
//!   when a [`DeviceAllocator`] is configured and the budget can hold it — the transport's
//!   operation);
//! - [`SpillStore::with`]: borrows it without removing it, after bringing it up a tier or
//!   two (dask/zict's `get`); it becomes most recently used;
//! - [`SpillStore::remove`] drops it; [`contains`](SpillStore::contains),
//!   [`len`](SpillStore::len), [`tier`](SpillStore::tier), [`stats`](SpillStore::stats);
//! - [`SpillStore::read`]: a copy of it in host memory, leaving it in place;
//! - [`SpillStore::evict_lru`] moves a tier's least recently used entry down on request
//!   (memory pressure seen by the caller), and [`SpillStore::drain_evicted`] lists the
//!   keys moved down since it was last called, for callers that keep their own view of
//!   what is in memory ([`SpillConfig::record_evictions`]).
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
//! it, so they are linearizable and budgets hold after every operation. Two exceptions,
//! both finishing after the operation returns, on threads of the store that dropping the
//! store waits for:
//! - the file of an entry that left the disk tier is removed there when it holds
//!   [`REMOVE_ASIDE_MIN`] bytes or more;
//! - the host copy of an entry evicted to disk is freed there when it holds
//!   [`RELEASE_ASIDE_MIN`] bytes or more and none of it is pinned. One such copy at a time
//!   ([`SpillStats::host_releasing`]): the next one waits for it, and
//!   [`SpillStore::evict_lru`] returns only once its bytes are freed.
//!
//! Moving other I/O out of the lock (in-transit states) is future work.
#![warn(missing_docs)]

pub mod crc;
pub mod disk;
mod error;
mod store;
mod tier;

pub use disk::{DiskIo, FaultyDiskIo, RealDiskIo, Trailer};
pub use error::{Rejected, SpillError};
pub use store::{DeviceAllocator, SpillConfig, SpillStats, SpillStore, TierStats, RELEASE_ASIDE_MIN, REMOVE_ASIDE_MIN};
pub use tier::Tier;
