//! Which device memory `local-send-recv` sends and receives (`--memory`), and the fresh
//! buffers of the kinds other than the pool.
//!
//! - [`MemoryKind::Pool`]: ferrylink's exportable [`DevicePool`]
//!   (`cuMemAlloc` slabs, legacy IPC); the round trip as it always was (one send buffer
//!   reused, receives into the transport's memory or, with `--reuse-alloc`, one buffer).
//! - The other kinds give every round trip **fresh** buffers on both sides, made before
//!   the timed part of the iteration and dropped after it ([`FreshBuffers`]): the client
//!   sends a fresh buffer (filled, and the fill completed, before the timing) and receives into another
//!   (`recv_into`), the server receives into a fresh buffer and echoes it. So the
//!   receiver's buffers are exported as push targets and the echo is pulled from them:
//!   the export and import paths of that memory run in every iteration (and the
//!   transport's caches show what they save).
//! - [`MemoryKind::Vmm`]: `cuMemCreate` memory as PyTorch's expandable segments make it.
//!   Each [`FreshBuffers`] owns one arena made once
//!   ([`VmmAllocation::with_chunks`]: [`VMM_CHUNKS`] chunks of `n` rounded up to the
//!   granularity) and hands out, iteration after iteration, a new
//!   [`DeviceBuffer`] at the next of a few offsets in rotation ([`vmm_offsets`]: chunk
//!   starts, the end of the last chunk, and one straddling the first chunk boundary when
//!   `n` is at least 512 bytes), as a caching allocator hands out blocks of its segments.
//!   The buffers are fresh, the chunks behind them are not: the transport exports each
//!   chunk once and its per-chunk import cache serves the later iterations, so the first
//!   [`VMM_CHUNKS`] round trips or so pay the first export and import of a chunk (pass
//!   `--n-warmup-iter 5` or more to keep them out of the median). The client has two
//!   arenas (sends, receives), the server one: 12 chunks of `n` in all.
//! - [`MemoryKind::Cudarc`]: cudarc `CudaSlice<u8>`s (`alloc`, not zeroed, on the device's
//!   cudarc default stream, [`cudarc_stream`]) wrapped with [`from_cuda_slice`], after
//!   [`install_exportable_pool`] made the device's current pool exportable (once per
//!   process and device).
//! - [`MemoryKind::CudarcDefault`]: the same from cudarc's stock pool, which cannot be
//!   exported: the transport bounces it. Installing the exportable pool cannot be undone
//!   in a process; nothing in an invocation with this kind installs it (the kind is one
//!   per invocation, and every server is a process of its own).
//!
//! One-sided round trips (`--op put|get`) register their memory once instead: each
//! region is one buffer of its kind made at setup ([`one_buffer`]), reused every round
//! trip; the transport refuses to register `cudarc-default` memory (it would bounce it).

use crate::BenchError;
use ferrylink::memory::cuda::{
    cudarc_stream, from_cuda_slice, install_exportable_pool, DevicePool, Gpu, VmmAllocation,
};
use ferrylink::memory::cudarc::driver::result::memset_d8_async;
use ferrylink::memory::cudarc::driver::sys::CUevent_flags;
use ferrylink::memory::cudarc::driver::{CudaStream, DevicePtrMut};
use ferrylink::DeviceBuffer;
use std::sync::Arc;

/// Chunks of a VMM arena.
pub const VMM_CHUNKS: usize = 4;

/// Alignment of the offsets of buffers in a VMM arena.
const VMM_ALIGN: usize = 256;

/// `--memory`: where device buffers come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, clap::ValueEnum)]
pub enum MemoryKind {
    /// ferrylink's exportable device pool: one send buffer reused, receives into the
    /// transport's memory.
    #[default]
    Pool,
    /// Fresh buffers from a VMM arena (`cuMemCreate` chunks, as PyTorch's expandable
    /// segments).
    Vmm,
    /// Fresh cudarc slices, from the exportable stream-ordered pool it installs.
    Cudarc,
    /// Fresh cudarc slices from cudarc's stock pool (not exportable: the transport
    /// bounces them).
    CudarcDefault,
}

impl MemoryKind {
    /// The name `--memory` takes and records carry.
    pub fn name(self) -> &'static str {
        match self {
            MemoryKind::Pool => "pool",
            MemoryKind::Vmm => "vmm",
            MemoryKind::Cudarc => "cudarc",
            MemoryKind::CudarcDefault => "cudarc-default",
        }
    }

    /// Whether every round trip uses fresh buffers of this kind ([`FreshBuffers`]).
    pub fn is_fresh(self) -> bool {
        self != MemoryKind::Pool
    }
}

impl std::fmt::Display for MemoryKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A VMM arena and the offsets its buffers rotate through.
struct VmmArena {
    alloc: Arc<VmmAllocation>,
    offsets: Vec<usize>,
    next: usize,
}

/// Where a [`FreshBuffers`] takes its memory from.
enum Source {
    Vmm(VmmArena),
    Cudarc(Arc<CudaStream>),
}

/// Fresh device buffers of `n` bytes of one [`MemoryKind`] (not the pool) on one device,
/// one per [`FreshBuffers::alloc`].
pub struct FreshBuffers {
    kind: MemoryKind,
    dev: usize,
    n: usize,
    source: Source,
}

impl FreshBuffers {
    /// Buffers of `kind` on `dev`; `None` for [`MemoryKind::Pool`]. Makes the VMM arena,
    /// or installs the exportable pool ([`MemoryKind::Cudarc`]).
    pub fn new(kind: MemoryKind, dev: usize, n: usize) -> Result<Option<FreshBuffers>, BenchError> {
        let source = match kind {
            MemoryKind::Pool => return Ok(None),
            MemoryKind::Vmm => Source::Vmm(vmm_arena(dev, n)?),
            MemoryKind::Cudarc => {
                install_exportable_pool(dev)?;
                Source::Cudarc(cudarc_stream(dev)?)
            }
            MemoryKind::CudarcDefault => Source::Cudarc(cudarc_stream(dev)?),
        };
        Ok(Some(FreshBuffers { kind, dev, n, source }))
    }

    /// A new buffer of `n` bytes: the next offset of the arena, or a new cudarc slice
    /// (on the cudarc default stream, not zeroed: a memset would be GPU work of this
    /// process right where the peer's copy into the buffer runs, and two processes' work
    /// on one GPU costs a context switch of about 150 µs, docs/decisions/0002-connector-runs-device-copies.md).
    pub fn alloc(&mut self) -> Result<DeviceBuffer, BenchError> {
        match &mut self.source {
            Source::Vmm(arena) => {
                let offset = arena.offsets[arena.next % arena.offsets.len()];
                arena.next += 1;
                Ok(arena.alloc.buffer(offset, self.n)?)
            }
            Source::Cudarc(stream) => {
                // SAFETY: the bytes are never read before they are written: send buffers
                // are filled by the client, receive buffers are written by the transport.
                let slice = unsafe { stream.alloc::<u8>(self.n) }.map_err(|e| {
                    BenchError::Cuda(format!(
                        "--memory {}: allocating {} bytes with cudarc on device {}: {e}",
                        self.kind, self.n, self.dev
                    ))
                })?;
                Ok(from_cuda_slice(slice)?)
            }
        }
    }
}

impl FreshBuffers {
    /// A new buffer of `n` bytes holding `value` in every byte, for a send, filled before
    /// the round trip's timing starts (as the pool's send buffer and VMM buffers are). A
    /// cudarc slice is filled on its own stream, which the send still names as its
    /// producer stream, and the fill is waited for by polling an event: the host never
    /// synchronises, which would also unmap the peer's freed imports of this process's
    /// memory (docs/decisions/0020-user-memory-vmm-pool-pointers-bounces.md). Waiting for the fill keeps its GPU time
    /// (about 0.25 ms for 1 GB) out of the timed round trip, where the push would wait for it.
    pub fn alloc_filled(&mut self, value: u8) -> Result<DeviceBuffer, BenchError> {
        let Source::Cudarc(stream) = &self.source else {
            let buf = self.alloc()?;
            buf.fill(value)?;
            return Ok(buf);
        };
        let cuda = |e: &dyn std::fmt::Display| {
            BenchError::Cuda(format!("--memory {}: {} bytes on device {}: {e}", self.kind, self.n, self.dev))
        };
        // SAFETY: every byte is written by the memset below, on the slice's own stream,
        // before anything on that stream (or ordered after it) reads them.
        let mut slice = unsafe { stream.alloc::<u8>(self.n) }.map_err(|e| cuda(&e))?;
        {
            let (ptr, _record) = slice.device_ptr_mut(stream);
            // SAFETY: `ptr` is the slice's `n` bytes, alive while `slice` is; the memset
            // is ordered on the slice's stream.
            unsafe { memset_d8_async(ptr, value, self.n, stream.cu_stream()) }.map_err(|e| cuda(&e))?;
        }
        wait_by_polling(stream).map_err(|e| cuda(&e))?;
        Ok(from_cuda_slice(slice)?)
    }
}

/// How long [`wait_by_polling`] waits for a fill before it gives up.
const FILL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Waits for the work queued so far on `stream` by spinning on an event's query (never
/// a host synchronisation); an error after [`FILL_TIMEOUT`] or when the GPU reports one.
fn wait_by_polling(stream: &CudaStream) -> Result<(), String> {
    let done = stream
        .record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
        .map_err(|e| format!("recording an event after the fill: {e}"))?;
    let deadline = std::time::Instant::now() + FILL_TIMEOUT;
    while !done.try_is_complete().map_err(|e| format!("waiting for the fill: {e}"))? {
        if std::time::Instant::now() > deadline {
            return Err(format!("the fill did not complete within {FILL_TIMEOUT:?}"));
        }
        std::hint::spin_loop();
    }
    Ok(())
}

/// One buffer of `len` bytes of `kind` on `dev`, made once: a one-sided round trip
/// (`--op put|get`) registers it and reuses it every round trip. The pool's memory; a VMM
/// allocation of its own (one chunk, `len` rounded up to the granularity); or a cudarc
/// slice, from the exportable stream-ordered pool ([`MemoryKind::Cudarc`], installed
/// first) or cudarc's stock pool ([`MemoryKind::CudarcDefault`], which cannot be
/// registered: the transport refuses memory it would have to bounce), allocated and
/// waited for on its stream so that copies on any stream may fill it.
pub fn one_buffer(kind: MemoryKind, dev: usize, len: usize) -> Result<DeviceBuffer, BenchError> {
    match kind {
        MemoryKind::Pool => Ok(DevicePool::shared(dev)?.alloc(len)?),
        MemoryKind::Vmm => Ok(VmmAllocation::new(&Gpu::get(dev)?, len)?.buffer(0, len)?),
        MemoryKind::Cudarc | MemoryKind::CudarcDefault => {
            if kind == MemoryKind::Cudarc {
                install_exportable_pool(dev)?;
            }
            let stream = cudarc_stream(dev)?;
            let cuda = |e: &dyn std::fmt::Display| {
                BenchError::Cuda(format!("--memory {kind}: {len} bytes with cudarc on device {dev}: {e}"))
            };
            // SAFETY: the bytes are never read before they are written: the caller fills
            // the buffer before it registers it.
            let slice = unsafe { stream.alloc::<u8>(len) }.map_err(|e| cuda(&e))?;
            stream.synchronize().map_err(|e| cuda(&e))?;
            Ok(from_cuda_slice(slice)?)
        }
    }
}

/// One arena of [`VMM_CHUNKS`] chunks, each `n` bytes rounded up to the granularity.
fn vmm_arena(dev: usize, n: usize) -> Result<VmmArena, BenchError> {
    let gpu = Gpu::get(dev)?;
    let granule = VmmAllocation::granularity(&gpu)?;
    let chunk = n
        .max(1)
        .checked_next_multiple_of(granule)
        .ok_or_else(|| BenchError::Usage(format!("--memory vmm: {n} bytes is too large")))?;
    let alloc = VmmAllocation::with_chunks(&gpu, &[chunk; VMM_CHUNKS])?;
    let chunk = alloc.chunk_lens().first().copied().unwrap_or(chunk);
    let offsets = vmm_offsets(chunk, VMM_CHUNKS, n);
    tracing::debug!(device = dev, chunk, ?offsets, "VMM arena for the round trip");
    Ok(VmmArena { alloc, offsets, next: 0 })
}

/// The offsets buffers of `n` bytes rotate through in an arena of `chunks` chunks of
/// `chunk` bytes (`n <= chunk`, `chunk` a multiple of 256): the start of the first chunk,
/// one straddling the first boundary (half of `n` on each side, 256-aligned) when
/// `n >= 512` (else the start of the second chunk), the starts of the other chunks, and
/// the end of the last one (when that is not its start).
pub fn vmm_offsets(chunk: usize, chunks: usize, n: usize) -> Vec<usize> {
    let mut offsets = vec![0];
    if chunks < 2 {
        return offsets;
    }
    let half = n / 2 / VMM_ALIGN * VMM_ALIGN;
    offsets.push(if half > 0 { chunk - half } else { chunk });
    offsets.extend((2..chunks).map(|c| c * chunk));
    let last = (chunk * chunks - n) / VMM_ALIGN * VMM_ALIGN;
    if !offsets.contains(&last) {
        offsets.push(last);
    }
    offsets
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB2: usize = 2 << 20;

    /// Whether `[offset, offset + n)` crosses a chunk boundary.
    fn straddles(offset: usize, n: usize, chunk: usize) -> bool {
        offset / chunk != (offset + n - 1) / chunk
    }

    #[test]
    fn offsets_fit_are_aligned_and_one_straddles() {
        for n in [512, 4096, 1_000_000, MB2 - 1, MB2] {
            let offsets = vmm_offsets(MB2, 4, n);
            assert!(offsets.len() >= 4, "{n}: {offsets:?}");
            for &o in &offsets {
                assert!(o + n <= 4 * MB2 && o % VMM_ALIGN == 0, "{n}: {offsets:?}");
            }
            assert_eq!(offsets.iter().filter(|&&o| straddles(o, n, MB2)).count(), 1, "{n}: {offsets:?}");
        }
    }

    #[test]
    fn small_buffers_do_not_straddle() {
        let offsets = vmm_offsets(MB2, 4, 100);
        assert_eq!(offsets, vec![0, MB2, 2 * MB2, 3 * MB2, (4 * MB2 - 100) / 256 * 256]);
        assert!(offsets.iter().all(|&o| !straddles(o, 100, MB2)));
        assert_eq!(vmm_offsets(MB2, 1, 100), vec![0]);
    }

    #[test]
    fn names_are_the_flag_values() {
        use clap::ValueEnum;
        for kind in MemoryKind::value_variants() {
            assert_eq!(kind.to_possible_value().unwrap().get_name(), kind.name());
        }
        assert_eq!(MemoryKind::default(), MemoryKind::Pool);
        assert!(!MemoryKind::Pool.is_fresh() && MemoryKind::CudarcDefault.is_fresh());
    }
}
