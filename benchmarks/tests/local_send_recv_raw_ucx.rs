//! The raw UCX reference of `local-send-recv` on host memory: runs on the UCX lane record
//! and print raw UCX's median round trip and the lane's ratio against it, measured (it
//! grows with the size, counts the run's round trips); the native lane has neither. The
//! UCX tests print `skipped: UCX not available` and pass where UCX cannot be loaded,
//! unless `FERRYLINK_REQUIRE_UCX=1`.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_local-send-recv");

/// Runs the binary with `args` on `lane`.
fn run_on(lane: &str, args: &[&str]) -> Output {
    run_env(args, &[("FERRYLINK_TRANSPORT", lane)])
}

/// Runs the binary with `args` and the variables `env` (every transfer bounded by 20 s);
/// fails the test if it runs past 60 s.
fn run_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env("FERRYLINK_TIMEOUT_MS", "20000");
    for (k, v) in env {
        cmd.env(k, v);
    }
    ferrylink_testkit::output_within(&mut cmd, Duration::from_secs(60))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The value of the table row `key`.
fn value<'a>(table: &'a str, key: &str) -> Option<&'a str> {
    table.lines().find_map(|l| l.split_once(" | ").filter(|(k, _)| k.trim_end() == key).map(|(_, v)| v))
}

/// Whether this machine has a UCX the UCX lane can use; `false` after `skipped: UCX not
/// available` (a failure instead with `FERRYLINK_REQUIRE_UCX=1`).
fn ucx_or_skip() -> bool {
    let config = ferrylink::transport::Config::default().with_lane_policy("ucx".parse().unwrap());
    ferrylink_testkit::ucx_or_skip(ferrylink::transport::Context::new(config)).is_some()
}

/// The JSON record of a successful run of `args` (plus `--json`) on `lane`.
fn record(lane: &str, args: &[&str]) -> serde_json::Value {
    let mut args = args.to_vec();
    args.push("--json");
    let out = run_on(lane, &args);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{args:?}: stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(!stderr.contains("left out"), "{args:?}: the reference was left out: {stderr}");
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// The record's number `key`.
fn number(v: &serde_json::Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} is not a number: {v}"))
}

/// The record carries raw UCX's median, positive; its round trips, as many as the run
/// timed, with a total time of at least n_iter / 2 medians; its method (the loaded UCX's
/// version, the memory); and the ratio, recomputed here from the two medians.
#[test]
fn ucx_lane_runs_record_raw_ucx_and_the_ratio_against_it() {
    if !ucx_or_skip() {
        return;
    }
    let started = Instant::now();
    let v = record("ucx", &["-o", "host", "-n", "64kB", "--n-iter", "37"]);
    let wall = started.elapsed().as_secs_f64();
    assert_eq!(v["lane"], "ucx", "{v}");
    let key_names = ferrylink_benchmarks::record::REQUIRED_KEYS;
    assert!(key_names.contains(&"raw_ucx_median_us") && key_names.contains(&"raw_ucx_ratio"));
    let raw = number(&v, "raw_ucx_median_us");
    assert!(raw > 0.0, "{v}");
    assert_eq!(v["raw_ucx_n_iter"].as_u64(), Some(37), "as many round trips as the run's: {v}");
    let total = number(&v, "raw_ucx_time_us");
    assert!(total >= 37.0 / 2.0 * raw && total * 1e-6 < wall, "Σt {total} µs, median {raw} µs, wall {wall} s: {v}");
    let ratio = number(&v, "raw_ucx_ratio");
    let expected = number(&v, "latency_median_us") / raw;
    assert!((ratio - expected).abs() <= 1e-9 * expected, "ratio {ratio} != median / raw median {expected}: {v}");
    let method = v["raw_ucx_method"].as_str().unwrap_or_default();
    assert!(method.starts_with("UCX 1.") && method.ends_with("host memory"), "{v}");
}

/// The table shows raw UCX's median (as its method says) and the ratio, `1.23x`, which is
/// the latency median over it to the rounding of the printed figures.
#[test]
fn ucx_lane_tables_show_raw_ucx_and_the_ratio() {
    if !ucx_or_skip() {
        return;
    }
    let out = run_on("ucx", &["-o", "host", "-n", "1MB", "--n-iter", "20", "--no-detailed-report"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let seconds = |cell: &str| {
        let (amount, rest) = cell.split_once(' ').unwrap_or_else(|| panic!("{cell}: {stdout}"));
        let scale = [("us", 1e-6), ("ms", 1e-3), ("s", 1.0)].iter().find(|(u, _)| rest.starts_with(u)).unwrap().1;
        amount.parse::<f64>().unwrap() * scale
    };
    let raw = value(&stdout, "Raw UCX median").unwrap_or_else(|| panic!("no raw UCX row: {stdout}"));
    assert!(raw.contains("(mean ") && raw.contains("; UCX 1.") && raw.ends_with("host memory)"), "{stdout}");
    let ratio = value(&stdout, "Lane / raw UCX").unwrap_or_else(|| panic!("no ratio row: {stdout}"));
    let ratio: f64 = ratio.strip_suffix('x').and_then(|r| r.parse().ok()).unwrap_or_else(|| panic!("{stdout}"));
    let median = seconds(value(&stdout, "Latency median").unwrap());
    let expected = median / seconds(raw);
    // Both times printed with two decimals (3 significant digits at least), the ratio too.
    assert!((ratio - expected).abs() <= 0.01 + 0.01 * expected, "{ratio} vs {expected}: {stdout}");
}

/// Raw UCX is measured, not made up: its median round trip of 64 MiB takes far longer
/// than of 8 B (at least 20 times: 128 MiB moved take milliseconds on any link UCX has
/// between two processes, 8 B microseconds), and each counts its run's round trips.
#[test]
fn raw_ucx_round_trips_grow_with_the_size() {
    if !ucx_or_skip() {
        return;
    }
    let small = record("ucx", &["-o", "host", "-n", "8B", "--n-iter", "50"]);
    let large = record("ucx", &["-o", "host", "-n", "64MiB", "--n-iter", "5"]);
    let (small_raw, large_raw) = (number(&small, "raw_ucx_median_us"), number(&large, "raw_ucx_median_us"));
    assert!(large_raw > 20.0 * small_raw, "64 MiB: {large_raw} µs, 8 B: {small_raw} µs");
    assert_eq!((small["raw_ucx_n_iter"].as_u64(), large["raw_ucx_n_iter"].as_u64()), (Some(50), Some(5)));
    // 128 MiB in under a millisecond would be over 130 GB/s between two processes.
    assert!(large_raw > 1000.0, "64 MiB round trip in {large_raw} µs: {large}");
}

/// On the native lane there is no raw UCX: the record's keys are null and the table has
/// no rows of it. A one-sided run on the UCX lane does not measure it either (its table
/// says so).
#[test]
fn other_runs_have_no_raw_ucx() {
    let v = record("native", &["-o", "host", "-n", "64kB", "--n-iter", "5"]);
    assert_eq!(v["lane"], "native", "{v}");
    for key in ["raw_ucx_median_us", "raw_ucx_ratio", "raw_ucx_n_iter", "raw_ucx_time_us", "raw_ucx_method"] {
        assert!(v.get(key).is_some_and(serde_json::Value::is_null), "{key} should be null: {v}");
    }
    let out = run_on("native", &["-o", "host", "-n", "64kB", "--n-iter", "5", "--no-detailed-report"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!stdout.contains("Raw UCX") && !stdout.contains("raw UCX"), "{stdout}");
    if !ucx_or_skip() {
        return;
    }
    let args = ["-o", "host", "-n", "64kB", "--op", "put", "--n-iter", "3", "--no-detailed-report"];
    let out = run_env(&args, &[("FERRYLINK_TRANSPORT", "ucx"), ("FERRYLINK_UCX_RMA", "1")]);
    // One-sided transfers over UCX may be refused here (the UCX lane's own tests say
    // when); a run that ran says it has no reference.
    if out.status.success() {
        let stdout = text(&out.stdout);
        assert_eq!(value(&stdout, "Raw UCX median"), Some("not measured"), "{stdout}");
        assert_eq!(value(&stdout, "Lane / raw UCX"), Some("n/a"), "{stdout}");
    }
}
