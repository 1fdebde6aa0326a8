//! Time on the progress thread for tasks that wait without a runtime: wake-ups at a time
//! (an `accept_async`'s bound, a `connect_async`'s retry), and how long the thread may
//! sleep before the next timer is due. The deadlines of requests awaited as futures live
//! with their connections (`requests.rs`); they count here too.

use crate::command::WakerCell;
use std::collections::BTreeMap;
use std::sync::Weak;
use std::time::Instant;

/// Tasks to wake, soonest first.
#[derive(Default)]
pub(super) struct WakeTimers {
    due: BTreeMap<(Instant, u64), Weak<WakerCell>>,
    /// Tells apart timers due at the same instant.
    next_seq: u64,
}

impl WakeTimers {
    pub(super) fn add(&mut self, at: Instant, waker: Weak<WakerCell>) {
        self.next_seq += 1;
        self.due.insert((at, self.next_seq), waker);
    }

    /// Wakes the tasks due by `now` (a task that is gone is skipped).
    pub(super) fn fire(&mut self, now: Instant) {
        while let Some(entry) = self.due.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let Some(cell) = entry.remove().upgrade() else { continue };
            let waker = cell.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(waker) = waker {
                waker.wake();
            }
        }
    }

    /// Wakes every task, due or not (the thread stops).
    pub fn wake_all(&mut self) {
        for (_, waker) in std::mem::take(&mut self.due) {
            let Some(cell) = waker.upgrade() else { continue };
            let waker = cell.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(waker) = waker {
                waker.wake();
            }
        }
    }

    pub(super) fn next(&self) -> Option<Instant> {
        self.due.first_key_value().map(|(&(at, _), _)| at)
    }
}
