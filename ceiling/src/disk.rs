//! Disk ceilings of the spill benchmark: writes and reads of n bytes in the directory the
//! spill store writes to, done the way the store does them (see the crate documentation).

use crate::timing::measure;
use crate::Ceiling;
use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;

/// How a [`disk_write`] ceiling writes: like the spill store without and with fsync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskWrite {
    /// Through the page cache, no sync (the store's default).
    Buffered,
    /// `O_DIRECT`, then `fdatasync` (the store with fsync: the data on the disk). Where
    /// the file system refuses `O_DIRECT` (tmpfs): a buffered write and `fdatasync`, and
    /// the method says so.
    DirectSynced,
}

/// Writes `n` bytes to a new file in `dir` ([`DiskWrite::DirectSynced`]: `n` rounded up to
/// 4 KiB), once untimed and then `iters` times; each write is timed from creating its file
/// to closing it, and the file is removed after it, untimed (as the spill benchmark
/// removes each evicted entry); n / t.
pub fn disk_write(dir: &Path, n: usize, iters: usize, how: DiskWrite) -> std::io::Result<Ceiling> {
    const ALIGN: usize = 4096;
    let synced = how == DiskWrite::DirectSynced;
    let len = if synced { n.next_multiple_of(ALIGN) } else { n };
    let raw = vec![0x5au8; len + ALIGN];
    let off = raw.as_ptr().align_offset(ALIGN);
    let buf = &raw[off..off + len];
    let path = |i: usize| dir.join(format!(".ferrylink-ceiling-{}-{i}", std::process::id()));
    let open = |path: &Path, direct: bool| {
        let mut o = std::fs::OpenOptions::new();
        o.write(true).create(true).truncate(true);
        if direct {
            use std::os::unix::fs::OpenOptionsExt;
            o.custom_flags(nix::fcntl::OFlag::O_DIRECT.bits());
        }
        o.open(path)
    };
    let direct = synced
        && match open(&path(0), true) {
            Ok(_) => true,
            Err(e) if e.raw_os_error() == Some(nix::libc::EINVAL) => false,
            Err(e) => return Err(e),
        };
    let iters = iters.max(1);
    let result = measure::<_, _, std::io::Error>(
        1,
        iters,
        |i| Ok(path(i)),
        |p| {
            let mut f = open(&p, direct)?;
            f.write_all(buf)?;
            if synced {
                f.sync_data()?;
            }
            Ok(p)
        },
        |_, p| std::fs::remove_file(p),
    );
    for i in 0..=iters {
        let _ = std::fs::remove_file(path(i));
    }
    let times = result?;
    let dir = dir.display();
    let method = match (how, direct) {
        (DiskWrite::Buffered, _) => format!("buffered write of {len} B to {dir} (page cache, no sync), n/t"),
        (DiskWrite::DirectSynced, true) => format!("O_DIRECT write + fdatasync of {len} B to {dir}, n/t"),
        (DiskWrite::DirectSynced, false) => {
            format!("write + fdatasync of {len} B to {dir} (O_DIRECT refused there), n/t")
        }
    };
    Ok(Ceiling::from_times(n as f64, &times, method))
}

/// Reads `n` bytes back from a file in `dir`, like the spill store reading an entry that
/// was written through the page cache without a sync and has since left it: each timed
/// read opens the file, reads it whole into a new buffer (`std::fs::read`, as unspill
/// reads into new memory) and closes it. Before each read, untimed, the file (written once,
/// buffered) is synced and its pages dropped from the page cache ([`drop_cached_pages`]),
/// so the bytes come from the disk; where the file system keeps them (tmpfs) the method
/// says so. Once untimed, then `iters` times; n / t.
pub fn disk_read(dir: &Path, n: usize, iters: usize) -> std::io::Result<Ceiling> {
    let path = dir.join(format!(".ferrylink-ceiling-read-{}", std::process::id()));
    let result = read_back(&path, n, iters.max(1));
    let _ = std::fs::remove_file(&path);
    let (times, dropped) = result?;
    let dir = dir.display();
    let method = if dropped {
        format!("buffered read of {n} B from {dir} into new memory, out of the page cache (dropped), n/t")
    } else {
        format!("buffered read of {n} B from {dir} into new memory (the page cache could not be dropped there), n/t")
    };
    Ok(Ceiling::from_times(n as f64, &times, method))
}

/// Writes the file and times `iters` reads of it (one untimed first), each after
/// dropping its pages; also whether the pages could be dropped.
fn read_back(path: &Path, n: usize, iters: usize) -> std::io::Result<(Vec<std::time::Duration>, bool)> {
    File::create(path)?.write_all(&vec![0x5au8; n])?;
    let mut dropped = true;
    let times = measure::<_, _, std::io::Error>(
        1,
        iters,
        |_| {
            dropped &= drop_cached_pages(path)?;
            Ok(())
        },
        |()| {
            let mut bytes = Vec::new();
            File::open(path)?.read_to_end(&mut bytes)?;
            Ok(bytes)
        },
        |_, bytes| {
            if bytes.len() == n {
                Ok(())
            } else {
                Err(std::io::Error::other(format!("read {} of {n} bytes back", bytes.len())))
            }
        },
    )?;
    Ok((times, dropped))
}

/// Makes the next read of `path` come from the disk: `fdatasync`, then
/// `posix_fadvise(POSIX_FADV_DONTNEED)` over the whole file, which drops its clean pages
/// from the page cache (no privileges needed). `Ok(false)` where the file system keeps
/// them anyway (tmpfs, where the page cache is the file).
pub fn drop_cached_pages(path: &Path) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    let file = File::open(path)?;
    file.sync_data()?;
    // SAFETY: a plain syscall on an open descriptor we own; it reads no memory of ours.
    let rc = unsafe { nix::libc::posix_fadvise(file.as_raw_fd(), 0, 0, nix::libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok(!on_tmpfs(&file)?)
}

/// Whether `file` lives on tmpfs, where dropping pages drops nothing.
fn on_tmpfs(file: &File) -> std::io::Result<bool> {
    let fs = nix::sys::statfs::fstatfs(file).map_err(std::io::Error::from)?;
    let kind = fs.filesystem_type();
    Ok(kind == nix::sys::statfs::TMPFS_MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_writes_say_how_they_wrote_and_clean_up() {
        let dir = tempfile::tempdir().unwrap();
        let buffered = disk_write(dir.path(), 100_000, 2, DiskWrite::Buffered).unwrap();
        assert!(buffered.bytes_per_sec > 0.0 && buffered.n_iter == 2, "{buffered:?}");
        assert!(buffered.method.starts_with("buffered write of 100000 B"), "{}", buffered.method);
        assert!(!buffered.method.contains("fdatasync") && !buffered.method.contains("O_DIRECT"));
        let synced = disk_write(dir.path(), 100_000, 2, DiskWrite::DirectSynced).unwrap();
        assert!(synced.bytes_per_sec > 0.0 && synced.n_iter == 2, "{synced:?}");
        assert!(synced.method.contains("write + fdatasync of 102400 B"), "{}", synced.method);
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "the files are removed");
    }

    #[test]
    fn disk_reads_read_the_bytes_back_and_clean_up() {
        let dir = tempfile::tempdir().unwrap();
        let read = disk_read(dir.path(), 100_000, 2).unwrap();
        assert!(read.bytes_per_sec > 0.0 && read.n_iter == 2, "{read:?}");
        assert!(read.method.starts_with("buffered read of 100000 B"), "{}", read.method);
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "the file is removed");
        assert!(disk_read(&dir.path().join("missing"), 10, 1).is_err(), "a missing directory is an error");
    }

    #[test]
    fn dropping_pages_says_whether_the_file_system_drops_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, [1u8; 8192]).unwrap();
        let tmpfs = on_tmpfs(&File::open(&path).unwrap()).unwrap();
        assert_eq!(drop_cached_pages(&path).unwrap(), !tmpfs);
        assert_eq!(std::fs::read(&path).unwrap(), [1u8; 8192], "the bytes stay");
        assert!(drop_cached_pages(&dir.path().join("missing")).is_err());
    }
}
