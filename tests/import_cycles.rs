//! No import cycle between the files or the modules of the transport and its protocol
//! core.
//!
//! Every non-test file of each checked crate is parsed; each path it names (in `use`
//! items and in code) is resolved, through re-exports, to the file that defines the
//! item, and that makes an edge from the naming file to the defining one. The test fails
//! when a strongly connected group of more than one file exists, or when, among the
//! children of any module (each child standing for its whole subtree, the parent's own
//! file for itself), the edges form a loop. A dependency that points one way only keeps
//! the layering visible from the tree: a core type never sits beside a handle that uses
//! it, and a parent's file never both uses and is used by its children.

#[path = "import_graph/mod.rs"]
mod import_graph;

use import_graph::{CrateGraph, Report};
use std::path::PathBuf;

/// The crates whose sources must be free of import cycles.
const CHECKED_CRATES: &[&str] = &["proto/src/lib.rs", "transport/src/lib.rs"];

fn repository_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn transport_and_core_have_no_import_cycle() {
    let mut failures = Vec::new();
    for root in CHECKED_CRATES {
        let graph = CrateGraph::load(&repository_root(), root).expect("crate sources parse");
        let report = Report::of(&graph);
        println!("{root}: {}", report.summary());
        if !report.is_acyclic() {
            failures.push(format!("{root}:\n{}", report.details()));
        }
    }
    assert!(failures.is_empty(), "import cycles:\n{}", failures.join("\n"));
}

/// The check itself finds a loop: two files of a small made-up crate that use each other.
#[test]
fn a_loop_between_two_files_is_found() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("a")).expect("folders");
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\n").expect("lib.rs");
    std::fs::write(src.join("a/mod.rs"), "mod inner;\npub struct A;\n").expect("a/mod.rs");
    std::fs::write(src.join("a/inner.rs"), "use crate::b::B;\npub struct Inner(B);\n").expect("a/inner.rs");
    std::fs::write(src.join("b.rs"), "use crate::a::A;\npub struct B(A);\n#[cfg(test)]\nmod tests;\n").expect("b.rs");
    let graph = CrateGraph::load(dir.path(), "src/lib.rs").expect("parses");
    let report = Report::of(&graph);
    assert!(!report.is_acyclic(), "{}", report.details());
    // The files are not in a loop (inner → b → a/mod.rs), the modules `a` and `b` are.
    assert_eq!(report.files_in_cycles(), 0, "{}", report.details());
    assert_eq!(report.largest_module_group(), 2, "{}", report.details());
    assert_eq!(report.module_loops(), 1, "{}", report.details());

    std::fs::write(src.join("a/mod.rs"), "mod inner;\npub use inner::Inner;\n").expect("a/mod.rs");
    std::fs::write(src.join("b.rs"), "pub struct B(crate::a::Inner);\n").expect("b.rs");
    let graph = CrateGraph::load(dir.path(), "src/lib.rs").expect("parses");
    let report = Report::of(&graph);
    // Through the re-export, b.rs names a/inner.rs, which names b.rs.
    assert_eq!(report.files_in_cycles(), 2, "{}", report.details());
}
