//! Stream-ordered memory pools whose memory can be exported to another process.
//!
//! `cuMemAllocAsync` (cudarc's `CudaStream::alloc`, `alloc_zeros`, `memcpy_stod`) takes
//! memory from the device's *current* pool. The stock default pool is created without
//! shareable handle types, so that memory can be sent neither by legacy IPC nor as VMM
//! fds: ferrylink would have to bounce it. An [`ExportablePool`] is created with POSIX-fd
//! handle types instead; [`install_exportable_pool`] makes it the device's current pool
//! (`cuDeviceSetMemPool`), after which every stream-ordered allocation of the process on
//! that device is exportable.
//!
//! Sharing pool memory takes two steps: the pool once, as an fd
//! ([`export_pool`] → [`ImportedPool::import`]), then each allocation as 64 opaque bytes
//! ([`export_pointer`] → [`ImportedPool::import_pointer`]). The importer must free an
//! imported pointer ([`ImportedPoolPointer`]'s drop) **before** the exporter frees the
//! allocation: the exporter's free returns the memory to its pool for reuse at once.
//! The driver exports pointers only of a pool already exported once ([`export_pointer`]
//! sees to it). On driver 580 importing the pool and a pointer also worked in the
//! exporting process itself (a second pool handle, a second address); other drivers may
//! refuse it, so the tests check the import from a second process.
//!
//! [`export_allocation`] remembers each allocation's export data, so exporting it again
//! costs two driver queries instead of another `cuMemPoolExportPointer`.
//!
//! [`export_route`] says, in one driver query, which of the routes (legacy
//! IPC, VMM, pool) a buffer can be exported by.

mod export_cache;
mod memo;
mod route;
mod share;

pub use export_cache::{export_allocation, export_buffer_allocation, export_cache_hits, PoolPointerExport};
pub(crate) use memo::ExportMemo;
pub use route::{export_route, ExportRoute};
pub use share::{export_pointer, export_pool, pool_of, ImportedPool, ImportedPoolPointer};

use super::context::Gpu;
use super::error::{check, CudaError, CudaResult};
use super::stream::Stream;
use super::vmm::device_location;
use crate::{DeviceBuffer, DeviceMemoryOwner};
use cudarc::driver::sys;
use std::collections::HashMap;
use std::fmt;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// A raw pool handle; the driver's handles are process-wide and usable from any thread.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct RawPool(pub(super) sys::CUmemoryPool);
// SAFETY: a CUmemoryPool is an opaque driver handle valid on every thread of the
// process; we never dereference it.
unsafe impl Send for RawPool {}
// SAFETY: as above; the driver serialises what needs serialising.
unsafe impl Sync for RawPool {}

/// A stream-ordered memory pool on one device, created with POSIX-fd handle types
/// (`cuMemPoolCreate`), so its pool and allocations can be exported. Its release
/// threshold is raised to the maximum: freed memory stays in the pool (and mapped in the
/// importers) instead of going back to the driver at each synchronisation. Dropping it
/// destroys it (the driver defers that until its allocations are freed), unless it is
/// installed as the device's current pool ([`install_exportable_pool`]): then it lives
/// for the process.
pub struct ExportablePool {
    gpu: Gpu,
    raw: RawPool,
    installed: AtomicBool,
}

impl ExportablePool {
    /// A new pool of `gpu`'s memory, exportable as POSIX fds.
    pub fn create(gpu: &Gpu) -> CudaResult<Arc<ExportablePool>> {
        gpu.bind_to_current_thread()?;
        let props = pool_props(device_location(gpu));
        let mut raw: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: the context is bound; `props` is fully initialised; the call writes one
        // handle.
        check("cuMemPoolCreate", unsafe { sys::cuMemPoolCreate(&mut raw, &props) })?;
        if raw.is_null() {
            return Err(CudaError::invalid("cuMemPoolCreate", "the driver returned a null pool"));
        }
        // Destroyed by its Drop if the step below fails.
        let pool = ExportablePool { gpu: gpu.clone(), raw: RawPool(raw), installed: AtomicBool::new(false) };
        let mut threshold: sys::cuuint64_t = u64::MAX;
        // SAFETY: the pool is live; the release threshold is one cuuint64_t, read by the
        // driver from `threshold`.
        check("cuMemPoolSetAttribute", unsafe {
            sys::cuMemPoolSetAttribute(
                raw,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut sys::cuuint64_t).cast(),
            )
        })?;
        route::remember(raw, true);
        tracing::debug!(device = gpu.ordinal(), pool = ?raw, "exportable memory pool created");
        Ok(Arc::new(pool))
    }

    /// The raw pool handle (valid while `self` lives).
    pub fn raw(&self) -> sys::CUmemoryPool {
        self.raw.0
    }

    /// The device.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Whether it is the device's current pool ([`install_exportable_pool`]).
    pub fn is_installed(&self) -> bool {
        self.installed.load(Ordering::Relaxed)
    }

    /// The pool as a POSIX fd ([`export_pool`]).
    pub fn export(&self) -> CudaResult<OwnedFd> {
        // SAFETY: the pool is live while `self` is.
        unsafe { export_pool(&self.gpu, self.raw.0) }
    }

    /// `len` bytes (at least 1) from the pool, allocated in `stream`'s order
    /// (`cuMemAllocFromPoolAsync`): work on `stream`, or any work after it has
    /// synchronised, may use them. The buffer's owner keeps the pool and the stream alive
    /// and frees the memory with `cuMemFreeAsync` on that stream when it drops.
    pub fn alloc(self: &Arc<Self>, len: usize, stream: &Arc<Stream>) -> CudaResult<DeviceBuffer> {
        if stream.gpu() != &self.gpu {
            return Err(CudaError::invalid("ExportablePool::alloc", "the stream is on another device"));
        }
        self.gpu.bind_to_current_thread()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: the context is bound; the pool and the stream are live and of this
        // device; the call writes one address.
        check("cuMemAllocFromPoolAsync", unsafe {
            sys::cuMemAllocFromPoolAsync(&mut ptr, len.max(1), self.raw.0, stream.raw())
        })?;
        if ptr == 0 {
            return Err(CudaError::invalid("cuMemAllocFromPoolAsync", "the driver returned a null address"));
        }
        let owner = Arc::new(PoolAllocation { pool: self.clone(), stream: stream.clone(), ptr, len });
        // SAFETY: `ptr..ptr+len` is an allocation of this device's pool, freed only when
        // the owner drops.
        Ok(unsafe { DeviceBuffer::from_raw_parts(ptr, len, self.gpu.ordinal(), owner) })
    }
}

/// Pool properties: pinned device memory at `location`, exportable as POSIX fds, every
/// other field zero (no maximum size, no usage flags). The fields after
/// `win32SecurityAttributes` differ between CUDA versions of the bindings (`maxSize` from
/// 12.2, `usage` from 12.6, `gpuDirectRDMACapable` from 13.4, `reserved` shrinking to
/// match), so they are zeroed, not named.
fn pool_props(location: sys::CUmemLocation) -> sys::CUmemPoolProps {
    let mut props = std::mem::MaybeUninit::<sys::CUmemPoolProps>::zeroed();
    let p = props.as_mut_ptr();
    // SAFETY: `p` points to the zeroed struct and the writes go through raw field pointers
    // (no reference to it exists before `assume_init`). The three fields whose types are
    // enums (allocType, handleTypes, location) get valid values; every other field is an
    // integer, an array of integers or a raw pointer, for which zero bytes are valid.
    unsafe {
        (&raw mut (*p).allocType).write(sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED);
        (&raw mut (*p).handleTypes).write(sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        (&raw mut (*p).location).write(location);
        props.assume_init()
    }
}

impl Drop for ExportablePool {
    fn drop(&mut self) {
        if self.is_installed() {
            return; // the device's current pool: never destroyed
        }
        route::forget(self.raw.0);
        if let Err(e) = self.gpu.bind_to_current_thread() {
            tracing::warn!(error = %e, "exportable pool leaked: cannot bind its context");
            return;
        }
        // SAFETY: the pool was created here and is destroyed exactly once; the driver
        // defers the release of memory still allocated from it.
        if let Err(e) = check("cuMemPoolDestroy", unsafe { sys::cuMemPoolDestroy(self.raw.0) }) {
            tracing::warn!(error = %e, "cuMemPoolDestroy failed");
        }
    }
}

impl fmt::Debug for ExportablePool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExportablePool")
            .field("device", &self.gpu.ordinal())
            .field("raw", &self.raw.0)
            .field("installed", &self.is_installed())
            .finish()
    }
}

/// The owner of one allocation of an [`ExportablePool`].
struct PoolAllocation {
    pool: Arc<ExportablePool>,
    stream: Arc<Stream>,
    ptr: u64,
    len: usize,
}

impl DeviceMemoryOwner for PoolAllocation {
    fn describe(&self) -> String {
        format!("exportable pool allocation {:#x} ({} B, device {})", self.ptr, self.len, self.pool.gpu.ordinal())
    }
}

impl Drop for PoolAllocation {
    fn drop(&mut self) {
        if let Err(e) = self.pool.gpu.bind_to_current_thread() {
            tracing::warn!(error = %e, ptr = self.ptr, "pool allocation leaked: cannot bind its context");
            return;
        }
        // SAFETY: `ptr` came from cuMemAllocFromPoolAsync and is freed exactly once, in
        // the order of the live stream it was allocated on.
        if let Err(e) = check("cuMemFreeAsync", unsafe { sys::cuMemFreeAsync(self.ptr, self.stream.raw()) }) {
            tracing::warn!(error = %e, ptr = self.ptr, "cuMemFreeAsync failed");
        }
    }
}

/// Makes an [`ExportablePool`] device `ordinal`'s current pool (`cuDeviceSetMemPool`):
/// from then on `cuMemAllocAsync` on that device — cudarc's `CudaStream::alloc`,
/// `alloc_zeros`, `memcpy_stod` — allocates exportable memory. Created once per device
/// for the process; later calls return the same pool. Memory allocated before stays in
/// the pool it came from.
pub fn install_exportable_pool(ordinal: usize) -> CudaResult<Arc<ExportablePool>> {
    static INSTALLED: OnceLock<Mutex<HashMap<usize, Arc<ExportablePool>>>> = OnceLock::new();
    let gpu = Gpu::get(ordinal)?;
    let mut installed = INSTALLED.get_or_init(|| Mutex::new(HashMap::new())).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(pool) = installed.get(&ordinal) {
        return Ok(pool.clone());
    }
    let pool = ExportablePool::create(&gpu)?;
    gpu.bind_to_current_thread()?;
    // SAFETY: the context is bound; the device handle and the pool (of this device) are
    // live; the pool is never destroyed once installed (kept in INSTALLED).
    check("cuDeviceSetMemPool", unsafe { sys::cuDeviceSetMemPool(gpu.raw_device(), pool.raw()) })?;
    pool.installed.store(true, Ordering::Relaxed);
    installed.insert(ordinal, pool.clone());
    tracing::info!(device = ordinal, "exportable memory pool installed as the device's current pool");
    Ok(pool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_props_name_the_kind_and_zero_the_rest() {
        let location = crate::cuda::vmm::location(sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, 3);
        let props = pool_props(location);
        assert_eq!(props.allocType, sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED);
        assert_eq!(props.handleTypes, sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        assert!(props.win32SecurityAttributes.is_null());
        // Whatever this CUDA version has after the pointer (maxSize, usage, ..., reserved).
        let rest = std::mem::offset_of!(sys::CUmemPoolProps, win32SecurityAttributes) + 8;
        // SAFETY: reads the struct's bytes; every byte of it was written (zeroed first).
        let bytes: &[u8] = unsafe {
            std::slice::from_raw_parts((&props as *const sys::CUmemPoolProps).cast(), size_of::<sys::CUmemPoolProps>())
        };
        assert!(bytes[rest..].iter().all(|&b| b == 0));
    }

    #[test]
    #[cfg_attr(
        feature = "gpu-tests",
        ignore = "covers a machine without CUDA: the GPU build runs the device tests instead"
    )]
    fn entry_points_answer_unavailable_without_cuda() {
        if crate::cuda::probe().is_ok() {
            return; // covered by memory/tests/gpu_mempool.rs
        }
        assert!(matches!(install_exportable_pool(0), Err(CudaError::Unavailable(_))));
        // SAFETY: the address is never used: export_route answers before any driver call.
        let buf = unsafe { crate::cuda::from_raw_device_memory(0x1000, 16, 0, Box::new(())) };
        assert!(matches!(export_route(&buf), Err(CudaError::Unavailable(_))));
    }
}
