//! [`FileRemover`]: removes the files of entries that left the disk tier. Files of
//! [`REMOVE_ASIDE_MIN`] bytes or more are removed by a thread of the store, so an unspill or a
//! removal returns without waiting for the file system to free the file's blocks
//! (decision 0046); smaller ones, and every file where no thread can be had, on the
//! caller's thread. The thread is started on the first large file and joined when the
//! store is dropped, before its directory is removed.

use std::path::PathBuf;
use std::sync::Arc;

use super::aside::AsideThread;
use crate::disk::DiskIo;

/// Bytes from which a file is removed by the store's thread: freeing 1 GiB took
/// 137–142 ms on the H100 machine's disk, a small file's removal costs less than the
/// hand-off.
pub const REMOVE_ASIDE_MIN: u64 = 64 << 20;

/// Removes entry files, large ones off the caller's thread.
pub(super) struct FileRemover {
    io: Arc<dyn DiskIo>,
    thread: AsideThread,
}

impl FileRemover {
    pub(super) fn new(io: Arc<dyn DiskIo>) -> Self {
        Self { io, thread: AsideThread::new("spill-remove") }
    }

    /// Removes `path`, a file of `file_len` bytes: now, or soon on the store's thread.
    pub(super) fn remove(&self, path: PathBuf, file_len: u64) {
        if file_len < REMOVE_ASIDE_MIN {
            return remove_now(&*self.io, path);
        }
        let io = self.io.clone();
        self.thread.run(Box::new(move || remove_now(&*io, path)));
    }
}

fn remove_now(io: &dyn DiskIo, path: PathBuf) {
    if let Err(e) = io.remove_file(&path) {
        tracing::warn!(path = %path.display(), "could not remove spill file: {e}");
    }
}
