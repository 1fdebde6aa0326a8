//! Driver calls whose names differ between the CUDA versions of the bindings, chosen by
//! ferrylink-memory's version features.

/// `cuCtxCreate` with default flags: its `_v2` in the 12.x bindings, `_v4` (no creation
/// parameters) in the 13.x ones, which have no `_v2`. A build whose version comes from
/// `cuda-version-from-build-system` takes the 12.x call.
///
/// # Safety
/// `device` is a device handle of the driver.
pub unsafe fn create_context(
    ctx: &mut cudarc::driver::sys::CUcontext,
    device: cudarc::driver::sys::CUdevice,
) -> cudarc::driver::sys::CUresult {
    use cudarc::driver::sys;
    #[cfg(not(any(
        feature = "cuda-13000",
        feature = "cuda-13010",
        feature = "cuda-13020",
        feature = "cuda-13030",
        feature = "cuda-13040"
    )))]
    // SAFETY: the caller passes a device; the call writes one context handle.
    let res = unsafe { sys::cuCtxCreate_v2(ctx, 0, device) };
    #[cfg(any(
        feature = "cuda-13000",
        feature = "cuda-13010",
        feature = "cuda-13020",
        feature = "cuda-13030",
        feature = "cuda-13040"
    ))]
    // SAFETY: the caller passes a device; null creation parameters are allowed; the call
    // writes one context handle.
    let res = unsafe { sys::cuCtxCreate_v4(ctx, std::ptr::null_mut(), 0, device) };
    res
}
