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
        // Grown to the ordinal asked for, not to the driver's count (however large).
        if gpus.len() <= ordinal {
            gpus.resize(ordinal + 1, None);
        }
        if let Some(gpu) = &gpus[ordinal] {
            return Ok(gpu.clone());
        }
        let gpu = Gpu::open(ordinal)?;
        gpus[ordinal] = Some(gpu.clone());
        Ok(gpu)
    }

    /// Asks the driver for the device and its primary context. Every out-value starts
    /// initialised (cudarc's wrappers would read what a successful call failed to write)
    /// and is checked: a device name without a NUL, a null context, are not trusted.
    fn open(ordinal: usize) -> CudaResult<Gpu> {
        let raw_ordinal = i32::try_from(ordinal)
            .map_err(|_| CudaError::invalid("cuDeviceGet", format!("device ordinal {ordinal} out of range")))?;
        let mut device: sys::CUdevice = 0;
        // SAFETY: the driver is loaded (probed by `get`); the call writes one int.
        check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut device, raw_ordinal) })?;
        let mut uuid = sys::CUuuid { bytes: [0; 16] };
        // `_v2` (CUDA 11.4 and later) in every CUDA version of the bindings: the 13.x ones
        // have no other, and processes built for different versions must name a device
        // alike (a MIG instance by its own UUID, which the first version does not give).
        // SAFETY: `device` came from cuDeviceGet; the call writes 16 bytes.
        check("cuDeviceGetUuid_v2", unsafe { sys::cuDeviceGetUuid_v2(&mut uuid, device) })?;
        let mut name = [0u8; 256];
        // SAFETY: `device` came from cuDeviceGet; the driver writes at most `name.len()`
        // bytes into the buffer.
        check("cuDeviceGetName", unsafe { sys::cuDeviceGetName(name.as_mut_ptr().cast(), name.len() as i32, device) })?;
        let name = device_name(&name);
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `device` came from cuDeviceGet; the call writes one handle. The retained
        // context is never released: it lives as long as the process.
        check("cuDevicePrimaryCtxRetain", unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, device) })?;
        if ctx.is_null() {
            // A null context would look bound on every thread with none current.
            return Err(CudaError::invalid("cuDevicePrimaryCtxRetain", "the driver returned a null context"));
        }
        let uuid = uuid.bytes.map(|b| b as u8);
        tracing::debug!(ordinal, %name, "retained the primary context");
        Ok(Gpu(Arc::new(GpuInner { ordinal, device, ctx: RawCtx(ctx), uuid, name })))
    }

    /// Every device of the process (`CUDA_VISIBLE_DEVICES` applies).
    pub fn all() -> CudaResult<Vec<Gpu>> {
        available()?;
        (0..super::device_count()).map(Gpu::get).collect()
    }

    /// The device with this UUID (`cuDeviceGetUuid_v2`), if this process sees it; an error
    /// too when the driver gave the UUID to several devices (which one is meant is unknown).
    pub fn by_uuid(uuid: &[u8; 16]) -> CudaResult<Gpu> {
        let mut found = Gpu::all()?.into_iter().filter(|gpu| gpu.uuid() == uuid);
        match (found.next(), found.next()) {
            (Some(gpu), None) => Ok(gpu),
            (None, _) => {
                Err(CudaError::invalid("Gpu::by_uuid", format!("no visible device has UUID {}", format_uuid(uuid))))
            }
            (Some(a), Some(b)) => Err(CudaError::invalid(
                "Gpu::by_uuid",
                format!("devices {} and {} both report UUID {}", a.ordinal(), b.ordinal(), format_uuid(uuid)),
            )),
        }
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

    /// Free and total device memory in bytes (`cuMemGetInfo`); an error when the driver
    /// reports more free than total memory.
    pub fn mem_info(&self) -> CudaResult<(usize, usize)> {
        self.bind_to_current_thread()?;
        let (free, total) = result::mem_get_info().map_err(|e| from_driver("cuMemGetInfo", e))?;
        if free > total {
            return Err(CudaError::invalid("cuMemGetInfo", format!("{free} bytes free of {total}")));
        }
        Ok((free, total))
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

/// The name `cuDeviceGetName` wrote into `buf`: up to the first NUL, or the whole buffer
/// when the driver wrote none (lossy UTF-8 either way).
fn device_name(buf: &[u8]) -> String {
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..len]).into_owned()
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
    fn device_names_need_no_nul() {
        assert_eq!(device_name(b"NVIDIA H200\0junk"), "NVIDIA H200");
        assert_eq!(device_name(b"no terminator"), "no terminator");
        assert_eq!(device_name(b"\0"), "");
        assert_eq!(device_name(b"bad \xff utf-8\0"), "bad \u{fffd} utf-8");
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
