//! Tables and JSON records of runs: the round trip (`local-send-recv`) and the
//! per-case reports of `serialize` and `spill`.

use crate::ceiling::{Ceiling, Floor};
use crate::memory_kind::MemoryKind;
use crate::onesided::Op;
use crate::raw_ucx::{format_ratio, format_raw_ucx, RawUcx};
use crate::record::{IterationRecord, Record, GB, SCHEMA_VERSION};
use crate::size::{format_bytes, format_rate, format_seconds};
use crate::stats::Summary;
use crate::table::Table;

/// Host or device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum ObjectType {
    /// Host memory.
    Host,
    /// Device (GPU) memory.
    Device,
}

impl std::fmt::Display for ObjectType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ObjectType::Host => "host",
            ObjectType::Device => "device",
        })
    }
}

/// What was measured in one case: its timed iterations and the ceiling they are judged by.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// Short machine name (`roundtrip`, `device_to_host_pool`, …), the record's `case`.
    pub case: String,
    /// Human title (`device → host into the pinned pool`).
    pub title: String,
    /// The timed iterations.
    pub summary: Summary,
    /// The ceiling, when one was measured.
    pub ceiling: Option<Ceiling>,
    /// The floor of a round trip, when one was measured (`local-send-recv`; `None`
    /// elsewhere).
    pub floor: Option<Floor>,
    /// The raw UCX round trip measured in the same run (`local-send-recv` sends on the
    /// UCX lane; `None` elsewhere and where it could not be measured).
    pub raw_ucx: Option<RawUcx>,
    /// Seconds of the very first iteration (warm-up included), where a round trip's first
    /// export and import happen (`local-send-recv`; `None` elsewhere).
    pub first_round_trip: Option<f64>,
}

impl Measurement {
    /// Average bandwidth over the ceiling.
    pub fn efficiency(&self) -> Option<f64> {
        self.ceiling.as_ref().and_then(|c| c.efficiency(self.summary.bandwidth_avg()))
    }

    /// The round trip's mean time over the floor's (`None` without a floor).
    pub fn floor_efficiency(&self) -> Option<f64> {
        self.floor.as_ref().and_then(|f| f.efficiency(self.summary.latency_avg()))
    }

    /// The round trip's median time over raw UCX's (`None` without the reference).
    pub fn raw_ucx_ratio(&self) -> Option<f64> {
        self.raw_ucx.as_ref().and_then(|r| r.ratio(self.summary.latency_median()))
    }

    /// Appends the result rows (bandwidths, latencies, ceiling, efficiency, the floor with
    /// the efficiency against it, and raw UCX with the ratio against it, when measured).
    pub fn result_rows(&self, t: &mut Table) {
        let s = &self.summary;
        t.row("Average", format_rate(s.bandwidth_avg()))
            .row("Median", format_rate(s.bandwidth_median()))
            .row("Latency avg", format_seconds(s.latency_avg()))
            .row("Latency median", format_seconds(s.latency_median()))
            .row("Latency p99", format_seconds(s.latency_quantile(0.99)))
            .row("Latency p99.9", format_seconds(s.latency_quantile(0.999)));
        if let Some(first) = self.first_round_trip {
            t.row("first round trip", format_seconds(first));
        }
        match &self.ceiling {
            Some(c) => t.row("Ceiling", format!("{} ({})", format_rate(c.bytes_per_sec), c.method)),
            None => t.row("Ceiling", "not measured"),
        };
        t.row("Efficiency", format_efficiency(self.efficiency()));
        if let Some(f) = &self.floor {
            t.row("Floor", format_floor(f));
            t.row("Floor efficiency", format_floor_efficiency(self.floor_efficiency()));
        }
        if let Some(r) = &self.raw_ucx {
            t.row("Raw UCX median", format_raw_ucx(r));
            t.row("Lane / raw UCX", format_ratio(self.raw_ucx_ratio()));
        }
    }

    /// Appends one row per iteration: `000 | 12.34 GB/s | 1.23 ms`.
    pub fn iteration_rows(&self, t: &mut Table) {
        for (i, (bw, secs)) in self.summary.bandwidths().iter().zip(&self.summary.seconds).enumerate() {
            t.row(format!("{i:03}"), format!("{:>12} | {:>10}", format_rate(*bw), format_seconds(*secs)));
        }
    }
}

/// An efficiency (a fraction) in percent: one decimal from 1 % up (`33.3 %`), two
/// significant digits below (`0.012 %`, where small messages sit), `n/a` without one.
pub fn format_efficiency(efficiency: Option<f64>) -> String {
    match efficiency {
        Some(e) if e.is_finite() && e > 0.0 && e < 0.01 => {
            let percent = e * 100.0;
            let decimals = (1.0 - percent.log10().floor()).max(1.0) as usize;
            format!("{percent:.decimals$} %")
        }
        Some(e) => format!("{:.1} %", e * 100.0),
        None => "n/a".into(),
    }
}

/// A floor's row: its mean time per round trip, its median, and how it was measured.
pub fn format_floor(f: &Floor) -> String {
    format!("{} (median {}; {})", format_seconds(f.mean_seconds()), format_seconds(f.median_seconds), f.method)
}

/// The efficiency against a floor, and how many floors a round trip takes: `62.5 %
/// (1.60× the floor)`; `n/a` without one.
pub fn format_floor_efficiency(efficiency: Option<f64>) -> String {
    match efficiency {
        Some(e) if e > 0.0 => format!("{} ({:.2}× the floor)", format_efficiency(Some(e)), 1.0 / e),
        _ => "n/a".into(),
    }
}

/// The common fields of a run's JSON records.
#[derive(Debug, Clone, PartialEq)]
pub struct RunInfo {
    /// `local-send-recv`, `serialize`, `spill`.
    pub benchmark: String,
    /// The lane, when a transport was involved.
    pub lane: Option<String>,
    /// `UCX_TLS`, when the lane is UCX.
    pub ucx_tls: Option<String>,
    /// Host or device.
    pub object_type: ObjectType,
    /// Bytes per message / operation.
    pub n_bytes: u64,
    /// Timed iterations.
    pub n_iter: usize,
    /// Warm-up iterations.
    pub n_warmup_iter: usize,
    /// Buffers reused between iterations.
    pub reuse_alloc: bool,
    /// Where device buffers came from (`local-send-recv` device runs; `None` elsewhere).
    pub memory: Option<MemoryKind>,
    /// Server device (or the one device used).
    pub server_dev: Option<usize>,
    /// Client device.
    pub client_dev: Option<usize>,
    /// `local-send-recv`: what a round trip does (`--op`); `None` elsewhere.
    pub op: Option<Op>,
    /// `local-send-recv` one-sided runs: spans per request (`--blocks`); `None` for sends
    /// and elsewhere.
    pub blocks: Option<usize>,
    /// `local-send-recv` one-sided runs: whether each side posted a prepared request
    /// (`--prepared`); `None` for sends and elsewhere.
    pub prepared: Option<bool>,
}

impl RunInfo {
    /// The JSON record of `m` in this run.
    pub fn record(&self, m: &Measurement) -> Record {
        let s = &m.summary;
        Record {
            schema_version: SCHEMA_VERSION,
            benchmark: self.benchmark.clone(),
            case: m.case.clone(),
            lane: self.lane.clone(),
            ucx_tls: self.ucx_tls.clone(),
            object_type: self.object_type.to_string(),
            n_bytes: self.n_bytes,
            n_iter: self.n_iter,
            n_warmup_iter: self.n_warmup_iter,
            reuse_alloc: self.reuse_alloc,
            memory: self.memory.map(|m| m.to_string()),
            server_dev: self.server_dev,
            client_dev: self.client_dev,
            op: self.op.map(|op| op.to_string()),
            blocks: self.blocks,
            prepared: self.prepared,
            bandwidth_avg_gbps: s.bandwidth_avg() / GB,
            bandwidth_median_gbps: s.bandwidth_median() / GB,
            latency_avg_us: s.latency_avg() * 1e6,
            latency_median_us: s.latency_median() * 1e6,
            latency_p99_us: s.latency_quantile(0.99) * 1e6,
            latency_p999_us: s.latency_quantile(0.999) * 1e6,
            first_round_trip_us: m.first_round_trip.map(|t| t * 1e6),
            ceiling_gbps: m.ceiling.as_ref().map(|c| c.bytes_per_sec / GB),
            ceiling_method: m.ceiling.as_ref().map(|c| c.method.clone()),
            ceiling_time_us: m.ceiling.as_ref().map(|c| c.total_seconds * 1e6),
            ceiling_n_iter: m.ceiling.as_ref().map(|c| c.n_iter),
            efficiency: m.efficiency(),
            floor_us: m.floor.as_ref().map(|f| f.mean_seconds() * 1e6),
            floor_median_us: m.floor.as_ref().map(|f| f.median_seconds * 1e6),
            floor_method: m.floor.as_ref().map(|f| f.method.clone()),
            floor_time_us: m.floor.as_ref().map(|f| f.total_seconds * 1e6),
            floor_n_iter: m.floor.as_ref().map(|f| f.n_iter),
            floor_efficiency: m.floor_efficiency(),
            raw_ucx_median_us: m.raw_ucx.as_ref().map(|r| r.median_seconds * 1e6),
            raw_ucx_method: m.raw_ucx.as_ref().map(|r| r.method.clone()),
            raw_ucx_time_us: m.raw_ucx.as_ref().map(|r| r.total_seconds * 1e6),
            raw_ucx_n_iter: m.raw_ucx.as_ref().map(|r| r.n_iter),
            raw_ucx_ratio: m.raw_ucx_ratio(),
            iterations: s
                .bandwidths()
                .iter()
                .zip(&s.seconds)
                .map(|(bw, t)| IterationRecord { bandwidth_gbps: bw / GB, latency_us: t * 1e6 })
                .collect(),
        }
    }

    /// The header block shared by every table: iterations, bytes, the operation and its
    /// blocks (one-sided round trips only: a send's table is as it always was), object,
    /// memory (when known), reuse, lane.
    pub fn header_rows(&self, t: &mut Table) {
        t.row("n_iter", self.n_iter.to_string())
            .row("n_warmup_iter", self.n_warmup_iter.to_string())
            .row("n_bytes", format_bytes(self.n_bytes as f64));
        if let Some(op) = self.op.filter(|op| op.one_sided().is_some()) {
            t.row("op", op.to_string());
            t.row("blocks", self.blocks.unwrap_or(1).to_string());
            t.row("prepared", if self.prepared == Some(true) { "True" } else { "False" });
        }
        t.row("object", self.object_type.to_string());
        if let Some(memory) = self.memory {
            t.row("memory", memory.to_string());
        }
        t.row("reuse alloc", if self.reuse_alloc { "True" } else { "False" });
        if let Some(lane) = &self.lane {
            t.row("lane", lane.clone());
        }
        if let Some(tls) = &self.ucx_tls {
            t.row("UCX_TLS", tls.clone());
        }
    }

    /// `Device(s)` as ucx-py prints it: `server, client`, or `host`.
    pub fn devices(&self) -> String {
        match (self.object_type, self.server_dev, self.client_dev) {
            (ObjectType::Host, _, _) => "host".into(),
            (_, Some(s), Some(c)) => format!("{s}, {c}"),
            (_, Some(d), None) | (_, None, Some(d)) => d.to_string(),
            (_, None, None) => "-".into(),
        }
    }
}

/// Whether a round-trip table lists every iteration (ucx-py's "detailed report", which
/// its `--no-detailed-report` turns off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Iterations {
    Listed,
    Omitted,
}

/// The `local-send-recv` table: ucx-py's round-trip table plus lane, medians, latencies,
/// ceiling and efficiency, floor and efficiency against it, on the UCX lane raw UCX and
/// the ratio against it; then each iteration, unless `iterations` omits them.
pub fn roundtrip_table(info: &RunInfo, m: &Measurement, iterations: Iterations) -> Table {
    let mut t = Table::new();
    t.text("Roundtrip benchmark").rule();
    info.header_rows(&mut t);
    t.double_rule().row("Device(s)", info.devices());
    m.result_rows(&mut t);
    if m.floor.is_none() {
        t.row("Floor", "not measured").row("Floor efficiency", "n/a");
    }
    if m.raw_ucx.is_none() && info.lane.as_deref() == Some("ucx") {
        t.row("Raw UCX median", "not measured").row("Lane / raw UCX", "n/a");
    }
    if iterations == Iterations::Listed {
        t.rule().text("Iterations").rule();
        m.iteration_rows(&mut t);
    }
    t
}

/// A table of several cases of one benchmark (`serialize`, `spill`), one block each;
/// `extra` rows go to the header block, `skipped` lists cases that did not run and why.
pub fn cases_table(
    title: &str,
    info: &RunInfo,
    extra: &[(String, String)],
    cases: &[Measurement],
    skipped: &[(String, String)],
) -> Table {
    let mut t = Table::new();
    t.text(title).rule();
    info.header_rows(&mut t);
    t.row("Device(s)", info.devices());
    for (k, v) in extra {
        t.row(k.clone(), v.clone());
    }
    for m in cases {
        t.double_rule().text(format!("{} [{}]", m.title, m.case)).rule();
        m.result_rows(&mut t);
        t.rule();
        m.iteration_rows(&mut t);
    }
    for (case, why) in skipped {
        t.double_rule().text(format!("{case}: skipped ({why})"));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn info(lane: &str, tls: Option<&str>) -> RunInfo {
        RunInfo {
            benchmark: "local-send-recv".into(),
            lane: Some(lane.into()),
            ucx_tls: tls.map(Into::into),
            object_type: ObjectType::Host,
            n_bytes: 1_000_000,
            n_iter: 2,
            n_warmup_iter: 1,
            reuse_alloc: false,
            memory: None,
            server_dev: None,
            client_dev: None,
            op: Some(Op::Send),
            blocks: None,
            prepared: None,
        }
    }

    fn measurement() -> Measurement {
        Measurement {
            case: "roundtrip".into(),
            title: "round trip".into(),
            summary: Summary::new(2e6, &[Duration::from_millis(1), Duration::from_millis(2)]),
            ceiling: Some(Ceiling {
                bytes_per_sec: 4e9,
                method: "memcpy A→B + B→A".into(),
                total_seconds: 2e-3,
                n_iter: 2,
            }),
            floor: Some(Floor {
                method: "memcpy A→B, then B→A".into(),
                total_seconds: 1.2e-3,
                n_iter: 2,
                median_seconds: 0.5e-3,
            }),
            raw_ucx: None,
            first_round_trip: Some(2.5e-3),
        }
    }

    /// The value of the row `key` (the text after the first ` | `).
    fn value<'a>(text: &'a str, key: &str) -> Option<&'a str> {
        text.lines().find_map(|l| l.split_once(" | ").filter(|(k, _)| k.trim_end() == key).map(|(_, v)| v))
    }

    #[test]
    fn roundtrip_table_has_lane_ceiling_efficiency_and_iterations() {
        let text = roundtrip_table(&info("native", None), &measurement(), Iterations::Listed).render();
        assert!(text.starts_with("Roundtrip benchmark\n"), "{text}");
        assert_eq!(value(&text, "lane"), Some("native"), "{text}");
        assert_eq!(value(&text, "n_bytes"), Some("1000.00 kB"), "{text}");
        assert_eq!(value(&text, "Device(s)"), Some("host"), "{text}");
        // 4e6 bytes in 3 ms = 1.33 GB/s; ceiling 4 GB/s -> 33.3 %.
        assert_eq!(value(&text, "Average"), Some("1.33 GB/s"), "{text}");
        assert_eq!(value(&text, "Ceiling"), Some("4.00 GB/s (memcpy A→B + B→A)"), "{text}");
        assert_eq!(value(&text, "Efficiency"), Some("33.3 %"), "{text}");
        assert_eq!(value(&text, "Latency median"), Some("1.50 ms"), "{text}");
        // The floor: 1.2 ms over two iterations, 0.6 ms each, against a mean round trip
        // of 1.5 ms.
        assert_eq!(value(&text, "Floor"), Some("600.00 us (median 500.00 us; memcpy A→B, then B→A)"), "{text}");
        assert_eq!(value(&text, "Floor efficiency"), Some("40.0 % (2.50× the floor)"), "{text}");
        // Two iterations (1 and 2 ms): p99 and p99.9 are the slower one.
        assert_eq!(value(&text, "Latency p99"), Some("2.00 ms"), "{text}");
        assert_eq!(value(&text, "Latency p99.9"), Some("2.00 ms"), "{text}");
        assert!(value(&text, "000").is_some_and(|v| v.contains("2.00 GB/s") && v.contains("1.00 ms")), "{text}");
        assert!(value(&text, "001").is_some(), "{text}");
        assert!(value(&text, "UCX_TLS").is_none(), "{text}");
        assert_eq!(value(&text, "first round trip"), Some("2.50 ms"), "{text}");
        assert!(value(&text, "memory").is_none(), "{text}");
        // A send's table has no op rows (as before one-sided round trips existed).
        assert!(value(&text, "op").is_none() && value(&text, "blocks").is_none(), "{text}");
    }

    #[test]
    fn a_round_trip_without_a_floor_says_so_and_other_cases_leave_it_out() {
        let m = Measurement { floor: None, ..measurement() };
        let text = roundtrip_table(&info("native", None), &m, Iterations::Omitted).render();
        assert_eq!(value(&text, "Floor"), Some("not measured"), "{text}");
        assert_eq!(value(&text, "Floor efficiency"), Some("n/a"), "{text}");
        let r = info("native", None).record(&m);
        assert_eq!((r.floor_us, r.floor_efficiency, r.floor_method), (None, None, None));
        let text = cases_table("Spill benchmark", &info("n/a", None), &[], &[m], &[]).render();
        assert!(!text.contains("Floor"), "{text}");
    }

    #[test]
    fn without_the_detailed_report_the_iterations_are_left_out() {
        let text = roundtrip_table(&info("native", None), &measurement(), Iterations::Omitted).render();
        assert_eq!(value(&text, "Latency median"), Some("1.50 ms"), "{text}");
        assert_eq!(value(&text, "Efficiency"), Some("33.3 %"), "{text}");
        assert!(!text.contains("Iterations") && value(&text, "000").is_none(), "{text}");
    }

    #[test]
    fn one_sided_runs_show_op_and_blocks() {
        let i = RunInfo { op: Some(Op::Put), blocks: Some(1000), reuse_alloc: true, ..info("native", None) };
        let text = roundtrip_table(&i, &measurement(), Iterations::Listed).render();
        assert_eq!(value(&text, "op"), Some("put"), "{text}");
        assert_eq!(value(&text, "blocks"), Some("1000"), "{text}");
        let r = i.record(&measurement());
        assert_eq!((r.op.as_deref(), r.blocks), (Some("put"), Some(1000)));
        let send = info("native", None).record(&measurement());
        assert_eq!((send.op.as_deref(), send.blocks), (Some("send"), None));
    }

    #[test]
    fn device_runs_show_their_memory() {
        let i = RunInfo {
            object_type: ObjectType::Device,
            memory: Some(MemoryKind::CudarcDefault),
            server_dev: Some(0),
            client_dev: Some(0),
            ..info("native", None)
        };
        let text = roundtrip_table(&i, &measurement(), Iterations::Listed).render();
        assert_eq!(value(&text, "memory"), Some("cudarc-default"), "{text}");
        let r = i.record(&measurement());
        assert_eq!(r.memory.as_deref(), Some("cudarc-default"));
        assert_eq!(r.first_round_trip_us, Some(2500.0));
    }

    #[test]
    fn ucx_runs_show_ucx_tls() {
        let text = roundtrip_table(&info("ucx", Some("tcp")), &measurement(), Iterations::Listed).render();
        assert_eq!(value(&text, "UCX_TLS"), Some("tcp"), "{text}");
    }

    #[test]
    fn ucx_runs_show_raw_ucx_and_the_ratio_or_say_it_was_not_measured() {
        let raw = RawUcx::from_times(&[Duration::from_micros(500), Duration::from_micros(700)], "UCX tag".into());
        let m = Measurement { raw_ucx: Some(raw), ..measurement() };
        let text = roundtrip_table(&info("ucx", Some("tcp")), &m, Iterations::Omitted).render();
        // A median round trip of 1.5 ms against raw UCX's 600 µs.
        assert_eq!(value(&text, "Raw UCX median"), Some("600.00 us (mean 600.00 us; UCX tag)"), "{text}");
        assert_eq!(value(&text, "Lane / raw UCX"), Some("2.50x"), "{text}");
        let r = info("ucx", Some("tcp")).record(&m);
        assert!((r.raw_ucx_median_us.unwrap() - 600.0).abs() < 1e-9, "{r:?}");
        assert!((r.raw_ucx_time_us.unwrap() - 1200.0).abs() < 1e-9, "{r:?}");
        assert!((r.raw_ucx_ratio.unwrap() - 2.5).abs() < 1e-9, "{r:?}");
        assert_eq!((r.raw_ucx_n_iter, r.raw_ucx_method.as_deref()), (Some(2), Some("UCX tag")));
        // On the UCX lane without the reference the rows say so; on the native lane there
        // are none, and the record's keys are null either way.
        let text = roundtrip_table(&info("ucx", None), &measurement(), Iterations::Omitted).render();
        assert_eq!(value(&text, "Raw UCX median"), Some("not measured"), "{text}");
        assert_eq!(value(&text, "Lane / raw UCX"), Some("n/a"), "{text}");
        let text = roundtrip_table(&info("native", None), &measurement(), Iterations::Omitted).render();
        assert!(!text.contains("Raw UCX") && !text.contains("raw UCX"), "{text}");
        let r = info("native", None).record(&measurement());
        assert_eq!((r.raw_ucx_median_us, r.raw_ucx_ratio, r.raw_ucx_n_iter), (None, None, None));
    }

    #[test]
    fn records_carry_gbps_and_efficiency() {
        let r = info("native", None).record(&measurement());
        assert!((r.bandwidth_avg_gbps - 4e6 / 3e-3 / 1e9).abs() < 1e-9);
        assert_eq!(r.ceiling_gbps, Some(4.0));
        assert_eq!((r.ceiling_time_us, r.ceiling_n_iter), (Some(2000.0), Some(2)));
        assert!((r.efficiency.unwrap() - 1.0 / 3.0).abs() < 1e-9);
        assert_eq!(r.latency_median_us, 1500.0);
        // p99 of two iterations is the slower one (2 ms), exactly: the slowest time caps it.
        assert_eq!(r.latency_p99_us, 2e-3 * 1e6);
        assert_eq!(r.latency_p999_us, r.latency_p99_us);
        assert_eq!(r.iterations.len(), 2);
        assert_eq!(r.lane.as_deref(), Some("native"));
        assert_eq!(r.memory, None);
        assert_eq!((r.floor_time_us, r.floor_n_iter), (Some(1200.0), Some(2)));
        assert!((r.floor_us.unwrap() - 600.0).abs() < 1e-9, "{r:?}");
        assert!((r.floor_median_us.unwrap() - 500.0).abs() < 1e-9, "{r:?}");
        assert!((r.floor_efficiency.unwrap() - 0.4).abs() < 1e-9, "{r:?}");
        assert_eq!(r.floor_method.as_deref(), Some("memcpy A→B, then B→A"));
        let line: serde_json::Value = serde_json::from_str(&r.to_json_line()).unwrap();
        assert_eq!(line["floor_n_iter"], 2);
    }

    #[test]
    fn floor_efficiencies_say_how_many_floors_a_round_trip_takes() {
        assert_eq!(format_floor_efficiency(Some(0.625)), "62.5 % (1.60× the floor)");
        assert_eq!(format_floor_efficiency(Some(0.0)), "n/a");
        assert_eq!(format_floor_efficiency(None), "n/a");
    }

    #[test]
    fn efficiencies_keep_two_digits_below_one_percent() {
        assert_eq!(format_efficiency(Some(1.0 / 3.0)), "33.3 %");
        assert_eq!(format_efficiency(Some(0.01)), "1.0 %");
        assert_eq!(format_efficiency(Some(0.0567)), "5.7 %");
        assert_eq!(format_efficiency(Some(0.00123)), "0.12 %");
        assert_eq!(format_efficiency(Some(0.0000456)), "0.0046 %");
        assert_eq!(format_efficiency(Some(0.0)), "0.0 %");
        assert_eq!(format_efficiency(None), "n/a");
    }

    #[test]
    fn cases_table_lists_cases_and_skips() {
        let skipped = vec![("device_to_host_eviction".to_string(), "no CUDA device".to_string())];
        let text = cases_table("Spill benchmark", &info("n/a", None), &[], &[measurement()], &skipped).render();
        assert!(text.contains("round trip [roundtrip]") && text.contains("Efficiency"), "{text}");
        assert!(text.contains("device_to_host_eviction: skipped (no CUDA device)"), "{text}");
    }
}
