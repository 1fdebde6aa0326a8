//! Dropped and awaited requests, and the async accept and connect, between real
//! processes on the native lane (host frames).
//!
//! A send that never started is withdrawn when its handle drops; a send in flight still
//! arrives; `.await` on a receive ends with the context's `request_timeout`; accepting
//! and connecting as futures never block the executor's thread.

mod common;

use common::*;
use ferrylink::transport::{AcceptError, Config, ConnectError, Context, Endpoint, Listener, TransportError};
use ferrylink::Message;
use std::io::BufRead;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PATH_VAR: &str = "FERRYLINK_TEST_SOCKET";
/// A message that needs staging on the sender (above the inline threshold).
const STAGED: usize = 600 << 10;

fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap()
}

/// Runs `future` to its end on `runtime`; `None` when it had not ended after 20 s (the
/// bound under test is far shorter: this only keeps a broken one from hanging the test).
fn run_bounded<F: std::future::Future>(runtime: &tokio::runtime::Runtime, future: F) -> Option<F::Output> {
    runtime.block_on(async { tokio::time::timeout(Duration::from_secs(20), future).await.ok() })
}

fn message(name: &str, len: usize) -> Message {
    Message::new(name.as_bytes().to_vec(), vec![pattern(len, len as u64).into()])
}

/// How the peer reports a message: `name:checksum`.
fn described(m: &Message) -> String {
    let bytes: Vec<u8> = m.frames.iter().flat_map(frame_bytes).collect();
    format!("{}:{}", String::from_utf8_lossy(&m.header), checksum(&bytes))
}

fn expected(name: &str, len: usize) -> String {
    described(&message(name, len))
}

/// The next line the parent writes to the peer's stdin.
fn read_command() -> String {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).expect("stdin");
    line.trim().to_owned()
}

/// The peer of the drop tests: connects with an unclaimed budget of one byte (the first
/// message lands and is acknowledged, the rest wait unacknowledged), waits for
/// `receive N`, receives N messages and prints them, then stays until the parent hangs up.
fn run_holding_peer() {
    let ctx = Context::new(Config::default().with_unexpected_max_bytes(1)).unwrap();
    let ep = ctx.connect(std::env::var(PATH_VAR).unwrap()).expect("connect");
    let command = read_command();
    let n: usize = command.strip_prefix("receive ").and_then(|n| n.parse().ok()).expect("receive N");
    let got: Vec<String> = (0..n).map(|_| described(&ep.recv().wait().expect("receive"))).collect();
    println!("received: {}", got.join(" "));
    let _ = ep.recv().wait();
}

struct Parent {
    _dir: tempfile::TempDir,
    ctx: Context,
    peer: Peer,
    ep: Endpoint,
}

fn start(peers: &Peers, role: &str, config: Config) -> Parent {
    let dir = socket_dir();
    let ctx = Context::new(config).unwrap();
    let listener = Listener::bind(&ctx, dir.path().join("private/s.sock")).unwrap();
    let peer = peers.spawn_with(role, &[(PATH_VAR, listener.path().display().to_string())], true);
    let ep = listener.accept_timeout(Duration::from_secs(20)).expect("peer connects");
    Parent { _dir: dir, ctx, peer, ep }
}

fn sends_in_flight_become(ctx: &Context, n: usize) -> bool {
    eventually(Duration::from_secs(10), || ctx.stats().unwrap().sends_in_flight == n)
}

peer_test! {
    fn dropping_a_send_that_never_started_withdraws_it(peers) {
        // Staging holds one staged message: the third waits for room.
        let config = Config::default().with_staging_region_bytes(1 << 20).with_staging_max_bytes(1 << 20);
        let mut p = start(&peers, "holding", config);
        p.ep.send(message("a", STAGED)).wait().expect("the first lands at once");
        let second = p.ep.send(message("b", STAGED));
        let third = p.ep.send(message("c", STAGED));
        assert!(sends_in_flight_become(&p.ctx, 2), "the second in flight, the third waiting for staging room");
        drop(third);
        assert!(sends_in_flight_become(&p.ctx, 1), "the dropped send is withdrawn");
        // Had the third stayed queued, this would wait behind it.
        let fourth = p.ep.send(message("d", 16));
        p.peer.write_line("receive 3");
        let got = p.peer.expect_line_with("received: ", Duration::from_secs(20));
        let want = [expected("a", STAGED), expected("b", STAGED), expected("d", 16)].join(" ");
        assert_eq!(got, want, "the withdrawn send never reached the peer");
        second.wait().expect("second");
        fourth.wait().expect("fourth");
        assert_eq!(p.ctx.stats().unwrap().sends_in_flight, 0);
        drop(p.ep);
        p.peer.wait_success(Duration::from_secs(30));
    }
    "holding" => run_holding_peer(),
}

peer_test! {
    fn dropping_a_send_in_flight_still_delivers_it(peers) {
        let mut p = start(&peers, "holding", Config::default());
        p.ep.send(message("a", STAGED)).wait().expect("the first lands at once");
        let second = p.ep.send(message("b", STAGED));
        assert!(sends_in_flight_become(&p.ctx, 1), "described, unacknowledged");
        drop(second);
        p.peer.write_line("receive 2");
        let got = p.peer.expect_line_with("received: ", Duration::from_secs(20));
        assert_eq!(got, [expected("a", STAGED), expected("b", STAGED)].join(" "));
        assert!(sends_in_flight_become(&p.ctx, 0), "the dropped send completed as usual");
        drop(p.ep);
        p.peer.wait_success(Duration::from_secs(30));
    }
    "holding" => run_holding_peer(),
}

/// Connects, then sends one message `late` when told to `send`, and stays until the
/// parent hangs up.
fn run_late_peer() {
    let ctx = Context::new(Config::default()).unwrap();
    let ep = ctx.connect(std::env::var(PATH_VAR).unwrap()).expect("connect");
    assert_eq!(read_command(), "send");
    ep.send(message("late", 16)).wait().expect("send");
    let _ = ep.recv().wait();
}

peer_test! {
    fn awaiting_a_recv_ends_with_the_request_timeout_and_loses_nothing(peers) {
        let bound = Duration::from_millis(300);
        let mut p = start(&peers, "late", Config::default().with_request_timeout(bound));
        let runtime = current_thread_runtime();
        let started = Instant::now();
        let awaited = run_bounded(&runtime, p.ep.recv());
        let waited = started.elapsed();
        let error = awaited.expect("the await ended by itself").expect_err("nothing was sent");
        assert_eq!(error.error, TransportError::TimedOut(bound));
        assert!(waited >= bound, "ended after {waited:?}, before the bound");
        p.peer.write_line("send");
        let late = run_bounded(&runtime, p.ep.recv());
        assert_eq!(late.expect("within the bound").expect("received").header, b"late");
        drop(p.ep);
        p.peer.wait_success(Duration::from_secs(30));
    }
    "late" => run_late_peer(),
}

/// Connects with `connect_async` after a pause, sends `hello`, prints the reply.
fn run_async_peer() {
    let ctx = Context::new(Config::default()).unwrap();
    let path = std::env::var(PATH_VAR).unwrap();
    current_thread_runtime().block_on(async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let ep = ctx.connect_async(&path).await.expect("connect_async");
        ep.send(message("hello", 32)).await.expect("send");
        let reply = ep.recv().await.expect("reply");
        println!("reply: {}", described(&reply));
        let _ = ep.recv().await;
    });
}

peer_test! {
    fn accept_async_and_connect_async_leave_the_executor_free(peers) {
        let dir = socket_dir();
        let ctx = Context::new(Config::default()).unwrap();
        let listener = Listener::bind(&ctx, dir.path().join("private/s.sock")).unwrap();
        let mut peer = peers.spawn("async", &[(PATH_VAR, listener.path().display().to_string())]);
        let ticks = Arc::new(AtomicU64::new(0));
        let runtime = current_thread_runtime();
        let ep = runtime.block_on(async {
            // Runs only while the accept yields the one thread of this runtime.
            let counter = ticks.clone();
            let ticker = tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            });
            let ep = listener.accept_async().await.expect("accept_async");
            ticker.abort();
            let hello = ep.recv().await.expect("hello");
            assert_eq!(described(&hello), expected("hello", 32));
            ep.send(message("back", 64)).await.expect("reply");
            ep
        });
        assert!(ticks.load(Ordering::Relaxed) > 0, "the executor's thread was blocked while accepting");
        assert_eq!(peer.expect_line_with("reply: ", Duration::from_secs(20)), expected("back", 64));
        drop(ep);
        peer.wait_success(Duration::from_secs(30));
    }
    "async" => run_async_peer(),
}

#[test]
fn accept_async_ends_with_the_request_timeout() {
    let dir = socket_dir();
    let bound = Duration::from_millis(200);
    let ctx = Context::new(Config::default().with_request_timeout(bound)).unwrap();
    let listener = Listener::bind(&ctx, dir.path().join("private/s.sock")).unwrap();
    let started = Instant::now();
    let accepted = run_bounded(&current_thread_runtime(), listener.accept_async());
    match accepted.expect("the await ended by itself") {
        Err(AcceptError::TimedOut(t)) => assert_eq!(t, bound),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(started.elapsed() >= bound);
}

#[test]
fn connect_async_to_nobody_fails_with_the_systems_word() {
    let dir = socket_dir();
    let ctx = Context::new(Config::default()).unwrap();
    let path = dir.path().join("nobody.sock");
    let connected = run_bounded(&current_thread_runtime(), ctx.connect_async(&path));
    match connected.expect("the await ended by itself") {
        Err(ConnectError::Io { path: p, source }) => {
            assert_eq!(p, path);
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("expected an I/O error, got {:?}", other.map(|_| "an endpoint")),
    }
}
