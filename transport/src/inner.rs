//! What a context's handles (`Context`, `Endpoint`, `Listener`) share: the channel to
//! the progress thread and its waker, ids, and the CUDA state user threads touch.

use crate::command::Command;
use crate::config::Config;
use crate::device::DeviceState;
use crate::payload::Registry;
use crossbeam_channel::Sender;
use ferrylink_proto::wire::Hello;
use mio::Waker;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// The progress thread's end for user threads; the last handle dropped stops it.
pub(crate) struct ContextInner {
    pub config: Config,
    /// What this side says about itself (read by tests through `local_hello`).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub local_hello: Hello,
    pub(crate) commands: Sender<Command>,
    pub(crate) waker: Waker,
    /// CUDA state, shared with the progress thread (user threads record producer events).
    pub(crate) device: Arc<DeviceState>,
    /// One-sided registrations, shared with the progress thread's lanes.
    pub(crate) registry: Arc<Registry>,
    /// Set by the progress thread while it may sleep in `poll`: only then does a command
    /// need the waker (a system call); a spinning thread sees it on its next turn.
    pub(crate) engine_sleeping: Arc<AtomicBool>,
    pub(crate) next_id: Arc<AtomicUsize>,
    pub(crate) next_request: AtomicU64,
    pub(crate) thread: Mutex<Option<JoinHandle<()>>>,
}

impl ContextInner {
    /// Hands a command to the progress thread; gives it back when the thread is gone.
    pub fn submit(&self, cmd: Command) -> Result<(), Command> {
        self.commands.send(cmd).map_err(|e| e.into_inner())?;
        // Pairs with the fence in `Engine::run`: either the thread sees the command before
        // it sleeps, or this sees it sleeping and wakes it.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.engine_sleeping.load(Ordering::SeqCst) {
            if let Err(e) = self.waker.wake() {
                tracing::error!("waking the progress thread failed: {e}");
            }
        }
        Ok(())
    }

    pub fn next_request_id(&self) -> u64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }

    pub fn next_object_id(&self) -> usize {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }
}

impl Drop for ContextInner {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Shutdown);
        let _ = self.waker.wake();
        if let Some(thread) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            if thread.join().is_err() {
                tracing::error!("the progress thread panicked");
            }
        }
    }
}
