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

/// Entries of several MiB take the checksum path that runs beside the I/O (a thread of
/// its own on write and read): the file is the same format (its trailer the CRC-32C of
/// all that precedes it), it reads back byte-exact, and a flipped bit deep in a frame or
/// a truncated file is refused.
#[test]
fn large_entries_keep_the_format_and_their_checks() {
    let tmp = tempfile::tempdir().unwrap();
    let large = |len: usize, mul: usize| -> Frame {
        Frame::from((0..len).map(|i| (i * mul + i / 4099) as u8).collect::<Vec<u8>>())
    };
    let message = || Message::new(b"large".to_vec(), vec![large(5 << 20, 13), large((4 << 20) + 3, 7)]);
    let s = SpillStore::new(SpillConfig::new(1 << 20, 0, tmp.path())).unwrap();
    s.insert(1u32, message()).unwrap();
    assert_eq!(s.tier(&1), Some(Tier::Disk));
    let path = s.dir().join("1.spill");
    let written = std::fs::read(&path).unwrap();
    let (body, trailer) = written.split_at(written.len() - 4);
    assert_eq!(trailer, ferrylink_spill::crc::crc32c(body).to_le_bytes(), "the trailer is the body's CRC-32C");
    let m = s.take(&1).unwrap().unwrap();
    assert_eq!(contents(&m), contents(&message()));

    for damage in ["a bit in the second frame", "the last piece of the first frame", "truncated"] {
        s.insert(1, message()).unwrap();
        let path = s.dir().join(files_in(s.dir())[0].clone());
        let mut bytes = std::fs::read(&path).unwrap();
        match damage {
            "truncated" => bytes.truncate(bytes.len() - 1000),
            "a bit in the second frame" => bytes[(5 << 20) + (3 << 20)] ^= 0x40,
            _ => bytes[5 << 20] ^= 0x01,
        }
        std::fs::write(&path, &bytes).unwrap();
        let e = s.take(&1).unwrap_err();
        let want = if damage == "truncated" { "truncated" } else { "checksum" };
        assert!(matches!(&e, SpillError::Corrupt { reason, .. } if reason.contains(want)), "{damage}: {e}");
        s.remove(&1);
    }
}
