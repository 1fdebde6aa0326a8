//! The request slots of one connection and the deadlines of those awaited as futures.
//!
//! A slot whose handle is gone hands its completion back ([`Slot::complete`]): a
//! received message then goes back to the connection (the caller of
//! [`Requests::finish_recv`] returns it to the core), a send's result is dropped.

use super::spans;
use crate::command::{ImportSlot, NotificationSlot, TransferSlot};
use crate::error::{RecvError, SendError, TransportError};
use crate::slot::Slot;
use ferrylink_memory::{DeviceBuffer, Frame, Message, ProducerStream};
use ferrylink_proto::region::ImportedRegion;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Span;

pub(crate) type SendSlot = Arc<Slot<Result<Message, SendError>>>;
pub(crate) type RecvSlot = Arc<Slot<Result<Message, RecvError>>>;

/// The requests of one connection that the core has not answered yet; sends, receives and
/// one-sided transfers with their spans (`spans.rs`), entered when they complete.
#[derive(Default)]
pub(super) struct Requests {
    sends: HashMap<u64, (SendSlot, Span)>,
    /// Receive slots, with the stream a receive named (`Endpoint::recv_on`).
    recvs: HashMap<u64, (RecvSlot, Option<ProducerStream>, Span)>,
    imports: HashMap<u64, ImportSlot>,
    transfers: HashMap<u64, (TransferSlot, Span)>,
    notifications: HashMap<u64, NotificationSlot>,
    /// Futures' deadlines, soonest first, and each request's own.
    deadlines: BTreeSet<(Instant, u64)>,
    deadline_of: HashMap<u64, Instant>,
}

impl Requests {
    pub fn add_send(&mut self, id: u64, slot: SendSlot, span: Span) {
        self.sends.insert(id, (slot, span));
    }

    pub fn add_recv(&mut self, id: u64, slot: RecvSlot, on: Option<ProducerStream>, span: Span) {
        self.recvs.insert(id, (slot, on, span));
    }

    /// The core answered send `id`. A result whose handle is gone is dropped (a message
    /// nobody can take any more).
    pub fn finish_send(&mut self, id: u64, result: Result<Message, SendError>) {
        self.forget_deadline(id);
        match self.sends.remove(&id) {
            Some((slot, span)) => {
                let _in_transfer = span.entered();
                tracing::debug!(ok = result.is_ok(), "send completed");
                drop(slot.complete(result));
            }
            None => tracing::error!(id, "a send completed that no request waits for"),
        }
    }

    /// The core answered receive `id`. A message its handle did not live to take (or
    /// that came after the request timed out) is handed back, for the core to return.
    /// The device frames of a receive that named a stream name it as their producer.
    pub fn finish_recv(&mut self, id: u64, mut result: Result<Message, RecvError>) -> Option<Message> {
        self.forget_deadline(id);
        match self.recvs.remove(&id) {
            Some((slot, on, span)) => {
                if let Ok(message) = &result {
                    spans::record_received(&span, message);
                }
                let _in_transfer = span.entered();
                tracing::debug!(ok = result.is_ok(), "receive completed");
                if let (Ok(message), Some(on)) = (&mut result, &on) {
                    name_producer(message, on);
                }
                slot.complete(result).err().and_then(Result::ok)
            }
            None => {
                tracing::error!(id, "a receive completed that no request waits for");
                result.ok()
            }
        }
    }

    pub fn add_import(&mut self, id: u64, slot: ImportSlot) {
        self.imports.insert(id, slot);
    }

    pub fn add_transfer(&mut self, id: u64, slot: TransferSlot, span: Span) {
        self.transfers.insert(id, (slot, span));
    }

    pub fn add_notification(&mut self, id: u64, slot: NotificationSlot) {
        self.notifications.insert(id, slot);
    }

    /// The core answered import `id`. A region its handle did not live to take comes
    /// back, for the core to give up.
    pub fn finish_import(&mut self, id: u64, result: Result<ImportedRegion, TransportError>) -> Option<ImportedRegion> {
        self.forget_deadline(id);
        match self.imports.remove(&id) {
            Some(slot) => slot.complete(result).err().and_then(Result::ok),
            None => result.ok(),
        }
    }

    /// The core answered transfer `id`.
    pub fn finish_transfer(&mut self, id: u64, result: Result<(), TransportError>) {
        self.forget_deadline(id);
        if let Some((slot, span)) = self.transfers.remove(&id) {
            let _in_transfer = span.entered();
            tracing::debug!(ok = result.is_ok(), "transfer completed");
            drop(slot.complete(result));
        }
    }

    /// The core answered notification receive `id`. A notification its handle did not
    /// live to take comes back, for the core to give to the next receive.
    pub fn finish_notification(&mut self, id: u64, result: Result<Vec<u8>, TransportError>) -> Option<Vec<u8>> {
        self.forget_deadline(id);
        match self.notifications.remove(&id) {
            Some(slot) => slot.complete(result).err().and_then(Result::ok),
            None => result.ok(),
        }
    }

    /// Forgets request `id`, which the core withdrew.
    pub fn withdrawn(&mut self, id: u64) {
        self.forget_deadline(id);
        self.sends.remove(&id);
        self.recvs.remove(&id);
        self.notifications.remove(&id);
    }

    /// Whether request `id` waits for the core's answer.
    fn knows(&self, id: u64) -> bool {
        self.sends.contains_key(&id)
            || self.recvs.contains_key(&id)
            || self.imports.contains_key(&id)
            || self.transfers.contains_key(&id)
            || self.notifications.contains_key(&id)
    }

    /// Request `id`, awaited as a future, ends at `at` unless answered by then.
    pub fn set_deadline(&mut self, id: u64, at: Instant) {
        if !self.knows(id) {
            return;
        }
        self.forget_deadline(id);
        self.deadlines.insert((at, id));
        self.deadline_of.insert(id, at);
    }

    fn forget_deadline(&mut self, id: u64) {
        if let Some(at) = self.deadline_of.remove(&id) {
            self.deadlines.remove(&(at, id));
        }
    }

    /// The soonest deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|&(at, _)| at)
    }

    /// Takes the requests whose deadline passed by `now`.
    pub fn take_due(&mut self, now: Instant) -> Vec<u64> {
        let mut due = Vec::new();
        while let Some(&(at, id)) = self.deadlines.first() {
            if at > now {
                break;
            }
            self.deadlines.pop_first();
            self.deadline_of.remove(&id);
            due.push(id);
        }
        due
    }

    /// Ends request `id` with `TimedOut(timeout)` if the core has not answered it (a
    /// receive a message is landing for: the message comes later and goes back to the
    /// core through [`Requests::finish_recv`]). The slot stays until the core answers.
    pub fn time_out(&mut self, id: u64, timeout: Duration) {
        let error = TransportError::TimedOut(timeout);
        if let Some((slot, _)) = self.sends.get(&id) {
            drop(slot.complete(Err(SendError::new(error, None))));
        } else if let Some((slot, _, _)) = self.recvs.get(&id) {
            drop(slot.complete(Err(RecvError::new(error, None))));
        } else if let Some(slot) = self.imports.get(&id) {
            drop(slot.complete(Err(error)));
        } else if let Some((slot, _)) = self.transfers.get(&id) {
            drop(slot.complete(Err(error)));
        } else if let Some(slot) = self.notifications.get(&id) {
            drop(slot.complete(Err(error)));
        }
    }
}

/// Names `on` as the producer stream of every device frame of `message`: a later send of
/// them is ordered after the work the caller enqueues there.
fn name_producer(message: &mut Message, on: &ProducerStream) {
    let frames = std::mem::take(&mut message.frames);
    message.frames = frames
        .into_iter()
        .map(|frame| match frame {
            Frame::Device(buf) => Frame::Device(produced_on(buf, on)),
            host => host,
        })
        .collect();
}

fn produced_on(buf: DeviceBuffer, on: &ProducerStream) -> DeviceBuffer {
    match on {
        ProducerStream::Cudarc(stream) => buf.produced_on(stream),
        // SAFETY: a raw stream comes from `Endpoint::recv_on_raw`, whose contract is
        // `produced_on_raw`'s: a stream of a primary context, alive while the frames are sent.
        ProducerStream::Raw(_) => unsafe { buf.produced_on_raw(on.raw()) },
    }
}
