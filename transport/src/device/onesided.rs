//! One-sided transfers' device copies: between a buffer of this process (a registration)
//! and a peer's memory opened for it (a grant kept open, or the initiator's memory opened
//! for one transfer), span by span, on the local device's stream, ordered after the work
//! queued on the local buffer's producer stream; an event after them is polled.

use super::completion::Completion;
use super::gate::GateSignal;
use super::peer_memory::Mapping;
use super::{DeviceFrameError, DeviceState, PeerMemory, PerDevice};
use ferrylink_memory::cuda::copy_kernel::copy_dtod_async;
use ferrylink_memory::cuda::span_kernel::{launch_listed, ListedSpans, SpanBatch, SpanTable};
use ferrylink_memory::cuda::CudaResult;
use ferrylink_memory::DeviceBuffer;
use ferrylink_proto::wire::{DeviceFrameDescriptor, WireSpan};
use std::sync::Arc;

/// The copies of one transfer, enqueued: done when `done` says so. What they read and
/// write must live until then (the callers hold it; the span kernel's table is here;
/// staging copies have none).
pub(crate) struct SpanCopies {
    done: Completion,
    _table: Option<SpanTable>,
}

impl SpanCopies {
    pub(super) fn new(done: Completion, table: Option<SpanTable>) -> Self {
        Self { done, _table: table }
    }

    /// Whether every copy completed (a completion flag or event; never blocks).
    pub fn is_done(&mut self) -> CudaResult<bool> {
        self.done.is_done()
    }

    /// Waits for the copies (a failing connection's last moment).
    pub fn wait(&mut self) -> CudaResult<()> {
        self.done.wait()
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

impl DeviceState {
    /// Enqueues `spans` between `local` and `peer` (opened from `desc`, whose offset the
    /// spans' peer offsets are relative to) in `direction`. `spans` are a transfer's, seen
    /// from the side that copies ([`copy_span`]: `initiator_copies` when this side
    /// initiated it). Bounds were checked by the caller against both lengths; the pieces
    /// are checked again against the opened memory. Pieces on this device go into one
    /// span-kernel batch, written as they are found; pieces on another device (rare) are
    /// copied one by one on the same stream.
    ///
    /// `gate`: the copies' end writes that gate word (on the device it was registered
    /// with; elsewhere it is not used and the copies' completion is this side's own).
    pub fn enqueue_span_copies(
        &self,
        local: &DeviceBuffer,
        (peer, desc): (&PeerMemory, &DeviceFrameDescriptor),
        (spans, initiator_copies): (&[WireSpan], bool),
        direction: Direction,
        gate: Option<&GateSignal>,
    ) -> Result<SpanCopies, DeviceFrameError> {
        let dev = self.device(local.device_ordinal())?;
        let gate = gate.filter(|g| g.device() == dev.gpu.ordinal());
        let ordinal = local.device_ordinal();
        let contiguous = peer.contiguous().filter(|m| m.device_ordinal == ordinal);
        if let (Some(mapping), [span]) = (contiguous, spans) {
            // One span is one copy: no table (a batch of one would take a pinned one and
            // not use it).
            let entry = entry_of(local, mapping, desc.offset, copy_span(span, initiator_copies), direction)?;
            self.order_after_target_producer(&dev, local, &dev.stream)?;
            // SAFETY: the entry lies in the opened peer memory and the local buffer
            // (checked just above); the caller keeps both until the completion.
            return unsafe { enqueue_one_copy(&dev, entry, gate, local.producer_stream().is_none()) };
        }
        let mut batch = SpanBatch::with_capacity(&dev.gpu, spans.len());
        tracing::trace!("one-sided batch table taken");
        let mut elsewhere = Vec::new();
        match contiguous {
            Some(mapping) => {
                list_contiguous(&mut batch, local, mapping, desc.offset, (spans, initiator_copies), direction)?
            }
            None => {
                list_pieces(&mut batch, &mut elsewhere, local, peer, desc.offset, (spans, initiator_copies), direction)?
            }
        }
        tracing::trace!(pieces = batch.len() + elsewhere.len(), "one-sided pieces listed");
        self.order_after_target_producer(&dev, local, &dev.stream)?;
        tracing::trace!("one-sided copies ordered after the local buffer's producer");
        if let Some(entry) = batch.only_entry().filter(|_| elsewhere.is_empty()) {
            let may_linger = local.producer_stream().is_none();
            // SAFETY: the entry lies in the opened peer memory and the local buffer
            // (checked while listing it); the caller keeps both until the completion.
            if let Some(done) = unsafe { Completion::signalled_copy(&dev, entry, gate, may_linger) }? {
                tracing::trace!(spans = spans.len(), "one-sided copies enqueued");
                return Ok(SpanCopies::new(done, None));
            }
        }
        // SAFETY: every piece lies in the opened peer memory and in the local buffer
        // (checked while listing them); the batch's pieces are all on this
        // device; destinations do not overlap (the spans were checked); the caller keeps
        // both sides until the completion recorded below is seen, the table lives in the
        // returned copies.
        let enqueued = unsafe { batch.launch(&dev.stream) }.map_err(DeviceFrameError::from).and_then(|table| {
            elsewhere
                .iter()
                .try_for_each(|&(dst, dst_ordinal, src, src_ordinal, len)| {
                    // SAFETY: as above, one piece at a time across devices.
                    unsafe { super::copy_between(dst, dst_ordinal, src, src_ordinal, len as usize, &dev.stream) }
                })
                .map(|()| table)
        });
        let table = match enqueued {
            Ok(table) => table,
            Err(e) => {
                // Copies already enqueued use what the caller holds: let them finish first.
                super::synchronize_after_failure(&dev.stream);
                return Err(e);
            }
        };
        let done = Completion::after_copies_signalling(&dev, gate)?;
        tracing::trace!(spans = spans.len(), "one-sided copies enqueued");
        Ok(SpanCopies::new(done, Some(table)))
    }
}

impl DeviceState {
    /// Lists `spans` once for a prepared transfer (as [`DeviceState::enqueue_span_copies`]
    /// would, checked the same way) when the peer's memory is one mapping on the local
    /// buffer's device: the table is kept and launched by each run
    /// ([`DeviceState::enqueue_listed`]). `None`: memory in pieces, listed by each run.
    pub fn list_for_prepared(
        &self,
        local: &DeviceBuffer,
        peer: &PeerMemory,
        desc: &DeviceFrameDescriptor,
        (spans, initiator_copies): (&[WireSpan], bool),
        direction: Direction,
    ) -> Result<Option<Arc<ListedSpans>>, DeviceFrameError> {
        let dev = self.device(local.device_ordinal())?;
        let Some(mapping) = peer.contiguous().filter(|m| m.device_ordinal == local.device_ordinal()) else {
            return Ok(None);
        };
        let mut batch = SpanBatch::with_capacity(&dev.gpu, spans.len());
        list_contiguous(&mut batch, local, mapping, desc.offset, (spans, initiator_copies), direction)?;
        tracing::trace!(pieces = batch.len(), "prepared transfer's pieces listed");
        Ok(Some(batch.keep()?))
    }

    /// Enqueues the copies of a kept table ([`DeviceState::list_for_prepared`]) into or
    /// out of `local`, after the work queued on its producer stream.
    /// `gate` as for [`DeviceState::enqueue_span_copies`].
    pub fn enqueue_listed(
        &self,
        local: &DeviceBuffer,
        listed: &Arc<ListedSpans>,
        gate: Option<&GateSignal>,
    ) -> Result<SpanCopies, DeviceFrameError> {
        let dev = self.device(local.device_ordinal())?;
        let gate = gate.filter(|g| g.device() == dev.gpu.ordinal());
        self.order_after_target_producer(&dev, local, &dev.stream)?;
        if let Some(entry) = listed.only_entry() {
            let may_linger = local.producer_stream().is_none();
            // SAFETY: the entry was checked against the local buffer and the peer's
            // mapping when listed; the caller keeps both until the completion.
            if let Some(done) = unsafe { Completion::signalled_copy(&dev, entry, gate, may_linger) }? {
                tracing::trace!(entries = 1, "one-sided copies enqueued");
                return Ok(SpanCopies::new(done, None));
            }
        }
        // SAFETY: every entry was checked against the local buffer and the peer's mapping
        // when listed; the caller keeps both (the registration, the grant's or the kept
        // mapping) until the copies completed, and the returned copies hold the table;
        // destinations do not overlap (the spans were checked when prepared).
        let table = match unsafe { launch_listed(listed, &dev.stream) } {
            Ok(table) => table,
            Err(e) => {
                super::synchronize_after_failure(&dev.stream);
                return Err(e.into());
            }
        };
        let done = Completion::after_copies_signalling(&dev, gate)?;
        tracing::trace!(entries = listed.len(), "one-sided copies enqueued");
        Ok(SpanCopies::new(done, Some(table)))
    }
}

/// Enqueues the copy `(dst, src, len)` on `dev`'s stream, signalling `gate` (or a flag of
/// this side's) at its end: the lingering kernel where it is on and `may_linger`, else
/// one block that writes the word itself where it applies, else the copy then the word.
///
/// # Safety
/// Both ranges must be device memory of `dev` (or mapped into its context) that the
/// caller keeps until the returned copies completed; they must not overlap.
unsafe fn enqueue_one_copy(
    dev: &Arc<PerDevice>,
    (dst, src, len): (u64, u64, u64),
    gate: Option<&GateSignal>,
    may_linger: bool,
) -> Result<SpanCopies, DeviceFrameError> {
    // SAFETY: the caller's contract.
    if let Some(done) = unsafe { Completion::signalled_copy(dev, (dst, src, len), gate, may_linger) }? {
        tracing::trace!(spans = 1, "one-sided copies enqueued");
        return Ok(SpanCopies::new(done, None));
    }
    if len > 0 {
        // SAFETY: the caller's contract. A failed enqueue left nothing behind to wait for.
        unsafe { copy_dtod_async(dst, src, len as usize, &dev.stream) }?;
    }
    let done = Completion::after_copies_signalling(dev, gate)?;
    tracing::trace!(spans = 1, "one-sided copies enqueued");
    Ok(SpanCopies::new(done, None))
}

/// A piece list's element off the batch's device: (dst, dst device, src, src device, len).
type ElsewherePiece = (u64, usize, u64, usize, u64);

/// Whether `local_offset..+len` lies in `local`; the error says which span does not.
fn check_local(local: &DeviceBuffer, local_offset: u64, len: u64) -> Result<(), DeviceFrameError> {
    if local_offset.checked_add(len).is_none_or(|end| end > local.len() as u64) {
        return Err(DeviceFrameError::Local(format!("a span past the local buffer ({local_offset}+{len})")));
    }
    Ok(())
}

/// Lists `spans` into `batch` when the peer's memory is one mapping on the batch's
/// device: one bounds check a side and one entry per span, no piece list (1000 spans
/// went through `pieces_into` in 26–30 µs).
fn list_contiguous(
    batch: &mut SpanBatch,
    local: &DeviceBuffer,
    peer: Mapping,
    base_offset: u64,
    (spans, initiator_copies): (&[WireSpan], bool),
    direction: Direction,
) -> Result<(), DeviceFrameError> {
    batch.push_all(spans.len(), |i| {
        entry_of(local, peer, base_offset, copy_span(&spans[i], initiator_copies), direction)
    })
}

/// The copy `(dst, src, len)` of one span `(local offset, peer offset, len)` between
/// `local` and the peer's memory mapped as one piece, each side's bounds checked.
fn entry_of(
    local: &DeviceBuffer,
    peer: Mapping,
    base_offset: u64,
    (local_offset, peer_offset, len): (u64, u64, u64),
    direction: Direction,
) -> Result<(u64, u64, u64), DeviceFrameError> {
    check_local(local, local_offset, len)?;
    let theirs = peer.at(peer_start(base_offset, peer_offset)?, len)?;
    let mine = local.device_ptr() + local_offset;
    Ok(match direction {
        Direction::LocalToPeer => (theirs, mine, len),
        Direction::PeerToLocal => (mine, theirs, len),
    })
}

/// A span's offset in the peer's memory: the descriptor's offset plus the span's.
fn peer_start(base_offset: u64, peer_offset: u64) -> Result<u64, DeviceFrameError> {
    base_offset
        .checked_add(peer_offset)
        .ok_or_else(|| DeviceFrameError::BadDescriptor(format!("{base_offset}+{peer_offset} wraps around")))
}

/// Lists `spans` piece by piece (VMM chunks, or memory on another device): pieces on
/// the batch's device into `batch`, the others into `elsewhere`.
fn list_pieces(
    batch: &mut SpanBatch,
    elsewhere: &mut Vec<ElsewherePiece>,
    local: &DeviceBuffer,
    peer: &PeerMemory,
    base_offset: u64,
    (spans, initiator_copies): (&[WireSpan], bool),
    direction: Direction,
) -> Result<(), DeviceFrameError> {
    let ordinal = local.device_ordinal();
    let mut peer_pieces = Vec::with_capacity(4);
    for span in spans {
        let (local_offset, peer_offset, len) = copy_span(span, initiator_copies);
        check_local(local, local_offset, len)?;
        let mut at = local.device_ptr() + local_offset;
        peer_pieces.clear();
        peer.pieces_into(peer_start(base_offset, peer_offset)?, len, &mut peer_pieces)?;
        for piece in &peer_pieces {
            let (dst, dst_device, src, src_device) = match direction {
                Direction::LocalToPeer => (piece.ptr, piece.device_ordinal, at, ordinal),
                Direction::PeerToLocal => (at, ordinal, piece.ptr, piece.device_ordinal),
            };
            if piece.device_ordinal == ordinal {
                batch.push(dst, src, piece.len);
            } else {
                elsewhere.push((dst, dst_device, src, src_device, piece.len));
            }
            at += piece.len;
        }
    }
    Ok(())
}

/// A transfer's span as (local offset, peer offset, length), seen from the side that
/// copies: `initiator_copies` when the initiator copies (its local memory is "local"),
/// else the owner copies (its registration, the transfer's remote side, is "local").
pub(crate) fn copy_span(s: &WireSpan, initiator_copies: bool) -> (u64, u64, u64) {
    if initiator_copies {
        (s.local_offset, s.remote_offset, s.len)
    } else {
        (s.remote_offset, s.local_offset, s.len)
    }
}

/// [`copy_span`] of each span.
pub(crate) fn copy_spans(spans: &[WireSpan], initiator_copies: bool) -> Vec<(u64, u64, u64)> {
    spans.iter().map(|s| copy_span(s, initiator_copies)).collect()
}
