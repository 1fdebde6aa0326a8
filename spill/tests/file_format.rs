//! The spill file format stays readable: `fixtures/v1-host.spill` was written by the store
//! of ferrylink 0.1.0 (its hand-written CRC-32C) for the message [`fixture_message`]. The
//! store must read it back byte-exact, write the same message to the same bytes, and refuse
//! a corrupted copy.

mod common;

use common::{contents, files_in};
use ferrylink_memory::{Frame, Message};
use ferrylink_spill::{SpillConfig, SpillError, SpillStore, Tier};

const FIXTURE: &[u8] = include_bytes!("fixtures/v1-host.spill");

/// The message of the fixture: a header, frames of odd and even lengths (the checksum's
/// 8-byte blocks and its tail) and an empty frame.
fn fixture_message() -> Message {
    let frame = |len: usize, mul: usize| -> Frame {
        let bytes: Vec<u8> = (0..len).map(|i| (i * mul + len) as u8).collect();
        Frame::from(bytes)
    };
    Message::new(b"ferrylink spill fixture, format 1".to_vec(), vec![frame(1000, 31), frame(37, 7), frame(0, 1)])
}

/// A store whose host budget sends every entry to disk, holding the fixture's message as
/// key 1 in its file `1.spill`.
fn store_with_fixture_entry(dir: &std::path::Path) -> SpillStore<u32> {
    let s = SpillStore::new(SpillConfig::new(1 << 20, 0, dir)).unwrap();
    s.insert(1, fixture_message()).unwrap();
    assert_eq!(s.tier(&1), Some(Tier::Disk));
    assert_eq!(files_in(s.dir()), vec!["1.spill"]);
    s
}

#[test]
fn writes_the_same_bytes_as_the_fixture() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store_with_fixture_entry(tmp.path());
    let written = std::fs::read(s.dir().join("1.spill")).unwrap();
    assert_eq!(written.len(), FIXTURE.len());
    assert!(written == FIXTURE, "the spill file format changed");
}

#[test]
fn reads_the_fixture_back_byte_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store_with_fixture_entry(tmp.path());
    std::fs::write(s.dir().join("1.spill"), FIXTURE).unwrap();
    let m = s.take(&1).unwrap().unwrap();
    assert_eq!(contents(&m), contents(&fixture_message()));
}

#[test]
fn refuses_a_corrupted_fixture() {
    let tmp = tempfile::tempdir().unwrap();
    // One flipped bit in the header, in a frame, in the checksum itself.
    let header_at = FIXTURE.len() - 4 - 1037 - 10;
    for at in [header_at, FIXTURE.len() / 2, FIXTURE.len() - 1] {
        let s = store_with_fixture_entry(tmp.path());
        let mut bytes = FIXTURE.to_vec();
        bytes[at] ^= 0x08;
        std::fs::write(s.dir().join("1.spill"), &bytes).unwrap();
        let e = s.take(&1).unwrap_err();
        assert!(matches!(&e, SpillError::Corrupt { reason, .. } if reason.contains("checksum")), "byte {at}: {e}");
        assert_eq!(s.tier(&1), Some(Tier::Disk), "a corrupt entry stays on disk");
    }
}
