//! [`EngineCell`]: the progress engine behind a lock, so that a user thread waiting for
//! one of its requests can take a turn of the engine itself (decision 0044).
//!
//! The progress thread makes the engine, puts it in the cell, takes it for each turn and
//! takes it out for good when it ends. A waiting caller only ever tries the lock: when the
//! progress thread holds it, the caller spins as before. While callers are waiting the
//! progress thread leaves most of its turns to them ([`EngineCell::callers_waiting`]).

use super::Engine;
use crate::slot::SpinTurn;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

/// The engine and its lock.
pub(crate) struct EngineCell {
    /// Held by whoever runs a turn.
    locked: AtomicBool,
    /// Callers spinning on a request with a [`CallerWait`] (see `Slot::take_until_helping`).
    waiting: AtomicUsize,
    /// Whether callers take turns at all (`Config::caller_turns`).
    enabled: bool,
    /// A caller's turn left a command to the progress thread since its last turn.
    deferred: AtomicBool,
    engine: UnsafeCell<Option<Engine>>,
}

// SAFETY: the engine is reached only through `EngineGuard`, which exists only while
// `locked` is held (Acquire on taking it, Release on giving it back), so one thread at a
// time touches it and each sees the last one's writes. What in it may not leave its thread
// (the UCX worker and what holds it through `Rc`) is touched by the progress thread only:
// a caller's turn (`Engine::help`) defers every command for a UCX connection, never turns
// one, never progresses the worker and never drops a connection; the engine is made and
// dropped on the progress thread (`install`, `take`).
unsafe impl Sync for EngineCell {}
// SAFETY: as above; the cell is shared through an `Arc` and never moved out of it.
unsafe impl Send for EngineCell {}

/// A held lock on the engine (released when dropped).
pub(crate) struct EngineGuard<'a> {
    cell: &'a EngineCell,
}

impl EngineCell {
    pub(crate) fn new(enabled: bool) -> Self {
        Self {
            locked: AtomicBool::new(false),
            waiting: AtomicUsize::new(0),
            enabled,
            deferred: AtomicBool::new(false),
            engine: UnsafeCell::new(None),
        }
    }

    /// Takes the lock if it is free.
    fn try_lock(&self) -> Option<EngineGuard<'_>> {
        // A guard exists only once the lock is taken: dropping one releases it.
        let taken = self.locked.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok();
        taken.then(|| EngineGuard { cell: self })
    }

    /// Takes the lock, spinning while a caller holds it (a caller's turn is short).
    pub(super) fn lock(&self) -> EngineGuard<'_> {
        loop {
            if let Some(guard) = self.try_lock() {
                return guard;
            }
            while self.locked.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        }
    }

    /// Puts the engine in the cell (the progress thread, once it made it).
    pub(crate) fn install(&self, engine: Engine) {
        *self.lock().engine_slot() = Some(engine);
    }

    /// Takes the engine out for good (the progress thread, when it ends): callers find
    /// nothing to do from then on.
    pub(super) fn take(&self) -> Option<Engine> {
        self.lock().engine_slot().take()
    }

    /// Whether a caller's turn left a command to the progress thread since its last turn.
    pub(super) fn has_deferred(&self) -> bool {
        self.deferred.load(Ordering::Relaxed)
    }

    /// The progress thread takes its turn: what callers left is seen in it.
    pub(super) fn clear_deferred(&self) {
        self.deferred.store(false, Ordering::Relaxed);
    }

    /// Whether callers are waiting in their spin loops now.
    pub(super) fn callers_waiting(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) > 0
    }

    /// A caller starts or stops spinning on a request of endpoint `ep`: see
    /// [`CallerWait`].
    pub(crate) fn caller_wait(&self, ep: usize) -> Option<CallerWait<'_>> {
        self.enabled.then(|| {
            self.waiting.fetch_add(1, Ordering::Relaxed);
            CallerWait { cell: self, ep }
        })
    }
}

/// A caller spinning on a request of one endpoint; its [`SpinTurn::take_turn`] takes a turn of
/// the engine for that endpoint when the lock is free.
pub(crate) struct CallerWait<'a> {
    cell: &'a EngineCell,
    ep: usize,
}

impl SpinTurn for CallerWait<'_> {
    /// One turn of the engine for this caller's endpoint, if nobody else holds it.
    fn take_turn(&self) {
        if let Some(mut guard) = self.cell.try_lock() {
            if let Some(engine) = guard.engine_slot() {
                if engine.help(self.ep, Instant::now()) {
                    self.cell.deferred.store(true, Ordering::Relaxed);
                }
            }
        }
    }
}

impl Drop for CallerWait<'_> {
    fn drop(&mut self) {
        self.cell.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

impl EngineGuard<'_> {
    /// The engine (`None` before it is installed and after it was taken).
    pub(super) fn engine_slot(&mut self) -> &mut Option<Engine> {
        // SAFETY: this guard holds the lock, so no other reference to the engine exists
        // (see the `Sync` impl); the reference lives no longer than the guard.
        unsafe { &mut *self.cell.engine.get() }
    }
}

impl Drop for EngineGuard<'_> {
    fn drop(&mut self) {
        self.cell.locked.store(false, Ordering::Release);
    }
}
