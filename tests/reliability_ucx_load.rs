//! Reliability of the UCX lane, continued: no leaks after 1000
//! connect/send/disconnect cycles and after crashes (stats, fds and mappings:
//! `common::LeakBaseline`), and load (32 endpoints, 16 sends in flight on each at once,
//! asserted: the peer is stopped while they are posted). The peers and the survivor are
//! `ucx_reliability`'s (shared with `reliability_ucx.rs`).
//!
//! Without UCX every test prints `skipped: UCX not available` and passes, unless
//! `FERRYLINK_REQUIRE_UCX=1`. CI: `UCX_TLS=tcp UCX_NET_DEVICES=lo`.

mod common;
mod ucx_reliability;

use common::*;
use ferrylink::transport::{Context, Endpoint, LaneKind, Listener};
use ferrylink::{Frame, Message};
use std::time::{Duration, Instant};
use ucx_reliability::*;

// ---------------------------------------------------------------------------------------
// No leaks.

/// The open fds once their count held still for 300 ms (bounded: 5 s), so that sockets
/// earlier tests' contexts were still closing are not counted in a baseline.
fn settled_fds() -> usize {
    let (mut last, mut since) = (open_fds(), Instant::now());
    eventually(Duration::from_secs(5), || {
        let now = open_fds();
        if now != last {
            (last, since) = (now, Instant::now());
        }
        since.elapsed() >= Duration::from_millis(300)
    });
    last
}

/// One connect / send / echo / disconnect cycle between two contexts over UCX.
fn ucx_cycle(client: &Context, listener: &Listener, cycle: u64, rendezvous: &[u8], sum: u64) -> u64 {
    let ep = client.connect(listener.path()).expect("connect");
    let server_ep = listener.accept_timeout(Duration::from_secs(10)).expect("accept");
    assert_eq!(ep.lane(), LaneKind::Ucx);
    let mut frames: Vec<Frame> = vec![pattern(64, cycle).into(), pattern(20_000, cycle).into()];
    if cycle.is_multiple_of(4) {
        frames.push(rendezvous.to_vec().into());
    }
    let n = frames.len();
    ep.send(Message::new(cycle.to_le_bytes().to_vec(), frames)).wait().expect("send");
    let got = server_ep.recv().wait().expect("recv");
    assert_eq!(got.header, cycle.to_le_bytes());
    if n == 3 {
        assert_eq!(checksum(got.frames[2].as_host().unwrap().as_slice()), sum, "cycle {cycle}");
    }
    server_ep.send(got).wait().expect("echo");
    let back = ep.recv().wait().expect("echo recv");
    assert_eq!(back.frames.len(), n);
    if cycle.is_multiple_of(2) {
        drop(ep);
        drop(server_ep);
    } else {
        drop(server_ep);
        drop(ep);
    }
    2 * back.payload_len() as u64
}

#[test]
fn ucx_a_thousand_connect_send_disconnect_cycles_leave_nothing_behind() {
    let _fds = exclusive_fds();
    let Some(server) = ucx_context_or_skip_with(config()) else { return };
    let client = Context::new(config()).unwrap();
    let dir = socket_dir();
    let listener = Listener::bind(&server, dir.path().join("p/s.sock")).unwrap();
    let rendezvous = pattern(1 << 20, 99);
    let sum = checksum(&rendezvous);
    // UCX opens its transports' sockets lazily, on the first connection of a worker: the
    // baseline is taken after one warm-up cycle.
    ucx_cycle(&client, &listener, 0, &rendezvous, sum);
    let settled = eventually(Duration::from_secs(5), || {
        server.stats().unwrap().endpoints == 0 && client.stats().unwrap().endpoints == 0
    });
    assert!(settled, "{:?} {:?}", server.stats(), client.stats());
    let baseline = LeakBaseline::take(&[&server, &client], settled_fds()).allowing_fewer_fds();
    let fds = baseline.fds;
    let started = Instant::now();
    let (mut bytes, mut peak_fds) = (0u64, fds);
    const CYCLES: u64 = 1000;
    for cycle in 1..=CYCLES {
        bytes += ucx_cycle(&client, &listener, cycle, &rendezvous, sum);
        peak_fds = peak_fds.max(open_fds());
    }
    let elapsed = started.elapsed();
    let settled = baseline.assert_back("after 1000 UCX cycles", &[&server, &client], Duration::from_secs(10));
    println!(
        "{CYCLES} UCX connect/send/echo/disconnect cycles in {elapsed:.2?}: {} messages, {bytes} payload bytes; \
         fds {fds} before, peak {peak_fds}, {} after; stats back to {:?}; {:?} before, {settled:?} after",
        2 * CYCLES,
        open_fds(),
        baseline.stats[0],
        baseline.footprint
    );
}

peer_test! {
    fn ucx_killed_peers_leave_nothing_behind(peers) {
        let _fds = exclusive_fds();
        let Some(s) = Survivor::new(false) else { return };
        // Warm-up: one served peer opens UCX's lazily created sockets.
        s.assert_serves_a_new_peer();
        assert!(eventually(Duration::from_secs(5), || s.ctx.stats().unwrap().endpoints == 0));
        let baseline = LeakBaseline::take(&[&s.ctx], settled_fds()).allowing_fewer_fds();
        const CRASHES: usize = 3;
        for round in 0..CRASHES {
            let mut child = s.spawn(&peers, "crasher");
            let ep = s.accept();
            let mut kept = Vec::new();
            for _ in 0..3 {
                kept.push(ep.recv().wait().expect("the peer's message"));
            }
            ep.send(Message::new(vec![], vec![pattern(500_000, 9).into()])).wait().expect("send");
            child.wait_reached(STEP, Duration::from_secs(30));
            // A rendezvous send the dead peer never receives, and a receive, pending.
            let pending_send = ep.send(Message::new(vec![], vec![vec![1u8; BIG].into()]));
            let pending_recv = ep.recv();
            child.kill();
            if round % 2 == 0 {
                drop(ep);
                let _ = pending_send.wait();
                let _ = pending_recv.wait();
            } else {
                // The send may have been taken (and acknowledged) before the death; the
                // receive cannot have been answered.
                let _ = pending_send.wait();
                assert!(pending_recv.wait().is_err());
                drop(ep);
            }
            for (i, m) in kept.iter().enumerate() {
                assert_eq!(m.frames[1].as_host().unwrap().as_slice(), &pattern(2 << 20, i as u64)[..]);
            }
            drop(kept);
            let settled = baseline.assert_back(&format!("after UCX crash {}", round + 1), &[&s.ctx], Duration::from_secs(10));
            println!("after UCX crash {}: {settled:?}", round + 1);
        }
        // Killed holding the descriptors of three 64 MiB rendezvous sends it never matched:
        // the frames stay with the UCX worker until UCX lets go of them, which must happen.
        let rss = resident_bytes();
        for round in 0..2 {
            let mut child = s.spawn(&peers, "receiver-holds-descriptor");
            let ep = s.accept();
            let send = ep.send(big_message());
            child.wait_reached(STEP, Duration::from_secs(30));
            child.kill();
            assert!(send.wait().is_err(), "round {round}: a send the dead peer never matched");
            drop(ep);
            let settled = baseline.assert_back(&format!("after UCX crash {}", CRASHES + round + 1), &[&s.ctx], Duration::from_secs(10));
            println!("after UCX crash {}: {settled:?}", CRASHES + round + 1);
        }
        let released = eventually(Duration::from_secs(10), || resident_bytes() < rss + BIG as u64);
        assert!(
            released,
            "192 MiB of frames a dead peer never matched stay resident: {} MiB before, {} MiB now",
            rss >> 20,
            resident_bytes() >> 20
        );
        // And it still serves.
        s.assert_serves_a_new_peer();
        println!(
            "{} killed UCX peers: stats, fds ({}) and mappings back to the baseline after each ({:?}); resident {} \
             MiB before the unmatched rendezvous sends, {} MiB after",
            CRASHES + 2,
            baseline.fds,
            baseline.footprint,
            rss >> 20,
            resident_bytes() >> 20
        );
    }
    peer(role) => run_peer(role),
}

// ---------------------------------------------------------------------------------------
// Load.

/// Message `m` of endpoint `e`: 1 to 3 frames stamped with their identity.
fn load_message(e: usize, m: usize, bases: &[Vec<u8>]) -> Message {
    let mut frames: Vec<Frame> = Vec::new();
    for f in 0..1 + (e + m) % 3 {
        let mut bytes = bases[(e * 7 + m * 3 + f) % LOAD_SIZES.len()].clone();
        let stamp = [(e as u32).to_le_bytes(), (m as u32).to_le_bytes(), (f as u32).to_le_bytes()].concat();
        let n = stamp.len().min(bytes.len());
        bytes[..n].copy_from_slice(&stamp[..n]);
        frames.push(bytes.into());
    }
    let header = [(e as u64).to_le_bytes(), (m as u64).to_le_bytes()].concat();
    Message::new(header, frames)
}

peer_test! {
    fn ucx_thirty_two_endpoints_with_many_messages_in_flight_lose_and_corrupt_nothing(peers) {
        let _fds = shared_fds();
        let Some(ctx) =
            ucx_context_or_skip_with(config().with_request_timeout(LOAD_BOUND).with_connect_timeout(LOAD_BOUND))
        else {
            return;
        };
        let dir = socket_dir();
        let listener = Listener::bind(&ctx, dir.path().join("p/s.sock")).unwrap();
        let mut child = peers.spawn("echo-32", &[(ADDR_VAR, format!("unix:{}", listener.path().display()))]);
        let eps: Vec<Endpoint> =
            (0..LOAD_ENDPOINTS).map(|_| listener.accept_timeout(Duration::from_secs(30)).expect("connects")).collect();
        assert!(eps.iter().all(|ep| ep.lane() == LaneKind::Ucx));
        let bases: Vec<Vec<u8>> = LOAD_SIZES.iter().enumerate().map(|(i, &s)| pattern(s, 200 + i as u64)).collect();

        // Every message in flight at once: the peer, stopped, takes none until the whole
        // window is posted. Each echo checked (header, the peer's checksums, the frames
        // back), per endpoint in order.
        let load = Load { messages: LOAD_IN_FLIGHT, in_flight: LOAD_IN_FLIGHT, bound: LOAD_BOUND };
        let held = ResumedAtFirstWait::new(PausedPeers::stop(std::slice::from_ref(&child)));
        let depth = || ctx.stats().unwrap().sends_in_flight;
        let r = echo::check_load(&held, &eps, load, |e, m| load_message(e, m, &bases), depth);
        drop(held);
        for ep in &eps {
            stop_echo(ep);
        }
        child.wait_success(Duration::from_secs(30));
        println!(
            "UCX load: {LOAD_ENDPOINTS} endpoints x {LOAD_IN_FLIGHT} messages in flight = {} messages sent and echoed \
             ({:.1} MB payload each way) in {:.2?}: {:.0} messages/s, {:.3} GB/s both ways together; \
             {} messages outstanding at once, peak {} sends in flight",
            r.total,
            r.payload_bytes as f64 / 1e6,
            r.elapsed,
            r.messages_per_second(),
            r.gigabytes_per_second(),
            r.posted_depth,
            r.peak_depth,
        );
        println!(
            "UCX load: {} of {} echoes received: {} lost, {} corrupted, {} failed sends",
            r.received, r.total, r.lost, r.corrupted, r.send_failures
        );
        assert_eq!(r.total, LOAD_ENDPOINTS * LOAD_IN_FLIGHT);
        r.assert_intact();
        // No endpoint has more than its 16 posted: the sum is 16 on every one, at once.
        let claimed = LOAD_ENDPOINTS * LOAD_IN_FLIGHT;
        assert!(r.peak_depth >= claimed, "peak {} sends in flight, {claimed} claimed", r.peak_depth);
        drop(eps);
        assert!(eventually(Duration::from_secs(5), || ctx.stats().unwrap().endpoints == 0), "{:?}", ctx.stats());
    }
    peer(role) => run_peer(role),
}
