//! [`AsideThread`]: one thread of the store that runs work the caller need not wait for
//! (removing a large file, freeing a large evicted entry), in the order it was handed
//! over. Started on the first job, joined when dropped: every job handed over has run by
//! then.

use std::sync::mpsc::{channel, Sender};
use std::sync::Mutex;
use std::thread::JoinHandle;

/// A unit of work for the thread.
pub(super) type Job = Box<dyn FnOnce() + Send>;

/// The running thread and the queue it reads.
struct Running {
    queue: Sender<Job>,
    thread: JoinHandle<()>,
}

/// A lazily started thread that runs jobs in order.
pub(super) struct AsideThread {
    name: &'static str,
    running: Mutex<Option<Running>>,
}

impl AsideThread {
    pub(super) fn new(name: &'static str) -> Self {
        Self { name, running: Mutex::new(None) }
    }

    /// Queues `job` (starting the thread if need be); runs it in line when neither the
    /// queue nor a new thread can take it.
    pub(super) fn run(&self, job: Job) {
        if let Err(job) = self.hand_over(job) {
            job();
        }
    }

    /// Queues `job`, starting the thread if need be; gives it back when that fails.
    fn hand_over(&self, job: Job) -> Result<(), Job> {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if running.is_none() {
            let (queue, jobs) = channel::<Job>();
            let spawned = std::thread::Builder::new()
                .name(self.name.into())
                .spawn(move || jobs.into_iter().for_each(|job| job()));
            match spawned {
                Ok(thread) => *running = Some(Running { queue, thread }),
                Err(e) => {
                    tracing::debug!(thread = self.name, "no thread to run aside, run in line: {e}");
                    return Err(job);
                }
            }
        }
        match running.as_ref() {
            Some(r) => r.queue.send(job).map_err(|unsent| unsent.0),
            None => Err(job),
        }
    }
}

impl Drop for AsideThread {
    /// Waits for the queued jobs.
    fn drop(&mut self) {
        let running = self.running.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(Running { queue, thread }) = running {
            drop(queue);
            if thread.join().is_err() {
                tracing::warn!(thread = self.name, "a spill store thread panicked");
            }
        }
    }
}
