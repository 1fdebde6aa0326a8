//! [`TaskTimer`]: wakes a task at a time, without a runtime: the progress thread keeps
//! the time and wakes the task's latest waker (`driver/timers.rs`). Futures that wait for
//! something with a bound (`accept_async`, `connect_async`) use one.

use crate::command::{Command, WakerCell};
use crate::inner::ContextInner;
use std::sync::{Arc, Mutex};
use std::task::Context as TaskContext;
use std::time::Instant;

/// A task's wake-up at one or more times.
pub(crate) struct TaskTimer {
    waker: Arc<WakerCell>,
}

impl TaskTimer {
    pub fn new() -> Self {
        Self { waker: Arc::new(Mutex::new(None)) }
    }

    /// The task polling now is the one to wake (a future may move between tasks).
    pub fn register(&self, cx: &TaskContext<'_>) {
        let mut waker = self.waker.lock().unwrap_or_else(|e| e.into_inner());
        if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *waker = Some(cx.waker().clone());
        }
    }

    /// Asks the progress thread to wake the registered task at `at`; `false` when the
    /// thread is gone (nothing will wake the task).
    pub fn wake_at(&self, ctx: &ContextInner, at: Instant) -> bool {
        ctx.submit(Command::WakeAt { at, waker: Arc::downgrade(&self.waker) }).is_ok()
    }
}
