//! The re-exec harness: a test runs this test binary again as its peer process.
//!
//! [`peer_test!`](crate::peer_test) declares a test `name` and, next to it, the peer's
//! entry point: an ignored test `name::peer_process`. The parent starts peers with
//! [`Peers::spawn`]; each is this binary run as `--ignored --exact name::peer_process`,
//! its role in an environment variable. The entry point does nothing unless its own test
//! started it (so `cargo test -- --ignored` runs it harmlessly); in a peer it runs the
//! peer body for the role and then prints a completion line, which
//! [`Peer::wait_success`] requires together with a zero exit status: a peer that never
//! ran (a name that matched no test), died or returned early fails the test.
//!
//! A [`Peer`] captures the child's stdout and stderr (each line is also written to the
//! parent's captured output, so a failing test shows it), bounds every wait, and kills the
//! child when it is dropped. Dropping a peer that was neither waited for nor killed fails
//! the test. Never fork after CUDA is initialised: spawning a fresh process image is
//! always safe.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The test entry point a peer process runs (its libtest name).
const ENTRY_VAR: &str = "FERRYLINK_TESTKIT_PEER_ENTRY";
/// The peer's role.
const ROLE_VAR: &str = "FERRYLINK_TESTKIT_PEER_ROLE";
/// The line a peer prints once its body returned.
const DONE: &str = "ferrylink-testkit: peer finished:";
/// The line a peer prints at a step ([`reached`]).
const STEP: &str = "ferrylink-testkit: peer reached:";
/// The entry point's name inside the module `peer_test!` makes for a test.
#[doc(hidden)]
pub const ENTRY_FN: &str = "peer_process";
/// How many lines of each stream a failure message shows.
const TAIL_LINES: usize = 60;

/// The peers of one test: made by [`peer_test!`](crate::peer_test) and handed to the
/// parent body.
#[derive(Clone, Debug)]
pub struct Peers {
    entry: String,
}

impl Peers {
    /// For `peer_test!`: `path` is `module_path!()::name::peer_process`.
    #[doc(hidden)]
    pub fn __new(path: &str) -> Self {
        Self { entry: test_name(path).to_owned() }
    }

    /// The libtest name of the peers' entry point (`name::peer_process`).
    pub fn entry(&self) -> &str {
        &self.entry
    }

    /// Starts a peer with `role` and extra environment variables (stdin: none).
    pub fn spawn(&self, role: &str, env: &[(&str, String)]) -> Peer {
        self.spawn_with(role, env, false)
    }

    /// Starts a peer with `role` and extra environment variables; with `stdin`, the
    /// parent writes to it ([`Peer::write_line`]).
    pub fn spawn_with(&self, role: &str, env: &[(&str, String)], stdin: bool) -> Peer {
        let exe = std::env::current_exe().expect("the test binary's path");
        self.spawn_command(Command::new(exe), role, env, stdin)
    }

    /// Starts a peer with `cmd`, a command that runs this test binary (however it is
    /// launched: [`crate::two_host`] enters namespaces first).
    pub fn spawn_command(&self, mut cmd: Command, role: &str, env: &[(&str, String)], stdin: bool) -> Peer {
        cmd.args(["--ignored", "--exact", &self.entry, "--nocapture", "--test-threads=1"])
            .env(ENTRY_VAR, &self.entry)
            .env(ROLE_VAR, role)
            .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawning peer {role} ({}): {e}", self.entry));
        let log = Arc::new(Log::default());
        let readers = vec![
            read_lines(child.stdout.take().expect("piped stdout"), Stream::Stdout, role, &log),
            read_lines(child.stderr.take().expect("piped stderr"), Stream::Stderr, role, &log),
        ];
        let stdin = child.stdin.take();
        Peer { child, role: role.to_owned(), entry: self.entry.clone(), log, readers, stdin, cursor: 0, done: false }
    }
}

/// A test's libtest name from a path with the crate name first.
fn test_name(path: &str) -> &str {
    path.split_once("::").map_or(path, |(_crate, rest)| rest)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Stream {
    Stdout,
    Stderr,
}

/// What a peer printed so far.
#[derive(Default)]
struct Log {
    state: Mutex<LogState>,
    grew: Condvar,
}

#[derive(Default)]
struct LogState {
    stdout: Vec<String>,
    stderr: Vec<String>,
    /// Streams at their end.
    closed: usize,
}

impl Log {
    fn lock(&self) -> MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Reads a stream of the child line by line into the log, echoing each line to the
/// parent's (test-captured) stderr.
fn read_lines(
    stream: impl Read + Send + 'static,
    which: Stream,
    role: &str,
    log: &Arc<Log>,
) -> std::thread::JoinHandle<()> {
    let log = log.clone();
    let prefix = format!("[peer {role}{}]", if which == Stream::Stderr { " stderr" } else { "" });
    // Spawned from the test's thread: its output is captured with the test's.
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut raw = Vec::new();
        loop {
            raw.clear();
            match reader.read_until(b'\n', &mut raw) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let line = String::from_utf8_lossy(&raw).trim_end_matches(['\n', '\r']).to_owned();
            eprintln!("{prefix} {line}");
            let mut state = log.lock();
            match which {
                Stream::Stdout => state.stdout.push(line),
                Stream::Stderr => state.stderr.push(line),
            }
            log.grew.notify_all();
        }
        log.lock().closed += 1;
        log.grew.notify_all();
    })
}

/// A peer's exit status and everything it printed.
#[derive(Debug)]
pub struct PeerOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// A running peer process (this test binary, re-executed). Killed when dropped.
pub struct Peer {
    child: Child,
    role: String,
    entry: String,
    log: Arc<Log>,
    readers: Vec<std::thread::JoinHandle<()>>,
    stdin: Option<ChildStdin>,
    /// Stdout lines already consumed by [`Peer::next_line_with`].
    cursor: usize,
    /// Waited for or killed: the test looked at the peer's end.
    done: bool,
}

impl Peer {
    /// The peer's process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The peer's role.
    pub fn role(&self) -> &str {
        &self.role
    }

    /// Writes one line to the peer's stdin (the peer must have been spawned with stdin);
    /// errors are ignored (the peer may have exited: the next wait reports that).
    pub fn write_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("the peer was spawned without stdin (spawn_with(.., true))");
        let _ = writeln!(stdin, "{line}").and_then(|()| stdin.flush());
    }

    /// The rest of the next stdout line containing `marker` (anywhere: libtest may have
    /// printed on the same line), after the lines earlier calls consumed; `None` when the
    /// peer's stdout ends or `bound` passes first.
    pub fn next_line_with(&mut self, marker: &str, bound: Duration) -> Option<String> {
        let deadline = Instant::now() + bound;
        let mut state = self.log.lock();
        loop {
            while self.cursor < state.stdout.len() {
                let line = &state.stdout[self.cursor];
                self.cursor += 1;
                if let Some(i) = line.find(marker) {
                    return Some(line[i + marker.len()..].to_owned());
                }
            }
            let now = Instant::now();
            if state.closed == 2 || now >= deadline {
                return None;
            }
            state = self.log.grew.wait_timeout(state, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Like [`Peer::next_line_with`], failing the test (with the peer's output, the peer
    /// killed) when no such line comes.
    pub fn expect_line_with(&mut self, marker: &str, bound: Duration) -> String {
        match self.next_line_with(marker, bound) {
            Some(rest) => rest,
            None => self.fail(&format!("printed no line with {marker:?} within {bound:?}")),
        }
    }

    /// Waits for the peer to reach `step` (it called [`reached`]); fails the test (with the
    /// peer's output, the peer killed) when it does not within `bound`.
    pub fn wait_reached(&mut self, step: &str, bound: Duration) {
        let marker = format!("{STEP} {step}");
        if self.next_line_with(&marker, bound).is_none() {
            self.fail(&format!("did not reach {step:?} within {bound:?}"));
        }
    }

    /// Waits (bounded) for the peer to end, and checks that it succeeded: exit status 0
    /// and its body ran to the end. Otherwise, or when `bound` passes (the peer is then
    /// killed), fails the test with the peer's output.
    pub fn wait_success(&mut self, bound: Duration) -> PeerOutput {
        let Some(status) = self.wait_exit(bound) else { self.fail(&format!("did not finish within {bound:?}")) };
        self.join_readers();
        let output = self.output(status);
        let done = format!("{DONE} {}", self.role);
        if !status.success() || !output.stdout.lines().any(|l| l.contains(&done)) {
            let why = if status.success() { "exited without running its body to the end" } else { "failed" };
            panic!("{}", self.describe(&format!("{why} ({status})")));
        }
        output
    }

    /// Waits (bounded) for the peer to end, whatever its exit status, for a test that
    /// expects a particular one (make it one a peer that never ran cannot have: not 0).
    /// Fails the test (the peer killed) when `bound` passes.
    pub fn wait_end(&mut self, bound: Duration) -> PeerOutput {
        let Some(status) = self.wait_exit(bound) else { self.fail(&format!("did not finish within {bound:?}")) };
        self.join_readers();
        self.output(status)
    }

    /// SIGKILLs the peer and reaps it (bounded).
    pub fn kill(&mut self) {
        self.done = true;
        let _ = self.child.kill();
        if self.wait_exit(Duration::from_secs(10)).is_none() {
            panic!("{}", self.describe("was not reaped within 10 s of SIGKILL"));
        }
    }

    /// Whether the peer has exited.
    pub fn has_exited(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_some()
    }

    /// Everything the peer printed so far (stdout, then stderr).
    pub fn output_so_far(&self) -> String {
        let state = self.log.lock();
        format!("stdout:\n{}\nstderr:\n{}", tail(&state.stdout), tail(&state.stderr))
    }

    fn wait_exit(&mut self, bound: Duration) -> Option<ExitStatus> {
        self.done = true;
        let deadline = Instant::now() + bound;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait on a peer") {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits (bounded) for the readers to see the end of the peer's streams (a grandchild
    /// holding them open does not hang the test).
    fn join_readers(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut state = self.log.lock();
        while state.closed < 2 && Instant::now() < deadline {
            state = self.log.grew.wait_timeout(state, Duration::from_millis(50)).unwrap_or_else(|e| e.into_inner()).0;
        }
        let all_closed = state.closed == 2;
        drop(state);
        if all_closed {
            for reader in self.readers.drain(..) {
                let _ = reader.join();
            }
        }
    }

    fn output(&self, status: ExitStatus) -> PeerOutput {
        let state = self.log.lock();
        PeerOutput { status, stdout: state.stdout.join("\n"), stderr: state.stderr.join("\n") }
    }

    fn describe(&self, what: &str) -> String {
        format!("peer {:?} of {} (pid {}) {what}\n{}", self.role, self.entry, self.child.id(), self.output_so_far())
    }

    /// Kills the peer and fails the test with its output.
    fn fail(&mut self, what: &str) -> ! {
        let _ = self.child.kill();
        let _ = self.wait_exit(Duration::from_secs(10));
        self.join_readers();
        panic!("{}", self.describe(what));
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let running = self.child.try_wait().ok().flatten().is_none();
        if running {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if !self.done && !std::thread::panicking() {
            panic!("{}", self.describe("was dropped without wait_success() or kill(): its end was never checked"));
        }
    }
}

fn tail(lines: &[String]) -> String {
    let skip = lines.len().saturating_sub(TAIL_LINES);
    let mut out = String::new();
    if skip > 0 {
        out.push_str(&format!("  ... {skip} lines before\n"));
    }
    for line in &lines[skip..] {
        out.push_str("  ");
        out.push_str(line);
        out.push('\n');
    }
    out
}

// ---- The peer's side ----

/// For `peer_test!`'s entry point: the role, when this process is the peer started for
/// the entry point `path` (`module_path!()` of the entry function); otherwise `None`
/// after printing why nothing runs.
#[doc(hidden)]
pub fn __peer_role(path: &str) -> Option<String> {
    let entry = format!("{}::{ENTRY_FN}", test_name(path));
    match (std::env::var(ENTRY_VAR), std::env::var(ROLE_VAR)) {
        (Ok(e), Ok(role)) if e == entry => Some(role),
        _ => {
            println!("{entry}: the peer process of a multi-process test; runs only when that test starts it");
            None
        }
    }
}

/// For `peer_test!`'s entry point: the peer body returned.
#[doc(hidden)]
pub fn __peer_done(role: &str) {
    let mut out = std::io::stdout().lock();
    // Own line: libtest may have printed "test NAME ... " without a newline.
    let _ = writeln!(out, "\n{DONE} {role}").and_then(|()| out.flush());
}

/// Called in a peer: it reached `step`; the parent waits for it with [`Peer::wait_reached`].
pub fn reached(step: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "\n{STEP} {step}").and_then(|()| out.flush());
}

/// Declares a multi-process test: the parent body, run by `cargo test`, and the peer
/// body, run in the peer processes the parent starts.
///
/// ```ignore
/// peer_test! {
///     /// Docs and attributes go to the parent test.
///     fn messages_round_trip(peers) {
///         let mut peer = peers.spawn("echo", &[("SOCKET", path)]);
///         // ...
///         peer.wait_success(Duration::from_secs(30));
///     }
///     "echo" => run_echo_peer(),
///     "sleeper" => { /* ... */ },
/// }
/// ```
///
/// or, with one body for every role (bound to `role`, a `&str`):
///
/// ```ignore
/// peer_test! {
///     fn killed_after_connect(peers) { sending_peer_dies(&peers, "connected-idle") }
///     peer(role) => run_peer(role),
/// }
/// ```
///
/// The parent is `#[test] fn NAME()`; `peers` is its [`Peers`]. The peer entry point is
/// `#[test] #[ignore] fn NAME::peer_process()` (a module named after the test, which
/// sees the file's items through `use super::*`). An unknown role fails the peer. A GPU
/// test's attribute `#[cfg_attr(not(feature = "gpu-tests"), ignore = "...")]` goes with the
/// docs, to the parent (`require_gpu`, feature `cuda`).
#[macro_export]
macro_rules! peer_test {
    (
        $(#[$meta:meta])*
        fn $name:ident($peers:ident) $parent:block
        peer($role:ident) => $child:expr $(,)?
    ) => {
        $(#[$meta])*
        #[test]
        fn $name() {
            let $peers = $crate::peer::Peers::__new(concat!(module_path!(), "::", stringify!($name), "::peer_process"));
            $parent
        }

        #[allow(unused_imports)]
        mod $name {
            use super::*;

            /// The peer process of the test of this name: started by it, not alone.
            #[test]
            #[ignore = "the peer process of a multi-process test: it starts this, with a role"]
            #[allow(unreachable_code)]
            fn peer_process() {
                let Some(__role) = $crate::peer::__peer_role(module_path!()) else { return };
                #[allow(unused_variables)]
                let $role: &str = &__role;
                // A closure: a `return` in the peer body ends the body, not the entry point.
                #[allow(clippy::redundant_closure_call)]
                (|| {
                    $child;
                })();
                $crate::peer::__peer_done($role);
            }
        }
    };
    (
        $(#[$meta:meta])*
        fn $name:ident($peers:ident) $parent:block
        $($r:literal => $child:expr),+ $(,)?
    ) => {
        $crate::peer_test! {
            $(#[$meta])*
            fn $name($peers) $parent
            peer(role) => match role {
                $($r => { $child; })+
                other => panic!("unknown peer role {other:?}"),
            }
        }
    };
}
