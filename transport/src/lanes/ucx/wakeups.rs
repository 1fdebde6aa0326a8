//! What woke the progress thread from a sleep with the UCX worker armed: the worker's
//! event fd, or the timeout (the driver's tick) after which progress found UCX work that
//! a live fd would have signalled first. The tick alone would hide an fd that never
//! fires (deliveries only come later), so tests count both (`tests/ucx_lane.rs`).
//!
//! Counted per process in relaxed atomics: one increment per wake-up, which already cost
//! a system call. Read with the `testing` feature ([`ucx_wakeups`]).

use std::sync::atomic::{AtomicU64, Ordering};

/// Wake-ups of the progress threads of this process from sleeps with the UCX worker armed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UcxWakeups {
    /// The worker's event fd was ready.
    pub by_event_fd: u64,
    /// The sleep timed out with nothing else ready, and progress then found UCX work.
    pub repolls_with_work: u64,
    /// The sleep timed out and progress found nothing.
    pub idle_repolls: u64,
}

/// The counters behind [`UcxWakeups`].
#[derive(Debug, Default)]
pub(crate) struct WakeupCounters {
    by_event_fd: AtomicU64,
    repolls_with_work: AtomicU64,
    idle_repolls: AtomicU64,
}

impl WakeupCounters {
    fn snapshot(&self) -> UcxWakeups {
        UcxWakeups {
            by_event_fd: self.by_event_fd.load(Ordering::Relaxed),
            repolls_with_work: self.repolls_with_work.load(Ordering::Relaxed),
            idle_repolls: self.idle_repolls.load(Ordering::Relaxed),
        }
    }
}

/// Every progress thread of this process counts here.
static PROCESS: WakeupCounters = WakeupCounters {
    by_event_fd: AtomicU64::new(0),
    repolls_with_work: AtomicU64::new(0),
    idle_repolls: AtomicU64::new(0),
};

/// The counts so far (every context of this process together).
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub fn ucx_wakeups() -> UcxWakeups {
    PROCESS.snapshot()
}

/// One progress thread's view from arming the worker to the next progress of it.
#[derive(Debug)]
pub(crate) struct WakeupWatch {
    counters: &'static WakeupCounters,
    /// The worker is armed for the coming sleep.
    armed: bool,
    /// The last sleep timed out with nothing ready: the next progress tells whether UCX
    /// had work.
    timed_out: bool,
}

impl Default for WakeupWatch {
    fn default() -> Self {
        Self { counters: &PROCESS, armed: false, timed_out: false }
    }
}

impl WakeupWatch {
    /// `ucp_worker_arm` succeeded: the coming sleep relies on the fd.
    pub fn armed(&mut self) {
        self.armed = true;
    }

    /// `poll` returned: whether it waited at all, whether the worker's fd was ready, and
    /// whether anything else was.
    pub fn woke(&mut self, slept: bool, event_fd_ready: bool, other_events: bool) {
        let armed = std::mem::take(&mut self.armed);
        self.timed_out = false;
        if !(armed && slept) {
            return;
        }
        if event_fd_ready {
            self.counters.by_event_fd.fetch_add(1, Ordering::Relaxed);
        } else if !other_events {
            self.timed_out = true;
        }
    }

    /// The worker was progressed and handled `events`.
    pub fn progressed(&mut self, events: u64) {
        if std::mem::take(&mut self.timed_out) {
            let counter = if events > 0 { &self.counters.repolls_with_work } else { &self.counters.idle_repolls };
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sleeps_with_the_worker_armed_count_and_a_timeout_counts_once_progressed() {
        let counters: &'static WakeupCounters = Box::leak(Box::default());
        let mut watch = WakeupWatch { counters, armed: false, timed_out: false };
        watch.woke(true, true, false); // not armed
        watch.armed();
        watch.woke(false, true, false); // armed, but did not sleep
        watch.armed();
        watch.woke(true, true, true); // the fd, with a socket
        watch.armed();
        watch.woke(true, false, true); // a socket only: not a re-poll
        watch.progressed(3);
        watch.armed();
        watch.woke(true, false, false); // timed out
        watch.progressed(2);
        watch.progressed(2); // counted once
        watch.armed();
        watch.woke(true, false, false);
        watch.progressed(0);
        watch.woke(true, false, false); // not armed again
        watch.progressed(1);
        assert_eq!(counters.snapshot(), UcxWakeups { by_event_fd: 1, repolls_with_work: 1, idle_repolls: 1 });
    }
}
