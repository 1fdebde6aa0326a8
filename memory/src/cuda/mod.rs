//! The CUDA layer over cudarc's driver API.
//!
//! cudarc is built with `fallback-dynamic-loading`: nothing links against `libcuda`, and
//! [`probe`] checks for the library before any driver call, so a machine without CUDA gets
//! an [`CudaUnavailable`] answer instead of a panic. Every other piece of ferrylink asks
//! here before it touches CUDA; every entry point of this module does too and answers
//! [`CudaError::Unavailable`].
//!
//! - [`Gpu`]: a device (by ordinal or UUID) and its primary context, bound on every thread
//!   that makes CUDA calls ([`Gpu::bind_to_current_thread`]).
//! - [`Stream`], [`Event`] (interprocess events too), [`EventPool`].
//! - [`copy`]: raw async copies (DtoD, DtoH, HtoD, peer) and memsets; [`peer`]: peer access.
//! - [`copy_kernel`]: same-device copies by a small PTX kernel, which starts sooner than
//!   the copy engine ([`copy_kernel::copy_dtod_async`] picks between them).
//! - [`DevicePool`]: exportable device memory (`cuMemAlloc` slabs, sub-allocated).
//! - [`foreign`]: raw foreign pointers, exportability, bouncing; `cudarc_interop`:
//!   `CudaSlice<T>` in and out ([`from_cuda_slice`], `DeviceBuffer::into_cuda_slice`), and
//!   `DeviceBuffer` as a cudarc `DevicePtr`.
//! - [`ipc`]: the legacy CUDA IPC memory calls used by `ferrylink-ipc`.
//! - [`PinnedStaging`]: pinned (not write-combined) host memory for staged copies.
//! - [`vmm`]: VMM memory (`cuMemCreate`, POSIX-fd shareable): [`VmmAllocation`], its
//!   chunks exported one by one as fds ([`export_chunk`]) and mapped in
//!   ([`ImportedVmmChunk`]).
//! - [`mempool`]: stream-ordered pools made exportable ([`ExportablePool`],
//!   [`install_exportable_pool`]), their pools and pointers shared ([`ImportedPool`]), and
//!   [`export_route`]: which way a buffer can be exported.

mod alloc;
mod buffer_copy;
mod context;
pub mod copy;
pub mod copy_kernel;
mod cudarc_interop;
mod done_flag;
mod error;
mod event;
pub mod foreign;
pub mod ipc;
mod launch;
mod linger;
mod mapped_host;
pub mod mempool;
pub mod peer;
mod pinned;
mod pointer;
mod pool;
mod probe;
pub mod span_kernel;
mod span_table;
mod stream;
mod suballoc;
pub mod vmm;

pub use alloc::DeviceAllocation;
pub use context::{format_uuid, CurrentContextGuard, Gpu};
pub use cudarc_interop::{cudarc_stream, from_cuda_slice};
pub use done_flag::DoneFlag;
pub use error::{codes, CudaError, CudaResult};
pub use event::{Event, EventPool, PooledEvent};
pub use foreign::{
    address_range, bounce_to_exportable, buffer_info, ensure_exportable, from_raw_device_memory, is_ipc_exportable,
    known_buffer_info, pointer_info, PointerInfo,
};
pub use linger::{LingeringCopier, LINGER_MAX_BYTES, LINGER_PTX};
pub use mapped_host::{write_value32, MappedHostRange};
pub use mempool::{
    export_allocation, export_buffer_allocation, export_cache_hits, export_pointer, export_pool, export_route,
    install_exportable_pool, pool_of, ExportRoute, ExportablePool, ImportedPool, ImportedPoolPointer,
    PoolPointerExport,
};
pub use peer::{can_access_peer, enable_peer_access};
pub use pinned::PinnedStaging;
pub use pool::{DevicePool, PoolConfig, PoolStats};
pub use probe::{device_count, disable, probe, CudaProbe, CudaUnavailable};
pub use stream::Stream;
pub use vmm::{export_chunk, vmm_chunks, ImportedVmmChunk, VmmAllocation, VmmChunk};
