//! Same-device copies by a small copy kernel instead of the copy engine.
//!
//! `cuMemcpyDtoDAsync` between two buffers of one GPU runs on a copy engine, which costs
//! several microseconds to start (`docs/architecture.md`, "Copy kernel"). A kernel launch
//! starts sooner, so small and medium frames are copied by [`KERNEL_PTX`], a grid-stride loop
//! of 16-byte loads and stores, and large ones by the copy engine (which reaches the same
//! bandwidth without occupying the SMs). [`copy_dtod_async`] picks; the limit is
//! [`kernel_copy_limit`], set by [`set_max_bytes`].
//!
//! The kernel is PTX text, compiled by the driver's JIT once per device on first use, so
//! the build needs no CUDA toolkit. When the JIT is unavailable the copy engine does every
//! copy and this is logged once.

use super::context::Gpu;
use super::copy::memcpy_dtod_async;
use super::done_flag::DoneFlag;
use super::error::{check, CudaError, CudaResult};
use super::launch::launch_kernel;
use super::stream::Stream;
use cudarc::driver::sys;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// The copy kernel: `dst[i] = src[i]` for `n16` 16-byte vectors (grid-stride loop), and
/// the `tail_len` (< 16) bytes at `tail_off` by the first threads.
pub const KERNEL_PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry ferrylink_copy(
    .param .u64 p_dst,
    .param .u64 p_src,
    .param .u64 p_n16,
    .param .u64 p_tail_off,
    .param .u64 p_tail_len
)
{
    .reg .pred %p<3>;
    .reg .b32 %r<6>;
    .reg .b32 %v<4>;
    .reg .b64 %rd<16>;

    ld.param.u64 %rd1, [p_dst];
    ld.param.u64 %rd2, [p_src];
    ld.param.u64 %rd3, [p_n16];
    ld.param.u64 %rd4, [p_tail_off];
    ld.param.u64 %rd5, [p_tail_len];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd6, %r1, %r2;
    cvt.u64.u32 %rd7, %r3;
    add.u64 %rd6, %rd6, %rd7;
    mul.wide.u32 %rd8, %r4, %r2;

    setp.ge.u64 %p1, %rd6, %rd5;
    @%p1 bra LOOP;
    add.u64 %rd9, %rd4, %rd6;
    add.u64 %rd10, %rd2, %rd9;
    add.u64 %rd11, %rd1, %rd9;
    ld.global.u8 %r5, [%rd10];
    st.global.u8 [%rd11], %r5;

LOOP:
    setp.ge.u64 %p2, %rd6, %rd3;
    @%p2 bra DONE;
    shl.b64 %rd12, %rd6, 4;
    add.u64 %rd13, %rd2, %rd12;
    add.u64 %rd14, %rd1, %rd12;
    ld.global.v4.u32 {%v0, %v1, %v2, %v3}, [%rd13];
    st.global.v4.u32 [%rd14], {%v0, %v1, %v2, %v3};
    add.u64 %rd6, %rd6, %rd8;
    bra LOOP;

DONE:
    ret;
}

// The same copy in one block (at most 256 vectors and a tail) that then writes its own
// completion flag: every thread's stores, a system-scope fence, `p_value` at `p_flag`
// (mapped pinned host memory). No `cuStreamWriteValue32` follows the launch.
.visible .entry ferrylink_copy_signalled(
    .param .u64 p_dst,
    .param .u64 p_src,
    .param .u64 p_n16,
    .param .u64 p_tail_off,
    .param .u64 p_tail_len,
    .param .u64 p_flag,
    .param .u32 p_value
)
{
    .reg .pred %p<4>;
    .reg .b32 %r<8>;
    .reg .b32 %v<4>;
    .reg .b64 %rd<16>;

    ld.param.u64 %rd1, [p_dst];
    ld.param.u64 %rd2, [p_src];
    ld.param.u64 %rd3, [p_n16];
    ld.param.u64 %rd4, [p_tail_off];
    ld.param.u64 %rd5, [p_tail_len];
    mov.u32 %r3, %tid.x;
    mov.u32 %r2, %ntid.x;
    cvt.u64.u32 %rd6, %r3;
    cvt.u64.u32 %rd8, %r2;

    setp.ge.u64 %p1, %rd6, %rd5;
    @%p1 bra S_LOOP;
    add.u64 %rd9, %rd4, %rd6;
    add.u64 %rd10, %rd2, %rd9;
    add.u64 %rd11, %rd1, %rd9;
    ld.global.u8 %r5, [%rd10];
    st.global.u8 [%rd11], %r5;

S_LOOP:
    setp.ge.u64 %p2, %rd6, %rd3;
    @%p2 bra S_DONE;
    shl.b64 %rd12, %rd6, 4;
    add.u64 %rd13, %rd2, %rd12;
    add.u64 %rd14, %rd1, %rd12;
    ld.global.v4.u32 {%v0, %v1, %v2, %v3}, [%rd13];
    st.global.v4.u32 [%rd14], {%v0, %v1, %v2, %v3};
    add.u64 %rd6, %rd6, %rd8;
    bra S_LOOP;

S_DONE:
    bar.sync 0;
    setp.ne.u32 %p3, %r3, 0;
    @%p3 bra S_END;
    ld.param.u64 %rd15, [p_flag];
    ld.param.u32 %r6, [p_value];
    membar.sys;
    st.volatile.global.u32 [%rd15], %r6;

S_END:
    ret;
}
"#;

const THREADS_PER_BLOCK: u32 = 256;

/// The largest copy [`kernel_copy_signalled`] takes: what one block copies with one
/// vector per thread.
pub const SIGNALLED_MAX_BYTES: usize = THREADS_PER_BLOCK as usize * 16;
/// Blocks per launch at most (a block per 4 KiB up to 16 GiB; beyond, the threads loop).
const MAX_BLOCKS: u64 = 1 << 22;

/// Frames up to this many bytes are copied by the kernel unless [`set_max_bytes`] chose
/// another limit.
pub const DEFAULT_KERNEL_COPY_LIMIT: usize = 64 << 20;

/// The limit [`kernel_copy_limit`] answers: process-wide, one relaxed load per copy.
static KERNEL_COPY_LIMIT: AtomicUsize = AtomicUsize::new(DEFAULT_KERNEL_COPY_LIMIT);

/// Sets the largest copy [`copy_dtod_async`] gives the kernel, for the whole process (0:
/// the copy engine does every copy). `ferrylink-transport` calls it with its
/// configuration's `FERRYLINK_COPY_KERNEL_MAX_BYTES` when it builds a context; the last
/// call wins. This crate reads no environment variable.
pub fn set_max_bytes(limit: usize) {
    KERNEL_COPY_LIMIT.store(limit, Ordering::Relaxed);
}

/// The largest copy [`copy_dtod_async`] gives the kernel: [`DEFAULT_KERNEL_COPY_LIMIT`]
/// until [`set_max_bytes`] sets another.
pub fn kernel_copy_limit() -> usize {
    KERNEL_COPY_LIMIT.load(Ordering::Relaxed)
}

/// Which engine a copy ran on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyEngine {
    /// The copy kernel.
    Kernel,
    /// `cuMemcpyDtoDAsync`.
    CopyEngine,
}

/// Copies `len` bytes from `src` to `dst`, both on `stream`'s device (or mapped into its
/// context), on `stream`: by the kernel when the copy is at most [`kernel_copy_limit`]
/// bytes, both addresses are 16-byte aligned and the kernel loaded; else by the copy
/// engine.
///
/// # Safety
/// As [`memcpy_dtod_async`]: both ranges stay valid, and `dst` unused by anyone else,
/// until the stream's work completed.
pub unsafe fn copy_dtod_async(dst: u64, src: u64, len: usize, stream: &Stream) -> CudaResult<CopyEngine> {
    if len > 0 && len <= kernel_copy_limit() && (dst | src).is_multiple_of(16) {
        if let Some(kernel) = loaded(stream.gpu()) {
            // SAFETY: the caller's contract, passed on.
            unsafe { kernel.launch(dst, src, len, stream)? };
            return Ok(CopyEngine::Kernel);
        }
    }
    // SAFETY: the caller's contract, passed on.
    unsafe { memcpy_dtod_async(dst, src, len, stream)? };
    Ok(CopyEngine::CopyEngine)
}

/// Copies by the kernel whatever the size (benchmarks and tests); an error when the
/// kernel cannot load or the addresses are not 16-byte aligned.
///
/// # Safety
/// As [`copy_dtod_async`].
pub unsafe fn kernel_copy_async(dst: u64, src: u64, len: usize, stream: &Stream) -> CudaResult<()> {
    if !(dst | src).is_multiple_of(16) {
        return Err(CudaError::invalid("kernel_copy_async", "addresses must be 16-byte aligned"));
    }
    let Some(kernel) = loaded(stream.gpu()) else {
        return Err(CudaError::invalid("kernel_copy_async", "the copy kernel did not load (see the log)"));
    };
    // SAFETY: the caller's contract, passed on.
    unsafe { kernel.launch(dst, src, len, stream) }
}

/// Copies `len` bytes from `src` to `dst` (both 16-byte aligned, on `stream`'s device or
/// mapped into its context) in one block of the copy kernel that then writes `flag`
/// itself, so nothing is enqueued after the launch: `Ok(true)`, and `flag` is armed
/// ([`DoneFlag::is_set`] once the copy is done and its writes visible). `Ok(false)`
/// where this does not apply (an empty copy or one over [`SIGNALLED_MAX_BYTES`],
/// unaligned addresses, the kernel not loaded, a flag of another device): nothing was
/// enqueued, the caller copies and records the flag as usual.
///
/// One launch where a copy and a recorded flag make two driver calls: on the H200
/// (`memory/examples/copy_latency_floor`, 8 B) the enqueue took 3.91 µs against 5.34 µs,
/// the host saw the copy done after 7.96 µs against 8.63 µs.
///
/// # Safety
/// As [`copy_dtod_async`].
pub unsafe fn kernel_copy_signalled(
    dst: u64,
    src: u64,
    len: usize,
    stream: &Stream,
    flag: &mut DoneFlag,
) -> CudaResult<bool> {
    if !signalled_applies(dst, src, len) || flag.device() != stream.gpu().ordinal() {
        return Ok(false);
    }
    let Some(kernel) = loaded(stream.gpu()) else { return Ok(false) };
    // SAFETY: the caller's contract, passed on; the flag's word is mapped pinned memory of
    // this device, alive as long as the flag.
    flag.arm_for_kernel(|address, value| unsafe { kernel.launch_signalled(dst, src, len, stream, (address, value)) })?;
    Ok(true)
}

/// [`kernel_copy_signalled`] writing `value` at `address` instead of a [`DoneFlag`]: a
/// word of mapped host memory the caller watches (a control ring's gate word, which the
/// peer process reads too). `Ok(false)`: nothing enqueued, as there.
///
/// # Safety
/// As [`copy_dtod_async`]; `address` stays mapped for `stream`'s device until the
/// stream's work completed.
pub unsafe fn kernel_copy_signalling(
    dst: u64,
    src: u64,
    len: usize,
    stream: &Stream,
    (address, value): (u64, u32),
) -> CudaResult<bool> {
    if !signalled_applies(dst, src, len) {
        return Ok(false);
    }
    let Some(kernel) = loaded(stream.gpu()) else { return Ok(false) };
    // SAFETY: the caller's contract, passed on.
    unsafe { kernel.launch_signalled(dst, src, len, stream, (address, value))? };
    Ok(true)
}

/// Whether one block of the signalled kernel copies `len` bytes between these addresses.
fn signalled_applies(dst: u64, src: u64, len: usize) -> bool {
    len > 0 && len <= SIGNALLED_MAX_BYTES && (dst | src).is_multiple_of(16)
}

/// The blocks a launch of `n16` vectors uses: one per [`THREADS_PER_BLOCK`] vectors, so
/// each thread copies one (up to [`MAX_BLOCKS`]), at least one. A grid of 8 blocks per
/// multiprocessor looping over the copy (the earlier launch shape) was 7–10 % slower from 64 MB
/// up on the H200 (`memory/examples/span_copy_rate`: 64 MB 40.0 against 37.3 µs, 100 MB
/// 61.4 against 55.0 µs, the copy engine 38.4 and 56.8 µs).
fn blocks_for(n16: u64) -> u32 {
    // At most 2^22 by the clamp.
    n16.div_ceil(u64::from(THREADS_PER_BLOCK)).clamp(1, MAX_BLOCKS) as u32
}

/// The kernel loaded into one device's primary context.
struct LoadedKernel {
    _module: sys::CUmodule,
    function: sys::CUfunction,
    signalled: sys::CUfunction,
}

// SAFETY: module and function handles belong to a primary context that lives as long as
// the process; the driver allows using them from any thread with that context bound
// (every launch binds it first).
unsafe impl Send for LoadedKernel {}
// SAFETY: as above; launching does not mutate the handles.
unsafe impl Sync for LoadedKernel {}

impl LoadedKernel {
    fn load(gpu: &Gpu) -> CudaResult<LoadedKernel> {
        gpu.bind_to_current_thread()?;
        let ptx = std::ffi::CString::new(KERNEL_PTX)
            .map_err(|_| CudaError::invalid("cuModuleLoadData", "the PTX contains a NUL byte"))?;
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: the context is bound; `ptx` is a NUL-terminated PTX image that outlives
        // the call; the driver writes one module handle.
        check("cuModuleLoadData", unsafe { sys::cuModuleLoadData(&mut module, ptx.as_ptr().cast()) })?;
        if module.is_null() {
            return Err(CudaError::invalid("cuModuleLoadData", "the driver returned a null module"));
        }
        let functions = Self::function(module, c"ferrylink_copy")
            .and_then(|f| Self::function(module, c"ferrylink_copy_signalled").map(|s| (f, s)));
        let (function, signalled) = functions.inspect_err(|_| {
            // SAFETY: `module` was loaded above, nothing of it is in use, unloaded once.
            let _ = unsafe { sys::cuModuleUnload(module) };
        })?;
        Ok(LoadedKernel { _module: module, function, signalled })
    }

    /// Entry `name` of `module` (a loaded, live module).
    fn function(module: sys::CUmodule, name: &std::ffi::CStr) -> CudaResult<sys::CUfunction> {
        let mut function: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: `module` is a live loaded module (caller's promise); `name` is
        // NUL-terminated; the driver writes one function handle.
        check("cuModuleGetFunction", unsafe { sys::cuModuleGetFunction(&mut function, module, name.as_ptr()) })?;
        if function.is_null() {
            return Err(CudaError::invalid("cuModuleGetFunction", "the driver returned a null function"));
        }
        Ok(function)
    }

    /// # Safety
    /// As [`copy_dtod_async`]; `dst` and `src` 16-byte aligned.
    unsafe fn launch(&self, dst: u64, src: u64, len: usize, stream: &Stream) -> CudaResult<()> {
        if len == 0 {
            return Ok(());
        }
        stream.gpu().bind_to_current_thread()?;
        let mut p_dst = dst;
        let mut p_src = src;
        let mut n16 = (len / 16) as u64;
        let mut tail_off = n16 * 16;
        let mut tail_len = (len % 16) as u64;
        let blocks = blocks_for(n16);
        let mut params: [*mut c_void; 5] = [
            (&mut p_dst as *mut u64).cast(),
            (&mut p_src as *mut u64).cast(),
            (&mut n16 as *mut u64).cast(),
            (&mut tail_off as *mut u64).cast(),
            (&mut tail_len as *mut u64).cast(),
        ];
        // SAFETY: the function belongs to the bound context; `params` points at five u64
        // values matching the kernel's five .u64 parameters, read during the call; the
        // memory contract is the caller's.
        unsafe { launch_kernel(self.function, (blocks, 1), THREADS_PER_BLOCK, stream, &mut params) }
    }
}

impl LoadedKernel {
    /// One block copying `len` (≤ [`SIGNALLED_MAX_BYTES`]) bytes, then writing `value` at
    /// `flag` (a device address of mapped pinned memory).
    ///
    /// # Safety
    /// As [`copy_dtod_async`]; `dst` and `src` 16-byte aligned; `flag` stays mapped until
    /// the stream's work completed.
    unsafe fn launch_signalled(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        stream: &Stream,
        (flag, value): (u64, u32),
    ) -> CudaResult<()> {
        stream.gpu().bind_to_current_thread()?;
        let (mut p_dst, mut p_src, mut n16) = (dst, src, (len / 16) as u64);
        let (mut tail_off, mut tail_len) = (n16 * 16, (len % 16) as u64);
        let (mut p_flag, mut p_value) = (flag, value);
        let mut params: [*mut c_void; 7] = [
            (&mut p_dst as *mut u64).cast(),
            (&mut p_src as *mut u64).cast(),
            (&mut n16 as *mut u64).cast(),
            (&mut tail_off as *mut u64).cast(),
            (&mut tail_len as *mut u64).cast(),
            (&mut p_flag as *mut u64).cast(),
            (&mut p_value as *mut u32).cast(),
        ];
        tracing::trace!("signalling copy kernel launching");
        // SAFETY: the function belongs to the bound context; `params` points at six u64
        // and a u32 matching the kernel's parameters, read during the call; one block
        // covers the copy (len ≤ SIGNALLED_MAX_BYTES, checked by the caller); the memory
        // contract is the caller's.
        unsafe { launch_kernel(self.signalled, (1, 1), THREADS_PER_BLOCK, stream, &mut params) }
    }
}

/// The kernel of `gpu`, loaded on first use; `None` (logged once) when it cannot load.
fn loaded(gpu: &Gpu) -> Option<Arc<LoadedKernel>> {
    static KERNELS: OnceLock<Mutex<HashMap<usize, Option<Arc<LoadedKernel>>>>> = OnceLock::new();
    let mut kernels = KERNELS.get_or_init(|| Mutex::new(HashMap::new())).lock().unwrap_or_else(|p| p.into_inner());
    kernels
        .entry(gpu.ordinal())
        .or_insert_with(|| match LoadedKernel::load(gpu) {
            Ok(k) => Some(Arc::new(k)),
            Err(e) => {
                tracing::warn!(device = gpu.ordinal(), error = %e, "the copy kernel did not load; copies use the copy engine");
                None
            }
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_per_256_vectors_within_the_cap() {
        assert_eq!(blocks_for(0), 1);
        assert_eq!(blocks_for(1), 1);
        assert_eq!(blocks_for(256), 1);
        assert_eq!(blocks_for(257), 2);
        // 64 MiB: 2^22 vectors.
        assert_eq!(blocks_for(1 << 22), 1 << 14);
        assert_eq!(blocks_for(u64::MAX), 1 << 22);
    }
}
