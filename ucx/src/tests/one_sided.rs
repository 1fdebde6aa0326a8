//! One-sided transfers over real UCX: registrations, keys, puts, gets and flushes between
//! two contexts of this process over TCP loopback (UCX emulates RMA there with active
//! messages, so the target's worker must progress, as the transport's progress thread
//! does). Every region is checked byte for byte against a model of what it should hold.
//!
//! On a warm TCP connection UCX 1.13 completes many puts inside `ucp_put_nbx` (up to 1
//! MiB: the bytes fit the socket), so the immediate-completion path runs in the size and
//! offset tests; 64 MiB transfers and every get return a request. Under valgrind (no
//! errors in UCX or here) a dropped request's buffer freed early shows as invalid reads.

use super::*;

/// Contexts with RMA on, over loopback TCP.
fn rma_config() -> UcxConfig {
    tcp_config().rma(true)
}

/// An initiator context and worker `a` with an endpoint to the target worker `b` of its
/// own context (as with two processes), both with RMA; `None` after the skip line.
struct RmaPair {
    pair: Pair,
    /// The target's context, where its registrations live.
    target: UcxContext,
}

impl RmaPair {
    fn new_or_skip() -> Option<Self> {
        // Skips without UCX (fails instead under FERRYLINK_REQUIRE_UCX=1).
        context_or_skip()?;
        let initiator = UcxContext::new(&rma_config()).expect("initiator context");
        let target = UcxContext::new(&rma_config()).expect("target context");
        let a = UcxWorker::new(&initiator).expect("worker a");
        let b = UcxWorker::new(&target).expect("worker b");
        let ab = a.connect(&b.address().expect("address of b")).expect("connect a->b");
        Some(RmaPair { pair: Pair { a, b, ab }, target })
    }

    /// Registers `bytes` in the target and unpacks its key for `ab`.
    fn region(&self, bytes: Vec<u8>) -> (Registration<Vec<u8>>, RemoteKey) {
        let registration = self.target.register(bytes).expect("register");
        let key = self.pair.ab.unpack_rkey(&registration.region_key().expect("pack")).expect("unpack");
        assert_eq!((key.address(), key.len()), (registration.address(), registration.len() as u64));
        (registration, key)
    }

    fn wait_put(&self, put: &mut Put<impl SendBuf>) -> usize {
        self.pair.progress_until("put", || put.is_complete());
        put.poll().expect("complete").expect("put succeeded")
    }

    fn wait_get<B: RecvBuf>(&self, mut get: Get<B>) -> B {
        self.pair.progress_until("get", || get.is_complete());
        get.poll().expect("complete").expect("get succeeded");
        get.into_buf().expect("complete")
    }

    /// Flushes `ab` and waits: the puts before it are then visible at the target.
    fn flush(&self) {
        let mut flush = self.pair.ab.flush().expect("flush");
        self.pair.progress_until("flush", || flush.is_complete());
        assert_eq!(flush.poll(), Some(Ok(())));
    }
}

/// The target's registered bytes, once every put to them has been flushed.
fn flushed_bytes(registration: &Registration<Vec<u8>>) -> &[u8] {
    // SAFETY: callers flushed the only endpoint that holds the key and start no operation
    // while the slice lives.
    unsafe { registration.buf() }
}

/// Where two byte strings first differ (assert_eq! on megabytes prints megabytes).
fn first_difference(got: &[u8], want: &[u8]) -> Option<usize> {
    if got == want {
        return None;
    }
    if got.len() != want.len() {
        return Some(got.len().min(want.len()));
    }
    got.iter().zip(want).position(|(g, w)| g != w)
}

#[test]
fn puts_and_gets_of_every_size_arrive_intact() {
    let Some(rma) = RmaPair::new_or_skip() else { return };
    for (i, &len) in [1usize, 4096, 1 << 20, 64 << 20].iter().enumerate() {
        let before = pattern(len, 10 + i as u64);
        let (registration, key) = rma.region(before.clone());
        // A get reads what the target holds.
        let got = rma.wait_get(rma.pair.ab.get(&key, 0, vec![0u8; len]).expect("get"));
        assert_eq!(first_difference(&got, &before), None, "get of {len} bytes");
        // A put replaces it, visible after the flush.
        let after = pattern(len, 20 + i as u64);
        let mut put = rma.pair.ab.put(&key, 0, after.clone()).expect("put");
        assert_eq!(rma.wait_put(&mut put), len);
        assert_eq!(first_difference(&put.into_buf().expect("complete"), &after), None, "put buffer given back");
        rma.flush();
        assert_eq!(first_difference(flushed_bytes(&registration), &after), None, "target after a put of {len}");
        let got = rma.wait_get(rma.pair.ab.get(&key, 0, vec![0u8; len]).expect("get"));
        assert_eq!(first_difference(&got, &after), None, "get after the put of {len} bytes");
        drop(key);
        assert_eq!(first_difference(&registration.into_buf(), &after), None, "buffer given back");
    }
    assert_eq!(rma.pair.a.orphans() + rma.pair.b.orphans(), 0);
}

/// Each write is put, flushed and read back; after each the whole region matches the
/// model, so a write that landed one byte off (or spilled) shows.
#[test]
fn offsets_at_the_start_middle_and_last_byte_of_a_region() {
    let Some(rma) = RmaPair::new_or_skip() else { return };
    let len = (1 << 20) + 3; // odd: the middle is not aligned
    let mut model = pattern(len, 30);
    let (registration, key) = rma.region(model.clone());
    let (middle, last) = (len / 2, len - 1);
    let writes = [
        (0, vec![0xa1]),
        (middle, vec![0xb2]),
        (last, vec![0xc3]),
        (0, pattern(4096, 31)),
        (middle - 2048, pattern(4096, 32)),
        (len - 4096, pattern(4096, 33)),
        (0, pattern(len, 34)),
    ];
    for (offset, bytes) in writes {
        let n = bytes.len();
        let mut put = rma.pair.ab.put(&key, offset as u64, bytes.clone()).expect("put");
        assert_eq!(rma.wait_put(&mut put), n);
        rma.flush();
        model[offset..offset + n].copy_from_slice(&bytes);
        let at = first_difference(flushed_bytes(&registration), &model);
        assert_eq!(at, None, "region after {n} bytes at offset {offset}");
        let got = rma.wait_get(rma.pair.ab.get(&key, offset as u64, vec![0u8; n]).expect("get"));
        assert_eq!(first_difference(&got, &bytes), None, "get of {n} bytes at offset {offset}");
        for probe in [0, middle, last] {
            let got = rma.wait_get(rma.pair.ab.get(&key, probe as u64, vec![0u8; 1]).expect("get"));
            assert_eq!(got[0], model[probe], "byte {probe} after the write at {offset}");
        }
    }
}

/// Spans laid out `gap` apart in the region, and where each sits in a local buffer that
/// holds them back to back in reverse order.
fn scattered_spans(region_len: usize) -> (Vec<RmaSpan>, usize) {
    let mut remote = Vec::new();
    let (mut at, mut i) = (0usize, 0usize);
    loop {
        let (gap, n) = (i % 5, 1 + (i * 7919) % 6000);
        if at + gap + n > region_len {
            break;
        }
        remote.push((at + gap, n));
        at += gap + n;
        i += 1;
    }
    let mut local = 0usize;
    let spans = remote
        .iter()
        .rev()
        .map(|&(offset, n)| {
            let span = RmaSpan::new(local, offset as u64, n);
            local += n;
            span
        })
        .collect();
    (spans, local)
}

/// Hundreds of spans in one put request, as many more single puts, one flush issued
/// right behind them: the region matches byte for byte, and one batched get reads the
/// spans back.
#[test]
fn a_batch_of_many_puts_then_one_flush() {
    let Some(rma) = RmaPair::new_or_skip() else { return };
    let len = 1 << 20;
    let (registration, key) = rma.region(vec![0u8; len]);
    let (spans, local_len) = scattered_spans(len);
    assert!(spans.len() > 300, "{} spans", spans.len());
    let local = pattern(local_len, 40);
    let mut model = vec![0u8; len];
    for span in &spans {
        let (l, r) = (span.local_offset, span.remote_offset as usize);
        model[r..r + span.len].copy_from_slice(&local[l..l + span.len]);
    }
    let (batched, singles) = spans.split_at(spans.len() / 2);
    let mut batch = rma.pair.ab.put_spans(&key, local.clone(), batched).expect("batched put");
    let mut puts: Vec<_> = singles
        .iter()
        .map(|s| {
            let bytes = local[s.local_offset..s.local_offset + s.len].to_vec();
            rma.pair.ab.put(&key, s.remote_offset, bytes).expect("single put")
        })
        .collect();
    let mut flush = rma.pair.ab.flush().expect("flush");
    rma.pair.progress_until("puts and flush", || {
        flush.is_complete() && batch.is_complete() && puts.iter_mut().all(|p| p.is_complete())
    });
    assert_eq!(flush.poll(), Some(Ok(())));
    assert_eq!(batch.poll(), Some(Ok(batched.iter().map(|s| s.len).sum())));
    assert!(puts.iter_mut().all(|p| p.poll().is_some_and(|r| r.is_ok())));
    assert_eq!(first_difference(flushed_bytes(&registration), &model), None, "region after the batch");

    let got = rma.wait_get(rma.pair.ab.get_spans(&key, vec![0u8; local_len], &spans).expect("batched get"));
    assert_eq!(first_difference(&got, &local), None, "batched get");
    assert_eq!(rma.pair.a.orphans() + rma.pair.b.orphans(), 0);
}

/// `ab.put` refused with exactly `error`, the buffer given back untouched.
fn expect_refused_put(rma: &RmaPair, key: &RemoteKey, spans: &[RmaSpan], error: &str) {
    let buf = pattern(64, 7);
    let rejected = rma.pair.ab.put_spans(key, buf.clone(), spans).expect_err("out of range");
    assert_eq!(rejected.error.to_string(), error, "{spans:?}");
    assert!(matches!(rejected.error, UcxError::OutOfBounds { .. }), "{:?}", rejected.error);
    assert_eq!(rejected.buf, buf);
}

/// The key describes less than was registered (what a peer lying about its range looks
/// like from here): operations past either end of the described range are refused before
/// UCX sees them, and the registered bytes around it never change.
#[test]
fn out_of_range_ops_are_refused_and_write_nothing() {
    let Some(rma) = RmaPair::new_or_skip() else { return };
    let page = 4096usize;
    let mut model = pattern(3 * page, 50);
    let registration = rma.target.register(model.clone()).expect("register");
    let real = registration.region_key().expect("pack");
    let middle = RegionKey { address: real.address + page as u64, length: page as u64, rkey: real.rkey.clone() };
    let key = rma.pair.ab.unpack_rkey(&middle).expect("unpack");
    let out = |side, offset: u64, len: u64, bound: u64| UcxError::OutOfBounds { side, offset, len, bound }.to_string();
    let remote = |offset, len| out(SpanSide::Remote, offset, len, page as u64);
    expect_refused_put(&rma, &key, &[RmaSpan::new(0, page as u64, 1)], &remote(4096, 1));
    expect_refused_put(&rma, &key, &[RmaSpan::new(0, page as u64 - 1, 2)], &remote(4095, 2));
    expect_refused_put(&rma, &key, &[RmaSpan::new(0, u64::MAX, 1)], &remote(u64::MAX, 1));
    expect_refused_put(&rma, &key, &[RmaSpan::new(0, u64::MAX - 7, 16)], &remote(u64::MAX - 7, 16));
    // One bad span among good ones refuses the whole request; nothing is written.
    let mixed = [RmaSpan::new(0, 0, 8), RmaSpan::new(8, 100, 8), RmaSpan::new(16, 4090, 8)];
    expect_refused_put(&rma, &key, &mixed, &remote(4090, 8));
    // The local buffer bounds its spans too.
    expect_refused_put(&rma, &key, &[RmaSpan::new(60, 0, 8)], &out(SpanSide::Local, 60, 8, 64));
    // A whole buffer longer than the region.
    let rejected = rma.pair.ab.put(&key, 0, vec![9u8; page + 1]).expect_err("longer than the region");
    assert_eq!(rejected.error.to_string(), remote(0, 4097));
    // Gets are bounded the same way.
    let rejected = rma.pair.ab.get(&key, page as u64, vec![0u8; 1]).expect_err("get past the end");
    assert_eq!(rejected.error.to_string(), remote(4096, 1));
    assert_eq!(rejected.buf, vec![0u8; 1]);
    let rejected = rma.pair.ab.get_spans(&key, vec![0u8; 4], &[RmaSpan::new(2, 0, 4)]).expect_err("local");
    assert_eq!(rejected.error.to_string(), out(SpanSide::Local, 2, 4, 4));

    // Inside: the described page is written to its last byte, its neighbours not at all.
    let bytes = pattern(page, 51);
    let mut put = rma.pair.ab.put(&key, 0, bytes.clone()).expect("put of the whole range");
    rma.wait_put(&mut put);
    rma.flush();
    model[page..2 * page].copy_from_slice(&bytes);
    assert_eq!(first_difference(flushed_bytes(&registration), &model), None);
}

/// `ab.unpack_rkey(key)` refused as an invalid key: the fault.
fn refused_key(rma: &RmaPair, key: &RegionKey) -> KeyFault {
    match rma.pair.ab.unpack_rkey(key) {
        Err(UcxError::InvalidRemoteKey(fault)) => fault,
        other => panic!("{key:?} ({:02x?}) was not refused as invalid: {other:?}", key.rkey),
    }
}

/// Empty, short, truncated, oversized, garbage and odd keys are refused before UCX parses
/// them; the real key still works afterwards.
#[test]
fn garbage_and_short_rkey_bytes_are_refused() {
    let Some(rma) = RmaPair::new_or_skip() else { return };
    let registration = rma.target.register(vec![0u8; 4096]).expect("register");
    let real = registration.region_key().expect("pack");
    let with = |rkey: Vec<u8>| RegionKey { rkey, ..real.clone() };
    assert_eq!(refused_key(&rma, &with(Vec::new())), KeyFault::TooShort { len: 0 });
    for cut in 1..real.rkey.len() {
        let fault = refused_key(&rma, &with(real.rkey[..cut].to_vec()));
        let expected = if cut < 9 {
            matches!(fault, KeyFault::TooShort { len } if len == cut)
        } else {
            matches!(fault, KeyFault::Truncated { len, .. } if len == cut)
        };
        assert!(expected, "{cut} of {} bytes: {fault:?}", real.rkey.len());
    }
    for seed in 0..64u64 {
        let garbage = pattern(9 + seed as usize * 37, 60 + seed);
        let fault = refused_key(&rma, &with(garbage));
        assert!(!matches!(fault, KeyFault::TooShort { .. }), "{fault:?}");
    }
    let mut odd_type = real.rkey.clone();
    odd_type[8] = 7;
    assert_eq!(refused_key(&rma, &with(odd_type)), KeyFault::MemoryType(7));
    let mut trailing = real.rkey.clone();
    trailing.extend(std::iter::repeat_n(0xff, MAX_RKEY_TRAILER + 1));
    assert_eq!(refused_key(&rma, &with(trailing)), KeyFault::TrailingBytes { extra: MAX_RKEY_TRAILER + 1 });
    let huge = vec![0u8; MAX_PACKED_RKEY_LEN + 1];
    assert_eq!(refused_key(&rma, &with(huge)), KeyFault::TooLong { len: MAX_PACKED_RKEY_LEN + 1 });
    let range = |address, length| RegionKey { address, length, rkey: real.rkey.clone() };
    assert_eq!(refused_key(&rma, &range(real.address, 0)), KeyFault::EmptyRange);
    assert_eq!(refused_key(&rma, &range(0, 4096)), KeyFault::NullAddress);
    assert_eq!(
        refused_key(&rma, &range(u64::MAX - 100, 4096)),
        KeyFault::RangeOverflow { address: u64::MAX - 100, length: 4096 }
    );

    let key = rma.pair.ab.unpack_rkey(&real).expect("the real key");
    let mut put = rma.pair.ab.put(&key, 0, pattern(4096, 61)).expect("put");
    rma.wait_put(&mut put);
    rma.flush();
    assert_eq!(first_difference(flushed_bytes(&registration), &pattern(4096, 61)), None);
}

/// Unmapping after the requests completed gives the bytes back as the peer left them, the
/// peer's key can outlive the registration harmlessly, and the memory can be registered
/// again.
#[test]
fn a_registration_dropped_after_its_requests_completed() {
    let Some(rma) = RmaPair::new_or_skip() else { return };
    let len = 1 << 20;
    let (registration, key) = rma.region(vec![0u8; len]);
    let mut put = rma.pair.ab.put(&key, 0, pattern(len, 90)).expect("put");
    rma.wait_put(&mut put);
    rma.flush();
    let got = rma.wait_get(rma.pair.ab.get(&key, 0, vec![0u8; len]).expect("get"));
    assert_eq!(first_difference(&got, &pattern(len, 90)), None);
    let buf = registration.into_buf();
    assert_eq!(first_difference(&buf, &pattern(len, 90)), None, "unmapped bytes");
    // The key stays with the initiator until it drops it; nothing refers to the mapping.
    assert!(key.is_live());
    drop(key);

    let (registration, key) = rma.region(buf);
    let mut put = rma.pair.ab.put(&key, 1, pattern(len - 1, 91)).expect("put");
    rma.wait_put(&mut put);
    rma.flush();
    drop(put);
    let buf = registration.into_buf();
    assert_eq!(buf[0], pattern(len, 90)[0]);
    assert_eq!(first_difference(&buf[1..], &pattern(len - 1, 91)), None, "registered again");
    assert_eq!(rma.pair.a.orphans() + rma.pair.b.orphans(), 0);
}

/// A put, a get and a batched put dropped in flight: the worker keeps their buffers (and
/// the key) until UCX completes them, and the data still lands intact.
#[test]
fn requests_dropped_before_completion_keep_their_buffers_until_ucx_is_done() {
    let Some(rma) = RmaPair::new_or_skip() else { return };
    let len = 64 << 20;
    let half = len / 2;
    let (registration, key) = rma.region(pattern(len, 70));
    let ab = &rma.pair.ab;
    // Only the initiator progresses: the emulated get waits for the target's reply, and
    // 32 MiB of puts fill the socket the target does not read.
    let mut get = ab.get(&key, 0, vec![0u8; len]).expect("get");
    let mut put = ab.put(&key, 0, pattern(half, 71)).expect("put");
    let spans: Vec<_> = (0..32).map(|i| RmaSpan::new(i << 20, (half + (i << 20)) as u64, 1 << 20)).collect();
    let mut batch = ab.put_spans(&key, pattern(half, 72), &spans).expect("batched put");
    for _ in 0..20 {
        rma.pair.a.progress();
    }
    assert!(!get.is_complete() && !put.is_complete() && !batch.is_complete(), "completed without the target");
    drop((get, put, batch));
    assert!(rma.pair.a.orphans() >= 3, "{} orphans", rma.pair.a.orphans());
    drop(key); // the orphans keep it alive
    rma.pair.progress_until("orphans released", || rma.pair.a.orphans() == 0);
    rma.flush();
    let mut model = pattern(half, 71);
    model.extend_from_slice(&pattern(half, 72));
    assert_eq!(first_difference(flushed_bytes(&registration), &model), None, "puts from dropped requests");
}

/// A key is refused on other endpoints; closing its endpoint destroys it unless a request
/// is using it, in which case it lives until that request is released.
#[test]
fn a_key_works_only_on_its_endpoint_and_dies_with_it() {
    let Some(rma) = RmaPair::new_or_skip() else { return };
    let (registration, key) = rma.region(pattern(4096, 80));
    let ab2 = rma.pair.a.connect(&rma.pair.b.address().unwrap()).unwrap();
    let rejected = ab2.put(&key, 0, vec![1u8; 16]).expect_err("foreign key");
    assert!(matches!(rejected.error, UcxError::ForeignRemoteKey), "{:?}", rejected.error);
    assert_eq!(rejected.buf, vec![1u8; 16]);
    let rejected = ab2.get(&key, 0, vec![0u8; 16]).expect_err("foreign key");
    assert!(matches!(rejected.error, UcxError::ForeignRemoteKey), "{:?}", rejected.error);

    let key2 = ab2.unpack_rkey(&registration.region_key().unwrap()).unwrap();
    let mut get = ab2.get(&key2, 0, vec![0u8; 4096]).expect("get on its own endpoint");
    rma.pair.progress_until("get", || get.is_complete());
    assert_eq!(get.into_buf().unwrap(), pattern(4096, 80));
    let mut closing = ab2.close(CloseMode::Flush);
    rma.pair.progress_until("close", || closing.poll().is_some());
    assert!(!key2.is_live(), "an idle key dies with its endpoint");
    let rejected = rma.pair.ab.put(&key2, 0, vec![1u8; 16]).expect_err("dead key");
    assert!(matches!(rejected.error, UcxError::ForeignRemoteKey), "{:?}", rejected.error);
    drop(key2);

    // In use when its endpoint is dropped: the key outlives the close until the get ends.
    let ab3 = rma.pair.a.connect(&rma.pair.b.address().unwrap()).unwrap();
    let key3 = ab3.unpack_rkey(&registration.region_key().unwrap()).unwrap();
    let mut get = ab3.get(&key3, 0, vec![0u8; 4096]).expect("get");
    drop(ab3);
    assert!(key3.is_live(), "a key in use survives its endpoint's close");
    rma.pair.progress_until("get after the close", || get.is_complete());
    assert!(matches!(get.poll(), Some(Err(_))), "the forced close ends the get: {:?}", get.poll());
    drop((get, key3));
    rma.pair.progress_until("close", || rma.pair.a.orphans() == 0);
    // The first endpoint and its key are untouched.
    let mut put = rma.pair.ab.put(&key, 0, pattern(4096, 81)).expect("put");
    rma.wait_put(&mut put);
    rma.flush();
    assert_eq!(first_difference(flushed_bytes(&registration), &pattern(4096, 81)), None);
}

/// Without the RMA feature nothing one-sided starts; a registration reports its buffer's
/// range and packs a key that passes the checks peers apply; empty and (on a UCX without
/// CUDA) device registrations are refused with their buffer given back.
#[test]
fn registrations_need_rma_a_range_and_a_memory_ucx_can_reach() {
    let Some(plain) = context_or_skip() else { return };
    assert!(!plain.supports_rma(), "RMA is opt-in");
    let rejected = plain.register(vec![1u8; 64]).expect_err("no RMA");
    assert!(matches!(rejected.error, UcxError::RmaDisabled), "{:?}", rejected.error);
    assert_eq!(rejected.buf, vec![1u8; 64]);

    let context = UcxContext::new(&rma_config()).expect("RMA context");
    assert!(context.supports_rma());
    let bytes = pattern(4096, 1);
    let address = bytes.as_ptr() as u64;
    let registration = context.register(bytes).expect("register");
    let range = (registration.address(), registration.len(), registration.memory_type());
    assert_eq!(range, (address, 4096, MemoryType::Host));
    let key = registration.region_key().expect("pack");
    assert_eq!((key.address, key.length), (address, 4096));
    let checked = key.check().expect("a key peers accept");
    assert_eq!(checked.memory_type, MemoryType::Host);

    let rejected = context.register(Vec::new()).expect_err("empty");
    assert!(matches!(rejected.error, UcxError::EmptyRegistration), "{:?}", rejected.error);
    let mut host = vec![0u8; 64];
    let at = host.as_mut_ptr().cast();
    // SAFETY: valid host memory that outlives the calls; without CUDA support they are
    // refused before UCX is called, so nothing ever accesses it as device memory.
    let fake_device = || unsafe { RawBuf::from_raw_parts(at, 64, MemoryType::Cuda) };
    if !context.supports_cuda_memory() {
        let rejected = context.register(fake_device()).expect_err("no CUDA");
        assert!(matches!(rejected.error, UcxError::CudaUnsupported), "{:?}", rejected.error);
    }
    assert_eq!(registration.into_buf(), pattern(4096, 1), "given back");

    // A context without RMA unpacks no key; a get into device memory needs CUDA support.
    let err = Pair::new(&plain).ab.unpack_rkey(&key).expect_err("no RMA");
    assert!(matches!(err, UcxError::RmaDisabled), "{err:?}");
    let rma = RmaPair::new_or_skip().expect("UCX is here");
    if !rma.target.supports_cuda_memory() {
        let (_registration, key) = rma.region(vec![0u8; 64]);
        let rejected = rma.pair.ab.get(&key, 0, fake_device()).expect_err("no CUDA");
        assert!(matches!(rejected.error, UcxError::CudaUnsupported), "{:?}", rejected.error);
    }
}
