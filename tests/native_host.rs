//! End-to-end tests of the native lane with host frames, between real processes.

mod common;

use common::*;
use ferrylink::ipc::shared_host_buffer;
use ferrylink::transport::{Config, Context, LaneKind, Listener, TransportError};
use ferrylink::{Frame, HostBuffer, Message};
use std::time::{Duration, Instant};

const PATH_VAR: &str = "FERRYLINK_TEST_SOCKET";

/// The peer of most tests: connects, then echoes every message back (the kit's echo:
/// the header followed by the checksum of each frame it received), until "stop".
fn run_echo_peer() {
    let path = std::env::var(PATH_VAR).expect("socket path");
    let ctx = Context::new(Config::default()).unwrap();
    let ep = ctx.connect(&path).expect("connect");
    echo::serve(&Ferry, &ep);
}

struct Parent {
    _dir: tempfile::TempDir,
    ctx: Context,
    peer: Peer,
    ep: ferrylink::transport::Endpoint,
}

fn start(peers: &Peers, role: &str) -> Parent {
    let dir = socket_dir();
    let ctx = Context::new(Config::default()).unwrap();
    let listener = Listener::bind(&ctx, dir.path().join("private/s.sock")).unwrap();
    let peer = peers.spawn(role, &[(PATH_VAR, listener.path().display().to_string())]);
    let ep = listener.accept_timeout(Duration::from_secs(20)).expect("peer connects");
    Parent { _dir: dir, ctx, peer, ep }
}

fn stop(mut p: Parent) {
    stop_echo(&p.ep);
    p.peer.wait_success(Duration::from_secs(30));
}

peer_test! {
    fn messages_of_every_size_round_trip(peers) {
        let p = start(&peers, "echo");
        assert_eq!(p.ep.lane(), LaneKind::Native);
        for (i, &size) in [0usize, 1, 4 << 10, 8 << 10, (8 << 10) + 1, 1 << 20, 64 << 20].iter().enumerate() {
            let data = pattern(size, i as u64);
            let back = p.ep.send(Message::new(b"h".to_vec(), vec![data.clone().into()])).wait().unwrap();
            assert_eq!(back.frames[0].len(), size, "the send hands the message back");
            let echoed = p.ep.recv().wait().unwrap();
            verify_echo(b"h", &[data], &echoed);
        }
        stop(p);
    }
    "echo" => run_echo_peer(),
}

peer_test! {
    fn many_frames_many_in_flight_both_directions(peers) {
        let p = start(&peers, "echo");
        // 40 messages in flight at once, each with 25 frames mixing inline, staged and
        // shared-memory frames.
        let mut sent = Vec::new();
        let mut requests = Vec::new();
        for m in 0..40u64 {
            let mut frames = Vec::new();
            let mut originals = Vec::new();
            for f in 0..25u64 {
                let size = [0usize, 3, 4096, 20_000, 300_000][(m + f) as usize % 5];
                let bytes = pattern(size, m * 100 + f);
                let frame: Frame = if f % 3 == 0 && size > 0 {
                    let mut shared = shared_host_buffer(size).unwrap();
                    shared.as_mut_slice().copy_from_slice(&bytes);
                    shared.into()
                } else {
                    bytes.clone().into()
                };
                frames.push(frame);
                originals.push(bytes);
            }
            requests.push(p.ep.send(Message::new(vec![], frames)));
            sent.push(originals);
        }
        let recvs: Vec<_> = (0..40).map(|_| p.ep.recv()).collect();
        for r in requests {
            r.wait().unwrap();
        }
        for (originals, r) in sent.iter().zip(recvs) {
            verify_echo(&[], originals, &r.wait().unwrap());
        }
        stop(p);
    }
    "echo" => run_echo_peer(),
}

peer_test! {
    fn large_messages_write_only_control_bytes_to_the_socket(peers) {
        let p = start(&peers, "echo");
        let size = 64 << 20;
        // A plain Vec frame: copied once into staging, fd passed, 64 MiB never on the socket.
        let before = p.ep.stats();
        p.ep.send(Message::new(vec![], vec![pattern(size, 1).into()])).wait().unwrap();
        let after = p.ep.stats();
        let written = after.socket_bytes_written - before.socket_bytes_written;
        println!("64 MiB staged message: {written} control bytes written to the socket");
        assert!(written < 512, "{written} bytes written to the socket for a 64 MiB message");
        assert_eq!(after.staged_bytes - before.staged_bytes, size as u64);
        let echoed = p.ep.recv().wait().unwrap();
        assert_eq!(echoed.frames[0].len(), size);
        // A shared-memory frame: not even a staging copy.
        let mut shared = shared_host_buffer(size).unwrap();
        shared.as_mut_slice().copy_from_slice(&pattern(size, 2));
        let before = p.ep.stats();
        p.ep.send(Message::new(vec![], vec![shared.into()])).wait().unwrap();
        let after = p.ep.stats();
        assert!(after.socket_bytes_written - before.socket_bytes_written < 512);
        assert_eq!(after.staged_bytes, before.staged_bytes, "shared frames are not staged");
        assert_eq!(after.fds_sent - before.fds_sent, 1, "one fd for the shared region");
        let echoed = p.ep.recv().wait().unwrap();
        assert_eq!(echoed.frames[0].as_host().unwrap().as_slice(), &pattern(size, 2)[..]);
        stop(p);
    }
    "echo" => run_echo_peer(),
}

peer_test! {
    fn recv_into_fills_the_callers_buffers_and_refuses_misfits(peers) {
        let p = start(&peers, "echo");
        let data = pattern(100_000, 5);
        p.ep.send(Message::new(vec![], vec![data.clone().into()])).wait().unwrap();
        // Wrong size: refused, the buffers come back, the message stays for the next receive.
        let err = p.ep.recv_into(vec![HostBuffer::zeroed(10).into()]).wait().unwrap_err();
        assert!(matches!(err.error, TransportError::BufferMismatch(_)), "{err}");
        assert_eq!(err.buffers.unwrap()[0].len(), 10);
        let got = p.ep.recv_into(vec![HostBuffer::zeroed(100_000).into()]).wait().unwrap();
        assert_eq!(got.frames[0].as_host().unwrap().as_slice(), &data[..]);
        stop(p);
    }
    "echo" => run_echo_peer(),
}

peer_test! {
    fn a_killed_peer_fails_pending_requests_quickly(peers) {
        let mut p = start(&peers, "sleeper");
        p.ep.send(Message::new(vec![], vec![pattern(1 << 20, 1).into()])).wait().unwrap();
        let recvs: Vec<_> = (0..5).map(|_| p.ep.recv()).collect();
        let sends: Vec<_> = (0..5).map(|i| p.ep.send(Message::new(vec![], vec![pattern(4 << 20, i).into()]))).collect();
        std::thread::sleep(Duration::from_millis(200));
        let started = Instant::now();
        p.peer.kill();
        for r in recvs {
            let err = r.wait().unwrap_err();
            assert!(matches!(err.error, TransportError::PeerClosed { .. } | TransportError::PeerFailed { .. }), "{err}");
            assert!(err.error.to_string().contains("pid"), "the error names the peer: {err}");
        }
        for s in sends {
            // Sends the dead peer had landed before dying succeeded; the rest fail, never hang.
            if let Err(e) = s.wait() {
                assert!(e.message.is_some(), "a failed send hands the message back");
            }
        }
        assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
        let err = p.ep.send(Message::new(vec![], vec![])).wait().unwrap_err();
        assert!(matches!(err.error, TransportError::PeerClosed { .. } | TransportError::PeerFailed { .. }));
        // The context still serves new peers and releases the dead one's memory.
        drop(p.ep);
        let stats = p.ctx.stats().unwrap();
        assert_eq!(stats.imported_regions, 0, "{stats:?}");
    }
    peer(role) => {
        assert_eq!(role, "sleeper");
        let path = std::env::var(PATH_VAR).unwrap();
        let ctx = Context::new(Config::default()).unwrap();
        let ep = ctx.connect(&path).unwrap();
        // Take one message, then hang until killed.
        let _ = ep.recv().wait();
        std::thread::sleep(Duration::from_secs(120));
        return;
    },
}

/// The peer of the hang-up test: connects, says "ready", then receives until the
/// connection ends.
fn run_hangup_peer() {
    let path = std::env::var(PATH_VAR).expect("socket path");
    let ctx = Context::new(Config::default()).unwrap();
    let ep = ctx.connect(&path).expect("connect");
    ep.send(Message::new(b"ready".to_vec(), vec![])).wait().unwrap();
    while ep.recv().wait().is_ok() {}
}

peer_test! {
    /// A side that closes first while the peer may still read what it sent (described,
    /// not acknowledged) gets the message back only once the peer hung up: the peer,
    /// stopped, holds it back; resumed, it reads EOF, ends, and its socket closes.
    fn a_side_closing_first_gets_unacknowledged_sends_back_once_the_peer_hung_up(peers) {
        let p = start(&peers, "hangup");
        assert_eq!(p.ep.recv().wait().unwrap().header, b"ready");
        let mut stopped = PausedPeers::stop(std::slice::from_ref(&p.peer));
        let data = pattern(64 << 10, 5);
        let mut send = p.ep.send(Message::new(b"held".to_vec(), vec![data.clone().into()]));
        assert!(send.wait_timeout(Duration::from_millis(200)).is_none(), "a stopped peer acknowledges nothing");
        let Parent { _dir, ctx, mut peer, ep } = p;
        drop(ep);
        assert!(
            send.wait_timeout(Duration::from_millis(500)).is_none(),
            "back before the peer hung up: it could still be reading the message"
        );
        stopped.resume();
        let e = send
            .wait_timeout(Duration::from_secs(20))
            .expect("back once the peer hung up")
            .expect_err("the connection ended");
        assert!(matches!(e.error, TransportError::EndpointClosed), "{e}");
        let message = e.message.expect("the message comes back");
        assert_eq!(message.frames[0].as_host().expect("host").as_slice(), &data[..]);
        peer.wait_success(Duration::from_secs(30));
        drop(ctx);
    }
    "hangup" => run_hangup_peer(),
}
