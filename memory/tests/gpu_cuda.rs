//! GPU tests of the CUDA layer: ignored unless built with `--features gpu-tests`, failing
//! without a device.

use ferrylink_memory::cuda::{
    self, bounce_to_exportable, copy, from_cuda_slice, is_ipc_exportable, pointer_info, DevicePool, Event, EventPool,
    Gpu, PinnedStaging, PoolConfig, Stream,
};
use ferrylink_testkit::{pattern, require_gpu};

mod versioned;

/// Device 0; the test fails without a CUDA device (the kit's `require_gpu`).
fn gpu() -> Gpu {
    require_gpu();
    Gpu::get(0).expect("device 0")
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn device_lookup_and_binding() {
    let g = gpu();
    println!("device 0: {g:?}");
    assert_eq!(Gpu::by_uuid(g.uuid()).unwrap(), g);
    assert!(Gpu::by_uuid(&[0xee; 16]).is_err());
    assert!(cuda::can_access_peer(&g, &g).unwrap());
    cuda::enable_peer_access(&g, &g).unwrap();
    for other in Gpu::all().unwrap() {
        if other != g {
            let can = cuda::can_access_peer(&g, &other).unwrap();
            println!("peer access 0 -> {}: {can}", other.ordinal());
            if can {
                cuda::enable_peer_access(&g, &other).unwrap();
                cuda::enable_peer_access(&g, &other).unwrap();
            }
        }
    }
    // A fresh thread has no context bound; every entry point binds it.
    let pool = DevicePool::new(&g, PoolConfig::default()).unwrap();
    std::thread::spawn(move || {
        let b = pool.alloc(4096).unwrap();
        b.fill(7).unwrap();
        assert!(b.to_vec().unwrap().iter().all(|&x| x == 7));
        let g = pool.gpu().clone();
        g.bind_to_current_thread().unwrap();
        g.ensure_current().unwrap();
        let (free, total) = g.mem_info().unwrap();
        assert!(free <= total && total > 0);
    })
    .join()
    .unwrap();
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn pool_alloc_free_reuse_stats() {
    let g = gpu();
    let pool = DevicePool::new(&g, PoolConfig::default().with_slab_size(1 << 20).with_alignment(512)).unwrap();
    assert_eq!(pool.stats().slabs, 0);
    let a = pool.alloc(1000).unwrap();
    let b = pool.alloc(1).unwrap();
    let s = pool.stats();
    assert_eq!((s.slabs, s.bytes_reserved, s.bytes_in_use, s.allocations), (1, 1 << 20, 1536, 2));
    assert_eq!(a.device_ptr() % 512, 0);
    assert_eq!(b.device_ptr(), a.device_ptr() + 1024);
    let a_ptr = a.device_ptr();
    drop(a);
    let c = pool.alloc(900).unwrap();
    assert_eq!(c.device_ptr(), a_ptr, "freed range reused first-fit");
    let big = pool.alloc(3 << 20).unwrap();
    let s = pool.stats();
    assert_eq!(s.slabs, 2);
    assert_eq!(s.bytes_reserved, (1 << 20) + (4 << 20));
    let zero = pool.alloc(0).unwrap();
    assert!(zero.is_empty());
    drop((b, c, big, zero));
    let s = pool.stats();
    assert_eq!((s.allocations, s.bytes_in_use, s.allocations_total), (0, 0, 5));
    assert_eq!(pool.trim(), 5 << 20);
    assert_eq!(pool.stats().slabs, 0);
    // Many buffers in one slab share one allocation base: one IPC handle serves them all.
    let bufs: Vec<_> = (0..64).map(|_| pool.alloc(4096).unwrap()).collect();
    let base = pointer_info(&g, bufs[0].device_ptr()).unwrap().base;
    for b in &bufs {
        let info = pointer_info(&g, b.device_ptr()).unwrap();
        assert_eq!(info.base, base);
        assert!(info.legacy_ipc_capable);
    }
    assert_eq!(pool.stats().slabs, 1);
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn copies_round_trip() {
    let g = gpu();
    let pool = DevicePool::shared(0).unwrap();
    let n = (1 << 20) + 3;
    let data = pattern(n, 9);
    let a = pool.alloc(n).unwrap();
    a.copy_from_host(&data).unwrap();
    assert_eq!(a.to_vec().unwrap(), data);

    let stream = Stream::new(&g).unwrap();
    let b = pool.alloc(n).unwrap();
    let mut pinned = PinnedStaging::new(&g, n).unwrap();
    // SAFETY: all buffers outlive the synchronisation below.
    unsafe {
        copy::memcpy_dtod_async(b.device_ptr(), a.device_ptr(), n, &stream).unwrap();
        copy::memset_d8_async(b.device_ptr(), 0xAB, 16, &stream).unwrap();
        copy::memcpy_dtoh_async(pinned.as_mut_ptr(), b.device_ptr(), n, &stream).unwrap();
    }
    stream.synchronize().unwrap();
    assert!(stream.query().unwrap());
    assert!(pinned.as_slice()[..16].iter().all(|&x| x == 0xAB));
    assert_eq!(&pinned.as_slice()[16..], &data[16..]);

    pinned.as_mut_slice().fill(0x5C);
    // SAFETY: as above.
    unsafe { copy::memcpy_htod_async(a.device_ptr(), pinned.as_ptr(), n, &stream).unwrap() };
    let ev = Event::new(&g).unwrap();
    ev.record(&stream).unwrap();
    ev.synchronize().unwrap();
    assert!(ev.query().unwrap());
    assert!(a.to_vec().unwrap().iter().all(|&x| x == 0x5C));

    // Peer copy path with the same device on both sides.
    // SAFETY: as above.
    unsafe { copy::memcpy_peer_async(b.device_ptr(), &g, a.device_ptr(), &g, n, &stream).unwrap() };
    stream.synchronize().unwrap();
    assert!(b.to_vec().unwrap().iter().all(|&x| x == 0x5C));
    assert!(a.copy_from_host(&vec![0; n + 1]).is_err());
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn exportability_and_bounce() {
    let g = gpu();
    let pool = DevicePool::shared(0).unwrap();
    let mine = pool.alloc(12345).unwrap();
    assert!(is_ipc_exportable(&mine).unwrap(), "pool memory must be exportable");
    let info = pointer_info(&g, mine.device_ptr()).unwrap();
    assert!(info.base <= mine.device_ptr());
    assert!(mine.device_ptr() + 12345 <= info.base + info.alloc_len as u64);
    assert_ne!(info.buffer_id, 0);
    assert_eq!(info.device_ordinal, 0);
    // The pool recorded what the driver says about the slab, so exports need not ask.
    assert_eq!(
        mine.owner().allocation().map(|a| (a.base, a.len, a.buffer_id)),
        Some((info.base, info.alloc_len, info.buffer_id))
    );
    assert_eq!(cuda::known_buffer_info(&mine).unwrap(), info);

    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    let cstream = ctx.new_stream().unwrap();
    let n = 3 << 20;
    let data = pattern(n, 3);
    let mut slice = cstream.alloc_zeros::<u8>(n).unwrap();
    cstream.memcpy_htod(&data, &mut slice).unwrap();
    let foreign = from_cuda_slice(slice).unwrap();
    assert_eq!(foreign.len(), n);
    assert!(foreign.owner().allocation().is_none(), "foreign memory is asked about, not assumed");
    assert_eq!(cuda::known_buffer_info(&foreign).unwrap(), pointer_info(&g, foreign.device_ptr()).unwrap());
    let exportable = is_ipc_exportable(&foreign).unwrap();
    println!("cudarc alloc_zeros memory exportable: {exportable} (has async alloc: {})", ctx.has_async_alloc());
    assert_eq!(foreign.to_vec().unwrap(), data);
    let stream = Stream::new(&g).unwrap();
    let bounced = bounce_to_exportable(&foreign, &pool, &stream).unwrap();
    drop(foreign); // cudarc frees its slice
    assert!(is_ipc_exportable(&bounced).unwrap());
    assert_eq!(bounced.to_vec().unwrap(), data);
    let kept = cuda::ensure_exportable(bounced, &pool, &stream).unwrap();
    assert_eq!(kept.len(), n);

    // A raw pointer with a guard: the guard drops with the buffer.
    let alloc = cuda::DeviceAllocation::new(&g, 4096).unwrap();
    let ptr = alloc.ptr();
    // SAFETY: the guard owns the allocation for the buffer's whole life.
    let raw = unsafe { cuda::from_raw_device_memory(ptr, 4096, 0, Box::new(alloc)) };
    assert!(is_ipc_exportable(&raw).unwrap());
    raw.fill(1).unwrap();
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn interprocess_events_and_handles() {
    let g = gpu();
    let pool = EventPool::new(&g, 4);
    let stream = Stream::new(&g).unwrap();
    let handle = {
        let ev = pool.acquire().unwrap();
        ev.record(&stream).unwrap();
        ev.synchronize().unwrap();
        assert_ne!(ev.handle(), [0; 64]);
        ev.handle()
    };
    assert_eq!(pool.idle(), 1);
    let again = pool.acquire().unwrap();
    assert_eq!(again.handle(), handle, "pooled event reused");
    assert_eq!(pool.idle(), 0);

    // Legacy IPC memory handles: fetched on a pool slab; opening one in the exporting
    // process is refused by CUDA (cross-process tests live in ferrylink-ipc).
    let buf = DevicePool::shared(0).unwrap().alloc(1 << 20).unwrap();
    let info = pointer_info(&g, buf.device_ptr()).unwrap();
    let h = cuda::ipc::get_mem_handle(&g, info.base).unwrap();
    assert_ne!(h, [0; 64]);
    match cuda::ipc::open_mem_handle(&g, &h) {
        Err(e) => println!("opening our own handle is refused: {e}"),
        Ok(p) => {
            println!("opening our own handle gave {p:#x}; closing it");
            // SAFETY: just opened, unused.
            unsafe { cuda::ipc::close_mem_handle(&g, p).unwrap() };
        }
    }
    // Opening an event in its own process is refused too, or gives a usable event.
    match Event::open_ipc(&g, &handle) {
        Ok(ev) => assert!(ev.is_imported()),
        Err(e) => println!("opening our own event handle: {e}"),
    }
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn the_copy_kernel_copies_every_size_exactly_and_touches_nothing_else() {
    use cuda::copy_kernel::{copy_dtod_async, kernel_copy_async, CopyEngine};
    let g = gpu();
    let pool = DevicePool::shared(0).unwrap();
    let stream = Stream::new(&g).unwrap();
    // Sizes around the 16-byte vector and the tail, a grid-stride case (more vectors
    // than threads launched), and an odd size.
    for &n in &[1usize, 15, 16, 17, 31, 4096 + 3, 1 << 20, (40 << 20) + 7] {
        let data = pattern(n, (n % 251) as u64);
        let src = pool.alloc(n).unwrap();
        src.copy_from_host(&data).unwrap();
        // One guard byte after the destination must stay as it is.
        let dst = pool.alloc(n + 512).unwrap();
        dst.copy_from_host(&vec![0xEEu8; n + 512]).unwrap();
        // SAFETY: both buffers outlive the synchronisation below; pool buffers are
        // 512-byte aligned.
        unsafe { kernel_copy_async(dst.device_ptr(), src.device_ptr(), n, &stream).unwrap() };
        stream.synchronize().unwrap();
        let got = dst.to_vec().unwrap();
        assert!(got[..n] == data[..], "{n} bytes: the kernel's copy differs");
        assert!(got[n..].iter().all(|&b| b == 0xEE), "{n} bytes: the kernel wrote past the end");
    }
    // The picker: aligned and small → kernel; misaligned → copy engine; both exact.
    let n = 100_000;
    let data = pattern(n + 16, 3);
    let src = pool.alloc(n + 16).unwrap();
    src.copy_from_host(&data).unwrap();
    let dst = pool.alloc(n + 16).unwrap();
    // SAFETY: as above.
    let (aligned, misaligned) = unsafe {
        let a = copy_dtod_async(dst.device_ptr(), src.device_ptr(), n, &stream).unwrap();
        stream.synchronize().unwrap();
        assert!(dst.to_vec().unwrap()[..n] == data[..n]);
        let m = copy_dtod_async(dst.device_ptr() + 1, src.device_ptr() + 3, n, &stream).unwrap();
        stream.synchronize().unwrap();
        (a, m)
    };
    assert_eq!(aligned, CopyEngine::Kernel);
    assert_eq!(misaligned, CopyEngine::CopyEngine);
    assert!(dst.to_vec().unwrap()[1..n + 1] == data[3..n + 3]);
    // SAFETY: misaligned addresses are refused before anything is enqueued.
    assert!(unsafe { kernel_copy_async(dst.device_ptr() + 1, src.device_ptr(), 64, &stream) }.is_err());
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn a_context_guard_gives_the_thread_its_context_back() {
    use cudarc::driver::sys;
    let g = gpu();
    let current = || {
        let mut c: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one handle; the driver is loaded (a Gpu exists).
        assert_eq!(unsafe { sys::cuCtxGetCurrent(&mut c) }, sys::CUresult::CUDA_SUCCESS);
        c
    };
    std::thread::spawn(move || {
        // A fresh thread has no current context; code under a guard binds the primary
        // one, which stays (as the runtime would leave it).
        assert!(current().is_null());
        {
            let _guard = cuda::CurrentContextGuard::save().unwrap();
            g.bind_to_current_thread().unwrap();
            assert!(!current().is_null());
        }
        let primary = current();
        assert!(!primary.is_null());
        // A thread with a context of its own gets it back.
        let mut own: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: creates one context on the device, destroyed below; it becomes current.
        assert_eq!(unsafe { versioned::create_context(&mut own, g.raw_device()) }, sys::CUresult::CUDA_SUCCESS);
        assert_eq!(current(), own);
        {
            let _guard = cuda::CurrentContextGuard::save().unwrap();
            g.bind_to_current_thread().unwrap();
            assert_eq!(current(), primary);
        }
        assert_eq!(current(), own, "the guard did not give the thread its own context back");
        // SAFETY: `own` was created above and nothing uses it any more.
        assert_eq!(unsafe { sys::cuCtxDestroy_v2(own) }, sys::CUresult::CUDA_SUCCESS);
    })
    .join()
    .unwrap();
}

/// (dst offset, src offset, len) of a span kernel batch over buffers of `n` bytes:
/// aligned and not, empty entries among them (left out of the kernel's table, so its
/// count must be of the others), `count` blocks of 1000 B in reverse order from `skew`.
fn span_batch(n: usize, count: usize, skew: usize) -> Vec<(usize, usize, usize)> {
    // A long aligned entry (18,750 vectors and a 7-byte tail: 74 steps of a block's
    // threads where the table is read in place, one block per entry) below the `count`
    // 1000-byte ones.
    let mut spans: Vec<(usize, usize, usize)> =
        vec![(0, 4096, 100), (200, 0, 0), (1000, 2001, 5000), (65_536, 131_072, 300_007)];
    spans.extend((0..count).map(|i| (n - (i + 1) * 1024, i * 1000 + skew, 1000)));
    spans.push((50_000, 10, 0));
    spans
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn the_span_kernel_copies_each_entry_skips_empty_ones_and_touches_nothing_else() {
    use cuda::span_kernel::copy_spans_async;
    let g = gpu();
    let pool = DevicePool::shared(0).unwrap();
    let stream = Stream::new(&g).unwrap();
    let n = 4 << 20;
    let data = pattern(n, 11);
    let src = pool.alloc(n).unwrap();
    src.copy_from_host(&data).unwrap();
    // Rounds: one batch; two in flight at once (two pinned tables, the second larger
    // than the spare the first left); one more reusing a spare table; one listed into a
    // batch made for 2 entries, which grows its table as they come.
    let rounds = [vec![(300, 7)], vec![(3000, 3), (1000, 5)], vec![(300, 9)], vec![(3500, 1)]];
    for (round, batches) in rounds.into_iter().enumerate() {
        let mut launched = Vec::new();
        for (count, skew) in batches {
            let dst = pool.alloc(n).unwrap();
            dst.copy_from_host(&vec![0xEEu8; n]).unwrap();
            let spans = span_batch(n, count, skew);
            let triples: Vec<(u64, u64, u64)> = spans
                .iter()
                .map(|&(d, s, l)| (dst.device_ptr() + d as u64, src.device_ptr() + s as u64, l as u64))
                .collect();
            let table = if round == 3 {
                let mut batch = cuda::span_kernel::SpanBatch::with_capacity(&g, 2);
                for &(d, s, l) in &triples {
                    batch.push(d, s, l);
                }
                assert_eq!(batch.len(), 3500 + 3, "empty entries are left out");
                // The first error stops a listing; the entries before it stay.
                let (d, s, _) = triples[0];
                let stopped = batch.push_all(3, |i| if i == 1 { Err("stop") } else { Ok((d, s, 0)) });
                assert_eq!((stopped, batch.len()), (Err("stop"), 3500 + 3), "empty entries before the error");
                // SAFETY: every range lies in the two buffers, which outlive the
                // synchronisation; the destinations do not overlap each other or the source.
                unsafe { batch.launch(&stream).unwrap() }
            } else {
                // SAFETY: as above.
                unsafe { copy_spans_async(&triples, &stream).unwrap() }
            };
            launched.push((dst, spans, table));
        }
        stream.synchronize().unwrap();
        for (dst, spans, table) in launched {
            drop(table);
            let mut want = vec![0xEEu8; n];
            for &(d, s, l) in &spans {
                want[d..d + l].copy_from_slice(&data[s..s + l]);
            }
            let got = dst.to_vec().unwrap();
            let wrong = got.iter().zip(&want).filter(|(a, b)| a != b).count();
            assert_eq!(wrong, 0, "round {round}: {wrong} bytes differ from the spans' copies (untouched stay 0xEE)");
        }
    }
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn a_kept_span_table_copies_anew_at_every_launch_and_outlives_its_batch() {
    use cuda::span_kernel::{kernel_available, launch_listed, SpanBatch};
    let g = gpu();
    assert!(kernel_available(&g), "the span kernel's PTX loads");
    let pool = DevicePool::shared(0).unwrap();
    let stream = Stream::new(&g).unwrap();
    let n = 4 << 20;
    let (src, dst) = (pool.alloc(n).unwrap(), pool.alloc(n).unwrap());
    // 1003 entries and two empty ones (the kernel, short spans and a long one); 16 spans
    // of 64 KiB and more, shared by a row of 9 blocks each, aligned or not at either end,
    // with byte tails of 0 to 15; one entry (a plain copy).
    let long: Vec<(usize, usize, usize)> =
        (0..16).map(|i| (i * 70_016 + i % 3, i * 66_000 + i % 5, 65_536 + 48 + i)).collect();
    // 19,999 entries of 16 B and one of 300,007 B: the wide kernel (the longest fills its
    // blocks) in rows of 3 blocks (the grid's block limit), so the long entry's threads
    // loop over their vectors four at a time, the last step partial, then its byte tail.
    let mut many: Vec<(usize, usize, usize)> = (0..19_999).map(|i| (i * 32, i * 16 + 16, 16)).collect();
    many.push((1 << 20, 2 << 20, 300_007));
    for (spans, count) in [(span_batch(n, 1000, 3), 1003), (long, 16), (many, 20_000), (vec![(8192, 64, 5000)], 1)] {
        let mut batch = SpanBatch::with_capacity(&g, spans.len());
        for &(d, s, l) in &spans {
            batch.push(dst.device_ptr() + d as u64, src.device_ptr() + s as u64, l as u64);
        }
        let kept = batch.keep().unwrap();
        assert_eq!(kept.len(), count, "empty entries are left out");
        // Two launches in flight on one table, then one more after the first tables went:
        // each copies what the source holds when it runs.
        // Rounds 2 and 3 wait only for a completion flag recorded after the launch (round
        // 3 reuses it).
        let mut flag = cuda::DoneFlag::acquire(&g).unwrap();
        for (round, seeds) in [vec![21, 22], vec![23], vec![24]].into_iter().enumerate() {
            let mut tables = Vec::new();
            let mut last = Vec::new();
            for seed in seeds {
                last = pattern(n, seed);
                src.copy_from_host(&last).unwrap();
                dst.copy_from_host(&vec![0xEEu8; n]).unwrap();
                // SAFETY: every range lies in the two buffers, which outlive the waits
                // below; destinations do not overlap each other or the source;
                // `copy_from_host` synchronises, so each launch reads this seed.
                tables.push(unsafe { launch_listed(&kept, &stream).unwrap() });
                if round > 0 {
                    flag.record(&stream).unwrap();
                    flag.wait();
                } else {
                    stream.synchronize().unwrap();
                }
            }
            let mut want = vec![0xEEu8; n];
            for &(d, s, l) in &spans {
                want[d..d + l].copy_from_slice(&last[s..s + l]);
            }
            let wrong = dst.to_vec().unwrap().iter().zip(&want).filter(|(a, b)| a != b).count();
            assert_eq!(wrong, 0, "{count} entries, round {round}: {wrong} bytes differ");
            stream.synchronize().unwrap();
            drop(tables);
        }
    }
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn a_done_flag_is_set_after_the_work_before_it_and_words_are_reused_with_their_next_value() {
    use cuda::DoneFlag;
    let g = gpu();
    let pool = DevicePool::shared(0).unwrap();
    let n = 64 << 20;
    let (a, b) = (pool.alloc(n).unwrap(), pool.alloc(n).unwrap());
    let stream = Stream::new(&g).unwrap();
    // Reads back on a stream not ordered after `stream`: only the flag orders them.
    let other = Stream::new(&g).unwrap();
    for round in 0..3u8 {
        a.fill(round + 1).unwrap();
        // SAFETY: both buffers outlive the flag's wait below.
        unsafe { copy::memcpy_dtod_async(b.device_ptr(), a.device_ptr(), n, &stream).unwrap() };
        let mut flag = DoneFlag::acquire(&g).unwrap();
        flag.record(&stream).unwrap();
        flag.wait();
        assert!(flag.is_set());
        // The flag says the copy is done: its last bytes are there for another stream.
        let mut pinned = PinnedStaging::new(&g, 4096).unwrap();
        // SAFETY: `pinned` outlives the copy (synchronised just after).
        unsafe { copy::memcpy_dtoh_async(pinned.as_mut_ptr(), b.device_ptr() + (n - 4096) as u64, 4096, &other) }
            .unwrap();
        other.synchronize().unwrap();
        assert!(pinned.as_slice().iter().all(|&x| x == round + 1), "round {round}");
        // The same flag again: the next value, set only after its own record.
        flag.record(&stream).unwrap();
        flag.wait();
    }
    // More flags than one page holds, all armed at once.
    let mut flags: Vec<DoneFlag> = (0..1500).map(|_| DoneFlag::acquire(&g).unwrap()).collect();
    for f in &mut flags {
        f.record(&stream).unwrap();
    }
    stream.synchronize().unwrap();
    assert!(flags.iter().all(DoneFlag::is_set));
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn a_signalled_copy_sets_its_flag_after_its_bytes_and_the_work_before_it() {
    use cuda::copy_kernel::{kernel_copy_signalled, SIGNALLED_MAX_BYTES};
    use cuda::DoneFlag;
    let g = gpu();
    let pool = DevicePool::shared(0).unwrap();
    let stream = Stream::new(&g).unwrap();
    let other = Stream::new(&g).unwrap();
    let mut flag = DoneFlag::acquire(&g).unwrap();
    // A long copy queued first: the flag must wait for it too.
    let big = 64 << 20;
    let (a, b) = (pool.alloc(big).unwrap(), pool.alloc(big).unwrap());
    for (round, &n) in [1usize, 8, 15, 16, 17, 4095, SIGNALLED_MAX_BYTES].iter().enumerate() {
        let data = pattern(n, round as u64 + 7);
        let src = pool.alloc(n).unwrap();
        src.copy_from_host(&data).unwrap();
        let dst = pool.alloc(n + 512).unwrap();
        dst.copy_from_host(&vec![0xEEu8; n + 512]).unwrap();
        a.fill(round as u8 + 1).unwrap();
        // SAFETY: every buffer outlives the flag's wait below (and the synchronisation).
        let signalled = unsafe {
            copy::memcpy_dtod_async(b.device_ptr(), a.device_ptr(), big, &stream).unwrap();
            kernel_copy_signalled(dst.device_ptr(), src.device_ptr(), n, &stream, &mut flag).unwrap()
        };
        assert!(signalled, "{n} bytes fit one block");
        flag.wait();
        // Read back on a stream not ordered after `stream`: only the flag orders them.
        let mut pinned = PinnedStaging::new(&g, 4096 + 512).unwrap();
        // SAFETY: `pinned` outlives the copy (synchronised just after).
        unsafe { copy::memcpy_dtoh_async(pinned.as_mut_ptr(), dst.device_ptr(), n + 512, &other).unwrap() };
        other.synchronize().unwrap();
        let got = pinned.as_slice();
        assert!(got[..n] == data[..], "{n} bytes: the signalled copy differs");
        assert!(got[n..n + 512].iter().all(|&x| x == 0xEE), "{n} bytes: written past the end");
        let mut tail = [0u8; 16];
        // SAFETY: 16 bytes of `b`, nothing queued on it any more (the flag is set).
        unsafe { copy::memcpy_dtoh_sync(&g, &mut tail, b.device_ptr() + (big - 16) as u64).unwrap() };
        assert!(tail.iter().all(|&x| x == round as u8 + 1), "{n} bytes: the flag came before the work queued first");
    }
    let src = pool.alloc(2 * SIGNALLED_MAX_BYTES).unwrap();
    let dst = pool.alloc(2 * SIGNALLED_MAX_BYTES).unwrap();
    // SAFETY: nothing is enqueued by refused copies; the buffers outlive the calls.
    unsafe {
        for (d, s, n) in [(0, 0, 0), (0, 0, SIGNALLED_MAX_BYTES + 1), (1, 0, 64), (0, 8, 64)] {
            let refused = kernel_copy_signalled(dst.device_ptr() + d, src.device_ptr() + s, n, &stream, &mut flag);
            assert!(!refused.unwrap(), "({d}, {s}, {n}) is not a signalled copy");
        }
    }
    // Refused calls left the flag as it was: still set.
    assert!(flag.is_set());
    stream.synchronize().unwrap();
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn a_registered_host_page_takes_words_from_the_copy_kernel_and_from_the_stream() {
    use cuda::copy_kernel::kernel_copy_signalling;
    use cuda::{write_value32, MappedHostRange};
    use std::alloc::{alloc_zeroed, dealloc, Layout};
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::{Duration, Instant};
    let g = gpu();
    let layout = Layout::from_size_align(4096, 4096).unwrap();
    // SAFETY: a non-zero layout; freed at the end, after the registration is dropped.
    let page = unsafe { alloc_zeroed(layout) };
    assert!(!page.is_null());
    // SAFETY: the page is live until the end; refused before anything is registered.
    assert!(unsafe { MappedHostRange::register(&g, page.wrapping_add(64), 4096) }.is_err(), "unaligned");
    // SAFETY: the page stays allocated until after `range` is dropped; its words are
    // read atomically below.
    let range = unsafe { MappedHostRange::register(&g, page, 4096).unwrap() };
    // SAFETY: in the page, aligned for u32; the GPU writes it, this thread reads it atomically.
    let word = |i: usize| unsafe { &*(page.cast::<AtomicU32>().add(i)) };
    let wait_for = |i: usize, value: u32| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while word(i).load(Ordering::Acquire) != value {
            assert!(Instant::now() < deadline, "word {i} never became {value}");
            std::hint::spin_loop();
        }
    };
    let pool = DevicePool::shared(0).unwrap();
    let stream = Stream::new(&g).unwrap();
    let data = pattern(1000, 3);
    let (src, dst) = (pool.alloc(1024).unwrap(), pool.alloc(1024).unwrap());
    src.copy_from_host(&data).unwrap();
    // SAFETY: both buffers and the page outlive the copy (its word is waited for).
    let launched = unsafe {
        kernel_copy_signalling(dst.device_ptr(), src.device_ptr(), 1000, &stream, (range.device_ptr() + 8, 5))
    };
    assert!(launched.unwrap(), "1000 bytes fit one block");
    wait_for(2, 5);
    assert!(dst.to_vec().unwrap()[..1000] == data[..], "the word came after the bytes");
    let big = 64 << 20;
    let (a, b) = (pool.alloc(big).unwrap(), pool.alloc(big).unwrap());
    a.fill(9).unwrap();
    // SAFETY: the buffers and the page outlive the stream's work (synchronised below).
    unsafe {
        copy::memcpy_dtod_async(b.device_ptr(), a.device_ptr(), big, &stream).unwrap();
        write_value32(&stream, range.device_ptr() + 12, 77).unwrap();
    }
    wait_for(3, 77);
    let mut tail = [0u8; 16];
    // SAFETY: 16 bytes of `b`, whose copy is done (the word after it is set).
    unsafe { copy::memcpy_dtoh_sync(&g, &mut tail, b.device_ptr() + (big - 16) as u64).unwrap() };
    assert!(tail.iter().all(|&x| x == 9), "the stream's word came before the copy queued first");
    stream.synchronize().unwrap();
    assert_eq!((word(0).load(Ordering::Relaxed), word(1).load(Ordering::Relaxed)), (0, 0), "no other word written");
    drop(range);
    // SAFETY: allocated above with `layout`; unregistered just above.
    unsafe { dealloc(page, layout) };
}
