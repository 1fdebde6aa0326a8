//! GPU tests of the lingering copy kernel (`cuda::LingeringCopier`): ignored unless built
//! with `--features gpu-tests`, failing without a device.

use ferrylink_memory::cuda::{copy, DevicePool, DoneFlag, Gpu, LingeringCopier, LINGER_MAX_BYTES};
use ferrylink_memory::DeviceBuffer;
use ferrylink_testkit::{pattern, require_gpu};
use std::time::{Duration, Instant};

fn gpu() -> Gpu {
    require_gpu();
    Gpu::get(0).expect("device 0")
}

/// A source holding `pattern(len, seed)` and a destination of `len + 64` bytes of 0xEE.
fn buffers(pool: &DevicePool, len: usize, seed: u64) -> (DeviceBuffer, DeviceBuffer, Vec<u8>) {
    let data = pattern(len + 16, seed);
    let src = pool.alloc(len + 16).unwrap();
    src.copy_from_host(&data).unwrap();
    let dst = pool.alloc(len + 80).unwrap();
    dst.copy_from_host(&vec![0xEE; len + 80]).unwrap();
    (src, dst, data)
}

/// Posts `len` bytes from `src + s_off` to `dst + d_off`, signalling `flag`.
fn post(
    copier: &mut LingeringCopier,
    flag: &mut DoneFlag,
    (dst, d_off): (&DeviceBuffer, u64),
    (src, s_off): (&DeviceBuffer, u64),
    len: u64,
) -> bool {
    let entry = (dst.device_ptr() + d_off, src.device_ptr() + s_off, len);
    // SAFETY: both buffers outlive the flag's wait in every caller.
    flag.try_arm_for_kernel(|address, value| unsafe { copier.copy(entry, (address, value)) }).unwrap()
}

/// Waits for `flag`, recovering copies a leaving kernel did not take; fails after 10 s.
fn wait(copier: &mut LingeringCopier, flag: &DoneFlag) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut polls = 0u32;
    while !flag.is_set() {
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(32) {
            copier.recover().unwrap();
        }
        assert!(Instant::now() < deadline, "the lingering copy never signalled (counts {:?})", copier.counts());
        std::hint::spin_loop();
    }
}

/// What `dst` holds: `len + 64` bytes from `d_off`.
fn read_back(g: &Gpu, dst: &DeviceBuffer, d_off: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len + 64];
    // SAFETY: `dst` holds `len + 80` bytes, `d_off` ≤ 16; nothing is queued on it any
    // more (its copy's flag is set).
    unsafe { copy::memcpy_dtoh_sync(g, &mut out, dst.device_ptr() + d_off).unwrap() };
    out
}

fn check(g: &Gpu, (dst, d_off): (&DeviceBuffer, u64), data: &[u8], s_off: u64, len: usize) {
    let got = read_back(g, dst, d_off, len);
    let want = &data[s_off as usize..s_off as usize + len];
    assert!(got[..len] == *want, "{len} bytes ({d_off}/{s_off}): the copy differs");
    assert!(got[len..].iter().all(|&b| b == 0xEE), "{len} bytes ({d_off}/{s_off}): written past the end");
}

const SHAPES: [(u64, u64, u64); 10] = [
    (1, 0, 0),
    (8, 0, 0),
    (15, 3, 1),
    (16, 0, 0),
    (17, 16, 0),
    (64, 8, 0),
    (1000, 1, 7),
    (4095, 0, 16),
    (4096, 0, 0),
    (4096, 5, 3),
];

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn copies_of_every_shape_go_through_one_kernel_that_stays() {
    let g = gpu();
    let pool = DevicePool::shared(0).unwrap();
    let mut copier = LingeringCopier::new(&g, Duration::from_millis(500)).unwrap();
    let mut flag = DoneFlag::acquire(&g).unwrap();
    for round in 0..30u64 {
        for (i, &(len, d_off, s_off)) in SHAPES.iter().enumerate() {
            let (src, dst, data) = buffers(&pool, len as usize, round * 16 + i as u64);
            assert!(post(&mut copier, &mut flag, (&dst, d_off), (&src, s_off), len), "{len} bytes not taken");
            wait(&mut copier, &flag);
            check(&g, (&dst, d_off), &data, s_off, len as usize);
            assert!(copier.running(), "the kernel left within its idle time");
        }
    }
    let (posted, taken) = copier.counts();
    assert_eq!((posted, taken), (300, 300), "every copy went to the kernel");
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn copies_posted_as_the_kernel_leaves_are_done_anyway() {
    let g = gpu();
    let pool = DevicePool::shared(0).unwrap();
    // No idle time: the kernel leaves as soon as it finds nothing, so posts race its exit.
    let mut copier = LingeringCopier::new(&g, Duration::ZERO).unwrap();
    let mut posted = Vec::new();
    for i in 0..200u64 {
        let (len, d_off, s_off) = SHAPES[i as usize % SHAPES.len()];
        let (src, dst, data) = buffers(&pool, len as usize, 1000 + i);
        let mut flag = DoneFlag::acquire(&g).unwrap();
        if i % 7 == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
        assert!(post(&mut copier, &mut flag, (&dst, d_off), (&src, s_off), len));
        posted.push((flag, src, dst, data, (len, d_off, s_off)));
        if posted.len() == 40 {
            wait_and_check_all(&g, &mut copier, &mut posted);
        }
    }
    wait_and_check_all(&g, &mut copier, &mut posted);
}

/// A posted copy: its flag, its buffers, the bytes expected, and its shape.
type Posted = (DoneFlag, DeviceBuffer, DeviceBuffer, Vec<u8>, (u64, u64, u64));

/// Waits for every copy of `posted` and checks its bytes; `posted` is left empty.
fn wait_and_check_all(g: &Gpu, copier: &mut LingeringCopier, posted: &mut Vec<Posted>) {
    for (flag, _src, dst, data, (len, d_off, s_off)) in posted.drain(..) {
        wait(copier, &flag);
        check(g, (&dst, d_off), &data, s_off, len as usize);
    }
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn the_kernel_leaves_when_idle_comes_back_for_the_next_copy_and_stops_on_drop() {
    let g = gpu();
    let pool = DevicePool::shared(0).unwrap();
    let mut copier = LingeringCopier::new(&g, Duration::from_micros(200)).unwrap();
    let mut flag = DoneFlag::acquire(&g).unwrap();
    let (src, dst, data) = buffers(&pool, 64, 9);
    for _ in 0..3 {
        assert!(post(&mut copier, &mut flag, (&dst, 0), (&src, 0), 64));
        wait(&mut copier, &flag);
        check(&g, (&dst, 0), &data, 0, 64);
        std::thread::sleep(Duration::from_millis(20));
        assert!(!copier.running(), "still there 20 ms after its last copy, with 200 µs idle time");
        copier.stream().synchronize().unwrap();
    }
    // Refused: nothing, and more than one block takes.
    assert!(!post(&mut copier, &mut flag, (&dst, 0), (&src, 0), 0));
    let big = pool.alloc(2 * LINGER_MAX_BYTES as usize).unwrap();
    assert!(!post(&mut copier, &mut flag, (&big, 0), (&big, LINGER_MAX_BYTES), LINGER_MAX_BYTES + 1));
    // A kernel that would stay ten seconds leaves when the copier goes.
    let mut staying = LingeringCopier::new(&g, Duration::from_secs(10)).unwrap();
    assert!(post(&mut staying, &mut flag, (&dst, 0), (&src, 0), 64));
    wait(&mut staying, &flag);
    let started = Instant::now();
    drop(staying);
    assert!(started.elapsed() < Duration::from_secs(2), "dropping the copier waited for the idle time");
}
