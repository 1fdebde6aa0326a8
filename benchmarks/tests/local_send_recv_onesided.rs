//! Runs `local-send-recv --op put|get` (one-sided round trips) on host memory on the native
//! lane (no GPU needed) and checks its records, its checks, its batches and its errors;
//! the UCX lane's runs end, either way, without a panic or a hang; the device runs need a
//! GPU (ignored unless built with `--features gpu-tests`).

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_local-send-recv");

/// Runs the binary with `args` on the native lane (unless `env` says otherwise); fails the
/// test if it runs past `bound`. The lane is forced rather than left to `auto`, which
/// would load UCX in both processes: with a CUDA-aware UCX that alone takes seconds per
/// process, and these runs never use it.
fn run_env(args: &[&str], env: &[(&str, &str)], bound: Duration) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env("FERRYLINK_TRANSPORT", "native");
    for (k, v) in env {
        cmd.env(k, v);
    }
    ferrylink_testkit::output_within(&mut cmd, bound)
}

fn run(args: &[&str]) -> Output {
    run_env(args, &[], Duration::from_secs(300))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The one JSON record of a successful run.
fn record(args: &[&str]) -> serde_json::Value {
    let out = run(args);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{args:?}: stdout:\n{stdout}\nstderr:\n{}", text(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    serde_json::from_str(lines[0]).unwrap()
}

/// `a` and `b` agree to a relative 1e-9.
fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

/// A record's latencies and bandwidths against its own iteration times: the mean and the
/// average bandwidth (2·n/Σt) recomputed, the median between the fastest and the slowest,
/// p99 and p99.9 at least the median, at most the slowest time (plus the histogram's
/// 1/1024 and the µs rounding), the ceiling recomputed from its recorded time.
fn check_latencies(v: &serde_json::Value) {
    let f = |key: &str| v[key].as_f64().unwrap_or_else(|| panic!("{key} is not a number: {v}"));
    let times: Vec<f64> =
        v["iterations"].as_array().unwrap().iter().map(|it| it["latency_us"].as_f64().unwrap()).collect();
    assert_eq!(times.len() as f64, f("n_iter"), "{v}");
    let (min, max) = times.iter().fold((f64::MAX, 0f64), |(lo, hi), &t| (lo.min(t), hi.max(t)));
    let total: f64 = times.iter().sum();
    assert!(min > 0.0, "{v}");
    assert!(close(f("latency_avg_us"), total / times.len() as f64), "{v}");
    let (p50, p99, p999) = (f("latency_median_us"), f("latency_p99_us"), f("latency_p999_us"));
    assert!(p50 >= min && p50 <= max, "median {p50} outside {min}..{max}: {v}");
    assert!(p99 >= p50 && p999 >= p99, "p50 {p50}, p99 {p99}, p99.9 {p999}: {v}");
    assert!(p999 <= max * (1.0 + 1.0 / 1024.0) + 1e-3, "p99.9 {p999} above the slowest {max}: {v}");
    let n = f("n_bytes");
    assert!(close(f("bandwidth_avg_gbps"), 2.0 * n * times.len() as f64 / (total * 1e-6) / 1e9), "{v}");
    let ceiling = 2.0 * n * f("ceiling_n_iter") / (f("ceiling_time_us") * 1e-6) / 1e9;
    assert!(close(f("ceiling_gbps"), ceiling), "{v}");
    assert!(close(f("efficiency"), f("bandwidth_avg_gbps") / ceiling), "{v}");
}

/// Put and get round trips of host memory on the native lane, every round trip checked:
/// the record names the op (a required key), one block, reused (registered) buffers, and
/// its latencies and bandwidths fit its times. The checks compare the data that came
/// back with what was sent after every round trip: a put or a get that moved nothing
/// would fail the run (`a_transfer_that_moved_nothing_fails_the_run` shows it).
#[test]
fn put_and_get_host_round_trips_record_their_op_and_sane_latencies() {
    for op in ["put", "get"] {
        let v = record(&["-o", "host", "-n", "1MB", "--op", op, "--n-iter", "20", "--check", "--json"]);
        for key in ferrylink_benchmarks::record::REQUIRED_KEYS {
            assert!(v.get(key).is_some(), "{op}: missing {key}: {v}");
        }
        assert_eq!(v["op"], op, "{v}");
        assert_eq!(v["blocks"], 1, "{v}");
        assert_eq!(v["lane"], "native", "{v}");
        assert_eq!(v["object_type"], "host", "{v}");
        assert_eq!(v["n_bytes"], 1_000_000, "{v}");
        assert_eq!(v["reuse_alloc"], true, "registered buffers serve every round trip: {v}");
        assert!(v["memory"].is_null(), "{v}");
        assert!(v["ceiling_method"].as_str().unwrap().starts_with("memcpy"), "{v}");
        assert!(v["first_round_trip_us"].as_f64().unwrap() > 0.0, "{v}");
        check_latencies(&v);
    }
    // Sends name their op too, with no blocks.
    let v = record(&["-o", "host", "-n", "64KiB", "--n-iter", "3", "--json"]);
    assert_eq!((&v["op"], &v["blocks"]), (&serde_json::json!("send"), &serde_json::Value::Null), "{v}");
}

/// A send's table is as it was (no op rows); a one-sided run's names its op and blocks.
#[test]
fn one_sided_tables_name_op_and_blocks() {
    let out = run(&["-o", "host", "-n", "64KiB", "--op", "get", "--blocks", "16", "--n-iter", "3"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let value = |key: &str| {
        stdout.lines().find_map(|l| l.split_once(" | ").filter(|(k, _)| k.trim_end() == key).map(|(_, v)| v))
    };
    assert_eq!(value("op"), Some("get"), "{stdout}");
    assert_eq!(value("blocks"), Some("16"), "{stdout}");
    assert_eq!(value("reuse alloc"), Some("True"), "{stdout}");
    assert!(value("Latency p99.9").is_some() && value("Ceiling").is_some(), "{stdout}");
    let send = text(&run(&["-o", "host", "-n", "64KiB", "--n-iter", "3"]).stdout);
    assert!(!send.lines().any(|l| l.starts_with("op ") || l.starts_with("blocks ")), "{send}");
}

/// The one-sided benchmark's batch: 1000 blocks of 64 KiB (`-n 64000KiB`) in one request each way, with
/// gaps on the server's side, checked; and gets of 7 blocks, every round trip checked.
#[test]
fn batches_of_blocks_run_and_check() {
    let v = record(&["-o", "host", "--op", "put", "--blocks", "1000", "-n", "64000KiB", "--n-iter", "3", "--json"]);
    assert_eq!((v["n_bytes"].as_u64(), v["blocks"].as_u64()), (Some(65_536_000), Some(1000)), "{v}");
    check_latencies(&v);
    let v =
        record(&["-o", "host", "--op", "get", "--blocks", "7", "-n", "7000", "--n-iter", "10", "--check", "--json"]);
    assert_eq!((v["op"].as_str(), v["blocks"].as_u64()), (Some("get"), Some(7)), "{v}");
    // A plain byte count works as well as a unit.
    let v = record(&["-o", "host", "--op", "put", "--blocks", "1000", "-n", "65536000", "--n-iter", "1", "--json"]);
    assert_eq!(v["n_bytes"], 65_536_000, "{v}");
}

/// `--blocks` that does not divide the size (or a sweep size), 0, or with `--op send`,
/// and `--reuse-alloc` with a one-sided op, are usage errors (exit 2) that say what is
/// wrong; nothing runs.
#[test]
fn bad_blocks_are_usage_errors() {
    for (args, says) in [
        (&["--op", "put", "--blocks", "3", "-n", "1000"][..], "-n: 1000 bytes is not a multiple of --blocks 3"),
        (&["--op", "get", "--blocks", "3", "-n", "1000"], "nearest sizes: 999 or 1002"),
        (&["--op", "put", "--blocks", "0", "-n", "1000"], "--blocks must be at least 1"),
        (&["--blocks", "4", "-n", "1000"], "--blocks 4 goes with --op put or --op get"),
        (&["--op", "send", "--blocks", "1", "-n", "1000"], "--blocks 1 goes with --op put or --op get"),
        (&["--op", "put", "--blocks", "3", "--sweep", "3B:1kB"], "--sweep: 1000 bytes is not a multiple"),
        (&["--op", "get", "--reuse-alloc"], "--reuse-alloc is for --op send"),
        (&["--op", "scatter"], "invalid value 'scatter'"),
        (&["--op", "put", "--blocks", "-1"], "'-1'"),
        (&["--op", "put", "--blocks", "x"], "invalid value 'x'"),
    ] {
        let mut all = vec!["-o", "host"];
        all.extend_from_slice(args);
        let out = run(&all);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked") && out.stdout.is_empty(), "{args:?}: {stderr}");
    }
}

/// One side skips its transfer of a round trip (the hidden test hook: a message stands in
/// for its notification, as if the transfer had moved nothing): the client's check of
/// that round trip fails the run (exit 1) naming it, for puts and gets, client and server,
/// the first, a middle (with --check) and the last round trip. Unchecked, a skip in the
/// middle passes unseen: the failures come from the comparisons.
#[test]
fn a_transfer_that_moved_nothing_fails_the_run() {
    // 1 warm-up + 4 timed round trips: 0..=4.
    for op in ["put", "get"] {
        for side in ["client", "server"] {
            for (round_trip, check) in [("0", false), ("2", true), ("4", false)] {
                let skip = format!("{side}:{round_trip}");
                let mut args = vec!["-o", "host", "-n", "100kB", "--op", op, "--n-iter", "4"];
                args.extend(["--skip-transfer-for-test", &skip]);
                args.extend(check.then_some("--check"));
                let out = run(&args);
                let stderr = text(&out.stderr);
                assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
                let first = stderr.lines().next().unwrap_or_default();
                assert!(
                    first.starts_with(&format!("error: transport: round trip {round_trip}: the "))
                        && first.contains("differ"),
                    "{args:?}: {stderr}"
                );
            }
            let skip = format!("{side}:2");
            let out =
                run(&["-o", "host", "-n", "100kB", "--op", op, "--n-iter", "4", "--skip-transfer-for-test", &skip]);
            assert!(out.status.success(), "{op} {skip} unchecked: {}", text(&out.stderr));
        }
    }
}

/// A sweep of one-sided round trips: the summary, the plot's title and its line name the
/// op (and the blocks per request).
#[test]
fn sweeps_name_the_op() {
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("sweep.svg");
    let args = ["-o", "host", "--op", "get", "--blocks", "8", "--sweep", "8B:32B", "--n-iter", "3", "--plot"];
    let mut all = args.to_vec();
    all.push(plot.to_str().unwrap());
    let out = run(&all);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.starts_with("Sweep: local-send-recv --op get: round-trip bandwidth"), "{stdout}");
    assert!(
        stdout.contains(
            "--op get (one-sided, notified), native lane, host memory, registered buffers, 8 blocks per request, 3 \
             timed round trips per size"
        ),
        "{stdout}"
    );
    let svg = std::fs::read_to_string(&plot).unwrap();
    for want in ["local-send-recv --op get", "ferrylink get round trip, native lane (average bandwidth)"] {
        assert!(svg.contains(want), "no {want:?} in the plot: {svg}");
    }
    assert_eq!(svg.matches("<circle").count(), 6, "8, 16 and 32 B, a bandwidth and a ceiling point each: {svg}");
}

/// A process killed when dropped (a test that fails leaves no server behind).
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A standalone server (`--server-only --op SERVER_OP`) on a socket in `dir` and a client
/// (`--client-only --op CLIENT_OP --json`): the client's output, whether the server
/// succeeded, and its stderr.
fn standalone(dir: &std::path::Path, server_op: &str, client_op: &str) -> (Output, bool, String) {
    let socket = dir.join(format!("{server_op}-{client_op}.sock"));
    let socket = socket.to_str().unwrap();
    let common = ["-o", "host", "-n", "64kB", "--n-iter", "3", "-s", socket];
    let mut server = Reaped(
        Command::new(BIN)
            .args(common)
            .args(["--server-only", "--op", server_op])
            .env("FERRYLINK_TRANSPORT", "native")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut server_err = String::new();
    let started = Instant::now();
    while !std::path::Path::new(socket).exists() {
        if server.0.try_wait().unwrap().is_some() || started.elapsed() > Duration::from_secs(30) {
            let _ = server.0.kill();
            server.0.stderr.take().unwrap().read_to_string(&mut server_err).unwrap();
            panic!("the server never listened: {server_err}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut args = common.to_vec();
    args.extend(["--client-only", "--op", client_op, "--json"]);
    let out = run(&args);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = server.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the server did not end: client: {}", text(&out.stderr));
        std::thread::sleep(Duration::from_millis(20));
    };
    server.0.stderr.take().unwrap().read_to_string(&mut server_err).unwrap();
    (out, status.success(), server_err)
}

/// A standalone server and client (`--server-only`, `--client-only`) exchange their
/// options at setup: the same ones run; a client with another op is refused on both sides
/// with a message naming both; a one-sided client of a send server (which echoes its
/// setup message) or a send client of a one-sided server fails with a message that says
/// so, and nothing hangs.
#[test]
fn standalone_sides_must_run_the_same_op() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    // Listeners take only directories no one else may enter.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();

    let (out, server_ok, server_err) = standalone(dir.path(), "put", "put");
    assert!(out.status.success() && server_ok, "client: {}\nserver: {server_err}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
    assert_eq!(v["op"], "put");
    assert!(server_err.contains("--op put --blocks 1"), "the client command it prints: {server_err}");

    let (out, server_ok, server_err) = standalone(dir.path(), "put", "get");
    let stderr = text(&out.stderr);
    assert!(out.status.code() == Some(1) && !server_ok, "client: {stderr}\nserver: {server_err}");
    for err in [&stderr, &server_err] {
        assert!(err.contains("--op get -n 64000 --blocks 1") && err.contains("--op put -n 64000"), "{err}");
    }

    let (out, server_ok, server_err) = standalone(dir.path(), "send", "put");
    let stderr = text(&out.stderr);
    assert!(out.status.code() == Some(1) && !server_ok, "client: {stderr}\nserver: {server_err}");
    assert!(stderr.contains("own setup message") && stderr.contains("--op send server"), "{stderr}");

    let (out, server_ok, server_err) = standalone(dir.path(), "put", "send");
    assert!(!out.status.success() && !server_ok, "client: {}\nserver: {server_err}", text(&out.stderr));
    assert!(server_err.contains("is the peer an --op send run?"), "{server_err}");
}

/// On the UCX lane a one-sided run either runs (and says so) or ends with the transport's
/// error: exit non-zero, an `error:` line, no panic, within its time-out.
#[test]
fn one_sided_runs_on_the_ucx_lane_end_either_way() {
    let config = ferrylink::transport::Config::default().with_lane_policy("ucx".parse().unwrap());
    if ferrylink_testkit::ucx_or_skip(ferrylink::transport::Context::new(config)).is_none() {
        return;
    }
    let env = [("FERRYLINK_TRANSPORT", "ucx"), ("FERRYLINK_TIMEOUT_MS", "10000")];
    for op in ["put", "get"] {
        let args = ["-o", "host", "-n", "64kB", "--op", op, "--n-iter", "3", "--json"];
        let out = run_env(&args, &env, Duration::from_secs(120));
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(!stderr.contains("panicked"), "{op}: {stderr}");
        if out.status.success() {
            let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
            assert_eq!((v["op"].as_str(), v["lane"].as_str()), (Some(op), Some("ucx")), "{stdout}");
        } else {
            assert!(stderr.starts_with("error: ") && stdout.is_empty(), "{op}: {stderr}");
            println!("{op} on the UCX lane: {}", stderr.lines().next().unwrap_or_default());
        }
    }
}

/// Device memory (the pool) on GPU 0, both ops, checked every round trip; the 1000-block
/// batch on the device; VMM and cudarc memory register; cudarc's stock pool, which the
/// transport would have to bounce, is refused with exit 2 and the reason.
#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn device_put_and_get_round_trips() {
    ferrylink_testkit::require_gpu();
    for op in ["put", "get"] {
        let v = record(&["-o", "device", "-n", "1MB", "--op", op, "--n-iter", "50", "--check", "--json"]);
        assert_eq!((v["op"].as_str(), v["object_type"].as_str()), (Some(op), Some("device")), "{v}");
        assert_eq!(v["memory"], "pool", "{v}");
        check_latencies(&v);
    }
    let v = record(&["-o", "device", "--op", "put", "--blocks", "1000", "-n", "64000KiB", "--n-iter", "5", "--json"]);
    assert_eq!(v["blocks"], 1000, "{v}");
    check_latencies(&v);
    for memory in ["vmm", "cudarc"] {
        let v = record(&["-o", "device", "-n", "1MB", "--op", "get", "--memory", memory, "--n-iter", "5", "--json"]);
        assert_eq!(v["memory"], memory, "{v}");
    }
    let out = run(&["-o", "device", "-n", "1MB", "--op", "put", "--memory", "cudarc-default"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("cannot be registered for one-sided transfers") && !stderr.contains("panicked"),
        "{stderr}"
    );
}
