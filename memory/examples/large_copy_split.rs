//! Whether a large device copy ends sooner when it is enqueued in pieces, so the GPU
//! starts on the first piece while the host still enqueues the rest (needs a CUDA device, run it on the GPU machine):
//!
//! ```text
//! cargo run --release -p ferrylink-memory --example large_copy_split [-- --iterations N]
//! ```
//!
//! Timelines of the transport put 10–13 µs of host time in enqueuing one `cuMemcpyDtoDAsync` of
//! 100 MB or 1 GB (3.7 µs at 8 B): if the GPU only starts once the call returns, a
//! piece enqueued first, small enough to enqueue fast and large enough to cover the
//! next piece's enqueue, moves the start earlier. Every figure is one copy between two
//! buffers of this process's device (`cuMemAlloc` memory and pool memory), from the host
//! deciding to copy to the host knowing it done (`cuStreamQuery` in a spin, as the
//! transport waits), on a non-blocking and on the legacy default stream:
//!
//! - `engine`: one `cuMemcpyDtoDAsync`;
//! - `kernel`: one launch of ferrylink's copy kernel;
//! - `engine head 8M`: an 8 MiB piece, then the rest;
//! - `engine doubling 2M`: pieces of 2, 4, 8, … MiB, the last one the rest;
//! - `engine 64M pieces`: pieces of 64 MiB;
//! - `pair engine` / `pair doubling 2M`: A → B then B → A on one stream, one wait (the
//!   benchmark's ceiling), whole or in doubling pieces.
//!
//! Columns: the host time to enqueue everything, to the first piece enqueued, and to the
//! copy seen done (median, p90), with the rate at the median. Each method's copy is
//! checked at its pieces' edges (an error, not a figure, when it moved the wrong bytes).

use ferrylink_memory::cuda::copy::{memcpy_dtod_async, memcpy_dtoh_sync, memset_d8_sync};
use ferrylink_memory::cuda::copy_kernel::kernel_copy_async;
use ferrylink_memory::cuda::{DeviceAllocation, DevicePool, Gpu, Stream};
use std::time::{Duration, Instant};

type Error = Box<dyn std::error::Error>;

const MIB: usize = 1 << 20;
const SIZES: [usize; 6] = [MIB, 16 * MIB, 64 * MIB, 100_000_000, 256 * MIB, 1_000_000_000];

/// How a copy of `len` bytes is cut: the pieces' lengths, in order.
#[derive(Clone, Copy)]
enum Cut {
    Whole,
    Head(usize),
    Doubling(usize),
    Pieces(usize),
}

impl Cut {
    fn pieces(self, len: usize) -> Vec<usize> {
        let mut out = Vec::new();
        let mut left = len;
        let mut next = match self {
            Cut::Whole => len,
            Cut::Head(first) | Cut::Doubling(first) | Cut::Pieces(first) => first,
        };
        while left > 0 {
            let piece = next.min(left);
            out.push(piece);
            left -= piece;
            next = match self {
                Cut::Whole | Cut::Head(_) => left,
                Cut::Doubling(_) => next * 2,
                Cut::Pieces(each) => each,
            };
        }
        out
    }
}

/// One way of copying: its name, its engine, its cut, and whether it copies back too.
struct Method {
    name: &'static str,
    kernel: bool,
    cut: Cut,
    pair: bool,
}

const METHODS: [Method; 7] = [
    Method { name: "engine", kernel: false, cut: Cut::Whole, pair: false },
    Method { name: "kernel", kernel: true, cut: Cut::Whole, pair: false },
    Method { name: "engine head 8M", kernel: false, cut: Cut::Head(8 * MIB), pair: false },
    Method { name: "engine doubling 2M", kernel: false, cut: Cut::Doubling(2 * MIB), pair: false },
    Method { name: "engine 64M pieces", kernel: false, cut: Cut::Pieces(64 * MIB), pair: false },
    Method { name: "pair engine", kernel: false, cut: Cut::Whole, pair: true },
    Method { name: "pair doubling 2M", kernel: false, cut: Cut::Doubling(2 * MIB), pair: true },
];

/// Host times of one copy: everything enqueued, the first piece enqueued, seen done.
struct Times {
    enqueued: Vec<Duration>,
    first: Vec<Duration>,
    done: Vec<Duration>,
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let iterations: Option<usize> = match args.iter().position(|a| a == "--iterations") {
        Some(i) => Some(args.get(i + 1).ok_or("--iterations needs a number")?.parse()?),
        None => None,
    };
    let gpu = Gpu::get(0)?;
    gpu.bind_to_current_thread()?;
    println!("{}; µs of host time: enqueued, first piece enqueued, done (median, p90), GB/s at the median", gpu.name());
    let pool = DevicePool::shared(gpu.ordinal())?;
    for n in SIZES {
        // A few hundred ms per row at most.
        let iters = iterations.unwrap_or((4_000_000_000 / n).clamp(30, 1000));
        for memory in ["cuMemAlloc", "pool"] {
            let (a, b, _held) = match memory {
                "pool" => {
                    let (a, b) = (pool.alloc(n)?, pool.alloc(n)?);
                    (a.device_ptr(), b.device_ptr(), Box::new((a, b)) as Held)
                }
                _ => {
                    let (a, b) = (DeviceAllocation::new(&gpu, n)?, DeviceAllocation::new(&gpu, n)?);
                    (a.ptr(), b.ptr(), Box::new((a, b)) as Held)
                }
            };
            let own = Stream::new(&gpu)?;
            let legacy = Stream::legacy_default(&gpu);
            for (stream_name, stream) in [("non-blocking", &own), ("legacy", &legacy)] {
                for method in &METHODS {
                    check(&gpu, method, a, b, n, stream)?;
                    let times = time_method(method, a, b, n, stream, iters)?;
                    let label = format!("{} {memory} {stream_name} {}", human(n), method.name);
                    report(&label, n * if method.pair { 2 } else { 1 }, times);
                }
            }
            own.synchronize()?;
            legacy.synchronize()?;
        }
    }
    Ok(())
}

/// The two buffers of a row, kept until its copies are done.
type Held = Box<dyn std::any::Any>;

/// Enqueues `method`'s copy of `n` bytes a → b (and back for a pair); the time its first
/// piece was enqueued.
fn enqueue(method: &Method, a: u64, b: u64, n: usize, stream: &Stream, started: Instant) -> Result<Duration, Error> {
    let mut first = None;
    let directions: &[(u64, u64)] = if method.pair { &[(b, a), (a, b)] } else { &[(b, a)] };
    for &(dst, src) in directions {
        let mut offset = 0usize;
        for piece in method.cut.pieces(n) {
            let (d, s) = (dst + offset as u64, src + offset as u64);
            // SAFETY: a and b are live allocations of n bytes held by the caller until
            // the stream is synchronised; every piece lies within them.
            unsafe {
                if method.kernel {
                    kernel_copy_async(d, s, piece, stream)?;
                } else {
                    memcpy_dtod_async(d, s, piece, stream)?;
                }
            }
            first.get_or_insert_with(|| started.elapsed());
            offset += piece;
        }
    }
    Ok(first.unwrap_or_default())
}

fn time_method(method: &Method, a: u64, b: u64, n: usize, stream: &Stream, iters: usize) -> Result<Times, Error> {
    let mut times = Times { enqueued: Vec::new(), first: Vec::new(), done: Vec::new() };
    for i in 0..iters + 3 {
        stream.synchronize()?;
        let started = Instant::now();
        let first = enqueue(method, a, b, n, stream, started)?;
        let enqueued = started.elapsed();
        stream.wait_by_polling()?;
        let done = started.elapsed();
        if i >= 3 {
            times.enqueued.push(enqueued);
            times.first.push(first);
            times.done.push(done);
        }
    }
    Ok(times)
}

/// Copies a pattern with `method` once and reads `b` back at every piece's edges.
fn check(gpu: &Gpu, method: &Method, a: u64, b: u64, n: usize, stream: &Stream) -> Result<(), Error> {
    let value = (n as u8).wrapping_add(method.name.len() as u8) | 1;
    // SAFETY: a and b are live allocations of n bytes of this device.
    unsafe {
        memset_d8_sync(gpu, a, value, n)?;
        memset_d8_sync(gpu, b, 0, n)?;
    }
    // A pair copies b back onto a after a → b: b is still what a held.
    enqueue(method, a, b, n, stream, Instant::now())?;
    stream.synchronize()?;
    let mut edges = vec![0usize, n - 1];
    let mut offset = 0;
    for piece in method.cut.pieces(n) {
        edges.extend([offset, offset + piece - 1]);
        offset += piece;
    }
    for at in edges {
        let mut byte = [0u8; 1];
        // SAFETY: `at` < n, within b.
        unsafe { memcpy_dtoh_sync(gpu, &mut byte, b + at as u64)? };
        if byte[0] != value {
            return Err(format!("{}: byte {at} of {n} is {} after the copy, not {value}", method.name, byte[0]).into());
        }
    }
    Ok(())
}

fn human(n: usize) -> String {
    if n.is_multiple_of(MIB) {
        format!("{}MiB", n / MIB)
    } else {
        format!("{}MB", n / 1_000_000)
    }
}

fn report(label: &str, bytes: usize, mut times: Times) {
    for v in [&mut times.enqueued, &mut times.first, &mut times.done] {
        v.sort();
    }
    let at = |v: &[Duration], q: f64| v[((v.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    let done = at(&times.done, 0.5);
    println!(
        "{label:48} enq {:8.2} first {:7.2} done {:9.2} p90 {:9.2} | {:7.1} GB/s",
        at(&times.enqueued, 0.5),
        at(&times.first, 0.5),
        done,
        at(&times.done, 0.9),
        bytes as f64 / done / 1e3,
    );
}
