//! `ferrylink-ceiling`: hardware ceilings measured in the same run as the benchmark they
//! judge, and the sizes and timing loop they share.
//!
//! The Rust benchmarks (`ferrylink-benchmarks`) and the Python one (through the extension
//! module) both judge their figures against these, so they live in a library of their own
//! that depends on the memory crate only: the Python wheel links none of the benchmark
//! binaries' command-line, plotting, progress-bar or histogram crates.
//!
//! Every benchmark prints its bandwidth next to the fastest the hardware did in the same
//! process, on the same sizes and iteration count, moments before: the ratio is the
//! **efficiency**. Each [`Ceiling`] keeps its total time and iteration count, which the
//! JSON record carries so that a reader can recompute it. What each ceiling times:
//!
//! - [`host_memcpy_roundtrip`]: `memcpy` of n bytes from buffer A to buffer B and back,
//!   both pre-touched. A round trip of n bytes through the native lane needs at least one
//!   copy of n bytes each way (copy-on-receive), so 2·n / (time of the two copies) is the
//!   round-trip equivalent of the benchmark's 2·n / t.
//! - [`device_copy_roundtrip`]: the same on the GPU, client device → server device and
//!   back: `cuMemcpyPeer` between two devices; on one device the faster of `cuMemcpyDtoD`
//!   (the copy engine) and ferrylink's copy kernel, both timed.
//! - [`pinned_copy`]: `cuMemcpyDtoH` / `cuMemcpyHtoD` of n bytes between device memory
//!   and pinned (page-locked, cached) host memory: n / t.
//! - [`disk_write`]: a write of n bytes to a new file in the directory the benchmark
//!   writes to, n / t, in the way of the spill store it judges: through the page cache
//!   without a sync ([`DiskWrite::Buffered`], the store without fsync), or `O_DIRECT`
//!   (n rounded up to 4 KiB) followed by `fdatasync` ([`DiskWrite::DirectSynced`], the
//!   store with fsync; where the file system refuses `O_DIRECT`, as tmpfs does, a buffered
//!   write and `fdatasync`, and the method says so).
//! - [`disk_read`]: a read of n bytes from a file in that directory into new memory, n / t,
//!   like unspill reading an entry written through the page cache that has since left it:
//!   the file's pages are dropped from the page cache before each read
//!   ([`drop_cached_pages`]), so the bytes come from the disk.
//!
//! Round trips are also judged against a **floor** ([`floor`]): the least time the two
//! copies a round trip needs take when the host sees each done before the next starts.

#![warn(missing_docs)]

pub mod disk;
pub mod floor;
mod handoff;
pub mod size;
pub mod timing;

pub use disk::{disk_read, disk_write, drop_cached_pages, DiskWrite};
pub use floor::{device_copy_floor, Floor};
pub use handoff::host_handoff_floor;

use ferrylink_memory::cuda::{self, CudaError, DeviceAllocation, Gpu, PinnedStaging, Stream};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// A ceiling: the best the hardware did, and how it was measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Ceiling {
    /// Bytes per second (Σbytes / Σt over the timed iterations).
    pub bytes_per_sec: f64,
    /// What was timed, for the table and the JSON record.
    pub method: String,
    /// Σt of the timed iterations in seconds (the record's `ceiling_time_us`, so a reader
    /// can recompute `bytes_per_sec`).
    pub total_seconds: f64,
    /// The timed iterations (the record's `ceiling_n_iter`).
    pub n_iter: usize,
}

impl Ceiling {
    /// Σbytes / Σt over `times`, as the benchmarks compute their own bandwidth.
    pub(crate) fn from_times(bytes_per_iter: f64, times: &[Duration], method: String) -> Self {
        let total_seconds: f64 = times.iter().map(Duration::as_secs_f64).sum();
        Ceiling {
            bytes_per_sec: if total_seconds > 0.0 { bytes_per_iter * times.len() as f64 / total_seconds } else { 0.0 },
            method,
            total_seconds,
            n_iter: times.len(),
        }
    }

    /// `bandwidth / ceiling` (a fraction), `None` when the ceiling is not positive.
    pub fn efficiency(&self, bandwidth: f64) -> Option<f64> {
        (self.bytes_per_sec > 0.0 && self.bytes_per_sec.is_finite()).then(|| bandwidth / self.bytes_per_sec)
    }
}

/// Times `op` once untimed, then `iters` times.
pub(crate) fn time_iters<E>(iters: usize, mut op: impl FnMut() -> Result<(), E>) -> Result<Vec<Duration>, E> {
    op()?;
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters.max(1) {
        let start = Instant::now();
        op()?;
        times.push(start.elapsed());
    }
    Ok(times)
}

/// `memcpy` of `n` bytes A → B then B → A between pre-touched buffers, `iters` times;
/// the round-trip equivalent 2·n / t (see the module documentation).
pub fn host_memcpy_roundtrip(n: usize, iters: usize) -> Ceiling {
    let mut a = vec![0x5au8; n];
    let mut b = vec![0xa5u8; n];
    let times = time_iters(iters, || {
        b.copy_from_slice(black_box(&a));
        a.copy_from_slice(black_box(&b));
        black_box((&a, &b));
        Ok::<(), std::convert::Infallible>(())
    })
    .unwrap_or_default();
    Ceiling::from_times(2.0 * n as f64, &times, "memcpy A→B + B→A (pre-touched), 2·n/t".into())
}

/// Raw device copies of `n` bytes client device → server device and back, `iters` times,
/// 2·n / t. Between two devices: `cuMemcpyPeer`. On one device: the faster of
/// `cuMemcpyDtoD` (copy engine) and the copy kernel the transport uses for frames up to
/// its kernel limit (`ferrylink_memory::cuda::copy_kernel`), each measured here: the
/// ceiling is the best raw copy this machine does, whichever engine the transport picks.
pub fn device_copy_roundtrip(
    client_dev: usize,
    server_dev: usize,
    n: usize,
    iters: usize,
) -> Result<Ceiling, CudaError> {
    let (c, s) = (Gpu::get(client_dev)?, Gpu::get(server_dev)?);
    let a = DeviceAllocation::new(&c, n)?;
    let b = DeviceAllocation::new(&s, n)?;
    let stream = Stream::new(&c)?;
    if client_dev != server_dev {
        let times = time_iters(iters, || {
            // SAFETY: `a` and `b` are live allocations of n bytes on their devices; the
            // stream is synchronised before they can drop.
            unsafe {
                cuda::copy::memcpy_peer_async(b.ptr(), &s, a.ptr(), &c, n, &stream)?;
                cuda::copy::memcpy_peer_async(a.ptr(), &c, b.ptr(), &s, n, &stream)?;
            }
            stream.synchronize()
        })?;
        let method = format!("cuMemcpyPeer {client_dev}→{server_dev} + {server_dev}→{client_dev}, 2·n/t");
        return Ok(Ceiling::from_times(2.0 * n as f64, &times, method));
    }
    let copy_engine = time_iters(iters, || {
        // SAFETY: as above.
        unsafe {
            cuda::copy::memcpy_dtod_async(b.ptr(), a.ptr(), n, &stream)?;
            cuda::copy::memcpy_dtod_async(a.ptr(), b.ptr(), n, &stream)?;
        }
        stream.synchronize()
    })?;
    let copy_engine = Ceiling::from_times(
        2.0 * n as f64,
        &copy_engine,
        format!("cuMemcpyDtoD on device {client_dev}, both ways, 2·n/t"),
    );
    let kernel = time_iters(iters, || {
        // SAFETY: as above (allocations are 256-byte aligned).
        unsafe {
            cuda::copy_kernel::kernel_copy_async(b.ptr(), a.ptr(), n, &stream)?;
            cuda::copy_kernel::kernel_copy_async(a.ptr(), b.ptr(), n, &stream)?;
        }
        stream.synchronize()
    });
    Ok(match kernel {
        Ok(times) => {
            let kernel = Ceiling::from_times(
                2.0 * n as f64,
                &times,
                format!("copy kernel on device {client_dev}, both ways, 2·n/t"),
            );
            if kernel.bytes_per_sec > copy_engine.bytes_per_sec {
                kernel
            } else {
                copy_engine
            }
        }
        Err(e) => {
            tracing::warn!("the copy kernel could not be measured: {e}");
            copy_engine
        }
    })
}

/// Which way a [`pinned_copy`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyDirection {
    /// Device → pinned host (`cuMemcpyDtoH`).
    DeviceToHost,
    /// Pinned host → device (`cuMemcpyHtoD`).
    HostToDevice,
}

/// Raw copies of `n` bytes between device memory and pinned host memory on `dev`,
/// `iters` times; n / t.
pub fn pinned_copy(dev: usize, n: usize, iters: usize, direction: CopyDirection) -> Result<Ceiling, CudaError> {
    let gpu = Gpu::get(dev)?;
    let d = DeviceAllocation::new(&gpu, n)?;
    let mut h = PinnedStaging::new(&gpu, n)?;
    h.as_mut_slice().fill(0x5a);
    let stream = Stream::new(&gpu)?;
    let host = h.as_mut_ptr();
    let times = time_iters(iters, || {
        // SAFETY: both buffers hold n bytes and live past the synchronisation below.
        unsafe {
            match direction {
                CopyDirection::DeviceToHost => cuda::copy::memcpy_dtoh_async(host, d.ptr(), n, &stream)?,
                CopyDirection::HostToDevice => cuda::copy::memcpy_htod_async(d.ptr(), host, n, &stream)?,
            }
        }
        stream.synchronize()
    })?;
    let method = match direction {
        CopyDirection::DeviceToHost => format!("cuMemcpyDtoH device {dev} → pinned host, n/t"),
        CopyDirection::HostToDevice => format!("cuMemcpyHtoD pinned host → device {dev}, n/t"),
    };
    Ok(Ceiling::from_times(n as f64, &times, method))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_memcpy_measures_something() {
        let c = host_memcpy_roundtrip(1 << 20, 3);
        assert!(c.bytes_per_sec > 0.0 && c.bytes_per_sec.is_finite());
        assert!(c.method.contains("memcpy"));
        assert_eq!(c.efficiency(c.bytes_per_sec / 2.0), Some(0.5));
    }

    #[test]
    #[cfg_attr(
        feature = "gpu-tests",
        ignore = "covers a machine without CUDA: the GPU build runs the device tests instead"
    )]
    fn device_ceilings_fail_cleanly_without_a_gpu() {
        if cuda::device_count() > 0 {
            return;
        }
        assert!(device_copy_roundtrip(0, 0, 1024, 1).is_err());
        assert!(pinned_copy(0, 1024, 1, CopyDirection::DeviceToHost).is_err());
    }
}
