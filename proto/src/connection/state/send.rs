//! [`SendSide`]: the sends of one connection, from queued to acknowledged.

use crate::payload::Payload;
use crate::wire::AckResult;
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

pub(in crate::connection) struct QueuedSend<P: Payload> {
    pub(in crate::connection) id: u64,
    pub(in crate::connection) message: P::Message,
}

pub(in crate::connection) struct InFlight<P: Payload> {
    pub(in crate::connection) id: u64,
    pub(in crate::connection) message: P::Message,
    pub(in crate::connection) sent_at: Instant,
    /// Connector-copies mode: the device frames wait for the listener's `PushTargets`.
    pub(in crate::connection) awaits_targets: bool,
    /// The peer's answer, when it came before the lane gave the frames back.
    pub(in crate::connection) acked: Option<AckResult>,
}

/// Sends of one connection, from queued to acknowledged.
pub(in crate::connection) struct SendSide<P: Payload> {
    pub(in crate::connection) next_seq: u64,
    pub(in crate::connection) queued: VecDeque<QueuedSend<P>>,
    pub(in crate::connection) in_flight: BTreeMap<u64, InFlight<P>>,
    /// The front send waits for its producer's GPU work: try again next turn.
    pub(in crate::connection) awaiting_producer: bool,
}

impl<P: Payload> Default for SendSide<P> {
    fn default() -> Self {
        Self {
            next_seq: Default::default(),
            queued: Default::default(),
            in_flight: Default::default(),
            awaiting_producer: Default::default(),
        }
    }
}

impl<P: Payload> SendSide<P> {
    /// The oldest unacknowledged message, when it has waited longer than `timeout`.
    pub fn overdue(&self, now: Instant, timeout: Duration) -> Option<u64> {
        self.in_flight.iter().find(|(_, f)| now.saturating_duration_since(f.sent_at) > timeout).map(|(&s, _)| s)
    }

    /// The sequence number the next message sent gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Sends queued or unacknowledged.
    pub fn in_flight_count(&self) -> usize {
        self.queued.len() + self.in_flight.len()
    }

    /// Sends described to the peer and not yet acknowledged (it may be reading them).
    pub fn described_count(&self) -> usize {
        self.in_flight.len()
    }
}
