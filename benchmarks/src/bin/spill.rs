//! `spill`: eviction throughput (device → host, host → disk) and unspill latency of the
//! spill store, against raw pinned copies and disk writes and reads of the same kind (the
//! store without fsync against a buffered write, with fsync against `O_DIRECT` +
//! `fdatasync`; unspill from disk against a plain read, both out of the page cache).
//! See `--help`.

use clap::Parser;
use ferrylink::memory::cuda::{self, DevicePool};
use ferrylink::memory::serialize::SerializeError;
use ferrylink::memory::{PinnedPool, PinnedPoolConfig};
use ferrylink::{Frame, HostBuffer, Message};
use ferrylink_benchmarks::ceiling::{disk_read, disk_write, drop_cached_pages, pinned_copy, CopyDirection, DiskWrite};
use ferrylink_benchmarks::report::{cases_table, Measurement, RunInfo};
use ferrylink_benchmarks::size::parse_size;
use ferrylink_benchmarks::stats::Summary;
use ferrylink_benchmarks::timing::measure;
use ferrylink_benchmarks::{exit_on_error, BenchError, ObjectType};
use ferrylink_spill::{DeviceAllocator, RealDiskIo, SpillConfig, SpillError, SpillStore, Tier};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Spill benchmark: entries of n bytes evicted device → host (into the pinned pool) and
/// host → disk, and brought back (unspill: disk → host, host → device), each judged
/// against a raw pinned copy or a disk write of the same bytes to the same directory,
/// measured in the same run. Host → disk runs twice, like with like: the store without
/// fsync (through the page cache) against a buffered write, and the store with fsync
/// against an O_DIRECT write + fdatasync. Unspill from disk reads a file whose pages were
/// dropped from the page cache, against a plain read into new memory of a file of the same
/// size in the same directory, dropped the same way. Without a CUDA device only the
/// host/disk cases run.
#[derive(Debug, Parser)]
#[command(name = "spill", version)]
struct Args {
    /// Entry size: 256MiB (default), 1GB, 1000000 …
    #[arg(short = 'n', long, default_value = "256MiB", value_parser = parse_size)]
    n_bytes: u64,
    /// Timed iterations per case.
    #[arg(long, default_value_t = 10)]
    n_iter: usize,
    /// Untimed iterations first.
    #[arg(long, default_value_t = 1)]
    n_warmup_iter: usize,
    /// CUDA device of the device cases.
    #[arg(short = 'd', long, default_value_t = 0)]
    device: usize,
    /// Directory the disk tier (and the disk write ceilings) writes to; default: a new
    /// temporary directory (removed afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Print one JSON object per line per case instead of the table.
    #[arg(long)]
    json: bool,
}

fn main() {
    ferrylink_benchmarks::init_tracing();
    exit_on_error(run(Args::parse()));
}

fn spill_err(e: SpillError) -> BenchError {
    BenchError::Other(format!("spill store: {e}"))
}

/// A host entry of `n` bytes, all `byte | 1`: never zero, so that every page is written
/// and resident, as a caller's data and the write ceiling's buffer are (`vec![0; n]`
/// leaves a large buffer unmapped: writing it out faults the zero page in 4 KiB at a
/// time, 5× the cost of the write on the development VM).
fn host_message(n: usize, byte: u8) -> Message {
    Message::new(Vec::new(), vec![Frame::Host(HostBuffer::from_vec(vec![byte | 1; n]))])
}

fn device_message(dev: usize, n: usize) -> Result<Message, BenchError> {
    let d = DevicePool::shared(dev)?.alloc(n)?;
    d.fill(0x5a)?;
    Ok(Message::new(Vec::new(), vec![Frame::Device(d)]))
}

fn expect_tier(store: &SpillStore<usize>, key: usize, tier: Tier) -> Result<(), BenchError> {
    match store.tier(&key) {
        Some(t) if t == tier => Ok(()),
        other => Err(BenchError::Other(format!("entry {key} is in {other:?}, expected {tier:?}"))),
    }
}

/// Drops the pages of every spill file under `dir` (the store's own directory is inside
/// it) from the page cache, so that unspill reads them from the disk, as the read ceiling
/// does.
fn drop_spill_files_from_cache(dir: &Path) -> Result<(), BenchError> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            drop_spill_files_from_cache(&path)?;
        } else if path.extension().is_some_and(|e| e == "spill") {
            drop_cached_pages(&path)?;
        }
    }
    Ok(())
}

struct Run {
    n: usize,
    warm: usize,
    iters: usize,
    dir: PathBuf,
}

impl Run {
    /// A store writing spill files to the run's directory, with `fsync` or not (the
    /// store's default is no fsync: spill files need not survive a crash).
    fn config(&self, device_budget: usize, host_budget: usize, fsync: bool) -> SpillConfig {
        SpillConfig::new(device_budget, host_budget, &self.dir).with_disk_io(Arc::new(RealDiskIo { fsync }))
    }

    /// host → disk: inserting entry i+1 into a host tier that holds one entry evicts entry
    /// i; without `fsync` against a buffered write, with it against `O_DIRECT` + `fdatasync`.
    fn host_to_disk(&self, fsync: bool) -> Result<Measurement, BenchError> {
        let n = self.n;
        let store = SpillStore::new(self.config(0, n, fsync)).map_err(spill_err)?;
        store.insert(0, host_message(n, 1)).map_err(|r| spill_err(r.error))?;
        let times = measure(
            self.warm,
            self.iters,
            |i| Ok((i + 1, host_message(n, (i % 251) as u8))),
            |(k, m)| store.insert(k, m).map_err(|r| spill_err(r.error)).map(|()| k),
            |_, k| {
                expect_tier(&store, k - 1, Tier::Disk)?;
                store.remove(&(k - 1));
                Ok(())
            },
        )?;
        // Waits for the store's file removals, which would otherwise share the disk with
        // the ceiling's writes.
        drop(store);
        let (case, title, write) = if fsync {
            ("host_to_disk_eviction_fsync", "host → disk eviction, fsync", DiskWrite::DirectSynced)
        } else {
            ("host_to_disk_eviction", "host → disk eviction, page cache (no fsync)", DiskWrite::Buffered)
        };
        let ceiling = disk_write(&self.dir, n, self.iters, write)?;
        Ok(Measurement {
            case: case.into(),
            title: title.into(),
            summary: Summary::new(n as f64, &times),
            ceiling: Some(ceiling),
            floor: None,
            raw_ucx: None,
            first_round_trip: None,
        })
    }

    /// disk → host unspill: `take_host` of an entry on disk (read back, checksum verified),
    /// its file's pages dropped from the page cache first, against a plain read of the
    /// same bytes from the same directory, out of the page cache as well.
    fn unspill_from_disk(&self) -> Result<Measurement, BenchError> {
        let n = self.n;
        let store = SpillStore::new(self.config(0, n, false)).map_err(spill_err)?;
        let times = measure(
            self.warm,
            self.iters,
            |i| {
                // Entry 2i goes to disk when 2i+1 arrives; 2i+1 is dropped after.
                store.insert(2 * i, host_message(n, 7)).map_err(|r| spill_err(r.error))?;
                store.insert(2 * i + 1, host_message(n, 8)).map_err(|r| spill_err(r.error))?;
                expect_tier(&store, 2 * i, Tier::Disk)?;
                store.remove(&(2 * i + 1));
                drop_spill_files_from_cache(&self.dir)?;
                Ok(2 * i)
            },
            |k| store.take_host(&k).map_err(spill_err),
            |_, m| match m {
                Some(m) if m.payload_len() == n => Ok(()),
                _ => Err(BenchError::Other("unspill from disk lost the entry".into())),
            },
        )?;
        drop(store); // its file removals done before the ceiling reads
        Ok(Measurement {
            case: "unspill_disk_to_host".into(),
            title: "unspill disk → host (read + checksum, out of the page cache)".into(),
            summary: Summary::new(n as f64, &times),
            ceiling: Some(disk_read(&self.dir, n, self.iters)?),
            floor: None,
            raw_ucx: None,
            first_round_trip: None,
        })
    }

    /// device → host: inserting device entry i+1 into a device tier that holds one entry
    /// evicts entry i into the pinned pool.
    fn device_to_host(&self, dev: usize, pool: &PinnedPool) -> Result<Measurement, BenchError> {
        let n = self.n;
        let store = SpillStore::new(self.config(n, 4 * n, false).with_pinned_pool(pool.clone())).map_err(spill_err)?;
        store.insert(0, device_message(dev, n)?).map_err(|r| spill_err(r.error))?;
        let times = measure(
            self.warm,
            self.iters,
            |i| Ok((i + 1, device_message(dev, n)?)),
            |(k, m)| store.insert(k, m).map_err(|r| spill_err(r.error)).map(|()| k),
            |_, k| {
                expect_tier(&store, k - 1, Tier::Host)?;
                store.remove(&(k - 1));
                Ok(())
            },
        )?;
        Ok(Measurement {
            case: "device_to_host_eviction".into(),
            title: "device → host eviction (into the pinned pool)".into(),
            summary: Summary::new(n as f64, &times),
            ceiling: Some(pinned_copy(dev, n, self.iters, CopyDirection::DeviceToHost)?),
            floor: None,
            raw_ucx: None,
            first_round_trip: None,
        })
    }

    /// host → device unspill: `take` of a device entry that was evicted to host.
    fn unspill_to_device(&self, dev: usize, pool: &PinnedPool) -> Result<Measurement, BenchError> {
        let n = self.n;
        let alloc: Arc<dyn DeviceAllocator> = Arc::new(|ordinal: usize, len: usize| {
            DevicePool::shared(ordinal).and_then(|p| p.alloc(len)).map_err(|e| SerializeError::DeviceAlloc {
                device_ordinal: ordinal,
                len,
                reason: e.to_string(),
            })
        });
        let config = self.config(n, 4 * n, false).with_pinned_pool(pool.clone()).with_device_allocator(alloc);
        let store = SpillStore::new(config).map_err(spill_err)?;
        let times = measure(
            self.warm,
            self.iters,
            |i| {
                store.insert(2 * i, device_message(dev, n)?).map_err(|r| spill_err(r.error))?;
                store.insert(2 * i + 1, device_message(dev, n)?).map_err(|r| spill_err(r.error))?;
                expect_tier(&store, 2 * i, Tier::Host)?;
                store.remove(&(2 * i + 1));
                Ok(2 * i)
            },
            |k| store.take(&k).map_err(spill_err),
            |_, m| match m {
                Some(m) if m.device_bytes() == n => Ok(()),
                _ => Err(BenchError::Other("unspill to device did not bring the entry back to the device".into())),
            },
        )?;
        Ok(Measurement {
            case: "unspill_host_to_device".into(),
            title: "unspill host → device".into(),
            summary: Summary::new(n as f64, &times),
            ceiling: Some(pinned_copy(dev, n, self.iters, CopyDirection::HostToDevice)?),
            floor: None,
            raw_ucx: None,
            first_round_trip: None,
        })
    }
}

fn run(args: Args) -> Result<(), BenchError> {
    if args.n_iter == 0 {
        return Err(BenchError::Usage("--n-iter must be at least 1".into()));
    }
    let n = usize::try_from(args.n_bytes).map_err(|_| BenchError::Usage("--n-bytes too large".into()))?;
    let temp;
    let dir = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(|e| BenchError::Usage(format!("--dir {}: {e}", d.display())))?;
            d.clone()
        }
        None => {
            temp = tempfile::Builder::new().prefix("ferrylink-spill-bench-").tempdir()?;
            temp.path().to_path_buf()
        }
    };
    let run = Run { n, warm: args.n_warmup_iter, iters: args.n_iter, dir };
    let mut cases = vec![run.host_to_disk(false)?, run.host_to_disk(true)?, run.unspill_from_disk()?];
    let mut skipped = Vec::new();
    let device = match cuda::probe() {
        Ok(p) if args.device < p.device_count => Some(args.device),
        Ok(p) => {
            return Err(BenchError::Usage(format!(
                "-d/--device {} is out of range: this machine has {} CUDA device(s)",
                args.device, p.device_count
            )))
        }
        Err(e) => {
            for case in ["device_to_host_eviction", "unspill_host_to_device"] {
                skipped.push((case.to_string(), format!("no CUDA device: {e}")));
            }
            eprintln!("note: no CUDA device ({e}): the device → host cases were skipped");
            None
        }
    };
    if let Some(dev) = device {
        let pool = PinnedPool::new(PinnedPoolConfig::default().with_region_size(2 * n))
            .map_err(|e| BenchError::Other(format!("creating the pinned pool: {e}")))?;
        cases.push(run.device_to_host(dev, &pool)?);
        cases.push(run.unspill_to_device(dev, &pool)?);
    }
    let info = RunInfo {
        benchmark: "spill".into(),
        lane: None,
        ucx_tls: None,
        object_type: if device.is_some() { ObjectType::Device } else { ObjectType::Host },
        n_bytes: n as u64,
        n_iter: args.n_iter,
        n_warmup_iter: args.n_warmup_iter,
        reuse_alloc: false,
        memory: None,
        server_dev: device,
        client_dev: None,
        op: None,
        blocks: None,
        prepared: None,
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        for m in &cases {
            let mut r = info.record(m);
            if m.case.starts_with("host_to_disk") || m.case == "unspill_disk_to_host" {
                r.object_type = "host".into();
            }
            writeln!(out, "{}", r.to_json_line())?;
        }
    } else {
        let extra = vec![
            ("directory".to_string(), run.dir.display().to_string()),
            ("bandwidth".to_string(), "n/t (one way); latency = time per eviction / unspill".to_string()),
            (
                "disk ceilings".to_string(),
                "like with like: no fsync against a buffered write, fsync against O_DIRECT + fdatasync; unspill \
                 against a buffered read into new memory, both out of the page cache"
                    .to_string(),
            ),
        ];
        write!(out, "{}", cases_table("Spill benchmark", &info, &extra, &cases, &skipped).render())?;
    }
    out.flush()?;
    Ok(())
}
