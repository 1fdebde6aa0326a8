//! One-sided transfers of host memory between two processes (the native lane, and the
//! UCX lane over TCP): registrations, keys shipped in a message, imports, `put` and
//! `get` run by either side, batches, notifications, refusals, revocation, a killed owner.

mod common;

use common::onesided::{bytes, recv_key, registered, send_key};
use common::*;
use ferrylink::ipc::shared_host_buffer;
use ferrylink::transport::onesided::{Access, RemoteKey, Span};
use ferrylink::transport::{Config, Context, TransportError};
use ferrylink::{Frame, Message};
use std::time::{Duration, Instant};

type Parent = ListeningParent;

const MIB: usize = 1 << 20;

/// Listens, starts the peer in `role` with `transport` as its FERRYLINK_TRANSPORT (on the
/// UCX lane both sides turn RMA on, which one-sided transfers there need).
fn start(peers: &Peers, role: &str, transport: &str) -> Parent {
    start_with_rma(peers, role, transport, transport == "ucx")
}

fn start_with_rma(peers: &Peers, role: &str, transport: &str, rma: bool) -> Parent {
    start_with(peers, role, transport, (rma, false))
}

/// As `start`, with RMA as given and, when `staged`, every one-sided transfer over UCX
/// through pinned host memory on both sides (`FERRYLINK_UCX_STAGED=1`).
fn start_with(peers: &Peers, role: &str, transport: &str, rma_staged: (bool, bool)) -> Parent {
    Parent::start_onesided(peers, role, transport, rma_staged)
}

/// A config that needs the UCX lane (without UCX the tests skip, or fail under
/// `FERRYLINK_REQUIRE_UCX=1`).
fn ucx_only() -> Config {
    Config::default().with_lane_policy("ucx".parse().unwrap())
}

/// 1000 blocks of 1 KiB from a 1 MiB registration into a 2 MiB region: every other
/// block of the region (gaps between), in reverse order.
fn batch() -> Vec<Span> {
    (0..1000u64).map(|i| Span { local_offset: i * 1024, remote_offset: (999 - i) * 2048, len: 1024 }).collect()
}

/// Checks what `batch()` wrote from `source` into `target`, and the gaps it left.
fn check_batch(target: &[u8], source: &[u8], untouched: &[u8]) {
    for (i, s) in batch().iter().enumerate() {
        let (r, l) = (s.remote_offset as usize, s.local_offset as usize);
        assert!(target[r..r + 1024] == source[l..l + 1024], "block {i}");
        assert!(target[r + 1024..r + 2048] == untouched[r + 1024..r + 2048], "the gap after block {i}");
    }
}

/// The peer: registers its own memory and sends the key; imports the parent's key, puts
/// a batch into it with a notification, gets a span back (notifying the owner); then serves the parent's
/// transfers into its own memory until "bye", and reports what its region holds.
fn run_owner_and_initiator() {
    let (ctx, ep) = connect_from_env();
    let mine = registered(&ctx, 2 * MIB, 70, Access::ReadWrite);
    send_key(&ep, &mine);
    let theirs = ep.import(&recv_key(&ep)).wait().unwrap();
    assert_eq!(theirs.len(), 2 * MIB as u64);
    let source = registered(&ctx, MIB, 71, Access::Read);
    ep.put_batch(&source, &theirs, &batch(), Some(b"batch".to_vec())).wait().unwrap();
    let back = registered(&ctx, 4096, 72, Access::Write);
    let tail = Span { local_offset: 0, remote_offset: 2 * MIB as u64 - 4096, len: 4096 };
    ep.get(&back, &theirs, tail, Some(b"read".to_vec())).wait().unwrap();
    ep.send(Message::new(b"got".to_vec(), vec![Frame::from(bytes(&back).to_vec())])).wait().unwrap();
    // The parent now writes into `mine` (this side copies on the native lane).
    let note = ep.recv_notification().wait().unwrap();
    assert_eq!(note.data, b"parent");
    ep.send(Message::new(b"mine".to_vec(), vec![Frame::from(bytes(&mine).to_vec())])).wait().unwrap();
    ep.recv().wait().unwrap(); // bye
}

fn owner_and_initiator(peers: &Peers, transport: &str) {
    let staging = owner_and_initiator_with(start(peers, "both", transport));
    assert_eq!(staging, 0, "nothing was staged");
}

/// Returns the pinned bytes this side mapped for staged transfers.
fn owner_and_initiator_with(p: Parent) -> u64 {
    let peer_key = recv_key(&p.ep);
    let target = registered(&p.ctx, 2 * MIB, 80, Access::ReadWrite);
    let before = bytes(&target).to_vec();
    send_key(&p.ep, &target);
    // The peer's batch, then its notification.
    let note = p.ep.recv_notification().wait().unwrap();
    assert_eq!(note.data, b"batch");
    check_batch(bytes(&target), &pattern(MIB, 71), &before);
    assert_eq!(p.ep.recv_notification().wait().unwrap().data, b"read", "the peer's get notified its owner");
    let got = p.ep.recv().wait().unwrap();
    assert_eq!(got.header, b"got");
    assert!(frame_bytes(&got.frames[0]) == bytes(&target)[2 * MIB - 4096..], "the peer's get read this side");
    // This side's transfers into the peer's region.
    let region = p.ep.import(&peer_key).wait().unwrap();
    let mine = registered(&p.ctx, MIB, 81, Access::ReadWrite);
    p.ep.put(&mine, &region, Span { local_offset: 0, remote_offset: MIB as u64, len: MIB as u64 }, None)
        .wait()
        .unwrap();
    let last = Span { local_offset: 0, remote_offset: 2 * MIB as u64 - 1, len: 1 };
    p.ep.put(&mine, &region, last, Some(b"parent".to_vec())).wait().unwrap();
    let read = registered(&p.ctx, 100, 82, Access::Write);
    p.ep.get(&read, &region, Span { local_offset: 0, remote_offset: 0, len: 100 }, None).wait().unwrap();
    assert!(bytes(&read) == &pattern(2 * MIB, 70)[..100], "read the peer's first bytes");
    let theirs = p.ep.recv().wait().unwrap();
    let theirs = frame_bytes(&theirs.frames[0]);
    let mut expected = pattern(2 * MIB, 70);
    expected[MIB..].copy_from_slice(&pattern(MIB, 81));
    expected[2 * MIB - 1] = pattern(MIB, 81)[0];
    assert!(theirs == expected, "the peer's region holds what this side put");
    p.ep.send(Message::new(b"bye".to_vec(), vec![])).wait().unwrap();
    let mut p = p;
    p.peer.wait_success(Duration::from_secs(60));
    p.ctx.stats().unwrap().transfer_staging_bytes
}

peer_test! {
    fn host_puts_and_gets_run_both_ways_on_the_native_lane(peers) {
        owner_and_initiator(&peers, "native");
    }
    "both" => run_owner_and_initiator(),
}

peer_test! {
    fn host_puts_and_gets_run_both_ways_on_the_ucx_lane(peers) {
        if ucx_context_or_skip_with(ucx_only()).is_none() {
            return;
        }
        owner_and_initiator(&peers, "ucx");
    }
    "both" => run_owner_and_initiator(),
}

peer_test! {
    fn host_puts_and_gets_run_both_ways_staged_through_pinned_memory_on_the_ucx_lane(peers) {
        if ucx_context_or_skip_with(ucx_only()).is_none() {
            return;
        }
        // The owner runs every transfer: the peer's batch, get and its answers to this
        // side's puts and get all go through both sides' staging buffers.
        let staging = owner_and_initiator_with(start_with(&peers, "both", "ucx", (true, true)));
        assert!(staging > 0, "the transfers went through pinned staging memory");
    }
    "both" => run_owner_and_initiator(),
}

/// The peer: registers two regions (one read-only) and sends both keys, revokes the
/// second when told, then waits (it is killed).
fn run_revoking_owner() {
    let (ctx, ep) = connect_from_env();
    let read_only = registered(&ctx, 4096, 90, Access::Read);
    let revoked = registered(&ctx, 4096, 91, Access::ReadWrite);
    let big = registered(&ctx, 64 * MIB, 92, Access::ReadWrite);
    for r in [&read_only, &revoked, &big] {
        send_key(&ep, r);
    }
    ep.recv().wait().unwrap(); // "revoke"
    drop(revoked);
    ep.send(Message::new(b"revoked".to_vec(), vec![])).wait().unwrap();
    std::thread::sleep(Duration::from_secs(60));
}

fn refusals_and_a_killed_owner(peers: &Peers, transport: &str) {
    refusals_and_a_killed_owner_with(start(peers, "revoker", transport), 64 * MIB as u64);
}

/// As `refusals_and_a_killed_owner`, the transfers pending at the owner's death
/// `pending_len` bytes each.
fn refusals_and_a_killed_owner_with(mut p: Parent, pending_len: u64) {
    let (read_only, revoked, big) = (recv_key(&p.ep), recv_key(&p.ep), recv_key(&p.ep));
    let local = registered(&p.ctx, 64 * MIB, 93, Access::ReadWrite);
    // Access the key does not grant, spans past the region: refused before anything moves.
    let ro = p.ep.import(&read_only).wait().unwrap();
    let e = p.ep.put(&local, &ro, Span::at(0, 16), None).wait().unwrap_err();
    assert!(e.to_string().contains("not writable"), "{e}");
    let e = p.ep.get(&local, &ro, Span::at(4000, 97), None).wait().unwrap_err();
    assert!(e.to_string().contains("outside the remote region"), "{e}");
    // A key of another context, and garbage, are refused.
    let other = Context::new(Config::default()).unwrap();
    let foreign = registered(&other, 4096, 1, Access::ReadWrite);
    let e = p.ep.import(&foreign.key()).wait().unwrap_err();
    assert!(e.to_string().contains("another context"), "{e}");
    assert!(RemoteKey::from_bytes(&[0u8; 48]).is_err());
    // A revoked registration: imported before, revoked, then refused.
    let gone = p.ep.import(&revoked).wait().unwrap();
    p.ep.send(Message::new(b"revoke".to_vec(), vec![])).wait().unwrap();
    p.ep.recv().wait().unwrap();
    let e = p.ep.put(&local, &gone, Span::at(0, 16), None).wait().unwrap_err();
    assert!(matches!(e, TransportError::Revoked(_) | TransportError::Refused { .. }), "{e}");
    let e = p.ep.import(&revoked).wait().unwrap_err();
    assert!(e.to_string().contains("revoked") || e.to_string().contains("does not exist"), "{e}");
    // The owner is killed with transfers pending: each fails, none hangs.
    let region = p.ep.import(&big).wait().unwrap();
    let pending: Vec<_> = (0..16).map(|_| p.ep.put(&local, &region, Span::at(0, pending_len), None)).collect();
    p.peer.kill();
    let started = Instant::now();
    let mut failed = 0;
    for request in pending {
        if request.wait().is_err() {
            failed += 1;
        }
    }
    println!("{failed} of 16 transfers in flight failed with the owner");
    let e = p.ep.put(&local, &region, Span::at(0, 16), None).wait().unwrap_err();
    assert!(matches!(e, TransportError::PeerClosed { .. } | TransportError::PeerFailed { .. }), "{e}");
    assert!(started.elapsed() < Duration::from_secs(20), "nothing hangs");
}

peer_test! {
    fn refusals_revocation_and_a_killed_owner_on_the_native_lane(peers) {
        refusals_and_a_killed_owner(&peers, "native");
    }
    "revoker" => run_revoking_owner(),
}

peer_test! {
    fn refusals_revocation_and_a_killed_owner_on_the_ucx_lane(peers) {
        if ucx_context_or_skip_with(ucx_only()).is_none() {
            return;
        }
        refusals_and_a_killed_owner(&peers, "ucx");
    }
    "revoker" => run_revoking_owner(),
}

peer_test! {
    fn refusals_revocation_and_a_killed_owner_staged_on_the_ucx_lane(peers) {
        if ucx_context_or_skip_with(ucx_only()).is_none() {
            return;
        }
        // 16 staged puts of 16 MiB pending (each with its staging buffer) when the owner dies.
        refusals_and_a_killed_owner_with(start_with(&peers, "revoker", "ucx", (true, true)), 16 * MIB as u64);
    }
    "revoker" => run_revoking_owner(),
}

/// The peer: registers a region, sends its key, waits for "bye".
fn run_plain_owner() {
    let (ctx, ep) = connect_from_env();
    let mine = registered(&ctx, 4096, 95, Access::ReadWrite);
    send_key(&ep, &mine);
    ep.recv().wait().unwrap(); // bye
}

peer_test! {
    fn an_import_over_ucx_without_rma_is_refused_with_the_setting_to_change(peers) {
        if ucx_context_or_skip_with(ucx_only()).is_none() {
            return;
        }
        let p = start_with_rma(&peers, "plain", "ucx", false);
        let key = recv_key(&p.ep);
        let e = p.ep.import(&key).wait().unwrap_err();
        assert!(e.to_string().contains("FERRYLINK_UCX_RMA=1"), "{e}");
        // The connection is unharmed: two-sided messages still flow.
        p.ep.send(Message::new(b"bye".to_vec(), vec![])).wait().unwrap();
        let mut p = p;
        p.peer.wait_success(Duration::from_secs(60));
    }
    "plain" => run_plain_owner(),
}

#[test]
fn host_memory_a_peer_cannot_map_is_refused_with_the_reason() {
    let ctx = Context::new(Config::default()).unwrap();
    let e = ctx.register(vec![0u8; 64], Access::Read).unwrap_err();
    assert!(e.to_string().contains("shared_host_buffer"), "{e}");
    let e = ctx.register(shared_host_buffer(0).unwrap(), Access::Read).unwrap_err();
    assert!(e.to_string().contains("empty"), "{e}");
    // The same memory again: the same registration (a cache hit).
    let buf = shared_host_buffer(4096).unwrap();
    let (region, offset) = buf.region().map(|(r, o)| (r.clone(), o)).unwrap();
    let a = ctx.register(buf, Access::ReadWrite).unwrap();
    let b = ctx.register(ferrylink::HostBuffer::from_region(region, offset, 4096), Access::ReadWrite).unwrap();
    assert_eq!(a.key(), b.key());
    let stats = ctx.stats().unwrap();
    assert_eq!((stats.registrations, stats.registration_cache_hits), (1, 1));
    drop((a, b));
    assert_eq!(ctx.stats().unwrap().registrations, 0, "revoked with its last handle");
}
