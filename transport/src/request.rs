//! Requests: handles on work the progress thread completes.
//!
//! Each request owns a [`Slot`] the progress thread fills exactly once. `wait()` blocks
//! (never longer than the context's `request_timeout`), `wait_timeout(d)` polls with a
//! bound, and requests implement [`Future`] with the same bound as `wait()`: the first
//! poll that finds the request pending hands the progress thread a deadline, and there
//! the request ends (as `wait()` would end it) if it is still pending. Async users need
//! no runtime from us.
//!
//! Dropping a request before taking its result withdraws it: the slot is marked
//! abandoned under its lock, so the progress thread, completing it at the same moment,
//! gets its result handed back instead (see [`Slot::complete`]). A received message that
//! completed into a dropped handle goes back to the endpoint (see [`RecvRequest`]).

use crate::error::{RecvError, SendError, TransportError};
use crate::slot::{Left, Slot};
use ferrylink_memory::Message;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

/// What a request's handle asks of the progress thread (for an endpoint's request:
/// commands for its connection). None of these block.
pub(crate) trait Link<T>: Send + Sync {
    /// `wait()` gave up after the bound: end the request (its final state still comes
    /// to the slot).
    fn cancel(&self);
    /// The handle went before the request completed: withdraw it if it has not started.
    fn withdraw(&self);
    /// The handle went without taking `value`, which had completed into the slot.
    fn unclaimed(&self, value: T);
    /// The request is awaited as a future: end it at `at` (as `wait()` would) unless it
    /// completed by then.
    fn expire_at(&self, at: Instant);
}

/// How long a cancelled request may take to report its final state.
const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// A request's side of its slot: the bound on waiting, and the link to the progress
/// thread that withdraws, cancels or hands back what the handle did not take.
pub(crate) struct Pending<T> {
    pub(crate) slot: Arc<Slot<T>>,
    timeout: Duration,
    pub(crate) spin: Duration,
    link: Box<dyn Link<T>>,
    /// Whether the progress thread holds this future's deadline.
    deadline_given: bool,
}

impl<T> Pending<T> {
    /// A request waiting on `slot` at most `timeout`, spinning `spin` first.
    pub(crate) fn new(slot: Arc<Slot<T>>, timeout: Duration, spin: Duration, link: Box<dyn Link<T>>) -> Self {
        Self { slot, timeout, spin, link, deadline_given: false }
    }

    /// Waits up to the timeout; then cancels and takes what the progress thread reports
    /// (the request may have completed meanwhile: nothing is lost).
    pub(crate) fn wait(&self, timed_out: impl FnOnce(Duration) -> T) -> T {
        if let Some(v) = self.slot.take_until(Instant::now() + self.timeout, self.spin) {
            return v;
        }
        self.link.cancel();
        self.slot.take_until(Instant::now() + CANCEL_GRACE, Duration::ZERO).unwrap_or_else(|| timed_out(self.timeout))
    }

    /// The future's poll: the first time it finds the request pending, the progress
    /// thread gets the deadline, `timeout` from now.
    pub(crate) fn poll(&mut self, cx: &mut TaskContext<'_>) -> Poll<T> {
        let poll = self.slot.poll_take(cx);
        if poll.is_pending() && !self.deadline_given {
            self.deadline_given = true;
            self.link.expire_at(Instant::now() + self.timeout);
        }
        poll
    }
}

impl<T> Drop for Pending<T> {
    /// Withdraws a request that has not completed, and hands a result nobody took to
    /// the link. Never blocks: each is at most a command to the progress thread.
    fn drop(&mut self) {
        match self.slot.abandon() {
            Left::Taken => {}
            Left::Pending => self.link.withdraw(),
            Left::Unclaimed(value) => self.link.unclaimed(value),
        }
    }
}

/// A send in progress. Completes when the receiver has the data and acknowledged it (or,
/// in connector-copies mode, when this side's copies into the receiver's buffers are
/// done): only then is the message handed back for reuse.
///
/// Dropping the request before it completed withdraws the send if it has not started
/// (it waits behind its producer's GPU work or for staging room, or the progress thread
/// has not taken it yet): it is never sent, and its message, which nobody can take any
/// more, is dropped, freeing its buffers. A send already under way is not recalled: the
/// peer still gets the message, and the message is dropped when the send completes.
#[must_use = "a send completes in the background; wait for it to reuse the buffers or see errors"]
pub struct SendRequest {
    pending: Pending<Result<Message, SendError>>,
}

impl SendRequest {
    pub(crate) fn new(
        slot: Arc<Slot<Result<Message, SendError>>>,
        timeout: Duration,
        spin: Duration,
        link: Box<dyn Link<Result<Message, SendError>>>,
    ) -> Self {
        Self { pending: Pending::new(slot, timeout, spin, link) }
    }

    /// Waits for the send, at most the context's `request_timeout`. On success the message
    /// comes back, its buffers free to reuse.
    pub fn wait(self) -> Result<Message, SendError> {
        let result = self.pending.wait(|t| Err(SendError::new(TransportError::TimedOut(t), None)));
        tracing::trace!("send wait returned");
        result
    }

    /// Waits at most `timeout`; `None` when still in flight (call again later).
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<Result<Message, SendError>> {
        self.pending.slot.take_until(Instant::now() + timeout, self.pending.spin.min(timeout))
    }

    /// Whether the send has completed (successfully or not).
    pub fn is_complete(&self) -> bool {
        self.pending.slot.is_complete()
    }
}

/// Awaiting a send is bounded like [`SendRequest::wait`]: `request_timeout` after the
/// first poll that found it pending, it ends as `wait()` would end it then.
impl Future for SendRequest {
    type Output = Result<Message, SendError>;
    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        self.get_mut().pending.poll(cx)
    }
}

/// A receive in progress. Completes with a whole message, never a partial one.
///
/// Dropping the request (a `recv()` future losing a `tokio::select!`, say) withdraws
/// it, and no message is lost: a receive still waiting is withdrawn (the buffers of a
/// `recv_into` are dropped with it), and a message that had already completed into it,
/// or arrives for it while it is being dropped, goes back to the front of the
/// endpoint's undelivered messages, in order, for the next receive. A message that
/// landed in a dropped `recv_into`'s buffers goes back in them.
#[must_use = "a receive completes in the background; wait for it to get the message"]
pub struct RecvRequest {
    pending: Pending<Result<Message, RecvError>>,
}

impl RecvRequest {
    pub(crate) fn new(
        slot: Arc<Slot<Result<Message, RecvError>>>,
        timeout: Duration,
        spin: Duration,
        link: Box<dyn Link<Result<Message, RecvError>>>,
    ) -> Self {
        Self { pending: Pending::new(slot, timeout, spin, link) }
    }

    /// Waits for a message, at most the context's `request_timeout`; after that the receive
    /// is cancelled (a message arriving later is kept for the next receive).
    pub fn wait(self) -> Result<Message, RecvError> {
        let result = self.pending.wait(|t| Err(RecvError::new(TransportError::TimedOut(t), None)));
        tracing::trace!("receive wait returned");
        result
    }

    /// Waits at most `timeout`; `None` when nothing arrived yet (call again later).
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<Result<Message, RecvError>> {
        self.pending.slot.take_until(Instant::now() + timeout, self.pending.spin.min(timeout))
    }

    /// Whether the receive has completed (successfully or not).
    pub fn is_complete(&self) -> bool {
        self.pending.slot.is_complete()
    }
}

/// Awaiting a receive is bounded like [`RecvRequest::wait`]: `request_timeout` after
/// the first poll that found it pending, it ends with `TimedOut` (a message arriving
/// later is kept for the next receive).
impl Future for RecvRequest {
    type Output = Result<Message, RecvError>;
    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        self.get_mut().pending.poll(cx)
    }
}

#[cfg(test)]
mod tests;
