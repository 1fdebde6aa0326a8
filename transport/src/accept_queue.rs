//! [`AcceptQueue`]: the endpoints a listener's connections hand to `accept`, for
//! blocking waits and futures alike.

use crate::endpoint_shared::EndpointShared;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::Instant;

/// Why a wait for an endpoint ended without one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoEndpoint {
    /// Nothing came by the deadline.
    TimedOut,
    /// The progress thread stopped serving the listener.
    ContextClosed,
}

/// Filled by the progress thread as handshakes finish, emptied by `accept`.
#[derive(Default)]
pub(crate) struct AcceptQueue {
    state: Mutex<QueueState>,
    ready: Condvar,
}

#[derive(Default)]
struct QueueState {
    endpoints: VecDeque<Arc<EndpointShared>>,
    /// Tasks waiting in `accept_async` futures.
    wakers: Vec<Waker>,
    /// The listener is gone: nothing is queued any more.
    listener_gone: bool,
    /// The progress thread no longer serves the listener.
    context_gone: bool,
}

impl AcceptQueue {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Progress thread: queues an accepted endpoint; hands it back when the listener is
    /// gone (nobody will accept it).
    pub fn push(&self, endpoint: Arc<EndpointShared>) -> Result<(), Arc<EndpointShared>> {
        let mut state = self.lock();
        if state.listener_gone {
            return Err(endpoint);
        }
        state.endpoints.push_back(endpoint);
        let wakers = std::mem::take(&mut state.wakers);
        drop(state);
        self.ready.notify_one();
        wakers.into_iter().for_each(Waker::wake);
        Ok(())
    }

    /// Progress thread: it stops serving the listener (the context shuts down).
    pub fn close_by_context(&self) {
        let mut state = self.lock();
        state.context_gone = true;
        let wakers = std::mem::take(&mut state.wakers);
        drop(state);
        self.ready.notify_all();
        wakers.into_iter().for_each(Waker::wake);
    }

    /// The listener goes: what was queued and never accepted is dropped (the progress
    /// thread closes endpoints nobody holds), and nothing more is queued.
    pub fn close_by_listener(&self) {
        let mut state = self.lock();
        state.listener_gone = true;
        let unaccepted = std::mem::take(&mut state.endpoints);
        drop(state);
        drop(unaccepted);
    }

    /// Waits for the next endpoint until `deadline`.
    pub fn pop_until(&self, deadline: Instant) -> Result<Arc<EndpointShared>, NoEndpoint> {
        let mut state = self.lock();
        loop {
            if let Some(endpoint) = state.endpoints.pop_front() {
                return Ok(endpoint);
            }
            if state.context_gone {
                return Err(NoEndpoint::ContextClosed);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(NoEndpoint::TimedOut);
            }
            state = self.ready.wait_timeout(state, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Takes the next endpoint if one is queued; else the task is woken when one comes
    /// (`Pending`), or the context is gone.
    pub fn poll_pop(&self, cx: &TaskContext<'_>) -> Poll<Result<Arc<EndpointShared>, NoEndpoint>> {
        let mut state = self.lock();
        if let Some(endpoint) = state.endpoints.pop_front() {
            return Poll::Ready(Ok(endpoint));
        }
        if state.context_gone {
            return Poll::Ready(Err(NoEndpoint::ContextClosed));
        }
        if !state.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            state.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}
