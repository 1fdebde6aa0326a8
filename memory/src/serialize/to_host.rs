//! Device → host: device frames into pooled host memory with pipelined chunk copies on
//! two streams, into pageable memory through a ring of pinned staging chunks, or
//! straight to pageable memory (see the [module documentation](super)).

use std::collections::VecDeque;

use super::error::{Failure, SerializeError};
use super::host_message::{FrameOrigin, HostMessage};
use crate::pinned::{bind_primary_context, dtoh_async, Event, Stream};
use crate::{DeviceBuffer, Frame, HostBuffer, Message, PinnedPool};

/// Chunk size of pipelined copies when no pool says otherwise.
pub const DEFAULT_COPY_CHUNK: usize = 4 << 20;
/// Most pinned staging chunks used for a copy into pageable memory.
const MAX_STAGING: usize = 4;

/// Device frames → host frames from `pool`, with pipelined chunk copies.
///
/// See the [module documentation](super) for the copy strategy. On failure the message
/// comes back intact.
pub fn device_to_host(msg: Message, pool: &PinnedPool) -> Result<HostMessage, Failure<Message>> {
    device_to_host_with(msg, Some(pool))
}

/// Like [`device_to_host`], into pooled memory when `pool` is given, fresh memory
/// otherwise.
pub fn device_to_host_with(msg: Message, pool: Option<&PinnedPool>) -> Result<HostMessage, Failure<Message>> {
    if msg.device_bytes() == 0 && msg.frames.iter().all(|f| f.as_host().is_some()) {
        return HostMessage::from_host_message(msg);
    }
    if let Err(e) = crate::cuda::probe() {
        return Err(Failure::new(SerializeError::Unsupported(e.to_string()), msg));
    }
    match device_frames_to_host(&msg, pool) {
        Ok(copies) => assemble_host(msg, copies),
        Err(e) => Err(Failure::new(e, msg)),
    }
}

/// Replaces the device frames of `msg` by their host `copies` (index-aligned with the
/// frames, as [`device_frames_to_host`] returns them), dropping the device buffers.
pub fn assemble_host(msg: Message, mut copies: Vec<Option<HostBuffer>>) -> Result<HostMessage, Failure<Message>> {
    let aligned = copies.len() == msg.frames.len()
        && copies
            .iter()
            .zip(&msg.frames)
            .all(|(c, f)| c.as_ref().map(HostBuffer::len) == f.as_device().map(DeviceBuffer::len));
    if !aligned {
        let e = SerializeError::Layout("host copies do not match the device frames".into());
        return Err(Failure::new(e, msg));
    }
    let Message { header, frames } = msg;
    let mut out = Vec::with_capacity(frames.len());
    let mut origins = Vec::with_capacity(frames.len());
    for (f, copy) in frames.into_iter().zip(copies.iter_mut()) {
        match (f, copy.take()) {
            (Frame::Device(d), Some(h)) => {
                origins.push(FrameOrigin::Device { ordinal: d.device_ordinal() });
                out.push(h);
            }
            (Frame::Host(h), _) => {
                origins.push(FrameOrigin::Host);
                out.push(h);
            }
            (Frame::Device(_), None) => {} // excluded by the check above
        }
    }
    Ok(HostMessage { header, frames: out, origins })
}

/// Copies every device frame of `msg` to new host memory (pooled when possible), leaving
/// `msg` untouched: the result is index-aligned with `msg.frames` (`None` for host
/// frames). Use it to keep the device copy until the host copy is safe somewhere (spill
/// writes it to disk first); [`assemble_host`] then swaps them in.
///
/// Host-only messages need no CUDA; device frames without CUDA give
/// [`SerializeError::Unsupported`].
pub fn device_frames_to_host(
    msg: &Message,
    pool: Option<&PinnedPool>,
) -> Result<Vec<Option<HostBuffer>>, SerializeError> {
    if msg.frames.iter().all(|f| f.as_host().is_some()) {
        return Ok(msg.frames.iter().map(|_| None).collect());
    }
    crate::cuda::probe().map_err(|e| SerializeError::Unsupported(e.to_string()))?;
    let chunk = pool.map_or(DEFAULT_COPY_CHUNK, PinnedPool::chunk_size);
    let mut copies: Vec<Option<HostBuffer>> = Vec::with_capacity(msg.frames.len());
    let mut ordinals: Vec<usize> = Vec::new();
    for f in &msg.frames {
        copies.push(match f {
            Frame::Host(_) => None,
            Frame::Device(d) => {
                if !ordinals.contains(&d.device_ordinal()) {
                    ordinals.push(d.device_ordinal());
                }
                Some(match pool.map(|p| p.alloc(d.len())) {
                    Some(Ok(b)) => b,
                    Some(Err(e)) => {
                        tracing::debug!("device_to_host: pool cannot hold a frame ({e}); staging");
                        HostBuffer::zeroed(d.len())
                    }
                    None => HostBuffer::zeroed(d.len()),
                })
            }
        });
    }
    for ordinal in ordinals {
        bind_primary_context(ordinal).map_err(SerializeError::Cuda)?;
        // Declared after `copies`' buffers exist; dropped (synchronized) before we return
        // them or drop them on error.
        let streams = [Stream::new().map_err(SerializeError::Cuda)?, Stream::new().map_err(SerializeError::Cuda)?];
        let result = (|| {
            let mut next = 0usize;
            for (f, dst) in msg.frames.iter().zip(copies.iter_mut()) {
                let (Frame::Device(src), Some(dst)) = (f, dst) else {
                    continue;
                };
                if src.device_ordinal() != ordinal {
                    continue;
                }
                if dst.is_pinned() || pool.is_none() {
                    chunked_dtoh(src, dst, chunk, &streams, &mut next)?;
                } else {
                    staged_dtoh(src, dst, pool, chunk, &streams)?;
                }
            }
            for s in &streams {
                s.synchronize()?;
            }
            Ok::<(), String>(())
        })();
        drop(streams);
        result.map_err(SerializeError::Cuda)?;
    }
    Ok(copies)
}

/// Queues `src` → `dst` chunk by chunk, alternating streams. The caller synchronizes.
fn chunked_dtoh(
    src: &DeviceBuffer,
    dst: &mut HostBuffer,
    chunk: usize,
    streams: &[Stream; 2],
    next: &mut usize,
) -> Result<(), String> {
    let dst = dst.as_mut_slice();
    for (i, part) in dst.chunks_mut(chunk.max(1)).enumerate() {
        let off = (i * chunk) as u64;
        let stream = &streams[*next % 2];
        *next += 1;
        // SAFETY: `src` is live device memory of at least `dst.len()` bytes (same length by
        // construction); `dst` is not touched until the streams are synchronized by the
        // caller, which also happens (Stream::drop) before `dst` can be dropped.
        unsafe { dtoh_async(part, src.device_ptr() + off, stream) }?;
    }
    Ok(())
}

/// `src` → pageable `dst` through a ring of pinned staging chunks: the copy of chunk k+1
/// runs while the CPU empties chunk k. Falls back to direct copies when the pool has no
/// pinned chunk to spare.
fn staged_dtoh(
    src: &DeviceBuffer,
    dst: &mut HostBuffer,
    pool: Option<&PinnedPool>,
    chunk: usize,
    streams: &[Stream; 2],
) -> Result<(), String> {
    let mut slots: Vec<HostBuffer> = Vec::new();
    if let Some(pool) = pool.filter(|p| p.is_pinned()) {
        let want = dst.len().div_ceil(chunk).clamp(1, MAX_STAGING);
        while slots.len() < want {
            match pool.alloc(chunk) {
                Ok(b) => slots.push(b),
                Err(_) => break,
            }
        }
    }
    if slots.is_empty() {
        let mut next = 0;
        chunked_dtoh(src, dst, chunk, streams, &mut next)?;
        return streams.iter().try_for_each(Stream::synchronize);
    }
    let events = (0..slots.len()).map(|_| Event::new()).collect::<Result<Vec<_>, _>>()?;
    let dst = dst.as_mut_slice();
    let k = slots.len();
    let mut pending: VecDeque<(usize, usize, usize)> = VecDeque::with_capacity(k);
    let drain_one =
        |pending: &mut VecDeque<(usize, usize, usize)>, slots: &[HostBuffer], dst: &mut [u8]| -> Result<(), String> {
            if let Some((s, off, n)) = pending.pop_front() {
                events[s].synchronize()?;
                dst[off..off + n].copy_from_slice(&slots[s].as_slice()[..n]);
            }
            Ok(())
        };
    let total = dst.len();
    let mut off = 0;
    let mut i = 0;
    while off < total {
        let n = chunk.min(total - off);
        let s = i % k;
        if pending.len() == k {
            drain_one(&mut pending, &slots, dst)?;
        }
        let stream = &streams[i % 2];
        // SAFETY: `src` holds `total` bytes; slot `s` is not read by the CPU until its
        // event has completed, and the slots outlive the streams' work (we drain every
        // pending slot below, and on error the caller drops the streams — synchronizing
        // them — before these slots are dropped at the end of this function... which is
        // why errors synchronize first).
        let queued = unsafe { dtoh_async(&mut slots[s].as_mut_slice()[..n], src.device_ptr() + off as u64, stream) }
            .and_then(|()| events[s].record(stream));
        if let Err(e) = queued {
            for st in streams {
                let _ = st.synchronize();
            }
            return Err(e);
        }
        pending.push_back((s, off, n));
        off += n;
        i += 1;
    }
    while !pending.is_empty() {
        if let Err(e) = drain_one(&mut pending, &slots, dst) {
            for st in streams {
                let _ = st.synchronize();
            }
            return Err(e);
        }
    }
    Ok(())
}
