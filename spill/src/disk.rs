//! The disk tier: the file format, the injectable file I/O and the per-store directory.
//!
//! # File format (version 1, little endian)
//! ```text
//! magic  "FLSPILL\0"          8 bytes
//! version u32 = 1
//! header_len u64
//! frame_count u32
//! per frame: len u64, origin u8 (0 host, 1 device), device ordinal u32
//! header bytes
//! frame bytes, in order
//! crc32c u32 of everything above
//! ```
//! One file per entry, written to `<n>.tmp` then renamed to `<n>.spill`: a file with the
//! final name is always complete.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use ferrylink_memory::serialize::FrameOrigin;
use ferrylink_memory::{HostBuffer, PinnedPool};

use crate::crc::Crc32c;
use crate::SpillError;

const MAGIC: &[u8; 8] = b"FLSPILL\0";
const VERSION: u32 = 1;
const FIXED: usize = 8 + 4 + 8 + 4;
const PER_FRAME: usize = 8 + 1 + 4;
const MAX_FRAMES: usize = 1 << 20;
/// Prefix of per-store directory names: `ferrylink-spill-<pid>-<n>`.
pub const DIR_PREFIX: &str = "ferrylink-spill-";

/// File operations of the disk tier. Injectable, so tests can fail writes the way a full
/// disk does.
pub trait DiskIo: Send + Sync + 'static {
    /// Creates (truncates) `path` and writes `parts` in order.
    fn write_file(&self, path: &Path, parts: &[&[u8]]) -> io::Result<()>;
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
    fn write_file(&self, path: &Path, parts: &[&[u8]]) -> io::Result<()> {
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
    fn write_file(&self, path: &Path, parts: &[&[u8]]) -> io::Result<()> {
        if !self.fail_writes.load(Ordering::SeqCst) {
            return self.inner.write_file(path, parts);
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

/// The layout of a file's metadata block plus its trailer, returned with the block.
pub(crate) fn encode_meta(header: &[u8], frames: &[(usize, FrameOrigin)]) -> Vec<u8> {
    let mut m = Vec::with_capacity(FIXED + frames.len() * PER_FRAME);
    m.extend_from_slice(MAGIC);
    m.extend_from_slice(&VERSION.to_le_bytes());
    m.extend_from_slice(&(header.len() as u64).to_le_bytes());
    m.extend_from_slice(&(frames.len() as u32).to_le_bytes());
    for &(len, origin) in frames {
        m.extend_from_slice(&(len as u64).to_le_bytes());
        let (kind, ordinal) = match origin {
            FrameOrigin::Host => (0u8, 0u32),
            FrameOrigin::Device { ordinal } => (1u8, ordinal as u32),
        };
        m.push(kind);
        m.extend_from_slice(&ordinal.to_le_bytes());
    }
    m
}

/// Bytes a file with this layout has.
pub(crate) fn file_len(header_len: usize, frames: &[(usize, FrameOrigin)]) -> u64 {
    (FIXED + frames.len() * PER_FRAME + header_len + frames.iter().map(|f| f.0).sum::<usize>() + 4) as u64
}

/// What a file holds.
pub(crate) struct Decoded {
    pub header: Vec<u8>,
    pub frames: Vec<HostBuffer>,
    pub origins: Vec<FrameOrigin>,
}

fn corrupt(path: &Path, reason: impl Into<String>) -> SpillError {
    SpillError::Corrupt { path: path.to_path_buf(), reason: reason.into() }
}

fn read_exact(r: &mut dyn Read, buf: &mut [u8], path: &Path, crc: &mut Crc32c) -> Result<(), SpillError> {
    r.read_exact(buf).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            corrupt(path, "file is truncated")
        } else {
            SpillError::Io { op: "read", path: path.to_path_buf(), source: e }
        }
    })?;
    crc.update(buf);
    Ok(())
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Reads and verifies a spill file whose length should be `expected_len`. Frames land in
/// `pool` when it has room, in fresh memory otherwise.
pub(crate) fn read_entry(
    io: &dyn DiskIo,
    path: &Path,
    expected_len: u64,
    pool: Option<&PinnedPool>,
) -> Result<Decoded, SpillError> {
    let mut r = io.open(path).map_err(|source| SpillError::Io { op: "open", path: path.to_path_buf(), source })?;
    let r: &mut dyn Read = &mut *r;
    let mut crc = Crc32c::new();
    let mut fixed = [0u8; FIXED];
    read_exact(r, &mut fixed, path, &mut crc)?;
    if &fixed[..8] != MAGIC {
        return Err(corrupt(path, "bad magic"));
    }
    let version = u32_at(&fixed, 8);
    if version != VERSION {
        return Err(corrupt(path, format!("unknown version {version}")));
    }
    let header_len = u64_at(&fixed, 12);
    let count = u32_at(&fixed, 20) as usize;
    if count > MAX_FRAMES || header_len > expected_len {
        return Err(corrupt(path, "implausible layout"));
    }
    let mut table = vec![0u8; count * PER_FRAME];
    read_exact(r, &mut table, path, &mut crc)?;
    let mut layout = Vec::with_capacity(count);
    for i in 0..count {
        let at = i * PER_FRAME;
        let len = u64_at(&table, at);
        let origin = match table[at + 8] {
            0 => FrameOrigin::Host,
            1 => FrameOrigin::Device { ordinal: u32_at(&table, at + 9) as usize },
            k => return Err(corrupt(path, format!("unknown frame origin {k}"))),
        };
        if len > expected_len {
            return Err(corrupt(path, "implausible frame length"));
        }
        layout.push((len as usize, origin));
    }
    if file_len(header_len as usize, &layout) != expected_len {
        return Err(corrupt(path, "layout does not match the file's recorded length"));
    }
    let mut header = vec![0u8; header_len as usize];
    read_exact(r, &mut header, path, &mut crc)?;
    let mut frames = Vec::with_capacity(count);
    for &(len, _) in &layout {
        let mut buf = match pool.map(|p| p.alloc(len)) {
            Some(Ok(b)) => b,
            _ => HostBuffer::zeroed(len),
        };
        read_exact(r, buf.as_mut_slice(), path, &mut crc)?;
        frames.push(buf);
    }
    let want = crc.finish();
    let mut trailer = [0u8; 4];
    read_exact(r, &mut trailer, path, &mut Crc32c::new())?;
    if u32::from_le_bytes(trailer) != want {
        return Err(corrupt(path, "checksum mismatch"));
    }
    let mut extra = [0u8; 1];
    match r.read(&mut extra) {
        Ok(0) => {}
        Ok(_) => return Err(corrupt(path, "trailing bytes")),
        Err(source) => return Err(SpillError::Io { op: "read", path: path.to_path_buf(), source }),
    }
    Ok(Decoded { header, frames, origins: layout.into_iter().map(|l| l.1).collect() })
}

/// The store's own directory, `<parent>/ferrylink-spill-<pid>-<n>`, removed on drop.
#[derive(Debug)]
pub(crate) struct SpillDir {
    path: PathBuf,
}

impl SpillDir {
    /// Creates the directory after removing directories of dead processes in `parent`.
    pub(crate) fn create(parent: &Path) -> Result<Self, SpillError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        fs::create_dir_all(parent).map_err(|source| SpillError::Io {
            op: "create directory",
            path: parent.to_path_buf(),
            source,
        })?;
        clean_stale(parent);
        let pid = std::process::id();
        loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = parent.join(format!("{DIR_PREFIX}{pid}-{n}"));
            match fs::create_dir(&path) {
                Ok(()) => return Ok(Self { path }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(source) => return Err(SpillError::Io { op: "create directory", path, source }),
            }
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SpillDir {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(&self.path) {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::warn!(path = %self.path.display(), "could not remove spill directory: {e}");
            }
        }
    }
}

/// Whether a process with this pid exists (`kill(pid, 0)`: only `ESRCH` means gone).
fn pid_alive(pid: i32) -> bool {
    use nix::errno::Errno;
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => true,
        Err(Errno::ESRCH) => false,
        Err(_) => true, // EPERM: exists, someone else's
    }
}

/// Removes `ferrylink-spill-<pid>-<n>` directories in `parent` whose pid is dead.
pub(crate) fn clean_stale(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else { return };
    let me = std::process::id();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(DIR_PREFIX)) else { continue };
        let Some((pid, n)) = rest.split_once('-') else { continue };
        let (Ok(pid), Ok(_)) = (pid.parse::<i32>(), n.parse::<u64>()) else { continue };
        if pid <= 0 || pid as u32 == me || pid_alive(pid) {
            continue;
        }
        match fs::remove_dir_all(e.path()) {
            Ok(()) => tracing::info!(path = %e.path().display(), "removed spill directory of dead process {pid}"),
            Err(err) => tracing::warn!(path = %e.path().display(), "stale spill directory: {err}"),
        }
    }
}
