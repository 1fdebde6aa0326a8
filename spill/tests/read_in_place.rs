//! [`SpillStore::read`]: copies of entries that stay where they are (no GPU needed).

mod common;

use common::{files_in, msg};
use ferrylink_memory::serialize::FrameOrigin;
use ferrylink_memory::{PinnedPool, PinnedPoolConfig, Registration};
use ferrylink_spill::{SpillConfig, SpillError, SpillStore, Tier};

fn frames_of(hm: &ferrylink_memory::serialize::HostMessage) -> Vec<Vec<u8>> {
    hm.frames.iter().map(|f| f.to_vec()).collect()
}

fn expected(sizes: &[usize], seed: u8) -> Vec<Vec<u8>> {
    let m = msg(b"", sizes, seed);
    m.frames.iter().map(|f| f.as_host().unwrap().to_vec()).collect()
}

#[test]
fn a_disk_entry_is_read_and_stays_on_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let s: SpillStore<u32> = SpillStore::new(SpillConfig::new(0, 100, tmp.path())).unwrap();
    s.insert(1, msg(b"big", &[80, 70], 4)).unwrap();
    s.insert(2, msg(b"small", &[60], 5)).unwrap();
    assert_eq!(s.tier(&1), Some(Tier::Disk));
    let hm = s.read(&1, None).unwrap().unwrap();
    assert_eq!(hm.header, b"big");
    assert_eq!(frames_of(&hm), expected(&[80, 70], 4));
    assert_eq!(hm.origins, vec![FrameOrigin::Host; 2]);
    assert_eq!((s.tier(&1), s.tier(&2)), (Some(Tier::Disk), Some(Tier::Host)), "nothing moved");
    assert_eq!(files_in(s.dir()).len(), 1);
    assert!(s.read(&9, None).unwrap().is_none());
}

#[test]
fn a_host_entry_is_copied_into_the_pool_and_marked_recently_used() {
    let tmp = tempfile::tempdir().unwrap();
    let config = PinnedPoolConfig::default().with_region_size(1 << 20).with_registration(Registration::Never);
    let pool = PinnedPool::new(config.with_chunk_size(4096)).unwrap();
    let s: SpillStore<u32> = SpillStore::new(SpillConfig::new(0, 1000, tmp.path())).unwrap();
    s.insert(1, msg(b"one", &[400], 1)).unwrap();
    s.insert(2, msg(b"two", &[400], 2)).unwrap();
    let hm = s.read(&1, Some(&pool)).unwrap().unwrap();
    assert_eq!(frames_of(&hm), expected(&[400], 1));
    assert!(hm.frames[0].region().is_some(), "the copy lies in the pool");
    assert_eq!(pool.stats().bytes_in_use, 4096);
    s.insert(3, msg(b"three", &[400], 3)).unwrap();
    assert_eq!((s.tier(&1), s.tier(&2)), (Some(Tier::Host), Some(Tier::Disk)), "the read made 1 the most recent");
    drop(hm);
    assert_eq!(pool.stats().bytes_in_use, 0);
}

#[test]
fn a_corrupt_file_fails_the_read_and_stays() {
    let tmp = tempfile::tempdir().unwrap();
    let s: SpillStore<u32> = SpillStore::new(SpillConfig::new(0, 10, tmp.path())).unwrap();
    s.insert(1, msg(b"h", &[64], 7)).unwrap();
    let path = s.dir().join(&files_in(s.dir())[0]);
    let mut bytes = std::fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();
    assert!(matches!(s.read(&1, None), Err(SpillError::Corrupt { .. })));
    assert_eq!(s.tier(&1), Some(Tier::Disk));
}
