//! [`HostReleaser`]: frees the host copy of an entry that was just written to disk. A
//! copy of [`RELEASE_ASIDE_MIN`] bytes or more, none of it pinned, is dropped by a thread
//! of the store, so an insert that evicted it returns without waiting for its pages to go
//! back to the system (decision 0047). At most one copy is being freed at a time: the next
//! hand-over, and [`SpillStore::evict_lru`](super::SpillStore::evict_lru), wait for it, so
//! the memory held beyond the host budget is bounded by one entry, for as long as one free
//! takes. [`SpillStats::host_releasing`](super::SpillStats::host_releasing) counts it.
//!
//! Pinned frames go back to their pool in line: the next device eviction may need them.

use std::sync::{Arc, Condvar, Mutex};

use ferrylink_memory::{Frame, HostBuffer, Message};

use super::aside::AsideThread;

/// Payload bytes from which an evicted host copy is freed by the store's thread: freeing
/// 1 GiB of 4 KiB pages took 28 ms on the H100 machine, a small copy's free costs less
/// than the hand-off.
pub const RELEASE_ASIDE_MIN: usize = 64 << 20;

/// Bytes handed to the thread and not yet freed, and the signal that they were.
#[derive(Default)]
struct Releasing {
    bytes: Mutex<usize>,
    freed: Condvar,
}

impl Releasing {
    fn set(&self, bytes: usize) {
        *self.bytes.lock().unwrap_or_else(|e| e.into_inner()) = bytes;
        self.freed.notify_all();
    }

    fn bytes(&self) -> usize {
        *self.bytes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait_until_freed(&self) {
        let bytes = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
        drop(self.freed.wait_while(bytes, |b| *b > 0).unwrap_or_else(|e| e.into_inner()));
    }
}

/// Marks the copy freed when dropped: after the copy, or while unwinding from its drop,
/// so that no caller waits for a copy that will never be freed.
struct FreedOnDrop(Arc<Releasing>);

impl Drop for FreedOnDrop {
    fn drop(&mut self) {
        self.0.set(0);
    }
}

/// Frees evicted host copies, large ones off the caller's thread, one at a time.
pub(super) struct HostReleaser {
    releasing: Arc<Releasing>,
    thread: AsideThread,
}

impl HostReleaser {
    pub(super) fn new() -> Self {
        Self { releasing: Arc::default(), thread: AsideThread::new("spill-release") }
    }

    /// Frees `msg`, an evicted host copy: now, or on the store's thread once the copy
    /// before it is freed.
    pub(super) fn release(&self, msg: Message) {
        let bytes = msg.payload_len();
        let pinned = msg.frames.iter().filter_map(Frame::as_host).any(HostBuffer::is_pinned);
        if bytes < RELEASE_ASIDE_MIN || pinned {
            return drop(msg);
        }
        self.wait_until_freed();
        self.releasing.set(bytes);
        let freed = FreedOnDrop(self.releasing.clone());
        self.thread.run(Box::new(move || {
            let _freed = freed;
            drop(msg);
        }));
    }

    /// Returns once no copy is being freed.
    pub(super) fn wait_until_freed(&self) {
        self.releasing.wait_until_freed();
    }

    /// Bytes handed to the thread and not yet freed.
    pub(super) fn releasing(&self) -> usize {
        self.releasing.bytes()
    }
}
