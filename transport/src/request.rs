//! Requests: handles on work the progress thread completes.
//!
//! Each request owns a [`Slot`] the progress thread fills exactly once. `wait()` blocks
//! (never longer than the context's `request_timeout`), `wait_timeout(d)` polls with a
//! bound, and requests implement [`Future`] so async users need no runtime from us.

use crate::error::{RecvError, SendError, TransportError};
use ferrylink_memory::Message;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::{Duration, Instant};

/// Filled once by the progress thread, taken once by the request's owner.
pub(crate) struct Slot<T> {
    state: Mutex<SlotState<T>>,
    ready: Condvar,
    /// Set once completed: lets a waiter spin without taking the lock.
    completed: AtomicBool,
}

struct SlotState<T> {
    value: Option<T>,
    completed: bool,
    waker: Option<Waker>,
    /// Threads blocked on the condition variable (a spinning waiter needs no notify,
    /// which is a system call).
    parked: usize,
}

impl<T> Slot<T> {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(SlotState { value: None, completed: false, waker: None, parked: 0 }),
            ready: Condvar::new(),
            completed: AtomicBool::new(false),
        })
    }

    /// Stores the result; later calls are ignored (the first completion wins).
    pub(crate) fn complete(&self, value: T) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.completed {
            return;
        }
        state.completed = true;
        state.value = Some(value);
        self.completed.store(true, Ordering::Release);
        let waker = state.waker.take();
        let parked = state.parked > 0;
        drop(state);
        if parked {
            self.ready.notify_all();
        }
        if let Some(w) = waker {
            w.wake();
        }
    }

    pub(crate) fn is_complete(&self) -> bool {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).completed
    }

    /// Takes the result, waiting until `deadline` at most; spins for `spin` first (a
    /// result that comes that soon is taken without a thread wake-up).
    fn take_until(&self, deadline: Instant, spin: Duration) -> Option<T> {
        let spin_until = (Instant::now() + spin).min(deadline);
        let mut spins = 0u32;
        while !self.completed.load(Ordering::Acquire) {
            // Read the clock and yield the core only now and then: on a busy machine the
            // thread that will complete us may need this core, and both cost more than a
            // check of the flag.
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) {
                if Instant::now() >= spin_until {
                    break;
                }
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(v) = state.value.take() {
                return Some(v);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            state.parked += 1;
            state = self.ready.wait_timeout(state, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
            state.parked -= 1;
        }
    }

    fn poll_take(&self, cx: &mut TaskContext<'_>) -> Poll<T> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match state.value.take() {
            Some(v) => Poll::Ready(v),
            None => {
                state.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Asks the progress thread to give up a request that timed out.
pub(crate) type Canceller = Box<dyn Fn() + Send + Sync>;

/// How long a cancelled request may take to report its final state.
const CANCEL_GRACE: Duration = Duration::from_secs(5);

struct Pending<T> {
    slot: Arc<Slot<T>>,
    timeout: Duration,
    spin: Duration,
    cancel: Canceller,
}

impl<T> Pending<T> {
    /// Waits up to the timeout; then cancels and takes what the progress thread reports
    /// (the request may have completed meanwhile: nothing is lost).
    fn wait(self, timed_out: impl FnOnce(Duration) -> T) -> T {
        if let Some(v) = self.slot.take_until(Instant::now() + self.timeout, self.spin) {
            return v;
        }
        (self.cancel)();
        self.slot.take_until(Instant::now() + CANCEL_GRACE, Duration::ZERO).unwrap_or_else(|| timed_out(self.timeout))
    }
}

/// A send in progress. Completes when the receiver has the data (copied into its own
/// memory) and acknowledged it: only then is the message handed back for reuse.
#[must_use = "a send completes in the background; wait for it to reuse the buffers or see errors"]
pub struct SendRequest {
    pending: Pending<Result<Message, SendError>>,
}

impl SendRequest {
    pub(crate) fn new(
        slot: Arc<Slot<Result<Message, SendError>>>,
        timeout: Duration,
        spin: Duration,
        cancel: Canceller,
    ) -> Self {
        Self { pending: Pending { slot, timeout, spin, cancel } }
    }

    /// Waits for the send, at most the context's `request_timeout`. On success the message
    /// comes back, its buffers free to reuse.
    pub fn wait(self) -> Result<Message, SendError> {
        let result = self.pending.wait(|t| Err(SendError { error: TransportError::TimedOut(t), message: None }));
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

impl Future for SendRequest {
    type Output = Result<Message, SendError>;
    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        self.pending.slot.poll_take(cx)
    }
}

/// A receive in progress. Completes with a whole message, never a partial one.
#[must_use = "a receive completes in the background; wait for it to get the message"]
pub struct RecvRequest {
    pending: Pending<Result<Message, RecvError>>,
}

impl RecvRequest {
    pub(crate) fn new(
        slot: Arc<Slot<Result<Message, RecvError>>>,
        timeout: Duration,
        spin: Duration,
        cancel: Canceller,
    ) -> Self {
        Self { pending: Pending { slot, timeout, spin, cancel } }
    }

    /// Waits for a message, at most the context's `request_timeout`; after that the receive
    /// is cancelled (a message arriving later is kept for the next receive).
    pub fn wait(self) -> Result<Message, RecvError> {
        let result = self.pending.wait(|t| Err(RecvError { error: TransportError::TimedOut(t), buffers: None }));
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

impl Future for RecvRequest {
    type Output = Result<Message, RecvError>;
    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        self.pending.slot.poll_take(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::Wake;

    #[test]
    fn first_completion_wins_and_wait_returns_it() {
        let slot = Slot::new();
        slot.complete(Ok(Message::default()));
        slot.complete(Err(SendError { error: TransportError::EndpointClosed, message: None }));
        let req = SendRequest::new(slot, Duration::from_secs(1), Duration::ZERO, Box::new(|| {}));
        assert!(req.is_complete());
        assert!(req.wait().is_ok());
    }

    #[test]
    fn wait_times_out_cancels_and_reports_timeout() {
        let cancelled = Arc::new(AtomicBool::new(false));
        let c = cancelled.clone();
        let slot = Slot::new();
        let s2 = slot.clone();
        // The "progress thread" answers the cancel with the timeout error.
        let req = RecvRequest::new(
            slot,
            Duration::from_millis(20),
            Duration::from_micros(100),
            Box::new(move || {
                c.store(true, Ordering::SeqCst);
                s2.complete(Err(RecvError {
                    error: TransportError::TimedOut(Duration::from_millis(20)),
                    buffers: None,
                }));
            }),
        );
        let err = req.wait().unwrap_err();
        assert!(cancelled.load(Ordering::SeqCst));
        assert!(matches!(err.error, TransportError::TimedOut(_)));
    }

    #[test]
    fn a_completion_racing_the_cancel_is_not_lost() {
        let slot = Slot::new();
        let s2 = slot.clone();
        let req = RecvRequest::new(
            slot,
            Duration::from_millis(10),
            Duration::ZERO,
            Box::new(move || s2.complete(Ok(Message::new(b"late".to_vec(), vec![])))),
        );
        assert_eq!(req.wait().unwrap().header, b"late");
    }

    #[test]
    fn wait_timeout_leaves_the_request_usable() {
        let slot = Slot::new();
        let mut req =
            SendRequest::new(slot.clone(), Duration::from_secs(1), Duration::from_micros(50), Box::new(|| {}));
        assert!(req.wait_timeout(Duration::from_millis(1)).is_none());
        slot.complete(Ok(Message::default()));
        assert!(req.wait_timeout(Duration::from_millis(1)).unwrap().is_ok());
    }

    struct Flag(AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn future_is_woken_on_completion() {
        let slot = Slot::new();
        let mut req =
            SendRequest::new(slot.clone(), Duration::from_secs(1), Duration::from_micros(50), Box::new(|| {}));
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let waker = Waker::from(flag.clone());
        let mut cx = TaskContext::from_waker(&waker);
        assert!(Pin::new(&mut req).poll(&mut cx).is_pending());
        slot.complete(Ok(Message::default()));
        assert!(flag.0.load(Ordering::SeqCst));
        assert!(matches!(Pin::new(&mut req).poll(&mut cx), Poll::Ready(Ok(_))));
    }
}
