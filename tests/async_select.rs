//! `recv()` raced against a timer in `tokio::select!`: a receive dropped by the timer
//! must neither stay posted (and swallow the next message) nor lose a message that
//! completed into it. A peer process sends 10,000 messages in bursts, so the timer often
//! wins while no message is there and sometimes just as one completes; every message
//! must arrive, once, in order, intact. On the native lane and on the UCX lane.
//! And, deterministically, a receive dropped while no message is on its way is withdrawn
//! (no longer posted) on the native lane.

mod common;

use common::*;
use ferrylink::transport::{Config, Context, Endpoint, LaneKind, LanePolicy, Listener};
use ferrylink::{Frame, Message};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

const PATH_VAR: &str = "FERRYLINK_TEST_SOCKET";
const MESSAGES: u64 = 10_000;
/// Messages the peer sends between two pauses.
const BURST: u64 = 25;
/// The peer's pause between bursts: long enough for the parent's timer to win.
const PAUSE: Duration = Duration::from_millis(2);
/// The parent stops once nothing arrived for this long (with lost messages, the rest
/// never comes).
const IDLE_BOUND: Duration = Duration::from_secs(5);

fn config(policy: LanePolicy) -> Config {
    Config::default().with_lane_policy(policy)
}

/// Message `i`: its index in the header, one frame, every eighth one above the inline
/// threshold (it travels through staging, or as a UCX transfer).
fn flood_message(i: u64) -> Message {
    let len = if i.is_multiple_of(8) { 16 << 10 } else { 24 };
    Message::new(i.to_le_bytes().to_vec(), vec![pattern(len, i).into()])
}

/// The index of a message, checking its bytes.
fn index_of(message: &Message) -> u64 {
    let i = u64::from_le_bytes(message.header[..8].try_into().expect("an 8-byte header"));
    let bytes = match &message.frames[..] {
        [Frame::Host(h)] => h.to_vec(),
        other => panic!("message {i}: expected one host frame, got {}", other.len()),
    };
    assert_eq!(bytes, pattern(bytes.len(), i), "the bytes of message {i}");
    i
}

/// The peer: sends the messages (up to 32 in flight, a pause after every burst), then
/// stays until the parent hangs up.
fn run_flood_peer(policy: LanePolicy) {
    let ctx = Context::new(config(policy)).unwrap();
    let ep = ctx.connect(std::env::var(PATH_VAR).unwrap()).expect("connect");
    let mut in_flight = VecDeque::new();
    for i in 0..MESSAGES {
        in_flight.push_back(ep.send(flood_message(i)));
        if in_flight.len() >= 32 {
            in_flight.pop_front().expect("one").wait().expect("send");
        }
        if i % BURST == BURST - 1 {
            std::thread::sleep(PAUSE);
        }
    }
    for send in in_flight {
        send.wait().expect("send");
    }
    // Returns when the parent hangs up.
    let _ = ep.recv().wait();
}

/// What the parent got: the indices in arrival order, and how often the timer won.
struct Raced {
    indices: Vec<u64>,
    timer_wins: u64,
}

/// Receives with `recv()` raced against a 100 µs timer until every message arrived or
/// nothing came for `IDLE_BOUND`.
fn race_recv_against_a_timer(ep: &Endpoint) -> Raced {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    runtime.block_on(async {
        let mut raced = Raced { indices: Vec::new(), timer_wins: 0 };
        let mut last = Instant::now();
        while (raced.indices.len() as u64) < MESSAGES && last.elapsed() < IDLE_BOUND {
            tokio::select! {
                received = ep.recv() => {
                    raced.indices.push(index_of(&received.expect("receive")));
                    last = Instant::now();
                }
                _ = tokio::time::sleep(Duration::from_micros(100)) => raced.timer_wins += 1,
            }
        }
        raced
    })
}

fn check_nothing_lost(ctx: &Context, peers: &Peers, role: &str, lane: LaneKind) {
    let dir = socket_dir();
    let listener = Listener::bind(ctx, dir.path().join("private/s.sock")).unwrap();
    let mut peer = peers.spawn(role, &[(PATH_VAR, listener.path().display().to_string())]);
    let ep = listener.accept_timeout(Duration::from_secs(20)).expect("peer connects");
    assert_eq!(ep.lane(), lane);
    let raced = race_recv_against_a_timer(&ep);
    let got = raced.indices.len() as u64;
    println!("received {got} of {MESSAGES} messages; the timer won {} times", raced.timer_wins);
    assert!(raced.timer_wins > 0, "the timer never won: the race was not run");
    assert_eq!(got, MESSAGES, "received {got} of {MESSAGES} messages (the timer won {} times)", raced.timer_wins);
    let in_order = raced.indices.iter().enumerate().all(|(n, &i)| n as u64 == i);
    assert!(in_order, "messages out of order or twice");
    drop(ep);
    peer.wait_success(Duration::from_secs(30));
}

peer_test! {
    fn recv_raced_against_a_timer_in_select_loses_no_message_native(peers) {
        let ctx = Context::new(config(LanePolicy::Native)).unwrap();
        check_nothing_lost(&ctx, &peers, "native", LaneKind::Native);
    }
    "native" => run_flood_peer(LanePolicy::Native),
}

peer_test! {
    fn recv_raced_against_a_timer_in_select_loses_no_message_ucx(peers) {
        let Some(ctx) = ucx_context_or_skip_with(config(LanePolicy::Ucx)) else { return };
        check_nothing_lost(&ctx, &peers, "ucx", LaneKind::Ucx);
    }
    "ucx" => run_flood_peer(LanePolicy::Ucx),
}

/// The receives this context still has posted.
fn recvs_posted(ctx: &Context) -> usize {
    ctx.stats().expect("the context's stats").recvs_posted
}

#[test]
fn a_dropped_receive_is_withdrawn_on_the_native_lane_and_the_next_one_gets_the_message() {
    let dir = socket_dir();
    let ctx = Context::new(config(LanePolicy::Native)).unwrap();
    let listener = Listener::bind(&ctx, dir.path().join("p/s.sock")).unwrap();
    let sender_ctx = Context::new(config(LanePolicy::Native)).unwrap();
    let sender = sender_ctx.connect(listener.path()).unwrap();
    let ep = listener.accept_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(ep.lane(), LaneKind::Native);
    // No message is on its way: the receive is posted, then its handle goes, as a
    // `recv()` that lost a `select!` to a timer.
    let dropped = ep.recv();
    assert!(eventually(Duration::from_secs(5), || recvs_posted(&ctx) == 1), "the receive was never posted");
    drop(dropped);
    let withdrawn = eventually(Duration::from_secs(5), || recvs_posted(&ctx) == 0);
    assert!(withdrawn, "a dropped receive stays posted ({} posted)", recvs_posted(&ctx));
    let mut next = ep.recv();
    sender.send(flood_message(7)).wait().unwrap();
    let got = next.wait_timeout(Duration::from_secs(5)).expect("the message reaches the next receive");
    assert_eq!(index_of(&got.unwrap()), 7);
    assert_eq!(recvs_posted(&ctx), 0);
}
