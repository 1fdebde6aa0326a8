//! The disk tier's file operations: the injectable [`DiskIo`], plain `std::fs` I/O
//! ([`RealDiskIo`], with overlapped writeback when it syncs), and [`FaultyDiskIo`], which
//! fails writes like a full disk.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The last bytes of a file, known only once the rest is on its way: the store computes a
/// spill file's checksum while its body is being written, and this waits for it.
pub type Trailer<'a> = Box<dyn FnOnce() -> io::Result<[u8; 4]> + 'a>;

/// File operations of the disk tier. Injectable, so tests can fail writes the way a full
/// disk does.
pub trait DiskIo: Send + Sync + 'static {
    /// Creates (truncates) `path`, writes `parts` in order, then the bytes `trailer`
    /// returns (called once the parts are written; not called when writing them failed).
    fn write_file(&self, path: &Path, parts: &[&[u8]], trailer: Trailer<'_>) -> io::Result<()>;
    /// Renames `from` to `to` (atomically replacing `to`).
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Opens `path` for reading.
    fn open(&self, path: &Path) -> io::Result<Box<dyn Read + Send>>;
    /// Removes `path`.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
}

/// Plain `std::fs` I/O, optionally with `fsync` before the rename.
#[derive(Debug, Default, Clone)]
pub struct RealDiskIo {
    /// `fsync` each file before it is renamed into place. Default false: spill files do
    /// not need to survive a crash (the directory is removed on the next start).
    pub fsync: bool,
}

/// With `fsync`, writeback of each this-many bytes starts as soon as they are written,
/// so the disk works while the next bytes are still being copied into the page cache.
const WRITEBACK_CHUNK: usize = 32 << 20;

impl DiskIo for RealDiskIo {
    fn write_file(&self, path: &Path, parts: &[&[u8]], trailer: Trailer<'_>) -> io::Result<()> {
        let mut f = File::create(path)?;
        let mut written = 0u64;
        let mut submitted = 0u64;
        for p in parts {
            for chunk in p.chunks(WRITEBACK_CHUNK) {
                f.write_all(chunk)?;
                written += chunk.len() as u64;
                if self.fsync && written - submitted >= WRITEBACK_CHUNK as u64 {
                    start_writeback(&f, submitted, written - submitted);
                    submitted = written;
                }
            }
        }
        f.write_all(&trailer()?)?;
        if self.fsync {
            f.sync_data()?;
        }
        Ok(())
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }
    fn open(&self, path: &Path) -> io::Result<Box<dyn Read + Send>> {
        Ok(Box::new(File::open(path)?))
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }
}

/// Asks the kernel to start writing `offset..offset+len` of `file` back to disk without
/// waiting (`sync_file_range(SYNC_FILE_RANGE_WRITE)`); the final `fdatasync` waits. A
/// failure here only loses the overlap, never data, so it is logged and ignored.
fn start_writeback(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain syscall on an open fd we own; it reads no memory of ours.
    let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), offset as i64, len as i64, libc::SYNC_FILE_RANGE_WRITE) };
    if rc != 0 {
        tracing::debug!("sync_file_range: {}", io::Error::last_os_error());
    }
}

/// Real I/O that can be told to fail writes like a full disk: half of the bytes reach
/// the file, then `ENOSPC`. For tests (of this crate and of its users).
#[derive(Debug, Default)]
pub struct FaultyDiskIo {
    inner: RealDiskIo,
    fail_writes: AtomicBool,
    fail_reads: AtomicBool,
    writes_failed: AtomicU64,
}

impl FaultyDiskIo {
    /// Real I/O, not failing yet.
    pub fn new() -> Self {
        Self::default()
    }
    /// Whether writes fail with `ENOSPC`.
    pub fn set_fail_writes(&self, fail: bool) {
        self.fail_writes.store(fail, Ordering::SeqCst);
    }
    /// Whether opening files for reading fails with `EIO`.
    pub fn set_fail_reads(&self, fail: bool) {
        self.fail_reads.store(fail, Ordering::SeqCst);
    }
    /// Writes failed so far.
    pub fn writes_failed(&self) -> u64 {
        self.writes_failed.load(Ordering::SeqCst)
    }
}

impl DiskIo for FaultyDiskIo {
    fn write_file(&self, path: &Path, parts: &[&[u8]], trailer: Trailer<'_>) -> io::Result<()> {
        if !self.fail_writes.load(Ordering::SeqCst) {
            return self.inner.write_file(path, parts, trailer);
        }
        self.writes_failed.fetch_add(1, Ordering::SeqCst);
        let mut f = File::create(path)?;
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut left = total / 2;
        for p in parts {
            let n = left.min(p.len());
            f.write_all(&p[..n])?;
            left -= n;
        }
        Err(io::Error::from_raw_os_error(nix::libc::ENOSPC))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn open(&self, path: &Path) -> io::Result<Box<dyn Read + Send>> {
        if self.fail_reads.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(nix::libc::EIO));
        }
        self.inner.open(path)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file(path)
    }
}
