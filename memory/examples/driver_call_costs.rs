//! What the driver calls on a send's path cost the calling thread, and what a query of
//! the legacy default stream says while other streams are busy (needs a CUDA device; run
//! it on the GPU machine):
//!
//! ```text
//! cargo run --release -p ferrylink-memory --example driver_call_costs [-- --iterations N]
//! ```
//!
//! Every figure is host time in ns (median and p99 over the iterations) of one call on an
//! idle device: `cuStreamQuery` and `cuEventRecord` on the legacy default stream,
//! `cuEventQuery` of a completed event, `cuStreamWriteValue32` of a completion flag
//! (`DoneFlag::record`), saving and binding the current context; then how long after
//! the call returned the host knows the work done: a flag's word seen, an event's query
//! answering true. They were measured to decide whether a listener's send could ask
//! "is the legacy stream idle?" instead of recording and polling its producer's event
//! (docs/decisions/0031-progress-thread-pacing.md: no, the query costs three records). Then what enqueuing one 8 B
//! copy costs: the copy kernel, the copy engine and the signalling kernel, on a
//! non-blocking and on the legacy stream, and a wait for a completed event.

use cudarc::driver::sys;
use ferrylink_memory::cuda::copy::memcpy_dtod_async;
use ferrylink_memory::cuda::copy_kernel::{kernel_copy_async, kernel_copy_signalled};
use ferrylink_memory::cuda::{CurrentContextGuard, DevicePool, DoneFlag, Event, Gpu, Stream};
use std::time::{Duration, Instant};

type Error = Box<dyn std::error::Error>;

/// The busy work: passes of a memset over this many bytes.
const BUSY_LEN: usize = 48 << 20;
/// How long the host waits for one flag or event (an error, not a hang).
const WAIT_TIMEOUT: Duration = Duration::from_secs(5);

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let iterations = match args.iter().position(|a| a == "--iterations") {
        Some(i) => args.get(i + 1).ok_or("--iterations needs a number")?.parse()?,
        None => 2000usize,
    };
    let gpu = Gpu::get(0)?;
    gpu.bind_to_current_thread()?;
    println!("{}, {iterations} calls per figure, ns of host time (median, p99)", gpu.name());
    let legacy = Stream::legacy_default(&gpu);
    legacy_query_semantics(&gpu, &legacy)?;
    let event = Event::new(&gpu)?;
    let mut flag = DoneFlag::acquire(&gpu)?;
    report("cuStreamQuery(legacy), idle", time_each(iterations, || legacy.query().map(drop))?);
    report("cuEventRecord(legacy)", time_each(iterations, || event.record_on_legacy_default_stream())?);
    legacy.synchronize()?;
    report("cuEventQuery, completed event", time_each(iterations, || event.query().map(drop))?);
    report("cuStreamWriteValue32 of a flag (legacy)", time_each(iterations, || flag.record(&legacy))?);
    legacy.synchronize()?;
    report("CurrentContextGuard::save", time_each(iterations, || CurrentContextGuard::save().map(drop))?);
    report("Gpu::bind_to_current_thread", time_each(iterations, || gpu.bind_to_current_thread())?);
    let mut seen = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        flag.record(&legacy)?;
        let returned = Instant::now();
        spin_until(|| Ok(flag.is_set()))?;
        seen.push(returned.elapsed());
    }
    report("flag recorded -> its word seen", seen);
    let mut seen = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        event.record_on_legacy_default_stream()?;
        let returned = Instant::now();
        spin_until(|| Ok(event.query()?))?;
        seen.push(returned.elapsed());
    }
    report("event recorded -> its query true", seen);
    enqueue_costs(&gpu, &legacy, iterations)?;
    Ok(())
}

/// What enqueuing one 8 B copy costs the calling thread, by how it is enqueued and on
/// which stream, with the stream idle before each call (as on a round trip's path), and
/// how long after the call the host sees a flag the copy kernel wrote itself.
fn enqueue_costs(gpu: &Gpu, legacy: &Stream, iterations: usize) -> Result<(), Error> {
    let pool = DevicePool::shared(gpu.ordinal())?;
    let (src, dst) = (pool.alloc(4096)?, pool.alloc(4096)?);
    let (s, d) = (src.device_ptr(), dst.device_ptr());
    let own = Stream::new(gpu)?;
    let waited = Event::new(gpu)?;
    waited.record(&own)?;
    own.synchronize()?;
    let mut flag = DoneFlag::acquire(gpu)?;
    for (name, stream) in [("non-blocking", &own), ("legacy", legacy)] {
        let kernel = time_synchronised(iterations, stream, || {
            // SAFETY: both 4 KiB allocations live until the end of this function and each
            // stream is synchronised after every call, before they go (so every copy here).
            unsafe { kernel_copy_async(d, s, 8, stream) }
        })?;
        report(&format!("copy kernel 8 B launch ({name})"), kernel);
        let engine = time_synchronised(iterations, stream, || {
            // SAFETY: as above.
            unsafe { memcpy_dtod_async(d, s, 8, stream) }
        })?;
        report(&format!("cuMemcpyDtoDAsync 8 B ({name})"), engine);
        let signalled = time_synchronised(iterations, stream, || {
            // SAFETY: as above; the flag's word stays mapped while `flag` lives.
            unsafe { kernel_copy_signalled(d, s, 8, stream, &mut flag) }.map(drop)
        })?;
        report(&format!("signalled copy kernel 8 B launch ({name})"), signalled);
    }
    let wait = time_synchronised(iterations, &own, || own.wait_event(&waited))?;
    report("cuStreamWaitEvent of a completed event", wait);
    let mut seen = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        // SAFETY: as above.
        if !unsafe { kernel_copy_signalled(d, s, 8, &own, &mut flag) }? {
            return Err("the signalled copy kernel did not apply".into());
        }
        let returned = Instant::now();
        spin_until(|| Ok(flag.is_set()))?;
        seen.push(returned.elapsed());
    }
    report("signalled copy launched -> its flag seen", seen);
    Ok(())
}

/// Times each call alone, with `stream` synchronised after it (untimed).
fn time_synchronised(
    iterations: usize,
    stream: &Stream,
    call: impl FnMut() -> ferrylink_memory::cuda::CudaResult<()>,
) -> Result<Vec<Duration>, Error> {
    time_each_then(iterations, call, || stream.synchronize())
}

/// Whether `cuStreamQuery` on the legacy default stream answers for work on a blocking
/// stream (it must, to stand in for an event recorded there), on a non-blocking one, and
/// on itself.
fn legacy_query_semantics(gpu: &Gpu, legacy: &Stream) -> Result<(), Error> {
    let buf = DevicePool::shared(gpu.ordinal())?.alloc(BUSY_LEN)?;
    let busy = |stream: sys::CUstream| -> Result<(), Error> {
        for pass in 0..40u8 {
            // SAFETY: `buf` is a live allocation of this context of BUSY_LEN bytes, and
            // every stream it is set on is synchronised before it goes.
            unsafe { cudarc::driver::result::memset_d8_async(buf.device_ptr(), pass, BUSY_LEN, stream)? };
        }
        Ok(())
    };
    let mut blocking: sys::CUstream = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local; flags 0 make a blocking stream of the bound context.
    let created = unsafe { sys::cuStreamCreate(&mut blocking, 0) };
    if created != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuStreamCreate: {created:?}").into());
    }
    let non_blocking = Stream::new(gpu)?;
    for (name, stream) in
        [("a blocking stream", blocking), ("a non-blocking stream", non_blocking.raw()), ("itself", legacy.raw())]
    {
        busy(stream)?;
        let idle = legacy.query()?;
        // SAFETY: a live stream of this context (the legacy one is the null handle).
        unsafe { sys::cuStreamSynchronize(stream) };
        println!("cuStreamQuery(legacy) while {name} is busy: {}", if idle { "idle" } else { "busy" });
    }
    // SAFETY: created above, idle (synchronised), destroyed once.
    unsafe { sys::cuStreamDestroy_v2(blocking) };
    Ok(())
}

fn time_each(
    iterations: usize,
    call: impl FnMut() -> ferrylink_memory::cuda::CudaResult<()>,
) -> Result<Vec<Duration>, Error> {
    time_each_then(iterations, call, || Ok(()))
}

/// Times each call alone, running `after` (untimed) after each.
fn time_each_then(
    iterations: usize,
    mut call: impl FnMut() -> ferrylink_memory::cuda::CudaResult<()>,
    mut after: impl FnMut() -> ferrylink_memory::cuda::CudaResult<()>,
) -> Result<Vec<Duration>, Error> {
    let mut times = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let started = Instant::now();
        call()?;
        times.push(started.elapsed());
        after()?;
    }
    Ok(times)
}

fn spin_until(mut done: impl FnMut() -> Result<bool, Error>) -> Result<(), Error> {
    let started = Instant::now();
    while !done()? {
        if started.elapsed() > WAIT_TIMEOUT {
            return Err(format!("not done within {WAIT_TIMEOUT:?}").into());
        }
        std::hint::spin_loop();
    }
    Ok(())
}

fn report(what: &str, mut times: Vec<Duration>) {
    times.sort();
    let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize].as_nanos();
    println!("{what:45} {:>6} {:>6}", at(0.5), at(0.99));
}
