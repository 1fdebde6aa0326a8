//! `--sweep MIN:MAX`: one run per size, each with its own server process and its own
//! ceiling measured right after its round trips (as a single run measures it), then a
//! summary per size (latency median, p99, p99.9, bandwidth, ceiling, efficiency, floor,
//! efficiency against the floor, first round trip; on the UCX lane the raw UCX median and
//! the lane's median over it) and the SVG of bandwidth and ceiling (and raw UCX) against
//! size, log-log, captioned with what was measured and, when known, the commit.

use super::args::Args;
use super::runs::{efficiency, run_once};
use crate::plot::{self, Captions, Series};
use crate::raw_ucx::format_ratio;
use crate::record::GB;
use crate::report::{format_efficiency, Measurement, RunInfo};
use crate::roundtrip::RoundTripOptions;
use crate::size::{format_bytes, format_rate, format_seconds};
use crate::table::Columns;
use crate::{progress, provenance, BenchError, ObjectType};
use ferrylink::transport::Context;

/// Runs every size of `sizes`, prints the summary (or the JSON records) and draws the plot.
pub(super) fn sweep(args: &Args, ctx: &Context, base: &RoundTripOptions, sizes: &[u64]) -> Result<(), BenchError> {
    let bar = progress::bar(sizes.len() as u64, "sweep");
    let mut runs = Vec::with_capacity(sizes.len());
    for (i, &n) in sizes.iter().enumerate() {
        bar.set_message(format_bytes(n as f64));
        let n_bytes = usize::try_from(n).map_err(|_| BenchError::Usage(format!("{n} bytes is too large")))?;
        let o = RoundTripOptions { n_bytes, ..base.clone() };
        let (info, m) = run_once(ctx, &o, i, None).inspect_err(|_| bar.abandon())?;
        if args.json {
            println!("{}", info.record(&m).to_json_line());
        }
        runs.push((info, m));
        bar.inc(1);
    }
    bar.finish_and_clear();
    let captions = captions(&runs, provenance_line(provenance::commit(), args.label.as_deref()));
    if !args.json {
        print!("{}", summary(&captions, &runs));
    }
    plot::draw_sweep(&args.plot, &captions, &series(&runs)).map_err(BenchError::Other)?;
    eprintln!("plot written to {}", args.plot.display());
    Ok(())
}

/// `commit C · LABEL`, either part alone, or `None` without both.
fn provenance_line(commit: Option<String>, label: Option<&str>) -> Option<String> {
    let parts: Vec<String> =
        commit.map(|c| format!("commit {c}")).into_iter().chain(label.map(str::to_owned)).collect();
    (!parts.is_empty()).then(|| parts.join(" · "))
}

/// What the runs of a sweep measured: the operation, lane (and `UCX_TLS`), memory,
/// devices, receive buffers (or blocks), iterations; the same for every size.
fn what_was_measured(info: &RunInfo) -> String {
    let lane = info.lane.as_deref().unwrap_or("unknown");
    let lane = match &info.ucx_tls {
        Some(tls) => format!("{lane} lane (UCX_TLS {tls})"),
        None => format!("{lane} lane"),
    };
    let memory = match (info.object_type, info.memory) {
        (ObjectType::Host, _) => "host memory".to_owned(),
        (ObjectType::Device, Some(kind)) => format!("device memory ({kind})"),
        (ObjectType::Device, None) => "device memory".to_owned(),
    };
    let devices = match (info.object_type, info.server_dev, info.client_dev) {
        (ObjectType::Device, Some(s), Some(c)) => format!(", server GPU {s}, client GPU {c}"),
        _ => String::new(),
    };
    let op = info.op.unwrap_or_default();
    let (op, receives) = match op.one_sided() {
        None => (
            format!("--op {op} (send and receive)"),
            if info.reuse_alloc { "one reused receive buffer" } else { "fresh receive buffers" }.to_owned(),
        ),
        Some(_) => {
            let blocks = info.blocks.unwrap_or(1);
            let plural = if blocks == 1 { "" } else { "s" };
            (
                format!("--op {op} (one-sided, notified)"),
                format!("registered buffers, {blocks} block{plural} per request"),
            )
        }
    };
    format!(
        "{op}, {lane}, {memory}{devices}, {receives}, {} timed round trips per size after {} warm-up",
        info.n_iter, info.n_warmup_iter
    )
}

/// The ceiling methods of the runs, each once, in the order first seen.
fn ceiling_methods(runs: &[(RunInfo, Measurement)]) -> String {
    let mut methods: Vec<&str> = Vec::new();
    for method in runs.iter().filter_map(|(_, m)| m.ceiling.as_ref()).map(|c| c.method.as_str()) {
        if !methods.contains(&method) {
            methods.push(method);
        }
    }
    if methods.is_empty() {
        "not measured".into()
    } else {
        methods.join("; or ")
    }
}

/// The plot's title and caption lines, which the summary prints too.
fn captions(runs: &[(RunInfo, Measurement)], provenance: Option<String>) -> Captions {
    let mut lines = Vec::new();
    if let Some((first, _)) = runs.first() {
        lines.push(what_was_measured(first));
    }
    lines.push(format!("ceiling, measured at each size in the same run: {}", ceiling_methods(runs)));
    if on_ucx_lane(runs) {
        lines.push(RAW_UCX_CAPTION.into());
    }
    lines.extend(provenance);
    let op = runs.first().and_then(|(i, _)| i.op).unwrap_or_default();
    Captions { title: format!("local-send-recv --op {op}: round-trip bandwidth against message size (2·n/t)"), lines }
}

/// The caption line of a sweep on the UCX lane.
const RAW_UCX_CAPTION: &str =
    "raw UCX, measured at each size in the same run: tag send + receive each way, same processes, same UCX";

/// Whether the sweep ran on the UCX lane (its sizes have the raw UCX reference).
fn on_ucx_lane(runs: &[(RunInfo, Measurement)]) -> bool {
    runs.iter().any(|(i, _)| i.lane.as_deref() == Some("ucx"))
}

/// The summary printed after a sweep: the captions, then one row per size (with the raw
/// UCX columns on the UCX lane).
fn summary(captions: &Captions, runs: &[(RunInfo, Measurement)]) -> String {
    let ucx = on_ucx_lane(runs);
    let mut header = vec![
        "n_bytes",
        "latency median",
        "p99",
        "p99.9",
        "bandwidth",
        "ceiling",
        "efficiency",
        "floor",
        "floor efficiency",
        "first round trip",
    ];
    if ucx {
        header.extend(["raw UCX median", "lane / raw UCX"]);
    }
    let mut columns = Columns::new(header);
    for (info, m) in runs {
        let s = &m.summary;
        let mut row = vec![
            format_bytes(info.n_bytes as f64),
            format_seconds(s.latency_median()),
            format_seconds(s.latency_quantile(0.99)),
            format_seconds(s.latency_quantile(0.999)),
            format_rate(s.bandwidth_avg()),
            m.ceiling.as_ref().map_or_else(|| "n/a".into(), |c| format_rate(c.bytes_per_sec)),
            efficiency(m),
            m.floor.as_ref().map_or_else(|| "n/a".into(), |f| format_seconds(f.mean_seconds())),
            format_efficiency(m.floor_efficiency()),
            m.first_round_trip.map_or_else(|| "n/a".into(), format_seconds),
        ];
        if ucx {
            row.push(m.raw_ucx.as_ref().map_or_else(|| "n/a".into(), |r| format_seconds(r.median_seconds)));
            row.push(format_ratio(m.raw_ucx_ratio()));
        }
        columns.push(row);
    }
    let mut out = format!("Sweep: {}\n", captions.title);
    for line in &captions.lines {
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(
        "bandwidth: Σ(2·n) / Σt over the timed round trips; efficiency: bandwidth / ceiling; floor: two copies \
         each seen done, mean per round trip; floor efficiency: floor / mean round trip\n",
    );
    if ucx {
        out.push_str(
            "raw UCX median: the same round trip in raw UCX tag messages; lane / raw UCX: latency median / it\n",
        );
    }
    out.push_str(&columns.render());
    out
}

/// The plot's lines: the round trip's average bandwidth, the ceiling, and raw UCX's
/// average bandwidth (2·n / its mean round trip) where it was measured.
fn series(runs: &[(RunInfo, Measurement)]) -> Vec<Series> {
    let lane = runs.first().and_then(|(i, _)| i.lane.clone()).unwrap_or_default();
    let op = runs.first().and_then(|(i, _)| i.op).unwrap_or_default();
    let raw_ucx: Vec<(u64, f64)> = runs
        .iter()
        .filter_map(|(i, m)| {
            let mean = m.raw_ucx.as_ref()?.mean_seconds();
            (mean > 0.0).then(|| (i.n_bytes, 2.0 * i.n_bytes as f64 / mean / GB))
        })
        .collect();
    let mut series = vec![
        Series {
            name: format!("ferrylink {op} round trip, {lane} lane (average bandwidth)"),
            points: runs.iter().map(|(i, m)| (i.n_bytes, m.summary.bandwidth_avg() / GB)).collect(),
        },
        Series {
            name: "ceiling: raw copy, measured in the same run".into(),
            points: runs
                .iter()
                .filter_map(|(i, m)| m.ceiling.as_ref().map(|c| (i.n_bytes, c.bytes_per_sec / GB)))
                .collect(),
        },
    ];
    if !raw_ucx.is_empty() {
        series.push(Series { name: "raw UCX tag round trip, measured in the same run".into(), points: raw_ucx });
    }
    series
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ceiling::{Ceiling, Floor};
    use crate::stats::Summary;
    use crate::MemoryKind;
    use std::time::Duration;

    fn run(n_bytes: u64, micros: &[u64], ceiling: Option<(f64, &str)>) -> (RunInfo, Measurement) {
        let info = RunInfo {
            benchmark: "local-send-recv".into(),
            lane: Some("native".into()),
            ucx_tls: None,
            object_type: ObjectType::Device,
            n_bytes,
            n_iter: micros.len(),
            n_warmup_iter: 1,
            reuse_alloc: false,
            memory: Some(MemoryKind::Pool),
            server_dev: Some(0),
            client_dev: Some(1),
            op: Some(crate::onesided::Op::Send),
            blocks: None,
            prepared: None,
        };
        let times: Vec<Duration> = micros.iter().copied().map(Duration::from_micros).collect();
        let m = Measurement {
            case: "roundtrip".into(),
            title: "round trip".into(),
            summary: Summary::new(2.0 * n_bytes as f64, &times),
            ceiling: ceiling.map(|(bytes_per_sec, method)| Ceiling {
                bytes_per_sec,
                method: method.into(),
                total_seconds: 1.0,
                n_iter: 1,
            }),
            // With a ceiling, a floor of 10 µs per round trip.
            floor: ceiling.map(|_| Floor::from_times(&[Duration::from_micros(10); 3], "two copies".into())),
            raw_ucx: None,
            first_round_trip: Some(1e-3),
        };
        (info, m)
    }

    #[test]
    fn captions_name_lane_memory_devices_ceiling_and_commit() {
        let runs = [
            run(8, &[10, 20, 30], Some((1e6, "copy kernel on device 0, both ways, 2·n/t"))),
            run(1_000_000, &[40, 50, 60], Some((1e11, "cuMemcpyDtoD on device 0, both ways, 2·n/t"))),
            run(2_000_000, &[70, 80, 90], Some((2e11, "cuMemcpyDtoD on device 0, both ways, 2·n/t"))),
        ];
        let c = captions(&runs, provenance_line(Some("0123abcd".into()), Some("H200")));
        assert_eq!(
            c.lines,
            [
                "--op send (send and receive), native lane, device memory (pool), server GPU 0, client GPU 1, \
                 fresh receive buffers, 3 timed round trips per size after 1 warm-up",
                "ceiling, measured at each size in the same run: copy kernel on device 0, both ways, 2·n/t; or \
                 cuMemcpyDtoD on device 0, both ways, 2·n/t",
                "commit 0123abcd · H200",
            ]
        );
        assert_eq!(provenance_line(None, Some("H200")).as_deref(), Some("H200"));
        assert_eq!(provenance_line(Some("0123abcd".into()), None).as_deref(), Some("commit 0123abcd"));
        assert_eq!(provenance_line(None, None), None);
        let without = captions(&[run(8, &[10], None)], None);
        assert_eq!(without.lines.len(), 2, "{without:?}");
        assert!(without.lines[1].ends_with("not measured"), "{without:?}");
        assert_eq!(c.title, "local-send-recv --op send: round-trip bandwidth against message size (2·n/t)");
    }

    #[test]
    fn one_sided_captions_name_the_op_and_its_blocks() {
        use crate::onesided::Op;
        let mut runs = [run(8_000, &[10, 20, 30], None)];
        runs[0].0.op = Some(Op::Put);
        runs[0].0.blocks = Some(1000);
        let c = captions(&runs, None);
        assert_eq!(c.title, "local-send-recv --op put: round-trip bandwidth against message size (2·n/t)");
        assert!(
            c.lines[0].starts_with(
                "--op put (one-sided, notified), native lane, device memory (pool), server GPU 0, client GPU 1, \
                 registered buffers, 1000 blocks per request, 3 timed round trips"
            ),
            "{c:?}"
        );
        assert_eq!(series(&runs)[0].name, "ferrylink put round trip, native lane (average bandwidth)");
        runs[0].0.op = Some(Op::Get);
        runs[0].0.blocks = Some(1);
        let line = &captions(&runs, None).lines[0];
        assert!(line.starts_with("--op get (one-sided, notified)") && line.contains("1 block per request"), "{line}");
    }

    #[test]
    fn the_summary_has_one_row_per_size_with_percentiles_and_efficiency() {
        let runs = [run(8, &[10, 20, 30], Some((1e6, "memcpy"))), run(1_000_000, &[40, 50, 60], None)];
        let c = captions(&runs, None);
        let text = summary(&c, &runs);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], format!("Sweep: {}", c.title));
        let header = lines.iter().position(|l| l.trim_start().starts_with("n_bytes")).expect("a header");
        let cells = |l: &str| l.split(" | ").map(str::trim).map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(
            cells(lines[header]),
            [
                "n_bytes",
                "latency median",
                "p99",
                "p99.9",
                "bandwidth",
                "ceiling",
                "efficiency",
                "floor",
                "floor efficiency",
                "first round trip"
            ]
        );
        // 8 B: 16 bytes a round trip, 48 bytes in 60 µs = 800 kB/s against 1 MB/s; a
        // floor of 10 µs against a mean round trip of 20 µs.
        assert_eq!(
            cells(lines[header + 2]),
            [
                "8 B",
                "20.00 us",
                "30.00 us",
                "30.00 us",
                "800.00 kB/s",
                "1000.00 kB/s",
                "80.0 %",
                "10.00 us",
                "50.0 %",
                "1.00 ms"
            ]
        );
        assert_eq!(cells(lines[header + 3])[0], "1000.00 kB");
        assert_eq!(cells(lines[header + 3])[5..9], ["n/a", "n/a", "n/a", "n/a"]);
        assert_eq!(lines.len(), header + 4, "{text}");
    }

    /// A run of `run` on the UCX lane, with a raw UCX reference of `raw_micros` per round
    /// trip (none for `None`).
    fn ucx_run(n_bytes: u64, micros: &[u64], raw_micros: Option<u64>) -> (RunInfo, Measurement) {
        let (mut info, mut m) = run(n_bytes, micros, Some((1e9, "memcpy")));
        info.lane = Some("ucx".into());
        m.raw_ucx = raw_micros
            .map(|t| crate::raw_ucx::RawUcx::from_times(&[Duration::from_micros(t); 3], "UCX tag ping-pong".into()));
        (info, m)
    }

    #[test]
    fn a_sweep_on_the_ucx_lane_shows_raw_ucx_and_the_ratio() {
        let runs = [ucx_run(8, &[10, 20, 30], Some(8)), ucx_run(1_000_000, &[40, 50, 60], None)];
        let c = captions(&runs, None);
        assert!(c.lines.iter().any(|l| l == RAW_UCX_CAPTION), "{c:?}");
        let text = summary(&c, &runs);
        let lines: Vec<&str> = text.lines().collect();
        let header = lines.iter().position(|l| l.trim_start().starts_with("n_bytes")).expect("a header");
        let cells = |l: &str| l.split(" | ").map(str::trim).map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(cells(lines[header])[10..], ["raw UCX median", "lane / raw UCX"], "{text}");
        // A median round trip of 20 µs against raw UCX's 8 µs.
        assert_eq!(cells(lines[header + 2])[10..], ["8.00 us", "2.50x"], "{text}");
        assert_eq!(cells(lines[header + 3])[10..], ["n/a", "n/a"], "{text}");
        assert!(text.contains("lane / raw UCX: latency median / it"), "{text}");
        // Raw UCX's bandwidth: 16 bytes in 8 µs, at the one size it was measured.
        let s = series(&runs);
        assert_eq!(s.len(), 3, "{s:?}");
        assert_eq!(s[2].points.len(), 1, "{s:?}");
        assert!((s[2].points[0].1 - 16.0 / 8e-6 / 1e9).abs() < 1e-12, "{s:?}");
        // The native lane's sweep keeps its columns and lines.
        let native = [run(8, &[10, 20, 30], Some((1e6, "memcpy")))];
        let c = captions(&native, None);
        assert!(!summary(&c, &native).contains("raw UCX") && !c.lines.iter().any(|l| l.contains("raw UCX")));
        assert_eq!(series(&native).len(), 2);
    }

    #[test]
    fn the_series_are_bandwidth_and_ceiling_in_gb_per_second() {
        let runs = [run(8, &[10, 20, 30], Some((1e6, "memcpy"))), run(1_000_000, &[40, 50, 60], None)];
        let s = series(&runs);
        assert_eq!(s.len(), 2);
        assert!(s[0].name.contains("native lane"), "{}", s[0].name);
        assert_eq!(s[0].points.len(), 2);
        assert_eq!(s[0].points[0].0, 8);
        assert!((s[0].points[0].1 - 48.0 / 60e-6 / 1e9).abs() < 1e-12, "{:?}", s[0].points);
        assert_eq!(s[1].points, vec![(8, 1e-3)], "a size without a ceiling has no point");
    }
}
