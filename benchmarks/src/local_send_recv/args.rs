//! The command line of `local-send-recv` ([`Args`]).

use crate::onesided::{Op, SkipTransfer};
use crate::size::parse_size;
use crate::{MemoryKind, ObjectType};
use clap::{Parser, ValueEnum};
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum Pairs {
    /// Every (server device, client device) pair.
    All,
}

/// Round-trip benchmark (ucx-py's local-send-recv): the client sends n bytes to a server
/// process, which sends them back. Bandwidth = 2·n/t per round trip (as ucx-py reports
/// it), printed with the lane that ran, the hardware ceiling measured in the same run and
/// the efficiency against it, and on the UCX lane raw UCX's round trip measured in the
/// same run and the ratio against it.
#[derive(Debug, Clone, Parser)]
#[command(name = "local-send-recv", version, after_help = AFTER_HELP)]
pub struct Args {
    /// Message size: 1000000, 100MB (10^6), 10MiB (2^20), 1GB, 1GiB. The default of 100 MB
    /// finishes in a few seconds on host memory on a small machine; ucx-py users comparing
    /// figures usually pass -n 1GB and -n 1MB.
    #[arg(short = 'n', long, default_value = "100MB", value_parser = parse_size)]
    pub(super) n_bytes: u64,
    /// What a round trip does. `send`: the client sends n bytes, the server receives them
    /// and sends them back (two-sided). `put`: the client puts n bytes into the server's
    /// registered region with a notification; on it the server puts n bytes back into the
    /// client's, with a notification that ends the round trip. `get`: the client gets n
    /// bytes of the server's region with a notification (delivered after the read); on it
    /// the server gets n bytes of the client's, with a notification that ends the round
    /// trip. One-sided runs register their buffers and exchange keys once, before the round
    /// trips.
    #[arg(long, value_enum, default_value_t = Op::Send)]
    pub(super) op: Op,
    /// With --op put|get: the n bytes move as N equal blocks in one put_batch / get_batch
    /// request each way (n must be a multiple of N; 1000 blocks of 64 KiB: -n 64000KiB),
    /// scattered over the server's region in reverse with a gap after each (block i at
    /// (N-1-i)·2·n/N: the server registers 2·n bytes).
    #[arg(long, value_name = "N")]
    pub(super) blocks: Option<usize>,
    /// With --op put|get: each side prepares its request once (prepare_put_batch /
    /// prepare_get_batch, spans checked and kept by the lane) and posts it every round
    /// trip, instead of a put_batch / get_batch with its spans each time.
    #[arg(long)]
    pub(super) prepared: bool,
    /// Timed round trips.
    #[arg(long, default_value_t = 10)]
    pub(super) n_iter: usize,
    /// Untimed round trips before them.
    #[arg(long, default_value_t = 1)]
    pub(super) n_warmup_iter: usize,
    /// Memory to send: device when a CUDA device is present, host otherwise.
    #[arg(short = 'o', long, value_enum)]
    pub(super) object_type: Option<ObjectType>,
    /// Device memory to send and receive (device objects only). `pool` is the round trip
    /// as ever; the others make fresh buffers on both sides every round trip, outside its
    /// timing, so the round trips run the export and import of that memory (with `vmm`, pass
    /// `--n-warmup-iter 5` to keep each arena chunk's first export out of the timing).
    #[arg(long, value_enum, default_value_t = MemoryKind::Pool)]
    pub(super) memory: MemoryKind,
    /// The server's CUDA device.
    #[arg(short = 'd', long, default_value_t = 0)]
    pub(super) server_dev: usize,
    /// The client's CUDA device.
    #[arg(short = 'e', long, default_value_t = 0)]
    pub(super) client_dev: usize,
    /// Receive into one preallocated buffer on both sides instead of fresh memory each time.
    #[arg(long)]
    pub(super) reuse_alloc: bool,
    /// Compare every echo with what was sent (outside the timing). Without it the first
    /// and the last round trip's echoes are compared. A difference fails the run (exit 1)
    /// and names the round trip and the first differing byte.
    #[arg(long)]
    pub(super) check: bool,
    /// Only run the server (for a client started separately with --client-only).
    #[arg(long, conflicts_with_all = ["client_only", "sweep", "pairs"])]
    pub(super) server_only: bool,
    /// Only run the client, connecting to --server-address (and --port).
    #[arg(long, requires = "server_address", conflicts_with_all = ["sweep", "pairs"])]
    pub(super) client_only: bool,
    /// With --server-only / --client-only: a Unix socket path (`unix:/path`, or any path
    /// with a `/`) on this machine, or the server's host name / IP address (with -p: the
    /// UCX lane across machines).
    #[arg(short = 's', long)]
    pub(super) server_address: Option<String>,
    /// TCP port of the server (with -s HOST, or alone with --server-only: listen on all
    /// interfaces). Control messages go over TCP, data over UCX.
    #[arg(short = 'p', long)]
    pub(super) port: Option<u16>,
    /// Print one JSON object per line per run instead of the table.
    #[arg(long)]
    pub(super) json: bool,
    /// Leave each iteration's row out of the table (ucx-py's option of that name).
    #[arg(long)]
    pub(super) no_detailed_report: bool,
    /// Run every size from MIN to MAX, doubling (e.g. 8B:1GB), each with its ceiling
    /// measured in the same run; prints per size the latency median, p99 and p99.9, the
    /// bandwidth, the ceiling and the efficiency, and draws bandwidth and ceiling against
    /// size (log-log) to --plot.
    #[arg(long, value_name = "MIN:MAX", conflicts_with = "pairs")]
    pub(super) sweep: Option<String>,
    /// Where --sweep draws its SVG plot.
    #[arg(long, value_name = "PATH", default_value = "local-send-recv-sweep.svg")]
    pub(super) plot: PathBuf,
    /// With --sweep: text for the plot's caption and the summary, beside the commit
    /// (FERRYLINK_BENCH_COMMIT, else the source tree's, when there is one): the commit
    /// where neither is known (the GPU machine), the machine, anything the run needs said.
    #[arg(long, value_name = "TEXT", requires = "sweep")]
    pub(super) label: Option<String>,
    /// Run every device pair and print a matrix (device objects only).
    #[arg(long, value_enum)]
    pub(super) pairs: Option<Pairs>,
    /// After the table, print where a round trip's time goes: the median time of each
    /// step in the client's and the server's threads (the transport's trace events),
    /// from the start of the round trip; then the same over the slowest 1 % of the round
    /// trips, to show which steps the tail's time goes to. Recording adds about 0.5 µs
    /// per step.
    #[arg(long, conflicts_with_all = ["json", "sweep", "pairs", "server_only", "client_only"])]
    pub(super) timeline: bool,
    /// Internal: serve one client on this Unix socket (how the client starts its server).
    #[arg(long, hide = true, value_name = "PATH")]
    pub(super) serve_on: Option<PathBuf>,
    /// Internal: the server records its timeline into this file.
    #[arg(long, hide = true, value_name = "PATH", requires = "serve_on")]
    pub(super) timeline_file: Option<PathBuf>,
    /// Test only: the server flips one byte of the echo of this round trip (counted from
    /// 0, warm-up round trips first), so that the tests of this crate can check that the
    /// client's comparison fails the run. Hidden; never part of a measurement.
    #[arg(long, hide = true, value_name = "ROUND_TRIP")]
    pub(super) corrupt_echo_for_test: Option<usize>,
    /// Test only (--op put|get): the client or the server skips its transfer of this round
    /// trip (counted from 0, warm-up round trips first) and sends a message in place of its
    /// notification, so that the tests of this crate can check that the client's
    /// comparison fails the run. Hidden; never part of a measurement.
    #[arg(long, hide = true, value_name = "SIDE:ROUND_TRIP", value_parser = SkipTransfer::parse)]
    pub(super) skip_transfer_for_test: Option<SkipTransfer>,
}

const AFTER_HELP: &str = "\
Environment: FERRYLINK_TRANSPORT=auto|native|ucx picks the lane (both processes inherit it);
FERRYLINK_TIMEOUT_MS bounds every transfer; RUST_LOG=debug shows the transport's logs;
FERRYLINK_BENCH_COMMIT names the commit in a sweep's plot (else the source tree's, if any).

Ceiling: host runs time memcpy of n bytes between two pre-touched buffers, there and back
(a round trip needs at least one copy each way), as 2·n/t. Device runs time raw copies of
n bytes both ways, as 2·n/t: cuMemcpyPeer between two devices; on one device both
cuMemcpyDtoD (the copy engine) and ferrylink's copy kernel (which the transport uses for
frames up to FERRYLINK_COPY_KERNEL_MAX_BYTES, 64 MiB by default), and the ceiling is the
faster of the two. Efficiency = average bandwidth / ceiling.

Floor: the least time a round trip can take, the two copies it needs run one after the
other, each seen done by the host before the next starts (the echo depends on the first
copy's bytes): host runs, memcpy there, then back (a CPU copy is done when it returns, so
these are the ceiling's two copies, timed per round trip); device runs, cuMemcpyPeer each
way between two devices, on one device the faster of cuMemcpyDtoD and the copy kernel, each
copy waited for by polling cuStreamQuery. Floor efficiency = mean floor / mean round trip
(100 % is a round trip at the floor), with the round trip in floors.

Raw UCX (UCX lane, --op send): after the round trips, client and server each make a UCX
worker with the library and settings the lane loaded (FERRYLINK_UCX_LIB, else
libucp.so.0), exchange the workers' addresses over the ferrylink endpoint, and time a tag
ping-pong of the same n bytes and memory (host: pre-touched; device: ferrylink's device
pool on the run's devices): the client sends, the server receives into a pre-posted
buffer and sends it back, both busy-progressing their worker (never sleeping, yielding
the core now and then); the run's warm-up round trips, then n_iter timed on the client. Lane / raw UCX = latency median / raw UCX median.
Left out, with a warning, where UCX cannot move device memory (not CUDA-aware); one-sided
runs (--op put|get) and the other lanes do not measure it.

Latency p99 and p99.9: from an HDR histogram of the timed round trips (ns, 3 significant
digits), the ceil(q·n)-th smallest time, under 0.1 % above it, never above the slowest.
Below 100 timed round trips p99 is the slowest one, below 1000 p99.9 is.

First round trip = the very first one (the first warm-up round trip), where the memory's
first export and import happen. The echoes of the first and the last round trip are
compared with what was sent (every one with --check), outside the timing. Exit codes:
0 ok, 2 bad options or unsupported here, 1 failure (a differing echo included).

One-sided round trips (--op put|get) register each side's memory once (host: shared
memfd buffers; device: --memory pool, vmm or cudarc, allocated once; memory the transport
would have to bounce, cudarc-default, is refused with exit 2), and report, check and
sweep as sends do: before a checked round trip the client stamps its source with the
round trip's number and fills its landing region with the complement of what must
arrive, so a transfer that moved nothing fails the run; a get round trip's check also
reads the server's region back once, untimed. --reuse-alloc is refused (exit 2): the
registered buffers serve every round trip.";

impl Args {
    /// The timeline process name this run records under (`--timeline-file`: the server;
    /// `--timeline`: the client), for [`crate::init_tracing_with_timeline`].
    pub fn timeline_process(&self) -> Option<&'static str> {
        match (&self.timeline_file, self.timeline) {
            (Some(_), _) => Some("server"),
            (None, true) => Some("client"),
            (None, false) => None,
        }
    }
}
