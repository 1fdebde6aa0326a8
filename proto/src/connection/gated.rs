//! Notifications sent ahead of their data (docs/decisions/0029-copies-signal-their-own-end.md).
//!
//! Where the initiator's lane runs a `put` (or `get`) on a GPU that can write one of the
//! connection's gate words after the copies, the initiator sends `Notify` as soon as the
//! copies are enqueued, naming the gate (`CoreLane::early_notify_gate`); the copies' end
//! writes the word, which both processes read. The owner delivers such a notification
//! once its lane sees the gate open (`CoreLane::gate_open`), so the control message's
//! trip overlaps the copies instead of following them. If the copies fail, the
//! initiator sends `NotifyCancelled` and the owner drops the notification. Notifications
//! are delivered in the order they came: one whose gate is closed holds back those
//! behind it.
//!
//! A peer can name any gate: a word it wrote itself opens at once (it could as well
//! have sent the notification late), one that never opens holds notifications back
//! until the connection ends, like a notification never sent. An index outside the
//! gate words is a protocol error.

use super::lane::CoreLane;
use super::state::onesided::MAX_QUEUED_NOTIFICATIONS;
use super::{Connection, Output};
use crate::payload::Payload;
use crate::stats::Counters;
use crate::wire::{NotifyGate, WireMessage};

impl<P: Payload> Connection<P> {
    /// Transfer `id`, which this side's lane just started, has a notification: when the
    /// lane gives it a gate, the notification goes now, gated. What is left to send
    /// after the copies, and the gate.
    pub(super) fn notify_ahead(
        &mut self,
        id: u64,
        grant: u64,
        notify: Option<Vec<u8>>,
        lane: &mut dyn CoreLane<P>,
    ) -> (Option<Vec<u8>>, Option<NotifyGate>) {
        let Some(data) = notify else { return (None, None) };
        match lane.early_notify_gate(id) {
            Some(gate) => {
                tracing::trace!("notification sent ahead of the copies");
                Counters::add(&self.counters.notifications_sent_ahead, 1);
                self.transmit(WireMessage::Notify { grant, data, gate: Some(gate) });
                self.out.push_back(Output::Flush);
                (None, Some(gate))
            }
            None => (Some(data), None),
        }
    }

    /// A notification from the peer (its grant checked): delivered now, or queued behind
    /// its gate or the gated ones before it.
    pub(super) fn receive_notification(&mut self, data: Vec<u8>, gate: Option<NotifyGate>, lane: &mut dyn CoreLane<P>) {
        if gate.is_none() && self.onesided.gated.is_empty() {
            return self.deliver_notification(data, lane);
        }
        if self.onesided.gated.len() >= MAX_QUEUED_NOTIFICATIONS {
            let what = format!("more than {MAX_QUEUED_NOTIFICATIONS} notifications waiting for their data");
            return self.fail_peer(what, lane);
        }
        self.onesided.gated.push_back((data, gate));
        self.release_gated(lane);
    }

    /// The peer's transfer behind the gated notification with `gate` failed: it is
    /// dropped if still queued (it was delivered if its gate opened first).
    pub(super) fn cancel_gated(&mut self, gate: NotifyGate, lane: &mut dyn CoreLane<P>) {
        if let Some(at) = self.onesided.gated.iter().position(|(_, g)| *g == Some(gate)) {
            tracing::trace!("gated notification cancelled");
            self.onesided.gated.remove(at);
        }
        self.release_gated(lane);
    }

    /// Delivers the queued notifications from the front whose gates opened.
    pub(super) fn release_gated(&mut self, lane: &mut dyn CoreLane<P>) {
        loop {
            match self.take_opened_front(lane) {
                Ok(Some(data)) => self.deliver_notification(data, lane),
                Ok(None) => return,
                Err(reason) => return self.protocol_error_with(&reason, lane),
            }
        }
    }

    /// The connection ends: the queued notifications whose data arrived (gates open,
    /// in order) are delivered; the rest are dropped, as their copies may not have ended.
    pub(super) fn deliver_opened_at_end(&mut self, lane: &mut dyn CoreLane<P>) {
        while let Ok(Some(data)) = self.take_opened_front(lane) {
            match self.onesided.waiting.pop_front() {
                Some(id) => self.out.push_back(Output::NotificationDone { id, result: Ok(data) }),
                None => self.onesided.notifications.push_back(data),
            }
        }
        if !self.onesided.gated.is_empty() {
            let dropped = self.onesided.gated.len();
            tracing::debug!(dropped, "notifications whose data never came, dropped");
            self.onesided.gated.clear();
        }
    }

    /// The front queued notification, taken when its gate opened (or it has none);
    /// `Ok(None)` while it waits or when none is queued; an error for a gate that cannot
    /// exist here.
    fn take_opened_front(&mut self, lane: &dyn CoreLane<P>) -> Result<Option<Vec<u8>>, String> {
        let Some((_, gate)) = self.onesided.gated.front() else { return Ok(None) };
        if let Some(gate) = *gate {
            if !lane.gate_open(gate)? {
                return Ok(None);
            }
        }
        Ok(self.onesided.gated.pop_front().map(|(data, _)| data))
    }
}
