//! Prepared transfers of host memory between two processes (the native lane, and the UCX
//! lane over TCP): spans checked once when prepared, posted again and again, run by
//! either side (the connector runs a listener's prepared transfer on the native lane,
//! the owner keeping it), each post moving its bytes anew; bad spans refused when
//! prepared; posts after the region was dropped or revoked refused.

mod common;

use common::onesided::{bytes, recv_key, registered, send_key};
use common::*;
use ferrylink::transport::onesided::{Access, Span};
use ferrylink::transport::{Endpoint, PreparedTransfer, TransportError};
use ferrylink::{Frame, Message};
use std::time::Duration;

type Parent = ListeningParent;

const MIB: usize = 1 << 20;

fn say(ep: &Endpoint, what: &[u8]) {
    ep.send(Message::new(what.to_vec(), vec![])).wait().unwrap();
}

fn expect(ep: &Endpoint, what: &[u8]) {
    assert_eq!(ep.recv().wait().unwrap().header, what);
}

/// 500 blocks of 1 KiB from a 1 MiB registration into every other KiB of a 1 MiB region,
/// in reverse order.
fn batch() -> Vec<Span> {
    (0..500u64).map(|i| Span { local_offset: i * 1024, remote_offset: (499 - i) * 2048, len: 1024 }).collect()
}

/// Whether `region` holds `source`'s blocks where `batch()` puts them.
fn holds_batch(region: &[u8], source: &[u8]) -> bool {
    batch().iter().all(|s| {
        let (r, l) = (s.remote_offset as usize, s.local_offset as usize);
        region[r..r + 1024] == source[l..l + 1024]
    })
}

/// Posts `prepared` with notification `note` and waits for it.
fn post(ep: &Endpoint, prepared: &PreparedTransfer, note: u8) {
    ep.post(prepared, Some(vec![note])).wait().unwrap();
}

/// The peer (the connector): imports the parent's region and runs its own prepared
/// transfers into it (two puts of different sources alternated, then a get), checks the
/// refusals; then owns a region the parent's prepared transfers write, reports what it
/// holds after each, and revokes it when told.
fn run_prepared_peer() {
    let (ctx, ep) = connect_from_env();
    let theirs = ep.import(&recv_key(&ep)).wait().unwrap();
    let (first, second) = (registered(&ctx, MIB, 71, Access::Read), registered(&ctx, MIB, 72, Access::Read));
    let a = ep.prepare_put_batch(&first, &theirs, &batch()).unwrap();
    let b = ep.prepare_put_batch(&second, &theirs, &batch()).unwrap();
    assert_eq!((a.span_count(), a.bytes(), a.is_put()), (500, 500 * 1024, true));
    for (note, prepared) in [(1, &a), (2, &b), (3, &a)] {
        post(&ep, prepared, note);
        expect(&ep, b"checked");
    }
    // A get of the blocks back, prepared: the region holds `first`'s blocks now.
    let landing = registered(&ctx, MIB, 73, Access::Write);
    let g = ep.prepare_get_batch(&landing, &theirs, &batch()).unwrap();
    assert!(!g.is_put());
    post(&ep, &g, 4);
    let (got, put, end) = (bytes(&landing), pattern(MIB, 71), 500 * 1024);
    assert!(got[..end] == put[..end], "the prepared get brought the put's bytes back");
    assert!(got[end..] == pattern(MIB, 73)[end..], "and nothing more");
    // Refused when prepared: outside the region, overlapping destinations, a get into
    // memory registered read-only.
    let outside = [Span { local_offset: 0, remote_offset: MIB as u64 - 8, len: 16 }];
    let overlapping = [Span::at(0, 64), Span::at(32, 64)];
    for spans in [&outside[..], &overlapping[..]] {
        let e = ep.prepare_put_batch(&first, &theirs, spans).unwrap_err();
        assert!(matches!(e, TransportError::InvalidMessage(_)), "{e}");
    }
    // After the region is dropped, posts fail (and nothing was written).
    drop(theirs);
    let e = ep.post(&a, None).wait().unwrap_err();
    assert!(matches!(e, TransportError::Revoked(_)), "{e}");
    say(&ep, b"dropped");

    // Now the parent's prepared transfers into this side's region.
    let mine = registered(&ctx, MIB, 70, Access::ReadWrite);
    send_key(&ep, &mine);
    for note in [11, 12, 13] {
        assert_eq!(ep.recv_notification().wait().unwrap().data, [note]);
        ep.send(Message::new(b"mine".to_vec(), vec![Frame::from(bytes(&mine).to_vec())])).wait().unwrap();
    }
    expect(&ep, b"revoke");
    drop(mine);
    say(&ep, b"revoked");
    expect(&ep, b"bye");
}

fn prepared_both_ways(peers: &Peers, transport: &str) {
    let p = Parent::start_onesided(peers, "prepared", transport, (transport == "ucx", false));
    let region = registered(&p.ctx, MIB, 80, Access::ReadWrite);
    send_key(&p.ep, &region);
    for note in [1u8, 2, 3] {
        assert_eq!(p.ep.recv_notification().wait().unwrap().data, [note]);
        let source = if note == 2 { 72 } else { 71 };
        assert!(holds_batch(bytes(&region), &pattern(MIB, source)), "post {note} moved its source's bytes");
        say(&p.ep, b"checked");
    }
    assert_eq!(p.ep.recv_notification().wait().unwrap().data, [4], "the prepared get notified its owner");
    expect(&p.ep, b"dropped");

    // This side (the listener on the native lane: the peer runs its transfers).
    let theirs = p.ep.import(&recv_key(&p.ep)).wait().unwrap();
    let (first, second) = (registered(&p.ctx, MIB, 81, Access::Read), registered(&p.ctx, MIB, 82, Access::Read));
    let a = p.ep.prepare_put_batch(&first, &theirs, &batch()).unwrap();
    let b = p.ep.prepare_put_batch(&second, &theirs, &batch()).unwrap();
    for (note, prepared, source) in [(11, &a, 81), (12, &b, 82), (13, &a, 81)] {
        post(&p.ep, prepared, note);
        let held = p.ep.recv().wait().unwrap();
        assert!(holds_batch(&frame_bytes(&held.frames[0]), &pattern(MIB, source)), "post {note}");
    }
    drop(b);
    say(&p.ep, b"revoke");
    expect(&p.ep, b"revoked");
    let e = p.ep.post(&a, None).wait().unwrap_err();
    assert!(matches!(e, TransportError::Revoked(_)), "{e}");
    say(&p.ep, b"bye");
    let mut p = p;
    p.peer.wait_success(Duration::from_secs(60));
}

peer_test! {
    fn prepared_transfers_run_both_ways_on_the_native_lane(peers) {
        prepared_both_ways(&peers, "native");
    }
    "prepared" => run_prepared_peer(),
}

peer_test! {
    fn prepared_transfers_run_both_ways_on_the_ucx_lane(peers) {
        let ucx = ferrylink::transport::Config::default().with_lane_policy("ucx".parse().unwrap());
        if ucx_context_or_skip_with(ucx).is_none() {
            return;
        }
        prepared_both_ways(&peers, "ucx");
    }
    "prepared" => run_prepared_peer(),
}
