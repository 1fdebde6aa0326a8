//! `serialize`: device → host serialization into fresh memory and through the pinned
//! pool, and host → device, against raw pinned copies. Every device → host copy, and the
//! last host → device one, is checked whole against the CRC-32C of the source frame,
//! outside the timing. See `--help`.

use clap::Parser;
use ferrylink::memory::cuda::{self, DevicePool};
use ferrylink::memory::serialize::{device_frames_to_host, host_to_device, FrameOrigin, HostMessage, SerializeError};
use ferrylink::memory::{PinnedPool, PinnedPoolConfig, PinnedPoolStats, Registration};
use ferrylink::{Frame, HostBuffer, Message};
use ferrylink_benchmarks::ceiling::{pinned_copy, Ceiling, CopyDirection};
use ferrylink_benchmarks::digest::{source_pattern, FrameDigest};
use ferrylink_benchmarks::report::{cases_table, Measurement, RunInfo};
use ferrylink_benchmarks::size::{format_bytes, format_seconds, parse_size};
use ferrylink_benchmarks::stats::Summary;
use ferrylink_benchmarks::timing::measure;
use ferrylink_benchmarks::{exit_on_error, BenchError, ObjectType};
use std::io::Write;
use std::time::{Duration, Instant};

/// Device ↔ host serialization benchmark: a device frame of n bytes copied to host memory
/// (into a fresh Vec each iteration, and into the pinned pool) and back to the device,
/// each judged against a raw pinned cuMemcpyDtoH / cuMemcpyHtoD of the same size measured
/// in the same run. Outside the timing, every host copy and the last device copy are
/// compared whole (CRC-32C) with the source frame; a difference exits 1. Needs a CUDA
/// device (exit code 2 without one).
#[derive(Debug, Parser)]
#[command(name = "serialize", version)]
struct Args {
    /// Frame size: 1GiB (default), 100MB, 1000000 …
    #[arg(short = 'n', long, default_value = "1GiB", value_parser = parse_size)]
    n_bytes: u64,
    /// Timed iterations per case.
    #[arg(long, default_value_t = 10)]
    n_iter: usize,
    /// Untimed iterations first.
    #[arg(long, default_value_t = 1)]
    n_warmup_iter: usize,
    /// CUDA device.
    #[arg(short = 'd', long, default_value_t = 0)]
    device: usize,
    /// Chunk size of the pinned pool (and of the pipelined copies).
    #[arg(long, default_value = "4MiB", value_parser = parse_size)]
    chunk_size: u64,
    /// Print one JSON object per line per case instead of the table.
    #[arg(long)]
    json: bool,
}

fn main() {
    ferrylink_benchmarks::init_tracing();
    exit_on_error(run(Args::parse()));
}

fn ser(e: SerializeError) -> BenchError {
    BenchError::Other(format!("serialization: {e}"))
}

fn run(args: Args) -> Result<(), BenchError> {
    let (n, chunk) = checked_sizes(&args)?;
    let dev = args.device;
    let (warm, iters) = (args.n_warmup_iter, args.n_iter);
    let device_pool = DevicePool::shared(dev)?;
    let source = device_pool.alloc(n)?;
    let pattern = source_pattern(n);
    source.copy_from_host(&pattern)?;
    // Taken once, of the frame as the device holds it.
    let digest = FrameDigest::of(&source.to_vec()?);
    let msg = Message::new(Vec::new(), vec![Frame::Device(source)]);

    let started = Instant::now();
    let pool = PinnedPool::new(
        PinnedPoolConfig::default().with_chunk_size(chunk).with_region_size(n).with_registration(Registration::Require),
    )
    .map_err(|e| BenchError::Other(format!("creating the pinned pool: {e}")))?;
    let pool_setup = started.elapsed();
    let stats = pool.stats();

    let dtoh_ceiling = pinned_copy(dev, n, iters, CopyDirection::DeviceToHost)?;
    let htod_ceiling = pinned_copy(dev, n, iters, CopyDirection::HostToDevice)?;
    let mut cases = device_to_host_cases(&msg, &digest, &pool, warm, iters, dtoh_ceiling)?;
    cases.push(host_to_device_case(&pool, dev, (&pattern, &digest), warm, iters, htod_ceiling)?);

    let info = RunInfo {
        benchmark: "serialize".into(),
        lane: None,
        ucx_tls: None,
        object_type: ObjectType::Device,
        n_bytes: n as u64,
        n_iter: iters,
        n_warmup_iter: warm,
        reuse_alloc: false,
        memory: None,
        server_dev: Some(dev),
        client_dev: None,
        op: None,
        blocks: None,
        prepared: None,
    };
    print_cases(args.json, &info, &cases, &stats, pool_setup)
}

/// `--n-iter`, `--n-bytes`, `--chunk-size` and `-d` checked against the machine: (n, chunk).
fn checked_sizes(args: &Args) -> Result<(usize, usize), BenchError> {
    if args.n_iter == 0 {
        return Err(BenchError::Usage("--n-iter must be at least 1".into()));
    }
    let n = usize::try_from(args.n_bytes).map_err(|_| BenchError::Usage("--n-bytes too large".into()))?;
    let chunk = usize::try_from(args.chunk_size).map_err(|_| BenchError::Usage("--chunk-size too large".into()))?;
    let count = match cuda::probe() {
        Ok(p) => p.device_count,
        Err(e) => return Err(BenchError::Unsupported(format!("serialize needs a CUDA device: {e}"))),
    };
    if args.device >= count {
        return Err(BenchError::Usage(format!(
            "-d/--device {} is out of range: this machine has {count} CUDA device(s)",
            args.device
        )));
    }
    Ok((n, chunk))
}

/// Device → host into fresh memory, then into the pinned pool; each copy checked against
/// the source's `digest` (untimed).
fn device_to_host_cases(
    msg: &Message,
    digest: &FrameDigest,
    pool: &PinnedPool,
    warm: usize,
    iters: usize,
    dtoh_ceiling: Ceiling,
) -> Result<Vec<Measurement>, BenchError> {
    let n = digest.len;
    let check = |i: usize, copies: &[Option<HostBuffer>]| -> Result<(), BenchError> {
        let h = copies.first().and_then(Option::as_ref).ok_or_else(|| BenchError::Other("no host copy".into()))?;
        digest.check(&format!("the host copy of iteration {i}"), h.as_slice())
    };
    let mut cases = Vec::new();

    let fresh = measure(
        warm,
        iters,
        |_| Ok(()),
        |()| device_frames_to_host(msg, None).map_err(ser),
        |i, copies| check(i, &copies),
    )?;
    cases.push(Measurement {
        case: "device_to_host_fresh".into(),
        title: "device → host into fresh memory (a new Vec each iteration)".into(),
        summary: Summary::new(n as f64, &fresh),
        ceiling: Some(dtoh_ceiling.clone()),
        floor: None,
        raw_ucx: None,
        first_round_trip: None,
    });

    let pooled = measure(
        warm,
        iters,
        |_| Ok(()),
        |()| device_frames_to_host(msg, Some(pool)).map_err(ser),
        |i, copies| check(i, &copies),
    )?;
    cases.push(Measurement {
        case: "device_to_host_pool".into(),
        title: "device → host into the pinned pool".into(),
        summary: Summary::new(n as f64, &pooled),
        ceiling: Some(dtoh_ceiling),
        floor: None,
        raw_ucx: None,
        first_round_trip: None,
    });
    Ok(cases)
}

/// Host (pinned pool) → device. The last iteration's host frame holds the source pattern
/// and its device copy is checked against the source's digest (untimed).
fn host_to_device_case(
    pool: &PinnedPool,
    dev: usize,
    (pattern, digest): (&[u8], &FrameDigest),
    warm: usize,
    iters: usize,
    htod_ceiling: Ceiling,
) -> Result<Measurement, BenchError> {
    let alloc = |ordinal: usize, len: usize| {
        DevicePool::shared(ordinal).and_then(|p| p.alloc(len)).map_err(|e| SerializeError::DeviceAlloc {
            device_ordinal: ordinal,
            len,
            reason: e.to_string(),
        })
    };
    let n = digest.len;
    let last = warm + iters - 1;
    let htod = measure(
        warm,
        iters,
        |i| {
            let mut frame = pool.alloc(n).map_err(|e| BenchError::Other(format!("pinned pool: {e}")))?;
            if i == last {
                frame.as_mut_slice().copy_from_slice(pattern);
            }
            Ok(HostMessage {
                header: Vec::new(),
                frames: vec![frame],
                origins: vec![FrameOrigin::Device { ordinal: dev }],
            })
        },
        |hm| host_to_device(hm, alloc).map_err(|f| ser(f.error)),
        |i, m: Message| {
            let Some(Frame::Device(d)) = m.frames.first().filter(|_| m.device_bytes() == n) else {
                return Err(BenchError::Other("host → device gave no device frame".into()));
            };
            if i == last {
                digest.check("the device copy of the last iteration", &d.to_vec()?)?;
            }
            Ok(())
        },
    )?;
    Ok(Measurement {
        case: "host_to_device_pool".into(),
        title: "host (pinned pool) → device".into(),
        summary: Summary::new(n as f64, &htod),
        ceiling: Some(htod_ceiling),
        floor: None,
        raw_ucx: None,
        first_round_trip: None,
    })
}

/// The table (or, with `--json`, one record per case).
fn print_cases(
    json: bool,
    info: &RunInfo,
    cases: &[Measurement],
    stats: &PinnedPoolStats,
    pool_setup: Duration,
) -> Result<(), BenchError> {
    let mut out = std::io::stdout().lock();
    if json {
        for m in cases {
            writeln!(out, "{}", info.record(m).to_json_line())?;
        }
    } else {
        let extra = vec![
            (
                "pinned pool".to_string(),
                format!(
                    "{} in {} region(s), chunks of {}, pinned: {}, set up in {}",
                    format_bytes(stats.bytes_reserved as f64),
                    stats.regions,
                    format_bytes(stats.chunk_size as f64),
                    stats.pinned,
                    format_seconds(pool_setup.as_secs_f64())
                ),
            ),
            ("bandwidth".to_string(), "n/t (one way)".to_string()),
        ];
        write!(out, "{}", cases_table("Serialize benchmark", info, &extra, cases, &[]).render())?;
    }
    out.flush()?;
    Ok(())
}
