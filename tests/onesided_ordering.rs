//! One-sided transfers are ordered after the GPU work queued on the stream the
//! initiator's memory names as its producer (`DeviceBuffer::produced_on`, every cudarc
//! slice), whoever copies: the connector's own copies wait for it on the GPU; a
//! listener's transfers, which the connector runs from another process, and UCX's wait
//! for it on the listener's host first. Each side, in turn, puts from a buffer that slow
//! memsets on a non-blocking stream (then the legacy default stream) are still writing,
//! and gets into one they are still writing: the owner must find the memsets' last value,
//! the getter the owner's bytes, and a completed request must find the memsets done.
//! Every test needs a GPU: ignored unless built with `--features gpu-tests`, failing
//! without a device.

mod common;

use common::onesided::{recv_key, send_key};
use common::*;
use ferrylink::memory::cuda::{self, Event, Gpu};
use ferrylink::memory::ProducerStream;
use ferrylink::transport::onesided::{Access, RemoteRegion, Span};
use ferrylink::transport::{Config, Context, Endpoint};
use ferrylink::Message;
use std::time::Duration;

/// Bytes of each buffer: 40 memset passes over them take a few milliseconds, longer
/// than a transfer takes to reach a copy that would not wait.
const LEN: usize = 256 << 20;

/// Rounds: the producer on a non-blocking stream, then on cudarc's default stream (the
/// legacy one).
const ROUNDS: u8 = 2;

fn full_span() -> Span {
    Span { local_offset: 0, remote_offset: 0, len: LEN as u64 }
}

/// Registers a region of `LEN` bytes of zeros for the peer and sends its key.
fn own_region(ctx: &Context, ep: &Endpoint) -> ferrylink::transport::onesided::Registration {
    let buf = cuda::DevicePool::shared(0).unwrap().alloc(LEN).unwrap();
    buf.fill(0).unwrap();
    let region = ctx.register(buf, Access::ReadWrite).unwrap();
    send_key(ep, &region);
    region
}

/// The initiator's rounds: a put from a buffer still being written (the owner checks what
/// arrived once notified and says so), then a get into one still being written.
fn initiate(ctx: &Context, ep: &Endpoint, region: &RemoteRegion, who: &str) {
    let gpu = Gpu::get(0).unwrap();
    let cudarc = cudarc::driver::CudaContext::new(0).unwrap();
    // Every registration lives to the end, so no round's buffer reuses an address (and
    // registration) of a round before, which named another stream.
    let mut kept = Vec::new();
    for round in 0..ROUNDS {
        let stream = if round == 0 { cudarc.new_stream().unwrap() } else { cudarc.default_stream() };
        let value = 0xA0 + round;
        let source = cuda::DevicePool::shared(0).unwrap().alloc(LEN).unwrap();
        produce_slowly(&source, stream.cu_stream(), value);
        let produced = Event::new(&gpu).unwrap();
        produced.record_on_producer(&ProducerStream::Cudarc(stream.clone())).unwrap();
        let source = ctx.register(source.produced_on(&stream), Access::Read).unwrap();
        ep.put(&source, region, full_span(), Some(vec![round])).wait().unwrap();
        assert!(produced.query().unwrap(), "{who}, round {round}: the put completed before its producer's work");
        let verdict = String::from_utf8(ep.recv().wait().unwrap().header).unwrap();
        assert_eq!(verdict, "ok", "{who}, round {round}: the owner found {verdict}");

        let target = cuda::DevicePool::shared(0).unwrap().alloc(LEN).unwrap();
        produce_slowly(&target, stream.cu_stream(), 0x11);
        let target = ctx.register(target.produced_on(&stream), Access::Write).unwrap();
        ep.get(&target, region, full_span(), None).wait().unwrap();
        stream.synchronize().unwrap();
        let got = target.frame().as_device().unwrap().to_vec().unwrap();
        let stale = got.iter().filter(|&&b| b != value).count();
        assert_eq!(stale, 0, "{who}, round {round}: the get landed before its producer's memsets");
        kept.extend([source, target]);
    }
}

/// The owner's rounds: each notification names its round; the region must hold that
/// round's value in every byte.
fn own(ep: &Endpoint, region: &ferrylink::transport::onesided::Registration) {
    for round in 0..ROUNDS {
        let note = ep.recv_notification().wait().unwrap();
        assert_eq!(note.data, [round]);
        let bytes = region.frame().as_device().unwrap().to_vec().unwrap();
        let stale = bytes.iter().filter(|&&b| b != 0xA0 + round).count();
        let verdict = if stale == 0 { "ok".to_string() } else { format!("{stale} of {LEN} bytes stale") };
        ep.send(Message::new(verdict.into_bytes(), vec![])).wait().unwrap();
    }
}

/// Both directions on `transport`: the listener (this process) initiates first, the
/// connector (the peer) after.
fn both_initiators(peers: &Peers, transport: &str) {
    let p = ListeningParent::start_onesided(peers, "peer", transport, (transport == "ucx", false));
    let mut p = p;
    let region = p.ep.import(&recv_key(&p.ep)).wait().unwrap();
    initiate(&p.ctx, &p.ep, &region, "listener");
    let mine = own_region(&p.ctx, &p.ep);
    own(&p.ep, &mine);
    p.peer.wait_success(Duration::from_secs(120));
}

/// The peer: owns a region for the listener's rounds, then initiates into the listener's.
fn run_peer() {
    let (ctx, ep) = connect_from_env();
    let mine = own_region(&ctx, &ep);
    own(&ep, &mine);
    let region = ep.import(&recv_key(&ep)).wait().unwrap();
    initiate(&ctx, &ep, &region, "connector");
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn transfers_wait_for_the_initiators_producer_stream_on_the_native_lane(peers) {
        require_gpu();
        both_initiators(&peers, "native");
    }
    "peer" => run_peer(),
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn transfers_wait_for_the_initiators_producer_stream_on_the_ucx_lane(peers) {
        require_gpu();
        if ucx_context_or_skip_with(Config::default().with_lane_policy("ucx".parse().unwrap())).is_none() {
            return;
        }
        // Staged through pinned memory where this UCX is not CUDA-aware.
        both_initiators(&peers, "ucx");
    }
    "peer" => run_peer(),
}
