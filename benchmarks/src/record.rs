//! The JSON record every benchmark writes with `--json`: one object per line per run.
//!
//! Units: bandwidths in GB/s with GB = 10^9 bytes, latencies in microseconds, efficiency
//! as a fraction (0.93 = 93 %). Fields that do not apply to a benchmark are `null`.
//! [`SCHEMA_VERSION`] changes when a field changes meaning or disappears (adding fields
//! does not change it).

use serde::Serialize;

/// Version of the record layout.
pub const SCHEMA_VERSION: u32 = 1;

/// Bytes per GB in every `_gbps` field.
pub const GB: f64 = 1e9;

/// One iteration of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IterationRecord {
    /// Bandwidth of the iteration in GB/s.
    pub bandwidth_gbps: f64,
    /// Its duration in microseconds.
    pub latency_us: f64,
}

/// The keys every record carries at least (the benchmark's original list, plus `memory`,
/// `op`, `first_round_trip_us`, `floor_us`, `floor_efficiency`, `raw_ucx_median_us` and
/// `raw_ucx_ratio`: `null` where they do not apply, and the latency percentiles).
pub const REQUIRED_KEYS: [&str; 20] = [
    "schema_version",
    "op",
    "lane",
    "object_type",
    "memory",
    "n_bytes",
    "n_iter",
    "bandwidth_avg_gbps",
    "bandwidth_median_gbps",
    "latency_avg_us",
    "latency_median_us",
    "latency_p99_us",
    "latency_p999_us",
    "first_round_trip_us",
    "ceiling_gbps",
    "efficiency",
    "floor_us",
    "floor_efficiency",
    "raw_ucx_median_us",
    "raw_ucx_ratio",
];

/// One run of one benchmark case.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Record {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// `local-send-recv`, `serialize` or `spill`.
    pub benchmark: String,
    /// What was measured (`roundtrip`, `device_to_host_pool`, `host_to_disk_eviction`, …).
    pub case: String,
    /// The transport lane (`native`, `ucx`); `null` where no transport is involved.
    pub lane: Option<String>,
    /// `UCX_TLS` when the lane is UCX.
    pub ucx_tls: Option<String>,
    /// `host` or `device`.
    pub object_type: String,
    /// Bytes per message / operation.
    pub n_bytes: u64,
    /// Timed iterations.
    pub n_iter: usize,
    /// Untimed warm-up iterations.
    pub n_warmup_iter: usize,
    /// Whether buffers were reused between iterations.
    pub reuse_alloc: bool,
    /// `local-send-recv` device runs: where device buffers came from (`pool`, `vmm`,
    /// `cudarc`, `cudarc-default`); `null` for host runs and the other benchmarks.
    pub memory: Option<String>,
    /// The server's device (local-send-recv) or the device used (`null` for host runs).
    pub server_dev: Option<usize>,
    /// The client's device (`null` for host runs and single-device benchmarks).
    pub client_dev: Option<usize>,
    /// `local-send-recv`: what a round trip does, `send` (two-sided), `put` or `get`
    /// (one-sided); `null` for the other benchmarks.
    pub op: Option<String>,
    /// `local-send-recv` one-sided runs: the spans each request moves the `n_bytes` as
    /// (`--blocks`, 1 without it); `null` for sends and the other benchmarks.
    pub blocks: Option<usize>,
    /// `local-send-recv` one-sided runs: whether each request was prepared once and
    /// posted (`--prepared`); `null` for sends and the other benchmarks.
    pub prepared: Option<bool>,
    /// Σbytes / Σt in GB/s (a round trip of n bytes counts 2·n, as ucx-py does).
    pub bandwidth_avg_gbps: f64,
    /// Median of per-iteration bandwidths in GB/s.
    pub bandwidth_median_gbps: f64,
    /// Mean time per iteration in µs.
    pub latency_avg_us: f64,
    /// Median time per iteration in µs (the exact median: the middle time, or the mean of
    /// the two middle ones; this is the p50).
    pub latency_median_us: f64,
    /// 99th percentile of the time per iteration in µs, from an HDR histogram of the times
    /// (`stats`): the ⌈0.99·n⌉-th smallest time, less than 0.1 % above it (the upper end
    /// of its histogram bucket, never above the slowest time). Below 100 iterations that is
    /// the slowest one.
    pub latency_p99_us: f64,
    /// 99.9th percentile, the same way (the ⌈0.999·n⌉-th smallest time; below 1000
    /// iterations the slowest one).
    pub latency_p999_us: f64,
    /// `local-send-recv`: the very first round trip (the first warm-up one, else the first
    /// timed one) in µs, where the memory's first export and import happen; `null` for
    /// the other benchmarks.
    pub first_round_trip_us: Option<f64>,
    /// The hardware ceiling measured in the same run, in GB/s (`null` when not measured).
    pub ceiling_gbps: Option<f64>,
    /// How the ceiling was measured.
    pub ceiling_method: Option<String>,
    /// Σt of the ceiling's timed iterations in µs: with `ceiling_n_iter` and the bytes one
    /// iteration moves (2·n for round trips, n otherwise) it gives `ceiling_gbps` back.
    pub ceiling_time_us: Option<f64>,
    /// The ceiling's timed iterations.
    pub ceiling_n_iter: Option<usize>,
    /// `bandwidth_avg_gbps / ceiling_gbps` (`null` without a ceiling).
    pub efficiency: Option<f64>,
    /// `local-send-recv`: the floor of a round trip measured in the same run, its mean
    /// time in µs: two copies of `n_bytes` one after the other, each seen done by the host
    /// before the next starts (`null` when not measured and for the other benchmarks).
    pub floor_us: Option<f64>,
    /// The floor's median time in µs.
    pub floor_median_us: Option<f64>,
    /// How the floor was measured.
    pub floor_method: Option<String>,
    /// Σt of the floor's timed iterations in µs (`floor_us` = `floor_time_us /
    /// floor_n_iter`).
    pub floor_time_us: Option<f64>,
    /// The floor's timed iterations.
    pub floor_n_iter: Option<usize>,
    /// `floor_us / latency_avg_us`: the round trip's mean time against the floor's (1 = a
    /// round trip at the floor; `null` without a floor).
    pub floor_efficiency: Option<f64>,
    /// `local-send-recv` sends on the UCX lane: the median of raw UCX round trips measured
    /// in the same run, by the same two processes, with the UCX library the lane loaded
    /// (a tag send of `n_bytes` of the run's memory, received into a pre-posted buffer and
    /// sent back), in µs; `null` when not measured (another lane, a one-sided run, device
    /// memory through a UCX that is not CUDA-aware) and for the other benchmarks.
    pub raw_ucx_median_us: Option<f64>,
    /// How the raw UCX round trips were measured.
    pub raw_ucx_method: Option<String>,
    /// Σt of the raw UCX round trips in µs.
    pub raw_ucx_time_us: Option<f64>,
    /// The timed raw UCX round trips (as many as `n_iter`).
    pub raw_ucx_n_iter: Option<usize>,
    /// `latency_median_us / raw_ucx_median_us`: the lane's median round trip in raw UCX
    /// ones (1 = the lane at raw UCX's speed; `null` without the reference).
    pub raw_ucx_ratio: Option<f64>,
    /// Each timed iteration.
    pub iterations: Vec<IterationRecord>,
}

impl Record {
    /// The record as one line of JSON (no trailing newline).
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).expect("a Record always serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_required_key_is_present_on_one_line() {
        let r = Record {
            schema_version: SCHEMA_VERSION,
            benchmark: "local-send-recv".into(),
            case: "roundtrip".into(),
            lane: Some("native".into()),
            ucx_tls: None,
            object_type: "host".into(),
            n_bytes: 1_000_000,
            n_iter: 2,
            n_warmup_iter: 1,
            reuse_alloc: false,
            memory: None,
            server_dev: None,
            client_dev: None,
            op: Some("put".into()),
            blocks: Some(1),
            prepared: Some(false),
            bandwidth_avg_gbps: 1.5,
            bandwidth_median_gbps: 1.4,
            latency_avg_us: 10.0,
            latency_median_us: 9.0,
            latency_p99_us: 12.0,
            latency_p999_us: 13.0,
            first_round_trip_us: Some(900.0),
            ceiling_gbps: Some(3.0),
            ceiling_method: Some("memcpy".into()),
            ceiling_time_us: Some(4000.0),
            ceiling_n_iter: Some(2),
            efficiency: Some(0.5),
            floor_us: Some(8.0),
            floor_median_us: Some(7.5),
            floor_method: Some("memcpy A→B, then B→A".into()),
            floor_time_us: Some(16.0),
            floor_n_iter: Some(2),
            floor_efficiency: Some(0.8),
            raw_ucx_median_us: Some(6.0),
            raw_ucx_method: Some("UCX tag ping-pong".into()),
            raw_ucx_time_us: Some(12.5),
            raw_ucx_n_iter: Some(2),
            raw_ucx_ratio: Some(1.5),
            iterations: vec![IterationRecord { bandwidth_gbps: 1.5, latency_us: 10.0 }],
        };
        let line = r.to_json_line();
        assert!(!line.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        for key in REQUIRED_KEYS {
            assert!(v.get(key).is_some(), "missing {key} in {line}");
        }
        assert_eq!(v["schema_version"], SCHEMA_VERSION);
        assert_eq!(v["efficiency"], 0.5);
        assert_eq!((&v["op"], &v["blocks"]), (&serde_json::json!("put"), &serde_json::json!(1)));
    }
}
