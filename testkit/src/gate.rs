//! [`Gate`]: holds back a piece of work a test stands in for (a file removal, a free) until
//! the test opens it, so the test can see whether a caller waited for that work;
//! [`returns_within`] runs the caller on a thread, bounded.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// A gate that starts closed; [`pass`](Gate::pass) waits until it is opened.
#[derive(Default)]
pub struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
    waiting: Mutex<usize>,
}

impl Gate {
    /// Opens the gate for good: every waiter passes, and so does every later one.
    pub fn open(&self) {
        *self.open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.opened.notify_all();
    }

    /// Returns once the gate is open.
    pub fn pass(&self) {
        *self.waiting.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        drop(self.opened.wait_while(open, |open| !*open).unwrap_or_else(|e| e.into_inner()));
        *self.waiting.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
    }

    /// How many are waiting at the gate now.
    pub fn waiting(&self) -> usize {
        *self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Runs `f` on a thread of its own; what it returned, or `None` if it has not returned
/// within `bound` (the thread is left to finish on its own).
pub fn returns_within<T: Send + 'static>(bound: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (done, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(f()));
    result.recv_timeout(bound).ok()
}
