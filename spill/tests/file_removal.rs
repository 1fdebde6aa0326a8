//! Files of entries that leave the disk tier: large ones are removed off the caller's
//! thread (an unspill returns without waiting for the file system), small ones at once,
//! and dropping the store waits for the removals it queued.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{contents, files_in, msg};
use ferrylink_spill::{DiskIo, RealDiskIo, SpillConfig, SpillStore, Tier, Trailer, REMOVE_ASIDE_MIN};
use ferrylink_testkit::{eventually, returns_within, Gate};

/// Real I/O whose removals wait until the gate opens.
#[derive(Default)]
struct GatedRemovals {
    inner: RealDiskIo,
    gate: Gate,
    removed: Mutex<Vec<PathBuf>>,
}

impl GatedRemovals {
    fn removed(&self) -> Vec<PathBuf> {
        self.removed.lock().unwrap().clone()
    }
}

impl DiskIo for GatedRemovals {
    fn write_file(&self, path: &Path, parts: &[&[u8]], trailer: Trailer<'_>) -> std::io::Result<()> {
        self.inner.write_file(path, parts, trailer)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.inner.rename(from, to)
    }
    fn open(&self, path: &Path) -> std::io::Result<Box<dyn std::io::Read + Send>> {
        self.inner.open(path)
    }
    fn remove_file(&self, path: &Path) -> std::io::Result<()> {
        self.gate.pass();
        self.inner.remove_file(path)?;
        self.removed.lock().unwrap().push(path.to_path_buf());
        Ok(())
    }
}

const LARGE: usize = REMOVE_ASIDE_MIN as usize;

/// A store whose entries all go straight to disk.
fn disk_only(dir: &Path, io: Arc<dyn DiskIo>) -> Arc<SpillStore<u32>> {
    Arc::new(SpillStore::new(SpillConfig::new(0, 10, dir).with_disk_io(io)).unwrap())
}

/// What `f` returns while `io` holds every removal back; a failure naming `what` if `f`
/// waits for one (the gate is opened first, so nothing stays blocked).
fn returned_while_removals_wait<T: Send + 'static>(
    io: &GatedRemovals,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    returns_within(Duration::from_secs(20), f).unwrap_or_else(|| {
        io.gate.open();
        panic!("{what} waited for the removal of a large file")
    })
}

#[test]
fn large_files_are_removed_after_take_and_remove_return() {
    let tmp = tempfile::tempdir().unwrap();
    let io = Arc::new(GatedRemovals::default());
    let s = disk_only(tmp.path(), io.clone());
    s.insert(1, msg(b"one", &[LARGE], 1)).unwrap();
    s.insert(2, msg(b"two", &[LARGE + 1], 2)).unwrap();
    assert_eq!((s.tier(&1), s.tier(&2)), (Some(Tier::Disk), Some(Tier::Disk)));
    let store = s.clone();
    let (taken, removed) = returned_while_removals_wait(&io, "take_host or remove", move || {
        let m = store.take_host(&1).unwrap().unwrap();
        (contents(&m), store.remove(&2))
    });
    assert!(taken == contents(&msg(b"one", &[LARGE], 1)) && removed);
    assert_eq!(files_in(s.dir()).len(), 2, "both files wait for the gate");
    assert!((s.len(), s.stats().disk.entries) == (0, 0));
    io.gate.open();
    assert!(eventually(Duration::from_secs(20), || io.removed().len() == 2), "both removals: not within 20 s");
    assert!(files_in(s.dir()).is_empty());
}

#[test]
fn small_files_are_removed_before_take_returns() {
    let tmp = tempfile::tempdir().unwrap();
    let s = disk_only(tmp.path(), Arc::new(RealDiskIo::default()));
    s.insert(1, msg(b"one", &[4096], 1)).unwrap();
    assert_eq!(files_in(s.dir()).len(), 1);
    assert!(s.take_host(&1).unwrap().is_some());
    assert!(files_in(s.dir()).is_empty(), "a small file is removed in line");
}

#[test]
fn dropping_the_store_waits_for_queued_removals() {
    let tmp = tempfile::tempdir().unwrap();
    let io = Arc::new(GatedRemovals::default());
    let s = disk_only(tmp.path(), io.clone());
    s.insert(1, msg(b"", &[LARGE], 1)).unwrap();
    let dir = s.dir().to_path_buf();
    let file = dir.join(&files_in(&dir)[0]);
    let store = s.clone();
    assert!(returned_while_removals_wait(&io, "remove", move || store.remove(&1)));
    let held = io.clone();
    let opener = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        held.gate.open();
    });
    assert!(
        returns_within(Duration::from_secs(20), move || drop(s)).is_some(),
        "the drop did not return after the gate opened"
    );
    opener.join().unwrap();
    assert_eq!(io.removed(), vec![file], "the queued removal ran before the drop returned");
    assert!(!dir.exists(), "the store's directory is removed");
}
