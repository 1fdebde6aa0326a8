//! Peers held still while a load check posts its window: stopped (`SIGSTOP`) they take
//! and acknowledge nothing, so every message the check posts is in flight at the
//! transport at once; resumed (`SIGCONT`) when the check first waits
//! ([`ResumedAtFirstWait`]).

use crate::common::{echo, Ferry, Peer};
use echo::Transport as _;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::borrow::Cow;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Peer processes stopped until [`PausedPeers::resume`] (or the drop).
pub struct PausedPeers {
    pids: Vec<Pid>,
    resumed: bool,
}

impl PausedPeers {
    /// Stops `peers` and waits (bounded: 5 s) until every thread of each is stopped.
    pub fn stop(peers: &[Peer]) -> Self {
        let pids: Vec<Pid> = peers.iter().map(|p| Pid::from_raw(p.id() as i32)).collect();
        let paused = Self { pids, resumed: false };
        for &pid in &paused.pids {
            kill(pid, Signal::SIGSTOP).unwrap_or_else(|e| panic!("SIGSTOP to peer {pid}: {e}"));
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for &pid in &paused.pids {
            while !all_threads_stopped(pid) {
                assert!(Instant::now() < deadline, "peer {pid} not stopped 5 s after SIGSTOP");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        paused
    }

    /// Lets the peers run again.
    pub fn resume(&mut self) {
        if std::mem::replace(&mut self.resumed, true) {
            return;
        }
        for &pid in &self.pids {
            kill(pid, Signal::SIGCONT).unwrap_or_else(|e| panic!("SIGCONT to peer {pid}: {e}"));
        }
    }
}

/// ferrylink's transport for the kit's load check ([`Ferry`]), with peers stopped until
/// the check first waits for a request: everything it posts before that is in flight at
/// once, whatever its window.
pub struct ResumedAtFirstWait {
    peers: Mutex<PausedPeers>,
}

impl ResumedAtFirstWait {
    pub fn new(peers: PausedPeers) -> Self {
        Self { peers: Mutex::new(peers) }
    }

    fn resume(&self) {
        self.peers.lock().unwrap_or_else(|e| e.into_inner()).resume();
    }
}

impl echo::Transport for ResumedAtFirstWait {
    type Endpoint = <Ferry as echo::Transport>::Endpoint;
    type Message = <Ferry as echo::Transport>::Message;
    type Sending = <Ferry as echo::Transport>::Sending;
    type Receiving = <Ferry as echo::Transport>::Receiving;

    fn send(&self, ep: &Self::Endpoint, message: Self::Message) -> Self::Sending {
        Ferry.send(ep, message)
    }
    fn recv(&self, ep: &Self::Endpoint) -> Self::Receiving {
        Ferry.recv(ep)
    }
    fn wait_sent(&self, req: &mut Self::Sending, bound: Duration) -> Option<Result<(), String>> {
        self.resume();
        Ferry.wait_sent(req, bound)
    }
    fn wait_received(&self, req: &mut Self::Receiving, bound: Duration) -> Option<Result<Self::Message, String>> {
        self.resume();
        Ferry.wait_received(req, bound)
    }
    fn message(&self, header: Vec<u8>, frames_of: Option<Self::Message>) -> Self::Message {
        Ferry.message(header, frames_of)
    }
    fn header<'m>(&self, message: &'m Self::Message) -> &'m [u8] {
        Ferry.header(message)
    }
    fn frames<'m>(&self, message: &'m Self::Message) -> Vec<Cow<'m, [u8]>> {
        Ferry.frames(message)
    }
}

impl Drop for PausedPeers {
    fn drop(&mut self) {
        // A stopped peer would hold up the test's waits for it (a kill ends it anyway).
        for &pid in &self.pids {
            let _ = kill(pid, Signal::SIGCONT);
        }
    }
}

/// Whether every thread of `pid` is in the stopped state (`T` in `/proc/PID/task/*/stat`).
fn all_threads_stopped(pid: Pid) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.flatten().all(|task| {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // `pid (comm) S ...`: the state follows the last ')' (comm may contain one).
        stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()) == Some('T')
    })
}
