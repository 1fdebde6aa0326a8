//! `ferrylink-benchmarks`: the benchmarks users judge ferrylink by, and the pieces they
//! share.
//!
//! # Binaries
//! - `local-send-recv`: ucx-py's round-trip benchmark (`local-send-recv.py`), with the same
//!   options and table, plus the lane that ran, medians, latencies, the hardware ceiling
//!   measured in the same run and the efficiency against it; `--sweep` (a summary per size
//!   and a log-log SVG of bandwidth and ceiling, captioned with what ran and the commit),
//!   `--pairs all`, `--json`; `--memory pool|vmm|cudarc|cudarc-default` picks the device
//!   memory ([`memory_kind`]). The server is a second process (the binary re-executes
//!   itself). The echoes of the first and the last round trip (every one with `--check`)
//!   are compared with what was sent ([`echo_check`]). `--op put|get` runs one-sided
//!   round trips instead ([`onesided`]: registered regions, keys exchanged at setup, a
//!   notified put or get each way, `--blocks N` spans per request), checked the same way.
//!   Sends on the UCX lane are also printed against raw UCX ([`raw_ucx`]): a tag
//!   ping-pong of the same bytes and memory, timed in the same run by the same two
//!   processes with the UCX library the lane loaded, and the lane's median over it.
//! - `serialize`: device → host serialization into fresh memory and through the pinned
//!   pool, and host → device, against raw pinned copies; the copies are checked whole
//!   against the source frame's CRC-32C ([`digest`]).
//! - `spill`: device → host and host → disk eviction throughput and unspill latency of
//!   the spill store, against raw pinned copies and disk writes of the same kind (no
//!   fsync: a buffered write; fsync: `O_DIRECT` + `fdatasync`).
//! - `peers.sh` (next to this crate): `ucx_perftest` at the same sizes, side by side.
//!
//! # Conventions (every binary)
//! Sizes accept `1GB` (10^9), `10MiB` (2^20), `1000000` ([`size`]). Bandwidth is Σbytes / Σt
//! (round trips count 2·n, as ucx-py does), reported with its median; latency is the time
//! per iteration: mean, median, and p99 and p99.9 from an HDR histogram ([`stats`]). Each result is printed next to a ceiling
//! measured in the same run ([`ceiling`]) and the efficiency = average / ceiling. `--json`
//! prints one [`record::Record`] per line per run instead of the table (GB = 10^9 bytes),
//! with the per-iteration times and the ceiling's total time, from which every bandwidth
//! can be recomputed (the tests do).
//! Failures print `error: …` and exit non-zero (2 for bad options and unsupported
//! requests, 1 for failures while measuring) ([`error`]).

// The crate docs map the modules of the benchmarks for a reader of its source, private ones
// included (`cargo doc --document-private-items` renders them); the public docs alone
// leave those links unresolved.
#![allow(rustdoc::private_intra_doc_links)]

pub mod digest;
pub mod echo_check;
pub mod error;
pub mod local_send_recv;
pub mod memory_kind;
pub mod onesided;
pub mod plot;
pub mod progress;
pub mod provenance;
pub mod raw_ucx;
pub mod record;
pub mod report;
pub mod roundtrip;
pub mod stats;
pub mod table;
pub mod timeline;

/// The hardware ceilings (`ferrylink-ceiling`, shared with the Python benchmark).
pub use ferrylink_ceiling as ceiling;
pub use ferrylink_ceiling::{size, timing};

pub use error::BenchError;
pub use memory_kind::MemoryKind;
pub use report::ObjectType;

/// Logs to stderr at `warn`, or as `RUST_LOG` says (binaries only; the libraries just
/// emit `tracing` events).
pub fn init_tracing() {
    init_tracing_with_timeline(None);
}

/// [`init_tracing`], and with `Some(process)` a [`timeline::TimelineLayer`] recording the
/// transport's step events under that name.
pub fn init_tracing_with_timeline(timeline: Option<&'static str>) {
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let log = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_filter(filter);
    let timeline =
        timeline.map(|process| timeline::TimelineLayer::new(process).with_filter(timeline::timeline_filter()));
    let _ = tracing_subscriber::registry().with(log).with(timeline).try_init();
}

/// Sends UCX's own log lines to stderr unless `UCX_LOG_FILE` says where they go.
///
/// UCX prints its log (warnings, `UCX_PROTO_INFO` tables, `UCX_LOG_LEVEL=debug`) on
/// stdout by default, into the middle of the table or of the `--json` records a
/// script parses. The server process inherits the setting. Call it first in `main`,
/// before any thread starts (the environment is then this thread's alone) and before
/// UCX loads (it reads the variable once).
pub fn ucx_logs_to_stderr() {
    if std::env::var_os("UCX_LOG_FILE").is_none() {
        std::env::set_var("UCX_LOG_FILE", "stderr");
    }
}

/// Runs a binary's `main` body: prints the error and exits with its code on failure.
pub fn exit_on_error(result: Result<(), BenchError>) {
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(e.exit_code());
    }
}
