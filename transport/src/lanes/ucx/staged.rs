//! One-sided transfers through pinned host memory on the UCX lane, for memory UCX does
//! not move itself: device memory unless both sides' UCX is CUDA-aware, and any memory
//! with `FERRYLINK_UCX_STAGED=1`.
//!
//! The owner grants such memory as `GrantedMemory::Staged` and runs every transfer on
//! it. Each side copies between its own memory and pinned host memory of its own; UCX's
//! RMA moves the bytes between the two pinned buffers, so neither side's UCX ever sees
//! device memory, and the owner's RMA reaches only the initiator's staging buffer:
//! - **put**: the initiator copies its spans, packed one after another in their order,
//!   into a staging buffer it maps for UCX, and describes that (`GrantedMemory::
//!   Staging`, the spans' local offsets now the packed ones) once the copies are done;
//!   the owner gets the bytes into its own pinned buffer, copies them into its memory,
//!   and answers.
//! - **get**: the initiator maps an empty staging buffer and describes it at once; the
//!   owner copies its spans into its pinned buffer, puts them into the initiator's and
//!   flushes, then answers; the initiator copies them into its memory and completes.
//!
//! Bounds are the core's on both sides (the owner checks the spans against its
//! registration and the staging buffer's length); the copies check them again. A staging
//! buffer lives until the owner answered or the connection ended; copies in flight are
//! waited for before any buffer goes back to the pool.

use super::engine::UcxEngine;
use crate::device::{check_staging_pieces, describe, DeviceState, SpanCopies, StagingPiece};
use crate::payload::{LaneEvent, LocalTransfer, PeerTransfer, RegistrationInner};
use ferrylink_memory::{Frame, HostBuffer};
use ferrylink_proto::connection::lane::{DescribedTransfer, LaneFailure};
use ferrylink_proto::wire::{GrantedMemory, TransferOp, WireSpan};
use ferrylink_ucx::{EndpointFlush, Get, Put, RegionKey, Registration, RemoteKey, RmaSpan, UcxEndpoint};
use std::collections::HashMap;
use std::sync::Arc;

/// Bytes one staged transfer may move (its staging buffers are this large at most).
pub(crate) const MAX_STAGED_TRANSFER_BYTES: u64 = 1 << 30;

/// Copies between a registration's memory and a staging buffer: done (host memory,
/// copied at once) or enqueued on the device.
enum Copies {
    Done,
    Device(Box<SpanCopies>),
}

impl Copies {
    /// `Ok(true)` once every copy completed.
    fn poll(&mut self) -> Result<bool, String> {
        match self {
            Copies::Done => Ok(true),
            Copies::Device(c) => c.is_done().map_err(|e| format!("a staging copy failed: {e}")),
        }
    }

    /// Waits for the copies (the memory they use is about to go).
    fn wait(&mut self) {
        if let Copies::Device(c) = self {
            if let Err(e) = c.wait() {
                tracing::warn!("waiting for staging copies failed: {e}");
            }
        }
    }
}

/// Copies `pieces` (offset in `memory`, offset in the host buffer, bytes) between a
/// registration's memory and the `host_len` bytes at `host`: into the host memory when
/// `to_host`, else out of it.
///
/// # Safety
/// `host..host + host_len` must stay valid, and not be used by anyone else, until the
/// returned copies completed or were waited for.
unsafe fn copy_pieces(
    device: &DeviceState,
    memory: &Frame,
    (host, host_len): (*mut u8, usize),
    pieces: &[StagingPiece],
    to_host: bool,
) -> Result<Copies, String> {
    match memory {
        Frame::Device(d) => {
            // SAFETY: the caller's promise on the host memory; `d` is held by the caller.
            let copies = unsafe { device.enqueue_staging_copies(d, (host, host_len), pieces, to_host) };
            copies.map(|c| Copies::Device(Box::new(c))).map_err(|e| format!("staging copies: {}", describe(e)))
        }
        Frame::Host(h) => {
            // Registered host memory is shared by design: peers write it through their
            // mappings, so it is written here through a pointer as well.
            let mine = h.as_slice().as_ptr().cast_mut();
            check_staging_pieces(pieces, h.len(), host_len)?;
            for &(at, host_at, len) in pieces {
                // SAFETY: both ranges were checked against their memory just above; the
                // two buffers are distinct allocations, so they do not overlap.
                unsafe {
                    let (mine, theirs) = (mine.add(at as usize), host.add(host_at as usize));
                    let (src, dst) = if to_host { (mine, theirs) } else { (theirs, mine) };
                    std::ptr::copy_nonoverlapping(src, dst, len as usize);
                }
            }
            Ok(Copies::Done)
        }
    }
}

/// The pieces of `spans` packed in their order: (offset in this side's memory, offset
/// in the packed buffer, bytes), and the packed buffer's length. `initiator` picks the
/// spans' side: their local offsets (the initiator's memory) or remote ones (the owner's).
fn pack(spans: &[WireSpan], initiator: bool) -> Result<(Vec<StagingPiece>, u64), String> {
    let mut pieces = Vec::with_capacity(spans.len());
    let mut packed = 0u64;
    for s in spans {
        let at = if initiator { s.local_offset } else { s.remote_offset };
        pieces.push((at, packed, s.len));
        packed = packed.checked_add(s.len).ok_or("a staged transfer's length overflows")?;
    }
    if packed > MAX_STAGED_TRANSFER_BYTES {
        return Err(format!(
            "a transfer through staging memory moves at most {MAX_STAGED_TRANSFER_BYTES} bytes, not {packed} \
             (split it, or use a UCX that moves this memory itself)"
        ));
    }
    Ok((pieces, packed))
}

/// RMA spans between this side's packed buffer and the peer's memory, the peer's offset
/// of each piece given by `peer_offsets`; neighbours adjacent on both sides are merged
/// (a packed peer buffer becomes one span).
fn rma_spans(pieces: &[StagingPiece], peer_offsets: impl Iterator<Item = u64>) -> Vec<RmaSpan> {
    let mut spans: Vec<RmaSpan> = Vec::new();
    for (&(_, packed, len), peer) in pieces.iter().zip(peer_offsets) {
        if let Some(last) = spans.last_mut() {
            if last.local_offset as u64 + last.len as u64 == packed && last.remote_offset + last.len as u64 == peer {
                last.len += len as usize;
                continue;
            }
        }
        spans.push(RmaSpan::new(packed as usize, peer, len as usize));
    }
    spans
}

/// Pinned staging memory of `len` bytes.
fn staging(engine: &UcxEngine, len: u64) -> Result<HostBuffer, String> {
    let pool = engine.transfer_staging()?;
    pool.alloc(len as usize).map_err(|e| format!("pinned staging memory for a transfer: {e}"))
}

/// The host address and length of `buf`.
fn host_range(buf: &mut HostBuffer) -> (*mut u8, usize) {
    let slice = buf.as_mut_slice();
    (slice.as_mut_ptr(), slice.len())
}

/// A transfer this side initiated on a staged grant.
struct Initiated {
    op: TransferOp,
    /// The user's memory (held until the transfer ended).
    local: Arc<RegistrationInner>,
    pieces: Vec<StagingPiece>,
    /// The staging buffer, mapped for the owner's RMA.
    staging: Registration<HostBuffer>,
    step: InitiatedStep,
}

enum InitiatedStep {
    /// A put's bytes being copied into the staging buffer; then this description goes.
    Staging(Copies, Option<Box<DescribedTransfer>>),
    /// The owner was asked.
    AtOwner,
    /// A get's bytes being copied out of the staging buffer into the user's memory.
    Unstaging(Copies),
}

impl Drop for Initiated {
    fn drop(&mut self) {
        if let InitiatedStep::Staging(c, _) | InitiatedStep::Unstaging(c) = &mut self.step {
            c.wait();
        }
    }
}

/// A transfer the peer asked this side (the owner) to run on a staged grant.
struct Running {
    registration: Arc<RegistrationInner>,
    pieces: Vec<StagingPiece>,
    /// Between this side's packed buffer and the initiator's staging buffer.
    spans: Vec<RmaSpan>,
    /// The initiator's staging buffer.
    key: RemoteKey,
    step: RunningStep,
}

enum RunningStep {
    /// A put: the initiator's bytes being fetched.
    Fetching(Get<HostBuffer>),
    /// A put: the fetched bytes being copied into the registration.
    Storing(HostBuffer, Copies),
    /// A get: the registration's bytes being copied into the packed buffer.
    Loading(HostBuffer, Copies),
    /// A get: the bytes being put into the initiator's staging buffer, and the flush
    /// behind them (the bytes are there once both completed).
    Sending(Put<HostBuffer>, EndpointFlush),
    /// Between steps (never seen by `poll`).
    Moved,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let RunningStep::Storing(_, c) | RunningStep::Loading(_, c) = &mut self.step {
            c.wait();
        }
    }
}

/// The staged transfers of one UCX connection.
#[derive(Default)]
pub(super) struct StagedTransfers {
    /// Grants of the peer's that this side imported as staged.
    pub grants: std::collections::HashSet<u64>,
    initiated: HashMap<u64, Initiated>,
    running: HashMap<u64, Running>,
}

impl StagedTransfers {
    pub fn busy(&self) -> bool {
        !self.initiated.is_empty() || !self.running.is_empty()
    }

    /// The connection ended: copies in flight are waited for, buffers go back.
    pub fn clear(&mut self) {
        self.initiated.clear();
        self.running.clear();
        self.grants.clear();
    }

    /// Initiator: prepares transfer `id` on a staged grant and describes it (a put: once
    /// its bytes are in the staging buffer, reported by `poll`).
    pub fn describe(
        &mut self,
        (engine, device): (&UcxEngine, &DeviceState),
        id: u64,
        t: &LocalTransfer<'_>,
    ) -> Result<Option<DescribedTransfer>, String> {
        let (pieces, len) = pack(t.spans, true)?;
        let buf = staging(engine, len)?;
        let staging = engine.register(buf).map_err(|e| format!("mapping a staging buffer for UCX: {e}"))?;
        let key = staging.region_key().map_err(|e| format!("packing a staging buffer's UCX key: {e}"))?;
        let memory = GrantedMemory::Staging { address: key.address, rkey: key.rkey, device: t.local.is_device() };
        let spans = t.spans.iter().zip(&pieces).map(|(s, &(_, packed, _))| WireSpan { local_offset: packed, ..*s });
        let described = DescribedTransfer { memory, len, spans: Some(spans.collect()), regions: Vec::new() };
        let (step, now) = match t.op {
            TransferOp::Get => (InitiatedStep::AtOwner, Some(described)),
            TransferOp::Put => {
                let host = (staging.address() as usize as *mut u8, staging.len());
                // SAFETY: the staging buffer stays in `self.initiated` (mapped, owned by
                // its registration) until the copies completed or `Initiated::drop`
                // waited for them; nobody reads it before the description goes out.
                let copies = unsafe { copy_pieces(device, &t.local.frame, host, &pieces, true)? };
                match copies {
                    Copies::Done => (InitiatedStep::AtOwner, Some(described)),
                    copies => (InitiatedStep::Staging(copies, Some(Box::new(described))), None),
                }
            }
        };
        let initiated = Initiated { op: t.op, local: t.local.clone(), pieces, staging, step };
        self.initiated.insert(id, initiated);
        tracing::trace!(spans = t.spans.len(), bytes = len, "staged transfer prepared");
        Ok(now)
    }

    /// Initiator: the owner answered transfer `id`. Whether it is over for this side.
    pub fn answered(&mut self, device: &DeviceState, id: u64, done: bool) -> Result<bool, String> {
        let Some(mut t) = self.initiated.remove(&id) else { return Ok(true) };
        if !done || t.op == TransferOp::Put {
            return Ok(true);
        }
        let host = (t.staging.address() as usize as *mut u8, t.staging.len());
        // SAFETY: the owner finished writing the staging buffer (it answered after its
        // flush); the buffer stays in `self.initiated` until the copies completed or
        // `Initiated::drop` waited for them.
        let copies = unsafe { copy_pieces(device, &t.local.frame, host, &t.pieces, false)? };
        if let Copies::Done = copies {
            return Ok(true);
        }
        t.step = InitiatedStep::Unstaging(copies);
        self.initiated.insert(id, t);
        Ok(false)
    }

    /// Owner: starts transfer `id` the peer asked for, between this side's registration
    /// and the peer's staging buffer.
    pub fn run(
        &mut self,
        (engine, device, endpoint): (&UcxEngine, &DeviceState, &UcxEndpoint),
        id: u64,
        t: &PeerTransfer<'_>,
    ) -> Result<(), LaneFailure> {
        let GrantedMemory::Staging { address, rkey, .. } = t.peer_memory else {
            return Err(LaneFailure::peer("a transfer on staged memory without a staging buffer"));
        };
        let region = RegionKey { address: *address, length: t.peer_len, rkey: rkey.clone() };
        let key =
            endpoint.unpack_rkey(&region).map_err(|e| LaneFailure::peer(format!("the staging buffer's key: {e}")))?;
        let (pieces, len) = pack(t.spans, false).map_err(LaneFailure::local)?;
        let spans = rma_spans(&pieces, t.spans.iter().map(|s| s.local_offset));
        let mut buf = staging(engine, len).map_err(LaneFailure::local)?;
        let step = match t.op {
            TransferOp::Put => match endpoint.get_spans(&key, buf, &spans) {
                Ok(get) => RunningStep::Fetching(get),
                Err(rejected) => {
                    return Err(LaneFailure::local(format!("fetching the staged bytes: {}", rejected.error)))
                }
            },
            TransferOp::Get => {
                let host = host_range(&mut buf);
                // SAFETY: `buf` moves into the step kept in `self.running` (a move of the
                // handle, not of the memory) until the copies completed or
                // `Running::drop` waited for them.
                let copies = unsafe { copy_pieces(device, &t.registration.frame, host, &pieces, true) };
                RunningStep::Loading(buf, copies.map_err(LaneFailure::local)?)
            }
        };
        let running = Running { registration: t.registration.clone(), pieces, spans, key, step };
        self.running.insert(id, running);
        tracing::trace!(spans = t.spans.len(), bytes = len, "staged peer transfer started");
        Ok(())
    }

    /// Moves every staged transfer on; reports those that reached the core's next step.
    pub fn poll(&mut self, (device, endpoint): (&DeviceState, Option<&UcxEndpoint>), events: &mut Vec<LaneEvent>) {
        let mut ended = Vec::new();
        for (&id, t) in self.initiated.iter_mut() {
            match &mut t.step {
                InitiatedStep::Staging(copies, described) => match copies.poll() {
                    Ok(false) => {}
                    Ok(true) => {
                        let result = described.take().map(|d| *d).ok_or_else(|| "described twice".to_owned());
                        t.step = InitiatedStep::AtOwner;
                        events.push(LaneEvent::TransferDescribed { id, result });
                    }
                    Err(reason) => {
                        // Never described: the owner never sees it.
                        ended.push(id);
                        events.push(LaneEvent::TransferDescribed { id, result: Err(reason) });
                    }
                },
                InitiatedStep::Unstaging(copies) => match copies.poll() {
                    Ok(false) => {}
                    result => {
                        ended.push(id);
                        events.push(LaneEvent::TransferFinished { id, result: result.map(|_| ()) });
                    }
                },
                InitiatedStep::AtOwner => {}
            }
        }
        for id in ended {
            self.initiated.remove(&id);
        }
        let mut finished = Vec::new();
        for (&id, r) in self.running.iter_mut() {
            match r.advance(device, endpoint) {
                Ok(false) => {}
                Ok(true) => finished.push((id, Ok(()))),
                Err(reason) => finished.push((id, Err(reason))),
            }
        }
        for (id, result) in finished {
            self.running.remove(&id);
            events.push(LaneEvent::PeerTransferFinished { id, result });
        }
    }
}

impl Running {
    /// Moves this transfer on as far as it goes now; `Ok(true)` once done.
    fn advance(&mut self, device: &DeviceState, endpoint: Option<&UcxEndpoint>) -> Result<bool, String> {
        loop {
            let next = match std::mem::replace(&mut self.step, RunningStep::Moved) {
                RunningStep::Fetching(mut get) => match get.poll() {
                    None => {
                        self.step = RunningStep::Fetching(get);
                        return Ok(false);
                    }
                    Some(Err(status)) => return Err(format!("fetching the staged bytes failed: {status}")),
                    Some(Ok(_)) => {
                        let mut buf = get.into_buf().map_err(|_| "the fetched staging buffer was lost")?;
                        let host = host_range(&mut buf);
                        // SAFETY: `buf` moves into the step (the handle, not the memory)
                        // until the copies completed or `Running::drop` waited for them.
                        let copies =
                            unsafe { copy_pieces(device, &self.registration.frame, host, &self.pieces, false)? };
                        RunningStep::Storing(buf, copies)
                    }
                },
                RunningStep::Storing(buf, mut copies) => {
                    let polled = copies.poll();
                    self.step = RunningStep::Storing(buf, copies);
                    return polled;
                }
                RunningStep::Loading(buf, mut copies) => match copies.poll() {
                    Ok(true) => {
                        let endpoint = endpoint.ok_or("the UCX endpoint is closed")?;
                        let put = endpoint.put_spans(&self.key, buf, &self.spans);
                        let put = put.map_err(|r| format!("sending the staged bytes: {}", r.error))?;
                        let flush = endpoint.flush().map_err(|e| format!("flushing the staged bytes: {e}"))?;
                        RunningStep::Sending(put, flush)
                    }
                    polled => {
                        self.step = RunningStep::Loading(buf, copies);
                        return polled;
                    }
                },
                RunningStep::Sending(mut put, mut flush) => {
                    let put_done = match put.poll() {
                        None => false,
                        Some(Ok(_)) => true,
                        Some(Err(status)) => return Err(format!("sending the staged bytes failed: {status}")),
                    };
                    let flushed = match flush.poll() {
                        None => false,
                        Some(Ok(())) => true,
                        Some(Err(status)) => return Err(format!("flushing the staged bytes failed: {status}")),
                    };
                    self.step = RunningStep::Sending(put, flush);
                    return Ok(put_done && flushed);
                }
                RunningStep::Moved => return Err("a staged transfer lost its step".into()),
            };
            self.step = next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(local_offset: u64, remote_offset: u64, len: u64) -> WireSpan {
        WireSpan { local_offset, remote_offset, len }
    }

    #[test]
    fn spans_pack_in_their_order_from_either_side() {
        let spans = [span(100, 7, 10), span(0, 50, 5), span(40, 0, 1)];
        assert_eq!(pack(&spans, true).unwrap(), (vec![(100, 0, 10), (0, 10, 5), (40, 15, 1)], 16));
        assert_eq!(pack(&spans, false).unwrap(), (vec![(7, 0, 10), (50, 10, 5), (0, 15, 1)], 16));
    }

    #[test]
    fn transfers_past_the_staging_limit_are_refused_with_the_way_out() {
        let e = pack(&[span(0, 0, MAX_STAGED_TRANSFER_BYTES), span(0, 0, 1)], true).unwrap_err();
        assert!(e.contains("split it"), "{e}");
        assert!(pack(&[span(0, 0, u64::MAX), span(0, 0, 1)], true).is_err(), "an overflowing sum");
        assert!(pack(&[span(0, 0, MAX_STAGED_TRANSFER_BYTES)], true).is_ok());
    }

    #[test]
    fn rma_spans_merge_only_pieces_adjacent_on_both_sides() {
        let pieces = [(7, 0, 10), (50, 10, 5), (0, 15, 1)];
        // The peer packed them the same way: one span.
        assert_eq!(rma_spans(&pieces, [0, 10, 15].into_iter()), vec![RmaSpan::new(0, 0, 16)]);
        // A gap on the peer's side splits them.
        let split = rma_spans(&pieces, [0, 10, 20].into_iter());
        assert_eq!(split, vec![RmaSpan::new(0, 0, 15), RmaSpan::new(15, 20, 1)]);
        let reversed = rma_spans(&pieces, [15, 5, 0].into_iter());
        assert_eq!(reversed.len(), 3);
    }

    #[test]
    fn host_copies_move_the_pieces_and_refuse_any_out_of_bounds() {
        let memory = Frame::Host(HostBuffer::from_vec((0..32).collect()));
        let mut staging = vec![0u8; 8];
        let device = DeviceState::new(&crate::config::Config::default(), None);
        let host = (staging.as_mut_ptr(), staging.len());
        // SAFETY: `staging` outlives the call; host copies complete inside it.
        let copied = unsafe { copy_pieces(&device, &memory, host, &[(30, 0, 2), (4, 2, 3)], true) };
        assert!(matches!(copied, Ok(Copies::Done)));
        assert_eq!(&staging[..5], &[30, 31, 4, 5, 6]);
        // SAFETY: as above.
        let past = unsafe { copy_pieces(&device, &memory, host, &[(31, 0, 2)], true) };
        assert!(past.is_err(), "past the memory");
        // SAFETY: as above.
        let past = unsafe { copy_pieces(&device, &memory, host, &[(0, 7, 2)], false) };
        assert!(past.is_err(), "past the staging buffer");
        // Every piece is checked before any is copied.
        let before = staging.clone();
        let host = (staging.as_mut_ptr(), staging.len());
        // SAFETY: as above.
        let refused = unsafe { copy_pieces(&device, &memory, host, &[(8, 6, 2), (31, 0, 2)], true) };
        assert!(refused.is_err());
        assert_eq!(staging, before, "nothing was copied");
    }
}
