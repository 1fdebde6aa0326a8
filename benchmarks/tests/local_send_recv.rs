//! Runs the `local-send-recv` binary on host memory (no GPU needed) and checks its table,
//! its JSON, its sweep and its errors; the tests of a device index out of range and of a
//! device sweep need a GPU (ignored unless built with `--features gpu-tests`).

use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_local-send-recv"))
        .args(args)
        .env_remove("FERRYLINK_TRANSPORT")
        .output()
        .expect("the binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The value of the table row `key`.
fn value<'a>(table: &'a str, key: &str) -> Option<&'a str> {
    table.lines().find_map(|l| l.split_once(" | ").filter(|(k, _)| k.trim_end() == key).map(|(_, v)| v))
}

#[test]
fn host_round_trip_prints_the_table() {
    let out = run(&["-o", "host", "-n", "1MB", "--n-iter", "3"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.starts_with("Roundtrip benchmark\n"), "{stdout}");
    assert_eq!(value(&stdout, "n_iter"), Some("3"), "{stdout}");
    assert_eq!(value(&stdout, "n_bytes"), Some("1000.00 kB"), "{stdout}");
    assert_eq!(value(&stdout, "object"), Some("host"), "{stdout}");
    assert_eq!(value(&stdout, "reuse alloc"), Some("False"), "{stdout}");
    // Host runs have no device memory kind.
    assert!(value(&stdout, "memory").is_none(), "{stdout}");
    assert_eq!(value(&stdout, "lane"), Some("native"), "{stdout}");
    assert_eq!(value(&stdout, "Device(s)"), Some("host"), "{stdout}");
    for key in ["Average", "Median"] {
        assert!(value(&stdout, key).is_some_and(|v| v.ends_with("B/s")), "{key}: {stdout}");
    }
    for key in ["Latency avg", "Latency median", "Latency p99", "Latency p99.9", "first round trip"] {
        assert!(value(&stdout, key).is_some_and(|v| v.ends_with('s')), "{key}: {stdout}");
    }
    assert!(value(&stdout, "Ceiling").is_some_and(|v| v.contains("B/s (memcpy")), "{stdout}");
    assert!(value(&stdout, "Efficiency").is_some_and(|v| v.ends_with(" %")), "{stdout}");
    // The floor: its mean time per round trip (positive), its median and its method, then
    // the efficiency against it.
    let floor = value(&stdout, "Floor").unwrap_or_else(|| panic!("no floor row: {stdout}"));
    assert!(floor.contains(" (median ") && floor.contains("; copy to the other thread, echo seen done"), "{stdout}");
    let (amount, unit) = floor.split_once(' ').unwrap();
    let positive = amount.parse::<f64>().is_ok_and(|t| t > 0.0);
    assert!(positive && (unit.starts_with("us") || unit.starts_with("ms")), "{floor}");
    let floor_efficiency =
        value(&stdout, "Floor efficiency").unwrap_or_else(|| panic!("no floor efficiency: {stdout}"));
    assert!(floor_efficiency.contains(" % (") && floor_efficiency.ends_with("× the floor)"), "{stdout}");
    for i in ["000", "001", "002"] {
        assert!(value(&stdout, i).is_some(), "row {i}: {stdout}");
    }
    assert!(value(&stdout, "003").is_none(), "{stdout}");
}

#[test]
fn no_detailed_report_leaves_the_iterations_out() {
    let out = run(&["-o", "host", "-n", "1kB", "--n-iter", "3", "--no-detailed-report"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(value(&stdout, "Latency median").is_some(), "{stdout}");
    assert!(!stdout.contains("Iterations") && value(&stdout, "000").is_none(), "{stdout}");
}

#[test]
fn json_has_one_record_with_every_required_key() {
    let out = run(&["-o", "host", "-n", "1MB", "--n-iter", "3", "--reuse-alloc", "--json"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{}", text(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    for key in ferrylink_benchmarks::record::REQUIRED_KEYS {
        assert!(v.get(key).is_some(), "missing {key}: {stdout}");
    }
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["lane"], "native");
    assert_eq!(v["object_type"], "host");
    assert_eq!(v["n_bytes"], 1_000_000);
    assert_eq!(v["n_iter"], 3);
    assert_eq!(v["reuse_alloc"], true);
    assert!(v["bandwidth_avg_gbps"].as_f64().unwrap() > 0.0);
    assert!(v["ceiling_gbps"].as_f64().unwrap() > 0.0);
    assert!(v["efficiency"].as_f64().unwrap() > 0.0);
    assert!(v["floor_us"].as_f64().unwrap() > 0.0, "{stdout}");
    assert!(v["floor_efficiency"].as_f64().unwrap() > 0.0, "{stdout}");
    assert_eq!(v["iterations"].as_array().unwrap().len(), 3);
    assert!(v["memory"].is_null(), "host runs have no device memory kind: {stdout}");
    assert!(v["first_round_trip_us"].as_f64().unwrap() > 0.0, "{stdout}");
}

#[test]
fn without_warm_up_the_first_round_trip_is_the_first_timed_one() {
    let out = run(&["-o", "host", "-n", "64KiB", "--n-iter", "2", "--n-warmup-iter", "0", "--json"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let first = v["first_round_trip_us"].as_f64().unwrap();
    let timed = v["iterations"][0]["latency_us"].as_f64().unwrap();
    assert!((first - timed).abs() < 1e-3, "{first} vs {timed}: {stdout}");
}

#[test]
fn memory_kinds_need_device_objects() {
    for kind in ["vmm", "cudarc", "cudarc-default"] {
        let out = run(&["-o", "host", "-n", "1MB", "--memory", kind]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{kind}: {stderr}");
        assert!(stderr.contains(&format!("--memory {kind} needs device objects")), "{stderr}");
    }
    // `pool` is the default, and host runs take it.
    let out = run(&["-o", "host", "-n", "64KiB", "--n-iter", "1", "--memory", "pool"]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    let out = run(&["-o", "device", "-n", "1MB", "--memory", "vmm", "--reuse-alloc"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--reuse-alloc goes with --memory pool only"), "{}", text(&out.stderr));

    let out = run(&["--memory", "malloc"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("cudarc-default"), "{}", text(&out.stderr));

    if ferrylink::memory::cuda::device_count() == 0 {
        // Without -o the object type is host here.
        let out = run(&["-n", "1MB", "--memory", "vmm"]);
        assert_eq!(out.status.code(), Some(2));
        assert!(text(&out.stderr).contains("this machine has no CUDA device"), "{}", text(&out.stderr));
        let out = run(&["-o", "device", "-n", "1MB", "--memory", "cudarc"]);
        assert_eq!(out.status.code(), Some(2));
        assert!(text(&out.stderr).contains("needs a CUDA device"), "{}", text(&out.stderr));
    }
}

#[test]
fn errors_are_messages_and_exit_codes() {
    let out = run(&["-n", "12 parsecs"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("unknown unit"), "{}", text(&out.stderr));

    let out = run(&["-o", "host", "-n", "1MB", "-s", "gpu-node-2", "-p", "13337"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--server-only on one side"), "{}", text(&out.stderr));

    let out = run(&["-o", "host", "-n", "1MB", "--client-only", "-s", "gpu-node-2"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("give -p/--port"), "{}", text(&out.stderr));

    let out = run(&["-o", "host", "--n-iter", "0"]);
    assert_eq!(out.status.code(), Some(2));

    if ferrylink::memory::cuda::device_count() == 0 {
        let out = run(&["-o", "device", "-n", "1MB"]);
        assert_eq!(out.status.code(), Some(2));
        assert!(text(&out.stderr).contains("needs a CUDA device"), "{}", text(&out.stderr));
        let out = run(&["--pairs", "all"]);
        assert_eq!(out.status.code(), Some(2));
        assert!(text(&out.stderr).contains("--pairs needs device objects"), "{}", text(&out.stderr));
    }
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn a_device_out_of_range_is_an_error() {
    ferrylink_testkit::require_gpu();
    let out = run(&["-o", "device", "-n", "1MB", "-d", "99"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("out of range"), "{}", text(&out.stderr));
}

/// A sweep from 8 B: a summary row per size with its percentiles, ceiling and
/// efficiency, and an SVG with both lines (a point per size each), captioned with what was
/// measured, the commit (from FERRYLINK_BENCH_COMMIT) and --label.
#[test]
fn sweep_writes_a_plot_and_a_summary() {
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("sweep.svg");
    let args = ["-o", "host", "--sweep", "8B:32B", "--n-iter", "3", "--label", "test label", "--plot"];
    let out = Command::new(env!("CARGO_BIN_EXE_local-send-recv"))
        .args(args)
        .arg(&plot)
        .env_remove("FERRYLINK_TRANSPORT")
        .env("FERRYLINK_BENCH_COMMIT", "0123456789ab")
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{}", text(&out.stderr));
    assert!(stdout.contains("native lane, host memory, fresh receive buffers, 3 timed round trips"), "{stdout}");
    assert!(stdout.contains("commit 0123456789ab · test label"), "{stdout}");
    let header = [
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
    let cells = |l: &str| l.split(" | ").map(str::trim).map(str::to_owned).collect::<Vec<_>>();
    let lines: Vec<&str> = stdout.lines().collect();
    let at = lines.iter().position(|l| cells(l) == header).unwrap_or_else(|| panic!("no header: {stdout}"));
    let rows: Vec<Vec<String>> = lines[at + 2..].iter().map(|l| cells(l)).collect();
    assert_eq!(rows.iter().map(|r| r[0].as_str()).collect::<Vec<_>>(), ["8 B", "16 B", "32 B"], "{stdout}");
    for row in &rows {
        assert!(row[1..4].iter().all(|c| c.ends_with('s')), "latencies: {row:?}");
        assert!(row[4].ends_with("B/s") && row[5].ends_with("B/s") && row[6].ends_with(" %"), "{row:?}");
        assert!(row[7].ends_with('s') && row[8].ends_with(" %"), "floor: {row:?}");
    }
    let svg = std::fs::read_to_string(&plot).unwrap();
    for text in [
        "ferrylink send round trip, native lane (average bandwidth)",
        "ceiling: raw copy, measured in the same run",
        "native lane, host memory",
        "memcpy A→B + B→A",
        "commit 0123456789ab · test label",
    ] {
        assert!(svg.contains(text), "no {text:?} in the plot: {svg}");
    }
    assert_eq!(svg.matches("<circle").count(), 6, "a point per size on each line: {svg}");
}

/// The same on a GPU: device messages from 8 B (below the 1 MB the sweeps used to start
/// at), each size with its device ceiling (the copy kernel or cuMemcpyDtoD on one device).
#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn device_sweep_from_eight_bytes_draws_both_lines() {
    ferrylink_testkit::require_gpu();
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("sweep.svg");
    let out = run(&["-o", "device", "--sweep", "8B:64kB", "--n-iter", "5", "--plot", plot.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{}", text(&out.stderr));
    assert!(stdout.contains("device memory (pool), server GPU 0, client GPU 0"), "{stdout}");
    let svg = std::fs::read_to_string(&plot).unwrap();
    // 8, 16, …, 32768 and 64000 bytes: 14 sizes, a bandwidth and a ceiling point each.
    assert_eq!(svg.matches("<circle").count(), 28, "{stdout}\n{svg}");
    assert!(svg.contains("copy kernel on device 0") || svg.contains("cuMemcpyDtoD on device 0"), "{svg}");
}

/// A range that goes down, or that is not MIN:MAX of sizes, is a usage error (exit 2),
/// and nothing is measured or drawn; so is --label without --sweep.
#[test]
fn sweep_ranges_that_make_no_sense_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("sweep.svg");
    for (range, says) in [
        ("1GB:8B", "MIN is larger than MAX"),
        ("8B-1GB", "expected MIN:MAX"),
        ("8XB:1GB", "unknown unit"),
        ("0B:1MB", "zero bytes"),
        (":1MB", "empty size"),
    ] {
        let out = run(&["-o", "host", "--sweep", range, "--plot", plot.to_str().unwrap()]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{range}: {stderr}");
        assert!(stderr.starts_with("error: ") && stderr.contains(says), "{range}: {stderr}");
        assert!(!plot.exists(), "{range}: a plot was drawn");
    }
    let out = run(&["-o", "host", "-n", "1kB", "--label", "x"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

#[test]
fn timeline_shows_the_steps_of_both_processes() {
    let out = run(&["-o", "host", "-n", "1kB", "--n-iter", "50", "--timeline"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let timeline = stdout.split_once("Timeline: ").map(|(_, t)| t).unwrap_or_else(|| panic!("no timeline:\n{stdout}"));
    assert!(timeline.starts_with("median µs from the start of a round trip, over 49 round trips"), "{timeline}");
    let steps: Vec<&str> = timeline.lines().skip(1).collect();
    assert!(steps[0].ends_with("client main: round trip starts"), "{timeline}");
    for step in [
        "client main: send called",
        "server ferrylink-progress: control message read [Data]",
        "server main: send called",
        "client ferrylink-progress: control message read [Data]",
        "client main: receive wait returned",
    ] {
        assert!(steps.iter().any(|s| s.contains(step)), "no step {step:?} in:\n{timeline}");
    }
    // In order: the client's send comes before the server reads it, which comes before
    // the echo reaches the client.
    let at = |step: &str| steps.iter().position(|s| s.contains(step)).unwrap();
    assert!(at("client main: send called") < at("server ferrylink-progress: control message read [Data]"));
    assert!(at("server main: send called") < at("client ferrylink-progress: control message read [Data]"));
}

#[test]
fn timeline_refuses_options_it_cannot_serve() {
    for extra in [&["--json"][..], &["--sweep", "1kB:2kB"], &["--pairs", "all"]] {
        let mut args = vec!["-o", "host", "--timeline"];
        args.extend_from_slice(extra);
        let out = run(&args);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", text(&out.stderr));
    }
}

/// `a` and `b` agree to a relative 1e-9 (the binary and the test sum and divide in other
/// orders).
fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

/// The median (mean of the two middle values for an even count).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// Bandwidth is 2·n/t, recomputed here from `n_bytes` and the times the record carries
/// (not from the binary's own arithmetic): the average is 2·n·n_iter / Σt, each iteration
/// 2·n / t, the median their median, the ceiling 2·n·ceiling_n_iter / ceiling_time_us, the
/// efficiency average / ceiling. The times themselves fit in the run's wall-clock time.
#[test]
fn json_bandwidths_are_two_n_over_the_recorded_times() {
    let started = std::time::Instant::now();
    let out = run(&["-o", "host", "-n", "1MB", "--n-iter", "5", "--json"]);
    let wall = started.elapsed().as_secs_f64();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let f = |key: &str| v[key].as_f64().unwrap_or_else(|| panic!("{key} is not a number: {stdout}"));
    let n = f("n_bytes");
    assert_eq!(n, 1e6);
    let seconds: Vec<f64> =
        v["iterations"].as_array().unwrap().iter().map(|it| it["latency_us"].as_f64().unwrap() * 1e-6).collect();
    assert_eq!(seconds.len(), 5, "{stdout}");
    let total: f64 = seconds.iter().sum();
    assert!(total > 0.0 && total < wall, "Σt {total} s in a run of {wall} s: {stdout}");

    let average = 2.0 * n * 5.0 / total / 1e9;
    assert!(close(f("bandwidth_avg_gbps"), average), "average {} != 2·n·5/Σt = {average}", f("bandwidth_avg_gbps"));
    for (it, t) in v["iterations"].as_array().unwrap().iter().zip(&seconds) {
        let bw = it["bandwidth_gbps"].as_f64().unwrap();
        assert!(close(bw, 2.0 * n / t / 1e9), "iteration {it}: {bw} != 2·n/t = {}", 2.0 * n / t / 1e9);
    }
    let med = median(seconds.iter().map(|t| 2.0 * n / t / 1e9).collect());
    assert!(close(f("bandwidth_median_gbps"), med), "median {} != {med}", f("bandwidth_median_gbps"));
    assert!(close(f("latency_avg_us"), total / 5.0 * 1e6), "{stdout}");
    assert!(close(f("latency_median_us"), median(seconds.clone()) * 1e6), "{stdout}");

    let ceiling_n_iter = v["ceiling_n_iter"].as_u64().unwrap();
    assert_eq!(ceiling_n_iter, 5, "{stdout}");
    let ceiling_seconds = f("ceiling_time_us") * 1e-6;
    assert!(ceiling_seconds > 0.0 && ceiling_seconds < wall, "{stdout}");
    let ceiling = 2.0 * n * ceiling_n_iter as f64 / ceiling_seconds / 1e9;
    assert!(close(f("ceiling_gbps"), ceiling), "ceiling {} != 2·n·5/Σt = {ceiling}", f("ceiling_gbps"));
    assert!(close(f("efficiency"), average / ceiling), "{stdout}");

    // The floor: floor_us is its recorded total over its iterations, positive and within
    // the run's wall-clock time; floor_efficiency is floor_us over the mean round trip.
    assert_eq!(v["floor_n_iter"].as_u64(), Some(5), "{stdout}");
    let floor_seconds = f("floor_time_us") * 1e-6;
    assert!(floor_seconds > 0.0 && floor_seconds < wall, "{stdout}");
    assert!(close(f("floor_us"), f("floor_time_us") / 5.0), "{stdout}");
    assert!(f("floor_median_us") > 0.0, "{stdout}");
    assert!(close(f("floor_efficiency"), f("floor_us") / (total / 5.0 * 1e6)), "{stdout}");
    assert!(v["floor_method"].as_str().is_some_and(|m| m.starts_with("copy to the other thread")), "{stdout}");
}

/// The ⌈q·n⌉-th smallest of `sorted` (nearest rank, at least the first).
fn nearest_rank(sorted: &[f64], q: f64) -> f64 {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// p99 and p99.9 recomputed from the recorded times: the nearest-rank value, which the
/// HDR histogram reports at most 1/1024 above (plus a nanosecond for the µs round trip
/// through JSON); the median is the exact one, p99 at least the median, p99.9 at least
/// p99. 300 round trips: p99 is the 297th time, p99.9 the 300th.
#[test]
fn json_latency_percentiles_are_nearest_ranks_of_the_recorded_times() {
    let out = run(&["-o", "host", "-n", "1kB", "--n-iter", "300", "--json"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let f = |key: &str| v[key].as_f64().unwrap_or_else(|| panic!("{key} is not a number: {stdout}"));
    let mut times: Vec<f64> =
        v["iterations"].as_array().unwrap().iter().map(|it| it["latency_us"].as_f64().unwrap()).collect();
    assert_eq!(times.len(), 300, "{stdout}");
    times.sort_by(f64::total_cmp);
    let (p50, p99, p999) = (f("latency_median_us"), f("latency_p99_us"), f("latency_p999_us"));
    assert!(close(p50, median(times.clone())), "median {p50}: {stdout}");
    for (name, got, q) in [("p99", p99, 0.99), ("p99.9", p999, 0.999)] {
        let exact = nearest_rank(&times, q);
        assert!(
            got >= exact - 1e-3 && got <= exact * (1.0 + 1.0 / 1024.0) + 1e-3,
            "{name} {got} µs, nearest rank {exact} µs: {stdout}"
        );
    }
    assert_eq!(nearest_rank(&times, 0.999), times[299]);
    assert!(p99 >= p50 && p999 >= p99, "p50 {p50}, p99 {p99}, p99.9 {p999}");
}

#[test]
fn echoes_match_what_was_sent() {
    // Every round trip compared (fresh receives, one receive buffer), and a run of one
    // round trip (the first is the last).
    let runs = [
        &["--n-iter", "4", "--check"][..],
        &["--n-iter", "4", "--check", "--reuse-alloc"],
        &["--n-warmup-iter", "0", "--n-iter", "1"],
    ];
    for extra in runs {
        let mut args = vec!["-o", "host", "-n", "100kB"];
        args.extend_from_slice(extra);
        let out = run(&args);
        assert!(out.status.success(), "{extra:?}:\n{}", text(&out.stderr));
    }
}

/// The server flips byte 50000 of one echo (round trips count from 0, the warm-up one
/// first): a run fails naming the round trip and the offset, on the first and the last
/// round trip always, on the others with `--check`.
#[test]
fn a_corrupted_echo_fails_the_run() {
    // 1 warm-up + 4 timed round trips: 0..=4.
    let base = ["-o", "host", "-n", "100kB", "--n-iter", "4"];
    for (round_trip, check, reuse) in [("0", false, false), ("4", false, true), ("2", true, false), ("3", true, true)] {
        let mut args = base.to_vec();
        args.extend(["--corrupt-echo-for-test", round_trip]);
        args.extend(check.then_some("--check"));
        args.extend(reuse.then_some("--reuse-alloc"));
        let out = run(&args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        let first = stderr.lines().next().unwrap_or_default();
        assert!(
            first.starts_with(&format!(
                "error: transport: round trip {round_trip}: the echo differs from what was sent"
            )) && first.contains("first difference at byte offset 50000"),
            "{args:?}: {stderr}"
        );
    }
    // Without --check a round trip in the middle is not compared: the corruption passes
    // unseen (so the failures above come from the comparisons the flags ask for).
    let mut args = base.to_vec();
    args.extend(["--corrupt-echo-for-test", "2"]);
    let out = run(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn help_describes_both_device_ceilings() {
    let out = run(&["--help"]);
    let help = text(&out.stdout);
    assert!(out.status.success(), "{help}");
    let ceiling = help.split_once("Ceiling: ").map(|(_, t)| t).unwrap_or_else(|| panic!("no ceiling text:\n{help}"));
    let ceiling = ceiling.split("Efficiency").next().unwrap().split_whitespace().collect::<Vec<_>>().join(" ");
    for what in ["memcpy", "cuMemcpyPeer", "cuMemcpyDtoD", "copy kernel", "the faster"] {
        assert!(ceiling.contains(what), "the ceiling text leaves out {what:?}: {ceiling}");
    }
    let floor = help.split_once("Floor: ").map(|(_, t)| t).unwrap_or_else(|| panic!("no floor text:\n{help}"));
    let floor = floor.split("Latency p99").next().unwrap().split_whitespace().collect::<Vec<_>>().join(" ");
    for what in ["seen done", "memcpy", "cuMemcpyPeer", "cuMemcpyDtoD", "copy kernel", "Floor efficiency"] {
        assert!(floor.contains(what), "the floor text leaves out {what:?}: {floor}");
    }
    assert!(help.contains("--check"), "{help}");
    assert!(!help.contains("corrupt-echo"), "the test-only option is hidden: {help}");
}

/// UCX logs on stdout by default: the benchmark sends them to stderr, so `--json` stays
/// one record per line even with UCX talking (here at debug level, over the UCX lane).
#[test]
fn ucx_logs_stay_out_of_the_json() {
    let over_ucx = |log_level: &str| {
        Command::new(env!("CARGO_BIN_EXE_local-send-recv"))
            .args(["-o", "host", "-n", "1kB", "--n-iter", "3", "--json"])
            .env("FERRYLINK_TRANSPORT", "ucx")
            .env("UCX_LOG_LEVEL", log_level)
            .env_remove("UCX_LOG_FILE")
            .output()
            .expect("the binary runs")
    };
    // A quiet run first: failing, it says UCX is missing (CI, FERRYLINK_REQUIRE_UCX=1,
    // must have it).
    let quiet = over_ucx("warn");
    if !quiet.status.success() {
        let _ = ferrylink_testkit::ucx_or_skip(Err::<(), _>(text(&quiet.stderr)));
        return;
    }
    let out = over_ucx("debug");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "stdout has more than the record:\n{stdout}");
    let v: serde_json::Value = serde_json::from_str(lines[0]).expect("the record parses");
    assert_eq!(v["lane"], "ucx");
    assert!(stderr.contains("UCX  DEBUG"), "UCX's debug log went nowhere: {stderr}");
}
