//! Reliability of the UCX lane: peer failure at every protocol step (no leaks
//! and load: `reliability_ucx_load.rs`; the peers and the survivor: `ucx_reliability`).
//!
//! On the UCX lane the `Data` descriptor travels on the control stream (Unix or TCP) with
//! `FrameDescriptor::Remote` frames; the payloads follow as UCX tagged messages (64 MiB
//! frames use the rendezvous protocol: the sender's request completes only once the
//! receiver matched and pulled it); the receiver acknowledges on the control stream once
//! every payload arrived. To stop a peer at an exact step, most peers are "raw"
//! ([`RawUcxPeer`]): a re-executed child that speaks the control protocol by hand
//! and moves payloads with its own UCX worker. Others are real ferrylink endpoints. A
//! child reports its step with a marker file, then waits to be killed (SIGKILL).
//!
//! The steps covered (the survivor is the listening side; both use a 2 s request timeout):
//! - after connect, before any message (a real endpoint);
//! - during the handshake (half a Hello);
//! - a sender dies after its descriptor, before any payload (Unix and TCP bootstraps);
//! - a sender dies between the payloads of a multi-frame message: the first 64 MiB
//!   payload was received, the others never come (Unix and TCP bootstraps);
//! - a sender stops there and stays alive: given up after the timeout;
//! - a real ferrylink sender killed right after `send()` returned: where the kill lands
//!   is a race (before the descriptor, mid-payload or after landing), so the test accepts
//!   a message delivered whole or an error, never a partial one (Unix and TCP);
//! - a receiver dies holding the descriptor, its payload receives never posted (the
//!   survivor's rendezvous sends cannot complete);
//! - a receiver dies after every payload arrived, before it acknowledged: deterministic
//!   with a raw receiver. (A real ferrylink receiver acknowledges inside its engine as the
//!   message lands, before its `recv()` returns, so killing it "before the ack" cannot be
//!   aimed at; the raw receiver covers that step);
//! - a receiver that stays alive and never acknowledges: given up after the timeout;
//! - a receiver that acknowledges and closes at once, its UCX endpoint failing while its
//!   `Ack` waits on the control stream: the send succeeds (the control stream is read
//!   before a lane failure is acted on).
//!
//! Without UCX every test prints `skipped: UCX not available` and passes, unless
//! `FERRYLINK_REQUIRE_UCX=1`. CI: `UCX_TLS=tcp UCX_NET_DEVICES=lo`.

mod common;
mod ucx_reliability;

use common::*;
use ferrylink::Message;
use std::time::{Duration, Instant};
use ucx_reliability::*;

/// The shape of the "a sending peer dies" cases: the peer reaches `role`'s step, the
/// survivor has receives pending (posted before the step, so they take the message as it
/// lands, and after it), the peer is killed; every receive ends with an error quickly and
/// nothing partial is delivered; the survivor serves a new peer.
fn sending_peer_dies(peers: &Peers, role: &str, over_tcp: bool) {
    let _fds = shared_fds();
    let Some(s) = Survivor::new(over_tcp) else { return };
    let mut child = s.spawn(peers, role);
    let ep = s.accept();
    let early = ep.recv();
    child.wait_reached(STEP, Duration::from_secs(30));
    let late: Vec<_> = (0..2).map(|_| ep.recv()).collect();
    std::thread::sleep(Duration::from_millis(50));
    let killed = Instant::now();
    child.kill();
    for req in std::iter::once(early).chain(late) {
        assert_peer_gone(&recv_fails_within(req, DEATH_NOTICE));
    }
    assert!(killed.elapsed() < DEATH_NOTICE, "the survivor noticed the death after {:?}", killed.elapsed());
    // A request submitted after the death fails at once, and hands its message back.
    let err = ep.send(Message::new(vec![], vec![pattern(1000, 1).into()])).wait().unwrap_err();
    assert_peer_gone(&err.error);
    assert!(err.message.is_some(), "the failed send hands the message back");
    println!("{role}: every receive failed {:?} after the kill ({})", killed.elapsed(), err.error);
    drop(ep);
    s.assert_forgot_the_dead();
    s.assert_serves_a_new_peer();
}

/// The survivor sends a multi-frame message (plus queued ones); the peer (`role`) reads
/// its descriptor and stops at some step: the survivor's requests end with an error (after
/// the request timeout when the peer stays alive but silent), it serves a new peer.
fn receiving_peer_stops(peers: &Peers, role: &str) {
    let _fds = shared_fds();
    let Some(s) = Survivor::new(false) else { return };
    let mut child = s.spawn(peers, role);
    let ep = s.accept();
    let started = Instant::now();
    let mut send = ep.send(big_message());
    // Queued behind it: small messages (inline and eager frames, whose UCX sends complete
    // locally), which must come back on failure.
    let mut more: Vec<_> = (0..2)
        .map(|i| ep.send(Message::new(vec![], vec![pattern(100, i).into(), pattern(20_000, i).into()])))
        .collect();
    let recv = ep.recv();
    child.wait_reached(STEP, Duration::from_secs(30));
    let killed = Instant::now();
    let bound = if role == "receiver-never-acks" {
        // Alive but silent: the survivor gives up after its request timeout.
        TIMEOUT + DEATH_NOTICE
    } else {
        child.kill();
        DEATH_NOTICE
    };
    let err = match send.wait_timeout(bound) {
        Some(Err(e)) => e,
        Some(Ok(_)) => panic!("a send completed without an acknowledgement"),
        None => panic!("a send to a stopped peer still pending after {bound:?}"),
    };
    assert_peer_gone(&err.error);
    if role == "receiver-never-acks" {
        assert!(err.error.to_string().contains("not acknowledged"), "{}", err.error);
        assert!(started.elapsed() >= TIMEOUT, "gave up after {:?}", started.elapsed());
    } else {
        assert!(killed.elapsed() < DEATH_NOTICE, "noticed after {:?}", killed.elapsed());
    }
    // Every message comes back: one whose UCX sends were still outstanding (a rendezvous
    // the peer never matched, small sends queued behind it) is cancelled by force-closing
    // the endpoint first.
    let handed_back = err.message.is_some();
    assert!(handed_back, "{role}: the failed send hands its message back");
    for req in more.iter_mut() {
        let e = req.wait_timeout(DEATH_NOTICE).expect("a queued send ends").unwrap_err();
        assert_peer_gone(&e.error);
        assert!(e.message.is_some(), "queued sends hand their message back");
    }
    assert_peer_gone(&recv_fails_within(recv, DEATH_NOTICE));
    println!(
        "{role}: the send failed after {:?} ({}); message handed back: {handed_back}",
        started.elapsed(),
        err.error
    );
    drop(ep);
    if role == "receiver-never-acks" {
        child.wait_success(Duration::from_secs(10));
    }
    s.assert_forgot_the_dead();
    s.assert_serves_a_new_peer();
}

// ---------------------------------------------------------------------------------------
// Peer failure at every step.

peer_test! {
    fn ucx_killed_after_connect_before_any_message(peers) {
        sending_peer_dies(&peers, "connected-idle", false)
    }
    peer(role) => run_peer(role),
}

peer_test! {
    fn ucx_killed_during_the_handshake(peers) {
        let _fds = shared_fds();
        let Some(s) = Survivor::new(false) else { return };
        let mut child = s.spawn(&peers, "half-hello");
        child.wait_reached(STEP, Duration::from_secs(30));
        assert!(s.ctx.stats().unwrap().endpoints >= 1, "the half-shaken connection is tracked");
        let killed = Instant::now();
        child.kill();
        assert!(eventually(DEATH_NOTICE, || s.ctx.stats().unwrap().endpoints == 0), "{:?}", s.ctx.stats());
        assert!(killed.elapsed() < TIMEOUT, "dropped after {:?}", killed.elapsed());
        assert!(s.listener.accept_timeout(Duration::from_millis(100)).is_err(), "no endpoint from half a Hello");
        s.assert_forgot_the_dead();
        s.assert_serves_a_new_peer();
    }
    peer(role) => run_peer(role),
}

peer_test! {
    fn ucx_sender_killed_after_the_descriptor_before_any_payload(peers) {
        sending_peer_dies(&peers, "descriptor-then-nothing", false)
    }
    peer(role) => run_peer(role),
}

peer_test! {
    fn ucx_sender_killed_between_the_payloads_of_a_multi_frame_message(peers) {
        sending_peer_dies(&peers, "first-payload-then-death", false)
    }
    peer(role) => run_peer(role),
}

peer_test! {
    fn ucx_sender_killed_between_the_payloads_over_a_tcp_bootstrap(peers) {
        sending_peer_dies(&peers, "first-payload-then-death", true)
    }
    peer(role) => run_peer(role),
}

peer_test! {
    fn ucx_sender_killed_after_the_descriptor_over_a_tcp_bootstrap(peers) {
        sending_peer_dies(&peers, "descriptor-then-nothing", true)
    }
    peer(role) => run_peer(role),
}

peer_test! {
    /// The sender stays alive but stops between the payloads (no hang-up, as from a host
    /// that vanished): the survivor gives the landing up after its request timeout, and
    /// its receives fail then, not only when their waits give up.
    fn ucx_sender_stalled_between_the_payloads_is_given_up_after_the_timeout(peers) {
        let _fds = shared_fds();
        let Some(s) = Survivor::new(false) else { return };
        let mut child = s.spawn(&peers, "first-payload-then-stall");
        let ep = s.accept();
        let started = Instant::now();
        let landing = ep.recv();
        child.wait_reached(STEP, Duration::from_secs(30));
        let next = ep.recv();
        // `wait_timeout` never cancels: only the survivor's own deadline can end these.
        let error = recv_fails_within(landing, TIMEOUT + DEATH_NOTICE);
        assert_peer_gone(&error);
        assert!(error.to_string().contains("not landed within"), "{error}");
        assert!(started.elapsed() >= TIMEOUT, "gave up after {:?}", started.elapsed());
        assert_peer_gone(&recv_fails_within(next, DEATH_NOTICE));
        println!("stalled sender: the receives failed after {:?} ({error})", started.elapsed());
        drop(ep);
        child.wait_success(Duration::from_secs(10));
        s.assert_forgot_the_dead();
        s.assert_serves_a_new_peer();
    }
    peer(role) => run_peer(role),
}

/// A real ferrylink sender of three 64 MiB frames, killed as soon as its `send()` returned
/// (before `wait()`). Where the kill lands is a race (before the descriptor, mid-payload,
/// or after the message landed): every outcome must be whole-or-error, never partial.
fn real_sender_killed_mid_payload(peers: &Peers, over_tcp: bool) {
    let _fds = shared_fds();
    let Some(s) = Survivor::new(over_tcp) else { return };
    let mut child = s.spawn(peers, "real-sender");
    let ep = s.accept();
    let mut recv = ep.recv();
    child.wait_reached(STEP, Duration::from_secs(30));
    let killed = Instant::now();
    child.kill();
    let outcome = match recv.wait_timeout(DEATH_NOTICE) {
        Some(Ok(msg)) => {
            verify_big(&msg);
            "landed whole before the kill"
        }
        Some(Err(e)) => {
            assert_peer_gone(&e.error);
            "failed"
        }
        None => panic!("a receive from a dead sender still pending after {DEATH_NOTICE:?}"),
    };
    assert_peer_gone(&recv_fails_within(ep.recv(), DEATH_NOTICE));
    assert!(killed.elapsed() < DEATH_NOTICE, "noticed after {:?}", killed.elapsed());
    println!("real sender killed mid-payload (tcp bootstrap: {over_tcp}): the receive {outcome}");
    drop(ep);
    s.assert_forgot_the_dead();
    s.assert_serves_a_new_peer();
}

peer_test! {
    fn ucx_real_sender_killed_mid_payload(peers) {
        real_sender_killed_mid_payload(&peers, false)
    }
    peer(role) => run_peer(role),
}

peer_test! {
    fn ucx_real_sender_killed_mid_payload_over_a_tcp_bootstrap(peers) {
        real_sender_killed_mid_payload(&peers, true)
    }
    peer(role) => run_peer(role),
}

peer_test! {
    fn ucx_receiver_killed_holding_the_descriptor_before_the_payloads(peers) {
        receiving_peer_stops(&peers, "receiver-holds-descriptor")
    }
    peer(role) => run_peer(role),
}

peer_test! {
    fn ucx_receiver_killed_after_the_payloads_before_acking(peers) {
        receiving_peer_stops(&peers, "receiver-dies-before-ack")
    }
    peer(role) => run_peer(role),
}

peer_test! {
    fn ucx_receiver_that_never_acks_is_given_up_after_the_request_timeout(peers) {
        receiving_peer_stops(&peers, "receiver-never-acks")
    }
    peer(role) => run_peer(role),
}

peer_test! {
    /// A message that started landing before anyone received it counts as unclaimed bytes;
    /// when its sender dies mid-payload it can never be received, so while the user still
    /// holds the dead endpoint the count must drop back to 0.
    fn ucx_unclaimed_bytes_of_a_message_cut_short_are_released(peers) {
        let _fds = shared_fds();
        let Some(s) = Survivor::new(false) else { return };
        let mut child = s.spawn(&peers, "first-payload-then-death");
        let ep = s.accept();
        // No receive posted: the message lands ahead of the user, as unclaimed bytes.
        child.wait_reached(STEP, Duration::from_secs(30));
        assert!(s.ctx.stats().unwrap().unclaimed_bytes >= (BIG_FRAMES * BIG) as u64, "{:?}", s.ctx.stats());
        child.kill();
        assert_peer_gone(&recv_fails_within(ep.recv(), DEATH_NOTICE));
        let released = eventually(Duration::from_secs(2), || s.ctx.stats().unwrap().unclaimed_bytes == 0);
        assert!(released, "nothing can be received from the dead peer, yet {:?}", s.ctx.stats());
        drop(ep);
        s.assert_forgot_the_dead();
    }
    peer(role) => run_peer(role),
}

/// Peers that each connect [`LEAVING_ROUNDS`] times and leave right after a message:
/// several at once, so the survivor's progress thread is busy when endpoints fail.
const LEAVING_PEERS: usize = 4;

peer_test! {
    fn ucx_a_send_the_peer_acknowledged_just_before_leaving_succeeds(peers) {
        let _fds = shared_fds();
        let Some(s) = Survivor::new(false) else { return };
        let mut children: Vec<_> = (0..LEAVING_PEERS).map(|_| s.spawn(&peers, "takes-one-and-leaves")).collect();
        std::thread::scope(|scope| {
            for _ in 0..LEAVING_PEERS {
                scope.spawn(|| {
                    for round in 0..LEAVING_ROUNDS {
                        let ep = s.accept();
                        let sent = ep.send(Message::new(b"bye".to_vec(), vec![])).wait();
                        assert!(sent.is_ok(), "round {round}: the peer acknowledged, then left: {:?}", sent.err());
                    }
                });
            }
        });
        for child in &mut children {
            child.wait_success(Duration::from_secs(60));
        }
        s.assert_forgot_the_dead();
    }
    peer(role) => run_peer(role),
}
