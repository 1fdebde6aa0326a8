//! Malformed and hostile input to a listener and an endpoint: each is rejected with a
//! clear error, and the context keeps serving other endpoints.

mod common;

use common::*;
use ferrylink::ipc::fd_passing::send_with_fds;
use ferrylink::transport::wire::{
    encode_frame, AckResult, DataMessage, DeviceFrameDescriptor, DeviceMemory, FrameDescriptor, Hello,
    RegionAnnouncement, RegionKind, WireMessage, FRAME_PREFIX_LEN, MAGIC, PROTOCOL_VERSION,
};
use ferrylink::transport::{Config, Context, Endpoint, Listener, TransportError};
use ferrylink::Message;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

struct Server {
    _dir: tempfile::TempDir,
    ctx: Context,
    listener: Listener,
}

fn server() -> Server {
    let dir = socket_dir();
    let ctx = Context::new(Config::default().with_connect_timeout(Duration::from_secs(2))).unwrap();
    let listener = Listener::bind(&ctx, dir.path().join("p/s.sock")).unwrap();
    Server { _dir: dir, ctx, listener }
}

/// A raw client that completed the handshake, and the server's endpoint for it.
fn handshaken(s: &Server) -> (UnixStream, Endpoint) {
    let mut raw = UnixStream::connect(s.listener.path()).unwrap();
    raw.write_all(&encode_frame(&WireMessage::Hello(s.ctx.local_hello().clone()))).unwrap();
    let ep = s.listener.accept_timeout(Duration::from_secs(5)).unwrap();
    let mut prefix = [0u8; FRAME_PREFIX_LEN];
    raw.read_exact(&mut prefix).unwrap();
    let len = u32::from_le_bytes(prefix[8..12].try_into().unwrap()) as usize;
    let mut body = vec![0; len];
    raw.read_exact(&mut body).unwrap();
    (raw, ep)
}

/// The server's endpoint reports a peer failure whose text contains `needle`.
fn assert_endpoint_failed(ep: &Endpoint, needle: &str) {
    let err = ep.recv().wait().unwrap_err();
    match &err.error {
        TransportError::PeerFailed { reason, .. } => assert!(reason.contains(needle), "{reason:?} lacks {needle:?}"),
        other => panic!("expected a peer failure mentioning {needle:?}, got {other}"),
    }
}

/// A good client can still connect and exchange a message.
fn assert_still_serving(s: &Server) {
    let client = s.ctx.connect(s.listener.path()).unwrap();
    let server_ep = s.listener.accept_timeout(Duration::from_secs(5)).unwrap();
    client.send(Message::new(b"ok".to_vec(), vec![pattern(100_000, 1).into()])).wait().unwrap();
    let got = server_ep.recv().wait().unwrap();
    assert_eq!(got.header, b"ok");
    assert_eq!(got.frames[0].as_host().unwrap().as_slice(), &pattern(100_000, 1)[..]);
}

fn raw_frame(version: u16, body: &[u8]) -> Vec<u8> {
    let mut f = MAGIC.to_vec();
    f.extend_from_slice(&version.to_le_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(&(body.len() as u32).to_le_bytes());
    f.extend_from_slice(body);
    f
}

/// The server closes the connection (possibly after a Reject frame) within 5 s: the
/// bytes it wrote before the end of the stream. A connection still open after 5 s fails.
fn expect_closed(raw: UnixStream) -> Vec<u8> {
    match read_until_closed(raw, Duration::from_secs(5)) {
        Ok(bytes) => bytes,
        Err((bytes, e)) => panic!("the server did not close the connection ({e}); it wrote {} bytes", bytes.len()),
    }
}

#[test]
fn garbage_before_the_handshake_is_dropped() {
    let s = server();
    let inputs: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        pattern(4096, 7),
        raw_frame(PROTOCOL_VERSION + 1, b"\0"),
        raw_frame(PROTOCOL_VERSION, &[0xff; 64]),
        {
            let mut f = raw_frame(PROTOCOL_VERSION, b"");
            f[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
            f
        },
        // A valid Data message where a Hello is due.
        encode_frame(&WireMessage::Data(DataMessage { seq: 0, header: vec![], frames: vec![] })),
    ];
    for input in inputs {
        let mut raw = UnixStream::connect(s.listener.path()).unwrap();
        raw.write_all(&input).unwrap();
        expect_closed(raw);
    }
    assert!(s.listener.accept_timeout(Duration::from_millis(200)).is_err(), "no endpoint from garbage");
    assert_still_serving(&s);
}

#[test]
fn a_silent_client_is_dropped_after_the_connect_timeout() {
    let s = server();
    let raw = UnixStream::connect(s.listener.path()).unwrap();
    let start = std::time::Instant::now();
    expect_closed(raw);
    assert!(start.elapsed() < Duration::from_secs(5), "closed after {:?}", start.elapsed());
    assert_still_serving(&s);
}

#[test]
fn an_unknown_version_hello_is_refused_with_a_reason() {
    let s = server();
    let mut hello: Hello = s.ctx.local_hello().clone();
    hello.protocol_version = 77;
    let mut raw = UnixStream::connect(s.listener.path()).unwrap();
    raw.write_all(&encode_frame(&WireMessage::Hello(hello))).unwrap();
    let reply = expect_closed(raw);
    let text = String::from_utf8_lossy(&reply);
    assert!(text.contains("protocol versions differ"), "reply: {text:?}");
    assert_still_serving(&s);
}

#[test]
fn a_second_handshake_closes_the_endpoint() {
    let s = server();
    let (mut raw, ep) = handshaken(&s);
    raw.write_all(&encode_frame(&WireMessage::Hello(s.ctx.local_hello().clone()))).unwrap();
    assert_endpoint_failed(&ep, "second handshake");
    assert_still_serving(&s);
}

#[test]
fn descriptors_that_lie_close_the_endpoint() {
    let s = server();
    let cases: Vec<(Vec<FrameDescriptor>, &str)> = vec![
        (vec![FrameDescriptor::HostRegion { region_id: 99, offset: 0, len: 10 }], "unknown region"),
        (vec![FrameDescriptor::HostRegion { region_id: 1, offset: 4000, len: 200 }], "lies outside region"),
        (vec![FrameDescriptor::HostRegion { region_id: 1, offset: u64::MAX, len: 2 }], "overflows"),
    ];
    for (frames, needle) in cases {
        let (mut raw, ep) = handshaken(&s);
        // Announce a real, sealed 4096-byte region first.
        let region = ferrylink::ipc::MemfdRegion::create("test", 4096).unwrap();
        let announce = encode_frame(&WireMessage::Regions(vec![RegionAnnouncement::host(1, 4096)]));
        send_with_fds(&raw, &announce, &[region.fd().as_raw_fd()]).unwrap();
        let data = WireMessage::Data(DataMessage { seq: 0, header: vec![], frames });
        raw.write_all(&encode_frame(&data)).unwrap();
        assert_endpoint_failed(&ep, needle);
    }
    assert_still_serving(&s);
}

#[test]
fn bad_region_announcements_close_the_endpoint() {
    let s = server();
    // An fd that is not a memfd.
    let (raw, ep) = handshaken(&s);
    let file = tempfile::tempfile().unwrap();
    let announce = encode_frame(&WireMessage::Regions(vec![RegionAnnouncement::host(1, 0)]));
    send_with_fds(&raw, &announce, &[file.as_raw_fd()]).unwrap();
    assert_endpoint_failed(&ep, "not a memfd");
    // A region announced without its fd.
    let (mut raw, ep) = handshaken(&s);
    raw.write_all(&announce).unwrap();
    assert_endpoint_failed(&ep, "descriptors arrived");
    // A region whose announced size is a lie.
    let (raw, ep) = handshaken(&s);
    let region = ferrylink::ipc::MemfdRegion::create("test", 4096).unwrap();
    let announce = encode_frame(&WireMessage::Regions(vec![RegionAnnouncement::host(1, 1 << 30)]));
    send_with_fds(&raw, &announce, &[region.fd().as_raw_fd()]).unwrap();
    assert_endpoint_failed(&ep, "announced as");
    assert_still_serving(&s);
}

#[test]
fn bad_device_region_announcements_close_the_endpoint() {
    let s = server();
    let vmm = RegionKind::DeviceVmmChunk { device_uuid: [0; 16] };
    let pool = RegionKind::DevicePool { device_uuid: [0; 16] };
    let cases = [
        (RegionAnnouncement { region_id: 1, len: 0, kind: vmm }, "would exceed"),
        (RegionAnnouncement { region_id: 1, len: u64::MAX, kind: vmm }, "would exceed"),
        (RegionAnnouncement { region_id: 1, len: 4096, kind: pool }, "claims a length"),
        // A memfd is no VMM handle: refused without CUDA, and by the import with it.
        (RegionAnnouncement { region_id: 1, len: 4096, kind: vmm }, "device region 1"),
        (RegionAnnouncement { region_id: 1, len: 0, kind: pool }, "device region 1"),
    ];
    for (announcement, needle) in cases {
        let (raw, ep) = handshaken(&s);
        let region = ferrylink::ipc::MemfdRegion::create("test", 4096).unwrap();
        let announce = encode_frame(&WireMessage::Regions(vec![announcement]));
        send_with_fds(&raw, &announce, &[region.fd().as_raw_fd()]).unwrap();
        assert_endpoint_failed(&ep, needle);
    }
    assert_still_serving(&s);
}

#[test]
fn device_frames_in_regions_never_announced_are_refused_or_close_the_endpoint() {
    let s = server();
    let cases = [
        DeviceMemory::Vmm { chunks: vec![(1 << 63) | 5] },
        DeviceMemory::PoolPointer { pool: (1 << 63) | 6, export: [1; 64], alloc_len: 4096 },
    ];
    for memory in cases {
        let (mut raw, ep) = handshaken(&s);
        let frame = FrameDescriptor::Device(DeviceFrameDescriptor {
            memory,
            offset: 0,
            len: 4096,
            device_uuid: [0; 16],
            event: None,
        });
        raw.write_all(&encode_frame(&WireMessage::Data(DataMessage { seq: 0, header: vec![], frames: vec![frame] })))
            .unwrap();
        if ferrylink::memory::cuda::device_count() > 0 {
            assert_endpoint_failed(&ep, "never announced");
            continue;
        }
        // Without CUDA the message is refused with a reason, and nothing is delivered.
        let mut peer = RawPeer::from_stream(raw);
        match peer.read_message() {
            Some(WireMessage::Ack { seq: 0, result: AckResult::Refused(reason) }) => {
                assert!(reason.contains("CUDA"), "{reason}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert!(ep.recv().wait_timeout(Duration::from_millis(200)).is_none(), "nothing is delivered");
    }
    assert_still_serving(&s);
}

#[test]
fn out_of_order_and_oversized_data_close_the_endpoint() {
    let s = server();
    let (mut raw, ep) = handshaken(&s);
    raw.write_all(&encode_frame(&WireMessage::Data(DataMessage { seq: 5, header: vec![], frames: vec![] }))).unwrap();
    assert_endpoint_failed(&ep, "arrived where 0 was due");
    let (mut raw, ep) = handshaken(&s);
    let frames = vec![FrameDescriptor::Inline(vec![]); Config::default().max_frames + 1];
    raw.write_all(&encode_frame(&WireMessage::Data(DataMessage { seq: 0, header: vec![], frames }))).unwrap();
    assert_endpoint_failed(&ep, "frames");
    let (mut raw, ep) = handshaken(&s);
    raw.write_all(&encode_frame(&WireMessage::Ack {
        seq: 3,
        result: ferrylink::transport::wire::AckResult::Delivered,
    }))
    .unwrap();
    assert_endpoint_failed(&ep, "unknown message 3");
    assert_still_serving(&s);
}

#[test]
fn push_messages_out_of_turn_close_the_endpoint() {
    let s = server();
    // The raw client said (in its Hello) that the connector copies: the listener is a
    // push target. A PushDone for nothing it awaits is a lie.
    let (mut raw, ep) = handshaken(&s);
    raw.write_all(&encode_frame(&WireMessage::PushDone { seq: 5 })).unwrap();
    assert_endpoint_failed(&ep, "out of turn");
    // A listener never receives PushTargets: only a connector fills buffers.
    let (mut raw, ep) = handshaken(&s);
    raw.write_all(&encode_frame(&WireMessage::PushTargets { seq: 0, targets: vec![] })).unwrap();
    assert_endpoint_failed(&ep, "unexpected message PushTargets");
    // A push frame from a peer that said the receiver copies.
    let mut hello: Hello = s.ctx.local_hello().clone();
    hello.device_copies = ferrylink::transport::wire::WireCopies::Receiver;
    let mut raw = UnixStream::connect(s.listener.path()).unwrap();
    raw.write_all(&encode_frame(&WireMessage::Hello(hello))).unwrap();
    let ep = s.listener.accept_timeout(Duration::from_secs(5)).unwrap();
    let frames = vec![FrameDescriptor::DevicePush { len: 16 }];
    raw.write_all(&encode_frame(&WireMessage::Data(DataMessage { seq: 0, header: vec![], frames }))).unwrap();
    assert_endpoint_failed(&ep, "no push target");
    assert_still_serving(&s);
}

#[test]
fn lies_about_push_offers_close_the_endpoint() {
    let s = server();
    // The listener made no offer: declining one, or filling one, is a lie.
    let (mut raw, ep) = handshaken(&s);
    raw.write_all(&encode_frame(&WireMessage::DeclineOffer { offer: 0 })).unwrap();
    assert_endpoint_failed(&ep, "decline of unknown push offer 0");
    let (mut raw, ep) = handshaken(&s);
    let frames = vec![FrameDescriptor::DeviceOffered { offer: 3, index: 0, len: 16, ready: None, gate: None }];
    raw.write_all(&encode_frame(&WireMessage::Data(DataMessage { seq: 0, header: vec![], frames }))).unwrap();
    assert_endpoint_failed(&ep, "fills unknown push offer 3");
    // A listener never receives offers: only it makes them.
    let (mut raw, ep) = handshaken(&s);
    raw.write_all(&encode_frame(&WireMessage::PushOffer { offer: 0, targets: vec![], for_seq: None })).unwrap();
    assert_endpoint_failed(&ep, "push offer to a side that does not push");
    assert_still_serving(&s);
}
