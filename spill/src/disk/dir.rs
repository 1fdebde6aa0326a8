//! The store's own directory (`<parent>/ferrylink-spill-<pid>-<n>`, removed on drop), and
//! the removal of directories left by dead processes when a store starts.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::SpillError;

/// Prefix of per-store directory names: `ferrylink-spill-<pid>-<n>`.
pub const DIR_PREFIX: &str = "ferrylink-spill-";

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
