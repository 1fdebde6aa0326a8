//! The UCX lane between real processes (CI: Debian's UCX over TCP loopback, `UCX_TLS=tcp`).
//! Without UCX these tests print `skipped: UCX not available` and pass, unless
//! `FERRYLINK_REQUIRE_UCX=1`. The device-frame test also needs a GPU: ignored unless built
//! with `--features gpu-tests`, failing without a device.

mod common;

use common::*;
use ferrylink::transport::{
    Config, ConnectError, Context, ContextError, Endpoint, LaneKind, LanePolicy, Listener, TransportError,
};
use ferrylink::Message;
use std::time::{Duration, Instant};

const ADDR_VAR: &str = "FERRYLINK_TEST_ADDR";

fn ucx_config() -> Config {
    Config::default().with_lane_policy(LanePolicy::Ucx)
}

/// A context forced onto the UCX lane, or `None` (skipped) when UCX cannot load.
fn ucx_context_or_skip() -> Option<Context> {
    ucx_context_or_skip_with(ucx_config())
}

/// Connects to the address in the environment: `unix:PATH` or `tcp:HOST:PORT`.
fn connect_from_env(ctx: &Context) -> Endpoint {
    let addr = std::env::var(ADDR_VAR).unwrap();
    match addr.split_once(':') {
        Some(("unix", path)) => ctx.connect(path).unwrap(),
        Some(("tcp", hostport)) => ctx.connect_tcp(hostport).unwrap(),
        _ => panic!("bad address {addr}"),
    }
}

/// Echoes every message back (the kit's echo: the header, then the checksums of its
/// frames), until "stop".
fn run_echo_peer(policy: LanePolicy) {
    let ctx = Context::new(Config::default().with_lane_policy(policy)).unwrap();
    let ep = connect_from_env(&ctx);
    assert_eq!(ep.lane(), LaneKind::Ucx);
    echo::serve(&Ferry, &ep);
}

struct Parent {
    _dir: tempfile::TempDir,
    _listener: Listener,
    peer: Peer,
    ep: Endpoint,
}

fn start(peers: &Peers, role: &str, ctx: &Context, over_tcp: bool) -> Parent {
    let dir = socket_dir();
    let (listener, addr) = if over_tcp {
        let l = Listener::bind_tcp(ctx, "127.0.0.1:0").unwrap();
        let addr = format!("tcp:{}", l.tcp_addr().unwrap());
        (l, addr)
    } else {
        let l = Listener::bind(ctx, dir.path().join("p/s.sock")).unwrap();
        let addr = format!("unix:{}", l.path().display());
        (l, addr)
    };
    let peer = peers.spawn(role, &[(ADDR_VAR, addr)]);
    let ep = listener.accept_timeout(Duration::from_secs(30)).expect("peer connects");
    Parent { _dir: dir, _listener: listener, peer, ep }
}

fn stop(mut p: Parent) {
    stop_echo(&p.ep);
    p.peer.wait_success(Duration::from_secs(30));
}

fn round_trips(p: &Parent) {
    assert_eq!(p.ep.lane(), LaneKind::Ucx);
    for (i, &size) in [0usize, 1, 4 << 10, 8 << 10, (8 << 10) + 1, 1 << 20, 64 << 20].iter().enumerate() {
        let data = pattern(size, i as u64);
        p.ep.send(Message::new(b"h".to_vec(), vec![data.clone().into()])).wait().unwrap();
        verify_echo(b"h", &[data], &p.ep.recv().wait().unwrap());
    }
    // Many messages in flight, several frames each.
    let mut sent = Vec::new();
    let mut sends = Vec::new();
    for m in 0..32u64 {
        let originals: Vec<Vec<u8>> =
            (0..6u64).map(|f| pattern([0, 10, 5000, 20_000, 300_000, 2 << 20][f as usize], m * 10 + f)).collect();
        sends.push(p.ep.send(Message::new(vec![], originals.iter().cloned().map(Into::into).collect())));
        sent.push(originals);
    }
    let recvs: Vec<_> = (0..32).map(|_| p.ep.recv()).collect();
    for s in sends {
        s.wait().unwrap();
    }
    for (originals, r) in sent.iter().zip(recvs) {
        verify_echo(&[], originals, &r.wait().unwrap());
    }
}

peer_test! {
    fn host_messages_over_ucx_with_a_unix_bootstrap(peers) {
        let Some(ctx) = ucx_context_or_skip() else { return };
        let p = start(&peers, "echo", &ctx, false);
        round_trips(&p);
        stop(p);
    }
    "echo" => run_echo_peer(LanePolicy::Ucx),
}

peer_test! {
    fn host_messages_over_ucx_with_a_tcp_bootstrap(peers) {
        let Some(_probe) = ucx_context_or_skip() else { return };
        let ctx = Context::new(Config::default()).unwrap();
        let p = start(&peers, "echo", &ctx, true);
        round_trips(&p);
        stop(p);
    }
    "echo" => {
        // auto: over TCP the native lane is impossible, so UCX is chosen.
        run_echo_peer(LanePolicy::Auto)
    },
}

/// Messages the sleeping receiver below gets, one at a time.
const WAKEUP_MESSAGES: u64 = 12;

peer_test! {
    /// A receiver's progress thread asleep with its UCX worker armed is woken by the
    /// worker's event fd when a payload arrives, not only by the tick's re-poll (which
    /// would deliver too, later, and hide a dead fd). The receiver is the child: the
    /// wake-up counts are per process, and the parent runs other tests' contexts.
    fn the_ucx_event_fd_wakes_a_sleeping_receiver(peers) {
        let Some(ctx) = ucx_context_or_skip() else { return };
        let mut p = start(&peers, "sleeping-receiver", &ctx, false);
        assert_eq!(p.ep.lane(), LaneKind::Ucx);
        for i in 0..WAKEUP_MESSAGES {
            // Long enough for the receiver to stop spinning and sleep on its fds.
            std::thread::sleep(Duration::from_millis(100));
            // 64 KiB: above the inline threshold, so the payload travels over UCX.
            p.ep.send(Message::new(i.to_le_bytes().to_vec(), vec![pattern(64 << 10, i).into()])).wait().unwrap();
        }
        let counts = p.peer.expect_line_with("UCX-WAKEUPS ", Duration::from_secs(30));
        let [by_fd, repolls_with_work, idle_repolls]: [u64; 3] = counts
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect::<Vec<_>>()
            .try_into()
            .unwrap();
        println!("receiver woken by the UCX fd {by_fd}, by re-polls with work {repolls_with_work}, idle re-polls {idle_repolls}");
        assert!(by_fd >= WAKEUP_MESSAGES / 2, "the UCX event fd woke the receiver {by_fd} times for {WAKEUP_MESSAGES} messages");
        assert!(repolls_with_work <= by_fd / 4, "re-polls found UCX work the fd did not signal: {counts}");
        p.peer.wait_success(Duration::from_secs(30));
    }
    "sleeping-receiver" => {
        let ctx = Context::new(ucx_config()).unwrap();
        let ep = connect_from_env(&ctx);
        for i in 0..WAKEUP_MESSAGES {
            let m = ep.recv().wait().unwrap();
            assert_eq!(m.header, i.to_le_bytes());
            assert!(frame_bytes(&m.frames[0]) == pattern(64 << 10, i), "message {i} intact");
        }
        let w = ferrylink::transport::ucx_wakeups();
        println!("\nUCX-WAKEUPS {} {} {}", w.by_event_fd, w.repolls_with_work, w.idle_repolls);
    },
}

peer_test! {
    fn a_killed_peer_fails_pending_ucx_requests(peers) {
        let Some(ctx) = ucx_context_or_skip() else { return };
        let mut p = start(&peers, "sleeper", &ctx, false);
        p.ep.send(Message::new(vec![], vec![pattern(1 << 20, 1).into()])).wait().unwrap();
        let recvs: Vec<_> = (0..3).map(|_| p.ep.recv()).collect();
        let sends: Vec<_> = (0..3).map(|i| p.ep.send(Message::new(vec![], vec![pattern(32 << 20, i).into()]))).collect();
        std::thread::sleep(Duration::from_millis(300));
        let started = Instant::now();
        p.peer.kill();
        // Bounded waits: a death the lane misses fails here in seconds, not after each
        // request's own timeout (60 s by default) in turn.
        let deadline = started + Duration::from_secs(10);
        for (i, mut r) in recvs.into_iter().enumerate() {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(result) = r.wait_timeout(left) else { panic!("receive {i} still pending 10 s after the kill") };
            let err = result.unwrap_err();
            assert!(matches!(err.error, TransportError::PeerClosed { .. } | TransportError::PeerFailed { .. }), "{err}");
        }
        for (i, mut s) in sends.into_iter().enumerate() {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(s.wait_timeout(left).is_some(), "send {i} still pending 10 s after the kill");
        }
    }
    "sleeper" => {
        let ctx = Context::new(ucx_config()).unwrap();
        let ep = connect_from_env(&ctx);
        let _ = ep.recv().wait();
        std::thread::sleep(Duration::from_secs(120));
        return;
    },
}

peer_test! {
    fn conflicting_forced_lanes_fail_on_both_sides(peers) {
        let Some(ctx) = ucx_context_or_skip() else { return };
        let dir = socket_dir();
        let listener = Listener::bind(&ctx, dir.path().join("p/s.sock")).unwrap();
        let mut child = peers.spawn("native", &[(ADDR_VAR, format!("unix:{}", listener.path().display()))]);
        child.wait_success(Duration::from_secs(30));
        assert!(listener.accept_timeout(Duration::from_millis(200)).is_err(), "no endpoint from a conflict");
    }
    peer(role) => {
        let ctx = Context::new(Config::default().with_lane_policy(LanePolicy::Native)).unwrap();
        let addr = std::env::var(ADDR_VAR).unwrap();
        let err = ctx.connect(addr.strip_prefix("unix:").unwrap()).unwrap_err();
        assert!(err.to_string().contains("force different lanes"), "{err}");
        return;
    },
}

peer_test! {
    fn different_ucx_tcp_segments_are_refused_not_a_crash(peers) {
        let Some(ctx) = ucx_context_or_skip() else { return };
        let Some(ours) = ctx.local_hello().ucx.as_ref().and_then(|u| u.tcp_segment.clone()) else {
            println!("skipped: this UCX does not use TCP");
            return;
        };
        let theirs = if ours == "65536" { "128K" } else { "64K" };
        let listener = Listener::bind_tcp(&ctx, "127.0.0.1:0").unwrap();
        let env =
            [(ADDR_VAR, format!("tcp:{}", listener.tcp_addr().unwrap())), ("UCX_TCP_RX_SEG_SIZE", theirs.to_string())];
        let mut child = peers.spawn("other-segments", &env);
        child.wait_success(Duration::from_secs(30));
        assert!(listener.accept_timeout(Duration::from_millis(200)).is_err(), "no endpoint from a refused lane");
    }
    peer(role) => {
        // UCX aborts a receiver whose TCP segments are smaller than the sender's: this
        // side's differ from the listener's, so the handshake must refuse the UCX lane.
        let ctx = Context::new(ucx_config()).unwrap();
        let addr = std::env::var(ADDR_VAR).unwrap();
        let err = ctx.connect_tcp(addr.strip_prefix("tcp:").unwrap()).unwrap_err();
        assert!(err.to_string().contains("TCP receive segments differ"), "{err}");
        return;
    },
}

peer_test! {
    fn without_ucx_forcing_it_fails_clearly_and_auto_picks_native(peers) {
        let ctx = Context::new(Config::default()).unwrap();
        let dir = socket_dir();
        let listener = Listener::bind(&ctx, dir.path().join("p/s.sock")).unwrap();
        let env = [
            (ADDR_VAR, format!("unix:{}", listener.path().display())),
            ("FERRYLINK_UCX_LIB", "/nonexistent/libucp.so.0".into()),
        ];
        let mut child = peers.spawn("no-ucx", &env);
        let ep = listener.accept_timeout(Duration::from_secs(30)).unwrap();
        let got = ep.recv().wait().unwrap();
        assert_eq!(got.header, b"native");
        assert_eq!(frame_bytes(&got.frames[0]), pattern(1 << 20, 5));
        child.wait_success(Duration::from_secs(30));
    }
    peer(role) => {
        // This child cannot load UCX at all: FERRYLINK_UCX_LIB names no library.
        let from_env = || Config::from_env().unwrap();
        match Context::new(from_env().with_lane_policy(LanePolicy::Ucx)) {
            Err(ContextError::UcxUnavailable(reason)) => {
                assert!(reason.contains("FERRYLINK_TRANSPORT=ucx"), "{reason}");
                assert!(reason.contains("not found"), "{reason}");
            }
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("ucx forced without UCX must fail"),
        }
        let ctx = Context::new(from_env()).unwrap();
        assert!(ctx.local_hello().ucx.is_none());
        let addr = std::env::var(ADDR_VAR).unwrap();
        let ep = ctx.connect(addr.strip_prefix("unix:").unwrap()).unwrap();
        assert_eq!(ep.lane(), LaneKind::Native);
        ep.send(Message::new(b"native".to_vec(), vec![pattern(1 << 20, 5).into()])).wait().unwrap();
        // Over TCP (native impossible) there is no lane at all: a clear error.
        return;
    },
}

peer_test! {
    fn tcp_without_ucx_on_one_side_is_a_clear_error(peers) {
        let ctx = Context::new(Config::default()).unwrap();
        let listener = Listener::bind_tcp(&ctx, "127.0.0.1:0").unwrap();
        let env = [
            (ADDR_VAR, format!("tcp:{}", listener.tcp_addr().unwrap())),
            ("FERRYLINK_UCX_LIB", "/nonexistent/libucp.so.0".into()),
        ];
        let mut child = peers.spawn("no-ucx", &env);
        child.wait_success(Duration::from_secs(30));
        assert!(listener.accept_timeout(Duration::from_millis(200)).is_err(), "native never runs over TCP");
    }
    peer(role) => {
        // FERRYLINK_UCX_LIB names no library: this side has no UCX.
        let ctx = Context::new(Config::from_env().unwrap()).unwrap();
        let addr = std::env::var(ADDR_VAR).unwrap();
        match ctx.connect_tcp(addr.strip_prefix("tcp:").unwrap()) {
            Err(ConnectError::Rejected { reason }) | Err(ConnectError::Handshake(reason)) => {
                assert!(reason.contains("UCX"), "{reason}");
            }
            Err(e) => panic!("unexpected error {e}"),
            Ok(ep) => panic!("connected over {}", ep.lane()),
        }
        return;
    },
}

peer_test! {
    /// Device frames over the UCX lane: staged through pinned memory when the loaded UCX has
    /// no CUDA support, passed directly when it has. Needs a GPU (and UCX).
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn device_frames_over_ucx(peers) {
        require_gpu();
        let Some(ctx) = ucx_context_or_skip() else { return };
        let cuda_aware = ctx.local_hello().ucx.as_ref().is_some_and(|u| u.cuda_aware);
        println!(
            "UCX is {}CUDA-aware: device frames travel {}",
            if cuda_aware { "" } else { "not " },
            if cuda_aware { "directly" } else { "staged" }
        );
        let p = start(&peers, "echo", &ctx, false);
        for (i, &size) in [1usize, 4 << 10, 1 << 20, (8 << 20) + 3, 256 << 20].iter().enumerate() {
            let data = pattern(size, 40 + i as u64);
            let started = Instant::now();
            p.ep.send(Message::new(vec![], vec![device_buffer_with(0, &data).into()])).wait().unwrap();
            let back = p.ep.recv().wait().unwrap();
            println!("device frame of {size} bytes over UCX: round trip {:?}", started.elapsed());
            assert!(matches!(back.frames[0], ferrylink::Frame::Device(_)));
            verify_echo(&[], &[data], &back);
        }
        stop(p);
    }
    "echo" => run_echo_peer(LanePolicy::Ucx),
}
