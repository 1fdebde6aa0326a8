//! The echo peer and the load check, generic over the transport.
//!
//! The echo protocol: the peer sends every message back with its frames unchanged and
//! its header extended by the [`checksum`] of each frame as it received it (8 bytes each,
//! little-endian), until a message whose header is [`STOP`] and has no frames. The
//! checker compares both: what the peer saw and what came back.
//!
//! A test crate implements [`Transport`] once for a unit struct of its own (the kit
//! depends on no ferrylink crate, see the crate docs).

use crate::checksum;
use std::borrow::Cow;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The header of the message that ends an echo peer.
pub const STOP: &[u8] = b"stop";

/// What the echo peer and the load check need of a transport.
pub trait Transport: Sync {
    type Endpoint: Send + Sync;
    type Message: Send;
    type Sending;
    type Receiving;

    /// Starts sending `message`.
    fn send(&self, ep: &Self::Endpoint, message: Self::Message) -> Self::Sending;
    /// Posts a receive.
    fn recv(&self, ep: &Self::Endpoint) -> Self::Receiving;
    /// Waits at most `bound` for a send: `None` while still pending, the error as text.
    fn wait_sent(&self, req: &mut Self::Sending, bound: Duration) -> Option<Result<(), String>>;
    /// Waits at most `bound` for a receive: `None` while still pending.
    fn wait_received(&self, req: &mut Self::Receiving, bound: Duration) -> Option<Result<Self::Message, String>>;
    /// A message with `header` and the frames of `frames_of` (no frames: `None`).
    fn message(&self, header: Vec<u8>, frames_of: Option<Self::Message>) -> Self::Message;
    fn header<'m>(&self, message: &'m Self::Message) -> &'m [u8];
    /// The bytes of each frame (copied to the host where they are elsewhere).
    fn frames<'m>(&self, message: &'m Self::Message) -> Vec<Cow<'m, [u8]>>;
}

/// The echo peer: echoes every message on `ep` until [`STOP`]; returns the stop message
/// (a peer may answer it). Panics when a receive or a send fails.
pub fn serve<T: Transport>(t: &T, ep: &T::Endpoint) -> T::Message {
    loop {
        let msg = wait_forever(t.recv(ep), |r| t.wait_received(r, Duration::from_secs(3600))).expect("echo peer recv");
        if t.header(&msg) == STOP && t.frames(&msg).is_empty() {
            return msg;
        }
        let mut header = t.header(&msg).to_vec();
        for frame in t.frames(&msg) {
            header.extend_from_slice(&checksum(&frame).to_le_bytes());
        }
        let mut send = t.send(ep, t.message(header, Some(msg)));
        wait_forever(&mut send, |s| t.wait_sent(s, Duration::from_secs(3600))).expect("echo peer send");
    }
}

/// [`serve`] on every endpoint at once (a thread each), until each got [`STOP`].
pub fn serve_all<T: Transport>(t: &T, eps: &[T::Endpoint]) {
    std::thread::scope(|s| {
        for ep in eps {
            s.spawn(move || drop(serve(t, ep)));
        }
    });
}

/// Sends [`STOP`] on `ep` (bounded).
pub fn stop<T: Transport>(t: &T, ep: &T::Endpoint, bound: Duration) {
    let mut send = t.send(ep, t.message(STOP.to_vec(), None));
    match t.wait_sent(&mut send, bound) {
        Some(Ok(())) => {}
        Some(Err(e)) => panic!("sending stop to an echo peer: {e}"),
        None => panic!("stop to an echo peer still pending after {bound:?}"),
    }
}

fn wait_forever<R, O>(mut req: R, mut wait: impl FnMut(&mut R) -> Option<O>) -> O {
    loop {
        if let Some(outcome) = wait(&mut req) {
            return outcome;
        }
    }
}

/// Checks an echo of a message with `header` and frames `sent`: the peer's checksums
/// (after the header) are those of `sent`, and the frames came back intact.
pub fn verify<T: Transport>(t: &T, header: &[u8], sent: &[Vec<u8>], back: &T::Message) {
    let got = t.header(back);
    assert!(got.len() >= header.len() && &got[..header.len()] == header, "the echo keeps the header");
    let frames = t.frames(back);
    assert_eq!(frames.len(), sent.len(), "frames echoed");
    assert_eq!(got.len(), header.len() + 8 * sent.len(), "a checksum per frame");
    for (i, (orig, frame)) in sent.iter().zip(&frames).enumerate() {
        let at = header.len() + i * 8;
        let sum = u64::from_le_bytes(got[at..at + 8].try_into().expect("8 bytes"));
        assert_eq!(sum, checksum(orig), "checksum of frame {i} at the peer");
        assert!(frame[..] == orig[..], "frame {i} echoed intact");
    }
}

/// A load: `messages` per endpoint, at most `in_flight` of them outstanding on each at a
/// time (a receive is posted before each send, so echoes land into posted receives).
#[derive(Clone, Copy, Debug)]
pub struct Load {
    pub messages: usize,
    pub in_flight: usize,
    /// Nothing of the load may take longer.
    pub bound: Duration,
}

/// What a load did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Messages sent (and expected back).
    pub total: usize,
    pub received: usize,
    /// Receives that ended with an error.
    pub lost: usize,
    /// Echoes with the wrong header, a wrong checksum at the peer or wrong frames back.
    pub corrupted: usize,
    pub send_failures: usize,
    /// Payload bytes sent (the same come back).
    pub payload_bytes: u64,
    pub elapsed: Duration,
    /// The most messages outstanding at once, over all endpoints, as the check posted them.
    pub posted_depth: usize,
    /// The highest depth the `depth` probe reported (what the transport had in flight).
    pub peak_depth: usize,
}

impl LoadReport {
    /// Every message came back intact, none lost, no send failed.
    pub fn assert_intact(&self) {
        assert_eq!(
            (self.received, self.lost, self.corrupted, self.send_failures),
            (self.total, 0, 0, 0),
            "(received, lost, corrupted, failed sends) of {} messages",
            self.total
        );
    }

    /// Messages per second, both ways together.
    pub fn messages_per_second(&self) -> f64 {
        2.0 * self.total as f64 / self.elapsed.as_secs_f64()
    }

    /// GB/s of payload, both ways together.
    pub fn gigabytes_per_second(&self) -> f64 {
        2.0 * self.payload_bytes as f64 / self.elapsed.as_secs_f64() / 1e9
    }
}

/// One message of the load, outstanding.
struct Outstanding<T: Transport> {
    m: usize,
    header: Vec<u8>,
    sums: Vec<u64>,
    send: T::Sending,
    recv: T::Receiving,
}

/// Runs `load` over `eps`, each served by an echo peer: message `m` of endpoint `e` is
/// `make(e, m)`; every echo is checked (per endpoint, echoes come back in order). `depth`
/// is probed once each round of sends is posted (e.g. the transport's sends in flight).
/// Panics when a request is still pending at the load's bound; errors are counted.
pub fn check_load<T: Transport>(
    t: &T,
    eps: &[T::Endpoint],
    load: Load,
    mut make: impl FnMut(usize, usize) -> T::Message,
    mut depth: impl FnMut() -> usize,
) -> LoadReport {
    let started = Instant::now();
    let deadline = started + load.bound;
    let remaining = || deadline.saturating_duration_since(Instant::now());
    let mut report = LoadReport { total: eps.len() * load.messages, ..LoadReport::default() };
    let mut queues: Vec<VecDeque<Outstanding<T>>> = eps.iter().map(|_| VecDeque::new()).collect();
    let mut next = 0;
    while next < load.messages || queues.iter().any(|q| !q.is_empty()) {
        // Round: on every endpoint, take the oldest echo once the window is full, then
        // post the next message.
        for (e, ep) in eps.iter().enumerate() {
            if queues[e].len() >= load.in_flight.max(1) || (next >= load.messages && !queues[e].is_empty()) {
                let done = queues[e].pop_front().expect("outstanding");
                take_echo(t, e, done, remaining, &mut report);
            }
            if next < load.messages && queues[e].len() < load.in_flight.max(1) {
                let recv = t.recv(ep);
                let message = make(e, next);
                let header = t.header(&message).to_vec();
                let frames = t.frames(&message);
                report.payload_bytes += frames.iter().map(|f| f.len() as u64).sum::<u64>();
                let sums = frames.iter().map(|f| checksum(f)).collect();
                drop(frames);
                let send = t.send(ep, message);
                queues[e].push_back(Outstanding { m: next, header, sums, send, recv });
            }
        }
        if next < load.messages {
            next += 1;
            report.posted_depth = report.posted_depth.max(queues.iter().map(VecDeque::len).sum());
            report.peak_depth = report.peak_depth.max(depth());
        }
    }
    report.elapsed = started.elapsed();
    report
}

/// Waits for an outstanding message's send and echo, and checks the echo.
fn take_echo<T: Transport>(
    t: &T,
    e: usize,
    mut o: Outstanding<T>,
    remaining: impl Fn() -> Duration,
    report: &mut LoadReport,
) {
    let m = o.m;
    match t.wait_sent(&mut o.send, remaining()) {
        Some(Ok(())) => {}
        Some(Err(err)) => {
            eprintln!("endpoint {e} message {m}: send failed: {err}");
            report.send_failures += 1;
        }
        None => panic!("endpoint {e}: send {m} still pending at the load's bound"),
    }
    let msg = match t.wait_received(&mut o.recv, remaining()) {
        Some(Ok(msg)) => msg,
        Some(Err(err)) => {
            eprintln!("endpoint {e} message {m}: {err}");
            report.lost += 1;
            return;
        }
        None => panic!("endpoint {e}: echo {m} still pending at the load's bound"),
    };
    report.received += 1;
    let got = t.header(&msg);
    let (id, peer_sums) = got.split_at(o.header.len().min(got.len()));
    let peer_sums: Vec<u64> = peer_sums.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
    let back_sums: Vec<u64> = t.frames(&msg).iter().map(|f| checksum(f)).collect();
    if id != o.header || peer_sums != o.sums || back_sums != o.sums {
        eprintln!(
            "endpoint {e} message {m}: header ok {}, peer sums ok {}, echo ok {}",
            id == o.header,
            peer_sums == o.sums,
            back_sums == o.sums
        );
        report.corrupted += 1;
    }
}
