//! Faults between two hosts on one machine (the kit's `two_host`; the lanes and traffic:
//! `two_host.rs`). The first host (this test's thread) survives; on the second:
//! - a peer SIGKILLed at each protocol step (the UCX reliability peers, `ucx_reliability`:
//!   after connect, after a descriptor, between payloads, a receiver holding the
//!   descriptor, a receiver before its ack);
//! - the link set down mid-transfer, then up again;
//! - the second host torn down (its link and network gone, its processes killed).
//!
//! Every request ends with an error within the request timeout (2 s) plus a margin,
//! nothing hangs, the survivor forgets the peer, no descriptor or mapping leaks, and a new
//! connection from the second host works where its network still exists.

mod common;
mod two_host_kit;
mod ucx_reliability;

use common::*;
use ferrylink::transport::{Endpoint, LaneKind, TransportError};
use ferrylink::Message;
use std::time::{Duration, Instant};
use two_host_kit::{serve_echo_on_second, FirstHost};
use ucx_reliability::{assert_peer_gone, big_message, config, recv_fails_within, run_peer, STEP, TIMEOUT};

/// A fault must reach every pending request within this.
const NOTICE: Duration = Duration::from_secs(5);

/// The tests of this file run one at a time: open fds and mappings are process-wide, and
/// two cores moving several tests' 64 MiB payloads at once stretch the steps past the
/// 2 s request timeout.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// The survivor's state of the dead peer is gone, and a new peer from the second host is
/// served: verified echoes of inline, eager and rendezvous frames.
fn forgets_and_serves_a_new_peer(first: &FirstHost, peers: &Peers) {
    let settled = eventually(NOTICE, || {
        let s = first.ctx.stats().unwrap();
        s.endpoints == 0 && s.sends_in_flight == 0 && s.recvs_posted == 0 && s.unclaimed_bytes == 0
    });
    assert!(settled, "the survivor still holds state of the dead peer: {:?}", first.ctx.stats());
    let mut peer = first.spawn_on_second(peers, "echo", &[]);
    let ep = first.accept();
    assert_eq!(ep.lane(), LaneKind::Ucx);
    let frames: Vec<Vec<u8>> = [100, 20_000, 4 << 20].iter().map(|&n| pattern(n, n as u64)).collect();
    ep.send(Message::new(b"new".to_vec(), frames.iter().cloned().map(Into::into).collect())).wait().unwrap();
    verify_echo(b"new", &frames, &ep.recv().wait().unwrap());
    stop_echo(&ep);
    peer.wait_success(Duration::from_secs(30));
}

/// A sending peer on the second host reaches `role`'s step and is killed: the receives
/// pending before and after the step fail, a later send fails at once.
fn sending_peer_dies(peers: &Peers, role: &str) {
    let _one = one_at_a_time();
    let Some(first) = FirstHost::start(config()) else { return };
    let mut child = first.spawn_on_second(peers, role, &[]);
    let ep = first.accept();
    let early = ep.recv();
    child.wait_reached(STEP, Duration::from_secs(30));
    let late: Vec<_> = (0..2).map(|_| ep.recv()).collect();
    let killed = Instant::now();
    child.kill();
    for req in std::iter::once(early).chain(late) {
        assert_peer_gone(&recv_fails_within(req, NOTICE));
    }
    let err = ep.send(Message::new(vec![], vec![pattern(1000, 1).into()])).wait().unwrap_err();
    assert_peer_gone(&err.error);
    println!("{role}: every request failed {:?} after the kill", killed.elapsed());
    drop(ep);
    forgets_and_serves_a_new_peer(&first, peers);
}

/// The survivor sends a multi-frame message to a receiving peer on the second host,
/// which stops at `role`'s step and is killed: the send, queued sends and a receive fail.
fn receiving_peer_dies(peers: &Peers, role: &str) {
    let _one = one_at_a_time();
    let Some(first) = FirstHost::start(config()) else { return };
    let mut child = first.spawn_on_second(peers, role, &[]);
    let ep = first.accept();
    let send = ep.send(big_message());
    let queued = ep.send(Message::new(vec![], vec![pattern(20_000, 2).into()]));
    let recv = ep.recv();
    child.wait_reached(STEP, Duration::from_secs(30));
    let killed = Instant::now();
    child.kill();
    for mut req in [send, queued] {
        let e = req.wait_timeout(NOTICE).expect("a send to a killed peer ends").unwrap_err();
        assert_peer_gone(&e.error);
        assert!(e.message.is_some(), "a failed send hands its message back");
    }
    assert_peer_gone(&recv_fails_within(recv, NOTICE));
    println!("{role}: every request failed {:?} after the kill", killed.elapsed());
    drop(ep);
    forgets_and_serves_a_new_peer(&first, peers);
}

fn echo_peer() {
    serve_echo_on_second(config())
}

peer_test! {
    fn two_host_peer_killed_after_connect(peers) { sending_peer_dies(&peers, "connected-idle") }
    peer(role) => if role == "echo" { echo_peer() } else { run_peer(role) },
}

peer_test! {
    fn two_host_sender_killed_after_the_descriptor(peers) { sending_peer_dies(&peers, "descriptor-then-nothing") }
    peer(role) => if role == "echo" { echo_peer() } else { run_peer(role) },
}

peer_test! {
    fn two_host_sender_killed_between_payloads(peers) { sending_peer_dies(&peers, "first-payload-then-death") }
    peer(role) => if role == "echo" { echo_peer() } else { run_peer(role) },
}

peer_test! {
    fn two_host_receiver_killed_holding_the_descriptor(peers) {
        receiving_peer_dies(&peers, "receiver-holds-descriptor")
    }
    peer(role) => if role == "echo" { echo_peer() } else { run_peer(role) },
}

peer_test! {
    fn two_host_receiver_killed_before_its_ack(peers) { receiving_peer_dies(&peers, "receiver-dies-before-ack") }
    peer(role) => if role == "echo" { echo_peer() } else { run_peer(role) },
}

/// Big sends (rendezvous payloads) and receives pending on `ep` while the echo peer is
/// paused by them: what a fault must end.
fn transfers_in_flight(
    ep: &Endpoint,
) -> (Vec<ferrylink::transport::SendRequest>, Vec<ferrylink::transport::RecvRequest>) {
    let sends = (0..3).map(|i| ep.send(Message::new(vec![], vec![pattern(32 << 20, i).into()]))).collect();
    let recvs = (0..3).map(|_| ep.recv()).collect();
    (sends, recvs)
}

/// Every request of `transfers` ends: sends within `bound` (the transport gives up on an
/// unacknowledged send after its request timeout), receives within the request timeout
/// of their wait; the number that failed (an echo that came back before the fault may
/// succeed).
fn all_end(
    transfers: (Vec<ferrylink::transport::SendRequest>, Vec<ferrylink::transport::RecvRequest>),
    bound: Duration,
) -> usize {
    let started = Instant::now();
    let mut failed = 0;
    for mut s in transfers.0 {
        match s.wait_timeout(bound.saturating_sub(started.elapsed())) {
            Some(Err(e)) => {
                assert!(e.message.is_some(), "a failed send hands its message back ({})", e.error);
                failed += 1;
            }
            Some(Ok(_)) => {}
            None => panic!("a send still pending {bound:?} after the fault"),
        }
    }
    // A receive waits at most the request timeout (then it is cancelled with an error).
    for r in transfers.1 {
        let waited = Instant::now();
        if let Err(e) = r.wait() {
            let error = &e.error;
            let ended = matches!(error, TransportError::PeerClosed { .. } | TransportError::PeerFailed { .. });
            assert!(ended || matches!(error, TransportError::TimedOut(_)), "{error}");
            failed += 1;
        }
        assert!(waited.elapsed() < TIMEOUT + NOTICE, "a receive took {:?} to end", waited.elapsed());
    }
    failed
}

/// The baseline of the leak checks: after a first peer warmed UCX's pools up and its
/// endpoint (with its landing memory) is gone.
fn warmed_up_baseline(first: &FirstHost, peers: &Peers) -> LeakBaseline {
    forgets_and_serves_a_new_peer(first, peers);
    let settled = eventually(NOTICE, || {
        let s = first.ctx.stats().unwrap();
        s.endpoints == 0 && s.landing_mapped_bytes == 0
    });
    assert!(settled, "the warm-up peer's endpoint stays: {:?}", first.ctx.stats());
    LeakBaseline::take(&[&first.ctx], open_fds())
}

peer_test! {
    /// The link goes down mid-transfer: every request ends with an error within the
    /// request timeout (nothing answers), nothing leaks; with the link back up, a new
    /// peer from the second host is served.
    fn two_host_link_down_mid_transfer_then_back(peers) {
        let _one = one_at_a_time();
        let Some(first) = FirstHost::start(config()) else { return };
        let baseline = warmed_up_baseline(&first, &peers);
        let mut peer = first.spawn_on_second(&peers, "echo", &[]);
        let ep = first.accept();
        let transfers = transfers_in_flight(&ep);
        std::thread::sleep(Duration::from_millis(50));
        first.hosts.set_link(false).expect("link down");
        let down = Instant::now();
        let failed = all_end(transfers, TIMEOUT + NOTICE);
        println!("link down: {failed} of 6 requests failed within {:?}", down.elapsed());
        assert!(failed >= 1, "the cut link failed no request");
        drop(ep);
        peer.kill();
        first.hosts.set_link(true).expect("link up");
        forgets_and_serves_a_new_peer(&first, &peers);
        baseline.allowing_fewer_fds().assert_back("after the link came back", &[&first.ctx], NOTICE);
    }
    peer(role) => echo_peer(),
}

peer_test! {
    /// The second host is torn down mid-transfer (its link and network namespace removed,
    /// then its process killed, so no close reaches the first host): every request ends
    /// with an error within the request timeout, the survivor forgets the endpoint, and
    /// nothing leaks but the dead connection's socket, which the context keeps (awaiting
    /// a hang-up the vanished host never sends) until it ends.
    fn two_host_second_host_torn_down_mid_transfer(peers) {
        let _one = one_at_a_time();
        let fds_at_start = open_fds();
        let Some(mut first) = FirstHost::start(config()) else { return };
        let warm = warmed_up_baseline(&first, &peers);
        // The dead connection's socket stays while the context lives.
        let baseline = LeakBaseline::take(&[&first.ctx], warm.fds + 1).allowing_fewer_fds();
        let mut peer = first.spawn_on_second(&peers, "echo", &[]);
        let ep = first.accept();
        let transfers = transfers_in_flight(&ep);
        std::thread::sleep(Duration::from_millis(50));
        first.hosts.tear_down_second_host().expect("tearing the second host down");
        peer.kill();
        let gone = Instant::now();
        let failed = all_end(transfers, TIMEOUT + NOTICE);
        println!("host torn down: {failed} of 6 requests failed within {:?}", gone.elapsed());
        assert!(failed >= 1, "the torn-down host failed no request");
        drop(ep);
        let settled = eventually(NOTICE, || first.ctx.stats().unwrap().endpoints == 0);
        assert!(settled, "the survivor still holds the dead host's endpoint: {:?}", first.ctx.stats());
        baseline.assert_back("after the host was torn down", &[&first.ctx], NOTICE);
        // The context's end releases that socket too: back to the start (the first host's
        // saved network, one descriptor, stays until `hosts` drops).
        let FirstHost { ctx, listener, hosts, .. } = first;
        drop(listener);
        drop(ctx);
        let back = eventually(NOTICE, || open_fds() <= fds_at_start + 1);
        assert!(back, "{} fds open after the context ended, {fds_at_start} before it", open_fds());
        drop(hosts);
    }
    peer(role) => echo_peer(),
}
