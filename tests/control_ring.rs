//! Control rings: a Unix-socket connection's control messages through shared memory
//! (`ferrylink_ipc::control_ring`, `transport/src/engine/channel.rs`): when they are used,
//! that messages passing descriptors stay in order with them, that messages larger than
//! a ring go through, that a sleeping peer is woken, and that a peer offering unusable
//! rings or corrupting them is handled.

mod common;

use common::*;
use ferrylink::ipc::control_ring::ControlRingMemory;
use ferrylink::ipc::shared_host_buffer;
use ferrylink::transport::wire::{encode_frame, DataMessage, WireMessage};
use ferrylink::transport::{Config, Context, Endpoint, Listener, TransportError};
use ferrylink::{Frame, HostBuffer, Message};
use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

fn config(ring_bytes: usize) -> Config {
    Config::default().with_control_ring_bytes(ring_bytes)
}

struct Pair {
    _dir: tempfile::TempDir,
    _listener: Listener,
    _contexts: (Context, Context),
    server: Endpoint,
    client: Endpoint,
}

/// A listener with `server` and a client with `client`, in this process, connected.
fn pair(server: Config, client: Config) -> Pair {
    let dir = socket_dir();
    let sctx = Context::new(server).unwrap();
    let listener = Listener::bind(&sctx, dir.path().join("private/s.sock")).unwrap();
    let cctx = Context::new(client).unwrap();
    let client = cctx.connect(listener.path()).expect("connect");
    let server = listener.accept_timeout(Duration::from_secs(10)).expect("accept");
    Pair { _dir: dir, _listener: listener, _contexts: (sctx, cctx), server, client }
}

/// A message with a header, an inline frame and a frame in its own shared region (whose
/// descriptor travels with it).
fn message(seed: u64, header_len: usize) -> Message {
    let mut shared = shared_host_buffer(100_000).unwrap();
    shared.as_mut_slice().copy_from_slice(&pattern(100_000, seed));
    let inline = HostBuffer::from_vec(pattern(1000, seed + 1));
    Message::new(pattern(header_len, seed), vec![Frame::Host(inline), Frame::Host(shared)])
}

fn check(got: &Message, seed: u64, header_len: usize) {
    assert_eq!(got.header, pattern(header_len, seed), "header of message {seed}");
    assert_eq!(got.frames.len(), 2);
    assert_eq!(got.frames[0].as_host().unwrap().as_slice(), &pattern(1000, seed + 1)[..]);
    assert_eq!(got.frames[1].as_host().unwrap().as_slice(), &pattern(100_000, seed)[..], "frame of message {seed}");
}

/// `rounds` messages each way, every one in a new shared region.
fn exchange(p: &Pair, rounds: u64, header_len: usize) {
    for i in 0..rounds {
        let recv = p.server.recv();
        p.client.send(message(i, header_len)).wait().expect("client send");
        check(&recv.wait().expect("server recv"), i, header_len);
        let recv = p.client.recv();
        p.server.send(message(i + 100, header_len)).wait().expect("server send");
        check(&recv.wait().expect("client recv"), i + 100, header_len);
    }
}

#[test]
fn rings_are_used_by_default_and_either_side_can_turn_them_off() {
    for (server, client, rings) in [(1 << 20, 1 << 20, true), (1 << 20, 0, false), (0, 1 << 20, false)] {
        let p = pair(config(server), config(client));
        assert_eq!(p.server.uses_control_ring(), rings, "server {server} / client {client}");
        assert_eq!(p.client.uses_control_ring(), rings, "server {server} / client {client}");
        exchange(&p, 20, 64);
        assert!(p.client.stats().fds_sent >= 20, "every message passed its region's descriptor");
    }
    assert!(Config::default().control_ring_bytes > 0, "rings are on by default");
}

#[test]
fn a_message_larger_than_the_ring_goes_through_in_pieces() {
    let p = pair(config(4096), config(4096));
    assert!(p.client.uses_control_ring());
    // Headers of 200 kB in rings of 4 KiB: each message takes dozens of fills.
    exchange(&p, 10, 200_000);
}

#[test]
fn a_peer_asleep_on_its_ring_is_woken_over_the_socket() {
    // No busy polling: each progress thread goes to sleep as soon as it is idle, and only
    // a wake-up over the socket brings it back before its next tick.
    let quiet = config(1 << 16).with_busy_poll(Duration::ZERO);
    let p = pair(quiet.clone(), quiet);
    assert!(p.client.uses_control_ring());
    // Messages without descriptors: a message that passes some sends them ahead on the
    // socket, which wakes the peer by itself.
    for i in 0..5u64 {
        let recv = p.server.recv();
        std::thread::sleep(Duration::from_millis(20));
        let inline = HostBuffer::from_vec(pattern(1000, i));
        p.client.send(Message::new(pattern(16, i), vec![Frame::Host(inline)])).wait().expect("send");
        let got = recv.wait().expect("recv");
        assert_eq!((got.header, got.frames[0].as_host().unwrap().to_vec()), (pattern(16, i), pattern(1000, i)));
    }
    // (Whether the server's acks find the client asleep is a race: it may still be awake
    // from its send.)
    let client = p.client.stats();
    assert!(client.wakes_sent >= 5, "the client woke the sleeping server for each message: {client:?}");
}

/// Connects by hand, offering rings of `ring_bytes` with `fd` (if any); the `Welcome`'s
/// answer and the raw peer.
fn offer(listener: &Listener, ctx: &Context, ring_bytes: u64, fd: Option<std::os::fd::RawFd>) -> (bool, RawPeer) {
    let mut raw = RawPeer::connect(listener.path());
    let mut hello = ctx.local_hello().clone();
    hello.control_ring = Some(ring_bytes);
    match fd {
        Some(fd) => raw.write_with_fds(&WireMessage::Hello(hello), &[fd]),
        None => raw.write(&WireMessage::Hello(hello)),
    }
    match raw.read_message() {
        Some(WireMessage::Welcome { control_ring, .. }) => (control_ring, raw),
        other => panic!("expected a Welcome, got {other:?}"),
    }
}

fn data(seq: u64, header: &[u8]) -> WireMessage {
    WireMessage::Data(DataMessage { seq, header: header.to_vec(), frames: Vec::new() })
}

#[test]
fn unusable_rings_are_declined_and_the_socket_carries_on() {
    let dir = socket_dir();
    let ctx = Context::new(Config::default()).unwrap();
    let listener = Listener::bind(&ctx, dir.path().join("private/s.sock")).unwrap();
    let (pipe_r, _pipe_w) = nix::unistd::pipe().unwrap();
    let too_big = ControlRingMemory::create(8192).unwrap();
    let fine = ControlRingMemory::create(4096).unwrap();
    let cases: [(&str, u64, Option<std::os::fd::RawFd>); 4] = [
        ("a pipe", 4096, Some(pipe_r.as_raw_fd())),
        ("a memfd of another size", 4096, Some(too_big.fd().as_raw_fd())),
        ("no descriptor", 4096, None),
        ("a size that is no power of two", 5000, Some(fine.fd().as_raw_fd())),
    ];
    for (what, bytes, fd) in cases {
        let (taken, mut raw) = offer(&listener, &ctx, bytes, fd);
        assert!(!taken, "rings offered with {what} were taken");
        let ep = listener.accept_timeout(Duration::from_secs(10)).expect("accept");
        assert!(!ep.uses_control_ring());
        raw.write(&data(0, what.as_bytes()));
        let got = ep.recv().wait().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(got.header, what.as_bytes(), "the socket still works after declining {what}");
    }
}

#[test]
fn a_peer_that_corrupts_its_ring_is_failed_not_trusted() {
    use ferrylink::ipc::control_ring::Direction;
    let dir = socket_dir();
    let ctx = Context::new(Config::default()).unwrap();
    let listener = Listener::bind(&ctx, dir.path().join("private/s.sock")).unwrap();
    let memory = ControlRingMemory::create(4096).unwrap();
    let (taken, mut raw) = offer(&listener, &ctx, 4096, Some(memory.fd().as_raw_fd()));
    assert!(taken);
    let ep = listener.accept_timeout(Duration::from_secs(10)).expect("accept");
    assert!(ep.uses_control_ring());
    // A well-formed message through the ring arrives.
    let mut writer = memory.writer(Direction::ConnectorToAcceptor);
    let frame = encode_frame(&data(0, b"through the ring"));
    assert_eq!(writer.write(&frame).unwrap(), frame.len());
    raw.write(&WireMessage::Wake);
    assert_eq!(ep.recv().wait().expect("ring message").header, b"through the ring");
    // Then the "peer" claims to have written far more than the ring holds.
    let len = std::num::NonZeroUsize::new(4096 + 2 * 4096).unwrap();
    // SAFETY: a fresh shared mapping of the ring memfd, unmapped below; the head index of
    // the connector's ring is its first 8 bytes (the layout of `ferrylink_ipc::control_ring`).
    unsafe {
        let ptr = nix::sys::mman::mmap(
            None,
            len,
            nix::sys::mman::ProtFlags::PROT_READ | nix::sys::mman::ProtFlags::PROT_WRITE,
            nix::sys::mman::MapFlags::MAP_SHARED,
            memory.fd().as_fd(),
            0,
        )
        .unwrap();
        (*(ptr.as_ptr() as *const std::sync::atomic::AtomicU64)).store(1 << 40, std::sync::atomic::Ordering::SeqCst);
        nix::sys::mman::munmap(ptr, len.get()).unwrap();
    }
    raw.write(&WireMessage::Wake);
    let err = ep.recv().wait().expect_err("a corrupted ring fails the connection");
    match &err.error {
        TransportError::PeerFailed { reason, .. } => assert!(reason.contains("corrupted"), "{reason}"),
        other => panic!("expected PeerFailed, got {other:?}"),
    }
}

/// Message `i` of a stream: a header of varying length, and every third one a frame in
/// its own shared region (its descriptor travels on the socket, ahead of the ring bytes).
fn stream_message(i: usize, seed: u64) -> Message {
    let header = pattern(16 + (i * 997) % 20_000, seed + i as u64);
    let mut frames = vec![Frame::Host(HostBuffer::from_vec(pattern(100 + i % 3000, i as u64)))];
    if i.is_multiple_of(3) {
        let mut shared = shared_host_buffer(10_000 + i).unwrap();
        shared.as_mut_slice().copy_from_slice(&pattern(10_000 + i, seed ^ i as u64));
        frames.push(Frame::Host(shared));
    }
    Message::new(header, frames)
}

fn check_stream_message(got: &Message, i: usize, seed: u64) {
    let want = stream_message(i, seed);
    assert_eq!(got.header, want.header, "header of message {i}");
    assert_eq!(got.frames.len(), want.frames.len(), "frames of message {i}");
    for (g, w) in got.frames.iter().zip(&want.frames) {
        assert_eq!(g.as_host().unwrap().as_slice(), w.as_host().unwrap().as_slice(), "frame of message {i}");
    }
}

/// Sends `n` stream messages, keeping up to 8 in flight.
fn send_stream(ep: &Endpoint, n: usize, seed: u64) {
    let mut in_flight = std::collections::VecDeque::new();
    for i in 0..n {
        in_flight.push_back(ep.send(stream_message(i, seed)));
        if in_flight.len() > 8 {
            in_flight.pop_front().unwrap().wait().expect("send");
        }
    }
    for r in in_flight {
        r.wait().expect("send");
    }
}

#[test]
fn traffic_both_ways_through_tiny_rings_arrives_whole_and_in_order() {
    // Rings of 4 KiB against headers of up to 20 kB, several messages in flight each way,
    // descriptors on every third message, and no busy polling (every idle moment is a
    // sleep that a wake-up must end).
    let tiny = config(4096).with_busy_poll(Duration::ZERO);
    let p = pair(tiny.clone(), tiny);
    assert!(p.client.uses_control_ring());
    const N: usize = 300;
    std::thread::scope(|s| {
        s.spawn(|| send_stream(&p.client, N, 1));
        s.spawn(|| send_stream(&p.server, N, 2));
        s.spawn(|| (0..N).for_each(|i| check_stream_message(&p.server.recv().wait().expect("server recv"), i, 1)));
        (0..N).for_each(|i| check_stream_message(&p.client.recv().wait().expect("client recv"), i, 2));
    });
}
