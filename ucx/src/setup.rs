//! The process-wide lock around UCX's set-up calls: loading `libucp`, reading its
//! configuration and creating a context, and creating a worker (decision 0048). Those
//! calls load UCX's transport modules with `dlopen`, which takes the loader's lock, while
//! UCX holds locks of its own. On an H100 machine with the CUDA-aware UCX 1.22, a test
//! binary whose threads each created a context deadlocked before any of them finished:
//! every thread waited on the loader's lock, on a lock inside `libucp`, or on one in
//! another library's data. With one test thread it passed; with the system UCX 1.16 it did
//! not happen. One set-up at a time in the process keeps two UCX set-ups from holding
//! those locks against each other. Set-up is rare (a context, and a worker per progress
//! thread), so the lock costs nothing on a hot path.

use std::sync::{Mutex, MutexGuard};

static SETUP: Mutex<()> = Mutex::new(());

/// Holds the lock until dropped. A panic in another set-up does not poison it for good:
/// the lock guards no data of ours, only UCX's calls.
pub(crate) fn lock() -> MutexGuard<'static, ()> {
    SETUP.lock().unwrap_or_else(|e| e.into_inner())
}
