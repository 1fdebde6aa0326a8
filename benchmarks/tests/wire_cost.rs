//! Runs the `wire-cost` binary briefly: one row per sample message of the codec's corpus,
//! each with its encoded size, its encode and decode cost and the copy beside them.

use ferrylink_proto::wire::{encode_frame, sample_messages};
use std::process::Command;

#[test]
fn every_sample_message_gets_a_row_with_its_size_and_costs() {
    let out = Command::new(env!("CARGO_BIN_EXE_wire-cost"))
        .args(["--n-iter", "20", "--batches", "1"])
        .output()
        .expect("the binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{}", String::from_utf8_lossy(&out.stderr));
    let mut lines = stdout.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["message", "bytes", "encode", "decode", "copy", "coded/cp"]);
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split_whitespace().collect()).collect();
    let samples = sample_messages();
    assert_eq!(rows.len(), samples.len(), "{stdout}");
    for (row, (name, message)) in rows.iter().zip(&samples) {
        assert_eq!(row[0], *name, "{stdout}");
        assert_eq!(row[1].parse::<usize>().ok(), Some(encode_frame(message).len()), "{stdout}");
        // Three durations ("0.05 us" is two words each) and the ratio.
        assert_eq!(row.len(), 2 + 3 * 2 + 1, "{stdout}");
        assert!(row[row.len() - 1].ends_with('x'), "{stdout}");
    }
}

#[test]
fn zero_iterations_are_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_wire-cost")).args(["--n-iter", "0"]).output().expect("the binary runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--n-iter"), "{}", String::from_utf8_lossy(&out.stderr));
}
