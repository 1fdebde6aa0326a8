//! Two hosts on one machine: a test's traffic between a first and a second "host", each a
//! network namespace the test makes, joined by a veth pair with addresses from
//! `198.18.0.0/15` (the benchmarking range; no other), removed when the [`TwoHosts`]
//! drops (also on panic).
//!
//! - The first host is the test's own thread: [`TwoHosts::enter_first_host`] moves it (and
//!   every thread it starts afterwards, such as a transport's progress thread) into the
//!   first namespace, with its own mount namespace whose `/sys` shows that network.
//!   Other threads of the process stay where they were.
//! - The second host runs peers ([`TwoHosts::spawn_on_second_host`]): each peer joins the
//!   second network namespace and gets its own mount, UTS and PID namespaces, a fresh
//!   `/dev/shm` and `/tmp`, and the second host's name. Killing the peer ends everything
//!   it started there.
//!
//! Both namespaces hold one interface besides `lo`: [`LINK`], so a process-wide
//! `UCX_NET_DEVICES` names it on either side ([`use_the_link_for_ucx`]). Names are unique
//! per [`TwoHosts`] (process id and a counter), so tests run in parallel. Every external
//! command (`ip`) is bounded in time. Where namespaces cannot be made, [`two_hosts_or_skip`]
//! skips the test with the reason, or fails it under `FERRYLINK_REQUIRE_NETNS=1`.

mod enter;

pub use enter::SETUP_FAILED;

use crate::peer::{Peer, Peers};
use crate::skip::{or_skip, Need};
use enter::Launch;
use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The interface of either host on the link between them.
pub const LINK: &str = "fl0";
/// The first host's address on the link.
pub const FIRST_ADDR: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// The second host's address on the link.
pub const SECOND_ADDR: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
/// The link's prefix length.
const PREFIX: u8 = 30;
/// The longest the link may take to run once up.
const LINK_BOUND: Duration = Duration::from_secs(10);
/// The longest one `ip` command may take.
const IP_BOUND: Duration = Duration::from_secs(20);

/// Sets this process's UCX to TCP over [`LINK`] (`UCX_TLS=tcp`, `UCX_NET_DEVICES=fl0`),
/// once, for its own UCX contexts and the peers it starts. For a test binary whose tests
/// are all two-host tests: each calls it first, before any thread reads the environment.
pub fn use_the_link_for_ucx() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for (name, value) in ucx_env() {
            std::env::set_var(name, value);
        }
    });
}

/// The UCX settings of both hosts: TCP over [`LINK`].
pub fn ucx_env() -> [(&'static str, &'static str); 2] {
    [("UCX_TLS", "tcp"), ("UCX_NET_DEVICES", LINK)]
}

/// Two hosts, or `None` after skipping (printing why) where namespaces cannot be made;
/// fails the test instead under `FERRYLINK_REQUIRE_NETNS=1`.
pub fn two_hosts_or_skip() -> Option<TwoHosts> {
    or_skip(Need::Netns, TwoHosts::new())
}

/// A first and a second host joined by a veth pair. Dropping it removes both.
pub struct TwoHosts {
    first: String,
    second: String,
    second_hostname: String,
    /// Where the thread that entered the first host came from.
    entered_from: Option<(std::thread::ThreadId, File)>,
    /// The second host's network is gone ([`TwoHosts::tear_down_second_host`]).
    second_gone: bool,
}

impl TwoHosts {
    /// Makes both namespaces and the link between them.
    pub fn new() -> Result<Self, String> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        if !std::path::Path::new("/proc/self/ns/net").exists() {
            return Err("this kernel has no network namespaces (/proc/self/ns/net)".into());
        }
        remove_stale_namespaces();
        let id = format!("{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let hosts = Self {
            first: format!("ferrylink-{id}-first"),
            second: format!("ferrylink-{id}-second"),
            second_hostname: format!("ferrylink-second-host-{id}"),
            entered_from: None,
            second_gone: false,
        };
        // From here on, a failure drops `hosts`, which removes what was made.
        ip(&["netns", "add", &hosts.first])?;
        ip(&["netns", "add", &hosts.second])?;
        ip(&["-n", &hosts.first, "link", "add", LINK, "type", "veth", "peer", "name", LINK, "netns", &hosts.second])?;
        for (ns, addr) in [(&hosts.first, FIRST_ADDR), (&hosts.second, SECOND_ADDR)] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/{PREFIX}"), "dev", LINK])?;
            ip(&["-n", ns, "link", "set", LINK, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        hosts.wait_link_running()?;
        Ok(hosts)
    }

    /// The second host's name (its UTS namespace's hostname).
    pub fn second_hostname(&self) -> &str {
        &self.second_hostname
    }

    /// The name of the first host's network namespace (`ip netns`).
    pub fn first_netns(&self) -> &str {
        &self.first
    }

    /// The name of the second host's network namespace (`ip netns`).
    pub fn second_netns(&self) -> &str {
        &self.second
    }

    /// Moves the calling thread, and every thread it starts from now on, into the first
    /// host's network. The thread goes back when `self` drops (drop it on that thread).
    pub fn enter_first_host(&mut self) -> Result<(), String> {
        let here = File::open("/proc/thread-self/ns/net").map_err(|e| format!("this thread's network: {e}"))?;
        let first = File::open(netns_path(&self.first)).map_err(|e| format!("{}: {e}", self.first))?;
        nix::sched::setns(first.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| format!("setns into {}: {e}", self.first))?;
        self.entered_from = Some((std::thread::current().id(), here));
        // UCX finds interfaces in /sys/class/net, which shows the network of whoever
        // mounted sysfs: this thread gets its own mounts (a thread may unshare them
        // together with its filesystem context) and a sysfs of the first host.
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS | nix::sched::CloneFlags::CLONE_NEWNS)
            .map_err(|e| format!("unsharing this thread's mounts: {e}"))?;
        enter::private_mounts()
            .and_then(|()| enter::fresh_sysfs())
            .map_err(|step| format!("this thread's mounts: {}", step.trim()))
    }

    /// Starts a peer (as [`Peers::spawn`]) on the second host, with [`ucx_env`] in its
    /// environment besides `env`.
    pub fn spawn_on_second_host(&self, peers: &Peers, role: &str, env: &[(&str, String)]) -> Peer {
        let launch = Launch::open(&netns_path(&self.second))
            .unwrap_or_else(|e| panic!("opening what the second host's peer needs: {e}"));
        let mut all: Vec<(&str, String)> = ucx_env().iter().map(|&(k, v)| (k, v.to_owned())).collect();
        all.extend(env.iter().cloned());
        let peer = peers.spawn_command(launch.command(&self.second_hostname), role, &all, false);
        drop(launch);
        peer
    }

    /// Sets the link down (`up == false`) or up again, on the first host's side (the
    /// second side's carrier follows).
    /// Back up, this waits until both ends run.
    pub fn set_link(&self, up: bool) -> Result<(), String> {
        ip(&["-n", &self.first, "link", "set", LINK, if up { "up" } else { "down" }])?;
        if up {
            self.wait_link_running()?;
        }
        Ok(())
    }

    /// Waits (bounded) until both ends of the link run: the kernel reports a new carrier
    /// up to a second late, and UCX refuses an interface that is not running yet.
    fn wait_link_running(&self) -> Result<(), String> {
        let deadline = Instant::now() + LINK_BOUND;
        for ns in [&self.first, &self.second] {
            loop {
                let shown = ip_output(&["-n", ns, "-o", "link", "show", LINK])?;
                if shown.contains("state UP") {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!("the link in {ns} is not running after {LINK_BOUND:?}: {}", shown.trim()));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// Removes the second host's network: the link (both ends) and its namespace. Its
    /// peers, cut off, are the caller's to kill.
    pub fn tear_down_second_host(&mut self) -> Result<(), String> {
        self.second_gone = true;
        ip(&["-n", &self.second, "link", "del", LINK])?;
        ip(&["netns", "del", &self.second])
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        if let Some((thread, from)) = self.entered_from.take() {
            if thread == std::thread::current().id() {
                let _ = nix::sched::setns(from.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET);
            }
        }
        // Deleting the link first: a namespace outlives its name while a process (or a
        // thread) is still in it.
        let _ = ip(&["-n", &self.first, "link", "del", LINK]);
        let _ = ip(&["netns", "del", &self.first]);
        if !self.second_gone {
            let _ = ip(&["netns", "del", &self.second]);
        }
    }
}

/// Removes the namespaces of test processes that died before their [`TwoHosts`] dropped
/// (killed, say): `ferrylink-PID-N-first`/`-second` whose process is gone.
fn remove_stale_namespaces() {
    let Ok(entries) = std::fs::read_dir("/var/run/netns") else { return };
    for name in entries.filter_map(|e| e.ok()?.file_name().into_string().ok()) {
        let Some(pid) = name.strip_prefix("ferrylink-").and_then(|rest| rest.split('-').next()) else { continue };
        if pid.parse::<u32>().is_ok() && !std::path::Path::new("/proc").join(pid).exists() {
            let _ = ip(&["-n", &name, "link", "del", LINK]);
            let _ = ip(&["netns", "del", &name]);
        }
    }
}

fn netns_path(name: &str) -> PathBuf {
    PathBuf::from("/var/run/netns").join(name)
}

/// Runs `ip ARGS`, bounded by [`IP_BOUND`]; its error output on failure.
fn ip(args: &[&str]) -> Result<(), String> {
    ip_output(args).map(drop)
}

/// Runs `ip ARGS`, bounded by [`IP_BOUND`]: its output (a line or two), or its error
/// output on failure.
fn ip_output(args: &[&str]) -> Result<String, String> {
    let what = format!("ip {}", args.join(" "));
    let mut child = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{what}: {e} (is iproute2 installed?)"))?;
    let deadline = Instant::now() + IP_BOUND;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{what}: no answer within {IP_BOUND:?}"));
            }
            Err(e) => return Err(format!("{what}: {e}")),
        }
    };
    if status.success() {
        let mut out = String::new();
        if let Some(mut stdout) = child.stdout.take() {
            let _ = std::io::Read::read_to_string(&mut stdout, &mut out);
        }
        return Ok(out);
    }
    let mut stderr = String::new();
    if let Some(mut err) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut err, &mut stderr);
    }
    Err(format!("{what}: {status}: {}", stderr.trim()))
}
