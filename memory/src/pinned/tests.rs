//! The pool's logic over plain (unregistered) memory: runs everywhere.

use super::*;

const CHUNK: usize = 64 << 10;

fn pool(chunks: usize, max_chunks: usize) -> PinnedPool {
    PinnedPool::new(PinnedPoolConfig {
        chunk_size: CHUNK,
        region_size: chunks * CHUNK,
        initial_regions: 1,
        max_bytes: max_chunks * CHUNK,
        registration: Registration::Never,
        hugepages: true,
        touch_threads: 2,
    })
    .unwrap()
}

#[test]
fn small_allocations_take_one_chunk_and_are_reused() {
    let p = pool(4, 4);
    let mut a = p.alloc(10).unwrap();
    assert_eq!(a.len(), 10);
    a.as_mut_slice().copy_from_slice(b"0123456789");
    let (region, off) = a.region().map(|(r, o)| (r.region_id(), o)).unwrap();
    assert_eq!(off, 0);
    assert!(region & REGION_ID_TAG != 0);
    assert!(!a.is_pinned());
    assert_eq!(p.stats().bytes_in_use, CHUNK);
    drop(a);
    assert_eq!(p.stats().bytes_in_use, 0);
    let b = p.alloc(CHUNK).unwrap();
    assert_eq!(b.region().unwrap().1, 0, "freed chunk is reused first");
    let s = p.stats();
    assert_eq!((s.allocations, s.failures, s.high_water, s.regions), (2, 0, CHUNK, 1));
}

#[test]
fn large_frames_span_contiguous_chunks() {
    let p = pool(8, 8);
    let _a = p.alloc(1).unwrap();
    let mut big = p.alloc(3 * CHUNK + 1).unwrap();
    assert_eq!(big.region().unwrap().1, CHUNK);
    assert_eq!(p.stats().bytes_in_use, 5 * CHUNK);
    for (i, b) in big.as_mut_slice().iter_mut().enumerate() {
        *b = i as u8;
    }
    assert!(big.as_slice().iter().enumerate().all(|(i, &b)| b == i as u8));
    drop(big);
    assert_eq!(p.stats().bytes_in_use, CHUNK);
}

#[test]
fn exhaustion_is_a_clear_error_and_counts() {
    let p = pool(4, 4);
    let a = p.alloc(2 * CHUNK).unwrap();
    let _b = p.alloc(CHUNK).unwrap();
    let e = p.alloc(2 * CHUNK).unwrap_err();
    assert!(matches!(e, PoolError::Exhausted { requested, .. } if requested == 2 * CHUNK));
    assert!(e.to_string().contains("exhausted"));
    assert_eq!(p.stats().failures, 1);
    drop(a);
    assert!(p.alloc(2 * CHUNK).is_ok());
}

#[test]
fn fragmentation_needs_a_contiguous_run() {
    let p = pool(4, 4);
    let a = p.alloc(1).unwrap();
    let b = p.alloc(1).unwrap();
    let c = p.alloc(1).unwrap();
    drop(b);
    drop(a);
    assert!(matches!(p.alloc(3 * CHUNK), Err(PoolError::Exhausted { .. })));
    let ab = p.alloc(2 * CHUNK).unwrap();
    assert_eq!(ab.region().unwrap().1, 0);
    drop(c);
}

#[test]
fn grows_up_to_the_limit_including_oversize_regions() {
    let p = pool(2, 8);
    let _a = p.alloc(2 * CHUNK).unwrap();
    let _b = p.alloc(CHUNK).unwrap(); // second region of 2 chunks
    assert_eq!(p.stats().regions, 2);
    let _big = p.alloc(4 * CHUNK).unwrap(); // oversize region of 4 chunks
    let s = p.stats();
    assert_eq!((s.regions, s.bytes_reserved), (3, 8 * CHUNK));
    assert!(p.alloc(2 * CHUNK).is_err());
}

#[test]
fn buffers_outlive_the_pool() {
    let p = pool(2, 2);
    let mut a = p.alloc(100).unwrap();
    drop(p);
    a.as_mut_slice().fill(7);
    assert!(a.as_slice().iter().all(|&x| x == 7));
}

#[test]
fn concurrent_allocations_are_disjoint() {
    let p = pool(64, 64);
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let p = p.clone();
            s.spawn(move || {
                for _ in 0..50 {
                    let mut b = p.alloc(CHUNK + 5).unwrap();
                    b.as_mut_slice().fill(t);
                    std::thread::yield_now();
                    assert!(b.as_slice().iter().all(|&x| x == t));
                }
            });
        }
    });
    assert_eq!(p.stats().bytes_in_use, 0);
    assert_eq!(p.stats().allocations, 200);
}

#[test]
fn invalid_configs_are_refused() {
    let cfg = PinnedPoolConfig::default().with_chunk_size(0);
    assert!(matches!(PinnedPool::new(cfg), Err(PoolError::InvalidConfig(_))));
    let cfg = PinnedPoolConfig::default().with_region_size(1 << 20).with_max_bytes(1);
    assert!(matches!(PinnedPool::new(cfg), Err(PoolError::InvalidConfig(_))));
}

#[test]
fn auto_registration_pins_when_cuda_is_present() {
    let p = PinnedPool::with_capacity(1 << 20).unwrap();
    assert_eq!(p.is_pinned(), crate::cuda::probe().is_ok());
    let b = p.alloc(10).unwrap();
    assert_eq!(b.is_pinned(), p.is_pinned());
}

#[test]
fn sizes_that_overflow_are_errors_not_panics() {
    let p = pool(2, 2);
    for len in [usize::MAX, usize::MAX - CHUNK + 2] {
        assert!(matches!(p.alloc(len), Err(PoolError::Exhausted { requested, .. }) if requested == len));
    }
    assert_eq!(p.stats().failures, 2);
    // A pool allowed to grow without bound: the growth sum must not overflow either.
    let growing = PinnedPool::new(
        PinnedPoolConfig::default()
            .with_chunk_size(CHUNK)
            .with_region_size(CHUNK)
            .with_max_bytes(usize::MAX)
            .with_registration(Registration::Never)
            .with_touch_threads(1),
    )
    .unwrap();
    // Whole chunks fit in a usize, the reservation after growing would not.
    assert!(matches!(growing.alloc(usize::MAX - CHUNK + 1), Err(PoolError::Exhausted { .. })));
    for cfg in [
        PinnedPoolConfig::default().with_chunk_size(usize::MAX),
        PinnedPoolConfig::default().with_chunk_size(4096).with_region_size(usize::MAX),
    ] {
        assert!(matches!(PinnedPool::new(cfg), Err(PoolError::InvalidConfig(_))));
    }
}
