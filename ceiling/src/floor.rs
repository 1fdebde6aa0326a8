//! Floors: the least time a host-completed round trip of n bytes can take on this machine,
//! measured in the same run as the round trips they judge.
//!
//! A round trip's second copy can start only once the first was seen done: the echo
//! depends on the first copy's bytes (decision 0033). The floor times exactly that, two
//! copies of n bytes one after the other, the host seeing each done before it starts the
//! next, and nothing else (no messages, no queues):
//!
//! - [`crate::host_handoff_floor`]: two `memcpy`s of n bytes, each made by one thread and
//!   seen done by the other (spinning on a flag) before it makes the next: between two
//!   processes the echo's copy is made by the side that received, so the host floor has
//!   two hand-offs between cores in it as well as the two copies (`handoff.rs`).
//! - [`device_copy_floor`]: on one device, two `cuMemcpyDtoDAsync` (the copy engine) or two
//!   launches of ferrylink's copy kernel, whichever is faster, each waited for by polling
//!   `cuStreamQuery` (as the transport waits) before the next is enqueued; between two
//!   devices, `cuMemcpyPeerAsync` each way, each waited for the same way. The device
//!   ceiling ([`crate::device_copy_roundtrip`]) enqueues both copies and waits once.

use crate::time_iters;
use crate::timing::TimedIterations;
use ferrylink_memory::cuda::{self, CudaError, DeviceAllocation, Gpu, Stream};

/// A floor: the time of the two copies a round trip needs, each seen done before the
/// next starts, over `n_iter` timed iterations (the record's `floor_time_us`,
/// `floor_n_iter`); [`TimedIterations::efficiency`] judges a round trip against it.
pub type Floor = TimedIterations;

/// Two device copies of `n` bytes, client device → server device and back, the host
/// seeing each done (polling `cuStreamQuery`) before it enqueues the next, `iters` times:
/// between two devices `cuMemcpyPeerAsync`; on one device the faster (by mean) of
/// `cuMemcpyDtoDAsync` and the copy kernel, both timed.
pub fn device_copy_floor(client_dev: usize, server_dev: usize, n: usize, iters: usize) -> Result<Floor, CudaError> {
    let (c, s) = (Gpu::get(client_dev)?, Gpu::get(server_dev)?);
    let a = DeviceAllocation::new(&c, n)?;
    let b = DeviceAllocation::new(&s, n)?;
    let stream = Stream::new(&c)?;
    if client_dev != server_dev {
        let times = time_iters(iters, || {
            // SAFETY: `a` and `b` are live allocations of n bytes on their devices; each
            // copy is seen done before the next is enqueued or the allocations drop.
            unsafe { cuda::copy::memcpy_peer_async(b.ptr(), &s, a.ptr(), &c, n, &stream)? };
            stream.wait_by_polling()?;
            // SAFETY: as above.
            unsafe { cuda::copy::memcpy_peer_async(a.ptr(), &c, b.ptr(), &s, n, &stream)? };
            stream.wait_by_polling()
        })?;
        let method = format!("cuMemcpyPeer {client_dev}→{server_dev}, seen done, then back, per round trip");
        return Ok(Floor::from_times(&times, method));
    }
    let engine = time_iters(iters, || {
        // SAFETY: as above, on one device.
        unsafe { cuda::copy::memcpy_dtod_async(b.ptr(), a.ptr(), n, &stream)? };
        stream.wait_by_polling()?;
        // SAFETY: as above.
        unsafe { cuda::copy::memcpy_dtod_async(a.ptr(), b.ptr(), n, &stream)? };
        stream.wait_by_polling()
    })?;
    let engine = Floor::from_times(
        &engine,
        format!("cuMemcpyDtoD on device {client_dev}, seen done, then back, per round trip"),
    );
    let kernel = time_iters(iters, || {
        // SAFETY: as above (allocations are 256-byte aligned).
        unsafe { cuda::copy_kernel::kernel_copy_async(b.ptr(), a.ptr(), n, &stream)? };
        stream.wait_by_polling()?;
        // SAFETY: as above.
        unsafe { cuda::copy_kernel::kernel_copy_async(a.ptr(), b.ptr(), n, &stream)? };
        stream.wait_by_polling()
    });
    Ok(match kernel {
        Ok(times) => {
            let kernel = Floor::from_times(
                &times,
                format!("copy kernel on device {client_dev}, seen done, then back, per round trip"),
            );
            faster(kernel, engine)
        }
        Err(e) => {
            tracing::warn!("the copy kernel's floor could not be measured: {e}");
            engine
        }
    })
}

/// The floor with the shorter mean time.
fn faster(a: Floor, b: Floor) -> Floor {
    if a.mean_seconds() < b.mean_seconds() {
        a
    } else {
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn micros(us: &[u64]) -> Vec<Duration> {
        us.iter().copied().map(Duration::from_micros).collect()
    }

    #[test]
    fn a_floor_keeps_its_total_mean_and_median() {
        let f = Floor::from_times(&micros(&[30, 10, 20, 40]), "two copies".into());
        assert_eq!(f.n_iter, 4);
        assert!((f.total_seconds - 100e-6).abs() < 1e-12, "{f:?}");
        assert!((f.mean_seconds() - 25e-6).abs() < 1e-12, "{f:?}");
        assert!((f.median_seconds - 25e-6).abs() < 1e-12, "{f:?}");
        let odd = Floor::from_times(&micros(&[30, 10, 20]), "two copies".into());
        assert!((odd.median_seconds - 20e-6).abs() < 1e-12, "{odd:?}");
        let empty = Floor::from_times(&[], "none".into());
        assert_eq!((empty.mean_seconds(), empty.median_seconds, empty.efficiency(1.0)), (0.0, 0.0, None));
    }

    #[test]
    fn efficiency_is_the_floor_over_the_round_trip() {
        let f = Floor::from_times(&micros(&[20, 20]), "two copies".into());
        assert!((f.efficiency(40e-6).unwrap() - 0.5).abs() < 1e-12);
        assert!((f.efficiency(20e-6).unwrap() - 1.0).abs() < 1e-12);
        assert_eq!(f.efficiency(0.0), None);
        assert_eq!(f.efficiency(f64::INFINITY), None);
    }

    #[test]
    fn the_faster_floor_wins() {
        let slow = Floor::from_times(&micros(&[30]), "engine".into());
        let fast = Floor::from_times(&micros(&[20]), "kernel".into());
        assert_eq!(faster(slow.clone(), fast.clone()).method, "kernel");
        assert_eq!(faster(fast, slow).method, "kernel");
    }

    #[test]
    #[cfg_attr(
        feature = "gpu-tests",
        ignore = "covers a machine without CUDA: the GPU build runs the device tests instead"
    )]
    fn device_floor_fails_cleanly_without_a_gpu() {
        if cuda::device_count() > 0 {
            return;
        }
        assert!(device_copy_floor(0, 0, 1024, 1).is_err());
    }

    #[test]
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device (--features gpu-tests)")]
    fn device_floor_times_both_copies_on_one_device() {
        let floor = device_copy_floor(0, 0, 1 << 20, 5).unwrap();
        assert_eq!(floor.n_iter, 5, "{floor:?}");
        assert!(floor.mean_seconds() > 0.0 && floor.median_seconds > 0.0, "{floor:?}");
        assert!(floor.method.contains("on device 0, seen done, then back"), "{}", floor.method);
    }
}
