//! Which way a device buffer can be exported: one `cuPointerGetAttributes` call (three
//! attributes), a per-pool cache of whether the pool exports, and the owner's record
//! when it has one.

use super::share::{export_pool, is_not_exportable};
use crate::cuda::context::Gpu;
use crate::cuda::error::{check, CudaResult};
use crate::DeviceBuffer;
use cudarc::driver::sys;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// How a device buffer can be sent to another process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportRoute {
    /// `cuMemAlloc` memory: `cuIpcGetMemHandle` of its allocation base.
    LegacyIpc,
    /// VMM memory shareable as POSIX fds: [`crate::cuda::vmm_chunks`] and
    /// [`crate::cuda::export_chunk`], chunk by chunk.
    Vmm,
    /// Memory of this exportable stream-ordered pool: [`crate::cuda::export_pool`] once,
    /// [`crate::cuda::export_pointer`] per allocation.
    Pool(sys::CUmemoryPool),
    /// None of those (cudarc's allocations from the stock default pool, host memory, an
    /// address the driver does not know): bounce it through exportable memory.
    NotExportable,
}

/// Whether each pool seen exports (pool handle → answer). Pools made or destroyed here
/// update it; a foreign pool destroyed and another made at the same handle would read
/// the old answer.
fn cache() -> &'static Mutex<HashMap<usize, bool>> {
    static CACHE: OnceLock<Mutex<HashMap<usize, bool>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Records whether `pool` exports (a pool ferrylink just created).
pub(super) fn remember(pool: sys::CUmemoryPool, exportable: bool) {
    cache().lock().unwrap_or_else(|p| p.into_inner()).insert(pool as usize, exportable);
}

/// Forgets `pool` (being destroyed).
pub(super) fn forget(pool: sys::CUmemoryPool) {
    cache().lock().unwrap_or_else(|p| p.into_inner()).remove(&(pool as usize));
}

/// Whether `pool` exports: the cached answer, else one trial export (the fd is closed
/// at once). A driver error other than "not exportable" is returned, not cached.
fn pool_exports(gpu: &Gpu, pool: sys::CUmemoryPool) -> CudaResult<bool> {
    if let Some(&known) = cache().lock().unwrap_or_else(|p| p.into_inner()).get(&(pool as usize)) {
        return Ok(known);
    }
    // SAFETY: `pool` is the pool the driver just reported for memory the caller's
    // buffer keeps allocated, so it is live.
    let exportable = match unsafe { export_pool(gpu, pool) } {
        Ok(_fd) => true,
        Err(e) if is_not_exportable(&e) => {
            tracing::debug!(?pool, error = %e, "memory pool is not exportable");
            false
        }
        Err(e) => return Err(e),
    };
    remember(pool, exportable);
    Ok(exportable)
}

/// What the driver says about `ptr` in one call.
struct Attributes {
    legacy_ipc_capable: bool,
    handle_types: u32,
    pool: sys::CUmemoryPool,
}

fn attributes(gpu: &Gpu, ptr: u64) -> CudaResult<Attributes> {
    gpu.bind_to_current_thread()?;
    let mut attrs = [
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
    ];
    // Each attribute is at most 8 bytes (bool, CUmemAllocationHandleType, a handle); a
    // zeroed 8-byte slot reads correctly for each on a little-endian host, and the driver
    // leaves the default (zero) for an address it does not know.
    let mut values = [0u64; 3];
    let slots = values.as_mut_ptr();
    let mut data: [*mut std::ffi::c_void; 3] =
        [slots.cast(), slots.wrapping_add(1).cast(), slots.wrapping_add(2).cast()];
    // SAFETY: the context is bound; `attrs` and `data` hold three entries each, every
    // data pointer points at 8 writable bytes that outlive the call.
    check("cuPointerGetAttributes", unsafe {
        sys::cuPointerGetAttributes(attrs.len() as std::ffi::c_uint, attrs.as_mut_ptr(), data.as_mut_ptr(), ptr)
    })?;
    Ok(Attributes {
        legacy_ipc_capable: (values[0] & 0xff) != 0,
        handle_types: values[1] as u32,
        pool: values[2] as usize as sys::CUmemoryPool,
    })
}

/// How `buf` can be exported. A buffer whose owner recorded a legacy-IPC capable
/// allocation answers [`ExportRoute::LegacyIpc`] without a driver call; otherwise one
/// `cuPointerGetAttributes` (legacy IPC capability, allowed handle types, memory pool)
/// decides, plus one trial pool export the first time a pool is seen: pool memory is
/// [`ExportRoute::Pool`] when its pool exports (else [`ExportRoute::NotExportable`],
/// cudarc's stock default pool); memory allowing POSIX-fd handles that is not pool
/// memory is [`ExportRoute::Vmm`].
pub fn export_route(buf: &DeviceBuffer) -> CudaResult<ExportRoute> {
    if buf.owner().allocation().is_some_and(|a| a.legacy_ipc_capable) {
        return Ok(ExportRoute::LegacyIpc);
    }
    if let Some(known) = buf.export_memo.route() {
        return Ok(known);
    }
    let route = ask_export_route(buf)?;
    buf.export_memo.remember_route(route);
    Ok(route)
}

/// [`export_route`] as the driver answers it.
fn ask_export_route(buf: &DeviceBuffer) -> CudaResult<ExportRoute> {
    let gpu = Gpu::get(buf.device_ordinal())?;
    let attrs = attributes(&gpu, buf.device_ptr())?;
    if attrs.legacy_ipc_capable {
        return Ok(ExportRoute::LegacyIpc);
    }
    if !attrs.pool.is_null() {
        return Ok(if pool_exports(&gpu, attrs.pool)? {
            ExportRoute::Pool(attrs.pool)
        } else {
            ExportRoute::NotExportable
        });
    }
    let posix = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0;
    if attrs.handle_types & posix != 0 {
        return Ok(ExportRoute::Vmm);
    }
    Ok(ExportRoute::NotExportable)
}
