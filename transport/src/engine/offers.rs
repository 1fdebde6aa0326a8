//! Push offers: the connector-copies mode without the `PushTargets` round trip.
//!
//! In connector-copies mode (see `engine/device.rs`) a connector's device message costs
//! three control messages: `Data` (frames `DevicePush`), the listener's `PushTargets`,
//! the connector's `PushDone`. Two of them are on the critical path of every transfer.
//! An **offer** moves the listener's part ahead of time: after it delivered a pushed
//! message whose frames are all device frames of at most `Config::push_offer_max_bytes`
//! in all, the listener allocates buffers of the same lengths, exports them and sends
//! `PushOffer`. The connector keeps the offer; when its next message has exactly those
//! frame lengths, it enqueues the copies into the offered buffers (its copy stream
//! waiting on the producer's marks), records an interprocess event after them, and sends
//! `Data` at once with `DeviceOffered` frames carrying that event; the listener polls the
//! event (on the host: a GPU-side wait on another process' event costs a context switch)
//! and delivers when it completed, sending no ack; the connector's send completes when it
//! sees the same event complete. The control message thus travels while the GPU copies.
//! A message that looks different makes the connector send `DeclineOffer`, and the
//! listener frees the buffers.
//!
//! At most two offers are outstanding per connection, so a listener holds at most two
//! messages' worth of device memory (each ≤ the configured limit) for them. Two, because
//! the offer made after message k is written behind the reply to it and can reach the
//! connector after its message k+1 left (measured on the H200: half the 1 MB round
//! trips missed a single offer); the one made after message k-1 serves then. The listener
//! never withdraws an offer on its own, so the two sides cannot race; an offer dies with
//! the connection.
//!
//! Why offers rather than a connector-side allocator in the listener's memory: the
//! listener keeps ownership of everything it allocates, and a lying connector can only
//! fill buffers it was given.

use super::conn::{Conn, PushRole};
use super::device::{DeviceFrameError, ProducerMarks, PushInFlight};
use crate::config::Config;
use crate::endpoint::Counters;
use crate::error::{SendError, TransportError};
use crate::wire::{encode_frame, DataMessage, DeviceFrameDescriptor, FrameDescriptor, WireMessage};
use ferrylink_memory::{DeviceBuffer, Frame, Message};
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// Offers a listener has outstanding at most.
const MAX_OFFERS_MADE: usize = 2;

/// Offers a connector holds at most (more than a listener makes is a lie).
const MAX_OFFERS_HELD: usize = MAX_OFFERS_MADE;

/// How long a wanted offer waits for a send to ride along with before it goes alone.
const OFFER_IDLE_DELAY: Duration = Duration::from_micros(20);

/// A send copied into an offer, waiting for its copies.
pub(crate) struct OfferedSend {
    message: Message,
    slot: super::native::SendSlot,
    push: PushInFlight,
}

/// Both sides' offer state of one connection.
#[derive(Default)]
pub(crate) struct Offers {
    // Connector side.
    /// Offers received, oldest first: (id, targets).
    held: VecDeque<(u64, Vec<DeviceFrameDescriptor>)>,
    /// Sends whose copies into offers run.
    sending: VecDeque<OfferedSend>,
    // Listener side.
    /// Offers made and not yet used or declined: id → the offered buffers.
    made: BTreeMap<u64, Vec<DeviceBuffer>>,
    next_id: u64,
    /// Frame lengths of the next offer to make, and since when it is wanted.
    wanted: Option<(Vec<u64>, Instant)>,
    /// No offers while the receiver copies landed device frames into `recv_into` buffers
    /// (an offered frame would cost it such a copy); a plain receive of a pushed message
    /// resumes them.
    paused: bool,
}

impl Offers {
    /// Stops making offers (see `paused`); a wanted one is dropped.
    pub fn pause(&mut self) {
        self.paused = true;
        self.wanted = None;
    }

    /// Makes offers again.
    pub fn resume(&mut self) {
        self.paused = false;
    }

    /// Forgets everything (the connection ended): offered buffers return to the pool;
    /// sends copying into offers end with `error` once their copies finished.
    pub fn clear(&mut self, error: &TransportError) {
        for OfferedSend { message, slot, push } in self.sending.drain(..) {
            push.done.wait_all();
            slot.complete(Err(SendError { error: error.clone(), message: Some(message) }));
        }
        *self = Offers { next_id: self.next_id, ..Offers::default() };
    }
}

/// The device frame lengths of a message, when every frame is a device frame.
pub(super) fn device_layout(message: &Message) -> Option<Vec<u64>> {
    let lens: Option<Vec<u64>> = message.frames.iter().map(|f| f.as_device().map(|d| d.len() as u64)).collect();
    lens.filter(|l| !l.is_empty())
}

impl Conn {
    /// Connector: the listener offers buffers for a future message.
    pub(super) fn on_push_offer(&mut self, offer: u64, targets: Vec<DeviceFrameDescriptor>) {
        if self.push != PushRole::Pusher {
            return self.protocol_error("push offer to a side that does not push");
        }
        let offers = &mut self.native.offers;
        if offers.held.len() >= MAX_OFFERS_HELD || offers.held.back().is_some_and(|(last, _)| *last >= offer) {
            return self.protocol_error(&format!("push offer {offer} out of turn"));
        }
        if targets.is_empty() {
            return self.protocol_error(&format!("push offer {offer} has no buffers"));
        }
        offers.held.push_back((offer, targets));
    }

    /// Listener: the connector will not use an offer.
    pub(super) fn on_decline_offer(&mut self, offer: u64) {
        if self.push != PushRole::Target || self.native.offers.made.remove(&offer).is_none() {
            return self.protocol_error(&format!("decline of unknown push offer {offer}"));
        }
        tracing::trace!(offer, "push offer declined");
    }

    /// Connector: the offer `message` can be copied into, when the oldest one held fits
    /// it exactly. An offer that does not fit a device message is declined.
    pub(super) fn take_fitting_offer(&mut self, message: &Message) -> Option<(u64, Vec<DeviceFrameDescriptor>)> {
        if self.push != PushRole::Pusher || self.native.offers.held.is_empty() {
            return None;
        }
        if !message.frames.iter().any(|f| f.as_device().is_some()) {
            return None; // a host message leaves the offer for the next device one
        }
        let (id, targets) = self.native.offers.held.pop_front().expect("checked");
        let fits = device_layout(message)
            .is_some_and(|lens| lens.len() == targets.len() && lens.iter().zip(&targets).all(|(l, t)| *l == t.len));
        if fits {
            return Some((id, targets));
        }
        self.queue(encode_frame(&WireMessage::DeclineOffer { offer: id }), Vec::new());
        None
    }

    /// Connector: enqueues the copies of `message` into the offered buffers and describes
    /// it at once, each frame with the event that completes after its copy (the listener
    /// polls it before delivering: the control message travels while the GPU copies).
    /// The send completes when this side sees the events complete (`poll_offered_sends`).
    pub(super) fn send_into_offer(
        &mut self,
        message: Message,
        slot: super::native::SendSlot,
        (offer, targets): (u64, Vec<DeviceFrameDescriptor>),
        producer: ProducerMarks,
    ) {
        let peer_pid = self.shared.as_ref().map_or(0, |s| s.peer.pid);
        let sources: Vec<&DeviceBuffer> = message.frames.iter().filter_map(Frame::as_device).collect();
        // The copy streams' waits on the producer's marks are enqueued: the marks may go.
        let pushed = self.device.push_into_offer(peer_pid, &sources, &targets, &producer);
        drop(producer);
        match pushed {
            Ok(push) => {
                let frames = sources
                    .iter()
                    .enumerate()
                    .map(|(i, s)| FrameDescriptor::DeviceOffered {
                        offer,
                        index: i as u32,
                        len: s.len() as u64,
                        ready: push.done.on_device(s.device_ordinal()).map(|ev| ev.handle()),
                    })
                    .collect();
                let seq = self.native.next_seq;
                let data = DataMessage { seq, header: message.header.clone(), frames };
                self.queue(encode_frame(&WireMessage::Data(data)), Vec::new());
                tracing::trace!(seq, offer, "data message queued, copying into an offer");
                self.native.next_seq += 1;
                self.native.offers.sending.push_back(OfferedSend { message, slot, push });
            }
            Err(DeviceFrameError::BadDescriptor(e)) => {
                let error = TransportError::PeerFailed { peer: self.peer.clone(), reason: e.clone() };
                slot.complete(Err(SendError { error, message: Some(message) }));
                self.protocol_error(&format!("push offer {offer} does not map: {e}"));
            }
            Err(e) => {
                self.queue(encode_frame(&WireMessage::DeclineOffer { offer }), Vec::new());
                let reason = match e {
                    DeviceFrameError::NoCuda(e) => format!("device frames need CUDA: {e}"),
                    DeviceFrameError::Local(e) | DeviceFrameError::BadDescriptor(e) => e,
                };
                let error = TransportError::InvalidMessage(format!("copying into the listener's offer: {reason}"));
                slot.complete(Err(SendError { error, message: Some(message) }));
            }
        }
    }

    /// Connector: hands back the messages whose copies into offers completed, in order.
    pub(super) fn poll_offered_sends(&mut self) {
        while let Some(front) = self.native.offers.sending.front() {
            match front.push.done.all_done() {
                Ok(false) => return,
                Ok(true) => {
                    tracing::trace!("copies into the offer done");
                    let OfferedSend { message, slot, .. } = self.native.offers.sending.pop_front().expect("checked");
                    if let Some(c) = self.counters() {
                        Counters::add(&c.messages_sent, 1);
                        Counters::add(&c.offered_sends, 1);
                        Counters::add(&c.payload_bytes_sent, message.payload_len() as u64);
                    }
                    slot.complete(Ok(message));
                }
                Err(e) => {
                    let OfferedSend { message, slot, push } = self.native.offers.sending.pop_front().expect("checked");
                    push.done.wait_all();
                    let reason = super::native::describe(e);
                    let error = TransportError::InvalidMessage(format!("copying into the listener's offer: {reason}"));
                    slot.complete(Err(SendError { error, message: Some(message) }));
                }
            }
        }
    }

    /// Whether copies into offers are still running (the progress thread keeps turning).
    pub(super) fn offered_sends_pending(&self) -> bool {
        !self.native.offers.sending.is_empty()
    }

    /// Listener: the buffers of the offer a `DeviceOffered` message names, after checking
    /// that the message fills exactly that offer; `Ok(None)` for other messages.
    pub(super) fn take_offered(&mut self, data: &DataMessage) -> Result<Option<Vec<DeviceBuffer>>, String> {
        let offered: Vec<(u64, u32, u64)> = data
            .frames
            .iter()
            .filter_map(|f| match f {
                FrameDescriptor::DeviceOffered { offer, index, len, .. } => Some((*offer, *index, *len)),
                _ => None,
            })
            .collect();
        let Some(&(offer, _, _)) = offered.first() else { return Ok(None) };
        if self.push != PushRole::Target {
            return Err(format!("message {} fills a push offer, but this side makes none", data.seq));
        }
        if offered.len() != data.frames.len() {
            return Err(format!("message {} mixes offered frames with others", data.seq));
        }
        let Some(buffers) = self.native.offers.made.get(&offer) else {
            return Err(format!("message {} fills unknown push offer {offer}", data.seq));
        };
        let exact = buffers.len() == offered.len()
            && offered
                .iter()
                .enumerate()
                .all(|(i, &(o, index, len))| o == offer && index as usize == i && buffers[i].len() as u64 == len);
        if !exact {
            return Err(format!("message {} does not match push offer {offer}", data.seq));
        }
        Ok(self.native.offers.made.remove(&offer))
    }

    /// Listener: after a pushed message of `layout` was delivered, an offer of the same
    /// shape is wanted (when offers are on, fewer than two are outstanding and it is
    /// small enough).
    pub(super) fn want_offer(&mut self, layout: Option<Vec<u64>>, config: &Config) {
        let Some(lens) = layout else { return };
        let total: u64 = lens.iter().sum();
        let offers = &mut self.native.offers;
        if self.push != PushRole::Target
            || self.ucx.is_some()
            || total == 0
            || total > config.push_offer_max_bytes
            || offers.made.len() >= MAX_OFFERS_MADE
            || offers.paused
        {
            return;
        }
        offers.wanted = Some((lens, Instant::now()));
    }

    /// Listener: makes the wanted offer now (`eager`: a send just went out and the offer
    /// rides behind it) or once it waited `OFFER_IDLE_DELAY` for one.
    pub(super) fn make_offer(&mut self, eager: bool) {
        match &self.native.offers.wanted {
            Some((_, since)) if eager || since.elapsed() >= OFFER_IDLE_DELAY => {}
            _ => return,
        }
        let (lens, _) = self.native.offers.wanted.take().expect("checked");
        let ordinal = self.device.default_landing_device();
        let buffers: Result<Vec<DeviceBuffer>, DeviceFrameError> =
            lens.iter().map(|&len| self.device.allocate(ordinal, len as usize)).collect();
        let exported = buffers.and_then(|b| {
            let refs: Vec<&DeviceBuffer> = b.iter().collect();
            let targets = self.device.export_targets(&refs)?;
            Ok((b, targets))
        });
        match exported {
            Ok((buffers, targets)) => {
                let offer = self.native.offers.next_id;
                self.native.offers.next_id += 1;
                self.native.offers.made.insert(offer, buffers);
                self.queue(encode_frame(&WireMessage::PushOffer { offer, targets }), Vec::new());
                self.flush();
            }
            // Only a missed shortcut: the next message takes the PushTargets path.
            Err(e) => tracing::debug!("no push offer: {}", super::native::describe(e)),
        }
    }
}
