//! Commands across the two hosts: what the `two-host` binary runs. A first command runs
//! on the first host (network namespace and mounts of its own), commands started beside
//! it run on the second; when the first ends (or its time is up) every process of both is
//! killed and the hosts are removed. For what is not a Rust test: the Python tests of the
//! Dask comm across hosts and the benchmark between hosts (`benchmarks/two-host.sh`).
//!
//! ```text
//! two-host [--keep DIR]... [--second 'SHELL LINE']... [--timeout SECS] [--grace SECS] -- COMMAND [ARG]...
//! ```
//!
//! Every command gets `UCX_TLS=tcp`, `UCX_NET_DEVICES=fl0`, and the hosts' addresses in
//! `FERRYLINK_FIRST_HOST` and `FERRYLINK_SECOND_HOST`. A `--second` line runs under
//! `/bin/sh -c` on the second host; `--keep DIR` keeps a directory under `/tmp` or
//! `/dev/shm` visible there (a virtual environment, a checkout), everything else of those
//! stays the second host's own.

use super::{ucx_env, TwoHosts, FIRST_ADDR, SECOND_ADDR};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// The exit status when the hosts cannot be made (the reason is on stderr).
pub const NO_HOSTS: i32 = 77;
/// The exit status when the first command ran out of time.
pub const TIMED_OUT: i32 = 124;
/// The exit status of bad arguments.
pub const USAGE: i32 = 2;

/// What to run across the hosts.
#[derive(Debug, Clone, PartialEq)]
pub struct Across {
    /// The first host's command and its arguments.
    pub first: Vec<OsString>,
    /// Shell lines for the second host, started before the first command.
    pub second: Vec<String>,
    /// Directories kept visible on the second host.
    pub keep: Vec<PathBuf>,
    /// The longest the first command may run.
    pub timeout: Duration,
    /// How long the second host's commands may go on after the first ended.
    pub grace: Duration,
}

impl Across {
    /// Parses the arguments after the program's name.
    pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Self, String> {
        let mut across = Self {
            first: Vec::new(),
            second: Vec::new(),
            keep: Vec::new(),
            timeout: Duration::from_secs(600),
            grace: Duration::from_secs(5),
        };
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            if arg == "--" {
                across.first.extend(args.by_ref());
                break;
            }
            let mut value = || args.next().ok_or_else(|| format!("{} needs a value", arg.to_string_lossy()));
            match arg.to_str() {
                Some("--keep") => across.keep.push(PathBuf::from(value()?)),
                Some("--second") => {
                    across.second.push(value()?.into_string().map_err(|_| "--second: not UTF-8".to_owned())?)
                }
                Some("--timeout") => across.timeout = seconds(&value()?)?,
                Some("--grace") => across.grace = seconds(&value()?)?,
                _ => return Err(format!("unknown argument {}", arg.to_string_lossy())),
            }
        }
        if across.first.is_empty() {
            return Err("no command for the first host (after --)".into());
        }
        Ok(across)
    }
}

fn seconds(value: &OsString) -> Result<Duration, String> {
    let text = value.to_string_lossy();
    match text.parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Ok(Duration::from_secs_f64(s)),
        _ => Err(format!("{text}: not a number of seconds in (0, 86400]")),
    }
}

/// The environment of every command across the hosts.
fn host_env() -> Vec<(&'static str, String)> {
    let mut env: Vec<(&str, String)> = ucx_env().iter().map(|&(k, v)| (k, v.to_owned())).collect();
    env.push(("FERRYLINK_FIRST_HOST", FIRST_ADDR.to_string()));
    env.push(("FERRYLINK_SECOND_HOST", SECOND_ADDR.to_string()));
    env
}

/// Makes the hosts, runs `across` and removes the hosts: the first command's exit status
/// ([`NO_HOSTS`] where the hosts cannot be made, [`TIMED_OUT`] past its time). Problems
/// are printed to stderr.
pub fn run(across: &Across) -> i32 {
    let mut hosts = match TwoHosts::new() {
        Ok(hosts) => hosts,
        Err(reason) => {
            eprintln!("two-host: namespaces for a second host cannot be made: {reason}");
            return NO_HOSTS;
        }
    };
    let mut second = Vec::new();
    for line in &across.second {
        match hosts.spawn_program_on_second_host(Path::new("/bin/sh"), &["-c", line], &across.keep) {
            Ok(child) => second.push(child),
            Err(e) => {
                eprintln!("two-host: starting `{line}` on the second host: {e}");
                end_all(second, Duration::ZERO);
                return USAGE;
            }
        }
    }
    let status = match hosts.enter_first_host() {
        Ok(()) => run_first(&across.first, across.timeout),
        Err(e) => {
            eprintln!("two-host: entering the first host: {e}");
            NO_HOSTS
        }
    };
    end_all(second, across.grace);
    drop(hosts);
    status
}

/// Runs the first host's command in a process group of its own, bounded by `timeout`;
/// kills what is left of the group when it ends.
fn run_first(command: &[OsString], timeout: Duration) -> i32 {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..]).envs(host_env()).process_group(0);
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("two-host: starting {}: {e}", command[0].to_string_lossy());
            return USAGE;
        }
    };
    let group = nix::unistd::Pid::from_raw(-(child.id() as i32));
    let status = wait_bounded(&mut child, timeout);
    let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
    let _ = child.wait();
    match status {
        Some(status) => {
            status.code().unwrap_or_else(|| 128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0))
        }
        None => {
            eprintln!("two-host: the first host's command ran past {timeout:?}: killed");
            TIMED_OUT
        }
    }
}

/// Waits for `child` at most `bound`: its status, or `None` while it still runs.
fn wait_bounded(child: &mut Child, bound: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + bound;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) | Err(_) => return None,
        }
    }
}

/// Gives the second host's commands `grace` to end, then kills them (and with each,
/// everything it started there).
fn end_all(children: Vec<Child>, grace: Duration) {
    let deadline = Instant::now() + grace;
    for mut child in children {
        if wait_bounded(&mut child, deadline.saturating_duration_since(Instant::now())).is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl TwoHosts {
    /// Starts `program` with `args` on the second host (as the peers of
    /// [`TwoHosts::spawn_on_second_host`]), with the UCX settings and the hosts' addresses
    /// of every command across the hosts, and `keep` visible there; stdio inherited.
    pub fn spawn_program_on_second_host(
        &self,
        program: &Path,
        args: &[&str],
        keep: &[PathBuf],
    ) -> Result<Child, String> {
        let mut launch = super::enter::Launch::open_for_programs(&super::netns_path(&self.second))
            .map_err(|e| format!("{}: {e}", self.second))?;
        for dir in keep {
            launch.keep(dir)?;
        }
        let mut cmd = launch.program(program, &self.second_hostname);
        cmd.args(args).envs(host_env());
        let child = cmd.spawn().map_err(|e| format!("{}: {e}", program.display()));
        drop(launch);
        child
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Across, String> {
        Across::parse(args.iter().map(OsString::from))
    }

    #[test]
    fn parses_both_hosts_commands() {
        let a =
            parse(&["--keep", "/tmp/v", "--second", "sleep 1", "--timeout", "2.5", "--", "echo", "--keep"]).unwrap();
        assert_eq!(a.first, vec![OsString::from("echo"), OsString::from("--keep")]);
        assert_eq!(a.second, vec!["sleep 1".to_owned()]);
        assert_eq!(a.keep, vec![PathBuf::from("/tmp/v")]);
        assert_eq!(a.timeout, Duration::from_millis(2500));
        assert_eq!(a.grace, Duration::from_secs(5));
    }

    #[test]
    fn refuses_what_it_cannot_run() {
        assert!(parse(&["--second", "x"]).unwrap_err().contains("no command"));
        assert!(parse(&["--timeout"]).unwrap_err().contains("needs a value"));
        assert!(parse(&["--timeout", "-1", "--", "x"]).unwrap_err().contains("seconds"));
        assert!(parse(&["--timeout", "inf", "--", "x"]).unwrap_err().contains("seconds"));
        assert!(parse(&["--bogus", "--", "x"]).unwrap_err().contains("unknown"));
    }
}
