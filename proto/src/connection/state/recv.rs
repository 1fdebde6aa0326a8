//! [`RecvSide`]: the receiving side of one connection: parked messages, posted
//! receives, messages landing and landed, acknowledgements owed.

use crate::connection::output::Output;
use crate::error::{RecvError, TransportError};
use crate::payload::Payload;
use crate::wire::{AckResult, DataMessage, FrameDescriptor};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How long a message with device frames that arrived before its receive waits for one
/// before it lands in pool memory: a `recv_into` posted just after gets the one copy
/// directly into its buffers (the connector's push, or this side's copy from the
/// sender's exported memory), not a copy into pool memory and a second one out of it.
pub(in crate::connection) const DEVICE_RECV_GRACE: Duration = Duration::from_millis(1);

/// Whether a receive's own buffers could take `data`'s device frames as they land, so it
/// is worth waiting a moment for one: frames the connector pushes, or frames exported
/// for this side to copy.
pub(in crate::connection) fn lands_in_receive_buffers(data: &DataMessage) -> bool {
    data.frames.iter().any(|f| matches!(f, FrameDescriptor::DevicePush { .. } | FrameDescriptor::Device(_)))
}

pub(in crate::connection) struct PostedRecv<P: Payload> {
    pub(in crate::connection) id: u64,
    pub(in crate::connection) into: Option<Vec<P::Frame>>,
    /// The stream the receive named: copies this process runs end with it waiting.
    pub(in crate::connection) on: Option<P::Stream>,
}

/// An acknowledgement held back to keep acknowledgements in order.
pub(in crate::connection) struct PendingAck {
    pub(in crate::connection) seq: u64,
    /// The receive the message went to.
    pub(in crate::connection) claim: Option<u64>,
    /// `None` while the lane's copies of a message delivered early still run.
    pub(in crate::connection) result: Option<AckResult>,
}

/// How a landing in progress finishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::connection) enum Awaits {
    /// The connector's `PushDone`; `into_callers_buffers`: the targets are a
    /// `recv_into`'s own buffers.
    Push { into_callers_buffers: bool },
    /// The lane's `Landed` (UCX transfers).
    Lane,
    /// The connector filling receive offer `offer` with the message (`offered.rs`): the
    /// receive lent its buffers.
    Offer { offer: u64 },
    /// Nothing: landed whole (and acknowledged), unclaimed, behind an unclaimed message
    /// still landing.
    Done,
}

/// A message landing, in order.
pub(in crate::connection) struct InLanding<P: Payload> {
    /// The message's sequence number; `None` for one moved behind a landing given up
    /// (`withdraw.rs`), which is delivered in queue order and never looked up.
    pub(in crate::connection) seq: Option<u64>,
    /// The receive it goes to, when one took it as it started landing.
    pub(in crate::connection) claim: Option<u64>,
    /// Whether it lands in the claiming receive's own buffers (`recv_into`).
    pub(in crate::connection) with_buffers: bool,
    /// The stream the claiming receive named.
    pub(in crate::connection) on: Option<P::Stream>,
    pub(in crate::connection) payload: u64,
    pub(in crate::connection) awaits: Awaits,
    /// When the peer's part began (a push, a lane transfer: `Push`, `Lane`); the request
    /// timeout bounds it as it bounds the peer's wait for our acknowledgement.
    pub(in crate::connection) peer_since: Option<Instant>,
    /// Landed, waiting for the ones ahead of it.
    pub(in crate::connection) done: Option<P::Message>,
}

/// Receives of one connection, from described to delivered.
pub(in crate::connection) struct RecvSide<P: Payload> {
    pub(in crate::connection) expected_seq: u64,
    /// Messages described but not landed yet, with their arrival time.
    pub(in crate::connection) parked: VecDeque<(DataMessage, Instant)>,
    pub(in crate::connection) landings: VecDeque<InLanding<P>>,
    /// Messages landed whole that no receive took yet.
    pub(in crate::connection) landed: VecDeque<P::Message>,
    /// The first `returned.len()` of `landed` went to these receives (ascending), whose
    /// handles went without taking them ([`Connection::return_undelivered`]).
    pub(in crate::connection) returned: VecDeque<u64>,
    /// Bytes landed (or landing) that no receive claimed.
    pub(in crate::connection) landed_bytes: usize,
    pub(in crate::connection) posted: VecDeque<PostedRecv<P>>,
    /// The front parked message waits for the peer's GPU work: try again next turn.
    pub(in crate::connection) awaiting_peer_gpu: bool,
    /// Acknowledgements behind the first message whose copies still run, in order.
    pub(in crate::connection) acks: VecDeque<PendingAck>,
}

impl<P: Payload> Default for RecvSide<P> {
    fn default() -> Self {
        Self {
            expected_seq: Default::default(),
            parked: Default::default(),
            landings: Default::default(),
            landed: Default::default(),
            returned: Default::default(),
            landed_bytes: Default::default(),
            posted: Default::default(),
            awaiting_peer_gpu: Default::default(),
            acks: Default::default(),
        }
    }
}

impl<P: Payload> RecvSide<P> {
    /// Receives posted and not yet matched.
    pub fn posted_count(&self) -> usize {
        self.posted.len()
    }

    /// When the first parked message has device frames and no receive is posted: its
    /// arrival.
    pub(in crate::connection) fn parked_device(&self) -> Option<Instant> {
        if !self.posted.is_empty() {
            return None;
        }
        let (data, arrived) = self.parked.front()?;
        lands_in_receive_buffers(data).then_some(*arrived)
    }

    /// Whether a message with device frames waits, within its grace, for a receive.
    pub fn device_waits_for_recv(&self, now: Instant) -> bool {
        self.parked_device().is_some_and(|arrived| now.saturating_duration_since(arrived) < DEVICE_RECV_GRACE)
    }

    /// Whether a message with device frames is past its grace for a receive.
    pub fn device_grace_over(&self, now: Instant) -> bool {
        self.parked_device().is_some_and(|arrived| now.saturating_duration_since(arrived) >= DEVICE_RECV_GRACE)
    }

    /// Ends every pending receive with `error`; messages that landed whole stay. `lent`:
    /// the buffers of a receive offer, back from the lane, for its receive. The receive
    /// awaiting offer `held` stays, until its buffers are released (`hangup.rs`).
    pub fn fail_all(
        &mut self,
        error: &TransportError,
        out: &mut VecDeque<Output<P>>,
        lent: Option<(u64, Vec<P::Frame>)>,
        held: Option<u64>,
    ) {
        let mut lent = lent;
        let mut kept = VecDeque::new();
        for l in self.landings.drain(..) {
            if l.claim.is_some() && held.is_some_and(|offer| l.awaits == Awaits::Offer { offer }) {
                kept.push_back(l);
                continue;
            }
            match (l.claim, l.done) {
                (Some(id), _) => {
                    let buffers = match (&l.awaits, &lent) {
                        (Awaits::Offer { offer }, Some((lent_offer, _))) if offer == lent_offer => {
                            lent.take().map(|(_, b)| b)
                        }
                        _ => None,
                    };
                    out.push_back(Output::RecvDone { id, result: Err(recv_error(error.clone(), buffers)) })
                }
                (None, Some(message)) if l.awaits == Awaits::Done => self.landed.push_back(message),
                (None, _) => self.landed_bytes -= l.payload as usize,
            }
        }
        for r in self.posted.drain(..) {
            out.push_back(Output::RecvDone { id: r.id, result: Err(recv_error(error.clone(), r.into)) });
        }
        self.parked.clear();
        // The lane's `close` waits for the copies still running.
        self.acks.clear();
        self.landings = kept;
    }
}

pub(in crate::connection) fn recv_error<F>(error: TransportError, buffers: Option<Vec<F>>) -> RecvError<F> {
    RecvError { error, buffers }
}

/// Checks `recv_into` buffers against the descriptors of the message they receive.
pub(in crate::connection) fn check_targets<P: Payload>(
    descs: &[FrameDescriptor],
    buffers: &[P::Frame],
) -> Result<(), String> {
    if descs.len() != buffers.len() {
        return Err(format!("{} frames arrived for {} buffers", descs.len(), buffers.len()));
    }
    for (i, (d, b)) in descs.iter().zip(buffers).enumerate() {
        let device_desc = matches!(
            d,
            FrameDescriptor::Device(_)
                | FrameDescriptor::DevicePush { .. }
                | FrameDescriptor::DeviceOffered { .. }
                | FrameDescriptor::Remote { device: true, .. }
        );
        match (device_desc, P::is_device(b)) {
            (true, false) => return Err(format!("frame {i} is a device frame, buffer {i} is host memory")),
            (false, true) => return Err(format!("frame {i} is a host frame, buffer {i} is device memory")),
            _ => {}
        }
        let len = P::frame_len(b);
        if d.len() != len as u64 {
            return Err(format!("frame {i} holds {} bytes, buffer {i} {len}", d.len()));
        }
    }
    Ok(())
}
