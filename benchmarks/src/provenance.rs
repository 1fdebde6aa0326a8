//! Which build made a measurement, for the captions of plots: the commit, when it can be
//! known at run time.
//!
//! `FERRYLINK_BENCH_COMMIT` wins when set (a bundle run on the GPU machine, which has no
//! git and no source tree, can pass it, or `--label`); otherwise the commit of the source
//! tree the binary was built from (`git rev-parse` there, at run time), marked when that
//! tree has uncommitted changes. Without either: nothing, never an error.

use std::path::Path;
use std::process::{Command, Stdio};

/// The variable that names the commit of a run (benchmarks only; the library never reads
/// it).
pub const COMMIT_VARIABLE: &str = "FERRYLINK_BENCH_COMMIT";

/// The commit of this run: [`COMMIT_VARIABLE`], else the source tree's (see the module
/// documentation).
pub fn commit() -> Option<String> {
    commit_from(std::env::var(COMMIT_VARIABLE).ok(), Path::new(env!("CARGO_MANIFEST_DIR")))
}

/// `variable` when it holds more than blanks, else the commit of the git work tree at
/// `source_dir` (`abcdef123456`, or `abcdef123456 with uncommitted changes`), else `None`
/// (no such directory, no git, not a work tree).
pub fn commit_from(variable: Option<String>, source_dir: &Path) -> Option<String> {
    if let Some(v) = variable.map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()) {
        return Some(v);
    }
    if !source_dir.is_dir() {
        return None;
    }
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").arg("-C").arg(source_dir).args(args).stdin(Stdio::null()).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let head = git(&["rev-parse", "--short=12", "HEAD"]).filter(|h| !h.is_empty())?;
    let changed = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Some(if changed { format!("{head} with uncommitted changes") } else { head })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_wins_and_blanks_do_not_count() {
        let nowhere = Path::new("/nonexistent/ferrylink-source");
        assert_eq!(commit_from(Some(" 0123abcd ".into()), nowhere), Some("0123abcd".into()));
        assert_eq!(commit_from(Some("  ".into()), nowhere), None);
        assert_eq!(commit_from(None, nowhere), None);
    }

    #[test]
    fn a_directory_outside_git_has_no_commit() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(commit_from(None, dir.path()), None);
    }

    /// In a git work tree, the commit is HEAD's: a 12-digit hash that git resolves to the
    /// same commit as HEAD. Checked where this crate's source tree and git are present
    /// (CI's clone, a developer's tree; not a GPU bundle, which has neither).
    #[test]
    fn a_work_tree_gives_its_head() {
        let source = Path::new(env!("CARGO_MANIFEST_DIR"));
        let head = Command::new("git").arg("-C").arg(source).args(["rev-parse", "HEAD"]).output();
        let Some(head) = head.ok().filter(|o| o.status.success()) else {
            return;
        };
        let head = String::from_utf8_lossy(&head.stdout).trim().to_owned();
        let got = commit_from(None, source).expect("a commit in a git work tree");
        let hash = got.split(' ').next().unwrap();
        assert_eq!(hash.len(), 12, "{got}");
        assert!(head.starts_with(hash), "{got} is not HEAD {head}");
        assert!(got == hash || got.ends_with(" with uncommitted changes"), "{got}");
    }
}
