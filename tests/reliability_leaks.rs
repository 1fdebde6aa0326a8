//! No leaks: the context's counters (`Context::stats`), the process's open file
//! descriptors and its mappings (`/proc/self/maps`: memfd mappings exactly, the rest
//! within a small tolerance; device memory where a GPU is present) return to their
//! baseline after 1000 connect/send/disconnect cycles and after peer crashes
//! (`common::LeakBaseline`). The engine forgets a connection once the user dropped its
//! endpoint and it is dead, so the checks poll with a bound until things settle.

mod common;

use common::*;
use ferrylink::ipc::shared_host_buffer;
use ferrylink::transport::{Config, Context, Listener};
use ferrylink::Message;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const PATH_VAR: &str = "FERRYLINK_TEST_SOCKET";
/// The step a peer reports ([`reached`]) before it waits to be killed.
const STEP: &str = "the step";

/// File descriptors are process-wide: the tests of this file run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn config() -> Config {
    Config::default().with_request_timeout(Duration::from_secs(5)).with_connect_timeout(Duration::from_secs(5))
}

#[test]
fn a_thousand_connect_send_disconnect_cycles_leave_nothing_behind() {
    let _serial = serial();
    let dir = socket_dir();
    let server = Context::new(config()).unwrap();
    let client = Context::new(config()).unwrap();
    let listener = Listener::bind(&server, dir.path().join("p/s.sock")).unwrap();
    let baseline = LeakBaseline::take(&[&server, &client], open_fds());
    let fds = baseline.fds;
    let staged = pattern(100_000, 1);
    let staged_sum = checksum(&staged);
    let started = Instant::now();
    let mut peak_fds = fds;
    let (mut sent, mut bytes) = (0u64, 0u64);
    for cycle in 0..1000u64 {
        let ep = client.connect(listener.path()).expect("connect");
        let server_ep = listener.accept_timeout(Duration::from_secs(5)).expect("accept");
        // Inline, staged and (every 4th cycle) shared-memory frames; the server echoes
        // them, so its landing memory travels back too.
        let mut frames = vec![pattern(64, cycle).into(), staged.clone().into()];
        if cycle % 4 == 0 {
            let mut shared = shared_host_buffer(50_000).unwrap();
            shared.as_mut_slice().copy_from_slice(&pattern(50_000, cycle));
            frames.push(shared.into());
        }
        let n = frames.len();
        ep.send(Message::new(cycle.to_le_bytes().to_vec(), frames)).wait().expect("send");
        let got = server_ep.recv().wait().expect("recv");
        assert_eq!(got.header, cycle.to_le_bytes());
        assert_eq!(checksum(got.frames[1].as_host().unwrap().as_slice()), staged_sum, "cycle {cycle}");
        server_ep.send(got).wait().expect("echo");
        let back = ep.recv().wait().expect("echo recv");
        assert_eq!(back.frames.len(), n);
        sent += 2;
        bytes += 2 * back.payload_len() as u64;
        peak_fds = peak_fds.max(open_fds());
        // Every order of dropping occurs.
        if cycle % 2 == 0 {
            drop(ep);
            drop(server_ep);
        } else {
            drop(server_ep);
            drop(ep);
        }
    }
    let elapsed = started.elapsed();
    let settled = baseline.assert_back("after 1000 cycles", &[&server, &client], Duration::from_secs(5));
    println!(
        "1000 connect/send/echo/disconnect cycles in {elapsed:.2?}: {sent} messages, {bytes} payload bytes; \
         fds {fds} before, peak {peak_fds}, {} after; stats back to {:?}; mappings {:?} before, {:?} after",
        open_fds(),
        baseline.stats[0],
        baseline.footprint,
        settled
    );
}

/// A crashing peer: connects, sends shared and staged frames, takes one message, then
/// waits to be killed with everything mapped.
fn run_crashing_peer() {
    let path = std::env::var(PATH_VAR).unwrap();
    let ctx = Context::new(config()).unwrap();
    let ep = ctx.connect(&path).expect("connect");
    for i in 0..3u64 {
        let mut shared = shared_host_buffer(200_000).unwrap();
        shared.as_mut_slice().copy_from_slice(&pattern(200_000, i));
        ep.send(Message::new(vec![], vec![shared.into(), pattern(300_000, i).into()])).wait().expect("send");
    }
    let _held = ep.recv().wait().expect("the parent's message");
    reached(STEP);
    std::thread::sleep(Duration::from_secs(60));
}

peer_test! {
    fn killed_peers_leave_nothing_behind(peers) {
        let _serial = serial();
        let dir = socket_dir();
        let ctx = Context::new(config()).unwrap();
        let listener = Listener::bind(&ctx, dir.path().join("p/s.sock")).unwrap();
        let baseline = LeakBaseline::take(&[&ctx], open_fds());
        const CRASHES: usize = 4;
        for round in 0..CRASHES {
            let env = [(PATH_VAR, listener.path().display().to_string())];
            let mut child = peers.spawn("crasher", &env);
            let ep = listener.accept_timeout(Duration::from_secs(20)).expect("the peer connects");
            let mut kept = Vec::new();
            for _ in 0..3 {
                kept.push(ep.recv().wait().expect("the peer's message"));
            }
            // The parent sends a staged message the peer holds, and has sends and receives
            // pending when the peer dies.
            ep.send(Message::new(vec![], vec![pattern(500_000, 9).into()])).wait().expect("send");
            child.wait_reached(STEP, Duration::from_secs(20));
            let pending_send = ep.send(Message::new(vec![], vec![pattern(2 << 20, 3).into()]));
            let pending_recv = ep.recv();
            let during = ctx.stats().unwrap();
            assert!(during.imported_regions >= 1 && during.staging_mapped_bytes > 0, "{during:?}");
            child.kill();
            // Alternate: the user drops the endpoint before or after its requests end, and
            // keeps (or drops) the messages that landed from the dead peer.
            if round % 2 == 0 {
                drop(ep);
                let _ = pending_send.wait();
                let _ = pending_recv.wait();
            } else {
                // The send may have been acknowledged before the death; the receive cannot.
                let _ = pending_send.wait();
                assert!(pending_recv.wait().is_err());
                drop(ep);
            }
            // Messages that landed from the dead peer are whole and the user's own.
            for (i, m) in kept.iter().enumerate() {
                assert_eq!(m.frames[0].as_host().unwrap().as_slice(), &pattern(200_000, i as u64)[..]);
                assert_eq!(m.frames[1].as_host().unwrap().as_slice(), &pattern(300_000, i as u64)[..]);
            }
            drop(kept);
            let settled = baseline.assert_back(&format!("after crash {}", round + 1), &[&ctx], Duration::from_secs(5));
            println!("after crash {}: footprint {settled:?}", round + 1);
        }
        println!(
            "{CRASHES} killed peers: stats, fds ({}) and mappings back to the baseline after each; baseline {:?}",
            baseline.fds, baseline.footprint
        );
    }
    peer(role) => {
        run_crashing_peer()
    },
}

#[test]

fn an_idle_endpoint_releases_shared_regions_its_peer_dropped() {
    let _serial = serial();
    let dir = socket_dir();
    let server = Context::new(config()).unwrap();
    let client = Context::new(config()).unwrap();
    let listener = Listener::bind(&server, dir.path().join("p/s.sock")).unwrap();
    let ep = client.connect(listener.path()).unwrap();
    let server_ep = listener.accept_timeout(Duration::from_secs(5)).unwrap();
    for i in 0..20u64 {
        let mut shared = shared_host_buffer(1 << 20).unwrap();
        shared.as_mut_slice().copy_from_slice(&pattern(1 << 20, i));
        let back = ep.send(Message::new(vec![], vec![shared.into()])).wait().unwrap();
        drop(back); // the sender is done with the region
        let _ = server_ep.recv().wait().unwrap();
    }
    // Both sides are idle; the sender holds none of its regions any more.
    let released = eventually(Duration::from_secs(2), || server.stats().unwrap().imported_regions == 0);
    assert!(released, "the receiver still maps regions its peer dropped: {:?}", server.stats());
}

#[test]

fn endpoints_never_accepted_are_released_when_the_listener_goes() {
    let _serial = serial();
    let dir = socket_dir();
    let server = Context::new(config()).unwrap();
    let client = Context::new(config()).unwrap();
    let baseline = LeakBaseline::take(&[&server, &client], open_fds());
    let listener = Listener::bind(&server, dir.path().join("p/s.sock")).unwrap();
    // Five peers connect (their handshakes complete) but the server never calls accept.
    let eps: Vec<_> = (0..5).map(|_| client.connect(listener.path()).unwrap()).collect();
    drop(eps);
    // Let the server see the peers leave while their endpoints still wait to be accepted
    // (the order a fast machine produces), then drop the listener.
    std::thread::sleep(Duration::from_millis(300));
    drop(listener);
    baseline.assert_back("after the unaccepted peers left", &[&server, &client], Duration::from_secs(5));
}
