//! The one `cuLaunchKernel` call of the crate's kernels (the copy, signalling copy, span
//! and lingering kernels): each builds its parameter list, this enqueues the launch.

use super::error::{check, CudaResult};
use super::stream::Stream;
use cudarc::driver::sys;
use std::ffi::c_void;

/// Launches `function` on `stream` with a grid of `(x, y)` blocks of `threads` threads,
/// no dynamic shared memory, and the kernel parameters `params` points at.
///
/// # Safety
/// `function` belongs to the context bound to the calling thread (the stream's); each
/// pointer of `params` points at a live value of the type and size of the kernel's
/// parameter in its position, read during the call; the memory the kernel touches obeys
/// the caller's contract until the stream's work completed.
pub(super) unsafe fn launch_kernel(
    function: sys::CUfunction,
    (x, y): (u32, u32),
    threads: u32,
    stream: &Stream,
    params: &mut [*mut c_void],
) -> CudaResult<()> {
    // SAFETY: the caller's contract; `params` lives for the call and the driver reads
    // exactly the kernel's parameter count from it; no extra options are passed.
    check("cuLaunchKernel", unsafe {
        sys::cuLaunchKernel(
            function,
            x,
            y,
            1,
            threads,
            1,
            1,
            0,
            stream.raw(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    })
}
