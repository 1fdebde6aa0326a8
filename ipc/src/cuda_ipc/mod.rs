//! CUDA IPC for device frames (legacy `cuIpc*` handles): export on the sender, a mapping
//! cache and copies on the receiver, and interprocess events for ordering.
//!
//! Sender, per device frame:
//! 1. `ferrylink_memory::cuda::ensure_exportable` (bounces cudarc stream-pool memory);
//! 2. [`IpcExporter::export`] → [`IpcMemDescriptor`];
//! 3. record a pooled interprocess event (`ferrylink_memory::cuda::EventPool::acquire`,
//!    `Event::record`) on the producer's stream → [`export_event`] →
//!    [`IpcEventDescriptor`]; hold the `PooledEvent` and the buffer until the ack.
//!
//! Receiver, per device frame:
//! 1. [`MappingCache::acquire`] (peer pid + descriptor) → [`MappingLease`];
//! 2. [`ImportedEventCache::wait`] on the copy stream;
//! 3. [`copy_from_mapping`] into its own buffer; hold the lease until the copy completed,
//!    then ack. [`MappingCache::close_peer`] / [`ImportedEventCache::close_peer`] when the
//!    peer goes away.
//!
//! Every driver call goes through `ferrylink_memory::cuda`.

mod cache;
mod copy;
mod descriptor;
mod error;
mod events;
mod export;

pub use cache::{CacheConfig, CacheStats, CudaOpener, MappingCache, MappingLease, MappingOpener, OpenedMapping};
pub use copy::{copy_from_mapping, CopyPath, STAGING_CHUNK};
pub use descriptor::{IpcEventDescriptor, IpcMemDescriptor};
pub use error::CudaIpcError;
pub use events::{ImportedEvent, ImportedEventCache};
pub use export::{export_event, ExporterStats, IpcExporter};
