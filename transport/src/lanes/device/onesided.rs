//! One-sided transfers' device copies: between a buffer of this process (a registration)
//! and a peer's memory opened for it (a grant kept open, or the initiator's memory opened
//! for one transfer), span by span, on the local device's stream, ordered after the work
//! queued on the local buffer's producer stream; an event after them is polled.

use super::{DeviceFrameError, DeviceLane, PeerMemory};
use crate::wire::{DeviceFrameDescriptor, WireSpan};
use ferrylink_memory::cuda::span_kernel::{self, SpanTable};
use ferrylink_memory::cuda::{CudaResult, PooledEvent};
use ferrylink_memory::DeviceBuffer;

/// The copies of one transfer, enqueued: done when `done` completed. What they read and
/// write must live until then (the callers hold it; the span kernel's table is here).
pub(crate) struct SpanCopies {
    done: PooledEvent,
    _table: Option<SpanTable>,
}

impl SpanCopies {
    /// Whether every copy completed (`cuEventQuery`; never blocks).
    pub fn is_done(&self) -> CudaResult<bool> {
        self.done.query()
    }

    /// Waits for the copies (a failing connection's last moment).
    pub fn wait(&self) -> CudaResult<()> {
        self.done.synchronize()
    }
}

/// Which way a transfer's bytes go, as the copying side sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// From the local buffer into the peer's memory.
    LocalToPeer,
    /// From the peer's memory into the local buffer.
    PeerToLocal,
}

impl DeviceLane {
    /// Enqueues `spans` between `local` and `peer` (opened from `desc`, whose offset the
    /// spans' peer offsets are relative to) in `direction`. `spans` are in the order
    /// they name: `local_offset` into `local`, `peer_offset` into the peer's memory (the
    /// caller maps a transfer's local/remote offsets onto these). Bounds were checked by
    /// the caller against both lengths; the pieces are checked again against the opened
    /// memory.
    pub fn enqueue_span_copies(
        &self,
        local: &DeviceBuffer,
        peer: &PeerMemory,
        desc: &DeviceFrameDescriptor,
        spans: &[(u64, u64, u64)],
        direction: Direction,
    ) -> Result<SpanCopies, DeviceFrameError> {
        let dev = self.device(local.device_ordinal())?;
        let ordinal = local.device_ordinal();
        // Every piece as (dst, dst device, src, src device, len); bounds checked. One
        // buffer of peer pieces for all spans (no allocation per span).
        let mut pieces = Vec::with_capacity(spans.len());
        let mut peer_pieces = Vec::with_capacity(4);
        for &(local_offset, peer_offset, len) in spans {
            if local_offset.checked_add(len).is_none_or(|end| end > local.len() as u64) {
                return Err(DeviceFrameError::Local(format!("a span past the local buffer ({local_offset}+{len})")));
            }
            let mut at = local.device_ptr() + local_offset;
            peer_pieces.clear();
            peer.pieces_into(desc.offset + peer_offset, len, &mut peer_pieces)?;
            for piece in &peer_pieces {
                pieces.push(match direction {
                    Direction::LocalToPeer => (piece.ptr, piece.device_ordinal, at, ordinal, piece.len),
                    Direction::PeerToLocal => (at, ordinal, piece.ptr, piece.device_ordinal, piece.len),
                });
                at += piece.len;
            }
        }
        tracing::trace!(pieces = pieces.len(), "one-sided pieces listed");
        self.order_after_target_producer(&dev, local, &dev.stream)?;
        tracing::trace!("one-sided copies ordered after the local buffer's producer");
        let enqueued = if pieces.iter().all(|p| p.1 == ordinal && p.3 == ordinal) {
            let triples: Vec<(u64, u64, u64)> = pieces.iter().map(|p| (p.0, p.2, p.4)).collect();
            // SAFETY: every piece lies in the opened peer memory (checked by `pieces`) and
            // in the local buffer (checked above), all on this device; destinations do not
            // overlap (the spans were checked); the caller keeps both sides until the event
            // recorded below completed, the table lives in the returned copies.
            unsafe { span_kernel::copy_spans_async(&triples, &dev.stream) }.map(Some).map_err(DeviceFrameError::from)
        } else {
            pieces
                .iter()
                .try_for_each(|&(dst, dst_ordinal, src, src_ordinal, len)| {
                    // SAFETY: as above, one piece at a time across devices.
                    unsafe { super::copy_between(dst, dst_ordinal, src, src_ordinal, len as usize, &dev.stream) }
                })
                .map(|()| None)
        };
        let table = match enqueued {
            Ok(table) => table,
            Err(e) => {
                // Copies already enqueued use what the caller holds: let them finish first.
                super::synchronize_after_failure(&dev.stream);
                return Err(e);
            }
        };
        let done = dev.marks.acquire()?;
        done.record(&dev.stream)?;
        tracing::trace!(spans = spans.len(), pieces = pieces.len(), "one-sided copies enqueued");
        Ok(SpanCopies { done, _table: table })
    }
}

/// A transfer's spans as (local offset, peer offset, length), seen from the side that
/// copies: `initiator_copies` when the initiator copies (its local memory is "local"),
/// else the owner copies (its registration, the transfer's remote side, is "local").
pub(crate) fn copy_spans(spans: &[WireSpan], initiator_copies: bool) -> Vec<(u64, u64, u64)> {
    spans
        .iter()
        .map(|s| {
            if initiator_copies {
                (s.local_offset, s.remote_offset, s.len)
            } else {
                (s.remote_offset, s.local_offset, s.len)
            }
        })
        .collect()
}
