//! GPU tests of VMM memory (`cuda::vmm`) and of `export_route` for every kind of memory
//! but pool memory made exportable (this binary never installs an exportable pool, so
//! cudarc's allocations here come from the stock default pool). Ignored unless built with
//! `--features gpu-tests`, failing without a device.

use ferrylink_memory::cuda::{
    export_chunk, export_route, from_cuda_slice, from_raw_device_memory, pointer_info, vmm_chunks, DeviceAllocation,
    DevicePool, ExportRoute, Gpu, ImportedVmmChunk, PoolConfig, VmmAllocation,
};
use ferrylink_testkit::{pattern, require_gpu};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Instant;

/// Device 0; the test fails without a CUDA device (the kit's `require_gpu`).
fn gpu() -> Gpu {
    require_gpu();
    Gpu::get(0).expect("device 0")
}

/// Writes a pattern over the whole allocation, exports every chunk, imports each in this
/// process, and checks what comes back (every byte, and the bytes at each chunk edge).
fn round_trip_every_chunk(g: &Gpu, alloc: &Arc<VmmAllocation>, seed: u64) {
    let data = pattern(alloc.len(), seed);
    let whole = alloc.buffer(0, alloc.len()).unwrap();
    whole.copy_from_host(&data).unwrap();
    assert_eq!(export_route(&whole).unwrap(), ExportRoute::Vmm);
    let chunks = vmm_chunks(g, alloc.device_ptr(), alloc.len()).unwrap();
    println!("allocation {alloc:?}: chunks {chunks:x?}");
    assert_eq!(chunks.len(), alloc.chunk_lens().len());
    let mut offset = 0usize;
    for (i, (chunk, &len)) in chunks.iter().zip(alloc.chunk_lens()).enumerate() {
        assert_eq!((chunk.base, chunk.len), (alloc.device_ptr() + offset as u64, len), "chunk {i}");
        let t = Instant::now();
        let fd = export_chunk(g, chunk.base).unwrap();
        let exported = t.elapsed();
        let t = Instant::now();
        let imported = ImportedVmmChunk::import(g, fd.as_fd(), chunk.len).unwrap();
        let mapped = t.elapsed();
        drop(fd);
        println!("chunk {i} ({len} B): export_chunk {exported:?}, ImportedVmmChunk::import {mapped:?}");
        assert_eq!(imported.len(), len);
        assert_ne!(imported.device_ptr(), chunk.base, "mapped at an address of its own");
        let buf = imported.into_buffer();
        let back = buf.to_vec().unwrap();
        let want = &data[offset..offset + len];
        assert_eq!(&back[..64], &want[..64], "chunk {i}: first bytes");
        assert_eq!(&back[len - 64..], &want[len - 64..], "chunk {i}: last bytes");
        assert!(back == want, "chunk {i}: contents differ");
        // Both mappings show the same memory.
        buf.fill(0xEE).unwrap();
        let part = alloc.buffer(offset, len).unwrap();
        assert!(part.to_vec().unwrap().iter().all(|&b| b == 0xEE), "chunk {i}: a write through the import");
        offset += len;
    }
    // Reads across each chunk edge in the original range.
    whole.copy_from_host(&data).unwrap();
    let mut edge = 0usize;
    for &len in &alloc.chunk_lens()[..alloc.chunk_lens().len() - 1] {
        edge += len;
        let across = alloc.buffer(edge - 16, 32).unwrap();
        assert_eq!(across.to_vec().unwrap(), &data[edge - 16..edge + 16], "edge at {edge}");
    }
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn single_chunk_export_import() {
    let g = gpu();
    let granule = VmmAllocation::granularity(&g).unwrap();
    println!("VMM granularity (POSIX fd, minimum): {granule}");
    let alloc = VmmAllocation::new(&g, (3 << 20) + 5).unwrap();
    assert_eq!(alloc.len() % granule, 0);
    assert!(alloc.len() >= (3 << 20) + 5);
    assert_eq!(alloc.chunk_lens(), &[alloc.len()]);
    round_trip_every_chunk(&g, &alloc, 1);
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn multi_chunk_export_import() {
    let g = gpu();
    let granule = VmmAllocation::granularity(&g).unwrap();
    let alloc = VmmAllocation::with_chunks(&g, &[granule, 2 * granule + 1, 1, 0]).unwrap();
    assert_eq!(alloc.chunk_lens(), &[granule, 3 * granule, granule, granule]);
    assert_eq!(alloc.len(), 6 * granule);
    round_trip_every_chunk(&g, &alloc, 2);
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn chunks_of_a_range_straddling_a_boundary() {
    let g = gpu();
    let granule = VmmAllocation::granularity(&g).unwrap();
    let alloc = VmmAllocation::with_chunks(&g, &[granule, granule, granule]).unwrap();
    let base = alloc.device_ptr();
    let g64 = granule as u64;
    // What the driver reports for an address inside the second mapping.
    let info = pointer_info(&g, base + g64 + 100).unwrap();
    println!("pointer_info(second chunk + 100) = {info:x?}");
    assert_eq!((info.base, info.alloc_len), (base + g64, granule), "cuMemGetAddressRange reports the mapping");
    assert!(!info.legacy_ipc_capable);

    let all = vmm_chunks(&g, base, alloc.len()).unwrap();
    let straddling = vmm_chunks(&g, base + g64 - 10, 20).unwrap();
    assert_eq!(straddling, all[..2].to_vec());
    assert_eq!(vmm_chunks(&g, base + g64, granule).unwrap(), all[1..2].to_vec());
    assert_eq!(vmm_chunks(&g, base + g64 + 1, 0).unwrap(), all[1..2].to_vec());
    assert_eq!(vmm_chunks(&g, base + 2 * g64 - 1, 2).unwrap(), all[1..3].to_vec());
    let mut ids: Vec<u64> = all.iter().map(|c| c.buffer_id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 3, "each mapping has its own buffer id: {all:?}");
    // Past the last mapping (whatever lies there: unmapped, or another allocation),
    // outside VMM memory, or not a mapping's base.
    println!("vmm_chunks past the end: {:x?}", vmm_chunks(&g, base + 2 * g64, granule + 1));
    let plain = DeviceAllocation::new(&g, 1 << 20).unwrap();
    let not_vmm = vmm_chunks(&g, plain.ptr(), 16);
    println!("vmm_chunks of cuMemAlloc memory: {not_vmm:?}");
    assert!(not_vmm.is_err());
    assert!(export_chunk(&g, base + 4096).is_err());
    // A buffer inside one chunk carries the driver's record of it; one across, none.
    let inside = alloc.buffer(granule + 8, 8).unwrap();
    let known = inside.owner().allocation().expect("recorded");
    assert_eq!((known.base, known.len, known.buffer_id), (all[1].base, all[1].len, all[1].buffer_id));
    assert!(alloc.buffer(granule - 8, 16).unwrap().owner().allocation().is_none());
    assert!(alloc.buffer(alloc.len() - 1, 2).is_err());
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn buffer_id_differs_after_free_and_realloc() {
    let g = gpu();
    let len = 2 << 20;
    let mut seen = Vec::new();
    let mut same_address = 0;
    for round in 0..8 {
        let alloc = VmmAllocation::new(&g, len).unwrap();
        let chunk = vmm_chunks(&g, alloc.device_ptr(), alloc.len()).unwrap()[0];
        println!("round {round}: {chunk:x?}");
        if let Some(&(base, _, _)) = seen.last() {
            if base == chunk.base {
                same_address += 1;
            }
        }
        for &(base, l, id) in &seen {
            assert_ne!((base, l, id), (chunk.base, chunk.len, chunk.buffer_id), "a cache key came back");
            assert_ne!(id, chunk.buffer_id, "a buffer id came back");
        }
        seen.push((chunk.base, chunk.len, chunk.buffer_id));
    }
    println!("{same_address} of 7 reallocations landed at the previous address");
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn export_route_of_every_kind() {
    let g = gpu();
    // DevicePool memory: legacy IPC, from the owner's record (no driver call).
    let pool = DevicePool::new(&g, PoolConfig::default().with_slab_size(1 << 20).with_alignment(512)).unwrap();
    let pooled = pool.alloc(4096).unwrap();
    let t = Instant::now();
    assert_eq!(export_route(&pooled).unwrap(), ExportRoute::LegacyIpc);
    println!("export_route (recorded allocation): {:?}", t.elapsed());
    // The same memory without a record: legacy IPC, asked of the driver.
    // SAFETY: `pooled` outlives the wrapper (dropped first, below).
    let bare = unsafe { from_raw_device_memory(pooled.device_ptr(), 4096, 0, Box::new(())) };
    let t = Instant::now();
    assert_eq!(export_route(&bare).unwrap(), ExportRoute::LegacyIpc);
    println!("export_route (cuPointerGetAttributes): {:?}", t.elapsed());
    drop(bare);
    // VMM memory.
    let vmm = VmmAllocation::new(&g, 1).unwrap();
    assert_eq!(export_route(&vmm.buffer(0, 16).unwrap()).unwrap(), ExportRoute::Vmm);
    // cudarc's stream-ordered allocation from the stock default pool: not exportable.
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    let stream = ctx.default_stream();
    let slice = stream.alloc_zeros::<u8>(1 << 20).unwrap();
    let stock = from_cuda_slice(slice).unwrap();
    let pool_handle = ferrylink_memory::cuda::pool_of(&g, stock.device_ptr()).unwrap();
    println!("stock pool allocation: pool {pool_handle:?}");
    assert!(pool_handle.is_some(), "cudarc allocates from a pool");
    let t = Instant::now();
    assert_eq!(export_route(&stock).unwrap(), ExportRoute::NotExportable);
    println!("export_route (stock pool, first time: trial export): {:?}", t.elapsed());
    let t = Instant::now();
    assert_eq!(export_route(&stock).unwrap(), ExportRoute::NotExportable);
    println!("export_route (stock pool, cached): {:?}", t.elapsed());
    // SAFETY: the pool is the stock pool of memory still allocated (`stock`).
    let refused = unsafe { ferrylink_memory::cuda::export_pool(&g, pool_handle.unwrap()) };
    println!("export_pool(stock pool) = {refused:?}");
    assert!(refused.unwrap_err().to_string().contains("not exportable"));
    assert_eq!(ferrylink_memory::cuda::pool_of(&g, pooled.device_ptr()).unwrap(), None);
}
