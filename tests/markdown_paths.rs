//! Every repository path that a Markdown file of the repository names exists.
//!
//! A path is named by a link (`[text](target)`, relative to the file) or by an inline
//! code span outside fenced blocks. A code span counts as a path when it starts with a
//! top-level entry of the repository (then it must exist as written), or when it holds a
//! `/` and ends in a source or document extension (then it must be the tail of an existing
//! file, so `proto/recv.rs` stands for `transport/src/proto/recv.rs`). Build outputs and
//! other projects' files are not the repository's and are left alone.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// Extensions whose code spans are taken as file paths when they hold a `/`.
const FILE_EXTENSIONS: &[&str] = &["rs", "py", "pyi", "md", "toml", "sh", "svg", "json", "txt", "lock", "yml"];

/// First components that name no file of the repository: build outputs, and other
/// projects' modules that the documentation points readers to.
const NOT_OURS: &[&str] =
    &["target", ".gpu-bundle", ".gpu-wheels", ".whl", "distributed", "dask", "dask_cuda", "ucxx", "rmm", "torch"];

/// The repository: where the crate was built, else the current directory (a copy of the
/// tree on another machine, run from its root).
fn repository_root() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if built.join("README.md").is_file() {
        return built;
    }
    let here = std::env::current_dir().expect("a current directory");
    assert!(
        here.join("README.md").is_file() && here.join("Cargo.toml").is_file(),
        "neither {} nor the current directory {} is the repository",
        built.display(),
        here.display()
    );
    here
}

/// Hidden folders that belong to the repository (CI's script, cargo's and cargo-mutants'
/// settings); every other hidden folder is left out.
const HIDDEN_FOLDERS_OF_OURS: &[&str] = &[".ci", ".cargo"];

/// Every file under `root`, relative to it, skipping `target` and the hidden folders that
/// are not the repository's.
fn repository_files(root: &Path) -> BTreeSet<String> {
    let mut files = BTreeSet::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = fs::read_dir(root.join(&dir)) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let relative = dir.join(&name);
            let Ok(kind) = entry.file_type() else { continue };
            if kind.is_dir() {
                let hidden = name.starts_with('.') && !HIDDEN_FOLDERS_OF_OURS.contains(&name.as_str());
                if !hidden && name != "target" {
                    pending.push(relative);
                }
            } else {
                files.insert(relative.to_string_lossy().into_owned());
            }
        }
    }
    files
}

/// Link targets and inline code spans of `text`, outside fenced code blocks.
fn named_paths(text: &str) -> Vec<(Kind, String)> {
    let mut named = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        for (index, span) in line.split('`').enumerate() {
            if index % 2 == 1 {
                named.push((Kind::Code, span.to_string()));
            } else {
                let mut rest = span;
                while let Some(at) = rest.find("](") {
                    let tail = &rest[at + 2..];
                    let Some(end) = tail.find(')') else { break };
                    named.push((Kind::Link, tail[..end].to_string()));
                    rest = &tail[end..];
                }
            }
        }
    }
    named
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Link,
    Code,
}

/// What `named` (from the Markdown file at `doc`, relative to the root) must match among
/// `files`, or `None` when it names no repository path.
fn check(doc: &str, kind: Kind, named: &str, files: &BTreeSet<String>, top_level: &BTreeSet<String>) -> Option<bool> {
    let doc_dir = Path::new(doc).parent().unwrap_or(Path::new(""));
    let exists = |path: &Path| {
        let path = normalise(path);
        files.contains(&path) || files.iter().any(|f| f.starts_with(&format!("{path}/")))
    };
    match kind {
        Kind::Link => {
            let target = named.split('#').next().unwrap_or("").trim();
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                return None;
            }
            Some(exists(&doc_dir.join(target)))
        }
        Kind::Code => {
            let path = named.trim().trim_end_matches([',', '.', ':']);
            let path = strip_line_number(path);
            let plain = |c: char| c.is_ascii_alphanumeric() || "/._-".contains(c);
            if path.is_empty() || !path.chars().all(plain) || path.starts_with('/') || path.contains("..") {
                return None;
            }
            let first = path.split('/').next().unwrap_or("");
            if NOT_OURS.contains(&first) {
                return None;
            }
            let from_root =
                top_level.contains(first.trim_end_matches('/')) && (path.contains('/') || path.contains('.'));
            if from_root {
                return Some(exists(Path::new(path)) || exists(&doc_dir.join(path)));
            }
            let extension = path.rsplit('.').next().unwrap_or("");
            if !path.contains('/') || !FILE_EXTENSIONS.contains(&extension) || path.ends_with('/') {
                return None;
            }
            let tail = format!("/{path}");
            Some(files.contains(path) || files.iter().any(|f| f.ends_with(&tail)))
        }
    }
}

/// `a/b.rs:120` and `a/b.rs:120-140` name `a/b.rs`.
fn strip_line_number(path: &str) -> &str {
    match path.rsplit_once(':') {
        Some((file, line)) if !line.is_empty() && line.chars().all(|c| c.is_ascii_digit() || c == '-') => file,
        _ => path,
    }
}

/// `a/./b/../c/` as `a/c`.
fn normalise(path: &Path) -> String {
    let mut parts: Vec<String> = Vec::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                parts.pop();
            }
            std::path::Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
            _ => {}
        }
    }
    parts.join("/")
}

/// Every `(doc, named)` that names a repository path which does not exist.
fn missing_paths(files: &BTreeSet<String>, read: impl Fn(&str) -> String) -> Vec<String> {
    let top_level: BTreeSet<String> = files.iter().map(|f| f.split('/').next().unwrap_or("").to_string()).collect();
    let mut missing = Vec::new();
    for doc in files.iter().filter(|f| f.ends_with(".md")) {
        for (kind, named) in named_paths(&read(doc)) {
            if check(doc, kind, &named, files, &top_level) == Some(false) {
                missing.push(format!("{doc}: {named}"));
            }
        }
    }
    missing
}

#[test]
fn markdown_names_only_repository_paths_that_exist() {
    let root = repository_root();
    let files = repository_files(&root);
    assert!(
        files.contains("README.md") && files.contains("transport/Cargo.toml"),
        "{} is the repository",
        root.display()
    );
    let missing = missing_paths(&files, |doc| fs::read_to_string(root.join(doc)).unwrap_or_default());
    assert!(missing.is_empty(), "Markdown names paths that do not exist:\n{}", missing.join("\n"));
}

fn tree(paths: &[&str]) -> BTreeSet<String> {
    paths.iter().map(|p| p.to_string()).collect()
}

#[test]
fn a_stale_path_in_a_code_span_or_a_link_is_reported() {
    let files = tree(&["README.md", "docs/a.md", "spill/src/store/mod.rs", "transport/src/proto/recv.rs"]);
    let docs = |doc: &str| match doc {
        "README.md" => "See `spill/src/store.rs`, [the notes](docs/missing.md) and `cuda_ipc/cache.rs`.".to_string(),
        _ => "Back to [the README](../README.md#top), `proto/recv.rs:271` and `spill/src/store/`.".to_string(),
    };
    let missing = missing_paths(&files, docs);
    assert_eq!(
        missing,
        ["README.md: spill/src/store.rs", "README.md: docs/missing.md", "README.md: cuda_ipc/cache.rs"]
    );
}

#[test]
fn fenced_blocks_urls_and_other_projects_files_are_not_repository_paths() {
    let files = tree(&["README.md", "benchmarks/peers.sh"]);
    let doc = "```sh\nbash .gpu-bundle/run.sh tests\ncat nowhere/file.rs\n```\n\
               [site](https://example.org/x.md), `distributed/comm/tests/test_comms.py`, \
               `target/release/x`, `/dev/shm`, `ferrylink://host:8786`, `FERRYLINK_TRANSPORT`, \
               `benchmarks/peers.sh`";
    assert!(missing_paths(&files, |_| doc.to_string()).is_empty());
    let broken = doc.replace("`benchmarks/peers.sh`", "`benchmarks/peer.sh`");
    assert_eq!(missing_paths(&files, |_| broken.clone()), ["README.md: benchmarks/peer.sh"]);
}

#[test]
fn the_repositorys_hidden_folders_are_walked_and_others_are_not() {
    let root = tempfile::tempdir().unwrap();
    for file in [".cargo/mutants.toml", ".ci/run", ".git/config", ".gpu-bundle/run.sh", "target/debug/x", "docs/a.md"] {
        let path = root.path().join(file);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, "").unwrap();
    }
    let files: Vec<_> = repository_files(root.path()).into_iter().collect();
    assert_eq!(files, [".cargo/mutants.toml", ".ci/run", "docs/a.md"]);
}
