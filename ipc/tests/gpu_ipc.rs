//! Cross-process CUDA IPC tests. CUDA refuses to open a handle in the process that
//! exported it, so each test re-executes this test binary as the importing child (the
//! kit's peer harness: each test's `importer` peer runs [`run_importer`]) and talks to it
//! over stdin/stdout lines. The tests that need a GPU are ignored unless built with
//! `--features gpu-tests`, and fail without a device; the harness's own test runs always.

use ferrylink_ipc::cuda_ipc::{
    copy_from_mapping, export_event, CacheConfig, ImportedEventCache, IpcEventDescriptor, IpcExporter,
    IpcMemDescriptor, MappingCache,
};
use ferrylink_memory::cuda::{self, DeviceAllocation, DevicePool, EventPool, Gpu, Stream};
use ferrylink_memory::DeviceBuffer;
use ferrylink_testkit::{pattern_at, peer_test, require_gpu, Peer, Peers};
use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

/// The importer's mapping limit (bytes), when a test sets one.
const LIMIT_VAR: &str = "FERRYLINK_IPC_CHILD_LIMIT";

/// Device 0; the test fails without a CUDA device (the kit's `require_gpu`).
fn gpu() -> Gpu {
    require_gpu();
    Gpu::get(0).expect("device 0")
}

/// Written to stderr directly (not captured by the harness), so figures show in CI logs.
fn report(line: &str) {
    let _ = writeln!(std::io::stderr(), "[gpu_ipc] {line}");
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap()).collect()
}

fn expected(spec: &str, start: u64, len: usize) -> Vec<u8> {
    if let Some(b) = spec.strip_prefix("fill:") {
        return vec![b.parse().unwrap(); len];
    }
    let seed: u64 = spec.strip_prefix("pat:").unwrap().parse().unwrap();
    pattern_at(seed, start, len)
}

const CHUNK: usize = 64 << 20;

/// Writes `pat:<seed>` into the buffer (chunked host copies).
fn write_pattern(gpu: &Gpu, buf: &DeviceBuffer, seed: u8) {
    let mut off = 0;
    while off < buf.len() {
        let n = (buf.len() - off).min(CHUNK);
        let data = expected(&format!("pat:{seed}"), off as u64, n);
        // SAFETY: `off..off+n` lies within the buffer.
        unsafe { cuda::copy::memcpy_htod_sync(gpu, buf.device_ptr() + off as u64, &data).unwrap() };
        off += n;
    }
}

/// Compares the buffer with `spec`, chunk by chunk; the first difference.
fn verify(gpu: &Gpu, buf: &DeviceBuffer, spec: &str) -> Result<(), String> {
    let mut off = 0;
    let mut host = vec![0u8; CHUNK.min(buf.len())];
    while off < buf.len() {
        let n = (buf.len() - off).min(CHUNK);
        // SAFETY: `off..off+n` lies within the buffer.
        unsafe { cuda::copy::memcpy_dtoh_sync(gpu, &mut host[..n], buf.device_ptr() + off as u64) }
            .map_err(|e| e.to_string())?;
        let want = expected(spec, off as u64, n);
        if host[..n] != want[..] {
            let i = (0..n).find(|&i| host[i] != want[i]).unwrap_or(0);
            return Err(format!("byte {} is {:#x}, expected {:#x} ({spec})", off + i, host[i], want[i]));
        }
        off += n;
    }
    Ok(())
}

// ---------------------------------------------------------------- the importing child

/// The importing child: answers the parent's requests, one line each, until "quit".
fn run_importer() {
    let limit = std::env::var(LIMIT_VAR).ok().and_then(|v| v.parse().ok());
    let cache = MappingCache::cuda(CacheConfig::default().with_max_mapped_bytes(limit.unwrap_or(64 << 30)));
    let events = ImportedEventCache::default();
    // CUDA is initialised on the first command that needs it ("ping" works without).
    let mut gpu_state: Option<(Gpu, DevicePool, Stream)> = None;
    let init = || -> Result<(Gpu, DevicePool, Stream), String> {
        let gpu = Gpu::get(0).map_err(|e| e.to_string())?;
        let pool = DevicePool::shared(0).map_err(|e| e.to_string())?;
        let stream = Stream::new(&gpu).map_err(|e| e.to_string())?;
        Ok((gpu, pool, stream))
    };
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        let line = line.unwrap();
        let w: Vec<&str> = line.split_whitespace().collect();
        let needs_gpu = matches!(w.first().copied(), Some("import") | Some("bench"));
        if needs_gpu && gpu_state.is_none() {
            match init() {
                Ok(st) => gpu_state = Some(st),
                Err(e) => {
                    writeln!(out, "\nFERRY err child CUDA init: {e}").unwrap();
                    out.flush().unwrap();
                    continue;
                }
            }
        }
        let reply = match (w.first().copied(), gpu_state.as_ref()) {
            (Some("import"), Some((gpu, pool, stream))) => import(gpu, &cache, &events, pool, stream, &w[1..]),
            (Some("bench"), Some((gpu, pool, stream))) => bench(gpu, &cache, pool, stream, &w[1..]),
            (Some("stats"), _) => Ok(String::new()),
            (Some("ping"), _) => Ok(format!("pong pid={}", std::process::id())),
            (Some("close"), _) => {
                let closed = cache.close_peer(w[1].parse().unwrap());
                events.close_peer(w[1].parse().unwrap());
                Ok(format!("closed={closed}"))
            }
            _ => break,
        };
        let s = cache.stats();
        let tail = format!(
            "opens={} hits={} open={} mapped={} leased={} closes={} evictions={}",
            s.opens_total, s.hits, s.open_mappings, s.mapped_bytes, s.leased_mappings, s.closes_total, s.evictions
        );
        let msg = match reply {
            Ok(r) => format!("FERRY ok {r} {tail}"),
            Err(e) => format!("FERRY err {} | {tail}", e.replace('\n', " ")),
        };
        // Own line: libtest may have printed "test NAME ... " without a newline.
        writeln!(out, "\n{msg}").unwrap();
        out.flush().unwrap();
    }
}

/// import PID DESC_HEX EVENT_HEX|- SPEC
fn import(
    gpu: &Gpu,
    cache: &MappingCache,
    events: &ImportedEventCache,
    pool: &DevicePool,
    stream: &Stream,
    w: &[&str],
) -> Result<String, String> {
    let pid: u32 = w[0].parse().unwrap();
    let desc = IpcMemDescriptor::from_bytes(&unhex(w[1])).map_err(|e| e.to_string())?;
    let lease = cache.acquire(pid, &desc).map_err(|e| e.to_string())?;
    if w[2] != "-" {
        let mut handle = [0u8; 64];
        handle.copy_from_slice(&unhex(w[2]));
        events.wait(pid, &IpcEventDescriptor { handle }, stream).map_err(|e| e.to_string())?;
    }
    let dst = pool.alloc(desc.len as usize).map_err(|e| e.to_string())?;
    let t = Instant::now();
    // SAFETY: the lease and `dst` live until the synchronisation below.
    let path = unsafe { copy_from_mapping(&lease, desc.offset, desc.len, &dst, stream) }.map_err(|e| e.to_string())?;
    stream.synchronize().map_err(|e| e.to_string())?;
    let us = t.elapsed().as_secs_f64() * 1e6;
    drop(lease);
    verify(gpu, &dst, w[3])?;
    Ok(format!("path={path:?} copy_us={us:.1}"))
}

/// bench PID DESC_HEX ITERS: median of acquire + copy + sync, and of a raw DtoD copy of
/// the same size in this process.
fn bench(_gpu: &Gpu, cache: &MappingCache, pool: &DevicePool, stream: &Stream, w: &[&str]) -> Result<String, String> {
    let pid: u32 = w[0].parse().unwrap();
    let desc = IpcMemDescriptor::from_bytes(&unhex(w[1])).map_err(|e| e.to_string())?;
    let iters: usize = w[2].parse().unwrap();
    let len = desc.len as usize;
    let dst = pool.alloc(len).map_err(|e| e.to_string())?;
    let src = pool.alloc(len).map_err(|e| e.to_string())?;
    let (mut ipc, mut raw) = (Vec::new(), Vec::new());
    for _ in 0..iters {
        let t = Instant::now();
        let lease = cache.acquire(pid, &desc).map_err(|e| e.to_string())?;
        // SAFETY: lease and dst outlive the synchronisation.
        unsafe { copy_from_mapping(&lease, desc.offset, desc.len, &dst, stream) }.map_err(|e| e.to_string())?;
        stream.synchronize().map_err(|e| e.to_string())?;
        ipc.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        // SAFETY: both buffers outlive the synchronisation.
        unsafe { cuda::copy::memcpy_dtod_async(dst.device_ptr(), src.device_ptr(), len, stream) }
            .map_err(|e| e.to_string())?;
        stream.synchronize().map_err(|e| e.to_string())?;
        raw.push(t.elapsed().as_secs_f64());
    }
    ipc.sort_by(f64::total_cmp);
    raw.sort_by(f64::total_cmp);
    let (mi, mr) = (ipc[iters / 2], raw[iters / 2]);
    Ok(format!(
        "len={len} ipc_median_us={:.1} ipc_GBps={:.0} raw_median_us={:.1} raw_GBps={:.0}",
        mi * 1e6,
        len as f64 / mi / 1e9,
        mr * 1e6,
        len as f64 / mr / 1e9
    ))
}

// ---------------------------------------------------------------- the exporting parent

struct Child {
    peer: Peer,
}

/// How long one request to the child may take before the test fails (never hangs).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(45);

impl Child {
    fn spawn(peers: &Peers, limit: Option<u64>) -> Child {
        let env: Vec<(&str, String)> = limit.iter().map(|l| (LIMIT_VAR, l.to_string())).collect();
        Child { peer: peers.spawn_with("importer", &env, true) }
    }

    fn request(&mut self, line: &str) -> String {
        self.peer.write_line(line);
        // libtest may print "test NAME ... " on the same line: the marker is found anywhere.
        self.peer.expect_line_with("FERRY ", REQUEST_TIMEOUT)
    }

    fn import(&mut self, desc: &IpcMemDescriptor, event: Option<&IpcEventDescriptor>, spec: &str) -> String {
        let ev = event.map(|e| hex(&e.handle)).unwrap_or_else(|| "-".into());
        self.request(&format!("import {} {} {ev} {spec}", std::process::id(), hex(&desc.to_bytes())))
    }

    fn import_ok(&mut self, desc: &IpcMemDescriptor, event: Option<&IpcEventDescriptor>, spec: &str) -> String {
        let r = self.import(desc, event, spec);
        assert!(r.starts_with("ok "), "import {spec} ({} B): {r}", desc.len);
        r
    }
}

impl Drop for Child {
    /// "quit": the child must end well (after a failure elsewhere it is killed).
    fn drop(&mut self) {
        self.peer.write_line("quit");
        if std::thread::panicking() {
            self.peer.kill();
        } else {
            self.peer.wait_success(Duration::from_secs(10));
        }
    }
}

/// The value of `key=` in a child's answer.
fn field(reply: &str, key: &str) -> u64 {
    let k = format!("{key}=");
    reply
        .split_whitespace()
        .find_map(|w| w.strip_prefix(k.as_str()))
        .unwrap_or_else(|| panic!("no {key} in {reply}"))
        .parse()
        .unwrap()
}

peer_test! {
    /// The re-executed child answers over the pipes; runs without a GPU too.
    fn child_harness_answers_without_gpu(peers) {
        let mut child = Child::spawn(&peers, None);
        for _ in 0..3 {
            let r = child.request("ping");
            assert!(r.starts_with("ok pong"), "{r}");
            assert_ne!(field(&r, "pid"), std::process::id() as u64);
        }
        let r = child.request("stats");
        assert_eq!(field(&r, "opens"), 0, "{r}");
        assert_eq!(field(&r, "open"), 0, "{r}");
    }
    "importer" => run_importer(),
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn frames_of_every_size_arrive_intact(peers) {
        let g = gpu();
        let pool = DevicePool::new(&g, Default::default()).unwrap();
        let exporter = IpcExporter::default();
        let mut child = Child::spawn(&peers, None);
        let sizes = [1usize, 4096, 1 << 20, 256 << 20, 1 << 30];
        let bufs: Vec<DeviceBuffer> = sizes.iter().map(|&n| pool.alloc(n).unwrap()).collect();
        for (i, b) in bufs.iter().enumerate() {
            write_pattern(&g, b, i as u8 + 1);
            let d = exporter.export(b).unwrap();
            assert_eq!(d.len, b.len() as u64);
            let r = child.import_ok(&d, None, &format!("pat:{}", i as u8 + 1));
            report(&format!("{} B: {r}", b.len()));
        }
        // 1 B, 4 KiB and 1 MiB share the first slab: one mapping; 256 MiB and 1 GiB: one each.
        let r = child.request("stats");
        assert_eq!(field(&r, "opens"), 3, "{r}");
        assert_eq!(exporter.stats().handles_fetched, 3);

        // An untrusted descriptor claiming more than the allocation is refused, not mapped.
        let mut lying = exporter.export(&bufs[2]).unwrap();
        lying.alloc_len += 1 << 30;
        lying.offset = lying.alloc_len - lying.len;
        let r = child.import(&lying, None, "pat:3");
        assert!(r.starts_with("err "), "{r}");

        for (n, b) in [(1 << 20, &bufs[2]), (1 << 30, &bufs[4])] {
            let d = exporter.export(b).unwrap();
            let r = child.request(&format!("bench {} {} 21", std::process::id(), hex(&d.to_bytes())));
            assert!(r.starts_with("ok "), "{r}");
            report(&format!("bench {n} B: {r}"));
        }

        // The peer goes away: every mapping is closed.
        let r = child.request(&format!("close {}", std::process::id()));
        assert_eq!(field(&r, "open"), 0, "{r}");
        assert_eq!(field(&r, "mapped"), 0, "{r}");
    }
    "importer" => run_importer(),
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn hundred_sends_of_one_buffer_open_one_mapping(peers) {
        let g = gpu();
        let pool = DevicePool::new(&g, Default::default()).unwrap();
        let exporter = IpcExporter::default();
        let buf = pool.alloc(1 << 20).unwrap();
        write_pattern(&g, &buf, 77);
        let mut child = Child::spawn(&peers, None);
        let mut last = String::new();
        for _ in 0..100 {
            let d = exporter.export(&buf).unwrap();
            last = child.import_ok(&d, None, "pat:77");
        }
        assert_eq!(field(&last, "opens"), 1, "{last}");
        assert_eq!(field(&last, "hits"), 99, "{last}");
        assert_eq!(field(&last, "open"), 1, "{last}");
        assert_eq!(exporter.stats().handles_fetched, 1);
        assert_eq!(exporter.stats().exports, 100);
        report(&format!("100 sends: {last}"));
    }
    "importer" => run_importer(),
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn freed_and_reallocated_memory_never_yields_stale_data(peers) {
        let g = gpu();
        let exporter = IpcExporter::default();
        let mut child = Child::spawn(&peers, None);
        let len = 2 << 20;
        let mut same_address = 0;
        let mut ids = std::collections::HashSet::new();
        for round in 0..4u8 {
            let a = DeviceAllocation::new(&g, len).unwrap();
            let ptr = a.ptr();
            let buf = a.into_buffer();
            write_pattern(&g, &buf, 10 + round);
            let d = exporter.export(&buf).unwrap();
            assert!(ids.insert(d.buffer_id), "buffer id reused: {}", d.buffer_id);
            let r = child.import_ok(&d, None, &format!("pat:{}", 10 + round));
            drop(buf); // freed while the child still has it mapped (cached, unused)
            let next = DeviceAllocation::new(&g, len).unwrap();
            if next.ptr() == ptr {
                same_address += 1;
            }
            drop(next);
            report(&format!("round {round}: ptr {ptr:#x} buffer_id {} {r}", d.buffer_id));
        }
        let r = child.request("stats");
        assert_eq!(field(&r, "opens"), 4, "every reallocation is a new mapping: {r}");
        assert_eq!(exporter.stats().handles_fetched, 4);
        report(&format!("reallocated at the same address {same_address}/4 times"));
    }
    "importer" => run_importer(),
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn interprocess_event_orders_the_copy(peers) {
        let g = gpu();
        let pool = DevicePool::new(&g, Default::default()).unwrap();
        let exporter = IpcExporter::default();
        let events = EventPool::new(&g, 8);
        let stream = Stream::new(&g).unwrap();
        let mut child = Child::spawn(&peers, None);
        let buf = pool.alloc(256 << 20).unwrap();
        buf.fill(0).unwrap();
        let d = exporter.export(&buf).unwrap();
        for round in 0..3u8 {
            let value = 0x50 + round;
            // A long chain of memsets, the last one writing `value`, then the event: the
            // child's copy must see only the final value.
            for i in 0..200u32 {
                // SAFETY: `buf` outlives the child's answer, after which the stream is drained.
                unsafe { cuda::copy::memset_d8_async(buf.device_ptr(), (i % 7) as u8, buf.len(), &stream).unwrap() };
            }
            // SAFETY: as above.
            unsafe { cuda::copy::memset_d8_async(buf.device_ptr(), value, buf.len(), &stream).unwrap() };
            let ev = events.acquire().unwrap();
            ev.record(&stream).unwrap();
            let ed = export_event(&ev).unwrap();
            let still_running = !stream.query().unwrap();
            let r = child.import_ok(&d, Some(&ed), &format!("fill:{value}"));
            report(&format!("event round {round}: producer still running at send: {still_running}; {r}"));
            stream.synchronize().unwrap();
            drop(ev); // back to the pool only after the consumer waited
        }
        assert!(events.idle() >= 1);
    }
    "importer" => run_importer(),
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn cudarc_stream_pool_memory_arrives_bounced(peers) {
        let g = gpu();
        let pool = DevicePool::new(&g, Default::default()).unwrap();
        let exporter = IpcExporter::default();
        let ctx = cudarc::driver::CudaContext::new(0).unwrap();
        let cstream = ctx.new_stream().unwrap();
        let n = (5 << 20) + 7;
        let data = expected("pat:33", 0, n);
        let mut slice = cstream.alloc_zeros::<u8>(n).unwrap();
        cstream.memcpy_htod(&data, &mut slice).unwrap();
        let foreign = cuda::from_cuda_slice(slice).unwrap();
        let exportable = cuda::is_ipc_exportable(&foreign).unwrap();
        if !exportable {
            assert!(matches!(exporter.export(&foreign), Err(ferrylink_ipc::cuda_ipc::CudaIpcError::NotExportable(_))));
        }
        let stream = Stream::new(&g).unwrap();
        let ready = cuda::ensure_exportable(foreign, &pool, &stream).unwrap();
        let d = exporter.export(&ready).unwrap();
        let mut child = Child::spawn(&peers, None);
        let r = child.import_ok(&d, None, "pat:33");
        report(&format!("cudarc slice exportable: {exportable}; {r}"));
    }
    "importer" => run_importer(),
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn mapped_bytes_limit_evicts_unused_mappings(peers) {
        let g = gpu();
        let exporter = IpcExporter::default();
        // Each allocation is 2 MiB; the child may keep 5 MiB mapped.
        let mut child = Child::spawn(&peers, Some(5 << 20));
        let bufs: Vec<DeviceBuffer> = (0..6).map(|_| DeviceAllocation::new(&g, 2 << 20).unwrap().into_buffer()).collect();
        for (i, b) in bufs.iter().enumerate() {
            write_pattern(&g, b, 50 + i as u8);
            let r = child.import_ok(&exporter.export(b).unwrap(), None, &format!("pat:{}", 50 + i));
            assert!(field(&r, "mapped") <= 5 << 20, "{r}");
        }
        let r = child.request("stats");
        assert_eq!(field(&r, "opens"), 6, "{r}");
        assert_eq!(field(&r, "open"), 2, "{r}");
        assert_eq!(field(&r, "evictions"), 4, "{r}");
        // The first buffer again: reopened, still correct.
        let r = child.import_ok(&exporter.export(&bufs[0]).unwrap(), None, "pat:50");
        assert_eq!(field(&r, "opens"), 7, "{r}");
    }
    "importer" => run_importer(),
}
