//! Tests over real UCX: two workers in this process, TCP over loopback (the event fd's
//! wake-up: a worker in a second process, `tests/event_fd.rs`).
//!
//! Each test checks for UCX first: without it they print `skipped: UCX not available`
//! and pass, unless `FERRYLINK_REQUIRE_UCX=1`. Every wait is bounded by a deadline.

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::*;
use ferrylink_testkit::{pattern, peer_test, ucx_or_skip};

const DEADLINE: Duration = Duration::from_secs(60);

mod event_fd;
mod one_sided;

/// Loopback TCP only, set on the context (not the process environment, which tests
/// running in parallel threads share).
fn tcp_config() -> UcxConfig {
    UcxConfig::new().set("TLS", "tcp").set("NET_DEVICES", "lo")
}

/// A context, or `None` after `skipped: UCX not available` (the kit's [`ucx_or_skip`]:
/// fails instead with `FERRYLINK_REQUIRE_UCX=1`). Errors other than "UCX is missing" fail.
fn context_or_skip() -> Option<UcxContext> {
    ucx_or_skip(UcxContext::new(&tcp_config()).map_err(|e| match e {
        UcxError::Unavailable(e) => e,
        e => panic!("UCX context: {e}"),
    }))
}

/// Worker `a` with an endpoint to worker `b`.
struct Pair {
    a: UcxWorker,
    b: UcxWorker,
    ab: UcxEndpoint,
}

impl Pair {
    fn new(context: &UcxContext) -> Self {
        let a = UcxWorker::new(context).expect("worker a");
        let b = UcxWorker::new(context).expect("worker b");
        let ab = a.connect(&b.address().expect("address of b")).expect("connect a->b");
        Pair { a, b, ab }
    }

    /// Progresses both workers until `done()` or the deadline (then panics).
    fn progress_until(&self, what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + DEADLINE;
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            self.a.progress();
            self.b.progress();
        }
    }
}

/// Contexts and workers created at once in eight threads, with UCX's default
/// configuration (every transport module it finds, CUDA ones included where present): all
/// open within the deadline. Concurrent set-ups deadlocked inside UCX's module loading
/// on a machine with the CUDA-aware UCX; a deadlock fails here instead of hanging.
#[test]
fn contexts_and_workers_created_at_once_in_many_threads_all_open() {
    if context_or_skip().is_none() {
        return;
    }
    let start = std::sync::Arc::new(std::sync::Barrier::new(8));
    let (opened, results) = std::sync::mpsc::channel();
    for _ in 0..8 {
        let (start, opened) = (start.clone(), opened.clone());
        std::thread::spawn(move || {
            start.wait();
            let made = UcxContext::new(&UcxConfig::new()).and_then(|c| UcxWorker::new(&c).map(|w| (c, w)));
            let _ = opened.send(made.map(|_| ()).map_err(|e| e.to_string()));
        });
    }
    for i in 0..8 {
        match results.recv_timeout(DEADLINE) {
            Ok(made) => made.unwrap_or_else(|e| panic!("context or worker {i}: {e}")),
            Err(_) => panic!("{i} of 8 concurrent context and worker set-ups ended within {DEADLINE:?}"),
        }
    }
}

#[test]
fn context_reports_memory_types() {
    let Some(context) = context_or_skip() else { return };
    assert!(context.memory_types() & 1 != 0, "host memory must be accessible: {:#x}", context.memory_types());
    assert!(ucx_sys::version_supported(context.version()));
    // Debian's UCX has no CUDA transports: CUDA memory must be refused before UCX sees it.
    if !context.supports_cuda_memory() {
        let pair = Pair::new(&context);
        let mut fake_device = vec![0u8; 16];
        // SAFETY: the pointer is valid host memory for 16 bytes and outlives the call; the
        // send is refused before UCX is called, so nothing ever accesses it.
        let raw = unsafe { RawBuf::from_raw_parts(fake_device.as_mut_ptr().cast(), 16, MemoryType::Cuda) };
        let rejected = pair.ab.tag_send(1, raw).unwrap_err();
        assert!(matches!(rejected.error, UcxError::CudaUnsupported), "{rejected}");
        assert_eq!(rejected.buf.ptr(), fake_device.as_mut_ptr().cast());
    }
}

#[test]
fn missing_library_is_unavailable_not_a_panic() {
    let err = UcxContext::with_library_path("/nonexistent/libucp.so.0", &UcxConfig::new()).unwrap_err();
    assert!(matches!(err, UcxError::Unavailable(ucx_sys::LoadError::NotFound { .. })), "{err:?}");
    assert!(err.to_string().contains("install libucx / set FERRYLINK_UCX_LIB"), "{err}");
}

#[test]
fn configured_missing_library_is_unavailable_naming_the_path() {
    let config = UcxConfig::new().library_path("/nonexistent/configured/libucp.so.0");
    for _ in 0..2 {
        let err = UcxContext::new(&config).unwrap_err();
        assert!(matches!(err, UcxError::Unavailable(ucx_sys::LoadError::NotFound { .. })), "{err:?}");
        assert!(err.to_string().contains("/nonexistent/configured/libucp.so.0"), "{err}");
    }
}

#[test]
fn bad_option_is_a_config_error() {
    let Some(_) = context_or_skip() else { return };
    // A value UCX's parser refuses: `ucp_config_modify` names the option and the status.
    let err = UcxContext::new(&tcp_config().set("RNDV_THRESH", "not-a-size")).unwrap_err();
    assert!(
        matches!(&err, UcxError::Config { name, value, status }
            if name == "RNDV_THRESH" && value == "not-a-size" && *status == Status::ERR_INVALID_PARAM),
        "{err:?}"
    );
    assert_eq!(err.to_string(), format!("UCX option RNDV_THRESH=not-a-size rejected: {}", Status::ERR_INVALID_PARAM));
    // An unknown transport name passes the parser but leaves no usable transport.
    let err =
        UcxContext::new(&UcxConfig::new().set("TLS", "no_such_transport_xyz").set("NET_DEVICES", "lo")).unwrap_err();
    let no_device = Status(ucx_sys::UCS_ERR_NO_DEVICE);
    assert!(matches!(&err, UcxError::Call { call: "ucp_init_version", status } if *status == no_device), "{err:?}");
    // NUL bytes never reach UCX.
    let err = UcxContext::new(&UcxConfig::new().set("TLS", "tc\0p")).unwrap_err();
    assert!(matches!(err, UcxError::InteriorNul { what: "UCX option value" }), "{err:?}");
    let err = UcxContext::new(&UcxConfig::new().set("T\0LS", "tcp")).unwrap_err();
    assert!(matches!(err, UcxError::InteriorNul { what: "UCX option name" }), "{err:?}");
}

#[test]
fn tagged_messages_of_every_size_arrive_intact() {
    let Some(context) = context_or_skip() else { return };
    let pair = Pair::new(&context);
    for (i, &len) in [0usize, 1, 4096, 1 << 20, 64 << 20].iter().enumerate() {
        let tag = 0x100 + i as u64;
        let data = pattern(len, i as u64);
        let mut recv = pair.b.tag_recv(tag, u64::MAX, vec![0u8; len]).expect("post recv");
        let mut send = pair.ab.tag_send(tag, data.clone()).expect("send");
        pair.progress_until("transfer", || send.is_complete() && recv.is_complete());
        assert_eq!(send.poll(), Some(Ok(len)), "send of {len}");
        assert_eq!(recv.poll(), Some(Ok(len)), "recv of {len}");
        assert_eq!(recv.info(), Some(RecvInfo { sender_tag: tag, length: len }));
        let got = recv.into_buf().expect("complete");
        assert!(got == data, "contents of the {len}-byte message differ");
        assert_eq!(send.into_buf().expect("complete"), data, "send buffer given back");
    }
    assert_eq!(pair.a.orphans() + pair.b.orphans(), 0);
}

/// Contexts get ferrylink's TCP receive segments ([`TCP_RX_SEG_SIZE`], under the name
/// the loaded UCX knows it by) unless the environment, an option or the transport list
/// decides otherwise.
#[test]
fn ferrylink_defaults_yield_to_the_environment_and_the_options() {
    let v1_13 = ucx_sys::Version { major: 1, minor: 13, release: 1 };
    let v1_22 = ucx_sys::Version { major: 1, minor: 22, release: 0 };
    let vars = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string())
    };
    let segment = vec![("RX_SEG_SIZE".to_string(), TCP_RX_SEG_SIZE.to_string())];
    assert_eq!(UcxConfig::new().default_options(v1_13, vars(&[])), segment, "no UCX_* variables");
    assert_eq!(
        UcxConfig::new().default_options(v1_22, vars(&[])),
        vec![("TCP_RX_SEG_SIZE".to_string(), TCP_RX_SEG_SIZE.to_string())],
        "UCX 1.18 and later match transport options with their prefix"
    );
    assert_eq!(UcxConfig::new().set("TLS", "tcp").default_options(v1_13, vars(&[])), segment);
    for tls in ["tcp", "rc,tcp:aux,cuda_copy", "all", "^cuda_ipc"] {
        let env = move |name: &str| (name == "UCX_TLS").then(|| tls.to_string());
        assert_eq!(UcxConfig::new().default_options(v1_13, env), segment, "UCX_TLS={tls}");
    }
    // The user's own segment size wins, from the environment or an option (either name).
    assert!(UcxConfig::new().default_options(v1_13, vars(&[("UCX_TCP_RX_SEG_SIZE", "64K")])).is_empty());
    assert!(UcxConfig::new().set("RX_SEG_SIZE", "1M").default_options(v1_13, vars(&[])).is_empty());
    assert!(UcxConfig::new().set("TCP_RX_SEG_SIZE", "1M").default_options(v1_22, vars(&[])).is_empty());
    // No TCP: no option UCX would warn about. The last TLS option beats UCX_TLS.
    for tls in ["rc,sm,cuda_copy", "^tcp", "^ib,tcp"] {
        let env = move |name: &str| (name == "UCX_TLS").then(|| tls.to_string());
        assert!(UcxConfig::new().default_options(v1_13, env).is_empty(), "UCX_TLS={tls}");
    }
    assert!(UcxConfig::new().set("TLS", "rc").default_options(v1_13, vars(&[("UCX_TLS", "tcp")])).is_empty());
    // Plain UCX on request.
    assert!(UcxConfig::new().ferrylink_defaults(false).default_options(v1_13, vars(&[])).is_empty());
}

/// With ferrylink's large TCP segments, messages around and across segment boundaries,
/// received expected and unexpected, arrive intact; so they do with UCX's own segments.
#[test]
fn tcp_receive_segments_carry_every_size_intact() {
    let Some(_) = context_or_skip() else { return };
    let segment = 512 << 10;
    let sizes = [segment - 1, segment, segment + 1, 3 * segment + 17, 64 << 20];
    for config in [tcp_config(), tcp_config().ferrylink_defaults(false)] {
        let context = UcxContext::new(&config).expect("context");
        let pair = Pair::new(&context);
        for (i, &len) in sizes.iter().enumerate() {
            for expected in [true, false] {
                let tag = 0x200 + 2 * i as u64 + u64::from(expected);
                let data = pattern(len, i as u64);
                let mut recv = expected.then(|| pair.b.tag_recv(tag, u64::MAX, vec![0u8; len]).expect("post recv"));
                let mut send = pair.ab.tag_send(tag, data.clone()).expect("send");
                if recv.is_none() {
                    // Let the message (or its rendezvous request) arrive before the receive.
                    for _ in 0..100 {
                        pair.a.progress();
                        pair.b.progress();
                    }
                    recv = Some(pair.b.tag_recv(tag, u64::MAX, vec![0u8; len]).expect("post recv"));
                }
                let mut recv = recv.expect("posted");
                pair.progress_until("transfer", || send.is_complete() && recv.is_complete());
                let what = format!("{len} bytes, expected {expected}, {config:?}");
                assert_eq!(recv.poll(), Some(Ok(len)), "{what}");
                assert!(recv.into_buf().expect("complete") == data, "contents of {what}");
                assert_eq!(send.poll(), Some(Ok(len)), "{what}");
            }
        }
        assert_eq!(pair.a.orphans() + pair.b.orphans(), 0);
    }
}

#[test]
fn many_messages_in_flight_both_orders() {
    let Some(context) = context_or_skip() else { return };
    let pair = Pair::new(&context);
    let sizes: Vec<usize> = (0..96).map(|i| [0, 7, 4096, 65536 + i, 300_000][i % 5]).collect();
    // Half the receives are posted before the sends (expected), half after (unexpected).
    let mut recvs = Vec::new();
    for (i, &len) in sizes.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
        recvs.push((i, pair.b.tag_recv(i as u64, u64::MAX, vec![0u8; len]).unwrap()));
    }
    let mut sends: Vec<_> =
        sizes.iter().enumerate().map(|(i, &len)| pair.ab.tag_send(i as u64, pattern(len, i as u64)).unwrap()).collect();
    for (i, &len) in sizes.iter().enumerate().filter(|(i, _)| i % 2 == 1) {
        recvs.push((i, pair.b.tag_recv(i as u64, u64::MAX, vec![0u8; len]).unwrap()));
    }
    pair.progress_until("all transfers", || {
        sends.iter_mut().all(|s| s.is_complete()) && recvs.iter_mut().all(|(_, r)| r.is_complete())
    });
    for (i, mut recv) in recvs {
        assert_eq!(recv.poll(), Some(Ok(sizes[i])), "message {i}");
        assert!(recv.into_buf().unwrap() == pattern(sizes[i], i as u64), "contents of message {i}");
    }
    for (i, mut send) in sends.into_iter().enumerate() {
        assert_eq!(send.poll(), Some(Ok(sizes[i])));
    }
}

#[test]
fn tag_mask_matches_and_reports_sender_tag() {
    let Some(context) = context_or_skip() else { return };
    let pair = Pair::new(&context);
    let mut recv = pair.b.tag_recv(0xAB00, 0xFF00, vec![0u8; 8]).unwrap();
    let mut send = pair.ab.tag_send(0xAB42, b"12345".to_vec()).unwrap();
    pair.progress_until("masked transfer", || send.is_complete() && recv.is_complete());
    assert_eq!(recv.info(), Some(RecvInfo { sender_tag: 0xAB42, length: 5 }));
    assert_eq!(&recv.into_buf().unwrap()[..5], b"12345");
}

#[test]
fn message_longer_than_buffer_is_truncated_error() {
    let Some(context) = context_or_skip() else { return };
    let pair = Pair::new(&context);
    for len in [64usize, 1 << 20] {
        let mut recv = pair.b.tag_recv(5, u64::MAX, vec![0u8; 16]).unwrap();
        let mut send = pair.ab.tag_send(5, pattern(len, 1)).unwrap();
        pair.progress_until("truncated transfer", || send.is_complete() && recv.is_complete());
        assert_eq!(recv.poll(), Some(Err(Status::ERR_MESSAGE_TRUNCATED)), "{len}");
        assert!(recv.info().is_none());
    }
}

#[test]
fn dropped_or_cancelled_receives_release_their_buffer_and_eat_nothing() {
    let Some(context) = context_or_skip() else { return };
    let pair = Pair::new(&context);
    let mut cancelled = pair.b.tag_recv(9, u64::MAX, vec![0u8; 64]).unwrap();
    cancelled.cancel();
    pair.progress_until("cancel", || cancelled.is_complete());
    assert_eq!(cancelled.poll(), Some(Err(Status::ERR_CANCELED)));
    assert_eq!(cancelled.into_buf().unwrap().len(), 64, "buffer given back");

    drop(pair.b.tag_recv(9, u64::MAX, vec![0u8; 64]).unwrap());
    assert_eq!(pair.b.orphans(), 0, "an unmatched receive is cancelled at once on drop");

    // Neither consumed the message sent afterwards.
    let mut send = pair.ab.tag_send(9, b"still here".to_vec()).unwrap();
    let mut recv = pair.b.tag_recv(9, u64::MAX, vec![0u8; 64]).unwrap();
    pair.progress_until("transfer after cancel", || send.is_complete() && recv.is_complete());
    assert_eq!(recv.poll(), Some(Ok(10)));
}

#[test]
fn dropping_an_incomplete_send_keeps_its_buffer_until_ucx_is_done() {
    let Some(context) = context_or_skip() else { return };
    let pair = Pair::new(&context);
    let len = 32 << 20;
    // Large enough for rendezvous: it cannot complete before the receiver matches it.
    let mut send = pair.ab.tag_send(77, pattern(len, 3)).unwrap();
    for _ in 0..10 {
        pair.a.progress();
        pair.b.progress();
    }
    assert!(!send.is_complete(), "a 32 MiB rendezvous send completed with no receiver");
    drop(send);
    assert_eq!(pair.a.orphans(), 1, "UCX cannot cancel a send: the worker keeps the buffer");
    // The data is still sent correctly from the orphaned buffer.
    let mut recv = pair.b.tag_recv(77, u64::MAX, vec![0u8; len]).unwrap();
    pair.progress_until("orphaned send", || recv.is_complete() && pair.a.orphans() == 0);
    assert_eq!(recv.poll(), Some(Ok(len)));
    assert!(recv.into_buf().unwrap() == pattern(len, 3));
}

/// Sends to `ep` until the connection is up (one small message each way is matched).
fn warm_up(a: &UcxWorker, b: &UcxWorker, ab: &UcxEndpoint) {
    let mut send = ab.tag_send(1, vec![1u8; 8]).unwrap();
    let mut recv = b.tag_recv(1, u64::MAX, vec![0u8; 8]).unwrap();
    let deadline = Instant::now() + DEADLINE;
    while !(send.is_complete() && recv.is_complete()) {
        assert!(Instant::now() < deadline, "warm-up transfer");
        a.progress();
        b.progress();
    }
}

/// Progresses `a` until every send completed and the endpoint's error callback ran;
/// checks that the sends failed and the endpoint now refuses work and closes promptly.
fn expect_peer_failure(a: &UcxWorker, ab: UcxEndpoint, mut sends: Vec<TagSend<std::sync::Arc<[u8]>>>) {
    let deadline = Instant::now() + DEADLINE;
    while !sends.iter_mut().all(|s| s.is_complete()) || ab.error().is_none() {
        assert!(
            Instant::now() < deadline,
            "no failure reported: sends complete {:?}, endpoint error {:?}",
            sends.iter_mut().map(|s| s.poll()).collect::<Vec<_>>(),
            ab.error()
        );
        a.progress();
    }
    let failed = sends.iter_mut().filter_map(|s| s.poll()).filter(Result::is_err).count();
    assert!(failed > 0, "no send failed although the peer went away");
    let status = ab.error().unwrap();
    assert!(status.is_err(), "{status}");
    // A failed endpoint refuses new sends, giving the buffer back.
    let rejected = ab.tag_send(99, vec![5u8; 3]).unwrap_err();
    assert!(matches!(rejected.error, UcxError::EndpointFailed { .. }), "{rejected}");
    assert_eq!(rejected.buf, vec![5u8; 3]);
    // Closing a failed endpoint forces and completes with local progress only.
    ab.close(CloseMode::Flush).wait(Duration::from_secs(10)).ok();
    drop(sends);
    assert_eq!(a.orphans(), 0);
}

#[test]
fn peer_worker_destroyed_mid_transfer_fails_requests_without_hanging() {
    let Some(context) = context_or_skip() else { return };
    let Pair { a, b, ab } = Pair::new(&context);
    warm_up(&a, &b, &ab);
    // Rendezvous sends the peer has been told about but never receives.
    let data: std::sync::Arc<[u8]> = pattern(64 << 20, 9).into();
    let mut sends: Vec<_> = (0..4).map(|i| ab.tag_send(2 + i, data.clone()).unwrap()).collect();
    for _ in 0..20 {
        a.progress();
        b.progress();
    }
    assert!(sends.iter_mut().all(|s| !s.is_complete()), "transfers in flight");
    drop(b); // the peer worker goes away, sockets and all
    expect_peer_failure(&a, ab, sends);
}

peer_test! {
    /// The peer is another process (this test binary) killed with SIGKILL while it is
    /// receiving.
    fn peer_process_killed_mid_transfer_fails_requests_without_hanging(peers) {
        let Some(context) = context_or_skip() else { return };
        let mut child = peers.spawn("receiver", &[]);
        let address = from_hex(&child.expect_line_with("PEER-ADDRESS ", DEADLINE));
        let a = UcxWorker::new(&context).unwrap();
        // SAFETY: the bytes are the child's UcxWorker::address, passed intact through a pipe.
        let ab = a.connect(&unsafe { WorkerAddress::from_bytes_unchecked(address) }).unwrap();
        let data: std::sync::Arc<[u8]> = pattern(64 << 20, 9).into();
        let mut sends: Vec<_> = (0..4).map(|i| ab.tag_send(2 + i, data.clone()).unwrap()).collect();
        // Let the first transfer get going (the child receives tag 2), then kill the child.
        let until = Instant::now() + Duration::from_millis(300);
        while Instant::now() < until {
            a.progress();
        }
        assert!(sends.iter_mut().any(|s| !s.is_complete()), "transfers in flight");
        child.kill();
        expect_peer_failure(&a, ab, sends);
    }
    // Prints its worker address, receives, and progresses until killed (at most 60 s).
    "receiver" => {
        use std::io::Write;

        let context = UcxContext::new(&tcp_config()).expect("UCX in the child");
        let worker = UcxWorker::new(&context).unwrap();
        let mut recv = worker.tag_recv(2, u64::MAX, vec![0u8; 64 << 20]).unwrap();
        println!("\nPEER-ADDRESS {}", to_hex(worker.address().unwrap().as_bytes()));
        std::io::stdout().flush().unwrap();
        let deadline = Instant::now() + DEADLINE;
        while Instant::now() < deadline {
            worker.progress();
            recv.is_complete();
        }
    },
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(hex: &str) -> Vec<u8> {
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
}

#[test]
fn endpoint_close_flushes_and_drop_forces() {
    let Some(context) = context_or_skip() else { return };
    let pair = Pair::new(&context);
    let mut recv = pair.b.tag_recv(3, u64::MAX, vec![0u8; 1 << 20]).unwrap();
    drop(pair.ab.tag_send(3, pattern(1 << 20, 4)).unwrap()); // the worker keeps the buffer
    let mut closing = pair.ab.close(CloseMode::Flush);
    // A flush close completes once the peer has taken everything (the peer must progress).
    let deadline = Instant::now() + DEADLINE;
    while closing.poll().is_none() || !recv.is_complete() {
        assert!(Instant::now() < deadline, "flush close never completed");
        pair.a.progress();
        pair.b.progress();
    }
    assert_eq!(closing.poll(), Some(Ok(())));
    assert_eq!(recv.poll(), Some(Ok(1 << 20)));
    assert!(recv.into_buf().unwrap() == pattern(1 << 20, 4), "flushed data intact");
    assert_eq!(pair.a.orphans(), 0);

    // Dropping an endpoint never blocks; the forced close ends with local progress.
    let ab = pair.a.connect(&pair.b.address().unwrap()).unwrap();
    warm_up(&pair.a, &pair.b, &ab);
    let started = Instant::now();
    drop(ab);
    assert!(started.elapsed() < Duration::from_secs(1));
    pair.a.progress_until(DEADLINE, || pair.a.orphans() == 0).expect("forced close ends");
}

/// Manual measurement, two threads each owning a worker (like two processes):
/// `cargo test -p ferrylink-transport --release ucx::tests::bandwidth -- --ignored --nocapture`
/// (`FERRYLINK_UCX_BENCH_WINDOW`, default 4: sends in flight). The contexts get ferrylink's
/// TCP segments ([`TCP_RX_SEG_SIZE`]); `UCX_TCP_RX_SEG_SIZE=64K` measures UCX's own.
#[test]
#[ignore = "measurement, run by hand"]
fn bandwidth_64mib_tcp_loopback() {
    let Some(_) = context_or_skip() else { return };
    // FERRYLINK_UCX_BENCH_NO_WAKEUP=1: busy-poll-only contexts (no event fd).
    let config = tcp_config().wakeup(std::env::var_os("FERRYLINK_UCX_BENCH_NO_WAKEUP").is_none());
    let context = UcxContext::new(&config).unwrap();
    let len = 64 << 20;
    let iterations = 20usize;
    let warmup = 2usize;
    let total = warmup + iterations;
    let window: usize = std::env::var("FERRYLINK_UCX_BENCH_WINDOW").ok().and_then(|w| w.parse().ok()).unwrap_or(4);
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    // FERRYLINK_UCX_BENCH_SEPARATE=1: one context per side, as with two processes.
    let recv_context = match std::env::var_os("FERRYLINK_UCX_BENCH_SEPARATE") {
        Some(_) => UcxContext::new(&config).unwrap(),
        None => context.clone(),
    };
    let receiver = std::thread::spawn(move || {
        let worker = UcxWorker::new(&recv_context).unwrap();
        addr_tx.send(worker.address().unwrap()).unwrap();
        // Touched up front: page faults are not what is measured.
        let mut buffers: Vec<Vec<u8>> = (0..window).map(|_| vec![0xAA; len]).collect();
        let mut pending = std::collections::VecDeque::new();
        let (mut posted, mut done) = (0, 0);
        while done < total {
            while posted < total && pending.len() < window {
                let buf = buffers.pop().unwrap();
                pending.push_back(worker.tag_recv(posted as u64, u64::MAX, buf).unwrap());
                posted += 1;
            }
            worker.progress();
            if pending.front_mut().is_some_and(|r| r.is_complete()) {
                let mut r = pending.pop_front().unwrap();
                assert_eq!(r.poll(), Some(Ok(len)));
                buffers.push(r.into_buf().unwrap());
                done += 1;
            }
        }
    });
    let worker = UcxWorker::new(&context).unwrap();
    let ep = worker.connect(&addr_rx.recv().unwrap()).unwrap();
    let data: std::sync::Arc<[u8]> = pattern(len, 1).into();
    // Sends tags in `range`, `window` at a time, until all completed.
    let send_all = |range: std::ops::Range<usize>| {
        let mut pending = std::collections::VecDeque::new();
        let mut next = range.start;
        while next < range.end || !pending.is_empty() {
            while next < range.end && pending.len() < window {
                pending.push_back(ep.tag_send(next as u64, data.clone()).unwrap());
                next += 1;
            }
            worker.progress();
            if pending.front_mut().is_some_and(|s: &mut TagSend<_>| s.is_complete()) {
                assert_eq!(pending.pop_front().unwrap().poll(), Some(Ok(len)));
            }
        }
    };
    send_all(0..warmup);
    let started = Instant::now();
    send_all(warmup..total);
    let secs = started.elapsed().as_secs_f64();
    receiver.join().unwrap();
    let bytes = (len * iterations) as f64;
    println!(
        "UCX tag 64 MiB x {iterations} over tcp loopback (window {window}): {:.3} GB/s, {:.1} MiB/s",
        bytes / secs / 1e9,
        bytes / secs / (1 << 20) as f64
    );
    drop(ep);
}

#[test]
fn busy_poll_only_context_has_no_event_fd_but_transfers() {
    let Some(_) = context_or_skip() else { return };
    let context = UcxContext::new(&tcp_config().wakeup(false)).unwrap();
    let pair = Pair::new(&context);
    assert!(pair.a.event_fd().is_err(), "no WAKEUP feature, no event fd");
    let mut recv = pair.b.tag_recv(1, u64::MAX, vec![0u8; 4096]).unwrap();
    let mut send = pair.ab.tag_send(1, pattern(4096, 2)).unwrap();
    pair.progress_until("busy-poll transfer", || send.is_complete() && recv.is_complete());
    assert_eq!(recv.into_buf().unwrap(), pattern(4096, 2));
}
