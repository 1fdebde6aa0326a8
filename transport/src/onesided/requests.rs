//! Requests of one-sided transfers: [`ImportRequest`], [`TransferRequest`] and
//! [`NotificationRequest`], with `wait()`, `wait_timeout()` and `Future` as the other
//! requests have, and the same bound.

use crate::error::TransportError;
use crate::inner::ContextInner;
use crate::onesided::{Notification, RemoteRegion};
use crate::request::{Link, Pending};
use crate::slot::Slot;
use ferrylink_proto::region::ImportedRegion;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

fn pending<T>(slot: Arc<Slot<T>>, timeout: Duration, spin: Duration, link: Box<dyn Link<T>>) -> Pending<T> {
    Pending::new(slot, timeout, spin, link)
}

/// An import in progress ([`crate::Endpoint::import`]): completes with the peer's region,
/// or why the owner refused it. Dropping it before it completed gives a region granted
/// meanwhile back to its owner.
#[must_use = "an import completes in the background; wait for it to get the region"]
pub struct ImportRequest {
    pending: Pending<Result<ImportedRegion, TransportError>>,
    ep: usize,
    ctx: Arc<ContextInner>,
}

impl ImportRequest {
    pub(crate) fn new(
        slot: Arc<Slot<Result<ImportedRegion, TransportError>>>,
        (timeout, spin): (Duration, Duration),
        link: Box<dyn Link<Result<ImportedRegion, TransportError>>>,
        ep: usize,
        ctx: Arc<ContextInner>,
    ) -> Self {
        Self { pending: pending(slot, timeout, spin, link), ep, ctx }
    }

    fn region(&self, result: Result<ImportedRegion, TransportError>) -> Result<RemoteRegion, TransportError> {
        result.map(|info| RemoteRegion { ep: self.ep, info, ctx: self.ctx.clone() })
    }

    /// Waits for the owner's answer, at most the context's `request_timeout`.
    pub fn wait(self) -> Result<RemoteRegion, TransportError> {
        let result = self.pending.wait(|t| Err(TransportError::TimedOut(t)));
        self.region(result)
    }

    /// Waits at most `timeout`; `None` when not answered yet.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<Result<RemoteRegion, TransportError>> {
        let result = self.pending.slot.take_until(Instant::now() + timeout, self.pending.spin.min(timeout))?;
        Some(self.region(result))
    }

    /// Whether the owner has answered.
    pub fn is_complete(&self) -> bool {
        self.pending.slot.is_complete()
    }
}

impl Future for ImportRequest {
    type Output = Result<RemoteRegion, TransportError>;
    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match this.pending.poll(cx) {
            Poll::Ready(result) => Poll::Ready(this.region(result)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// A `put` or `get` in progress ([`crate::Endpoint::put`]): completes once every byte is
/// in place (for a `put`, in the remote region; a notification it carries goes after), or
/// fails with what went wrong (a refused span, a revoked region, the owner gone). A
/// transfer is not recalled: dropping the request only stops waiting for it.
#[must_use = "a transfer completes in the background; wait for it to know the bytes are there"]
pub struct TransferRequest {
    pending: Pending<Result<(), TransportError>>,
}

impl TransferRequest {
    pub(crate) fn new(
        slot: Arc<Slot<Result<(), TransportError>>>,
        (timeout, spin): (Duration, Duration),
        link: Box<dyn Link<Result<(), TransportError>>>,
    ) -> Self {
        Self { pending: pending(slot, timeout, spin, link) }
    }

    /// Waits for the transfer, at most the context's `request_timeout`.
    pub fn wait(self) -> Result<(), TransportError> {
        self.pending.wait(|t| Err(TransportError::TimedOut(t)))
    }

    /// Waits at most `timeout`; `None` when still running.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<Result<(), TransportError>> {
        self.pending.slot.take_until(Instant::now() + timeout, self.pending.spin.min(timeout))
    }

    /// Whether the transfer has ended.
    pub fn is_complete(&self) -> bool {
        self.pending.slot.is_complete()
    }
}

impl Future for TransferRequest {
    type Output = Result<(), TransportError>;
    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        self.get_mut().pending.poll(cx)
    }
}

/// A wait for the next notification ([`crate::Endpoint::recv_notification`]). Dropping it
/// loses nothing: a notification that came for it goes to the next one.
#[must_use = "a notification receive completes in the background; wait for it"]
pub struct NotificationRequest {
    pending: Pending<Result<Vec<u8>, TransportError>>,
}

impl NotificationRequest {
    pub(crate) fn new(
        slot: Arc<Slot<Result<Vec<u8>, TransportError>>>,
        (timeout, spin): (Duration, Duration),
        link: Box<dyn Link<Result<Vec<u8>, TransportError>>>,
    ) -> Self {
        Self { pending: pending(slot, timeout, spin, link) }
    }

    /// Waits for a notification, at most the context's `request_timeout`.
    pub fn wait(self) -> Result<Notification, TransportError> {
        self.pending.wait(|t| Err(TransportError::TimedOut(t))).map(|data| Notification { data })
    }

    /// Waits at most `timeout`; `None` when none came yet.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<Result<Notification, TransportError>> {
        let result = self.pending.slot.take_until(Instant::now() + timeout, self.pending.spin.min(timeout))?;
        Some(result.map(|data| Notification { data }))
    }

    /// Whether a notification (or the end of the wait) came.
    pub fn is_complete(&self) -> bool {
        self.pending.slot.is_complete()
    }
}

impl Future for NotificationRequest {
    type Output = Result<Notification, TransportError>;
    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        match self.get_mut().pending.poll(cx) {
            Poll::Ready(result) => Poll::Ready(result.map(|data| Notification { data })),
            Poll::Pending => Poll::Pending,
        }
    }
}
