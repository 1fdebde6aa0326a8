//! A lying initiator against a real owner, on the native lane (host memory) and on the
//! UCX lane over TCP: it imports a 4 KiB registration honestly, then claims local memory
//! of a tebibyte and asks for `put`, `get`, a batch and a prepared transfer whose spans
//! fit that claim but run past the owner's region. The owner checks each span against its
//! own region's length, refuses every one with that reason, writes nothing, and keeps
//! serving the connection.

mod common;

use common::onesided::{bytes, registered};
use common::*;
use ferrylink::transport::onesided::{Access, Registration};
use ferrylink::transport::wire::{
    GrantedMemory, ImportAnswer, TransferMessage, TransferOp, TransferOutcome, WireMessage, WireSpan,
};
use ferrylink::transport::{Config, Context, Endpoint, Listener};
use ferrylink::Message;
use ferrylink_testkit::pattern;
use std::time::Duration;

/// The owner's region.
const REGION: u64 = 4096;
/// What the lying initiator claims its own memory holds.
const CLAIMED_LOCAL: u64 = 1 << 40;
/// The reason every lie below must get.
const OUTSIDE: &str = "lies outside the remote region of 4096 bytes";

/// A peer that speaks the control protocol by hand, on either lane.
trait RawControl {
    fn send(&mut self, message: &WireMessage);
    fn next(&mut self) -> Option<WireMessage>;
}

impl RawControl for RawPeer {
    fn send(&mut self, message: &WireMessage) {
        self.write(message);
    }
    fn next(&mut self) -> Option<WireMessage> {
        self.read_message()
    }
}

impl RawControl for RawUcxPeer {
    fn send(&mut self, message: &WireMessage) {
        self.write(message);
    }
    fn next(&mut self) -> Option<WireMessage> {
        self.read_message(Duration::from_secs(10))
    }
}

/// Imports `owner`'s key honestly: the grant's id.
fn import(raw: &mut dyn RawControl, owner: &Registration) -> u64 {
    raw.send(&WireMessage::ImportKey { request: 1, key: owner.key().to_bytes().to_vec() });
    loop {
        match raw.next() {
            Some(WireMessage::ImportAnswer { request: 1, answer: ImportAnswer::Granted(region) }) => {
                assert_eq!(region.len, REGION);
                return region.grant;
            }
            Some(WireMessage::ImportAnswer { answer, .. }) => panic!("import refused: {answer:?}"),
            Some(_) => {}
            None => panic!("the owner did not answer the import"),
        }
    }
}

/// The owner's answer to transfer `id`.
fn outcome_of(raw: &mut dyn RawControl, id: u64) -> TransferOutcome {
    loop {
        match raw.next() {
            Some(WireMessage::TransferDone { id: done, outcome }) if done == id => return outcome,
            Some(_) => {}
            None => panic!("the owner did not answer transfer {id}"),
        }
    }
}

/// Spans that fit the claimed local memory, the last running 56 bytes past the region.
fn lying_spans(count: u64) -> Vec<WireSpan> {
    let mut spans: Vec<_> =
        (0..count - 1).map(|i| WireSpan { local_offset: i * 8, remote_offset: i * 8, len: 8 }).collect();
    spans.push(WireSpan { local_offset: (count - 1) * 8, remote_offset: REGION - 8, len: 64 });
    spans
}

fn lie(id: u64, op: TransferOp, grant: u64, local: &GrantedMemory, spans: Vec<WireSpan>) -> Box<TransferMessage> {
    Box::new(TransferMessage { id, op, grant, local: local.clone(), local_len: CLAIMED_LOCAL, spans, notify: None })
}

/// Every lie, each answered as refused for running past the region; the region is
/// untouched and the connection still answers.
fn lies_are_refused(raw: &mut dyn RawControl, owner: &Registration, local: GrantedMemory) {
    let before = bytes(owner).to_vec();
    let grant = import(raw, owner);
    let asks = [
        ("put", lie(1, TransferOp::Put, grant, &local, lying_spans(1))),
        ("get", lie(2, TransferOp::Get, grant, &local, lying_spans(1))),
        ("batched put", lie(3, TransferOp::Put, grant, &local, lying_spans(4))),
        ("batched get", lie(4, TransferOp::Get, grant, &local, lying_spans(4))),
    ];
    for (what, t) in asks {
        let id = t.id;
        raw.send(&WireMessage::Transfer(t));
        match outcome_of(raw, id) {
            TransferOutcome::Failed(reason) => assert!(reason.contains(OUTSIDE), "{what}: {reason}"),
            TransferOutcome::Done => panic!("{what}: the owner ran a transfer past its region"),
        }
    }
    for (prepared, op) in [(10, TransferOp::Put), (11, TransferOp::Get)] {
        raw.send(&WireMessage::Prepare(lie(prepared, op, grant, &local, lying_spans(3))));
        let run = prepared + 10;
        raw.send(&WireMessage::RunPrepared { id: run, prepared, notify: None });
        match outcome_of(raw, run) {
            TransferOutcome::Failed(reason) => assert!(reason.contains(OUTSIDE), "prepared {op:?}: {reason}"),
            TransferOutcome::Done => panic!("prepared {op:?}: the owner ran a transfer past its region"),
        }
    }
    assert_eq!(bytes(owner), &before[..], "the owner's region is untouched");
}

fn config() -> Config {
    Config::default().with_connect_timeout(Duration::from_secs(5)).with_request_timeout(Duration::from_secs(10))
}

/// The owner's endpoint for the raw peer still carries a message to it.
fn assert_still_serving(raw: &mut dyn RawControl, ep: &Endpoint) {
    let _sent = ep.send(Message::new(b"still serving".to_vec(), vec![]));
    loop {
        match raw.next() {
            Some(WireMessage::Data(d)) => return assert_eq!(d.header, b"still serving"),
            Some(_) => {}
            None => panic!("the owner's endpoint no longer serves the peer"),
        }
    }
}

#[test]
fn a_lying_initiator_cannot_reach_past_the_owners_host_region_on_the_native_lane() {
    let dir = socket_dir();
    let ctx = Context::new(config()).unwrap();
    let listener = Listener::bind(&ctx, dir.path().join("p/owner.sock")).unwrap();
    let owner = registered(&ctx, REGION as usize, 5, Access::ReadWrite);
    let liar_ctx = Context::new(config()).unwrap();
    let mut raw = RawPeer::handshaken(listener.path(), liar_ctx.local_hello());
    let ep = listener.accept_timeout(Duration::from_secs(5)).expect("the raw peer is accepted");
    lies_are_refused(&mut raw, &owner, GrantedMemory::Host { region_id: 77, offset: 0 });
    assert_still_serving(&mut raw, &ep);
    assert_eq!(bytes(&owner), &pattern(REGION as usize, 5)[..]);
}

#[test]
fn a_lying_initiator_cannot_reach_past_the_owners_host_region_on_the_ucx_lane() {
    // Staged, as the owner runs every transfer of a staged grant itself.
    let owner_config = config().with_lane_policy("ucx".parse().unwrap()).with_ucx_rma(true).with_ucx_staged(true);
    let Some(ctx) = ucx_context_or_skip_with(owner_config) else { return };
    let listener = Listener::bind_tcp(&ctx, "127.0.0.1:0").unwrap();
    let owner = registered(&ctx, REGION as usize, 6, Access::ReadWrite);
    let addr = format!("tcp:{}", listener.tcp_addr().expect("a TCP listener"));
    let mut raw = RawUcxPeer::handshaken(&addr);
    let ep = listener.accept_timeout(Duration::from_secs(5)).expect("the raw peer is accepted");
    let staging = GrantedMemory::Staging { address: 0x1000, rkey: vec![1; 16], device: false };
    lies_are_refused(&mut raw, &owner, staging);
    assert_still_serving(&mut raw, &ep);
    assert_eq!(bytes(&owner), &pattern(REGION as usize, 6)[..]);
}
