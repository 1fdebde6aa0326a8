//! [`FileRemover`]: removes the files of entries that left the disk tier. Files of
//! [`REMOVE_ASIDE_MIN`] bytes or more are removed by a thread of the store, so an unspill or a
//! removal returns without waiting for the file system to free the file's blocks
//! (decision 0046); smaller ones, and every file where no thread can be had, on the
//! caller's thread. The thread is started on the first large file and joined when the
//! store is dropped, before its directory is removed.

use std::path::PathBuf;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::disk::DiskIo;

/// Bytes from which a file is removed by the store's thread: freeing 1 GiB took
/// 137–142 ms on the H100 machine's disk, a small file's removal costs less than the
/// hand-off.
pub const REMOVE_ASIDE_MIN: u64 = 64 << 20;

/// The removing thread and the queue it reads.
struct Worker {
    queue: Sender<PathBuf>,
    thread: JoinHandle<()>,
}

/// Removes entry files, large ones off the caller's thread.
pub(super) struct FileRemover {
    io: Arc<dyn DiskIo>,
    worker: Mutex<Option<Worker>>,
}

impl FileRemover {
    pub(super) fn new(io: Arc<dyn DiskIo>) -> Self {
        Self { io, worker: Mutex::new(None) }
    }

    /// Removes `path`, a file of `file_len` bytes: now, or soon on the store's thread.
    pub(super) fn remove(&self, path: PathBuf, file_len: u64) {
        let path = if file_len >= REMOVE_ASIDE_MIN { self.hand_over(path) } else { Some(path) };
        if let Some(path) = path {
            remove_now(&*self.io, path);
        }
    }

    /// Queues `path` for the thread (starting it if need be); gives it back when neither
    /// the queue nor a new thread can take it.
    fn hand_over(&self, path: PathBuf) -> Option<PathBuf> {
        let mut worker = self.worker.lock().unwrap_or_else(|e| e.into_inner());
        if worker.is_none() {
            let (queue, paths) = channel::<PathBuf>();
            let io = self.io.clone();
            let spawned = std::thread::Builder::new()
                .name("spill-remove".into())
                .spawn(move || paths.into_iter().for_each(|path| remove_now(&*io, path)));
            match spawned {
                Ok(thread) => *worker = Some(Worker { queue, thread }),
                Err(e) => {
                    tracing::debug!("no thread to remove spill files, removed in line: {e}");
                    return Some(path);
                }
            }
        }
        let queue = &worker.as_ref()?.queue;
        queue.send(path).err().map(|unsent| unsent.0)
    }
}

impl Drop for FileRemover {
    /// Waits for the queued removals.
    fn drop(&mut self) {
        let worker = self.worker.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(Worker { queue, thread }) = worker {
            drop(queue);
            if thread.join().is_err() {
                tracing::warn!("the spill file removal thread panicked");
            }
        }
    }
}

fn remove_now(io: &dyn DiskIo, path: PathBuf) {
    if let Err(e) = io.remove_file(&path) {
        tracing::warn!(path = %path.display(), "could not remove spill file: {e}");
    }
}
