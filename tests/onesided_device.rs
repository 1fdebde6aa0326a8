//! One-sided transfers of device memory between two processes on GPU 0: every memory
//! kind the native lane exports (the exportable pool, VMM ranges of one and several
//! chunks, an exportable stream-ordered pool: cudarc after `install_exportable_pool`),
//! `put` and `get` run by either side, a batch of 1000 blocks (the span kernel), a
//! revocation and a killed owner; the same over the UCX lane (through pinned host memory
//! on both sides where UCX is not CUDA-aware, and with `FERRYLINK_UCX_STAGED=1`). Every
//! test needs a GPU:
//! ignored unless built with `--features gpu-tests`, failing without a device.

mod common;

use common::onesided::{device_memory, recv_key, send_key};
use common::*;
use ferrylink::ipc::shared_host_buffer;
use ferrylink::transport::onesided::{Access, Registration, RemoteKey, Span};
use ferrylink::transport::{Config, Context, TransportError};
use ferrylink::Message;
use std::time::{Duration, Instant};

type Parent = ListeningParent;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// Listens, starts the peer in `role` on `transport` (UCX: both sides with RMA on).
fn start(peers: &Peers, role: &str, transport: &str) -> Parent {
    start_with(peers, role, transport, false)
}

/// As `start`; `staged`: both sides stage every one-sided transfer over UCX through
/// pinned host memory (`FERRYLINK_UCX_STAGED=1`), CUDA-aware UCX or not.
fn start_with(peers: &Peers, role: &str, transport: &str, staged: bool) -> Parent {
    Parent::start_onesided(peers, role, transport, (transport == "ucx", staged))
}

/// Whether this process's UCX handles CUDA memory (`None`: no UCX, the test skips).
fn ucx_cuda_aware() -> Option<bool> {
    let ctx = ucx_context_or_skip_with(Config::default().with_lane_policy("ucx".parse().unwrap()))?;
    Some(ctx.local_hello().ucx.as_ref().is_some_and(|u| u.cuda_aware))
}

fn register(ctx: &Context, kind: usize, len: usize, seed: u64, access: Access) -> Registration {
    ctx.register(device_memory(kind, len, seed), access).unwrap()
}

fn device_bytes(r: &Registration) -> Vec<u8> {
    r.frame().as_device().unwrap().to_vec().unwrap()
}

/// 1000 blocks of 64 KiB: every other block of the region, in reverse order.
fn batch() -> Vec<Span> {
    let b = 64 * KIB as u64;
    (0..1000u64).map(|i| Span { local_offset: i * b, remote_offset: (999 - i) * 2 * b, len: b }).collect()
}

/// The peer: for each memory kind, registers a region and sends its key; then imports
/// the parent's regions, puts into each (a span at every edge and a notification), and
/// a batch of 1000 blocks; gets the parent's last bytes back and reports them.
fn run_device_peer() {
    let (ctx, ep) = connect_from_env();
    let len = 3 * MIB + 5;
    let mine: Vec<Registration> = (0..4).map(|k| register(&ctx, k, len, 100 + k as u64, Access::ReadWrite)).collect();
    for r in &mine {
        send_key(&ep, r);
    }
    let source = register(&ctx, 0, len, 200, Access::Read);
    for kind in 0..4u64 {
        let region = ep.import(&recv_key(&ep)).wait().unwrap();
        assert!(region.is_device());
        let edges = [Span::at(0, 1), Span::at(4096, 65536), Span::at(len as u64 - 17, 17), Span::at(MIB as u64 - 3, 7)];
        ep.put_batch(&source, &region, &edges, Some(vec![kind as u8])).wait().unwrap();
    }
    let big_region = ep.import(&recv_key(&ep)).wait().unwrap();
    let big = register(&ctx, 0, 1000 * 64 * KIB, 300, Access::Read);
    ep.put_batch(&big, &big_region, &batch(), Some(b"batch".to_vec())).wait().unwrap();
    let back = register(&ctx, 0, 4096, 301, Access::Write);
    ep.get(&back, &big_region, Span { local_offset: 0, remote_offset: 2000 * 64 * KIB as u64 - 4096, len: 4096 }, None)
        .wait()
        .unwrap();
    // The header: how many notifications went ahead of their copies (gated, native lane).
    let ahead = ep.stats().notifications_sent_ahead.to_le_bytes().to_vec();
    ep.send(Message::new(ahead, vec![device_bytes(&back).into()])).wait().unwrap();
    // The parent writes into `mine` now (this side copies on the native lane); report it.
    for _ in 0..4 {
        ep.recv_notification().wait().unwrap();
    }
    for r in &mine {
        ep.send(Message::new(vec![], vec![device_bytes(r).into()])).wait().unwrap();
    }
    ep.recv().wait().unwrap(); // bye
}

/// What `device_both_ways` saw besides the bytes.
struct BothWays {
    /// The pinned bytes this side mapped for staged transfers.
    staging: u64,
    /// The peer's notifications sent while their copies ran (of its five puts).
    peer_sent_ahead: u64,
}

fn device_both_ways(mut p: Parent) -> BothWays {
    let peer_keys: Vec<RemoteKey> = (0..4).map(|_| recv_key(&p.ep)).collect();
    let len = 3 * MIB + 5;
    let targets: Vec<Registration> = (0..4).map(|k| register(&p.ctx, k, len, 10 + k as u64, Access::Write)).collect();
    let source = pattern(len, 200);
    for (kind, t) in targets.iter().enumerate() {
        send_key(&p.ep, t);
        let note = p.ep.recv_notification().wait().unwrap();
        assert_eq!(note.data, vec![kind as u8]);
        let mut expected = pattern(len, 10 + kind as u64);
        for (at, n) in [(0, 1), (4096, 65536), (len - 17, 17), (MIB - 3, 7)] {
            expected[at..at + n].copy_from_slice(&source[at..at + n]);
        }
        assert!(device_bytes(t) == expected, "memory kind {kind}: the puts at every edge");
    }
    let big_target = register(&p.ctx, 0, 2000 * 64 * KIB, 20, Access::ReadWrite);
    let untouched = device_bytes(&big_target);
    send_key(&p.ep, &big_target);
    assert_eq!(p.ep.recv_notification().wait().unwrap().data, b"batch");
    let got = device_bytes(&big_target);
    let sent = pattern(1000 * 64 * KIB, 300);
    for (i, s) in batch().iter().enumerate() {
        let (r, l, n) = (s.remote_offset as usize, s.local_offset as usize, s.len as usize);
        assert!(got[r..r + n] == sent[l..l + n], "block {i}");
        assert!(got[r + n..r + 2 * n] == untouched[r + n..r + 2 * n], "the gap after block {i}");
    }
    let reply = p.ep.recv().wait().unwrap();
    assert!(frame_bytes(&reply.frames[0]) == got[got.len() - 4096..], "the peer's get read this side");
    let peer_sent_ahead = u64::from_le_bytes(reply.header[..8].try_into().unwrap());
    // This side's puts into the peer's regions, and a get back.
    let mine = register(&p.ctx, 0, len, 400, Access::ReadWrite);
    for key in &peer_keys {
        let region = p.ep.import(key).wait().unwrap();
        p.ep.put(&mine, &region, Span::at(MIB as u64, 2 * MIB as u64), Some(b"x".to_vec())).wait().unwrap();
        let read = register(&p.ctx, 0, 100, 401, Access::Write);
        p.ep.get(&read, &region, Span { local_offset: 0, remote_offset: len as u64 - 100, len: 100 }, None)
            .wait()
            .unwrap();
    }
    for kind in 0..4u64 {
        let theirs = frame_bytes(&p.ep.recv().wait().unwrap().frames[0]);
        let mut expected = pattern(len, 100 + kind);
        expected[MIB..3 * MIB].copy_from_slice(&pattern(len, 400)[MIB..3 * MIB]);
        assert!(theirs == expected, "memory kind {kind} of the peer holds what this side put");
    }
    p.ep.send(Message::new(b"bye".to_vec(), vec![])).wait().unwrap();
    p.peer.wait_success(Duration::from_secs(60));
    BothWays { staging: p.ctx.stats().unwrap().transfer_staging_bytes, peer_sent_ahead }
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn device_memory_of_every_kind_put_and_got_both_ways_on_the_native_lane(peers) {
        require_gpu();
        let seen = device_both_ways(start(&peers, "peer", "native"));
        // The peer ran its puts' copies itself: each notification went ahead, gated.
        assert_eq!(seen.peer_sent_ahead, 5, "notifications sent ahead of their copies");
    }
    "peer" => run_device_peer(),
}

/// The peer: registers 256 MiB, sends the key, revokes it when told, registers another
/// and sends its key, then waits to be killed.
fn run_revoking_device_owner() {
    let (ctx, ep) = connect_from_env();
    let first = register(&ctx, 0, 256 * MIB, 1, Access::ReadWrite);
    send_key(&ep, &first);
    ep.recv().wait().unwrap();
    drop(first);
    let second = register(&ctx, 0, 256 * MIB, 2, Access::ReadWrite);
    send_key(&ep, &second);
    std::thread::sleep(Duration::from_secs(60));
}

fn revocation_and_a_killed_owner(peers: &Peers, transport: &str) {
    let mut p = start(peers, "revoker", transport);
    let local = register(&p.ctx, 0, 256 * MIB, 3, Access::ReadWrite);
    let first = p.ep.import(&recv_key(&p.ep)).wait().unwrap();
    // Puts in flight when the owner revokes: each either landed before the revocation or
    // fails with it; none hangs, and the region is refused after.
    let racing: Vec<_> = (0..8).map(|_| p.ep.put(&local, &first, Span::at(0, 256 * MIB as u64), None)).collect();
    p.ep.send(Message::new(b"revoke".to_vec(), vec![])).wait().unwrap();
    let outcomes: Vec<_> = racing.into_iter().map(|r| r.wait()).collect();
    println!("puts racing a revocation: {:?}", outcomes.iter().map(|o| o.is_ok()).collect::<Vec<_>>());
    for o in &outcomes {
        if let Err(e) = o {
            assert!(matches!(e, TransportError::Revoked(_) | TransportError::Refused { .. }), "{e}");
        }
    }
    let second_key = recv_key(&p.ep);
    let e = p.ep.put(&local, &first, Span::at(0, 16), None).wait().unwrap_err();
    assert!(matches!(e, TransportError::Revoked(_) | TransportError::Refused { .. }), "{e}");
    // The owner killed while a batch runs.
    let second = p.ep.import(&second_key).wait().unwrap();
    let spans: Vec<Span> = (0..4096u64).map(|i| Span::at(i * 64 * KIB as u64, 64 * KIB as u64)).collect();
    let pending: Vec<_> = (0..8).map(|_| p.ep.put_batch(&local, &second, &spans, None)).collect();
    p.peer.kill();
    let started = Instant::now();
    let failed = pending.into_iter().map(|r| r.wait()).filter(Result::is_err).count();
    println!("{failed} of 8 batches in flight failed with their owner");
    let e = p.ep.put(&local, &second, Span::at(0, 16), None).wait().unwrap_err();
    assert!(matches!(e, TransportError::PeerClosed { .. } | TransportError::PeerFailed { .. }), "{e}");
    assert!(started.elapsed() < Duration::from_secs(30), "nothing hangs");
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn a_revocation_and_a_killed_owner_fail_device_transfers_cleanly_on_the_native_lane(peers) {
        require_gpu();
        revocation_and_a_killed_owner(&peers, "native");
    }
    "revoker" => run_revoking_device_owner(),
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn device_memory_of_every_kind_put_and_got_both_ways_on_the_ucx_lane(peers) {
        require_gpu();
        let Some(cuda_aware) = ucx_cuda_aware() else { return };
        // UCX moves device memory itself when CUDA-aware; else both sides stage it.
        let seen = device_both_ways(start(&peers, "peer", "ucx"));
        assert_eq!(seen.peer_sent_ahead, 0, "the UCX lane notifies after its flush");
        let staging = seen.staging;
        assert_eq!(staging > 0, !cuda_aware, "staged exactly when UCX is not CUDA-aware ({staging} bytes)");
    }
    "peer" => run_device_peer(),
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn device_memory_of_every_kind_put_and_got_both_ways_staged_on_the_ucx_lane(peers) {
        require_gpu();
        if ucx_cuda_aware().is_none() {
            return;
        }
        let staging = device_both_ways(start_with(&peers, "peer", "ucx", true)).staging;
        assert!(staging > 0, "FERRYLINK_UCX_STAGED=1 stages every transfer");
    }
    "peer" => run_device_peer(),
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn a_revocation_and_a_killed_owner_fail_device_transfers_cleanly_on_the_ucx_lane(peers) {
        require_gpu();
        if ucx_cuda_aware().is_none() {
            return;
        }
        // Without a CUDA-aware UCX the transfers are staged: the owner dies with staged
        // batches in flight.
        revocation_and_a_killed_owner(&peers, "ucx");
    }
    "revoker" => run_revoking_device_owner(),
}

/// The peer: registers host memory and device memory, sends both keys, then reports its
/// host region once notified.
fn run_mixed_peer() {
    let (ctx, ep) = connect_from_env();
    let mut host = shared_host_buffer(4 * MIB).unwrap();
    host.as_mut_slice().copy_from_slice(&pattern(4 * MIB, 50));
    let host = ctx.register(host, Access::ReadWrite).unwrap();
    let device = register(&ctx, 0, MIB, 51, Access::ReadWrite);
    send_key(&ep, &host);
    send_key(&ep, &device);
    assert_eq!(ep.recv_notification().wait().unwrap().data, b"checked");
    let bytes = host.frame().as_host().unwrap().as_slice().to_vec();
    ep.send(Message::new(vec![], vec![bytes.into()])).wait().unwrap();
    ep.recv().wait().unwrap(); // bye
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn host_and_device_memory_never_meet_in_one_transfer_over_ucx(peers) {
        require_gpu();
        if ucx_cuda_aware().is_none() {
            return;
        }
        let mut p = start(&peers, "mixed", "ucx");
        let (host_key, device_key) = (recv_key(&p.ep), recv_key(&p.ep));
        // The peer's device memory imports with any UCX (staged unless CUDA-aware).
        let peer_device = p.ep.import(&device_key).wait().unwrap();
        assert!(peer_device.is_device());
        // This side's device memory and the peer's host region: refused by the core on
        // every lane, writing nothing.
        let region = p.ep.import(&host_key).wait().unwrap();
        let device = register(&p.ctx, 0, MIB, 60, Access::ReadWrite);
        let refused = p.ep.put(&device, &region, Span::at(4096, 1000), None).wait().unwrap_err();
        assert!(refused.to_string().contains("between host and device"), "{refused}");
        let refused = p.ep.get(&device, &region, Span::at(0, 1000), None).wait().unwrap_err();
        assert!(refused.to_string().contains("between host and device"), "{refused}");
        // And the other way round: this side's host memory and the peer's device region.
        let mut host = shared_host_buffer(MIB).unwrap();
        host.as_mut_slice().fill(0);
        let host = p.ctx.register(host, Access::ReadWrite).unwrap();
        let refused = p.ep.put(&host, &peer_device, Span::at(0, 1000), None).wait().unwrap_err();
        assert!(refused.to_string().contains("between host and device"), "{refused}");
        // Host to host still works on the same region, and is all that landed.
        let mut source = shared_host_buffer(MIB).unwrap();
        source.as_mut_slice().copy_from_slice(&pattern(MIB, 61));
        let source = p.ctx.register(source, Access::Read).unwrap();
        let span = Span { local_offset: 1, remote_offset: 3 * MIB as u64, len: 1000 };
        p.ep.put(&source, &region, span, Some(b"checked".to_vec())).wait().unwrap();
        let mut expected = pattern(4 * MIB, 50);
        expected[3 * MIB..3 * MIB + 1000].copy_from_slice(&pattern(MIB, 61)[1..1001]);
        let theirs = frame_bytes(&p.ep.recv().wait().unwrap().frames[0]);
        assert!(theirs == expected, "the peer's host region holds the host put's bytes and nothing else");
        p.ep.send(Message::new(b"bye".to_vec(), vec![])).wait().unwrap();
        p.peer.wait_success(Duration::from_secs(60));
    }
    "mixed" => run_mixed_peer(),
}
