//! Device memory the user brings, between two processes on GPU 0 (the native lane, and
//! the UCX lane for VMM ranges):
//! VMM ranges of one and several chunks (fds over `SCM_RIGHTS`), cudarc's stock
//! stream-ordered pool (bounced, counted), and producers on non-blocking streams.
//! The exportable-pool tests install a device pool and live in `native_device_pools.rs`
//! (a separate process). Every test needs a GPU: ignored unless built with
//! `--features gpu-tests`, failing without a device.

mod common;

use common::*;
use ferrylink::memory::cuda::{self, VmmAllocation};
use ferrylink::memory::cudarc;
use ferrylink::transport::{Config, Context, Endpoint, LanePolicy, TransportError};
use ferrylink::{DeviceBuffer, Frame, Message};
use std::sync::Arc;
use std::time::{Duration, Instant};

type Parent = ListeningParent;

/// Listens, starts the peer in `role` with `copies` as its FERRYLINK_DEVICE_COPIES.
fn start(peers: &Peers, role: &str, copies: &str) -> Parent {
    start_on(peers, role, copies, Context::new(Config::default()).unwrap(), "native")
}

/// As `start`, with this side's context and the peer's FERRYLINK_TRANSPORT.
fn start_on(peers: &Peers, role: &str, copies: &str, ctx: Context, transport: &str) -> Parent {
    let env = [("FERRYLINK_DEVICE_COPIES", copies.to_string()), ("FERRYLINK_TRANSPORT", transport.to_string())];
    Parent::start(peers, role, ctx, &env)
}

fn stop(p: Parent) {
    p.stop();
}

fn run_echo_peer() {
    serve_echo_from_env();
}

/// A VMM range of `chunks` chunks of the minimum granularity, filled with `data`'s
/// pattern (`data.len()` = the range's length).
fn vmm_range(chunks: usize, seed: u64) -> (Arc<VmmAllocation>, Vec<u8>) {
    let gpu = cuda::Gpu::get(0).unwrap();
    let g = VmmAllocation::granularity(&gpu).unwrap();
    let range = VmmAllocation::with_chunks(&gpu, &vec![g; chunks]).unwrap();
    let data = pattern(range.len(), seed);
    range.buffer(0, range.len()).unwrap().copy_from_host(&data).unwrap();
    (range, data)
}

/// The bytes `vmm_range(chunks, seed)` fills its range with.
fn vmm_range_bytes(chunks: usize, seed: u64) -> (usize, Vec<u8>) {
    let gpu = cuda::Gpu::get(0).unwrap();
    let g = VmmAllocation::granularity(&gpu).unwrap();
    (g, pattern(g * chunks, seed))
}

/// Sends `buf` (whose bytes should be `expected`) and checks the echo.
fn round_trip(ep: &Endpoint, buf: DeviceBuffer, expected: &[u8]) {
    ep.send(Message::new(vec![], vec![buf.into()])).wait().unwrap();
    verify_echo(&[], &[expected.to_vec()], &ep.recv().wait().unwrap());
}

/// Offset and length pairs of frames in a range of chunks of `g` bytes: inside one
/// chunk, across each boundary by one byte, across all chunks, the whole range.
fn frames_at_chunk_edges(g: usize, chunks: usize) -> Vec<(usize, usize)> {
    let mut frames = vec![(0, 4096), (g - 4096, 4096)];
    for edge in 1..chunks {
        frames.push((edge * g - 1, 2));
        frames.push((edge * g - 4096, 8192));
    }
    frames.push((100, chunks * g - 200));
    frames.push((0, chunks * g));
    frames
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn vmm_frames_of_one_and_several_chunks_arrive_intact(peers) {
        require_gpu();
        for copies in ["connector", "receiver"] {
            // The peer pulls what this side sends: this side exports the VMM chunks.
            let p = start(&peers, "echo", copies);
            let (range, data) = vmm_range(3, 1);
            let g = range.len() / 3;
            for (offset, len) in frames_at_chunk_edges(g, 3) {
                round_trip(&p.ep, range.buffer(offset, len).unwrap(), &data[offset..offset + len]);
            }
            let fds = p.ep.stats().fds_sent;
            assert!(fds >= 3, "{copies}: each chunk's fd went to the peer ({fds} fds)");
            for (offset, len) in frames_at_chunk_edges(g, 3) {
                round_trip(&p.ep, range.buffer(offset, len).unwrap(), &data[offset..offset + len]);
            }
            assert_eq!(p.ep.stats().fds_sent, fds, "{copies}: a chunk is announced once per peer");
            assert_eq!(p.ep.stats().bounced_bytes, 0, "{copies}: VMM memory is never bounced");
            stop(p);
        }
    }
    "echo" => run_echo_peer(),
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn vmm_frames_across_chunks_arrive_intact_over_the_ucx_lane(peers) {
        require_gpu();
        let Some(ctx) = ucx_or_skip(Context::new(Config::default().with_lane_policy(LanePolicy::Ucx)))
        else {
            return;
        };
        // CUDA-aware UCX reads only a range's first chunk: such frames must be staged.
        let p = start_on(&peers, "echo", "connector", ctx, "ucx");
        assert_eq!(p.ep.lane().to_string(), "ucx");
        let (range, data) = vmm_range(3, 5);
        let g = range.len() / 3;
        for (offset, len) in frames_at_chunk_edges(g, 3) {
            round_trip(&p.ep, range.buffer(offset, len).unwrap(), &data[offset..offset + len]);
        }
        stop(p);
    }
    "echo" => run_echo_peer(),
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn the_connector_pushes_into_vmm_receive_buffers_across_chunk_edges(peers) {
        require_gpu();
        // The peer connects and pushes its echoes into this side's VMM buffers, which this
        // side exports as push targets.
        let p = start(&peers, "echo", "connector");
        let (range, _) = vmm_range(2, 2);
        let g = range.len() / 2;
        for (i, (offset, len)) in frames_at_chunk_edges(g, 2).into_iter().enumerate() {
            let data = pattern(len, 100 + i as u64);
            p.ep.send(Message::new(vec![], vec![device_buffer_with(0, &data).into()])).wait().unwrap();
            let target = range.buffer(offset, len).unwrap();
            let back = p.ep.recv_into(vec![target.into()]).wait().unwrap();
            verify_echo(&[], std::slice::from_ref(&data), &back);
            let mut edges = vec![0u8; len];
            range.buffer(offset, len).unwrap().copy_to_host(&mut edges).unwrap();
            assert_eq!(edges, data, "frame at {offset}+{len}: the bytes are in the VMM range itself");
        }
        stop(p);
    }
    "echo" => run_echo_peer(),
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn cudarc_stock_pool_memory_is_bounced_counted_and_intact(peers) {
        require_gpu();
        let p = start(&peers, "echo", "connector");
        let stream = cuda::cudarc_stream(0).unwrap();
        let data = pattern(3 << 20, 3);
        let slice = stream.clone_htod(&data).unwrap();
        let buf = cuda::from_cuda_slice(slice).unwrap();
        assert!(!cuda::is_ipc_exportable(&buf).unwrap());
        round_trip(&p.ep, buf, &data);
        assert_eq!(p.ep.stats().bounced_bytes, data.len() as u64, "the stock pool's bytes are bounced and counted");
        stop(p);
    }
    "echo" => run_echo_peer(),
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn sends_wait_for_a_producer_on_a_non_blocking_or_the_default_stream(peers) {
        require_gpu();
        let len = 256 << 20;
        let ctx = cudarc::driver::CudaContext::new(0).unwrap();
        for copies in ["connector", "receiver"] {
            // The peer pulls from this side's buffer.
            let p = start(&peers, "echo", copies);
            for round in 0..3u8 {
                // The last round names cudarc's default stream (the legacy one), which
                // the transport orders by the legacy stream's event alone.
                let stream = if round == 2 { ctx.default_stream() } else { ctx.new_stream().unwrap() };
                let buf = cuda::DevicePool::shared(0).unwrap().alloc(len).unwrap();
                produce_slowly(&buf, stream.cu_stream(), 0xA0 + round);
                p.ep.send(Message::new(vec![], vec![buf.produced_on(&stream).into()])).wait().unwrap();
                let bytes = frame_bytes(&p.ep.recv().wait().unwrap().frames[0]);
                assert!(bytes.iter().all(|&b| b == 0xA0 + round), "{copies}, round {round}: the copy overtook the producer");
            }
            // The same without naming the stream, for the record: the ordering is what
            // makes the rounds above pass (not asserted: it is a race the copy usually wins).
            let stream = ctx.new_stream().unwrap();
            let buf = cuda::DevicePool::shared(0).unwrap().alloc(len).unwrap();
            produce_slowly(&buf, stream.cu_stream(), 0xEE);
            p.ep.send(Message::new(vec![], vec![buf.into()])).wait().unwrap();
            let bytes = frame_bytes(&p.ep.recv().wait().unwrap().frames[0]);
            let stale = bytes.iter().filter(|&&b| b != 0xEE).count();
            println!("{copies}: without naming the producer stream, {stale} of {len} bytes arrived stale");
            stream.synchronize().unwrap();
            stop(p);
        }
        // The peer connects and pushes from its own buffer (this process's copies).
        let mut p = start(&peers, "nonblocking-pusher", "connector");
        for round in 0..3u8 {
            let bytes = frame_bytes(&p.ep.recv().wait().unwrap().frames[0]);
            assert!(bytes.iter().all(|&b| b == 0xB0 + round), "pusher, round {round}: the push overtook the producer");
        }
        p.peer.wait_success(Duration::from_secs(60));
    }
    "echo" => run_echo_peer(),
    "nonblocking-pusher" => {
        let (_ctx, ep) = connect_from_env();
        let ctx = cudarc::driver::CudaContext::new(0).unwrap();
        for round in 0..3u8 {
            let stream = if round == 2 { ctx.default_stream() } else { ctx.new_stream().unwrap() };
            let buf = cuda::DevicePool::shared(0).unwrap().alloc(256 << 20).unwrap();
            produce_slowly(&buf, stream.cu_stream(), 0xB0 + round);
            ep.send(Message::new(vec![], vec![buf.produced_on(&stream).into()])).wait().unwrap();
        }
    },
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn a_killed_vmm_exporter_fails_the_receive_and_unmaps(peers) {
        require_gpu();
        // Receiver copies: this side imports and maps the peer's VMM chunks.
        let mut p = start(&peers, "vmm-sender", "receiver");
        let (_, data) = vmm_range_bytes(4, 9);
        let check = |m: &Message| {
            let offset: usize = String::from_utf8(m.header.clone()).unwrap().parse().unwrap();
            let bytes = frame_bytes(&m.frames[0]);
            assert_eq!(bytes, data[offset..offset + bytes.len()], "only whole, intact messages arrive");
        };
        check(&p.ep.recv().wait().unwrap());
        assert!(p.ctx.stats().unwrap().imported_device_regions >= 1, "the peer's chunks are imported here");
        p.peer.kill();
        let started = Instant::now();
        loop {
            match p.ep.recv().wait() {
                Ok(m) => check(&m),
                Err(e) => {
                    assert!(
                        matches!(e.error, TransportError::PeerClosed { .. } | TransportError::PeerFailed { .. }),
                        "{e}"
                    );
                    break;
                }
            }
        }
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(
            eventually(Duration::from_secs(5), || p.ctx.stats().unwrap().imported_device_regions == 0),
            "the dead peer's chunks stay imported: {:?}",
            p.ctx.stats()
        );
    }
    "vmm-sender" => {
        let (_ctx, ep) = connect_from_env();
        let (range, _) = vmm_range(4, 9);
        let g = range.len() / 4;
        // Keep sending fresh frames across the chunks until killed.
        for i in 0.. {
            let offset = (i % 2) * g + g / 2;
            let frame = Frame::Device(range.buffer(offset, g + g / 2).unwrap());
            let msg = Message::new(offset.to_string().into_bytes(), vec![frame]);
            if ep.send(msg).wait().is_err() {
                std::thread::sleep(Duration::from_secs(60));
            }
        }
    },
}
