//! How a spinning progress thread paces its turns: when it reads the clock, asks the
//! kernel about its sockets, and gives its core away.
//!
//! Each of the three costs more than a turn that finds nothing to do (H200 host 1 kB
//! round trip, `perf`: `sched_yield` every 8th turn took a sixth of the progress thread's
//! time, the clock read every turn a tenth, `epoll_wait` a twelfth), and a message that
//! arrives while the thread is in one of them waits for it. So while spinning the clock
//! is read fresh only after a turn that did something or every few turns, the kernel is
//! asked every few turns, and the core is given away by time, not by turn count.

use std::time::{Duration, Instant};

/// While spinning on idle turns, the clock is read once per this many turns (a turn that
/// did something reads it at once: what it starts is timed from then).
const CLOCK_EVERY_TURNS: u32 = 4;
/// While spinning with every connection on control rings, the kernel is asked about the
/// sockets (and listeners) once per this many turns: they carry only wake-ups, descriptors
/// (read at once when a ring message needs them), new connections and a peer's end.
const POLL_EVERY_TURNS: u32 = 16;
/// While spinning, the thread yields its core at most this often: on a machine with a
/// core to spare the yield only costs its system call, and on a busy one the threads that
/// need the core get it within this time.
const YIELD_EVERY: Duration = Duration::from_micros(20);

/// The progress thread's pacing state, one per thread.
pub(super) struct Pacing {
    now: Instant,
    turns_since_clock: u32,
    turns_since_poll: u32,
    last_yield: Instant,
}

impl Pacing {
    pub fn new(now: Instant) -> Self {
        Self { now, turns_since_clock: 0, turns_since_poll: 0, last_yield: now }
    }

    /// The turn's time: `clock()` when the turn did something (`active`), when the thread
    /// may sleep after it (`!spinning`), or every [`CLOCK_EVERY_TURNS`]; else the last
    /// reading (at most a few idle turns old).
    pub fn turn_time(&mut self, active: bool, spinning: bool, clock: impl FnOnce() -> Instant) -> Instant {
        self.turns_since_clock += 1;
        if active || !spinning || self.turns_since_clock >= CLOCK_EVERY_TURNS {
            self.turns_since_clock = 0;
            self.now = clock();
        }
        self.now
    }

    /// Whether this turn asks the kernel (`rings_only`: spinning with every connection on
    /// control rings; otherwise every turn asks).
    pub fn polls_kernel(&mut self, rings_only: bool) -> bool {
        self.turns_since_poll += 1;
        if rings_only && self.turns_since_poll < POLL_EVERY_TURNS {
            return false;
        }
        self.turns_since_poll = 0;
        true
    }

    /// Whether the spinning thread should give its core away now (`now`: the turn's time).
    pub fn yield_due(&mut self, now: Instant) -> bool {
        if now.saturating_duration_since(self.last_yield) < YIELD_EVERY {
            return false;
        }
        self.last_yield = now;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_spinning_turns_reuse_the_clock_and_active_or_sleepy_ones_read_it() {
        let t0 = Instant::now();
        let mut p = Pacing::new(t0);
        let mut reads = 0;
        let mut clock = |i: u64| {
            reads += 1;
            t0 + Duration::from_micros(i)
        };
        let mut seen = Vec::new();
        for i in 1..=8 {
            seen.push(p.turn_time(false, true, || clock(i)));
        }
        assert_eq!(reads, 2, "idle spinning turns read the clock every {CLOCK_EVERY_TURNS}th turn");
        assert_eq!(seen[0], t0, "a reused reading is the last one");
        assert_eq!(seen[3], t0 + Duration::from_micros(4));
        assert_eq!(seen[7], t0 + Duration::from_micros(8));
        assert_eq!(p.turn_time(true, true, || t0 + Duration::from_micros(9)), t0 + Duration::from_micros(9));
        assert_eq!(p.turn_time(false, false, || t0 + Duration::from_micros(10)), t0 + Duration::from_micros(10));
    }

    #[test]
    fn the_kernel_is_asked_every_few_turns_on_rings_and_every_turn_otherwise() {
        let mut p = Pacing::new(Instant::now());
        let asked: Vec<bool> = (0..POLL_EVERY_TURNS * 2).map(|_| p.polls_kernel(true)).collect();
        assert_eq!(asked.iter().filter(|a| **a).count(), 2);
        assert!((0..5).all(|_| p.polls_kernel(false)));
    }

    #[test]
    fn yields_come_by_time_not_by_turn() {
        let t0 = Instant::now();
        let mut p = Pacing::new(t0);
        assert!((0..1000).all(|_| !p.yield_due(t0 + YIELD_EVERY / 2)));
        assert!(p.yield_due(t0 + YIELD_EVERY));
        assert!(!p.yield_due(t0 + YIELD_EVERY + YIELD_EVERY / 2));
        assert!(p.yield_due(t0 + YIELD_EVERY * 2));
    }
}
