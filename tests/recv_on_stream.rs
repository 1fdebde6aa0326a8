//! Receives on a caller's stream (`Endpoint::recv_on` and its forms) between two processes
//! on GPU 0: the peer connects and so runs the copies of what this side sends (pull);
//! its receive completes without a host wait, work it then enqueues on its stream reads
//! the bytes, and this side's send completes only once those copies are done. And a
//! receive target still busy on its own stream is written only after that work. Every test
//! needs a GPU: ignored unless built with `--features gpu-tests`, failing without a device.

mod common;

use common::*;
use ferrylink::memory::cuda;
use ferrylink::memory::cudarc;
use ferrylink::transport::{Config, Context, Endpoint};
use ferrylink::{Frame, Message};
use std::time::Duration;

const LEN: usize = 256 << 20;
/// Each round receives another way: `recv_on`, `recv_on_raw`, `recv_into_on`,
/// `recv_into_on_raw`.
const ROUNDS: u64 = 4;

fn seed(round: u64) -> u64 {
    0x5eed + round
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn a_receive_on_a_stream_feeds_the_stream_and_the_send_waits_for_the_copy(peers) {
        require_gpu();
        for copies in ["connector", "receiver"] {
            let ctx = Context::new(Config::default()).unwrap();
            let env = [("FERRYLINK_DEVICE_COPIES", copies.to_string())];
            let ListeningParent { mut peer, ep, .. } = ListeningParent::start(&peers, "stream-receiver", ctx, &env);
            // Each message is sent once its receive is posted (the peer says so), so it
            // lands on the stream rather than ahead of the receive.
            assert_eq!(ep.recv().wait().unwrap().header, b"ready");
            for round in 0..ROUNDS {
                let buf = device_buffer_with(0, &pattern(LEN, seed(round)));
                let sent = ep.send(Message::new(round.to_le_bytes().to_vec(), vec![buf.into()])).wait().unwrap();
                // The peer's copies are done: overwriting the buffer now must not reach it.
                let Frame::Device(buf) = &sent.frames[0] else { panic!("the device frame comes back") };
                buf.copy_from_host(&vec![0xFF; LEN]).unwrap();
                let verdict = ep.recv().wait().unwrap();
                assert_eq!(String::from_utf8_lossy(&verdict.header), "ok", "{copies}, round {round}");
            }
            peer.wait_success(Duration::from_secs(60));
        }
    }
    "stream-receiver" => run_stream_receiver(),
}

/// Receives `ROUNDS` messages on a non-blocking stream; for each, enqueues on that stream
/// a device copy of the frame and a copy to the host, waits for the stream only, checks
/// the bytes, and answers "ok" (once the next receive is posted).
fn run_stream_receiver() {
    let (_ctx, ep) = connect_from_env();
    let cuda_ctx = cudarc::driver::CudaContext::new(0).unwrap();
    let stream = cuda_ctx.new_stream().unwrap();
    let scratch = cuda::DevicePool::shared(0).unwrap().alloc(LEN).unwrap();
    let mut posted = Some(receive(&ep, &stream, 0));
    ep.send(Message::new(b"ready".to_vec(), vec![])).wait().unwrap();
    for round in 0..ROUNDS {
        let message = posted.take().expect("a receive is posted").wait().unwrap();
        assert_eq!(message.header, round.to_le_bytes());
        let Frame::Device(frame) = &message.frames[0] else { panic!("a device frame lands in device memory") };
        let producer = frame.producer_stream().expect("the frame names the receive's stream");
        assert_eq!(producer.raw(), stream.cu_stream(), "its producer is the receive's stream");
        let mut host = vec![0u8; LEN];
        cuda_ctx.bind_to_thread().unwrap();
        // SAFETY: `frame` and `scratch` are live device buffers of LEN bytes on device 0 and
        // `host` a live host buffer of LEN bytes; all outlive the synchronisation below. The
        // stream waits for the transport's copies into `frame` before these run.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                scratch.device_ptr(),
                frame.device_ptr(),
                LEN,
                stream.cu_stream(),
            )
            .unwrap();
            cudarc::driver::result::memcpy_dtoh_async(&mut host, scratch.device_ptr(), stream.cu_stream()).unwrap();
        }
        stream.synchronize().unwrap();
        let verdict =
            if host == pattern(LEN, seed(round)) { "ok".to_string() } else { format!("round {round}: wrong bytes") };
        drop(message);
        if round + 1 < ROUNDS {
            posted = Some(receive(&ep, &stream, round + 1));
        }
        ep.send(Message::new(verdict.into_bytes(), vec![])).wait().unwrap();
    }
}

/// The receive of `round`, each round another form.
fn receive(
    ep: &Endpoint,
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    round: u64,
) -> ferrylink::transport::RecvRequest {
    let target = || vec![Frame::Device(cuda::DevicePool::shared(0).unwrap().alloc(LEN).unwrap())];
    match round % 4 {
        0 => ep.recv_on(stream),
        // SAFETY: the stream is one of device 0's primary context (cudarc's), alive until
        // the process ends, after every use of the frames naming it.
        1 => unsafe { ep.recv_on_raw(stream.cu_stream()) },
        2 => ep.recv_into_on(target(), stream),
        // SAFETY: as above.
        _ => unsafe { ep.recv_into_on_raw(target(), stream.cu_stream()) },
    }
}

peer_test! {
    /// A receive target still being written on its own stream (slow memsets queued there
    /// just before the receive, ending with 0xAB) is written by the transport only after
    /// that work, whoever copies: the message arrives, not the producer's last value.
    /// Without the ordering the memsets end last and every byte reads 0xAB. Both a
    /// non-blocking stream (ordered by an event) and the legacy default stream (cudarc's
    /// default: a landing copies on that stream itself, `device/landing.rs`).
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn a_receive_target_busy_on_its_stream_is_written_after_that_work(peers) {
        require_gpu();
        let cuda_ctx = cudarc::driver::CudaContext::new(0).unwrap();
        for (stream_name, copies) in
            [("non-blocking", "connector"), ("non-blocking", "receiver"), ("legacy", "connector"), ("legacy", "receiver")]
        {
            let stream = if stream_name == "legacy" { cuda_ctx.default_stream() } else { cuda_ctx.new_stream().unwrap() };
            let ctx = Context::new(Config::default()).unwrap();
            let env = [("FERRYLINK_DEVICE_COPIES", copies.to_string())];
            let ListeningParent { mut peer, ep, .. } = ListeningParent::start(&peers, "busy-target-sender", ctx, &env);
            for round in 0..2u64 {
                // The peer's frame is ready before the producer starts, so the message
                // arrives while the producer's memsets still run.
                assert_eq!(ep.recv().wait().unwrap().header, b"ready");
                let target = cuda::DevicePool::shared(0).unwrap().alloc(LEN).unwrap();
                produce_slowly(&target, stream.cu_stream(), 0xAB);
                let posted = ep.recv_into(vec![Frame::Device(target.produced_on(&stream))]);
                ep.send(Message::new(b"go".to_vec(), vec![])).wait().unwrap();
                let message = posted.wait().unwrap();
                stream.synchronize().unwrap();
                let Frame::Device(got) = &message.frames[0] else { panic!("the target comes back") };
                let bytes = got.to_vec().unwrap();
                let want = pattern(LEN, seed(round));
                let wrong = bytes.iter().zip(&want).filter(|(a, b)| a != b).count();
                assert_eq!(wrong, 0, "{copies}, {stream_name} stream, round {round}: {wrong} of {LEN} bytes are not the message's");
            }
            assert_eq!(ep.recv().wait().unwrap().header, b"ready");
            ep.send(Message::new(b"done".to_vec(), vec![])).wait().unwrap();
            peer.wait_success(Duration::from_secs(60));
        }
    }
    "busy-target-sender" => run_busy_target_sender(),
}

/// Prepares a frame, says "ready", sends the frame on "go"; ends on "done".
fn run_busy_target_sender() {
    let (_ctx, ep) = connect_from_env();
    for round in 0.. {
        let buf = device_buffer_with(0, &pattern(LEN, seed(round)));
        ep.send(Message::new(b"ready".to_vec(), vec![])).wait().unwrap();
        let order = ep.recv().wait().unwrap();
        if order.header == b"done" {
            return;
        }
        assert_eq!(order.header, b"go");
        ep.send(Message::new(vec![], vec![buf.into()])).wait().unwrap();
    }
}
