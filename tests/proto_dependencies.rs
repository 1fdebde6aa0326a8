//! The protocol core (`ferrylink-proto`) builds without any crate that does I/O, holds
//! memory or loads a library: its normal dependencies, with every feature on, contain
//! none of the crates below. The compiler keeps the core's code from using what its
//! manifest does not name; this test keeps the manifest from naming it again.
//!
//! It asks `cargo tree` (the cargo that runs the tests, offline and from the lock file)
//! for the crates the core's library is built with.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// Crates the core must not be built with: the buffer, IPC, UCX and transport crates of
/// this workspace, CUDA bindings, system-call and library-loading crates, event loops,
/// channels and async runtimes.
const REFUSED: &[&str] = &[
    "ferrylink-memory",
    "ferrylink-ipc",
    "ferrylink-ucx",
    "ferrylink-transport",
    "ferrylink-ucx-sys",
    "cudarc",
    "nix",
    "libc",
    "libloading",
    "mio",
    "socket2",
    "crossbeam-channel",
    "tokio",
];

/// The names of the crates `cargo tree` lists for `package`'s normal dependencies.
fn normal_dependencies(package: &str) -> BTreeSet<String> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let output = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "--locked", "-e", "normal", "--prefix", "none", "--all-features", "-p", package])
        .arg("--manifest-path")
        .arg(&manifest)
        .output()
        .expect("cargo runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "cargo tree failed:\n{stderr}");
    let stdout = String::from_utf8(output.stdout).expect("cargo tree prints UTF-8");
    stdout.lines().filter_map(|line| line.split_whitespace().next()).map(str::to_owned).collect()
}

#[test]
fn the_protocol_core_is_built_with_no_io_memory_or_loader_crate() {
    let crates = normal_dependencies("ferrylink-proto");
    // The listing is real: the core itself and its codec are in it.
    assert!(crates.contains("ferrylink-proto") && crates.contains("bincode"), "unexpected listing: {crates:?}");
    let found: Vec<&str> = REFUSED.iter().copied().filter(|name| crates.contains(*name)).collect();
    assert!(found.is_empty(), "ferrylink-proto is built with {found:?}; its dependencies: {crates:?}");
}

/// The check sees such a crate where one is: the transport is built with most of them.
#[test]
fn the_check_finds_refused_crates_in_the_transport() {
    let crates = normal_dependencies("ferrylink-transport");
    for name in ["ferrylink-memory", "mio", "nix", "cudarc"] {
        assert!(crates.contains(name), "{name} missing from the transport's dependencies: {crates:?}");
    }
}
