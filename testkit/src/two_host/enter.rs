//! The launch of a process on the second host: the forked child enters the host's network
//! namespace and unshares mount, UTS and PID namespaces; a second fork makes the peer
//! the first process of the new PID namespace, with fresh `/dev/shm`, `/tmp`, `/proc` and
//! `/sys` and the host's name. The first child stays outside, waits for the peer and exits
//! with its status, so the parent's [`Child`](std::process::Child) is the peer's life:
//! killing it kills the peer (its parent-death signal), and with it everything the peer
//! started on that host (the end of a PID namespace's first process ends them all).
//!
//! Only system calls run between fork and exec (no allocation: the parent prepared every
//! string), as `pre_exec` requires.

use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, sethostname, ForkResult};
use std::fs::File;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

/// The exit status of a peer whose host could not be set up (it printed why).
pub const SETUP_FAILED: i32 = 121;
/// Most interrupted waits the outer child retries before it gives up on its peer.
const MAX_INTERRUPTED_WAITS: usize = 10_000;

/// What a launch keeps open until the child has started: this test binary (executed
/// through `/proc/self/fd`, since the fresh `/tmp` may hide its path) and the network
/// namespace.
pub struct Launch {
    exe: File,
    netns: File,
}

impl Launch {
    /// Opens this test binary and the network namespace at `netns_path`.
    pub fn open(netns_path: &Path) -> std::io::Result<Self> {
        let exe = File::open(std::env::current_exe()?)?;
        let netns = File::open(netns_path)?;
        Ok(Self { exe, netns })
    }

    /// A command running this test binary on the second host named `hostname`. Keep
    /// `self` until the command has been spawned.
    pub fn command(&self, hostname: &str) -> Command {
        let exe_fd = self.exe.as_raw_fd();
        let netns_fd = self.netns.as_raw_fd();
        let hostname = hostname.to_owned();
        let mut cmd = Command::new(format!("/proc/self/fd/{exe_fd}"));
        // SAFETY: the closure runs between fork and exec; it makes system calls only (no
        // allocation, no lock: the strings were made here, before the fork).
        unsafe {
            cmd.pre_exec(move || enter_second_host(exe_fd, netns_fd, &hostname));
        }
        cmd
    }
}

/// In the forked child: enters the host's namespaces, forks the peer and waits for it.
/// Returns (and the child execs) only in the peer.
fn enter_second_host(exe_fd: RawFd, netns_fd: RawFd, hostname: &str) -> std::io::Result<()> {
    // SAFETY: both descriptors are open in this child: `Launch` keeps them open in the
    // parent until the spawn returned.
    let (exe, netns) = unsafe { (BorrowedFd::borrow_raw(exe_fd), BorrowedFd::borrow_raw(netns_fd)) };
    // The binary must survive the exec.
    fcntl(exe, FcntlArg::F_SETFD(FdFlag::empty()))?;
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
    setns(netns, CloneFlags::CLONE_NEWNET)?;
    unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWUTS | CloneFlags::CLONE_NEWPID)?;
    // SAFETY: this child has one thread (fork copies only the calling one); both sides of
    // this fork make system calls only.
    match unsafe { fork() }? {
        ForkResult::Child => {
            if let Err(step) = set_up_host(hostname) {
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

/// In the peer (first process of its PID namespace): its own mounts, hostname and
/// parent-death signal. Returns the failed step.
fn set_up_host(hostname: &str) -> Result<(), &'static str> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(|_| "prctl(PR_SET_PDEATHSIG)\n")?;
    private_mounts()?;
    let fresh = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mount(Some("tmpfs"), "/dev/shm", Some("tmpfs"), fresh, None::<&str>).map_err(|_| "tmpfs on /dev/shm\n")?;
    mount(Some("tmpfs"), "/tmp", Some("tmpfs"), fresh, None::<&str>).map_err(|_| "tmpfs on /tmp\n")?;
    mount(Some("proc"), "/proc", Some("proc"), fresh | MsFlags::MS_NOEXEC, None::<&str>)
        .map_err(|_| "proc on /proc\n")?;
    fresh_sysfs()?;
    sethostname(hostname).map_err(|_| "sethostname\n")?;
    Ok(())
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
