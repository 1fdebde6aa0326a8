//! What importing stream-ordered pool memory into another process costs, by size and by
//! how the exporter allocates (needs a CUDA device; run it on the GPU machine):
//!
//! ```text
//! cargo run --release -p ferrylink-memory --example pool_import_cost [-- --cudarc-only]
//! ```
//!
//! The exporter (this process) allocates from an [`ExportablePool`] and sends the
//! pointer's export data to an importer (this program again, started with `--importer`).
//! The importer imports the pointer, copies its own buffer into it twice (each copy
//! synchronised, by the copy kernel up to 64 MiB as the transport copies) and once more by
//! the copy engine, and frees the import; then the exporter frees the allocation (only
//! then, as CUDA requires). Four patterns, each for 1 MB, 64 MB and 1 GB:
//!
//! - `fresh`: a new allocation every iteration while the previous one is still allocated
//!   (as a server that allocates its next buffer before freeing the last);
//! - `reuse`: a new allocation every iteration after the previous one was freed (the pool
//!   usually hands back the same address);
//! - `same`: one allocation imported again every iteration;
//! - `same-sync`: the same, the importer synchronising its context (`cuCtxSynchronize`)
//!   after each free, as a process may between messages (`DeviceBuffer::fill` does). The
//!   driver then unmaps the freed import, and the next import of the same memory maps it
//!   anew (an imported pool's release threshold cannot be raised: driver 580 answers
//!   `cuMemPoolSetAttribute` on it with `CUDA_ERROR_INVALID_VALUE`).
//!
//! With `--cudarc-only`, the pool is the one [`install_exportable_pool`] makes the device's
//! current pool (in both processes), and the allocations are made as `local-send-recv
//! --memory cudarc` makes them: `fresh` (as above, from that pool), `twice` (the same, the
//! importer opening each allocation a second time after the first import was freed, as
//! the round trip's echo does), `cudarc` (a new
//! `CudaSlice` every iteration on cudarc's default stream, the previous one alive, no
//! synchronisation after the allocation), `cudarc-sync` (synchronised after it),
//! `alloc-during` (cudarc's, the next one made while the importer imports this one) and
//! `cudarc-importer-sync` (cudarc's, the importer synchronising after each free), for
//! 1,000,000 and 1,000,000,000 bytes (instead of the patterns above).
//!
//! Printed: medians over the iterations after the first, in µs, of the export, the
//! import, the first and second copy, the copy-engine copy and the free; and the copy
//! ceilings of the size on this device (a copy between two local `cuMemAlloc` buffers, by
//! the kernel path and by the copy engine).

use ferrylink_memory::cuda::copy::memcpy_dtod_async;
use ferrylink_memory::cuda::copy_kernel::copy_dtod_async;
use ferrylink_memory::cuda::{
    cudarc_stream, export_pointer, from_cuda_slice, install_exportable_pool, DevicePool, ExportablePool, Gpu,
    ImportedPool, Stream,
};
use ferrylink_memory::DeviceBuffer;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Instant;

type Error = Box<dyn std::error::Error>;

const SIZES: [usize; 3] = [1 << 20, 64 << 20, 1 << 30];
const PATTERNS: [&str; 4] = ["fresh", "reuse", "same", "same-sync"];
const CUDARC_SIZES: [usize; 2] = [1_000_000, 1_000_000_000];
const CUDARC_PATTERNS: [&str; 6] = ["fresh", "twice", "cudarc", "cudarc-sync", "alloc-during", "cudarc-importer-sync"];
const ITERATIONS: usize = 9;

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--importer") {
        let fd = |i: usize| -> Result<RawFd, Error> { Ok(args.get(i).ok_or("missing fd")?.parse()?) };
        return importer(fd(2)?, fd(3)?);
    }
    exporter(args.iter().any(|a| a == "--cudarc-only"))
}

fn micros(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e6
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Copies `src` into `dst` (`len` bytes) on `stream` and waits: µs. By the copy kernel
/// as the transport chooses it, or by the copy engine (`engine`).
fn timed_copy(dst: u64, src: u64, len: usize, stream: &Stream, engine: bool) -> Result<f64, Error> {
    let t = Instant::now();
    // SAFETY: both ranges are live device memory of at least `len` bytes on the stream's
    // device for the duration (the caller holds them); we synchronise before returning.
    unsafe {
        if engine {
            memcpy_dtod_async(dst, src, len, stream)?;
        } else {
            copy_dtod_async(dst, src, len, stream)?;
        }
    }
    stream.synchronize()?;
    Ok(micros(t))
}

/// The local copy ceilings of `len` bytes: (kernel path, copy engine), µs.
fn ceilings(local: &DevicePool, len: usize, stream: &Stream) -> Result<(f64, f64), Error> {
    let (a, b) = (local.alloc(len)?, local.alloc(len)?);
    let mut out = (f64::NAN, f64::NAN);
    for _ in 0..3 {
        out = (
            timed_copy(a.device_ptr(), b.device_ptr(), len, stream, false)?,
            timed_copy(a.device_ptr(), b.device_ptr(), len, stream, true)?,
        );
    }
    Ok(out)
}

/// `cudarc_only`: only the patterns with cudarc's allocations.
fn exporter(cudarc_only: bool) -> Result<(), Error> {
    let gpu = Gpu::get(0)?;
    // With cudarc's allocations the pool is the one installed as the device's current
    // pool (the importer must import that one).
    let pool = if cudarc_only { install_exportable_pool(0)? } else { ExportablePool::create(&gpu)? };
    let stream = Arc::new(Stream::new(&gpu)?);
    let pool_fd = pool.export()?;
    let (ours, theirs) = UnixStream::pair()?;
    // `dup` clears close-on-exec: the importer inherits both.
    let (pool_dup, sock_dup) = (nix::unistd::dup(&pool_fd)?, nix::unistd::dup(&theirs)?);
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args(["--importer", &pool_dup.as_raw_fd().to_string(), &sock_dup.as_raw_fd().to_string()])
        .spawn()?;
    drop((pool_dup, sock_dup, theirs));
    let mut lines: Lines = BufReader::new(ours.try_clone()?).lines();
    let mut out = ours;
    println!(
        "size          pattern               export   import   copy1    copy2    engine   free     (µs, median of {})",
        ITERATIONS - 1
    );
    let local = DevicePool::shared(0)?;
    let sizes: &[usize] = if cudarc_only { &[] } else { &SIZES };
    for &len in sizes {
        let ceiling = ceilings(&local, len, &stream)?;
        for pattern in PATTERNS {
            let alloc = || -> Result<DeviceBuffer, Error> {
                let b = pool.alloc(len, &stream)?;
                stream.synchronize()?;
                Ok(b)
            };
            let rows = measure(&gpu, &stream, pattern, len, alloc, &mut lines, &mut out)?;
            print_row(len, pattern, &rows, ceiling);
        }
    }
    if !cudarc_only {
        println!("(run with --cudarc-only for cudarc's allocations)");
        // Both halves of our socket must close for the importer to see the end: `lines`
        // holds a clone.
        out.shutdown(std::net::Shutdown::Both)?;
        child.wait()?;
        return Ok(());
    }
    writeln!(out, "install")?;
    let cudarc = cudarc_stream(0)?;
    for &len in &CUDARC_SIZES {
        let ceiling = ceilings(&local, len, &stream)?;
        for pattern in CUDARC_PATTERNS {
            let alloc = || -> Result<DeviceBuffer, Error> {
                if pattern == "fresh" || pattern == "twice" {
                    let b = pool.alloc(len, &stream)?;
                    stream.synchronize()?;
                    return Ok(b);
                }
                // SAFETY: the bytes are written by the importer before anything reads them.
                let slice = unsafe { cudarc.alloc::<u8>(len) }?;
                if pattern == "cudarc-sync" {
                    cudarc.synchronize()?;
                }
                Ok(from_cuda_slice(slice)?)
            };
            let rows = measure(&gpu, &stream, pattern, len, alloc, &mut lines, &mut out)?;
            print_row(len, pattern, &rows, ceiling);
        }
    }
    out.shutdown(std::net::Shutdown::Both)?;
    child.wait()?;
    Ok(())
}

type Lines = std::io::Lines<BufReader<UnixStream>>;

/// One pattern at one size: per iteration (export, import, copy1, copy2, engine, free) in µs.
fn measure(
    gpu: &Gpu,
    stream: &Stream,
    pattern: &str,
    len: usize,
    mut alloc: impl FnMut() -> Result<DeviceBuffer, Error>,
    lines: &mut Lines,
    out: &mut UnixStream,
) -> Result<Vec<[f64; 6]>, Error> {
    let mut rows = Vec::new();
    let mut held: Option<DeviceBuffer> = None;
    let mut next: Option<DeviceBuffer> = None;
    for _ in 0..ITERATIONS {
        if pattern == "reuse" {
            held = None;
            stream.synchronize()?;
        }
        let buf = match (pattern, held.take(), next.take()) {
            ("same" | "same-sync", Some(b), _) => b,
            (_, _, Some(b)) => b,
            _ => alloc()?,
        };
        let t = Instant::now();
        let data = export_pointer(gpu, buf.device_ptr())?;
        let export = micros(t);
        let hex: String = data.iter().map(|b| format!("{b:02x}")).collect();
        // "twice": the importer opens the allocation a second time after freeing the first
        // import, as the round trip does (the push into it, then the echo out of it);
        // "same-sync", "cudarc-importer-sync": it synchronises its device after freeing.
        writeln!(
            out,
            "{hex} {len} {} {}",
            pattern == "twice",
            matches!(pattern, "same-sync" | "cudarc-importer-sync")
        )?;
        if pattern == "alloc-during" {
            // The next allocation is made while the importer imports this one, as the
            // benchmark's server allocates its next receive buffer.
            next = Some(alloc()?);
        }
        let reply = lines.next().ok_or("the importer closed")??;
        let nums: Vec<f64> = reply.split(' ').map(str::parse).collect::<Result<_, _>>()?;
        let [import, copy1, copy2, engine, free] = nums[..] else {
            return Err(format!("bad reply {reply:?}").into());
        };
        rows.push([export, import, copy1, copy2, engine, free]);
        // The importer freed its import: the previous allocation may go now.
        held = Some(buf);
    }
    drop((held, next));
    stream.synchronize()?;
    Ok(rows)
}

fn print_row(len: usize, pattern: &str, rows: &[[f64; 6]], (kernel, engine): (f64, f64)) {
    let col = |i: usize| median(rows.iter().skip(1).map(|r| r[i]).collect());
    println!(
        "{len:>10} B  {pattern:<20}  {:<8.1} {:<8.1} {:<8.1} {:<8.1} {:<8.1} {:<8.1} local copy {kernel:.1} µs, engine {engine:.1} µs",
        col(0),
        col(1),
        col(2),
        col(3),
        col(4),
        col(5)
    );
}

fn importer(pool_fd: RawFd, sock_fd: RawFd) -> Result<(), Error> {
    let gpu = Gpu::get(0)?;
    let stream = Stream::new(&gpu)?;
    // SAFETY: the exporter passed this fd open (inherited); it stays open here.
    let pool = ImportedPool::import(&gpu, unsafe { BorrowedFd::borrow_raw(pool_fd) })?;
    // SAFETY: the exporter passed this socket open (inherited); nothing else owns it.
    let sock = UnixStream::from(unsafe { OwnedFd::from_raw_fd(sock_fd) });
    let mut out = sock.try_clone()?;
    let local = DevicePool::shared(0)?;
    let mut src: Option<DeviceBuffer> = None;
    for line in BufReader::new(sock).lines() {
        let line = line?;
        if line == "install" {
            install_exportable_pool(0)?;
            continue;
        }
        let mut fields = line.split(' ');
        let (hex, len) = (fields.next().ok_or("bad request")?, fields.next().ok_or("bad request")?);
        let twice = fields.next() == Some("true");
        let sync = fields.next() == Some("true");
        let len: usize = len.parse()?;
        let mut data = [0u8; 64];
        for (i, b) in data.iter_mut().enumerate() {
            *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2).ok_or("short export data")?, 16)?;
        }
        if src.as_ref().map(DeviceBuffer::len) != Some(len) {
            src = Some(local.alloc(len)?);
        }
        let src = src.as_ref().ok_or("no source")?;
        let t = Instant::now();
        let imported = pool.import_pointer(&data, len)?;
        let import = micros(t);
        let copy1 = timed_copy(imported.device_ptr(), src.device_ptr(), len, &stream, false)?;
        let copy2 = timed_copy(imported.device_ptr(), src.device_ptr(), len, &stream, false)?;
        let engine = timed_copy(imported.device_ptr(), src.device_ptr(), len, &stream, true)?;
        let t = Instant::now();
        drop(imported);
        let free = micros(t);
        if twice {
            let again = pool.import_pointer(&data, len)?;
            timed_copy(src.device_ptr(), again.device_ptr(), len, &stream, false)?;
        }
        if sync {
            gpu.synchronize()?;
        }
        writeln!(out, "{import} {copy1} {copy2} {engine} {free}")?;
    }
    Ok(())
}
