//! [`HeldForHangup`]: what a side that ended a connection keeps until the peer, which may
//! still copy into buffers it lent, hangs up.

use crate::connection::output::Output;
use crate::error::TransportError;
use crate::payload::Payload;
use std::time::Instant;

/// What a connection ended by this side holds until its peer hangs up.
pub(in crate::connection) struct HeldForHangup<P: Payload> {
    /// The receive offer's buffers (by offer id), for the receive that lent them.
    pub(in crate::connection) lent: Option<(u64, Vec<P::Frame>)>,
    /// The error the connection ended with, for that receive.
    pub(in crate::connection) error: TransportError,
    /// Set on the first timeout check after the end: when to stop waiting.
    pub(in crate::connection) deadline: Option<Instant>,
    /// Completions of sends the peer may still be reading (described, not
    /// acknowledged), given with their messages once it hung up.
    pub(in crate::connection) deferred: Vec<Output<P>>,
}

impl<P: Payload> HeldForHangup<P> {
    /// Holds a send's completion until the peer hung up.
    pub fn defer(&mut self, done: Output<P>) {
        self.deferred.push(done);
    }

    /// The receive offer whose buffers are held, if any.
    pub fn offer(&self) -> Option<u64> {
        self.lent.as_ref().map(|(offer, _)| *offer)
    }
}
