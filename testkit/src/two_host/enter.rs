//! The launch of a process on the second host: the forked child enters the host's network
//! namespace and unshares mount, UTS and PID namespaces; a second fork makes the peer
//! the first process of the new PID namespace, with fresh `/dev/shm`, `/tmp`, `/proc` and
//! `/sys` and the host's name. The first child stays outside, waits for the peer and exits
//! with its status, so the parent's [`Child`](std::process::Child) is the peer's life:
//! killing it kills the peer (its parent-death signal), and with it everything the peer
//! started on that host (the end of a PID namespace's first process ends them all).
//!
//! Directories the launch keeps ([`Launch::keep`]) stay visible under the fresh `/tmp`
//! and `/dev/shm`: each is bound over an empty directory of the same path there.
//!
//! Only system calls run between fork and exec (no allocation: the parent prepared every
//! string), as `pre_exec` requires.

use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, sethostname, ForkResult};
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The exit status of a peer whose host could not be set up (it printed why).
pub const SETUP_FAILED: i32 = 121;
/// Most interrupted waits the outer child retries before it gives up on its peer.
const MAX_INTERRUPTED_WAITS: usize = 10_000;

/// What a launch keeps open until the child has started: the network namespace, the
/// test binary when the child runs it (executed through `/proc/self/fd`, since the fresh
/// `/tmp` may hide its path), and the directories it keeps visible.
pub struct Launch {
    exe: Option<File>,
    netns: File,
    kept: Vec<KeptDir>,
}

/// A directory under a fresh mount (`/tmp`, `/dev/shm`) that stays visible there: opened
/// in the child before the fresh mount hides it, then bound over the same path there.
#[derive(Clone)]
struct KeptDir {
    /// The directory's path (canonical).
    path: CString,
    /// Every directory from the fresh mount down to the kept one, to make in the child.
    make: Vec<CString>,
}

/// The most directories a launch keeps (the child holds their descriptors in an array).
const MAX_KEPT: usize = 8;

/// The mounts the second host gets fresh, hiding what the machine has there.
const FRESH_MOUNTS: [&str; 2] = ["/dev/shm", "/tmp"];

impl Launch {
    /// Opens this test binary and the network namespace at `netns_path`.
    pub fn open(netns_path: &Path) -> std::io::Result<Self> {
        let exe = Some(File::open(std::env::current_exe()?)?);
        let netns = File::open(netns_path)?;
        Ok(Self { exe, netns, kept: Vec::new() })
    }

    /// Opens the network namespace at `netns_path`, for a command other than this binary
    /// ([`Launch::program`]).
    pub fn open_for_programs(netns_path: &Path) -> std::io::Result<Self> {
        Ok(Self { exe: None, netns: File::open(netns_path)?, kept: Vec::new() })
    }

    /// Keeps `dir` visible on the second host, where it lies under a mount the host gets
    /// fresh (`/tmp`, `/dev/shm`); elsewhere it is visible anyway. Everything else of
    /// those mounts stays hidden.
    pub fn keep(&mut self, dir: &Path) -> Result<(), String> {
        let real = dir.canonicalize().map_err(|e| format!("{}: {e}", dir.display()))?;
        if !real.is_dir() {
            return Err(format!("{} is not a directory", dir.display()));
        }
        let Some(mount) = FRESH_MOUNTS.iter().map(Path::new).find(|m| real.starts_with(m) && real != *m) else {
            return Ok(());
        };
        let mut make = Vec::new();
        let mut at = PathBuf::from(mount);
        for part in real.strip_prefix(mount).expect("checked above").components() {
            at.push(part);
            make.push(c_path(&at)?);
        }
        if self.kept.len() == MAX_KEPT {
            return Err(format!("at most {MAX_KEPT} directories can be kept"));
        }
        self.kept.push(KeptDir { path: c_path(&real)?, make });
        Ok(())
    }

    /// A command running this test binary on the second host named `hostname`. Keep
    /// `self` until the command has been spawned.
    pub fn command(&self, hostname: &str) -> Command {
        let exe = self.exe.as_ref().expect("Launch::open opened the test binary");
        self.enter_on_spawn(Command::new(format!("/proc/self/fd/{}", exe.as_raw_fd())), hostname)
    }

    /// A command running `program` on the second host named `hostname`. Keep `self`
    /// until the command has been spawned.
    pub fn program(&self, program: &Path, hostname: &str) -> Command {
        self.enter_on_spawn(Command::new(program), hostname)
    }

    fn enter_on_spawn(&self, mut cmd: Command, hostname: &str) -> Command {
        let exe_fd = self.exe.as_ref().map(AsRawFd::as_raw_fd);
        let netns_fd = self.netns.as_raw_fd();
        let hostname = hostname.to_owned();
        let kept = self.kept.clone();
        // SAFETY: the closure runs between fork and exec; it makes system calls only (no
        // allocation, no lock: the strings were made here, before the fork).
        unsafe {
            cmd.pre_exec(move || enter_second_host(exe_fd, netns_fd, &hostname, &kept));
        }
        cmd
    }
}

fn c_path(path: &Path) -> Result<CString, String> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| format!("{} holds a NUL byte", path.display()))
}

/// In the forked child: enters the host's namespaces, forks the peer and waits for it.
/// Returns (and the child execs) only in the peer.
fn enter_second_host(exe_fd: Option<RawFd>, netns_fd: RawFd, hostname: &str, kept: &[KeptDir]) -> std::io::Result<()> {
    // SAFETY: the descriptors are open in this child: `Launch` keeps them open in the
    // parent until the spawn returned.
    let netns = unsafe { BorrowedFd::borrow_raw(netns_fd) };
    if let Some(exe_fd) = exe_fd {
        // SAFETY: as above.
        let exe = unsafe { BorrowedFd::borrow_raw(exe_fd) };
        // The binary must survive the exec.
        fcntl(exe, FcntlArg::F_SETFD(FdFlag::empty()))?;
    }
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
    setns(netns, CloneFlags::CLONE_NEWNET)?;
    unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWUTS | CloneFlags::CLONE_NEWPID)?;
    // SAFETY: this child has one thread (fork copies only the calling one); both sides of
    // this fork make system calls only.
    match unsafe { fork() }? {
        ForkResult::Child => {
            if let Err(step) = set_up_host(hostname, kept) {
                write_stderr(step);
                // SAFETY: _exit ends this process at once, without running anything of the
                // parent's copied state.
                unsafe { nix::libc::_exit(SETUP_FAILED) }
            }
            Ok(())
        }
        ForkResult::Parent { child } => {
            // The spawning parent waits until every copy of its exec-status pipe is
            // closed: this process never execs, so it closes all but stdio.
            // SAFETY: close_range only closes descriptors of this (single-threaded) child.
            unsafe { nix::libc::close_range(3, u32::MAX, 0) };
            let mut code = SETUP_FAILED;
            for _ in 0..MAX_INTERRUPTED_WAITS {
                match waitpid(child, None) {
                    Ok(WaitStatus::Exited(_, c)) => code = c,
                    Ok(WaitStatus::Signaled(_, signal, _)) => code = 128 + signal as i32,
                    Err(nix::errno::Errno::EINTR) => continue,
                    Ok(_) => continue,
                    Err(_) => {}
                }
                break;
            }
            // SAFETY: as above.
            unsafe { nix::libc::_exit(code) }
        }
    }
}

/// In the peer (first process of its PID namespace): its own mounts (with the kept
/// directories), hostname and parent-death signal. Returns the failed step.
fn set_up_host(hostname: &str, kept: &[KeptDir]) -> Result<(), &'static str> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(|_| "prctl(PR_SET_PDEATHSIG)\n")?;
    private_mounts()?;
    // Opened before the fresh mounts hide them (and in this mount namespace: a bind
    // mount's source must be one of its own mounts).
    let mut kept_fds = [-1; MAX_KEPT];
    for (fd, dir) in kept_fds.iter_mut().zip(kept) {
        let flags = nix::libc::O_PATH | nix::libc::O_DIRECTORY | nix::libc::O_CLOEXEC;
        // SAFETY: a valid NUL-terminated path; the descriptor is this process's to close.
        *fd = unsafe { nix::libc::open(dir.path.as_ptr(), flags) };
        if *fd < 0 {
            return Err("opening a kept directory\n");
        }
    }
    let fresh = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mount(Some("tmpfs"), "/dev/shm", Some("tmpfs"), fresh, None::<&str>).map_err(|_| "tmpfs on /dev/shm\n")?;
    mount(Some("tmpfs"), "/tmp", Some("tmpfs"), fresh, None::<&str>).map_err(|_| "tmpfs on /tmp\n")?;
    for (&fd, dir) in kept_fds.iter().zip(kept) {
        keep_dir(fd, &dir.make)?;
    }
    mount(Some("proc"), "/proc", Some("proc"), fresh | MsFlags::MS_NOEXEC, None::<&str>)
        .map_err(|_| "proc on /proc\n")?;
    fresh_sysfs()?;
    sethostname(hostname).map_err(|_| "sethostname\n")?;
    Ok(())
}

/// Binds the directory open as `fd` over the last of `make` (made first, with its
/// parents), through `/proc/self/fd/FD` (the machine's /proc: before the fresh one).
fn keep_dir(fd: RawFd, make: &[CString]) -> Result<(), &'static str> {
    for dir in make {
        match nix::unistd::mkdir(dir.as_c_str(), nix::sys::stat::Mode::from_bits_truncate(0o755)) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(_) => return Err("making a kept directory's path\n"),
        }
    }
    let target = make.last().ok_or("a kept directory without a path\n")?;
    let mut source = *b"/proc/self/fd/\0\0\0\0\0\0\0\0\0\0\0\0";
    write_decimal(&mut source[14..], fd);
    let source = std::ffi::CStr::from_bytes_until_nul(&source).map_err(|_| "a kept directory's descriptor\n")?;
    mount(Some(source), target.as_c_str(), None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>)
        .map_err(|_| "binding a kept directory\n")?;
    // SAFETY: closes a descriptor this process opened and uses no more.
    unsafe { nix::libc::close(fd) };
    Ok(())
}

/// Writes `n` (not negative) in decimal at the start of `out` (room for 11 digits), no
/// allocation.
fn write_decimal(out: &mut [u8], n: RawFd) {
    let mut digits = [0u8; 11];
    let mut len = 0;
    let mut rest = n.unsigned_abs();
    loop {
        digits[len] = b'0' + (rest % 10) as u8;
        len += 1;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    for (slot, digit) in out.iter_mut().zip(digits[..len].iter().rev()) {
        *slot = *digit;
    }
}

/// In a mount namespace of its own: makes every mount private, so that nothing mounted
/// here propagates back. Returns the failed step.
pub fn private_mounts() -> Result<(), &'static str> {
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .map_err(|_| "making / private\n")
}

/// Mounts a sysfs on /sys: it shows the network namespace of whoever mounts it (UCX finds
/// interfaces in /sys/class/net). After [`private_mounts`]. Returns the failed step.
pub fn fresh_sysfs() -> Result<(), &'static str> {
    let _ = umount2("/sys", MntFlags::MNT_DETACH);
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("sysfs"), "/sys", Some("sysfs"), flags, None::<&str>).map_err(|_| "sysfs on /sys\n")
}

fn write_stderr(step: &str) {
    let prefix: &[u8] = b"ferrylink-testkit: the second host could not be set up: ";
    // SAFETY: writes from valid buffers to stderr, which this process holds.
    unsafe {
        nix::libc::write(2, prefix.as_ptr().cast(), prefix.len());
        nix::libc::write(2, step.as_ptr().cast(), step.len());
    }
}
