//! [`PyWakeup`]: how ferrylink's threads tell an asyncio event loop that requests may
//! have completed, without taking the GIL.
//!
//! A request polled as a future gets a waker carrying its token; when the progress
//! thread wakes it, the token joins the ready list and one byte goes down a socket pair
//! (only when none is waiting already). The loop watches the other end (`add_reader`),
//! takes the ready tokens (`take_ready`) and polls those requests again.

use pyo3::prelude::*;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Wake, Waker};

/// What the wakers of one event loop share.
pub(crate) struct WakeupShared {
    reader: UnixStream,
    writer: UnixStream,
    ready: Mutex<Vec<u64>>,
    /// A byte is on its way to the loop (cleared by `take_ready`).
    signalled: AtomicBool,
}

impl WakeupShared {
    fn wake(&self, token: u64) {
        self.ready.lock().unwrap_or_else(|e| e.into_inner()).push(token);
        if !self.signalled.swap(true, Ordering::AcqRel) {
            // A full socket already holds a wake-up the loop will read.
            let _ = (&self.writer).write(&[1]);
        }
    }
}

/// A request's waker: its token, and where to report it.
struct TokenWaker {
    shared: Arc<WakeupShared>,
    token: u64,
}

impl Wake for TokenWaker {
    fn wake(self: Arc<Self>) {
        self.shared.wake(self.token);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.shared.wake(self.token);
    }
}

/// The wake-up channel of one asyncio event loop (the package keeps one per loop).
#[pyclass(name = "Wakeup", module = "ferrylink", frozen)]
pub(crate) struct PyWakeup {
    pub(crate) shared: Arc<WakeupShared>,
}

impl PyWakeup {
    /// A waker that reports `token`.
    pub(crate) fn waker(&self, token: u64) -> Waker {
        Waker::from(Arc::new(TokenWaker { shared: self.shared.clone(), token }))
    }
}

#[pymethods]
impl PyWakeup {
    #[new]
    fn new() -> PyResult<Self> {
        let (reader, writer) = UnixStream::pair()?;
        reader.set_nonblocking(true)?;
        writer.set_nonblocking(true)?;
        let shared = WakeupShared { reader, writer, ready: Mutex::new(Vec::new()), signalled: AtomicBool::new(false) };
        Ok(Self { shared: Arc::new(shared) })
    }

    /// The descriptor the event loop watches for reading.
    fn fileno(&self) -> i32 {
        self.shared.reader.as_raw_fd()
    }

    /// The tokens woken since the last call (the descriptor drained).
    fn take_ready(&self) -> Vec<u64> {
        // Drain first, then clear the flag, then take the tokens: a wake-up that found
        // the flag set has its token taken below; one that clears it after this writes a
        // new byte. (Clearing before draining could drain that byte and leave the flag
        // set with nothing to read: every later wake-up would be lost.)
        let mut sink = [0u8; 64];
        while let Ok(n) = (&self.shared.reader).read(&mut sink) {
            if n == 0 {
                break;
            }
        }
        // A read-modify-write, so this synchronises with the wake-up that set the flag
        // and its token is seen below.
        self.shared.signalled.swap(false, Ordering::AcqRel);
        std::mem::take(&mut *self.shared.ready.lock().unwrap_or_else(|e| e.into_inner()))
    }
}
