//! The progress thread's loop: each turn takes the engine from its cell, asks the kernel
//! about the sockets (sleeping with the engine's lock given back), and runs the engine's
//! turn. While callers spin on requests of native-lane endpoints they take the turns
//! for their connections themselves (`help.rs`); the thread then takes one only every
//! [`LEAVE_TO_CALLERS`], for what callers leave (sockets, listeners, other connections,
//! deferred commands), unless a connection uses the UCX lane, whose work is all the
//! progress thread's.

use super::cell::EngineCell;
use super::pacing::Pacing;
use super::{Engine, RING_FULL_RETRY, TICK};
use mio::{Events, Poll};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// While callers spin on their requests, the progress thread takes a turn at most this
/// often (it still spins, so it answers at once when they stop).
const LEAVE_TO_CALLERS: Duration = Duration::from_micros(20);

/// What the progress thread keeps between turns.
struct LoopState {
    events: Events,
    timeout: Duration,
    last_activity: Instant,
    last_turn: Instant,
    pacing: Pacing,
    spinning: bool,
    /// Every connection carries its messages on control rings (the kernel is then asked
    /// about the sockets every few turns only; `pacing.rs`).
    rings_only: bool,
    /// No connection has used the UCX lane, whose work callers never take: turns may be
    /// left to spinning callers.
    callers_may_lead: bool,
}

/// The loop, until the engine shuts down. `sleeping` is set while the thread may block in
/// `poll`, so user threads wake it only then (see `ContextInner::submit`).
pub(crate) fn run(cell: &EngineCell, mut poll: Poll, sleeping: &AtomicBool) {
    let now = Instant::now();
    let mut state = LoopState {
        events: Events::with_capacity(256),
        timeout: TICK,
        last_activity: now,
        last_turn: now,
        pacing: Pacing::new(now),
        spinning: false,
        rings_only: false,
        callers_may_lead: false,
    };
    loop {
        if state.spinning && state.callers_may_lead && cell.callers_waiting() && !cell.has_deferred() {
            let now = Instant::now();
            if now.saturating_duration_since(state.last_turn) < LEAVE_TO_CALLERS {
                // The callers need the cores more: on a machine with fewer cores than
                // spinning threads a spinning progress thread would take theirs.
                std::thread::yield_now();
                continue;
            }
        }
        match wait_for_events(cell, &mut poll, &mut state, sleeping) {
            Ok(slept) => {
                let mut guard = cell.lock();
                cell.clear_deferred();
                let Some(engine) = guard.engine_slot() else { return };
                let Some(spin) = turn(engine, &mut state, slept, cell.callers_waiting()) else { break };
                drop(guard);
                if spin {
                    spin_or_yield(&mut state.pacing, state.last_turn);
                }
            }
            Err(e) => {
                tracing::error!("poll failed: {e}; the progress engine stops");
                break;
            }
        }
    }
    if let Some(mut engine) = cell.take() {
        engine.shutdown();
    }
}

/// Waits for socket events: at most `state.timeout`, with the engine's lock given back
/// while it may sleep; while spinning on rings only every few turns. Whether it could
/// sleep.
fn wait_for_events(
    cell: &EngineCell,
    poll: &mut Poll,
    state: &mut LoopState,
    sleeping: &AtomicBool,
) -> std::io::Result<bool> {
    let mut timeout = state.timeout;
    let may_sleep = timeout > Duration::ZERO;
    if may_sleep {
        let mut guard = cell.lock();
        match guard.engine_slot() {
            Some(engine) => timeout = engine.arm_for_sleep(timeout, sleeping),
            None => return Ok(false),
        }
    }
    let polled = if may_sleep || state.pacing.polls_kernel(state.rings_only) {
        poll.poll(&mut state.events, Some(timeout))
    } else {
        state.events.clear();
        Ok(())
    };
    sleeping.store(false, Ordering::SeqCst);
    if may_sleep {
        if let Some(engine) = cell.lock().engine_slot() {
            engine.disarm_after_sleep();
        }
    }
    match polled {
        Err(e) if e.kind() != std::io::ErrorKind::Interrupted => Err(e),
        _ => Ok(timeout > Duration::ZERO),
    }
}

/// One turn of the engine: `None` once it shuts down, else whether the thread spins (it
/// may not sleep before its next turn). `callers_waiting`: callers spin on requests now
/// (the thread keeps spinning meanwhile: they may leave it work).
fn turn(engine: &mut Engine, state: &mut LoopState, slept: bool, callers_waiting: bool) -> Option<bool> {
    engine.note_ucx_wakeup(slept, &state.events);
    let mut active = engine.dispatch(&state.events);
    active |= engine.drain_commands()?;
    // One time a turn: timers, deadlines and the spin window all use it (reading the
    // clock was a tenth of a host round trip's samples when every step read its own), and
    // idle spinning turns reuse it for a few turns.
    let now = state.pacing.turn_time(active, state.spinning, Instant::now);
    state.last_turn = now;
    let (busy, ring_blocked) = engine.turn_connections(now);
    if active || callers_waiting {
        state.last_activity = now;
    }
    // Spin (poll without sleeping) for a while after activity: the reply to what just
    // happened is then seen without a wake-up.
    state.spinning = now.saturating_duration_since(state.last_activity) < engine.config.busy_poll;
    state.rings_only = engine.rings_only();
    state.callers_may_lead = !engine.ucx_in_use;
    state.timeout = if state.spinning {
        Duration::ZERO
    } else if ring_blocked {
        // A full ring empties as the peer reads: look again soon.
        engine.next_timeout(busy).min(RING_FULL_RETRY)
    } else {
        engine.next_timeout(busy)
    };
    if let Some(until) = engine.until_next_timer(now) {
        state.timeout = state.timeout.min(until);
    }
    Some(state.spinning || busy)
}

/// Gives the core away now and then only: every yield is a system call on the path of
/// whatever the next turn would have seen.
fn spin_or_yield(pacing: &mut Pacing, now: Instant) {
    if pacing.yield_due(now) {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}
