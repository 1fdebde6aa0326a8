//! How fast a device copies a batch of blocks, and one large block, by each way of
//! launching it (the one-sided 1000 × 64 KiB batch and the middle sizes; needs a CUDA
//! device, run it on the GPU machine):
//!
//! ```text
//! cargo run --release -p ferrylink-memory --example span_copy_rate [-- --iterations N] [--batch-only]
//! ```
//!
//! Every figure is the median over the iterations of one batch (or block) copied within
//! this process's device: `gpu` is the time between two events around the copies,
//! `host` from the host starting the launch to `cuStreamSynchronize` returning. Rows
//! marked `+flag` or `+event` record a completion flag or an event after the copies and
//! spin until the host sees it before the end event is recorded, so their `gpu` column
//! includes that detection (a few µs): compare them with each other, not with the
//! unmarked rows. The batch's destination blocks lie in reverse order with a gap after
//! each, as in `local-send-recv --blocks`.
//!
//! Batch methods: the span kernels as the transport launches them, a prepared transfer's
//! (table kept in device memory) and a transfer's (listed into pinned host memory, read
//! in place), each waited for by a flag and by an event; the span kernels' PTX launched
//! with other shapes (`span`: `ferrylink_copy_spans`, a load and a store at a time per
//! thread; `wide`: `ferrylink_copy_spans_wide`, four loads in flight per thread; blocks
//! per entry × threads per block), cache hints (`cs`: loads and stores marked
//! streaming, `nc`: loads through the read-only path), its table in pinned host memory
//! (`pinned`), and the first span kernel (`v1`: one block per entry); the same blocks with
//! their destinations in order and no gaps (`in order`, against the copy kernel on the
//! whole 64 MB: what the layout costs); `cuMemcpyBatchAsync` (the copy engines, one call
//! for the whole batch; CUDA 12.8 and later); one `cuMemcpyDtoDAsync` per block. Single
//! blocks, 1 MB to 1 GiB (left out with `--batch-only`): the copy engine against the
//! transport's copy kernel (a block per 4 KiB), each alone and with a flag or an event,
//! and the earlier copy grid (8 blocks per multiprocessor, each thread looping).
//!
//! Each method's result is compared with the expected bytes (an error, not a figure,
//! when a copy moved the wrong bytes or wrote a gap).

mod variants;

use cudarc::driver::sys;
use ferrylink_memory::cuda::copy::{memcpy_dtod_async, memcpy_dtoh_sync, memcpy_htod_sync, memset_d8_sync};
use ferrylink_memory::cuda::copy_kernel::kernel_copy_async;
use ferrylink_memory::cuda::span_kernel::{launch_listed, SpanBatch};
use ferrylink_memory::cuda::{DevicePool, Gpu, Stream};
use ferrylink_memory::DeviceBuffer;
use std::time::Instant;
use variants::{Done, Hints, Kernel, OldGridCopy, SpanShape, SpanVariant, Waiter};

type Error = Box<dyn std::error::Error>;

const WARMUPS: usize = 10;
const BLOCKS: usize = 1000;
const BLOCK_BYTES: usize = 64 << 10;
const SINGLE_SIZES: [usize; 7] = [1 << 20, 10 << 20, 64_000 << 10, 100 << 20, 128 << 20, 256 << 20, 1 << 30];

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let iterations = match args.iter().position(|a| a == "--iterations") {
        Some(i) => args.get(i + 1).ok_or("--iterations needs a number")?.parse()?,
        None => 200usize,
    };
    let gpu = Gpu::get(0)?;
    let stream = Stream::new(&gpu)?;
    let timer = Timer::new(&gpu)?;
    println!("{}: {iterations} iterations after {WARMUPS} warm-ups; medians in µs", gpu.name());
    batch_methods(&gpu, &stream, &timer, iterations)?;
    if !args.iter().any(|a| a == "--batch-only") {
        single_blocks(&gpu, &stream, &timer, iterations)?;
    }
    Ok(())
}

/// The batch: source blocks side by side, destination blocks reversed with gaps (or, to
/// tell the layout's cost from the kernel's, in order without gaps).
struct Batch {
    /// The blocks' source (the entries point into it).
    _src: DeviceBuffer,
    dst: DeviceBuffer,
    entries: Vec<(u64, u64, u64)>,
    expected: Vec<u8>,
}

impl Batch {
    fn new(gpu: &Gpu, in_order: bool) -> Result<Batch, Error> {
        let pool = DevicePool::shared(gpu.ordinal())?;
        let (src, dst) = (pool.alloc(BLOCKS * BLOCK_BYTES)?, pool.alloc(2 * BLOCKS * BLOCK_BYTES)?);
        let pattern: Vec<u8> = (0..BLOCKS * BLOCK_BYTES).map(|i| (i % 251) as u8 ^ (i >> 16) as u8).collect();
        // SAFETY: `src` holds the pattern's length of this device.
        unsafe { memcpy_htod_sync(gpu, src.device_ptr(), &pattern)? };
        let mut expected = vec![0u8; 2 * BLOCKS * BLOCK_BYTES];
        let mut entries = Vec::with_capacity(BLOCKS);
        for i in 0..BLOCKS {
            let at = if in_order { i * BLOCK_BYTES } else { (BLOCKS - 1 - i) * 2 * BLOCK_BYTES };
            expected[at..at + BLOCK_BYTES].copy_from_slice(&pattern[i * BLOCK_BYTES..(i + 1) * BLOCK_BYTES]);
            let (d, s) = (dst.device_ptr() + at as u64, src.device_ptr() + (i * BLOCK_BYTES) as u64);
            entries.push((d, s, BLOCK_BYTES as u64));
        }
        Ok(Batch { _src: src, dst, entries, expected })
    }

    fn clear(&self, gpu: &Gpu) -> Result<(), Error> {
        // SAFETY: `dst` holds this many bytes of this device; no queued work uses it.
        unsafe { memset_d8_sync(gpu, self.dst.device_ptr(), 0, self.dst.len())? };
        Ok(())
    }

    fn check(&self, gpu: &Gpu, method: &str) -> Result<(), Error> {
        check_bytes(gpu, &self.dst, &self.expected, method)
    }
}

/// The transport's launches, each followed by a completion flag or an event recorded on
/// the stream: a prepared transfer's (the table kept in device memory) and a transfer's
/// (listed into pinned host memory each time, read by the kernel in place).
fn batch_transport(batch: &Batch, gpu: &Gpu, stream: &Stream, timer: &Timer, iterations: usize) -> Result<(), Error> {
    let bytes = (BLOCKS * BLOCK_BYTES) as f64;
    let list = || -> Result<SpanBatch, Error> {
        let mut listed = SpanBatch::with_capacity(gpu, BLOCKS);
        listed.push_all(BLOCKS, |i| Ok::<_, Error>(batch.entries[i]))?;
        Ok(listed)
    };
    let kept = list()?.keep()?;
    let mut waiter = Waiter::new(gpu)?;
    for (prepared, done) in [(true, Done::Flag), (true, Done::Event), (false, Done::Flag), (false, Done::Event)] {
        batch.clear(gpu)?;
        let times = measure(timer, stream, iterations, || {
            // SAFETY: every entry lies in `src` and `dst`, which outlive the launch; the
            // destinations do not overlap; one launch at a time (waited for here).
            let table = unsafe {
                if prepared {
                    launch_listed(&kept, stream)?
                } else {
                    list()?.launch(stream)?
                }
            };
            waiter.finish(stream, done)?;
            drop(table);
            Ok(())
        })?;
        let table = if prepared { "kept table" } else { "pinned table" };
        let name = format!("transport: {table}{}", done.suffix());
        batch.check(gpu, &name)?;
        report(&name, times, bytes);
    }
    Ok(())
}

fn check_bytes(gpu: &Gpu, buf: &DeviceBuffer, expected: &[u8], method: &str) -> Result<(), Error> {
    let mut got = vec![0u8; expected.len()];
    // SAFETY: `buf` holds at least `expected.len()` bytes; the stream was synchronised.
    unsafe { memcpy_dtoh_sync(gpu, &mut got, buf.device_ptr())? };
    match got.iter().zip(expected).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(at) => Err(format!("{method}: wrong byte at {at}").into()),
    }
}

fn batch_methods(gpu: &Gpu, stream: &Stream, timer: &Timer, iterations: usize) -> Result<(), Error> {
    let batch = Batch::new(gpu, false)?;
    let bytes = (BLOCKS * BLOCK_BYTES) as f64;
    println!("\nbatch of {BLOCKS} × {} KiB ({bytes} bytes):", BLOCK_BYTES >> 10);
    println!("{:<28} {:>9} {:>9} {:>10}", "method", "gpu", "host", "GB/s (gpu)");
    batch_transport(&batch, gpu, stream, timer, iterations)?;

    let plain =
        |kernel, columns, done| SpanShape { kernel, hints: Hints::None, threads: 256, columns, pinned: false, done };
    let pinned = |kernel, columns| SpanShape { pinned: true, ..plain(kernel, columns, Done::Flag) };
    let shapes = [
        plain(Kernel::V1, 1, Done::Sync),
        plain(Kernel::Span, 8, Done::Sync),
        plain(Kernel::Wide, 4, Done::Sync),
        plain(Kernel::Span, 8, Done::Sync),
        plain(Kernel::Wide, 4, Done::Sync),
        plain(Kernel::Wide, 8, Done::Sync),
        plain(Kernel::Span, 16, Done::Sync),
        plain(Kernel::Wide, 16, Done::Sync),
        SpanShape { hints: Hints::Streaming, ..plain(Kernel::Span, 8, Done::Sync) },
        SpanShape { hints: Hints::ReadOnly, ..plain(Kernel::Span, 8, Done::Sync) },
        plain(Kernel::Span, 8, Done::Flag),
        plain(Kernel::Span, 8, Done::Event),
        pinned(Kernel::V1, 1),
        pinned(Kernel::Span, 1),
        pinned(Kernel::Wide, 1),
        pinned(Kernel::Wide, 2),
    ];
    for shape in shapes {
        span_variant(&batch, gpu, stream, (timer, iterations), shape, "")?;
    }
    let in_order = Batch::new(gpu, true)?;
    for shape in [plain(Kernel::Span, 8, Done::Sync), plain(Kernel::Wide, 4, Done::Sync)] {
        span_variant(&in_order, gpu, stream, (timer, iterations), shape, ", in order")?;
    }
    in_order.clear(gpu)?;
    let (dst, src, len) = (in_order.entries[0].0, in_order.entries[0].1, BLOCKS * BLOCK_BYTES);
    // SAFETY: the blocks in order are one range of `len` bytes in each buffer, which
    // outlive the copies.
    let times = measure(timer, stream, iterations, || unsafe { Ok(kernel_copy_async(dst, src, len, stream)?) })?;
    in_order.check(gpu, "copy kernel, one block")?;
    report("copy kernel, one block", times, bytes);

    batch.clear(gpu)?;
    match measure(timer, stream, iterations.min(50), || variants::memcpy_batch(&batch.entries, gpu, stream)) {
        Ok(times) => {
            batch.check(gpu, "cuMemcpyBatchAsync")?;
            report("cuMemcpyBatchAsync", times, bytes);
        }
        Err(e) => println!("{:<28} not measured: {e}", "cuMemcpyBatchAsync"),
    }

    batch.clear(gpu)?;
    let each = measure(timer, stream, iterations.min(50), || {
        for &(d, s, len) in &batch.entries {
            // SAFETY: the entry lies in `dst` and `src`, which outlive the copies.
            unsafe { memcpy_dtod_async(d, s, len as usize, stream)? };
        }
        Ok(())
    })?;
    batch.check(gpu, "cuMemcpyDtoDAsync each")?;
    report("cuMemcpyDtoDAsync each", each, bytes);
    Ok(())
}

/// Measures one span kernel variant over `batch` and checks what it wrote.
fn span_variant(
    batch: &Batch,
    gpu: &Gpu,
    stream: &Stream,
    (timer, iterations): (&Timer, usize),
    shape: SpanShape,
    suffix: &str,
) -> Result<(), Error> {
    let name = format!("{}{suffix}", shape.name());
    let mut variant = SpanVariant::load(gpu, &batch.entries, shape)?;
    batch.clear(gpu)?;
    let times = measure(timer, stream, iterations, || variant.launch(stream))?;
    batch.check(gpu, &name)?;
    report(&name, times, BLOCKS as f64 * BLOCK_BYTES as f64);
    Ok(())
}

fn single_blocks(gpu: &Gpu, stream: &Stream, timer: &Timer, iterations: usize) -> Result<(), Error> {
    let pool = DevicePool::shared(gpu.ordinal())?;
    let largest = SINGLE_SIZES[SINGLE_SIZES.len() - 1];
    let (src, dst) = (pool.alloc(largest)?, pool.alloc(largest)?);
    let pattern: Vec<u8> = (0..largest).map(|i| (i % 253) as u8).collect();
    // SAFETY: `src` holds `largest` bytes of this device.
    unsafe { memcpy_htod_sync(gpu, src.device_ptr(), &pattern)? };
    let old_grid = OldGridCopy::load(gpu)?;
    let mut waiter = Waiter::new(gpu)?;
    for len in SINGLE_SIZES {
        let bytes = len as f64;
        println!("\none block of {len} bytes:");
        println!("{:<28} {:>9} {:>9} {:>10}", "method", "gpu", "host", "GB/s (gpu)");
        let (d, s) = (dst.device_ptr(), src.device_ptr());
        for (engine, done) in [
            (true, Done::Sync),
            (true, Done::Flag),
            (true, Done::Event),
            (false, Done::Sync),
            (false, Done::Flag),
            (false, Done::Event),
        ] {
            // SAFETY: `dst` holds `len` bytes; no queued work uses it.
            unsafe { memset_d8_sync(gpu, d, 0, len)? };
            let times = measure(timer, stream, iterations, || {
                // SAFETY: `src` and `dst` hold `len` bytes and outlive the copy.
                unsafe {
                    if engine {
                        memcpy_dtod_async(d, s, len, stream)?
                    } else {
                        kernel_copy_async(d, s, len, stream)?
                    }
                };
                waiter.finish(stream, done)
            })?;
            let name = format!("{}{}", if engine { "copy engine" } else { "copy kernel" }, done.suffix());
            check_bytes(gpu, &dst, &pattern[..len], &name)?;
            report(&name, times, bytes);
        }
        // SAFETY: as above.
        unsafe { memset_d8_sync(gpu, d, 0, len)? };
        let times = measure(timer, stream, iterations, || old_grid.launch(d, s, len, stream))?;
        check_bytes(gpu, &dst, &pattern[..len], OldGridCopy::NAME)?;
        report(OldGridCopy::NAME, times, bytes);
    }
    Ok(())
}

/// Two timing events around each iteration's launch.
struct Timer {
    start: sys::CUevent,
    end: sys::CUevent,
}

impl Timer {
    fn new(gpu: &Gpu) -> Result<Timer, Error> {
        gpu.bind_to_current_thread()?;
        let mut events = [std::ptr::null_mut(); 2];
        for e in &mut events {
            // SAFETY: the context is bound; one event handle written.
            variants::check("cuEventCreate", unsafe { sys::cuEventCreate(e, 0) })?;
        }
        Ok(Timer { start: events[0], end: events[1] })
    }

    fn elapsed_us(&self) -> Result<f64, Error> {
        // SAFETY: both events were created by cuEventCreate, recorded on one stream, not
        // destroyed, and the stream synchronised. (cudarc calls the function of the CUDA
        // version its bindings were built for.)
        let ms = unsafe { cudarc::driver::result::event::elapsed(self.start, self.end) }
            .map_err(|e| format!("cuEventElapsedTime: {e}"))?;
        Ok(f64::from(ms) * 1e3)
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        for e in [self.start, self.end] {
            // SAFETY: created in `new`; no queued work records them any more.
            unsafe { sys::cuEventDestroy_v2(e) };
        }
    }
}

/// (gpu µs, host µs) per iteration after the warm-ups.
fn measure(
    timer: &Timer,
    stream: &Stream,
    iterations: usize,
    mut launch: impl FnMut() -> Result<(), Error>,
) -> Result<Vec<(f64, f64)>, Error> {
    let mut times = Vec::with_capacity(iterations);
    for i in 0..iterations + WARMUPS {
        let started = Instant::now();
        // SAFETY: the events belong to the stream's context.
        variants::check("cuEventRecord", unsafe { sys::cuEventRecord(timer.start, stream.raw()) })?;
        launch()?;
        // SAFETY: as above.
        variants::check("cuEventRecord", unsafe { sys::cuEventRecord(timer.end, stream.raw()) })?;
        stream.synchronize()?;
        let host = started.elapsed().as_secs_f64() * 1e6;
        if i >= WARMUPS {
            times.push((timer.elapsed_us()?, host));
        }
    }
    Ok(times)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn report(name: &str, times: Vec<(f64, f64)>, bytes: f64) {
    let gpu = median(times.iter().map(|t| t.0).collect());
    let host = median(times.iter().map(|t| t.1).collect());
    println!("{name:<28} {gpu:>9.2} {host:>9.2} {:>10.1}", bytes / gpu / 1e3);
}
