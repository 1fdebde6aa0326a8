//! [`Slot`]: the cell a request's result travels through, filled once by the progress
//! thread and taken once by the request's owner (blocking, polled, or as a future). A
//! slot abandoned by its owner hands a result completed at the same moment back instead
//! of losing it ([`Slot::complete`]).

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
    /// The owner's handle is gone: nobody takes a result any more.
    abandoned: bool,
    waker: Option<Waker>,
    /// Threads blocked on the condition variable (a spinning waiter needs no notify,
    /// which is a system call).
    parked: usize,
}

/// What a request's handle left behind when it went ([`Slot::abandon`]).
pub(crate) enum Left<T> {
    /// It took the result: nothing is left.
    Taken,
    /// A result completed into the slot that it never took.
    Unclaimed(T),
    /// The request had not completed.
    Pending,
}

impl<T> Slot<T> {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(SlotState { value: None, completed: false, abandoned: false, waker: None, parked: 0 }),
            ready: Condvar::new(),
            completed: AtomicBool::new(false),
        })
    }

    /// Stores the result. The first completion wins; a later one, or one for a handle
    /// that is gone, comes back as `Err(value)` so the caller can put it elsewhere (a
    /// received message goes back to its endpoint).
    pub(crate) fn complete(&self, value: T) -> Result<(), T> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.completed || state.abandoned {
            return Err(value);
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
        Ok(())
    }

    /// The owner's handle goes: from now on [`Slot::complete`] hands results back.
    /// Says what the handle left behind.
    pub(crate) fn abandon(&self) -> Left<T> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.abandoned = true;
        state.waker = None;
        match state.value.take() {
            Some(v) => Left::Unclaimed(v),
            None if state.completed => Left::Taken,
            None => Left::Pending,
        }
    }

    /// Whether the owner's handle is gone.
    pub(crate) fn is_abandoned(&self) -> bool {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).abandoned
    }

    pub(crate) fn is_complete(&self) -> bool {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).completed
    }

    /// Takes the result, waiting until `deadline` at most; spins for `spin` first (a
    /// result that comes that soon is taken without a thread wake-up).
    pub(crate) fn take_until(&self, deadline: Instant, spin: Duration) -> Option<T> {
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

    /// Takes the result if it is there; else the task's waker is woken when it comes.
    pub(crate) fn poll_take(&self, cx: &TaskContext<'_>) -> Poll<T> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match state.value.take() {
            Some(v) => Poll::Ready(v),
            None => {
                if !state.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    state.waker = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }
}
