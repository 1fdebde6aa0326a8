//! How soon the host can know that a small device copy is done, by how it launches the
//! copy and how it learns of its end (the latency floor; needs a CUDA device, run
//! it on the GPU machine):
//!
//! ```text
//! cargo run --release -p ferrylink-memory --example copy_latency_floor [-- --iterations N]
//! ```
//!
//! Every figure is one copy between two buffers of this process's device, from the host
//! deciding to copy to the host knowing the copy is done (medians and p99 over the
//! iterations, in µs), at 8 B and 1 MiB:
//!
//! - `engine+sync`: `cuMemcpyDtoDAsync`, then `cuStreamSynchronize` (the "bare launch and
//!   synchronise" the README quotes, 9–10 µs);
//! - `kernel+sync`: the copy kernel, then `cuStreamSynchronize`;
//! - `kernel+query`: the copy kernel, then `cuStreamQuery` in a spin (what the connector
//!   does for its pushes and landings, `Stream::wait_by_polling`);
//! - `kernel+event`: the copy kernel, an event recorded after it, `cuEventQuery` in a spin
//!   (the ready events);
//! - `kernel+flag`: the copy kernel, then `cuStreamWriteValue32` of the copy's number into
//!   pinned host memory mapped for the device, which the host reads in a spin (no driver
//!   call while waiting);
//! - `persistent/B`: no launch per copy. A kernel of B blocks stays resident; block 0
//!   polls a mailbox in mapped pinned host memory, where the host writes (dst, src, len)
//!   and a sequence number, and relays it to the other blocks through device memory; the
//!   blocks copy their share, the last to finish writes the number into a done word the
//!   host spins on (`sys`: after a system-scope fence). Costs B multiprocessors for as
//!   long as it runs, PCIe reads while it polls, and it blocks `cuCtxSynchronize` (and
//!   the legacy default stream, were it launched there) until it is told to stop. A
//!   first version had every block poll the host mailbox: 46 µs at 8 blocks, 808 µs at
//!   132 (H200), the polls crowding the bus.
//!
//! First, the resident kernel's signalling floor: one block, nothing to copy.
//!
//! Each method's last copy is checked against its source (an error, not a figure, when a
//! copy moved the wrong bytes). With `nvidia-smi` on the path, the board's power draw is
//! sampled for two seconds with nothing running and with a persistent kernel polling.

use cudarc::driver::sys;
use ferrylink_memory::cuda::copy::{memcpy_dtod_async, memcpy_dtoh_sync, memset_d8_sync};
use ferrylink_memory::cuda::copy_kernel::kernel_copy_async;
use ferrylink_memory::cuda::{DevicePool, Event, Gpu, Stream};
use ferrylink_memory::DeviceBuffer;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

type Error = Box<dyn std::error::Error>;

/// The resident copy kernel: `mailbox` (mapped host memory) holds seq, dst, src, len and
/// stop as five u64; `done` (mapped host memory) receives each finished seq; `arrivals`
/// (device memory, zeroed) counts the blocks that finished a request. Only block 0 polls
/// the mailbox (over PCIe); it relays each request to the other blocks through `relay`
/// (device memory, zeroed: seq, dst, src, len; `u64::MAX` stops them). With
/// `sys_fence`, the done word is written after a system-scope fence (`fence.sc.sys`),
/// else after the device-scope one every block makes (`membar.gl`), which is what a
/// consumer on the GPU needs.
const PERSISTENT_PTX: &str = include_str!("resident_kernel.ptx");

/// The copy kernel writing its own completion flag (`kernel→flag`): the last block to
/// finish (by a counter in device memory) stores the copy's number into mapped host
/// memory after a system-scope fence, so no `cuStreamWriteValue32` is enqueued per copy.
const FLAGGED_PTX: &str = include_str!("flag_kernel.ptx");

const SIZES: [usize; 2] = [8, 1 << 20];
const THREADS_PER_BLOCK: u32 = 256;
/// How long the host waits for one copy before it gives up (an error, not a hang).
const COPY_TIMEOUT: Duration = Duration::from_secs(5);

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let iterations = match args.iter().position(|a| a == "--iterations") {
        Some(i) => args.get(i + 1).ok_or("--iterations needs a number")?.parse()?,
        None => 2000usize,
    };
    let gpu = Gpu::get(0)?;
    let sms = gpu_attribute(&gpu, sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    println!(
        "{} ({} SMs), {iterations} copies per figure, µs from deciding to copy to knowing it done",
        gpu.name(),
        sms
    );
    let stream = Stream::new(&gpu)?;
    let flagged = FlaggedKernel::load(&gpu)?;
    println!("(kernel→flag: the copy kernel writes its own done flag, the last block by a counter)");
    println!("(persistent/B: B resident blocks; \"sys\": the done word after a system-scope fence)");
    let host = MappedHost::new(&gpu, 4096)?;
    let pool = DevicePool::shared(0)?;
    ping(&gpu, &host, iterations)?;
    for len in SIZES {
        let src = pool.alloc(len)?;
        let dst = pool.alloc(len)?;
        fill_pattern(&gpu, &src, len)?;
        println!("\n{len} B:");
        let methods: [(&str, Method); 6] = [
            ("engine+sync", Method::EngineSync),
            ("kernel+sync", Method::KernelSync),
            ("kernel+query", Method::KernelQuery),
            ("kernel+event", Method::KernelEvent),
            ("kernel+flag", Method::KernelFlag),
            ("kernel→flag", Method::KernelOwnFlag),
        ];
        for (name, method) in methods {
            memset_d8_sync_checked(&gpu, &dst, len)?;
            let mut enqueue = Vec::with_capacity(iterations);
            let times = run_launched(method, (&stream, &flagged), &host, (&src, &dst, len), iterations, &mut enqueue);
            report(name, times, &gpu, &src, &dst, len)?;
            enqueue.sort_by(f64::total_cmp);
            if let Some(median) = enqueue.get(enqueue.len() / 2) {
                println!("  {:<16} (of which enqueueing the copy and its signal: median {median:.2})", "");
            }
        }
        let shapes = [(1u32, true), (1, false), (8, false), (32, false), (sms as u32, false)];
        for (blocks, sys_fence) in shapes {
            memset_d8_sync_checked(&gpu, &dst, len)?;
            let shape = ResidentShape { blocks, sys_fence };
            let times = run_persistent(&gpu, &host, &src, &dst, len, iterations, shape);
            let fence = if sys_fence { " sys" } else { "" };
            report(&format!("persistent/{blocks}{fence}"), times, &gpu, &src, &dst, len)?;
        }
    }
    power_comparison(&gpu, &host)?;
    Ok(())
}

#[derive(Clone, Copy)]
enum Method {
    EngineSync,
    KernelSync,
    KernelQuery,
    KernelEvent,
    KernelFlag,
    KernelOwnFlag,
}

/// [`FLAGGED_PTX`] loaded, with its block counter (device memory, zeroed).
struct FlaggedKernel {
    module: sys::CUmodule,
    function: sys::CUfunction,
    counter: DeviceBuffer,
}

impl FlaggedKernel {
    fn load(gpu: &Gpu) -> Result<FlaggedKernel, Error> {
        gpu.bind_to_current_thread()?;
        let ptx = std::ffi::CString::new(FLAGGED_PTX)?;
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: the context is bound; the PTX is NUL-terminated and outlives the call.
        let res = unsafe { sys::cuModuleLoadData(&mut module, ptx.as_ptr().cast()) };
        if res != sys::CUresult::CUDA_SUCCESS || module.is_null() {
            return Err(format!("cuModuleLoadData: {res:?}").into());
        }
        let mut function: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: the module was just loaded; the name is NUL-terminated.
        let res = unsafe { sys::cuModuleGetFunction(&mut function, module, c"ferrylink_copy_flagged".as_ptr()) };
        let counter = DevicePool::shared(gpu.ordinal())?.alloc(64)?;
        let kernel = FlaggedKernel { module, function, counter };
        if res != sys::CUresult::CUDA_SUCCESS || function.is_null() {
            return Err(format!("cuModuleGetFunction: {res:?}").into());
        }
        // SAFETY: 64 bytes of this device, nothing queued on them.
        unsafe { memset_d8_sync(gpu, kernel.counter.device_ptr(), 0, 64)? };
        Ok(kernel)
    }

    /// Enqueues a copy of `len` bytes (16-byte aligned addresses) that stores `value` at
    /// `flag` (mapped host memory) once every block finished.
    fn launch(&self, stream: &Stream, (dst, src, len): (u64, u64, usize), flag: u64, value: u32) -> Result<(), Error> {
        let (mut p_dst, mut p_src, mut n16) = (dst, src, (len / 16) as u64);
        let (mut tail_off, mut tail_len) = (n16 * 16, (len % 16) as u64);
        let (mut p_counter, mut p_flag, mut p_value) = (self.counter.device_ptr(), flag, value);
        let blocks = n16.div_ceil(u64::from(THREADS_PER_BLOCK)).max(1) as u32;
        let mut params: [*mut c_void; 8] = [
            (&mut p_dst as *mut u64).cast(),
            (&mut p_src as *mut u64).cast(),
            (&mut n16 as *mut u64).cast(),
            (&mut tail_off as *mut u64).cast(),
            (&mut tail_len as *mut u64).cast(),
            (&mut p_counter as *mut u64).cast(),
            (&mut p_flag as *mut u64).cast(),
            (&mut p_value as *mut u32).cast(),
        ];
        // SAFETY: seven u64 and a u32 matching the kernel's parameters, read during the
        // call; the buffers, the counter and the mapped flag outlive the copy (waited for
        // by the caller); one stream, so launches never share the counter at once.
        let res = unsafe {
            sys::cuLaunchKernel(
                self.function,
                blocks,
                1,
                1,
                THREADS_PER_BLOCK,
                1,
                1,
                0,
                stream.raw(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        if res != sys::CUresult::CUDA_SUCCESS {
            return Err(format!("cuLaunchKernel: {res:?}").into());
        }
        Ok(())
    }
}

impl Drop for FlaggedKernel {
    fn drop(&mut self) {
        // SAFETY: every launch was waited for; the module is unused.
        unsafe { sys::cuModuleUnload(self.module) };
    }
}

/// Pinned host memory mapped into the device's address space (`cuMemHostAlloc` with
/// `CU_MEMHOSTALLOC_DEVICEMAP`), zeroed, freed on drop.
struct MappedHost {
    host: *mut u8,
    device: u64,
}

impl MappedHost {
    fn new(gpu: &Gpu, len: usize) -> Result<MappedHost, Error> {
        gpu.bind_to_current_thread()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: the context is bound; the driver writes one pointer.
        let res = unsafe { sys::cuMemHostAlloc(&mut p, len, sys::CU_MEMHOSTALLOC_DEVICEMAP) };
        if res != sys::CUresult::CUDA_SUCCESS || p.is_null() {
            return Err(format!("cuMemHostAlloc(DEVICEMAP): {res:?}").into());
        }
        // SAFETY: `p` points at `len` bytes just allocated.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, len) };
        let mut device = 0u64;
        // SAFETY: `p` is mapped host memory of the bound context; one pointer written.
        let res = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, p, 0) };
        if res != sys::CUresult::CUDA_SUCCESS {
            // SAFETY: allocated above, unused.
            unsafe { sys::cuMemFreeHost(p) };
            return Err(format!("cuMemHostGetDevicePointer: {res:?}").into());
        }
        Ok(MappedHost { host: p.cast(), device })
    }

    /// The u64 at word `index` (8-byte aligned: the allocation is page-aligned).
    fn word(&self, index: usize) -> &AtomicU64 {
        // SAFETY: in bounds (callers use the first 64 words of 4096 bytes), aligned, and
        // alive as long as `self`; the device writes it only with aligned 8-byte stores.
        unsafe { &*self.host.add(index * 8).cast::<AtomicU64>() }
    }

    fn word32(&self, index: usize) -> &AtomicU32 {
        // SAFETY: as `word`, 4-byte words.
        unsafe { &*self.host.add(index * 4).cast::<AtomicU32>() }
    }
}

impl Drop for MappedHost {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc; nothing on the device uses it any more
        // (every kernel and stream operation using it was waited for).
        unsafe { sys::cuMemFreeHost(self.host.cast()) };
    }
}

fn gpu_attribute(gpu: &Gpu, attribute: sys::CUdevice_attribute) -> Result<i32, Error> {
    let mut value = 0i32;
    // SAFETY: one int written for a valid device handle.
    let res = unsafe { sys::cuDeviceGetAttribute(&mut value, attribute, gpu.raw_device()) };
    if res != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuDeviceGetAttribute: {res:?}").into());
    }
    Ok(value)
}

fn fill_pattern(gpu: &Gpu, buf: &DeviceBuffer, len: usize) -> Result<(), Error> {
    let pattern: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
    // SAFETY: `buf` holds `len` bytes of this device.
    unsafe { ferrylink_memory::cuda::copy::memcpy_htod_sync(gpu, buf.device_ptr(), &pattern)? };
    Ok(())
}

fn memset_d8_sync_checked(gpu: &Gpu, buf: &DeviceBuffer, len: usize) -> Result<(), Error> {
    // SAFETY: `buf` holds `len` bytes of this device, unused by any queued work.
    unsafe { memset_d8_sync(gpu, buf.device_ptr(), 0, len)? };
    Ok(())
}

/// One copy per iteration, launched per copy; the times in µs, or why it stopped.
/// `enqueue` receives, per copy, the µs until the copy and its signal were enqueued.
fn run_launched(
    method: Method,
    (stream, flagged): (&Stream, &FlaggedKernel),
    host: &MappedHost,
    (src, dst, len): (&DeviceBuffer, &DeviceBuffer, usize),
    iterations: usize,
    enqueue: &mut Vec<f64>,
) -> Result<Vec<f64>, Error> {
    let event = Event::new(stream.gpu())?;
    let flag = host.word32(64);
    let mut times = Vec::with_capacity(iterations);
    for i in 0..iterations + 10 {
        let started = Instant::now();
        // SAFETY: both buffers hold `len` bytes of this device and outlive the copy,
        // which is waited for below in every method.
        unsafe {
            match method {
                Method::EngineSync => memcpy_dtod_async(dst.device_ptr(), src.device_ptr(), len, stream)?,
                Method::KernelOwnFlag => {}
                _ => kernel_copy_async(dst.device_ptr(), src.device_ptr(), len, stream)?,
            }
        }
        let value = (i + 1) as u32;
        match method {
            Method::EngineSync | Method::KernelSync => stream.synchronize()?,
            Method::KernelQuery => {
                enqueue.push(started.elapsed().as_secs_f64() * 1e6);
                spin(|| stream.query().map_err(Into::into))?
            }
            Method::KernelEvent => {
                event.record(stream)?;
                spin(|| event.query().map_err(Into::into))?;
            }
            Method::KernelOwnFlag => {
                flagged.launch(stream, (dst.device_ptr(), src.device_ptr(), len), host.device + 64 * 4, value)?;
                enqueue.push(started.elapsed().as_secs_f64() * 1e6);
                spin(|| Ok(flag.load(Ordering::Acquire) == value))?;
            }
            Method::KernelFlag => {
                // SAFETY: the flag's device address is mapped host memory of this
                // context, alive until after the stream is synchronised below.
                let res = unsafe { sys::cuStreamWriteValue32_v2(stream.raw(), host.device + 64 * 4, value, 0) };
                if res != sys::CUresult::CUDA_SUCCESS {
                    return Err(format!("cuStreamWriteValue32: {res:?}").into());
                }
                enqueue.push(started.elapsed().as_secs_f64() * 1e6);
                spin(|| Ok(flag.load(Ordering::Acquire) == value))?;
            }
        }
        if i >= 10 {
            times.push(started.elapsed().as_secs_f64() * 1e6);
        }
    }
    stream.synchronize()?;
    Ok(times)
}

/// Spins until `done` says so; an error after [`COPY_TIMEOUT`].
fn spin(mut done: impl FnMut() -> Result<bool, Error>) -> Result<(), Error> {
    let started = Instant::now();
    while !done()? {
        if started.elapsed() > COPY_TIMEOUT {
            return Err("the copy did not complete in 5 s".into());
        }
        std::hint::spin_loop();
    }
    Ok(())
}

/// The resident kernel loaded and launched on its own non-blocking stream, stopped (and
/// waited for) on drop.
struct Resident<'a> {
    stream: Stream,
    module: sys::CUmodule,
    arrivals: DeviceBuffer,
    host: &'a MappedHost,
}

impl<'a> Resident<'a> {
    fn launch(gpu: &Gpu, host: &'a MappedHost, blocks: u32, sys_fence: bool) -> Result<Resident<'a>, Error> {
        gpu.bind_to_current_thread()?;
        let ptx = std::ffi::CString::new(PERSISTENT_PTX)?;
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: the context is bound; the PTX is NUL-terminated and outlives the call.
        let res = unsafe { sys::cuModuleLoadData(&mut module, ptx.as_ptr().cast()) };
        if res != sys::CUresult::CUDA_SUCCESS || module.is_null() {
            return Err(format!("cuModuleLoadData: {res:?}").into());
        }
        let mut function: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: the module was just loaded; the name is NUL-terminated.
        let res = unsafe { sys::cuModuleGetFunction(&mut function, module, c"ferrylink_persistent_copy".as_ptr()) };
        let arrivals = DevicePool::shared(gpu.ordinal())?.alloc(64)?;
        let resident = Resident { stream: Stream::new(gpu)?, module, arrivals, host };
        if res != sys::CUresult::CUDA_SUCCESS || function.is_null() {
            return Err(format!("cuModuleGetFunction: {res:?}").into());
        }
        // SAFETY: 64 bytes of this device (the counter, then the relay at 32), nothing
        // queued on them.
        unsafe { memset_d8_sync(gpu, resident.arrivals.device_ptr(), 0, 64)? };
        for w in 0..9 {
            host.word(w).store(0, Ordering::SeqCst);
        }
        let (mut p_mailbox, mut p_done, mut p_arrivals) =
            (host.device, host.device + 8 * 8, resident.arrivals.device_ptr());
        let (mut p_relay, mut p_sys_fence) = (resident.arrivals.device_ptr() + 32, u32::from(sys_fence));
        let mut params: [*mut c_void; 5] = [
            (&mut p_mailbox as *mut u64).cast(),
            (&mut p_done as *mut u64).cast(),
            (&mut p_arrivals as *mut u64).cast(),
            (&mut p_relay as *mut u64).cast(),
            (&mut p_sys_fence as *mut u32).cast(),
        ];
        // SAFETY: the function takes four u64 and a u32, read during the call; the
        // mailbox and done words are mapped host memory and the counter device memory,
        // all alive until `Drop` stopped the kernel and synchronised its stream.
        let res = unsafe {
            sys::cuLaunchKernel(
                function,
                blocks,
                1,
                1,
                THREADS_PER_BLOCK,
                1,
                1,
                0,
                resident.stream.raw(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        if res != sys::CUresult::CUDA_SUCCESS {
            return Err(format!("cuLaunchKernel: {res:?}").into());
        }
        Ok(resident)
    }

    /// Posts one copy and spins until the kernel reports it done.
    fn copy(&self, seq: u64, dst: u64, src: u64, len: usize) -> Result<(), Error> {
        let host = self.host;
        host.word(1).store(dst, Ordering::Relaxed);
        host.word(2).store(src, Ordering::Relaxed);
        host.word(3).store(len as u64, Ordering::Relaxed);
        host.word(0).store(seq, Ordering::Release);
        spin(|| Ok(host.word(8).load(Ordering::Acquire) == seq))
    }
}

impl Drop for Resident<'_> {
    fn drop(&mut self) {
        self.host.word(4).store(1, Ordering::SeqCst);
        let _ = self.stream.synchronize();
        // SAFETY: the kernel stopped (its stream was synchronised); the module is unused.
        unsafe { sys::cuModuleUnload(self.module) };
    }
}

/// How a resident kernel runs: its blocks, and whether its done word follows a
/// system-scope fence.
#[derive(Clone, Copy)]
struct ResidentShape {
    blocks: u32,
    sys_fence: bool,
}

fn run_persistent(
    gpu: &Gpu,
    host: &MappedHost,
    src: &DeviceBuffer,
    dst: &DeviceBuffer,
    len: usize,
    iterations: usize,
    shape: ResidentShape,
) -> Result<Vec<f64>, Error> {
    let resident = Resident::launch(gpu, host, shape.blocks, shape.sys_fence)?;
    let mut times = Vec::with_capacity(iterations);
    for i in 0..iterations + 10 {
        let started = Instant::now();
        resident.copy(i as u64 + 1, dst.device_ptr(), src.device_ptr(), len)?;
        if i >= 10 {
            times.push(started.elapsed().as_secs_f64() * 1e6);
        }
    }
    Ok(times)
}

fn report(
    name: &str,
    times: Result<Vec<f64>, Error>,
    gpu: &Gpu,
    src: &DeviceBuffer,
    dst: &DeviceBuffer,
    len: usize,
) -> Result<(), Error> {
    let mut times = match times {
        Ok(t) => t,
        Err(e) => {
            println!("  {name:<16} failed: {e}");
            return Ok(());
        }
    };
    let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
    // SAFETY: both buffers hold `len` bytes; nothing is queued on them any more.
    unsafe {
        memcpy_dtoh_sync(gpu, &mut a, src.device_ptr())?;
        memcpy_dtoh_sync(gpu, &mut b, dst.device_ptr())?;
    }
    if a != b {
        return Err(format!("{name}: the destination differs from the source after the copies").into());
    }
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)];
    println!("  {name:<16} median {:>7.2}   p99 {:>7.2}   min {:>6.2}", at(0.5), at(0.99), times[0]);
    Ok(())
}

/// The signalling floor of a resident kernel: one block, nothing to copy (the host posts,
/// the kernel sees it over PCIe and writes the done word back).
fn ping(gpu: &Gpu, host: &MappedHost, iterations: usize) -> Result<(), Error> {
    let buf = DevicePool::shared(gpu.ordinal())?.alloc(16)?;
    let shape = ResidentShape { blocks: 1, sys_fence: false };
    let mut times = run_persistent(gpu, host, &buf, &buf, 0, iterations, shape)?;
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)];
    println!(
        "\nresident kernel, nothing copied (host → GPU → host signalling): median {:.2}   p99 {:.2}   min {:.2}",
        at(0.5),
        at(0.99),
        times[0]
    );
    Ok(())
}

/// The board's power draw (W, `nvidia-smi`) averaged over two seconds, idle and with a
/// resident kernel of one block polling; skipped without `nvidia-smi`.
fn power_comparison(gpu: &Gpu, host: &MappedHost) -> Result<(), Error> {
    let idle = match sample_power() {
        Some(w) => w,
        None => {
            println!("\npower: nvidia-smi not available, not measured");
            return Ok(());
        }
    };
    let polling_one = {
        let _resident = Resident::launch(gpu, host, 1, false)?;
        sample_power()
    };
    let polling_all = {
        let sms = gpu_attribute(gpu, sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let _resident = Resident::launch(gpu, host, sms as u32, false)?;
        sample_power()
    };
    let show = |w: Option<f64>| w.map_or("?".to_string(), |w| format!("{w:.1} W"));
    println!(
        "\npower (nvidia-smi, 2 s each): idle {idle:.1} W, one resident block polling {}, a block per SM polling {}",
        show(polling_one),
        show(polling_all)
    );
    Ok(())
}

fn sample_power() -> Option<f64> {
    let mut samples = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(2) {
        let out = std::process::Command::new("nvidia-smi")
            .args(["--query-gpu=power.draw", "--format=csv,noheader,nounits", "-i", "0"])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        if let Ok(w) = text.trim().parse::<f64>() {
            samples.push(w);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    (!samples.is_empty()).then(|| samples.iter().sum::<f64>() / samples.len() as f64)
}
