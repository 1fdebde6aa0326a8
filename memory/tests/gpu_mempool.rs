//! GPU tests of exportable stream-ordered pools (`cuda::mempool`): ignored unless built
//! with `--features gpu-tests`, failing without a device.
//!
//! Only `installing_makes_cudarc_allocations_exportable` installs a pool as the device's
//! current pool, and it checks the stock pool first: no other test of this binary relies
//! on the device's current pool. Importing a pool pointer is checked from a second process
//! (the peer of `pool_pointer_and_vmm_chunks_in_another_process`); the same-process import
//! is only reported (it worked on driver 580, but need not).

use ferrylink_memory::cuda::{
    export_allocation, export_buffer_allocation, export_cache_hits, export_chunk, export_pointer, export_pool,
    export_route, from_cuda_slice, install_exportable_pool, pointer_info, pool_of, vmm_chunks, ExportRoute,
    ExportablePool, Gpu, ImportedPool, ImportedVmmChunk, Stream, VmmAllocation,
};
use ferrylink_testkit::peer::reached;
use ferrylink_testkit::{pattern, peer_test, require_gpu};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

const POOL_FD: &str = "FERRYLINK_TEST_POOL_FD";
const POINTER: &str = "FERRYLINK_TEST_POOL_POINTER";
const LEN: &str = "FERRYLINK_TEST_POOL_LEN";
const CHUNKS: &str = "FERRYLINK_TEST_VMM_CHUNKS";

/// Device 0; the test fails without a CUDA device (the kit's `require_gpu`).
fn gpu() -> Gpu {
    require_gpu();
    Gpu::get(0).expect("device 0")
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn exportable_pool_alloc_and_export() {
    let g = gpu();
    let pool = ExportablePool::create(&g).unwrap();
    assert!(!pool.is_installed());
    let stream = Arc::new(Stream::new(&g).unwrap());
    let len = (1 << 20) + 3;
    let buf = pool.alloc(len, &stream).unwrap();
    stream.synchronize().unwrap();
    let data = pattern(len, 5);
    buf.copy_from_host(&data).unwrap();
    assert_eq!(buf.to_vec().unwrap(), data);
    println!("pointer_info(pool allocation) = {:x?}", pointer_info(&g, buf.device_ptr()));
    assert_eq!(pool_of(&g, buf.device_ptr()).unwrap(), Some(pool.raw()));
    assert_eq!(pool_of(&g, buf.device_ptr() + 100).unwrap(), Some(pool.raw()));
    assert_eq!(export_route(&buf).unwrap(), ExportRoute::Pool(pool.raw()));
    println!("vmm_chunks(pool allocation) = {:x?}", vmm_chunks(&g, buf.device_ptr(), len));
    let t = Instant::now();
    let fd = pool.export().unwrap();
    println!("export_pool: {:?} (fd {})", t.elapsed(), fd.as_raw_fd());
    // SAFETY: the pool is live (`pool`).
    let again = unsafe { export_pool(&g, pool.raw()) }.unwrap();
    assert_ne!(fd.as_raw_fd(), again.as_raw_fd());
    let t = Instant::now();
    let shared = export_pointer(&g, buf.device_ptr()).unwrap();
    println!("export_pointer: {:?}", t.elapsed());
    println!("export_pointer twice gives the same bytes: {}", export_pointer(&g, buf.device_ptr()).unwrap() == shared);
    println!("export_pointer(base + 512) = {:?}", export_pointer(&g, buf.device_ptr() + 512).map(|_| ()));
    let other = pool.alloc(4096, &stream).unwrap();
    stream.synchronize().unwrap();
    assert_ne!(export_pointer(&g, other.device_ptr()).unwrap(), shared);
    // In this process: what the driver does (pointer import is expected to fail here).
    match ImportedPool::import(&g, fd.as_fd()) {
        Ok(imported) if imported.raw() == pool.raw() => {
            println!("same-process pool import returned the exporter's own pool handle");
            std::mem::forget(imported); // its drop would destroy the exporter's pool
        }
        Ok(imported) => {
            let opened = imported.import_pointer(&shared, len);
            println!("same-process pool import: ok; import_pointer: {:?}", opened.as_ref().map(|p| p.device_ptr()));
            if let Ok(p) = opened {
                let b = p.into_buffer();
                println!("same-process imported pointer reads back the pattern: {}", b.to_vec().unwrap() == data);
            }
        }
        Err(e) => println!("same-process pool import: {e}"),
    }
    drop((buf, other));
    stream.synchronize().unwrap();
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn export_data_is_remembered_per_allocation_and_never_for_a_remade_one() {
    let g = gpu();
    let pool = ExportablePool::create(&g).unwrap();
    let stream = Arc::new(Stream::new(&g).unwrap());
    let len = 1 << 20;
    let buf = pool.alloc(len, &stream).unwrap();
    stream.synchronize().unwrap();
    let t = Instant::now();
    let first = export_allocation(&g, buf.device_ptr() + 100).unwrap();
    println!("export_allocation, first: {:?}", t.elapsed());
    assert_eq!((first.base, first.alloc_len), (buf.device_ptr(), len), "the allocation holding the address");
    let hits = export_cache_hits();
    let t = Instant::now();
    let again = export_allocation(&g, buf.device_ptr()).unwrap();
    println!("export_allocation, again: {:?}", t.elapsed());
    assert_eq!(again, first);
    assert!(export_cache_hits() > hits, "the second export is served from the table");
    // Whether the driver's answer for one allocation is always the same bytes.
    let deterministic = export_pointer(&g, buf.device_ptr()).unwrap() == first.data;
    println!("export_pointer again gives the same bytes: {deterministic}");

    let (old_ptr, old_id) = (buf.device_ptr(), pointer_info(&g, buf.device_ptr()).unwrap().buffer_id);
    drop(buf);
    stream.synchronize().unwrap();
    let remade = pool.alloc(len, &stream).unwrap();
    stream.synchronize().unwrap();
    let new_id = pointer_info(&g, remade.device_ptr()).unwrap().buffer_id;
    println!("remade at the same address: {} (buffer ids {old_id} then {new_id})", remade.device_ptr() == old_ptr);
    assert_ne!(new_id, old_id, "a remade pool allocation has a new buffer id, so it is a new key");
    let fresh = export_allocation(&g, remade.device_ptr()).unwrap();
    let direct = export_pointer(&g, remade.device_ptr()).unwrap();
    if deterministic {
        assert_eq!(fresh.data, direct, "the remade allocation's own data, not the table's old entry");
    }
    drop(remade);
    stream.synchronize().unwrap();
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn a_buffer_remembers_its_route_and_its_export() {
    let g = gpu();
    let pool = ExportablePool::create(&g).unwrap();
    let stream = Arc::new(Stream::new(&g).unwrap());
    let buf = pool.alloc(1 << 20, &stream).unwrap();
    stream.synchronize().unwrap();
    let route = export_route(&buf).unwrap();
    assert!(matches!(route, ExportRoute::Pool(_)), "{route:?}");
    let first = export_buffer_allocation(&g, &buf).unwrap();
    assert_eq!(first, export_allocation(&g, buf.device_ptr()).unwrap(), "what the table answers");
    // The table counts its hits process-wide: the GPU machine runs these one at a time.
    let hits = export_cache_hits();
    let t = Instant::now();
    assert_eq!(export_buffer_allocation(&g, &buf).unwrap(), first);
    assert_eq!(export_route(&buf).unwrap(), route);
    println!("route and export answered by the buffer: {:?}", t.elapsed());
    assert_eq!(export_cache_hits(), hits, "answered by the buffer, without the table's pointer queries");
    drop(buf);
    stream.synchronize().unwrap();
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn installing_makes_cudarc_allocations_exportable() {
    let g = gpu();
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    // Before: the stock default pool, not exportable.
    let stock = from_cuda_slice(stream.alloc_zeros::<u8>(1 << 20).unwrap()).unwrap();
    let stock_pool = pool_of(&g, stock.device_ptr()).unwrap().expect("cudarc allocates from a pool");
    assert_eq!(export_route(&stock).unwrap(), ExportRoute::NotExportable);
    // SAFETY: the pool is live: `stock` is allocated from it.
    let refused = unsafe { export_pool(&g, stock_pool) };
    println!("export_pool(stock pool) = {refused:?}");
    assert!(refused.unwrap_err().to_string().contains("not exportable"));

    let t = Instant::now();
    let pool = install_exportable_pool(0).unwrap();
    println!("install_exportable_pool: {:?}", t.elapsed());
    assert!(pool.is_installed());
    assert!(Arc::ptr_eq(&pool, &install_exportable_pool(0).unwrap()), "installed once per device");
    assert_ne!(pool.raw(), stock_pool);

    // After: cudarc's allocations come from the installed pool and are exportable.
    let data = pattern(3 << 20, 8);
    let copied = from_cuda_slice(stream.clone_htod(&data).unwrap()).unwrap();
    let zeroed = from_cuda_slice(stream.alloc_zeros::<u8>(1 << 20).unwrap()).unwrap();
    for buf in [&copied, &zeroed] {
        assert_eq!(pool_of(&g, buf.device_ptr()).unwrap(), Some(pool.raw()));
        assert_eq!(export_route(buf).unwrap(), ExportRoute::Pool(pool.raw()));
        export_pointer(&g, buf.device_ptr()).unwrap();
    }
    assert_eq!(copied.to_vec().unwrap(), data);
    assert!(zeroed.to_vec().unwrap().iter().all(|&b| b == 0));
    // The stock allocation made before stays where it was.
    assert_eq!(export_route(&stock).unwrap(), ExportRoute::NotExportable);
    pool.export().unwrap();
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> [u8; 64] {
    let mut out = [0u8; 64];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex");
    }
    out
}

/// An fd the child inherits: `dup` clears close-on-exec.
fn inheritable(fd: &OwnedFd) -> OwnedFd {
    nix::unistd::dup(fd).expect("dup")
}

peer_test! {
    /// An exportable pool's allocation and a two-chunk VMM range, opened by another
    /// process (fds inherited, export data in the environment), which checks the
    /// contents, writes the pool memory, and frees its pointer before the exporter does.
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn pool_pointer_and_vmm_chunks_in_another_process(peers) {
        let g = gpu();
        let len = (4 << 20) + 1;
        let pool = ExportablePool::create(&g).unwrap();
        let stream = Arc::new(Stream::new(&g).unwrap());
        let buf = pool.alloc(len, &stream).unwrap();
        stream.synchronize().unwrap();
        buf.copy_from_host(&pattern(len, 11)).unwrap();
        let pool_fd = pool.export().unwrap();
        let shared = export_pointer(&g, buf.device_ptr()).unwrap();

        let granule = VmmAllocation::granularity(&g).unwrap();
        let vmm = VmmAllocation::with_chunks(&g, &[granule, 2 * granule]).unwrap();
        vmm.buffer(0, vmm.len()).unwrap().copy_from_host(&pattern(vmm.len(), 12)).unwrap();
        let chunks = vmm_chunks(&g, vmm.device_ptr(), vmm.len()).unwrap();
        let chunk_fds: Vec<(OwnedFd, usize)> =
            chunks.iter().map(|c| (inheritable(&export_chunk(&g, c.base).unwrap()), c.len)).collect();
        let chunk_env: Vec<String> = chunk_fds.iter().map(|(fd, l)| format!("{}:{l}", fd.as_raw_fd())).collect();
        let pool_dup = inheritable(&pool_fd);
        let mut peer = peers.spawn(
            "importer",
            &[
                (POOL_FD, pool_dup.as_raw_fd().to_string()),
                (POINTER, hex(&shared)),
                (LEN, len.to_string()),
                (CHUNKS, chunk_env.join(",")),
            ],
        );
        drop((pool_dup, chunk_fds, pool_fd));
        peer.wait_reached("freed", Duration::from_secs(60));
        let out = peer.wait_success(Duration::from_secs(60));
        println!("peer output:\n{}", out.stdout);
        // The importer freed its pointer: only now may the exporter free the allocation.
        assert!(buf.to_vec().unwrap().iter().all(|&b| b == 0x5A), "the peer's write arrived");
        drop(buf);
        stream.synchronize().unwrap();
    }
    "importer" => importer(),
}

/// The peer: imports the pool, the pointer and the chunks the parent passed.
fn importer() {
    let g = Gpu::get(0).expect("device 0");
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"));
    let fd: RawFd = var(POOL_FD).parse().unwrap();
    let len: usize = var(LEN).parse().unwrap();
    // SAFETY: the parent passed this fd open (inherited); it stays open in this process.
    let pool_fd = unsafe { BorrowedFd::borrow_raw(fd) };
    let t = Instant::now();
    let pool = ImportedPool::import(&g, pool_fd).unwrap();
    println!("ImportedPool::import: {:?}", t.elapsed());
    let t = Instant::now();
    let pointer = pool.import_pointer(&unhex(&var(POINTER)), len).unwrap();
    println!("ImportedPool::import_pointer: {:?}", t.elapsed());
    let buf = pointer.into_buffer();
    assert!(buf.to_vec().unwrap() == pattern(len, 11), "pool memory read in the importer");
    buf.fill(0x5A).unwrap();
    let t = Instant::now();
    drop(buf);
    println!("imported pointer freed: {:?}", t.elapsed());
    // Freed by the refusal itself (the first import is freed already: no aliasing).
    let long = pool.import_pointer(&unhex(&var(POINTER)), len + (1 << 30));
    println!("import_pointer with a length past the allocation: {:?}", long.as_ref().map(|p| p.device_ptr()));
    assert!(long.is_err());
    reached("freed");

    let mut offset = 0usize;
    let chunks: Vec<(RawFd, usize)> = var(CHUNKS)
        .split(',')
        .map(|e| e.split_once(':').map(|(f, l)| (f.parse().unwrap(), l.parse().unwrap())).unwrap())
        .collect();
    let total: usize = chunks.iter().map(|c| c.1).sum();
    let want = pattern(total, 12);
    for (i, (fd, len)) in chunks.into_iter().enumerate() {
        // SAFETY: as above.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let t = Instant::now();
        let chunk = ImportedVmmChunk::import(&g, fd, len).unwrap();
        println!("ImportedVmmChunk::import (other process) chunk {i}: {:?}", t.elapsed());
        assert!(chunk.into_buffer().to_vec().unwrap() == want[offset..offset + len], "VMM chunk {i}");
        offset += len;
    }
}
