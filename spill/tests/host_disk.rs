//! The host and disk tiers, for real (no GPU needed).

mod common;

use std::sync::Arc;

use common::{contents, files_in, msg, pattern};
use ferrylink_memory::{MakeRoom, PinnedPool, PinnedPoolConfig, Registration};
use ferrylink_spill::{FaultyDiskIo, SpillConfig, SpillError, SpillStore, Tier};

fn store(host_budget: usize, dir: &std::path::Path) -> SpillStore<u32> {
    SpillStore::new(SpillConfig::new(1 << 20, host_budget, dir)).unwrap()
}

#[test]
fn lru_eviction_to_disk_and_unspill() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(1000, tmp.path());
    s.insert(1, msg(b"one", &[400], 1)).unwrap();
    s.insert(2, msg(b"two", &[300, 100], 2)).unwrap();
    assert_eq!(s.tier(&1), Some(Tier::Host));
    // Touch 1 so 2 is the least recently used.
    assert_eq!(s.with(&1, |m| m.header.clone()).unwrap().unwrap(), b"one");
    s.insert(3, msg(b"three", &[500], 3)).unwrap();
    assert_eq!(s.tier(&2), Some(Tier::Disk));
    assert_eq!(s.tier(&1), Some(Tier::Host));
    let st = s.stats();
    assert_eq!((st.host.bytes, st.disk.bytes, st.host_to_disk), (900, 400, 1));
    assert_eq!(files_in(s.dir()), vec!["1.spill"]);

    // `with` brings 2 back to host, evicting the LRU (1) to disk.
    let c = s.with(&2, contents).unwrap().unwrap();
    assert_eq!(c, contents(&msg(b"two", &[300, 100], 2)));
    assert_eq!(s.tier(&2), Some(Tier::Host));
    assert_eq!(s.tier(&1), Some(Tier::Disk));
    assert!(s.stats().host.bytes <= 1000);

    // take from disk removes the file.
    let m = s.take(&1).unwrap().unwrap();
    assert_eq!(contents(&m), contents(&msg(b"one", &[400], 1)));
    assert!(!s.contains(&1));
    assert!(s.take(&1).unwrap().is_none());
    let st = s.stats();
    assert_eq!(st.unspilled_from_disk, 2);
    assert!(st.disk_bytes_read > 0 && st.disk_bytes_written >= st.disk_bytes_read);
    assert_eq!(st.disk.entries, 0);
    assert!(files_in(s.dir()).is_empty());
    assert_eq!(s.len(), 2);
}

#[test]
fn entries_larger_than_the_host_budget_go_straight_to_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(100, tmp.path());
    s.insert(1, msg(b"", &[50], 0)).unwrap();
    s.insert(2, msg(b"big", &[80, 80], 9)).unwrap();
    assert_eq!(s.tier(&2), Some(Tier::Disk));
    assert_eq!(s.tier(&1), Some(Tier::Host), "a straight-to-disk entry evicts nothing");
    // `with` cannot promote it: served from disk, stays there.
    let c = s.with(&2, contents).unwrap().unwrap();
    assert_eq!(c, contents(&msg(b"big", &[80, 80], 9)));
    assert_eq!(s.tier(&2), Some(Tier::Disk));
    assert_eq!(s.tier(&1), Some(Tier::Host));
    let m = s.take(&2).unwrap().unwrap();
    assert_eq!(contents(&m), c);
}

#[test]
fn replace_remove_and_empty_entries() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(100, tmp.path());
    s.insert(1, msg(b"a", &[200], 1)).unwrap();
    assert_eq!(files_in(s.dir()).len(), 1);
    s.insert(1, msg(b"b", &[10], 2)).unwrap();
    assert!(files_in(s.dir()).is_empty(), "replaced entry's file is deleted");
    assert_eq!(s.with(&1, |m| m.header.clone()).unwrap().unwrap(), b"b");
    s.insert(2, msg(b"", &[], 0)).unwrap();
    s.insert(3, msg(b"", &[0, 0], 0)).unwrap();
    assert_eq!(s.len(), 3);
    assert!(s.remove(&1));
    assert!(!s.remove(&1));
    assert_eq!(s.take(&3).unwrap().unwrap().frames.len(), 2);
    assert_eq!(s.stats().host.bytes, 0);
}

#[test]
fn pooled_store_reads_back_into_the_pool() {
    let tmp = tempfile::tempdir().unwrap();
    let pool = PinnedPool::new(
        PinnedPoolConfig::default()
            .with_chunk_size(4096)
            .with_region_size(64 << 10)
            .with_registration(Registration::Never),
    )
    .unwrap();
    let s: SpillStore<u32> =
        SpillStore::new(SpillConfig::new(0, 10_000, tmp.path()).with_pinned_pool(pool.clone())).unwrap();
    s.insert(1, msg(b"x", &[20_000], 4)).unwrap();
    let got = s.with(&1, |m| m.frames[0].as_host().unwrap().region().is_some()).unwrap().unwrap();
    assert!(got, "read-back frames come from the pool");
    assert_eq!(pool.stats().bytes_in_use, 0, "released after with()");
    let m = s.take(&1).unwrap().unwrap();
    assert_eq!(m.frames[0].as_host().unwrap().to_vec(), pattern(20_000, 4));
    drop(m);
    assert_eq!(pool.stats().bytes_in_use, 0);
}

#[test]
fn full_disk_keeps_the_entry_in_the_host_tier() {
    let tmp = tempfile::tempdir().unwrap();
    let io = Arc::new(FaultyDiskIo::new());
    let s: SpillStore<u32> = SpillStore::new(SpillConfig::new(0, 1000, tmp.path()).with_disk_io(io.clone())).unwrap();
    s.insert(1, msg(b"1", &[600], 1)).unwrap();
    s.insert(2, msg(b"2", &[300], 2)).unwrap();
    io.set_fail_writes(true);

    // Needs 1 evicted to disk: the write fails, 1 stays on host, 3 comes back.
    let rej = s.insert(3, msg(b"3", &[500], 3)).unwrap_err();
    assert!(
        matches!(&rej.error, SpillError::Io { source, .. } if source.raw_os_error() == Some(nix::libc::ENOSPC)),
        "{}",
        rej.error
    );
    assert_eq!(contents(&rej.message), contents(&msg(b"3", &[500], 3)));
    assert_eq!(s.tier(&1), Some(Tier::Host));
    assert_eq!(s.tier(&2), Some(Tier::Host));
    assert!(!s.contains(&3));
    let st = s.stats();
    assert_eq!((st.host.bytes, st.disk.entries, st.disk_write_errors), (900, 0, 1));
    assert!(files_in(s.dir()).is_empty(), "no partial file left: {:?}", files_in(s.dir()));

    // Straight-to-disk insert fails the same way.
    let rej = s.insert(4, msg(b"4", &[5000], 4)).unwrap_err();
    assert_eq!(rej.message.payload_len(), 5000);
    assert!(!s.contains(&4));

    // Contents intact; once the disk has room again, everything works.
    assert_eq!(s.with(&1, contents).unwrap().unwrap(), contents(&msg(b"1", &[600], 1)));
    io.set_fail_writes(false);
    s.insert(3, rej_retry()).unwrap();
    assert_eq!(s.tier(&2), Some(Tier::Disk));
    assert_eq!(s.len(), 3);
    assert_eq!(contents(&s.take(&2).unwrap().unwrap()), contents(&msg(b"2", &[300], 2)));
    assert!(io.writes_failed() >= 2);

    fn rej_retry() -> ferrylink_memory::Message {
        msg(b"3", &[500], 3)
    }
}

#[test]
fn read_errors_leave_the_entry_on_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let io = Arc::new(FaultyDiskIo::new());
    let s: SpillStore<u32> = SpillStore::new(SpillConfig::new(0, 10, tmp.path()).with_disk_io(io.clone())).unwrap();
    s.insert(1, msg(b"1", &[100], 1)).unwrap();
    io.set_fail_reads(true);
    assert!(matches!(s.take(&1), Err(SpillError::Io { .. })));
    assert!(matches!(s.with(&1, |_| ()), Err(SpillError::Io { .. })));
    assert_eq!(s.tier(&1), Some(Tier::Disk));
    io.set_fail_reads(false);
    assert_eq!(contents(&s.take(&1).unwrap().unwrap()), contents(&msg(b"1", &[100], 1)));
}

#[test]
fn corrupted_files_are_detected() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(10, tmp.path());
    s.insert(1, msg(b"hdr", &[100, 50], 1)).unwrap();
    s.insert(2, msg(b"hdr", &[100], 2)).unwrap();
    s.insert(3, msg(b"hdr", &[100], 3)).unwrap();
    let files = files_in(s.dir());
    assert_eq!(files, vec!["1.spill", "2.spill", "3.spill"]);
    // Flip one payload byte of entry 1.
    let p1 = s.dir().join("1.spill");
    let mut bytes = std::fs::read(&p1).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&p1, &bytes).unwrap();
    let e = s.take(&1).unwrap_err();
    assert!(matches!(&e, SpillError::Corrupt { reason, .. } if reason.contains("checksum")), "{e}");
    assert_eq!(s.tier(&1), Some(Tier::Disk), "a corrupt entry stays, for the caller to remove");
    // Truncated file.
    let p2 = s.dir().join("2.spill");
    let len = std::fs::metadata(&p2).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&p2).unwrap().set_len(len - 3).unwrap();
    assert!(matches!(s.with(&2, |_| ()), Err(SpillError::Corrupt { .. })));
    // Bad magic.
    let p3 = s.dir().join("3.spill");
    let mut bytes = std::fs::read(&p3).unwrap();
    bytes[0] = b'X';
    std::fs::write(&p3, &bytes).unwrap();
    assert!(matches!(s.take(&3), Err(SpillError::Corrupt { reason, .. }) if reason.contains("magic")));
    assert!(s.remove(&1) && s.remove(&2) && s.remove(&3));
    assert!(files_in(s.dir()).is_empty());
}

#[test]
fn directory_removed_on_drop_and_dead_process_dirs_cleaned() {
    let tmp = tempfile::tempdir().unwrap();
    // A directory of a process that has exited.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let stale = tmp.path().join(format!("ferrylink-spill-{dead}-0"));
    std::fs::create_dir(&stale).unwrap();
    std::fs::write(stale.join("7.spill"), b"old").unwrap();
    // A directory of a live process (pid 1) and an unrelated one stay.
    let live = tmp.path().join("ferrylink-spill-1-0");
    std::fs::create_dir(&live).unwrap();
    let other = tmp.path().join("something-else");
    std::fs::create_dir(&other).unwrap();

    let s = store(10, tmp.path());
    assert!(!stale.exists(), "stale directory of dead pid {dead} removed");
    assert!(live.exists() && other.exists());
    let dir = s.dir().to_path_buf();
    assert!(dir
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with(&format!("ferrylink-spill-{}-", std::process::id())));
    s.insert(1, msg(b"", &[100], 0)).unwrap();
    let s2 = store(10, tmp.path());
    assert_ne!(s2.dir(), dir, "two stores of one process have their own directories");
    drop(s);
    assert!(!dir.exists(), "directory (and its files) removed on drop");
    assert!(s2.dir().exists(), "another store of this process is not stale");
}

#[test]
fn make_room_without_device_entries() {
    let tmp = tempfile::tempdir().unwrap();
    let s: SpillStore<u32> = SpillStore::new(SpillConfig::new(1000, 1000, tmp.path())).unwrap();
    assert!(s.make_room(0, 1000).is_ok());
    let e = s.make_room(0, 1001).unwrap_err();
    assert_eq!((e.device_ordinal, e.requested), (0, 1001));
    assert!(e.reason.contains("budget"), "{e}");
}

#[test]
fn concurrent_use_from_several_threads() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Arc::new(store(4000, tmp.path()));
    std::thread::scope(|scope| {
        for t in 0..4u32 {
            let s = s.clone();
            scope.spawn(move || {
                for i in 0..60u32 {
                    let key = t * 1000 + i % 10;
                    let seed = (t * 31 + i) as u8;
                    let size = 100 + (i as usize * 37) % 900;
                    s.insert(key, msg(&key.to_le_bytes(), &[size], seed)).unwrap();
                    let want = contents(&msg(&key.to_le_bytes(), &[size], seed));
                    assert_eq!(s.with(&key, contents).unwrap().unwrap(), want);
                    if i % 3 == 0 {
                        assert_eq!(contents(&s.take(&key).unwrap().unwrap()), want);
                    }
                    assert!(s.stats().host.bytes <= 4000);
                }
            });
        }
    });
    let st = s.stats();
    assert_eq!(st.host.entries + st.disk.entries, s.len());
    assert!(st.host.bytes <= 4000);
    assert!(st.host_to_disk > 0);
    let dir = s.dir().to_path_buf();
    assert_eq!(files_in(&dir).len(), st.disk.entries);
    drop(s);
    assert!(!dir.exists());
}

/// A real full filesystem: a 1 MiB tmpfs (needs root; skipped otherwise).
#[test]
fn real_full_tmpfs() {
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&mnt)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    }
    let result = std::panic::catch_unwind(|| {
        let s: SpillStore<u32> = SpillStore::new(SpillConfig::new(0, 300_000, &mnt)).unwrap();
        let mut failed = None;
        for k in 0..12u32 {
            match s.insert(k, msg(b"", &[250_000], k as u8)) {
                Ok(()) => {}
                Err(r) => {
                    failed = Some((k, r));
                    break;
                }
            }
        }
        let (k, r) = failed.expect("a 1 MiB tmpfs must fill up");
        assert!(
            matches!(&r.error, SpillError::Io { source, .. } if source.raw_os_error() == Some(nix::libc::ENOSPC)),
            "{}",
            r.error
        );
        assert!(!s.contains(&k));
        // Every earlier entry is intact, in some tier.
        for j in 0..k {
            assert_eq!(
                s.with(&j, |m| m.frames[0].as_host().unwrap().to_vec()).unwrap().unwrap(),
                pattern(250_000, j as u64)
            );
        }
        assert!(s.stats().host.bytes <= 300_000);
        assert!(!files_in(s.dir()).iter().any(|f| f.ends_with(".tmp")));
        drop(s);
        assert!(files_in(&mnt).is_empty());
    });
    let _ = std::process::Command::new("umount").arg(&mnt).status();
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}

/// Synced stores write large files (with writeback started as they are written) on disk
/// and on tmpfs: the entries come back byte exact and the files have their exact lengths.
#[test]
fn synced_large_entries_round_trip() {
    use ferrylink_spill::RealDiskIo;
    const LARGE: usize = 4 << 20;
    let tmp = tempfile::tempdir().unwrap();
    let mut dirs = vec![tmp.path().to_path_buf()];
    if std::path::Path::new("/dev/shm").is_dir() {
        dirs.push("/dev/shm".into());
    }
    for dir in dirs {
        let io = Arc::new(RealDiskIo { fsync: true });
        let s: SpillStore<u32> = SpillStore::new(SpillConfig::new(0, 10, &dir).with_disk_io(io)).unwrap();
        let layouts: [&[usize]; 3] = [&[LARGE], &[3, LARGE + 1, 17], &[(16 << 20) - 40, 4 << 20]];
        for (k, sizes) in layouts.iter().enumerate() {
            s.insert(k as u32, msg(b"header", sizes, k as u8)).unwrap();
            assert_eq!(s.tier(&(k as u32)), Some(Tier::Disk), "{}", dir.display());
        }
        let on_disk: u64 = files_in(s.dir()).iter().map(|f| std::fs::metadata(s.dir().join(f)).unwrap().len()).sum();
        assert_eq!(on_disk, s.stats().disk_bytes_written, "{}: files have their exact lengths", dir.display());
        for (k, sizes) in layouts.iter().enumerate() {
            let m = s.take(&(k as u32)).unwrap().unwrap();
            assert!(contents(&m) == contents(&msg(b"header", sizes, k as u8)), "{}: entry {k}", dir.display());
        }
    }
}
