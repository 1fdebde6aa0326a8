//! Devices and their primary contexts.
//!
//! A [`Gpu`] is one CUDA device with its **primary context**, retained once per device
//! for the life of the process (the same context cudarc's `CudaContext::new` uses, so
//! memory from either side is interchangeable). CUDA binds contexts per thread: every
//! entry point of this layer calls [`Gpu::bind_to_current_thread`] before its driver
//! calls, and a thread of the caller's (the transport's progress thread) may call it
//! up front. Binding is one `cuCtxGetCurrent` when the context is already current.

use super::error::{available, check, from_driver, CudaError, CudaResult};
use cudarc::driver::{result, sys};
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

/// A retained primary context handle. The driver's handles are process-wide and may be
/// used from any thread.
#[derive(Clone, Copy, PartialEq, Eq)]
struct RawCtx(sys::CUcontext);
// SAFETY: a CUcontext is an opaque driver handle valid on every thread of the process;
// the driver serialises what needs serialising.
unsafe impl Send for RawCtx {}
// SAFETY: as above; we never dereference it.
unsafe impl Sync for RawCtx {}

struct GpuInner {
    ordinal: usize,
    device: sys::CUdevice,
    ctx: RawCtx,
    uuid: [u8; 16],
    name: String,
}

/// Restores, when dropped, the CUDA context that was current on this thread when it was
/// made: code that runs on a caller's thread binds what it needs and gives the caller its
/// own context back. A thread that had none keeps the primary context bound, as the CUDA
/// runtime leaves a thread after any call: unbinding it again would cost every device
/// send on such a thread two `cuCtxSetCurrent` calls.
pub struct CurrentContextGuard {
    previous: sys::CUcontext,
    /// Bound to the thread it was made on.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl CurrentContextGuard {
    /// Remembers the calling thread's current context.
    pub fn save() -> CudaResult<CurrentContextGuard> {
        available()?;
        let mut previous: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: cuCtxGetCurrent writes one handle; the library is loaded (checked above).
        check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut previous) })?;
        Ok(CurrentContextGuard { previous, _not_send: std::marker::PhantomData })
    }
}

impl Drop for CurrentContextGuard {
    fn drop(&mut self) {
        let mut current: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: as in `save`; the library stays loaded for the process' life.
        let same =
            unsafe { sys::cuCtxGetCurrent(&mut current) } == sys::CUresult::CUDA_SUCCESS && current == self.previous;
        if !same && !self.previous.is_null() {
            // SAFETY: `previous` was current on this thread (or null, which unbinds); a
            // context the caller had current is still alive while the caller uses it.
            let _ = unsafe { sys::cuCtxSetCurrent(self.previous) };
        }
    }
}

/// One CUDA device and its primary context. Cheap to clone; one per ordinal per process.
#[derive(Clone)]
pub struct Gpu(Arc<GpuInner>);

static GPUS: OnceLock<Mutex<Vec<Option<Gpu>>>> = OnceLock::new();

impl Gpu {
    /// The device with this ordinal; retains its primary context the first time.
    pub fn get(ordinal: usize) -> CudaResult<Gpu> {
        available()?;
        let count = super::device_count();
        if ordinal >= count {
            return Err(CudaError::invalid(
                "Gpu::get",
                format!("device ordinal {ordinal} out of range ({count} devices)"),
            ));
        }
        let registry = GPUS.get_or_init(|| Mutex::new(Vec::new()));
        let mut gpus = registry.lock().unwrap_or_else(|p| p.into_inner());
        if gpus.len() < count {
            gpus.resize(count, None);
        }
        if let Some(gpu) = &gpus[ordinal] {
            return Ok(gpu.clone());
        }
        let gpu = Gpu::open(ordinal)?;
        gpus[ordinal] = Some(gpu.clone());
        Ok(gpu)
    }

    fn open(ordinal: usize) -> CudaResult<Gpu> {
        let device = result::device::get(ordinal as i32).map_err(|e| from_driver("cuDeviceGet", e))?;
        let uuid = result::device::get_uuid(device).map_err(|e| from_driver("cuDeviceGetUuid", e))?;
        let name = result::device::get_name(device).map_err(|e| from_driver("cuDeviceGetName", e))?;
        // SAFETY: `device` is a valid device handle just returned by cuDeviceGet. The
        // retained context is never released: it lives as long as the process.
        let ctx =
            unsafe { result::primary_ctx::retain(device) }.map_err(|e| from_driver("cuDevicePrimaryCtxRetain", e))?;
        let uuid = uuid.bytes.map(|b| b as u8);
        tracing::debug!(ordinal, %name, "retained the primary context");
        Ok(Gpu(Arc::new(GpuInner { ordinal, device, ctx: RawCtx(ctx), uuid, name })))
    }

    /// Every device of the process (`CUDA_VISIBLE_DEVICES` applies).
    pub fn all() -> CudaResult<Vec<Gpu>> {
        available()?;
        (0..super::device_count()).map(Gpu::get).collect()
    }

    /// The device with this UUID (`cuDeviceGetUuid`), if this process sees it.
    pub fn by_uuid(uuid: &[u8; 16]) -> CudaResult<Gpu> {
        for gpu in Gpu::all()? {
            if gpu.uuid() == uuid {
                return Ok(gpu);
            }
        }
        Err(CudaError::invalid("Gpu::by_uuid", format!("no visible device has UUID {}", format_uuid(uuid))))
    }

    /// Makes this device's primary context current on the calling thread. Cheap (one
    /// `cuCtxGetCurrent`) when it already is. Every call path of the layer calls it.
    pub fn bind_to_current_thread(&self) -> CudaResult<()> {
        let mut current: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: cuCtxGetCurrent writes one handle into `current`; the library is loaded
        // (a Gpu exists only after a successful probe).
        check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut current) })?;
        if current == self.0.ctx.0 {
            return Ok(());
        }
        // SAFETY: the context is a retained primary context, valid for the process' life.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.0.ctx.0) })
    }

    /// Same as [`Gpu::bind_to_current_thread`].
    pub fn ensure_current(&self) -> CudaResult<()> {
        self.bind_to_current_thread()
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.0.ordinal
    }
    /// The device UUID.
    pub fn uuid(&self) -> &[u8; 16] {
        &self.0.uuid
    }
    /// The device name ("NVIDIA H200").
    pub fn name(&self) -> &str {
        &self.0.name
    }
    /// The raw device handle.
    pub fn raw_device(&self) -> sys::CUdevice {
        self.0.device
    }
    /// The raw primary context.
    pub fn raw_context(&self) -> sys::CUcontext {
        self.0.ctx.0
    }

    /// Waits for all work of the context (`cuCtxSynchronize`).
    pub fn synchronize(&self) -> CudaResult<()> {
        self.bind_to_current_thread()?;
        // SAFETY: the context is bound on this thread.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }

    /// Free and total device memory in bytes (`cuMemGetInfo`).
    pub fn mem_info(&self) -> CudaResult<(usize, usize)> {
        self.bind_to_current_thread()?;
        result::mem_get_info().map_err(|e| from_driver("cuMemGetInfo", e))
    }
}

impl PartialEq for Gpu {
    fn eq(&self, other: &Self) -> bool {
        self.0.ordinal == other.0.ordinal
    }
}
impl Eq for Gpu {}

impl fmt::Debug for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gpu")
            .field("ordinal", &self.0.ordinal)
            .field("name", &self.0.name)
            .field("uuid", &format_uuid(&self.0.uuid))
            .finish()
    }
}

/// Formats a device UUID the way `nvidia-smi` does (`GPU-xxxxxxxx-xxxx-…`).
pub fn format_uuid(uuid: &[u8; 16]) -> String {
    let h: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!("GPU-{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_format() {
        let u = [0x12u8, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(format_uuid(&u), "GPU-12345678-9abc-def0-0102-030405060708");
    }

    #[test]
    fn no_panic_without_cuda() {
        match Gpu::get(0) {
            Ok(g) => assert_eq!(g.ordinal(), 0),
            Err(e) => assert!(!e.to_string().is_empty()),
        }
        assert!(Gpu::get(usize::MAX).is_err());
    }
}
