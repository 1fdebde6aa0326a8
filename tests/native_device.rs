//! Device frames on the native lane between two processes on GPU 0 (CUDA IPC).
//! Every test needs a GPU: ignored unless built with `--features gpu-tests`, failing
//! without a device.

mod common;

use common::*;
use ferrylink::memory::cuda::{self, DeviceAllocation, Gpu};
use ferrylink::transport::{Config, Context, Endpoint, TransportError};
use ferrylink::{Frame, Message};
use std::time::{Duration, Instant};

/// Listens, starts the peer in `role` with `copies` as `FERRYLINK_DEVICE_COPIES` (who
/// copies device frames: the connector, by default, or the receiver) and accepts it.
fn start_configured(peers: &Peers, role: &str, copies: &str, config: Config) -> ListeningParent {
    let ctx = Context::new(config).unwrap();
    ListeningParent::start(peers, role, ctx, &[("FERRYLINK_DEVICE_COPIES", copies.to_string())])
}

fn start(peers: &Peers, role: &str) -> ListeningParent {
    start_with(peers, role, "connector")
}

fn start_with(peers: &Peers, role: &str, copies: &str) -> ListeningParent {
    start_configured(peers, role, copies, Config::default())
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn device_frames_of_every_size_round_trip(peers) {
        require_gpu();
        let p = start(&peers, "echo");
        for (i, &size) in [1usize, 4 << 10, 1 << 20, 256 << 20, 1 << 30].iter().enumerate() {
            let data = pattern(size, i as u64 + 10);
            let buf = device_buffer_with(0, &data);
            let started = Instant::now();
            p.ep.send(Message::new(vec![], vec![buf.into()])).wait().unwrap();
            let back = p.ep.recv().wait().unwrap();
            println!("device frame of {size} bytes: round trip {:?}", started.elapsed());
            assert!(matches!(back.frames[0], Frame::Device(_)), "a device frame lands in device memory");
            verify_echo(&[], &[data], &back);
        }
        // A message mixing host and device frames.
        let host = pattern(100_000, 1);
        let dev = pattern(3 << 20, 2);
        let msg = Message::new(vec![], vec![host.clone().into(), device_buffer_with(0, &dev).into(), vec![7u8; 5].into()]);
        p.ep.send(msg).wait().unwrap();
        verify_echo(&[], &[host, dev, vec![7u8; 5]], &p.ep.recv().wait().unwrap());
        p.stop_reporting_mappings();
    }
    "echo" => serve_echo_reporting_mappings(),
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn device_frames_round_trip_when_each_receiver_copies(peers) {
        require_gpu();
        let p = start_with(&peers, "echo", "receiver");
        for (i, &size) in [1usize, 1 << 20, 64 << 20].iter().enumerate() {
            let data = pattern(size, i as u64 + 70);
            p.ep.send(Message::new(vec![], vec![device_buffer_with(0, &data).into()])).wait().unwrap();
            verify_echo(&[], &[data], &p.ep.recv().wait().unwrap());
        }
        // recv_into device buffers of the caller's own.
        let data = pattern(3 << 20, 99);
        p.ep.send(Message::new(vec![], vec![device_buffer_with(0, &data).into()])).wait().unwrap();
        let target = cuda::DevicePool::shared(0).unwrap().alloc(3 << 20).unwrap();
        let back = p.ep.recv_into(vec![target.into()]).wait().unwrap();
        verify_echo(&[], &[data], &back);
        p.stop_reporting_mappings();
    }
    "echo" => serve_echo_reporting_mappings(),
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn a_freed_and_reallocated_buffer_never_yields_stale_data(peers) {
        require_gpu();
        let p = start(&peers, "echo");
        let gpu = Gpu::get(0).unwrap();
        let mut same_address = 0;
        let mut last_ptr = 0;
        for round in 0..8u64 {
            // A whole allocation of its own (not the pool), freed after each round.
            let data = pattern(2 << 20, 100 + round);
            let buf = DeviceAllocation::new(&gpu, data.len()).unwrap().into_buffer();
            buf.copy_from_host(&data).unwrap();
            if buf.device_ptr() == last_ptr {
                same_address += 1;
            }
            last_ptr = buf.device_ptr();
            let sent = p.ep.send(Message::new(vec![], vec![buf.into()])).wait().unwrap();
            verify_echo(&[], &[data], &p.ep.recv().wait().unwrap());
            drop(sent); // cuMemFree: the next allocation likely reuses the address
        }
        println!("{same_address} of 7 reallocations reused the previous address");
        p.stop_reporting_mappings();
    }
    "echo" => serve_echo_reporting_mappings(),
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn stream_ordered_pool_memory_is_bounced_and_arrives_intact(peers) {
        require_gpu();
        let p = start(&peers, "echo");
        let data = pattern(8 << 20, 4);
        let ctx = cudarc::driver::CudaContext::new(0).unwrap();
        let stream = ctx.default_stream();
        let slice = stream.clone_htod(&data).unwrap();
        let buf = cuda::from_cuda_slice(slice).unwrap();
        println!("cudarc memory exportable: {}", cuda::is_ipc_exportable(&buf).unwrap());
        p.ep.send(Message::new(vec![], vec![buf.into()])).wait().unwrap();
        verify_echo(&[], &[data], &p.ep.recv().wait().unwrap());
        p.stop_reporting_mappings();
    }
    "echo" => serve_echo_reporting_mappings(),
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn the_receivers_copy_waits_for_the_producers_work(peers) {
        require_gpu();
        let p = start(&peers, "echo");
        copies_never_overtake_the_producer(p);
    }
    "echo" => serve_echo_reporting_mappings(),
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn the_copy_waits_for_the_producers_work_with_context_synchronize(peers) {
        require_gpu();
        let config =
            Config::default().with_producer_ordering(ferrylink::transport::ProducerOrdering::ContextSynchronize);
        let p = start_configured(&peers, "echo", "receiver", config);
        copies_never_overtake_the_producer(p);
    }
    "echo" => serve_echo_reporting_mappings(),
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn a_killed_sender_closes_its_mappings(peers) {
        require_gpu();
        // Each receiver copies: this side maps the sender's allocation.
        let mut p = start_with(&peers, "sender", "receiver");
        let first = p.ep.recv().wait().unwrap();
        assert_eq!(frame_bytes(&first.frames[0]), pattern(64 << 20, 9));
        assert!(p.ctx.stats().unwrap().ipc_mappings >= 1, "the sender's allocation is mapped here");
        p.peer.kill();
        // Drain until the death is seen; every receive ends, none hangs.
        let started = Instant::now();
        loop {
            match p.ep.recv().wait() {
                Ok(_) => continue,
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
        let stats = p.ctx.stats().unwrap();
        assert_eq!(stats.ipc_mappings, 0, "mappings of the dead peer stay open: {stats:?}");
    }
    peer(role) => {
        assert_eq!(role, "sender");
        let (_ctx, ep) = connect_from_env();
        let data = pattern(64 << 20, 9);
        let buf = device_buffer_with(0, &data);
        let msg = ep.send(Message::new(vec![], vec![buf.into()])).wait().unwrap();
        // Keep sending the same buffer until killed.
        let mut msg = Some(msg);
        loop {
            match ep.send(msg.take().unwrap()).wait() {
                Ok(m) => msg = Some(m),
                Err(_) => std::thread::sleep(Duration::from_secs(60)),
            }
        }
    },
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn the_connector_copies_into_the_callers_buffers(peers) {
        require_gpu();
        // The peer connects (connector copies): its echoes are pushed into our buffers, here
        // both pool memory (exported directly) and a cudarc allocation (filled through a
        // pool buffer, then copied).
        let p = start(&peers, "echo");
        for (i, &size) in [1usize, 4 << 10, 5 << 20].iter().enumerate() {
            let data = pattern(size, i as u64 + 200);
            p.ep.send(Message::new(vec![], vec![device_buffer_with(0, &data).into()])).wait().unwrap();
            let pooled = cuda::DevicePool::shared(0).unwrap().alloc(size).unwrap();
            verify_echo(&[], std::slice::from_ref(&data), &p.ep.recv_into(vec![pooled.into()]).wait().unwrap());
            p.ep.send(Message::new(vec![], vec![device_buffer_with(0, &data).into()])).wait().unwrap();
            let ctx = cudarc::driver::CudaContext::new(0).unwrap();
            let foreign = cuda::from_cuda_slice(ctx.default_stream().alloc_zeros::<u8>(size).unwrap()).unwrap();
            verify_echo(&[], &[data], &p.ep.recv_into(vec![foreign.into()]).wait().unwrap());
        }
        p.stop_reporting_mappings();
    }
    "echo" => serve_echo_reporting_mappings(),
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn a_killed_pusher_fails_the_receive_and_leaves_nothing_waiting(peers) {
        require_gpu();
        let mut p = start(&peers, "pusher");
        let first = p.ep.recv().wait().unwrap();
        assert_eq!(frame_bytes(&first.frames[0]), pattern(64 << 20, 11));
        p.peer.kill();
        let started = Instant::now();
        loop {
            match p.ep.recv().wait() {
                Ok(m) => assert_eq!(frame_bytes(&m.frames[0]), pattern(64 << 20, 11), "only whole messages arrive"),
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
        let stats = p.ctx.stats().unwrap();
        assert_eq!(stats.unclaimed_bytes, 0, "{stats:?}");
        assert_eq!(stats.recvs_posted, 0, "{stats:?}");
    }
    peer(role) => {
        assert_eq!(role, "pusher");
        // The connector copies into this side's exported buffers, until it is killed.
        let (_ctx, ep) = connect_from_env();
        let mut msg = Some(Message::new(vec![], vec![device_buffer_with(0, &pattern(64 << 20, 11)).into()]));
        while let Some(m) = msg.take() {
            msg = ep.send(m).wait().ok();
        }
        std::thread::sleep(Duration::from_secs(60));
        return;
    },
}

/// Queues ~40 passes over 256 MiB on the legacy default stream without waiting (the last
/// writing the value the peer must see), sends at once, and checks the echo: three rounds.
fn copies_never_overtake_the_producer(p: ListeningParent) {
    let len = 256 << 20;
    let gpu = Gpu::get(0).unwrap();
    for round in 0..3u8 {
        // Reading the last echo may have bound the device it landed on.
        gpu.bind_to_current_thread().unwrap();
        let buf = cuda::DevicePool::shared(0).unwrap().alloc(len).unwrap();
        produce_slowly(&buf, std::ptr::null_mut(), 0xA0 + round);
        p.ep.send(Message::new(vec![], vec![buf.into()])).wait().unwrap();
        let back = p.ep.recv().wait().unwrap();
        let bytes = frame_bytes(&back.frames[0]);
        assert!(bytes.iter().all(|&b| b == 0xA0 + round), "round {round}: the copy overtook the producer");
    }
    p.stop_reporting_mappings();
}

/// Connector side of the offer tests: reports how many of its sends filled offers, then
/// waits for the listener's goodbye.
fn report_offered_sends(ep: &Endpoint) {
    let s = ep.stats();
    let report = format!("{} {}", s.offered_sends, s.offered_sends_gated);
    ep.send(Message::new(report.into_bytes(), vec![])).wait().unwrap();
    ep.recv().wait().unwrap();
}

/// Listener side of the offer tests: the connector's report (its sends that filled
/// offers, and those of them gated on a control-ring word), after which it may end.
fn offered_sends_of_peer(mut p: ListeningParent) -> (u64, u64) {
    let report = String::from_utf8(p.ep.recv().wait().unwrap().header).unwrap();
    let counts: Vec<u64> = report.split(' ').map(|n| n.parse().unwrap()).collect();
    p.ep.send(Message::new(b"bye".to_vec(), vec![])).wait().unwrap();
    p.peer.wait_success(Duration::from_secs(60));
    (counts[0], counts[1])
}

/// The layouts the offer test's connector sends, in order: device frame sizes, or `None`
/// for a host-only message, and whether a host frame rides along.
fn offer_test_layouts() -> Vec<(Vec<usize>, bool)> {
    vec![
        (vec![1 << 20], false),          // PushTargets; an offer of [1 MiB] follows
        (vec![1 << 20], false),          // fills it
        (vec![4 << 10, 1 << 20], false), // declines it; PushTargets
        (vec![4 << 10, 1 << 20], false), // fills the new offer
        (vec![], true),                  // host only: the offer stays
        (vec![1 << 20], false),          // declines; PushTargets
        (vec![1 << 20], false),          // fills it (received into the caller's buffer: no new offer)
        (vec![100 << 20], false),        // over the offer limit: PushTargets, no offer after it
        (vec![1 << 20], false),          // PushTargets; offer
        (vec![1 << 20], true),           // mixed: declines; the usual path
    ]
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn push_offers_serve_repeated_layouts_and_others_are_declined(peers) {
        require_gpu();
        let p = start(&peers, "sender");
        for (i, (sizes, host)) in offer_test_layouts().into_iter().enumerate() {
            let mut expected: Vec<Vec<u8>> =
                sizes.iter().enumerate().map(|(j, &s)| pattern(s, (i * 10 + j) as u64)).collect();
            if host {
                expected.push(pattern(100, i as u64 + 500));
            }
            let got = if i == 6 {
                let target = cuda::DevicePool::shared(0).unwrap().alloc(1 << 20).unwrap();
                p.ep.recv_into(vec![target.into()]).wait().unwrap()
            } else {
                p.ep.recv().wait().unwrap()
            };
            assert_eq!(got.header, vec![i as u8]);
            assert_eq!(got.frames.len(), expected.len(), "message {i}");
            for (j, (frame, want)) in got.frames.iter().zip(&expected).enumerate() {
                assert!(frame_bytes(frame) == *want, "message {i} frame {j} differs");
            }
            p.ep.send(Message::new(b"next".to_vec(), vec![])).wait().unwrap();
        }
        let (offered, gated) = offered_sends_of_peer(p);
        // Messages 1, 3 and 6 filled offers; the others could not (see the layouts).
        assert_eq!(offered, 3, "sends that went into offers");
        // One device, control rings: each push's end was a gate word, not an event.
        assert_eq!(gated, 3, "offered sends gated on a control-ring word");
    }
    peer(role) => {
        assert_eq!(role, "sender");
        let (_ctx, ep) = connect_from_env();
        for (i, (sizes, host)) in offer_test_layouts().into_iter().enumerate() {
            let mut frames: Vec<Frame> = Vec::new();
            for (j, &size) in sizes.iter().enumerate() {
                frames.push(device_buffer_with(0, &pattern(size, (i * 10 + j) as u64)).into());
            }
            if host {
                frames.push(pattern(100, i as u64 + 500).into());
            }
            ep.send(Message::new(vec![i as u8], frames)).wait().unwrap();
            // The listener's reply carries its offer behind it; give it time to arrive.
            ep.recv().wait().unwrap();
            std::thread::sleep(Duration::from_millis(20));
        }
        return report_offered_sends(&ep);
    },
}

/// The producer test's buffers: 48 MiB, under the offer limit, so rounds after the first
/// fill offers.
const PRODUCER_LEN: usize = 48 << 20;

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn the_pushers_copy_waits_for_the_producers_work(peers) {
        require_gpu();
        let p = start(&peers, "producer");
        for round in 0..4u8 {
            let got = p.ep.recv().wait().unwrap();
            let bytes = frame_bytes(&got.frames[0]);
            assert!(bytes.iter().all(|&b| b == 0xB0 + round), "round {round}: the push overtook the producer");
            p.ep.send(Message::new(b"next".to_vec(), vec![])).wait().unwrap();
        }
        let (offered, gated) = offered_sends_of_peer(p);
        assert_eq!(offered, 3, "rounds 1–3 fill offers");
        // The listener waited for each gate word, written after the copy, itself after
        // the producer's memsets on the legacy default stream.
        assert_eq!(gated, 3, "offered sends gated on a control-ring word");
    }
    peer(role) => {
        assert_eq!(role, "producer");
        // The connector pushes: its copy into the listener's buffer must wait for the
        // memsets it queued just before sending.
        let (_ctx, ep) = connect_from_env();
        let gpu = Gpu::get(0).unwrap();
        gpu.bind_to_current_thread().unwrap();
        for round in 0..4u8 {
            let buf = cuda::DevicePool::shared(0).unwrap().alloc(PRODUCER_LEN).unwrap();
            for pass in 0..200u8 {
                let value = if pass == 199 { 0xB0 + round } else { pass };
                // SAFETY: the buffer lives until the send completes, after the copy, which
                // the transport orders after these memsets.
                unsafe {
                    cudarc::driver::result::memset_d8_async(buf.device_ptr(), value, PRODUCER_LEN, std::ptr::null_mut()).unwrap()
                };
            }
            // Marks the end of the memsets; the push's copy runs after it, its gate after
            // the copy, so a send that completed truly finds it complete.
            let memsets_done = cuda::Event::new(&gpu).unwrap();
            memsets_done.record_on_legacy_default_stream().unwrap();
            ep.send(Message::new(vec![round], vec![buf.into()])).wait().unwrap();
            assert!(memsets_done.query().unwrap(), "round {round}: the send completed before its copy could run");
            ep.recv().wait().unwrap();
            std::thread::sleep(Duration::from_millis(20));
        }
        return report_offered_sends(&ep);
    },
}

/// The small pushes' sizes, three messages each (the first declines or meets no offer,
/// the next two fill offers): up to 4 KiB one launch of the copy kernel writes the gate.
const SMALL_PUSHES: [usize; 4] = [8, 100, 4096, 4097];

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn small_pushes_write_their_gate_from_the_copy_after_the_producers_work(peers) {
        require_gpu();
        let mut p = start(&peers, "small");
        for (i, round) in (0..SMALL_PUSHES.len() * 3).map(|i| (i, i as u8)) {
            let got = p.ep.recv().wait().unwrap();
            let want = pattern(SMALL_PUSHES[i / 3], 0xC0 + u64::from(round));
            assert!(frame_bytes(&got.frames[0]) == want, "message {i}: the push overtook the producer or lost bytes");
            p.ep.send(Message::new(b"next".to_vec(), vec![])).wait().unwrap();
        }
        let report = String::from_utf8(p.ep.recv().wait().unwrap().header).unwrap();
        let counts: Vec<u64> = report.split(' ').map(|n| n.parse().unwrap()).collect();
        p.ep.send(Message::new(b"bye".to_vec(), vec![])).wait().unwrap();
        p.peer.wait_success(Duration::from_secs(60));
        assert_eq!(counts[0], 8, "two of each size's three messages filled offers");
        assert_eq!(counts[1], 8, "every offered send was gated on a control-ring word");
        assert_eq!(counts[2], 6, "those of at most 4 KiB had the copy kernel write the gate");
    }
    peer(role) => {
        assert_eq!(role, "small");
        let (ctx, ep) = connect_from_env();
        let gpu = Gpu::get(0).unwrap();
        gpu.bind_to_current_thread().unwrap();
        let slow = cuda::DevicePool::shared(0).unwrap().alloc(PRODUCER_LEN).unwrap();
        for (i, round) in (0..SMALL_PUSHES.len() * 3).map(|i| (i, i as u8)) {
            let want = pattern(SMALL_PUSHES[i / 3], 0xC0 + u64::from(round));
            let staged = device_buffer_with(0, &want);
            let buf = cuda::DevicePool::shared(0).unwrap().alloc(want.len()).unwrap();
            // SAFETY: every buffer lives until the send completes, after the push, which
            // the transport orders after this work on the legacy default stream: 40
            // passes over 48 MiB, then the copy that gives the frame its bytes.
            unsafe {
                for pass in 0..40u8 {
                    cudarc::driver::result::memset_d8_async(slow.device_ptr(), pass, PRODUCER_LEN, std::ptr::null_mut()).unwrap();
                }
                cudarc::driver::result::memcpy_dtod_async(buf.device_ptr(), staged.device_ptr(), want.len(), std::ptr::null_mut()).unwrap();
            }
            // The push's copy runs after this event on the legacy stream, and the gate
            // after the copy: a send that completed finds it complete (a completion that
            // queried another stream did not,
            // docs/decisions/0029-copies-signal-their-own-end.md).
            let produced = cuda::Event::new(&gpu).unwrap();
            produced.record_on_legacy_default_stream().unwrap();
            ep.send(Message::new(vec![round], vec![buf.into()])).wait().unwrap();
            assert!(produced.query().unwrap(), "message {i}: the send completed before its copy could run");
            drop(staged);
            ep.recv().wait().unwrap();
            std::thread::sleep(Duration::from_millis(20));
        }
        let (s, c) = (ep.stats(), ctx.stats().unwrap());
        let report = format!("{} {} {}", s.offered_sends, s.offered_sends_gated, c.signalled_pushes);
        ep.send(Message::new(report.into_bytes(), vec![])).wait().unwrap();
        ep.recv().wait().unwrap();
        return;
    },
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn the_copy_waits_for_the_producers_work_when_each_receiver_copies(peers) {
        require_gpu();
        // Both sides pull: each polls its producer event before describing its frames.
        let p = start_with(&peers, "echo", "receiver");
        copies_never_overtake_the_producer(p);
    }
    "echo" => serve_echo_reporting_mappings(),
}
