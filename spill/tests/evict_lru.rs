//! Eviction on request ([`SpillStore::evict_lru`]) and the record of evicted keys
//! ([`SpillStore::drain_evicted`]), on the host and disk tiers (no GPU needed).

mod common;

use std::sync::Arc;

use common::{contents, msg};
use ferrylink_spill::{FaultyDiskIo, SpillConfig, SpillError, SpillStore, Tier};

fn recording_store(host_budget: usize, dir: &std::path::Path) -> SpillStore<u32> {
    SpillStore::new(SpillConfig::new(1 << 20, host_budget, dir).with_recorded_evictions()).unwrap()
}

#[test]
fn evict_lru_moves_the_least_recently_used_host_entry_to_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let s = recording_store(1000, tmp.path());
    s.insert(1, msg(b"one", &[400], 1)).unwrap();
    s.insert(2, msg(b"two", &[300], 2)).unwrap();
    s.with(&1, |_| ()).unwrap();
    assert_eq!(s.evict_lru(Tier::Host).unwrap(), Some((2, 300)));
    assert_eq!((s.tier(&1), s.tier(&2)), (Some(Tier::Host), Some(Tier::Disk)));
    assert_eq!(s.evict_lru(Tier::Host).unwrap(), Some((1, 400)));
    assert_eq!(s.evict_lru(Tier::Host).unwrap(), None, "the host tier is empty");
    assert_eq!(s.evict_lru(Tier::Disk).unwrap(), None, "nothing lies below the disk");
    assert_eq!(s.evict_lru(Tier::Device).unwrap(), None);
    assert_eq!(s.drain_evicted(), vec![2, 1]);
    assert!(s.drain_evicted().is_empty(), "a drain empties the record");
    assert_eq!(contents(&s.take(&2).unwrap().unwrap()), contents(&msg(b"two", &[300], 2)));
    assert_eq!(s.stats().host_to_disk, 2);
}

#[test]
fn evictions_made_to_fit_an_insert_are_recorded_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let s = recording_store(1000, tmp.path());
    for k in 1..=4 {
        s.insert(k, msg(b"", &[300], k as u8)).unwrap();
    }
    assert_eq!(s.drain_evicted(), vec![1], "the fourth insert pushed out the first");
    s.insert(5, msg(b"", &[900], 5)).unwrap();
    assert_eq!(s.drain_evicted(), vec![2, 3, 4]);
    s.insert(6, msg(b"", &[5000], 6)).unwrap();
    assert_eq!(s.tier(&6), Some(Tier::Disk));
    assert!(s.drain_evicted().is_empty(), "an entry placed straight on disk was not evicted");
}

#[test]
fn a_failed_eviction_keeps_the_entry_and_records_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let io = Arc::new(FaultyDiskIo::new());
    let config = SpillConfig::new(0, 1000, tmp.path()).with_disk_io(io.clone()).with_recorded_evictions();
    let s: SpillStore<u32> = SpillStore::new(config).unwrap();
    s.insert(1, msg(b"1", &[600], 1)).unwrap();
    io.set_fail_writes(true);
    let err = s.evict_lru(Tier::Host).unwrap_err();
    assert!(matches!(&err, SpillError::Io { source, .. } if source.raw_os_error() == Some(nix::libc::ENOSPC)), "{err}");
    assert_eq!(s.tier(&1), Some(Tier::Host));
    assert!(s.drain_evicted().is_empty());
    io.set_fail_writes(false);
    assert_eq!(s.evict_lru(Tier::Host).unwrap(), Some((1, 600)));
    assert_eq!(s.drain_evicted(), vec![1]);
}

#[test]
fn a_store_that_does_not_record_evictions_drains_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let s: SpillStore<u32> = SpillStore::new(SpillConfig::new(0, 100, tmp.path())).unwrap();
    s.insert(1, msg(b"", &[80], 1)).unwrap();
    s.insert(2, msg(b"", &[80], 2)).unwrap();
    assert_eq!(s.tier(&1), Some(Tier::Disk));
    assert!(s.drain_evicted().is_empty());
}
