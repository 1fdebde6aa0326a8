//! cudarc allocations from an exportable stream-ordered pool, on the native lane between
//! two processes on GPU 0: every test here installs the pool first (process-wide, which
//! is why these tests have a binary of their own), after which cudarc's `CudaSlice`s
//! travel as pool pointers (exported per allocation, imported and freed per message by
//! the peer) with no bounce. Every test needs a GPU: ignored unless built with
//! `--features gpu-tests`, failing without a device.

mod common;

use common::*;
use ferrylink::memory::cuda;
use ferrylink::memory::cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};
use ferrylink::transport::{Config, Context, Endpoint};
use ferrylink::{Frame, Message};
use std::sync::Arc;

type Parent = ListeningParent;

/// Listens, starts the peer in `role` with `copies` as its FERRYLINK_DEVICE_COPIES.
fn start(peers: &Peers, role: &str, copies: &str) -> Parent {
    let ctx = Context::new(Config::default()).unwrap();
    Parent::start(peers, role, ctx, &[("FERRYLINK_DEVICE_COPIES", copies.to_string())])
}

fn stop(p: Parent) {
    p.stop();
}

fn run_echo_peer() {
    serve_echo_from_env();
}

/// Installs the exportable pool on device 0; the cudarc stream allocations use.
fn exportable_stream() -> Arc<CudaStream> {
    cuda::install_exportable_pool(0).unwrap();
    cuda::cudarc_stream(0).unwrap()
}

/// A pair of values laid out as C lays it out.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sample {
    index: u32,
    value: f32,
}

// SAFETY: `Sample` is `repr(C)` plain data (two 4-byte numbers, no padding, no pointers).
unsafe impl DeviceRepr for Sample {}

fn as_bytes<T: Copy>(values: &[T]) -> Vec<u8> {
    // SAFETY: `T` is plain data here (u8, f32, `Sample`: no padding); the slice is read only.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values)).to_vec() }
}

/// Sends a cudarc slice of `values`, checks the echo, and gets the slice back from the
/// sent message.
fn send_slice<T: DeviceRepr + Copy + Send + Sync + 'static>(
    ep: &Endpoint,
    stream: &Arc<CudaStream>,
    values: &[T],
) -> CudaSlice<T> {
    let slice = stream.clone_htod(values).unwrap();
    let buf = cuda::from_cuda_slice(slice).unwrap();
    assert!(!cuda::is_ipc_exportable(&buf).unwrap(), "pool memory is not legacy IPC memory");
    assert!(matches!(cuda::export_route(&buf).unwrap(), cuda::ExportRoute::Pool(_)));
    let sent = ep.send(Message::new(vec![], vec![buf.into()])).wait().unwrap();
    verify_echo(&[], &[as_bytes(values)], &ep.recv().wait().unwrap());
    let Some(Frame::Device(buf)) = sent.frames.into_iter().next() else { panic!("the sent frame comes back") };
    buf.into_cuda_slice::<T>().unwrap_or_else(|b| panic!("the slice comes back out of {b:?}"))
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn cudarc_slices_of_any_type_travel_from_the_exportable_pool(peers) {
        require_gpu();
        let stream = exportable_stream();
        for copies in ["connector", "receiver"] {
            let p = start(&peers, "echo", copies);
            let bytes = pattern(5 << 20, 1);
            let floats: Vec<f32> = (0..300_000).map(|i| i as f32 * 0.5).collect();
            let samples: Vec<Sample> = (0..70_000).map(|i| Sample { index: i, value: i as f32 / 3.0 }).collect();
            let back = send_slice(&p.ep, &stream, &bytes);
            assert_eq!(stream.clone_dtoh(&back).unwrap(), bytes);
            let back = send_slice(&p.ep, &stream, &floats);
            assert_eq!(stream.clone_dtoh(&back).unwrap(), floats, "the f32 slice comes back whole");
            let back = send_slice(&p.ep, &stream, &samples);
            assert_eq!(stream.clone_dtoh(&back).unwrap(), samples);
            assert_eq!(p.ep.stats().bounced_bytes, 0, "{copies}: exportable pool memory is never bounced");
            stop(p);
        }
    }
    "echo" => run_echo_peer(),
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn a_freed_and_reallocated_pool_pointer_is_never_stale(peers) {
        require_gpu();
        let stream = exportable_stream();
        let p = start(&peers, "echo", "connector");
        let mut addresses = std::collections::HashSet::new();
        for i in 0..40u64 {
            // Same size each time: the pool hands the freed range out again.
            let data = pattern(1 << 20, 1000 + i);
            let slice = stream.clone_htod(&data).unwrap();
            let buf = cuda::from_cuda_slice(slice).unwrap();
            addresses.insert(buf.device_ptr());
            p.ep.send(Message::new(vec![], vec![buf.into()])).wait().unwrap();
            verify_echo(&[], &[data], &p.ep.recv().wait().unwrap());
        }
        println!("40 allocations used {} distinct addresses", addresses.len());
        assert!(addresses.len() < 40, "the pool reused an address, so staleness was exercised");
        stop(p);
    }
    "echo" => run_echo_peer(),
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn the_connector_pushes_into_pool_receive_buffers(peers) {
        require_gpu();
        let stream = exportable_stream();
        let p = start(&peers, "echo", "connector");
        for (i, &size) in [1usize, 4 << 10, 5 << 20].iter().enumerate() {
            let data = pattern(size, i as u64 + 50);
            p.ep.send(Message::new(vec![], vec![device_buffer_with(0, &data).into()])).wait().unwrap();
            let target = cuda::from_cuda_slice(stream.alloc_zeros::<u8>(size).unwrap()).unwrap();
            let back = p.ep.recv_into(vec![target.into()]).wait().unwrap();
            verify_echo(&[], std::slice::from_ref(&data), &back);
            let Some(Frame::Device(buf)) = back.frames.into_iter().next() else { panic!("a device frame") };
            let slice = buf.into_cuda_slice::<u8>().unwrap_or_else(|b| panic!("the receive buffer comes back: {b:?}"));
            assert_eq!(stream.clone_dtoh(&slice).unwrap(), data, "the bytes are in the caller's own slice");
        }
        stop(p);
    }
    "echo" => run_echo_peer(),
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn a_posted_receive_is_offered_and_filled_in_place(peers) {
        require_gpu();
        let stream = exportable_stream();
        let p = start(&peers, "echo", "connector");
        // Each receive is posted before the message that answers it exists: the connector
        // holds its offer when it echoes, and copies straight into the caller's slice.
        let rounds = 20u64;
        for i in 0..rounds {
            let size = if i % 2 == 0 { 1 << 20 } else { (3 << 20) + 17 };
            let target = cuda::from_cuda_slice(stream.alloc_zeros::<u8>(size).unwrap()).unwrap();
            let ptr = target.device_ptr();
            let receive = p.ep.recv_into(vec![target.into()]);
            let data = pattern(size, 700 + i);
            p.ep.send(Message::new(vec![], vec![device_buffer_with(0, &data).into()])).wait().unwrap();
            let back = receive.wait().unwrap();
            verify_echo(&[], std::slice::from_ref(&data), &back);
            assert_eq!(back.frames[0].as_device().unwrap().device_ptr(), ptr, "round {i}: the caller's own slice");
        }
        let stats = p.ep.stats();
        println!("{stats:?}");
        assert_eq!(stats.offered_receives, rounds, "every message was copied into its offered receive");
        stop(p);
    }
    "echo" => run_echo_peer(),
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn an_offered_receive_that_times_out_gets_its_slice_back(peers) {
        require_gpu();
        let stream = exportable_stream();
        let config = Config::default().with_request_timeout(std::time::Duration::from_millis(300));
        let p = Parent::start(&peers, "echo", Context::new(config).unwrap(), &[]);
        let target = cuda::from_cuda_slice(stream.alloc_zeros::<u8>(1 << 20).unwrap()).unwrap();
        let ptr = target.device_ptr();
        // Nothing is sent: the receive's deadline passes while the connector holds its offer.
        let e = p.ep.recv_into(vec![target.into()]).wait().expect_err("nothing arrives");
        assert!(matches!(e.error, ferrylink::transport::TransportError::TimedOut(_)), "{e}");
        let buffers = e.buffers.expect("the connector gave the offer back, and with it the slice");
        assert_eq!(buffers[0].as_device().unwrap().device_ptr(), ptr);
        // The connection goes on: a round trip into the same slice.
        let data = pattern(1 << 20, 9);
        let receive = p.ep.recv_into(buffers);
        p.ep.send(Message::new(vec![], vec![device_buffer_with(0, &data).into()])).wait().unwrap();
        verify_echo(&[], &[data], &receive.wait().unwrap());
        stop(p);
    }
    "echo" => run_echo_peer(),
}

peer_test! {
    /// A listener that closes while its receive's own slice is offered to the connector
    /// gets the slice back only once the connector hung up (the connector could still be
    /// copying into it, and CUDA wants its import of the slice freed before the slice
    /// is): with the connector stopped, the receive waits; resumed, it reads the goodbye,
    /// ends, and the slice comes back.
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn an_offered_slice_comes_back_from_a_closing_listener_once_the_connector_hung_up(peers) {
        require_gpu();
        let stream = exportable_stream();
        let p = start(&peers, "echo-until-closed", "connector");
        // One round trip: the connection is up and the connector idle.
        let data = pattern(1 << 20, 3);
        p.ep.send(Message::new(vec![], vec![device_buffer_with(0, &data).into()])).wait().unwrap();
        let back = p.ep.recv().wait().unwrap();
        assert_eq!(back.frames[0].as_device().unwrap().to_vec().unwrap(), data);
        let target = cuda::from_cuda_slice(stream.alloc_zeros::<u8>(1 << 20).unwrap()).unwrap();
        let ptr = target.device_ptr();
        let mut receive = p.ep.recv_into(vec![target.into()]);
        // The offer goes out with the receive; let it reach the connector's ring.
        std::thread::sleep(std::time::Duration::from_millis(100));
        let mut stopped = PausedPeers::stop(std::slice::from_ref(&p.peer));
        let ListeningParent { ctx, mut peer, ep, .. } = p;
        drop(ep);
        assert!(
            receive.wait_timeout(std::time::Duration::from_millis(500)).is_none(),
            "the slice came back while the connector could still copy into it"
        );
        stopped.resume();
        let e = receive
            .wait_timeout(std::time::Duration::from_secs(20))
            .expect("back once the connector hung up")
            .expect_err("the connection ended");
        let buffers = e.buffers.expect("the slice comes back");
        assert_eq!(buffers[0].as_device().unwrap().device_ptr(), ptr);
        peer.wait_success(std::time::Duration::from_secs(30));
        drop(ctx);
    }
    "echo-until-closed" => run_echo_until_closed(),
}

/// Sends every message back as it came, until the connection ends.
fn run_echo_until_closed() {
    let (_ctx, ep) = connect_from_env();
    while let Ok(message) = ep.recv().wait() {
        if ep.send(message).wait().is_err() {
            break;
        }
    }
}
