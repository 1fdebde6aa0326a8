//! Load: 64 endpoints on one context (the peers are two re-executed processes with 32
//! endpoints each on their own context), 20 messages in flight on each, sizes mixed up to
//! 1 MiB (inline, staged and shared-memory frames). Every message comes back echoed with
//! the checksums the peer computed; both directions are verified, and the test reports
//! the throughput and how many messages were lost or corrupted (zero).

mod common;

use common::*;
use ferrylink::ipc::shared_host_buffer;
use ferrylink::transport::{Config, Context, Endpoint, Lane, Listener};
use ferrylink::{Frame, Message};
use std::time::{Duration, Instant};

const PATH_VAR: &str = "FERRYLINK_TEST_SOCKET";
const PEERS: usize = 2;
const ENDPOINTS_PER_PEER: usize = 32;
const MESSAGES_PER_ENDPOINT: usize = 20;
const SIZES: [usize; 6] = [0, 100, 8 << 10, 64 << 10, 256 << 10, 1 << 20];
/// Nothing of the load may take longer than this.
const BOUND: Duration = Duration::from_secs(60);

fn config() -> Config {
    Config { request_timeout: BOUND, connect_timeout: Duration::from_secs(20), ..Config::default() }
}

/// The peer: 32 endpoints, each echoing every message with the checksums of its frames in
/// the header, until "stop".
fn run_peer() {
    let path = std::env::var(PATH_VAR).unwrap();
    let ctx = Context::new(config()).unwrap();
    let eps: Vec<Endpoint> = (0..ENDPOINTS_PER_PEER).map(|_| ctx.connect(&path).expect("connect")).collect();
    let threads: Vec<_> = eps
        .into_iter()
        .map(|ep| {
            std::thread::spawn(move || loop {
                let msg = ep.recv().wait().expect("peer recv");
                if msg.header == b"stop" {
                    return;
                }
                let mut header = msg.header[..16].to_vec();
                for f in &msg.frames {
                    header.extend_from_slice(&checksum(f.as_host().unwrap().as_slice()).to_le_bytes());
                }
                ep.send(Message::new(header, msg.frames)).wait().expect("peer echo");
            })
        })
        .collect();
    for t in threads {
        t.join().expect("echo thread");
    }
}

/// Message `m` of endpoint `e`: 1 to 3 frames, each stamped with its identity, every
/// fourth frame of 8 KiB or more in shared memory. Returns it and its frames' checksums.
fn build(e: usize, m: usize, bases: &[Vec<u8>]) -> (Message, Vec<u64>) {
    let nframes = 1 + (e + m) % 3;
    let mut frames: Vec<Frame> = Vec::new();
    let mut sums = Vec::new();
    for f in 0..nframes {
        let which = (e * 7 + m * 3 + f) % SIZES.len();
        let mut bytes = bases[which].clone();
        let stamp = [(e as u32).to_le_bytes(), (m as u32).to_le_bytes(), (f as u32).to_le_bytes()].concat();
        let n = stamp.len().min(bytes.len());
        bytes[..n].copy_from_slice(&stamp[..n]);
        sums.push(checksum(&bytes));
        if bytes.len() >= 8 << 10 && (e + m + f).is_multiple_of(4) {
            let mut shared = shared_host_buffer(bytes.len()).unwrap();
            shared.as_mut_slice().copy_from_slice(&bytes);
            frames.push(shared.into());
        } else {
            frames.push(bytes.into());
        }
    }
    let header = [(e as u64).to_le_bytes(), (m as u64).to_le_bytes()].concat();
    (Message::new(header, frames), sums)
}

#[test]
fn sixty_four_endpoints_with_twenty_messages_in_flight_each_lose_and_corrupt_nothing() {
    const T: &str = "sixty_four_endpoints_with_twenty_messages_in_flight_each_lose_and_corrupt_nothing";
    if peer_role(T).is_some() {
        return run_peer();
    }
    if is_peer_process() {
        return;
    }
    let dir = socket_dir();
    let ctx = Context::new(config()).unwrap();
    let listener = Listener::bind(&ctx, dir.path().join("p/s.sock")).unwrap();
    let env = [(PATH_VAR, listener.path().display().to_string())];
    let mut children: Vec<_> = (0..PEERS).map(|_| spawn_peer(T, "echo", &env)).collect();
    let eps: Vec<Endpoint> = (0..PEERS * ENDPOINTS_PER_PEER)
        .map(|_| listener.accept_timeout(Duration::from_secs(30)).expect("a peer endpoint connects"))
        .collect();
    assert!(eps.iter().all(|ep| ep.lane() == Lane::Native));
    assert_eq!(ctx.stats().endpoints, eps.len());
    let bases: Vec<Vec<u8>> = SIZES.iter().enumerate().map(|(i, &s)| pattern(s, 100 + i as u64)).collect();

    let started = Instant::now();
    let mut expected = Vec::new();
    let mut sends = Vec::new();
    let mut recvs = Vec::new();
    let mut payload = 0u64;
    // Receives first, so echoes land into posted receives.
    for ep in &eps {
        recvs.push((0..MESSAGES_PER_ENDPOINT).map(|_| ep.recv()).collect::<Vec<_>>());
    }
    for m in 0..MESSAGES_PER_ENDPOINT {
        for (e, ep) in eps.iter().enumerate() {
            let (message, sums) = build(e, m, &bases);
            payload += message.payload_len() as u64;
            sends.push(ep.send(message));
            expected.push(((e, m), sums));
        }
    }
    let peak = ctx.stats();
    let deadline = started + BOUND;
    let remaining = || deadline.saturating_duration_since(Instant::now());
    let mut send_failures = 0;
    for mut s in sends {
        match s.wait_timeout(remaining()) {
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                eprintln!("send failed: {e}");
                send_failures += 1;
            }
            None => panic!("a send still pending after {BOUND:?}"),
        }
    }
    let expected: std::collections::HashMap<_, _> = expected.into_iter().collect();
    let (mut received, mut lost, mut corrupted) = (0usize, 0usize, 0usize);
    for (e, per_ep) in recvs.into_iter().enumerate() {
        for (m, mut r) in per_ep.into_iter().enumerate() {
            let msg = match r.wait_timeout(remaining()) {
                Some(Ok(msg)) => msg,
                Some(Err(err)) => {
                    eprintln!("endpoint {e} message {m}: {err}");
                    lost += 1;
                    continue;
                }
                None => panic!("endpoint {e}: echo {m} still pending after {BOUND:?}"),
            };
            received += 1;
            let id = (
                u64::from_le_bytes(msg.header[0..8].try_into().unwrap()) as usize,
                u64::from_le_bytes(msg.header[8..16].try_into().unwrap()) as usize,
            );
            // Per-endpoint order is kept: the m-th echo on endpoint e is message (e, m).
            let sums = &expected[&(e, m)];
            let peer_sums: Vec<u64> =
                msg.header[16..].chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
            let back_sums: Vec<u64> = msg.frames.iter().map(|f| checksum(f.as_host().unwrap().as_slice())).collect();
            if id != (e, m) || &peer_sums != sums || &back_sums != sums {
                eprintln!(
                    "endpoint {e} message {m}: got {id:?}, peer sums ok {}, echo ok {}",
                    &peer_sums == sums,
                    &back_sums == sums
                );
                corrupted += 1;
            }
        }
    }
    let elapsed = started.elapsed();
    for ep in &eps {
        ep.send(Message::new(b"stop".to_vec(), vec![])).wait().expect("stop");
    }
    for child in &mut children {
        let status = wait_child(child, Duration::from_secs(30));
        assert!(status.success(), "echo peer: {status}");
    }
    let total = eps.len() * MESSAGES_PER_ENDPOINT;
    let moved = 2 * payload;
    println!(
        "load: {} endpoints x {MESSAGES_PER_ENDPOINT} messages in flight = {total} messages sent and echoed \
         ({} MB payload each way) in {elapsed:.2?}: {:.0} messages/s, {:.2} GB/s both ways together; \
         peak {} sends in flight, {} receives posted",
        eps.len(),
        payload / 1_000_000,
        2.0 * total as f64 / elapsed.as_secs_f64(),
        moved as f64 / elapsed.as_secs_f64() / 1e9,
        peak.sends_in_flight,
        peak.recvs_posted,
    );
    println!(
        "load: {received} of {total} echoes received: {lost} lost, {corrupted} corrupted, {send_failures} failed sends"
    );
    assert_eq!((received, lost, corrupted, send_failures), (total, 0, 0, 0));
    drop(eps);
    assert!(eventually(Duration::from_secs(5), || ctx.stats().endpoints == 0), "{:?}", ctx.stats());
}
