//! Pool memory between processes: a pool out as an fd ([`export_pool`]) and in
//! ([`ImportedPool`]), an allocation out as 64 bytes ([`export_pointer`]) and in
//! ([`ImportedPool::import_pointer`]).

use super::{route, RawPool};
use crate::cuda::context::Gpu;
use crate::cuda::error::{available, check, codes, CudaError, CudaResult};
use crate::cuda::pointer::{address_range, attribute};
use crate::cuda::stream::Stream;
use crate::cuda::vmm::device_location;
use crate::{DeviceBuffer, DeviceMemoryOwner};
use cudarc::driver::sys;
use std::fmt;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;

/// `CUDA_ERROR_NOT_PERMITTED`.
const NOT_PERMITTED: i32 = 800;
/// `CUDA_ERROR_NOT_SUPPORTED`.
const NOT_SUPPORTED: i32 = 801;

/// The pool `ptr` was allocated from (`CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE`); `None`
/// for memory that is not pool memory.
pub fn pool_of(gpu: &Gpu, ptr: u64) -> CudaResult<Option<sys::CUmemoryPool>> {
    gpu.bind_to_current_thread()?;
    let raw = attribute(sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, ptr)?;
    Ok((raw != 0).then_some(raw as usize as sys::CUmemoryPool))
}

/// `pool` (of `gpu`'s device) as a POSIX fd (`cuMemPoolExportToShareableHandle`), for
/// [`ImportedPool::import`] in another process. A pool created without POSIX-fd handle
/// types (the device's stock default pool, for one) is refused with
/// [`CudaError::InvalidArgument`] saying it is not exportable.
///
/// # Safety
/// `pool` must be a live pool handle (one [`pool_of`] or [`crate::cuda::export_route`]
/// reported for memory that is still allocated, or a pool not yet destroyed): the driver
/// need not validate a stale handle. [`ExportablePool::export`](super::ExportablePool::export)
/// is the safe form for ferrylink's own pools.
pub unsafe fn export_pool(gpu: &Gpu, pool: sys::CUmemoryPool) -> CudaResult<OwnedFd> {
    available()?;
    if pool.is_null() {
        return Err(CudaError::invalid("export_pool", "a null pool"));
    }
    gpu.bind_to_current_thread()?;
    let mut fd: std::ffi::c_int = -1;
    // SAFETY: the context is bound; the pool is live (the caller's contract); for POSIX
    // fds the driver writes one int.
    let res = unsafe {
        sys::cuMemPoolExportToShareableHandle(
            (&mut fd as *mut std::ffi::c_int).cast(),
            pool,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    };
    if let Err(e) = check("cuMemPoolExportToShareableHandle", res) {
        return Err(match e.code() {
            Some(codes::INVALID_VALUE | NOT_PERMITTED | NOT_SUPPORTED) => CudaError::invalid(
                "export_pool",
                format!("pool {pool:?} is not exportable as a POSIX fd (made without that handle type?): {e}"),
            ),
            _ => e,
        });
    }
    if fd < 0 {
        return Err(CudaError::invalid("cuMemPoolExportToShareableHandle", format!("the driver returned fd {fd}")));
    }
    // SAFETY: the driver just opened `fd` for us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The 64 bytes that let an importer of the pool open the allocation starting at
/// `allocation_base` (`cuMemPoolExportPointer`). The allocation must come from an
/// exportable pool and stay allocated until every importer has freed it.
///
/// The driver exports pointers only of a pool that is "already shared": on driver 580
/// `cuMemPoolExportPointer` failed with `CUDA_ERROR_INVALID_VALUE` for memory of a pool
/// never exported. On that error the pool is exported ([`export_pool`]) and the pointer
/// export tried once more while that fd is open.
pub fn export_pointer(gpu: &Gpu, allocation_base: u64) -> CudaResult<[u8; 64]> {
    let first = export_pointer_once(gpu, allocation_base);
    match first {
        Err(e) if e.is_code(codes::INVALID_VALUE) => {
            let Some(pool) = pool_of(gpu, allocation_base)? else { return Err(e) };
            // SAFETY: the driver just reported this pool for memory that is allocated.
            let Ok(fd) = (unsafe { export_pool(gpu, pool) }) else { return Err(e) };
            // The driver refuses pointer exports of a pool it does not consider shared,
            // which an open exported fd keeps it: one fd per pool stays open for the
            // process's life, so later exports succeed the first time (without it every
            // export paid a refused call and a pool export, about 90 µs).
            keep_shared(pool, fd);
            export_pointer_once(gpu, allocation_base)
        }
        other => other,
    }
}

/// Keeps one exported fd of `pool` open for the rest of the process.
fn keep_shared(pool: sys::CUmemoryPool, fd: OwnedFd) {
    static SHARED: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<usize, OwnedFd>>> =
        std::sync::OnceLock::new();
    let mut shared = SHARED.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    shared.entry(pool as usize).or_insert(fd);
}

fn export_pointer_once(gpu: &Gpu, allocation_base: u64) -> CudaResult<[u8; 64]> {
    gpu.bind_to_current_thread()?;
    let mut data = sys::CUmemPoolPtrExportData { reserved: [0; 64] };
    // SAFETY: the context is bound; the driver validates the address and writes 64 bytes.
    check("cuMemPoolExportPointer", unsafe { sys::cuMemPoolExportPointer(&mut data, allocation_base) })?;
    if data.reserved.iter().all(|&b| b == 0) {
        return Err(CudaError::invalid("cuMemPoolExportPointer", "the driver returned all-zero export data"));
    }
    Ok(data.reserved)
}

/// A pool another process exported ([`export_pool`]), imported here
/// (`cuMemPoolImportFromShareableHandle`) and made readable and writable for one device.
/// Destroyed (`cuMemPoolDestroy`) when the last reference drops; every
/// [`ImportedPoolPointer`] holds one.
pub struct ImportedPool {
    gpu: Gpu,
    raw: RawPool,
}

impl ImportedPool {
    /// Imports the pool behind `fd` for `gpu`. The fd may be closed afterwards.
    pub fn import(gpu: &Gpu, fd: BorrowedFd<'_>) -> CudaResult<Arc<ImportedPool>> {
        gpu.bind_to_current_thread()?;
        let mut raw: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: the context is bound; for POSIX fds the handle argument is the fd's
        // value itself; the driver validates it and writes one handle. The fd stays ours.
        check("cuMemPoolImportFromShareableHandle", unsafe {
            sys::cuMemPoolImportFromShareableHandle(
                &mut raw,
                fd.as_raw_fd() as isize as *mut std::ffi::c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        })?;
        if raw.is_null() {
            return Err(CudaError::invalid("cuMemPoolImportFromShareableHandle", "the driver returned a null pool"));
        }
        // Destroyed by its Drop if the step below fails.
        let pool = ImportedPool { gpu: gpu.clone(), raw: RawPool(raw) };
        pool.ensure_access()?;
        Ok(Arc::new(pool))
    }

    /// An imported pool gets none of the exporter's access settings: gives this device
    /// read-write access unless it has it already (it is the pool's own device).
    fn ensure_access(&self) -> CudaResult<()> {
        let mut location = device_location(&self.gpu);
        let mut flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE;
        // SAFETY: the context is bound (import bound it); the pool is live; the call
        // reads one location and writes one flags value.
        let res = unsafe { sys::cuMemPoolGetAccess(&mut flags, self.raw.0, &mut location) };
        if res == sys::CUresult::CUDA_SUCCESS && flags == sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE {
            return Ok(());
        }
        let desc = sys::CUmemAccessDesc { location, flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
        // SAFETY: the pool is live; one descriptor is passed.
        check("cuMemPoolSetAccess", unsafe { sys::cuMemPoolSetAccess(self.raw.0, &desc, 1) })
    }

    /// The raw pool handle (valid while `self` lives).
    pub fn raw(&self) -> sys::CUmemoryPool {
        self.raw.0
    }

    /// Opens the exporter's allocation described by `data` ([`export_pointer`]), `len`
    /// bytes long (checked against the allocation's size): `cuMemPoolImportPointer`.
    pub fn import_pointer(self: &Arc<Self>, data: &[u8; 64], len: usize) -> CudaResult<ImportedPoolPointer> {
        self.gpu.bind_to_current_thread()?;
        let mut share = sys::CUmemPoolPtrExportData { reserved: *data };
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: the context is bound; the pool is live; the driver validates the
        // (untrusted) export data and writes one address.
        check("cuMemPoolImportPointer", unsafe { sys::cuMemPoolImportPointer(&mut ptr, self.raw.0, &mut share) })?;
        if ptr == 0 {
            return Err(CudaError::invalid("cuMemPoolImportPointer", "the driver returned a null address"));
        }
        // Freed by its Drop if the check below fails.
        let imported = ImportedPoolPointer { pool: self.clone(), ptr, len };
        let (base, size) = address_range(&self.gpu, ptr)?;
        let fits = ptr.checked_add(len as u64).zip(base.checked_add(size as u64)).is_some_and(|(e, m)| e <= m);
        if ptr < base || !fits {
            return Err(CudaError::invalid(
                "ImportedPool::import_pointer",
                format!("{len} bytes asked for, the allocation is {base:#x}+{size} (imported at {ptr:#x})"),
            ));
        }
        Ok(imported)
    }
}

impl Drop for ImportedPool {
    fn drop(&mut self) {
        route::forget(self.raw.0);
        if let Err(e) = self.gpu.bind_to_current_thread() {
            tracing::warn!(error = %e, "imported pool leaked: cannot bind its context");
            return;
        }
        // SAFETY: the pool was imported here and is destroyed exactly once, after every
        // pointer imported from it (each holds a reference) was freed.
        if let Err(e) = check("cuMemPoolDestroy", unsafe { sys::cuMemPoolDestroy(self.raw.0) }) {
            tracing::warn!(error = %e, "cuMemPoolDestroy of an imported pool failed");
        }
    }
}

impl fmt::Debug for ImportedPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImportedPool").field("device", &self.gpu.ordinal()).field("raw", &self.raw.0).finish()
    }
}

/// An allocation of another process' pool, opened here ([`ImportedPool::import_pointer`]).
/// Dropping it frees it here (`cuMemFree`), which the importer must do **before** the
/// exporter frees the allocation; it keeps the imported pool alive.
pub struct ImportedPoolPointer {
    pool: Arc<ImportedPool>,
    ptr: u64,
    len: usize,
}

impl ImportedPoolPointer {
    /// The device address here.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }
    /// The length asked for.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether zero bytes were asked for.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Frees the import in `stream`'s order (`cuMemFreeAsync`) instead of at once: work
    /// queued on `stream` before (copies through it) comes first, and an event recorded
    /// on `stream` after completes only once the free did, so whoever waits for that
    /// event may let the exporter free the allocation. The returned pool handle must live
    /// until then. When the driver refuses, the import comes back with the error (its drop
    /// frees it at once).
    pub fn free_in_order(mut self, stream: &Stream) -> Result<Arc<ImportedPool>, (ImportedPoolPointer, CudaError)> {
        if let Err(e) = self.pool.gpu.bind_to_current_thread() {
            return Err((self, e));
        }
        // SAFETY: `ptr` came from cuMemPoolImportPointer and is freed exactly once: here,
        // in the order of a live stream of this context (the drop below frees nothing, as
        // `ptr` is 0 then).
        let res = unsafe { sys::cuMemFreeAsync(self.ptr, stream.raw()) };
        if let Err(e) = check("cuMemFreeAsync", res) {
            return Err((self, e));
        }
        self.ptr = 0;
        Ok(self.pool.clone())
    }

    /// The memory as a [`DeviceBuffer`] that frees it when its owner drops.
    pub fn into_buffer(self) -> DeviceBuffer {
        let (ptr, len, ordinal) = (self.ptr, self.len, self.pool.gpu.ordinal());
        // SAFETY: `ptr..ptr+len` lies in the imported allocation (checked on import),
        // valid while the owner (the pointer itself) lives.
        unsafe { DeviceBuffer::from_raw_parts(ptr, len, ordinal, Arc::new(self)) }
    }
}

impl DeviceMemoryOwner for ImportedPoolPointer {
    fn describe(&self) -> String {
        format!("imported pool pointer {:#x} ({} B, device {})", self.ptr, self.len, self.pool.gpu.ordinal())
    }
}

impl Drop for ImportedPoolPointer {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return; // freed in a stream's order (`free_in_order`)
        }
        if let Err(e) = self.pool.gpu.bind_to_current_thread() {
            tracing::warn!(error = %e, ptr = self.ptr, "imported pool pointer leaked: cannot bind its context");
            return;
        }
        // SAFETY: `ptr` came from cuMemPoolImportPointer and is freed exactly once.
        if let Err(e) = check("cuMemFree", unsafe { sys::cuMemFree_v2(self.ptr) }) {
            tracing::warn!(error = %e, ptr = self.ptr, "cuMemFree of an imported pool pointer failed");
        }
    }
}

impl fmt::Debug for ImportedPoolPointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImportedPoolPointer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("device", &self.pool.gpu.ordinal())
            .finish()
    }
}

/// Used by `route` to classify an export failure.
pub(super) fn is_not_exportable(e: &CudaError) -> bool {
    matches!(e, CudaError::InvalidArgument { call: "export_pool", .. })
}
