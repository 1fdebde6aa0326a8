//! Runs the `spill` binary's host and disk cases (no GPU needed; the device cases run
//! where there is one) and checks that each is judged against a ceiling of its own kind.

use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_spill")).args(args).output().expect("the binary runs")
}

/// `a` and `b` agree to a relative 1e-9.
fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

/// The records of a `--json` run, by case.
fn records(dir: &std::path::Path) -> Vec<serde_json::Value> {
    let out = run(&["-n", "1MB", "--n-iter", "2", "--json", "--dir", dir.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{}", String::from_utf8_lossy(&out.stderr));
    stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

/// Host → disk runs twice, like with like: the store through the page cache against a
/// buffered write, the store with fsync against `O_DIRECT` + `fdatasync` (a buffered write
/// + `fdatasync` where `O_DIRECT` is refused). Bandwidths are n/t from the recorded times.
#[test]
fn host_to_disk_is_judged_like_with_like() {
    let dir = tempfile::tempdir().unwrap();
    let records = records(dir.path());
    let case = |name: &str| {
        records.iter().find(|r| r["case"] == name).unwrap_or_else(|| panic!("no case {name} in {records:?}"))
    };
    let buffered = case("host_to_disk_eviction");
    let synced = case("host_to_disk_eviction_fsync");
    let method = |r: &serde_json::Value| r["ceiling_method"].as_str().unwrap().to_owned();
    assert!(method(buffered).starts_with("buffered write of 1000000 B"), "{buffered}");
    assert!(!method(buffered).contains("fdatasync") && !method(buffered).contains("O_DIRECT"), "{buffered}");
    assert!(method(synced).contains("write + fdatasync of 1003520 B"), "{synced}");
    for r in [buffered, synced] {
        assert_eq!(r["object_type"], "host", "{r}");
        let f = |key: &str| r[key].as_f64().unwrap_or_else(|| panic!("{key}: {r}"));
        let n = f("n_bytes");
        let total: f64 = r["iterations"].as_array().unwrap().iter().map(|i| i["latency_us"].as_f64().unwrap()).sum();
        assert!(close(f("bandwidth_avg_gbps"), n * f("n_iter") / (total * 1e-6) / 1e9), "n·n_iter/Σt: {r}");
        let ceiling = n * f("ceiling_n_iter") / (f("ceiling_time_us") * 1e-6) / 1e9;
        assert!(close(f("ceiling_gbps"), ceiling), "ceiling {} != n·iters/Σt = {ceiling}: {r}", f("ceiling_gbps"));
        assert!(close(f("efficiency"), f("bandwidth_avg_gbps") / ceiling), "{r}");
    }
    assert!(records.iter().any(|r| r["case"] == "unspill_disk_to_host"), "{records:?}");
}

/// Unspill from disk is judged against a plain read of the same bytes from the same
/// directory, n/t from the recorded times.
#[test]
fn unspill_is_judged_against_a_plain_read() {
    let dir = tempfile::tempdir().unwrap();
    let records = records(dir.path());
    let r = records.iter().find(|r| r["case"] == "unspill_disk_to_host").expect("an unspill record");
    let method = r["ceiling_method"].as_str().unwrap_or_else(|| panic!("no read ceiling: {r}"));
    assert!(method.starts_with("buffered read of 1000000 B from ") && method.contains("into new memory"), "{r}");
    let f = |key: &str| r[key].as_f64().unwrap_or_else(|| panic!("{key}: {r}"));
    let ceiling = f("n_bytes") * f("ceiling_n_iter") / (f("ceiling_time_us") * 1e-6) / 1e9;
    assert!(ceiling > 0.0 && close(f("ceiling_gbps"), ceiling), "{r}");
    assert!(close(f("efficiency"), f("bandwidth_avg_gbps") / ceiling), "{r}");
    assert_eq!(r["object_type"], "host", "{r}");
}

#[test]
fn the_table_prints_both_pairs() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(&["-n", "1MB", "--n-iter", "2", "--dir", dir.path().to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let block = |title: &str| {
        let start = stdout.find(title).unwrap_or_else(|| panic!("no {title:?} in:\n{stdout}"));
        let rest = &stdout[start..];
        let ceiling = rest.lines().find(|l| l.starts_with("Ceiling")).unwrap_or_else(|| panic!("{rest}"));
        ceiling.to_owned()
    };
    let buffered = block("host → disk eviction, page cache (no fsync) [host_to_disk_eviction]");
    let synced = block("host → disk eviction, fsync [host_to_disk_eviction_fsync]");
    assert!(buffered.contains("buffered write of"), "{buffered}");
    assert!(synced.contains("write + fdatasync of"), "{synced}");
    let unspill = block("unspill disk → host (read + checksum, out of the page cache) [unspill_disk_to_host]");
    assert!(unspill.contains("buffered read of"), "{unspill}");
    // --fsync is gone: both modes always run.
    assert_eq!(run(&["--fsync"]).status.code(), Some(2));
}
