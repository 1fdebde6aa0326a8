//! Prepared transfers of device memory between two processes on GPU 0, on the native
//! lane (the connector keeps each prepared transfer's span table: its own on the grant it
//! opened, the listener's with the listener's memory when it is a legacy IPC mapping)
//! and on the UCX lane: memory of three kinds (the exportable pool, one VMM chunk, an
//! exportable stream-ordered pool), 1000 blocks per transfer, the source rewritten
//! before each post so that every post must move its bytes anew, puts and gets, run by
//! either side. Every test needs a GPU: ignored unless built with `--features
//! gpu-tests`, failing without a device.

mod common;

use common::onesided::{device_memory, recv_key, send_key};
use common::*;
use ferrylink::transport::onesided::{Access, Registration, Span};
use ferrylink::transport::{Config, Context, Endpoint, PreparedTransfer};
use ferrylink::Message;
use std::time::Duration;

type Parent = ListeningParent;

const KIB: usize = 1 << 10;
/// Bytes of a source: 1000 blocks of 4 KiB.
const LEN: usize = 1000 * 4 * KIB;
/// Memory kinds: 0 the exportable pool, 1 one VMM chunk, 3 an exportable stream-ordered
/// pool.
const KINDS: [usize; 3] = [0, 1, 3];

fn register(ctx: &Context, kind: usize, len: usize, seed: u64, access: Access) -> Registration {
    ctx.register(device_memory(kind, len, seed), access).unwrap()
}

fn device_bytes(r: &Registration) -> Vec<u8> {
    r.frame().as_device().unwrap().to_vec().unwrap()
}

fn rewrite(r: &Registration, seed: u64) {
    r.frame().as_device().unwrap().copy_from_host(&pattern(LEN, seed)).unwrap();
}

fn say(ep: &Endpoint, what: &[u8]) {
    ep.send(Message::new(what.to_vec(), vec![])).wait().unwrap();
}

fn expect(ep: &Endpoint, what: &[u8]) {
    assert_eq!(ep.recv().wait().unwrap().header, what);
}

/// 1000 blocks of 4 KiB into every other block of a region of twice that, in reverse.
fn batch() -> Vec<Span> {
    let b = 4 * KIB as u64;
    (0..1000u64).map(|i| Span { local_offset: i * b, remote_offset: (999 - i) * 2 * b, len: b }).collect()
}

/// Whether `region` holds `source`'s blocks where `batch()` puts them.
fn holds_batch(region: &[u8], source: &[u8]) -> bool {
    batch().iter().all(|s| {
        let (r, l, n) = (s.remote_offset as usize, s.local_offset as usize, s.len as usize);
        region[r..r + n] == source[l..l + n]
    })
}

fn post(ep: &Endpoint, prepared: &PreparedTransfer, note: u8) {
    ep.post(prepared, Some(vec![note])).wait().unwrap();
}

/// The rounds of one prepared put: the source rewritten with seed `seed + round` before
/// each post.
const ROUNDS: u64 = 3;

/// The peer (the connector): for each kind, its own prepared put into the parent's
/// region (three posts, the source rewritten before each) and a prepared get back; then
/// the parent's prepared puts into a region of its own, reported after each.
fn run_prepared_device_peer() {
    let (ctx, ep) = connect_from_env();
    for kind in KINDS {
        let region = ep.import(&recv_key(&ep)).wait().unwrap();
        let source = register(&ctx, kind, LEN, 0, Access::Read);
        let put = ep.prepare_put_batch(&source, &region, &batch()).unwrap();
        for round in 0..ROUNDS {
            rewrite(&source, 1000 + round);
            post(&ep, &put, round as u8);
            expect(&ep, b"checked");
        }
        let landing = register(&ctx, kind, LEN, 7, Access::Write);
        let get = ep.prepare_get_batch(&landing, &region, &batch()).unwrap();
        post(&ep, &get, 99);
        assert!(device_bytes(&landing) == pattern(LEN, 1000 + ROUNDS - 1), "kind {kind}: the prepared get");
    }
    for kind in KINDS {
        let mine = register(&ctx, kind, 2 * LEN, 50, Access::ReadWrite);
        send_key(&ep, &mine);
        for round in 0..ROUNDS {
            assert_eq!(ep.recv_notification().wait().unwrap().data, [round as u8]);
            ep.send(Message::new(b"mine".to_vec(), vec![device_bytes(&mine).into()])).wait().unwrap();
        }
    }
    expect(&ep, b"bye");
}

fn prepared_device_both_ways(p: Parent) {
    for kind in KINDS {
        let region = register(&p.ctx, kind, 2 * LEN, 40, Access::ReadWrite);
        send_key(&p.ep, &region);
        for round in 0..ROUNDS {
            assert_eq!(p.ep.recv_notification().wait().unwrap().data, [round as u8]);
            let held = device_bytes(&region);
            assert!(holds_batch(&held, &pattern(LEN, 1000 + round)), "kind {kind}, the peer's post {round}");
            say(&p.ep, b"checked");
        }
        assert_eq!(p.ep.recv_notification().wait().unwrap().data, [99], "the prepared get notified");
    }
    for kind in KINDS {
        let theirs = p.ep.import(&recv_key(&p.ep)).wait().unwrap();
        let source = register(&p.ctx, kind, LEN, 0, Access::Read);
        let put = p.ep.prepare_put_batch(&source, &theirs, &batch()).unwrap();
        for round in 0..ROUNDS {
            rewrite(&source, 2000 + round);
            post(&p.ep, &put, round as u8);
            let held = frame_bytes(&p.ep.recv().wait().unwrap().frames[0]);
            assert!(holds_batch(&held, &pattern(LEN, 2000 + round)), "kind {kind}, this side's post {round}");
        }
    }
    say(&p.ep, b"bye");
    let mut p = p;
    p.peer.wait_success(Duration::from_secs(120));
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn prepared_device_transfers_run_both_ways_on_the_native_lane(peers) {
        require_gpu();
        prepared_device_both_ways(Parent::start_onesided(&peers, "peer", "native", (false, false)));
    }
    "peer" => run_prepared_device_peer(),
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn prepared_device_transfers_run_both_ways_on_the_ucx_lane(peers) {
        require_gpu();
        let ucx = Config::default().with_lane_policy("ucx".parse().unwrap());
        if ucx_context_or_skip_with(ucx).is_none() {
            return;
        }
        prepared_device_both_ways(Parent::start_onesided(&peers, "peer", "ucx", (true, false)));
    }
    "peer" => run_prepared_device_peer(),
}
