//! Load: 64 endpoints on one context (the peers are two re-executed processes with 32
//! endpoints each on their own context), 20 messages in flight on each, sizes mixed up to
//! 1 MiB (inline, staged and shared-memory frames). The peers are stopped while the 20
//! are posted on every endpoint, so the context holds all 1280 sends in flight at once
//! (asserted), then resumed. Every message comes back echoed with the checksums the peer
//! computed; both directions are verified, and the test reports the throughput and how
//! many messages were lost or corrupted (zero).

mod common;

use common::*;
use ferrylink::ipc::shared_host_buffer;
use ferrylink::transport::{Config, Context, Endpoint, LaneKind, Listener};
use ferrylink::{Frame, Message};
use std::time::Duration;

const PATH_VAR: &str = "FERRYLINK_TEST_SOCKET";
const PEERS: usize = 2;
const ENDPOINTS_PER_PEER: usize = 32;
const MESSAGES_PER_ENDPOINT: usize = 20;
const SIZES: [usize; 6] = [0, 100, 8 << 10, 64 << 10, 256 << 10, 1 << 20];
/// Nothing of the load may take longer than this.
const BOUND: Duration = Duration::from_secs(60);

fn config() -> Config {
    Config::default().with_request_timeout(BOUND).with_connect_timeout(Duration::from_secs(20))
}

/// The peer: 32 endpoints, each echoing every message (the kit's echo: the header, then
/// the checksums of its frames), until "stop".
fn run_peer() {
    let path = std::env::var(PATH_VAR).unwrap();
    let ctx = Context::new(config()).unwrap();
    let eps: Vec<Endpoint> = (0..ENDPOINTS_PER_PEER).map(|_| ctx.connect(&path).expect("connect")).collect();
    echo::serve_all(&Ferry, &eps);
}

/// Message `m` of endpoint `e`: 1 to 3 frames, each stamped with its identity, every
/// fourth frame of 8 KiB or more in shared memory.
fn build(e: usize, m: usize, bases: &[Vec<u8>]) -> Message {
    let nframes = 1 + (e + m) % 3;
    let mut frames: Vec<Frame> = Vec::new();
    for f in 0..nframes {
        let which = (e * 7 + m * 3 + f) % SIZES.len();
        let mut bytes = bases[which].clone();
        let stamp = [(e as u32).to_le_bytes(), (m as u32).to_le_bytes(), (f as u32).to_le_bytes()].concat();
        let n = stamp.len().min(bytes.len());
        bytes[..n].copy_from_slice(&stamp[..n]);
        if bytes.len() >= 8 << 10 && (e + m + f).is_multiple_of(4) {
            let mut shared = shared_host_buffer(bytes.len()).unwrap();
            shared.as_mut_slice().copy_from_slice(&bytes);
            frames.push(shared.into());
        } else {
            frames.push(bytes.into());
        }
    }
    let header = [(e as u64).to_le_bytes(), (m as u64).to_le_bytes()].concat();
    Message::new(header, frames)
}

peer_test! {
    fn sixty_four_endpoints_with_twenty_messages_in_flight_each_lose_and_corrupt_nothing(peers) {
        let dir = socket_dir();
        let ctx = Context::new(config()).unwrap();
        let listener = Listener::bind(&ctx, dir.path().join("p/s.sock")).unwrap();
        let env = [(PATH_VAR, listener.path().display().to_string())];
        let mut children: Vec<_> = (0..PEERS).map(|_| peers.spawn("echo", &env)).collect();
        let eps: Vec<Endpoint> = (0..PEERS * ENDPOINTS_PER_PEER)
            .map(|_| listener.accept_timeout(Duration::from_secs(30)).expect("a peer endpoint connects"))
            .collect();
        assert!(eps.iter().all(|ep| ep.lane() == LaneKind::Native));
        assert_eq!(ctx.stats().unwrap().endpoints, eps.len());
        let bases: Vec<Vec<u8>> = SIZES.iter().enumerate().map(|(i, &s)| pattern(s, 100 + i as u64)).collect();

        // Every message in flight at once (receives posted first, so echoes land into
        // posted receives): the peers, stopped, acknowledge none until the whole window
        // is posted. Per-endpoint order is kept: the m-th echo on endpoint e is message
        // (e, m), its header and the checksums checked.
        let load = Load { messages: MESSAGES_PER_ENDPOINT, in_flight: MESSAGES_PER_ENDPOINT, bound: BOUND };
        let held = ResumedAtFirstWait::new(PausedPeers::stop(&children));
        let depth = || ctx.stats().unwrap().sends_in_flight;
        let r = echo::check_load(&held, &eps, load, |e, m| build(e, m, &bases), depth);
        drop(held);
        for ep in &eps {
            stop_echo(ep);
        }
        for child in &mut children {
            child.wait_success(Duration::from_secs(30));
        }
        println!(
            "load: {} endpoints x {MESSAGES_PER_ENDPOINT} messages in flight = {} messages sent and echoed \
             ({} MB payload each way) in {:.2?}: {:.0} messages/s, {:.2} GB/s both ways together; \
             {} messages outstanding at once, peak {} sends in flight",
            eps.len(),
            r.total,
            r.payload_bytes / 1_000_000,
            r.elapsed,
            r.messages_per_second(),
            r.gigabytes_per_second(),
            r.posted_depth,
            r.peak_depth,
        );
        println!(
            "load: {} of {} echoes received: {} lost, {} corrupted, {} failed sends",
            r.received, r.total, r.lost, r.corrupted, r.send_failures
        );
        assert_eq!(r.total, eps.len() * MESSAGES_PER_ENDPOINT);
        r.assert_intact();
        // No endpoint has more than its 20 posted: the sum is 20 on every one, at once.
        let claimed = eps.len() * MESSAGES_PER_ENDPOINT;
        assert!(r.peak_depth >= claimed, "peak {} sends in flight, {claimed} claimed", r.peak_depth);
        drop(eps);
        assert!(eventually(Duration::from_secs(5), || ctx.stats().unwrap().endpoints == 0), "{:?}", ctx.stats());
    }
    peer(role) => {
        run_peer()
    },
}
