//! Thin wrappers over the few CUDA driver calls the pinned pool and the serializer need.
//!
//! Every function here returns an error string instead of panicking, and checks
//! [`crate::cuda::probe`] first: cudarc is built with `fallback-dynamic-loading`, which
//! panics when a driver function is called without `libcuda`. Handles come from the raw
//! calls into initialised out-values (cudarc's `result` wrappers read them with
//! `assume_init`) and a null one is an error, never kept.
//!
//! These will move onto the CUDA layer's API (`crate::cuda`) once it lands; until then
//! they call `cudarc::driver::{result, sys}` directly.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use cudarc::driver::{result, sys};

/// Why a driver call failed, as text (driver errors are not `Clone`).
pub(crate) type DriverResult<T> = Result<T, String>;

fn require_cuda() -> DriverResult<()> {
    crate::cuda::probe().map(|_| ()).map_err(|e| e.to_string())
}

/// Makes the primary context of `ordinal` current on the calling thread.
///
/// The primary context is retained once per device per process and never released (it
/// lives as long as the process, like the runtime API's).
pub(crate) fn bind_primary_context(ordinal: usize) -> DriverResult<()> {
    require_cuda()?;
    // Contexts stored as addresses: raw pointers are not `Send`.
    static RETAINED: OnceLock<Mutex<HashMap<usize, usize>>> = OnceLock::new();
    let map = RETAINED.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    let ctx = match map.get(&ordinal) {
        Some(&ctx) => ctx as sys::CUcontext,
        None => {
            let ord = i32::try_from(ordinal).map_err(|_| format!("device ordinal {ordinal}"))?;
            let mut dev: sys::CUdevice = 0;
            // SAFETY: the driver is loaded (require_cuda); the call writes one int.
            unsafe { sys::cuDeviceGet(&mut dev, ord) }.result().map_err(|e| format!("cuDeviceGet({ordinal}): {e}"))?;
            let mut ctx: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: `dev` was returned by cuDeviceGet just above; the call writes one handle.
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) }
                .result()
                .map_err(|e| format!("cuDevicePrimaryCtxRetain({ordinal}): {e}"))?;
            // Binding null would unbind the thread's context instead.
            non_null(ctx, "cuDevicePrimaryCtxRetain", "context")?;
            map.insert(ordinal, ctx as usize);
            ctx
        }
    };
    drop(map);
    // SAFETY: `ctx` is a primary context we retained and never release.
    unsafe { result::ctx::set_current(ctx) }.map_err(|e| format!("cuCtxSetCurrent: {e}"))
}

/// `handle`, which `call` wrote with success; an error when it is null.
fn non_null<T>(handle: *mut T, call: &str, what: &str) -> DriverResult<*mut T> {
    if handle.is_null() {
        return Err(format!("{call} succeeded but returned a null {what}"));
    }
    Ok(handle)
}

/// Page-locks and registers `ptr..ptr+len` with CUDA for all contexts (PORTABLE).
///
/// # Safety
/// `ptr..ptr+len` must be a live host mapping that stays mapped until
/// [`host_unregister`] is called on `ptr`.
pub(crate) unsafe fn host_register(ptr: *mut u8, len: usize) -> DriverResult<()> {
    bind_primary_context(0)?;
    // SAFETY: the caller guarantees the range is mapped; PORTABLE makes the registration
    // visible to every context.
    unsafe { sys::cuMemHostRegister_v2(ptr.cast(), len, sys::CU_MEMHOSTREGISTER_PORTABLE) }
        .result()
        .map_err(|e| format!("cuMemHostRegister({len} bytes): {e}"))
}

/// Undoes [`host_register`].
///
/// # Safety
/// `ptr` must have been registered with [`host_register`] and not unregistered since.
pub(crate) unsafe fn host_unregister(ptr: *mut u8) -> DriverResult<()> {
    bind_primary_context(0)?;
    // SAFETY: the caller guarantees `ptr` is a registered base address.
    unsafe { sys::cuMemHostUnregister(ptr.cast()) }.result().map_err(|e| format!("cuMemHostUnregister: {e}"))
}

/// A non-blocking stream destroyed on drop (errors logged, never panics).
pub(crate) struct Stream(sys::CUstream);

impl Stream {
    /// Creates a stream in the current context.
    pub(crate) fn new() -> DriverResult<Self> {
        require_cuda()?;
        let mut raw: sys::CUstream = std::ptr::null_mut();
        // SAFETY: the driver is loaded; the call writes one handle.
        unsafe { sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) }
            .result()
            .map_err(|e| format!("cuStreamCreate: {e}"))?;
        // A null stream is the legacy default stream, which Drop would "destroy".
        non_null(raw, "cuStreamCreate", "stream").map(Stream)
    }
    pub(crate) fn raw(&self) -> sys::CUstream {
        self.0
    }
    /// Waits for all work queued on the stream.
    pub(crate) fn synchronize(&self) -> DriverResult<()> {
        // SAFETY: the stream is live until drop.
        unsafe { result::stream::synchronize(self.0) }.map_err(|e| format!("cuStreamSynchronize: {e}"))
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // Drain first so no copy still targets memory the caller is about to free.
        // SAFETY: the stream is live; destroyed exactly once here.
        unsafe {
            if let Err(e) = result::stream::synchronize(self.0) {
                tracing::warn!("cuStreamSynchronize on drop: {e}");
            }
            if let Err(e) = result::stream::destroy(self.0) {
                tracing::warn!("cuStreamDestroy: {e}");
            }
        }
    }
}

/// An event without timing, destroyed on drop.
pub(crate) struct Event(sys::CUevent);

impl Event {
    pub(crate) fn new() -> DriverResult<Self> {
        require_cuda()?;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: the driver is loaded; the call writes one handle.
        unsafe { sys::cuEventCreate(&mut raw, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) }
            .result()
            .map_err(|e| format!("cuEventCreate: {e}"))?;
        non_null(raw, "cuEventCreate", "event").map(Event)
    }
    pub(crate) fn record(&self, stream: &Stream) -> DriverResult<()> {
        // SAFETY: both handles are live.
        unsafe { result::event::record(self.0, stream.raw()) }.map_err(|e| format!("cuEventRecord: {e}"))
    }
    pub(crate) fn synchronize(&self) -> DriverResult<()> {
        // SAFETY: the event is live.
        unsafe { result::event::synchronize(self.0) }.map_err(|e| format!("cuEventSynchronize: {e}"))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: the event is live; destroyed exactly once here.
        if let Err(e) = unsafe { result::event::destroy(self.0) } {
            tracing::warn!("cuEventDestroy: {e}");
        }
    }
}

/// Queues a device → host copy of `dst.len()` bytes from `src`.
///
/// # Safety
/// `src..src+dst.len()` must be readable device memory, and `dst` must stay valid and
/// untouched until the stream has been synchronized past this copy.
pub(crate) unsafe fn dtoh_async(dst: &mut [u8], src: u64, stream: &Stream) -> DriverResult<()> {
    // SAFETY: forwarded from the caller.
    unsafe { result::memcpy_dtoh_async(dst, src, stream.raw()) }
        .map_err(|e| format!("cuMemcpyDtoHAsync({} bytes): {e}", dst.len()))
}

/// Queues a host → device copy of `src.len()` bytes to `dst`.
///
/// # Safety
/// `dst..dst+src.len()` must be writable device memory, and `src` must stay valid until
/// the stream has been synchronized past this copy.
pub(crate) unsafe fn htod_async(dst: u64, src: &[u8], stream: &Stream) -> DriverResult<()> {
    // SAFETY: forwarded from the caller.
    unsafe { result::memcpy_htod_async(dst, src, stream.raw()) }
        .map_err(|e| format!("cuMemcpyHtoDAsync({} bytes): {e}", src.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_null_handle_after_success_is_an_error() {
        let err = non_null(std::ptr::null_mut::<u8>(), "cuStreamCreate", "stream").unwrap_err();
        assert_eq!(err, "cuStreamCreate succeeded but returned a null stream");
        let mut x = 0u8;
        assert!(non_null(&mut x as *mut u8, "cuEventCreate", "event").is_ok());
    }
}
