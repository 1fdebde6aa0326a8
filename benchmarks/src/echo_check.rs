//! What `local-send-recv` checks of an echo, outside the timed part of a round trip: its
//! bytes against the bytes that were sent, frame by frame (device frames copied to the
//! host first), on the first and the last round trip, and on every one with `--check`.
//! A difference is an error naming the round trip and the first differing offset.
//!
//! Before a checked round trip the client stamps its reused send buffer with the round
//! trip's number ([`stamp_round_trip`]), so an echo that is a stale copy of an earlier
//! round trip differs from what was sent.
//!
//! [`corrupt_for_test`] is the test-only hook behind the hidden
//! `--corrupt-echo-for-test ROUND_TRIP` option: the server flips one byte of that round
//! trip's echo, and the crate's tests check that the run then fails.

use crate::error::BenchError;
use ferrylink::{Frame, Message};
use std::borrow::Cow;

/// The bytes of a frame: host frames as they are, device frames copied to the host.
fn frame_bytes(frame: &Frame) -> Result<Cow<'_, [u8]>, BenchError> {
    Ok(match frame {
        Frame::Host(h) => Cow::Borrowed(h.as_slice()),
        Frame::Device(d) => Cow::Owned(d.to_vec()?),
    })
}

/// The first offset where `a` and `b` differ (the shorter length when one is a prefix of
/// the other); `None` when they are equal.
pub fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    if a == b {
        return None;
    }
    Some(a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len())))
}

/// Compares the echo of round trip `round_trip` (counted from 0, warm-up round trips
/// first) with what was sent, frame by frame.
pub fn check_echo(round_trip: usize, sent: &Message, got: &Message) -> Result<(), BenchError> {
    let mismatch = |what: String| BenchError::Transport(format!("round trip {round_trip}: {what}"));
    if sent.frames.len() != got.frames.len() {
        return Err(mismatch(format!("the echo has {} frame(s), {} were sent", got.frames.len(), sent.frames.len())));
    }
    for (f, (a, b)) in sent.frames.iter().zip(&got.frames).enumerate() {
        let (a, b) = (frame_bytes(a)?, frame_bytes(b)?);
        if let Some(at) = first_difference(&a, &b) {
            let byte = |s: &[u8]| s.get(at).map_or_else(|| "nothing".to_string(), |x| format!("{x:#04x}"));
            return Err(mismatch(format!(
                "the echo differs from what was sent: frame {f}, first difference at byte offset {at} \
                 (sent {}, echoed {}; {} and {} bytes)",
                byte(&a),
                byte(&b),
                a.len(),
                b.len()
            )));
        }
    }
    Ok(())
}

/// Writes `round_trip` (little-endian, up to 8 bytes) at the start of the first frame of
/// a reused send message, so that its echo cannot be mistaken for an earlier one's.
pub fn stamp_round_trip(message: &mut Message, round_trip: usize) -> Result<(), BenchError> {
    let stamp = (round_trip as u64).to_le_bytes();
    match message.frames.first_mut() {
        Some(Frame::Host(h)) => {
            let s = h.as_mut_slice();
            let len = s.len().min(stamp.len());
            s[..len].copy_from_slice(&stamp[..len]);
        }
        Some(Frame::Device(d)) => d.copy_from_host(&stamp[..d.len().min(stamp.len())])?,
        None => {}
    }
    Ok(())
}

/// Test only (`--corrupt-echo-for-test`): flips the byte in the middle of the first frame
/// of `message` (in place; device frames through a copy to the host and back) and
/// returns its offset.
pub fn corrupt_for_test(message: &mut Message) -> Result<usize, BenchError> {
    let empty = || BenchError::Usage("--corrupt-echo-for-test needs a message of at least one byte".into());
    match message.frames.first_mut() {
        Some(Frame::Host(h)) if !h.is_empty() => {
            let at = h.len() / 2;
            h.as_mut_slice()[at] ^= 0xff;
            Ok(at)
        }
        Some(Frame::Device(d)) if !d.is_empty() => {
            let mut bytes = d.to_vec()?;
            let at = bytes.len() / 2;
            bytes[at] ^= 0xff;
            d.copy_from_host(&bytes)?;
            Ok(at)
        }
        _ => Err(empty()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrylink::HostBuffer;

    fn host_message(bytes: Vec<u8>) -> Message {
        Message::new(Vec::new(), vec![Frame::Host(HostBuffer::from_vec(bytes))])
    }

    #[test]
    fn first_difference_finds_the_first_offset() {
        assert_eq!(first_difference(b"abcd", b"abcd"), None);
        assert_eq!(first_difference(b"abcd", b"abXd"), Some(2));
        assert_eq!(first_difference(b"Xbcd", b"abcY"), Some(0));
        assert_eq!(first_difference(b"abc", b"abcd"), Some(3));
        assert_eq!(first_difference(b"", b""), None);
    }

    #[test]
    fn a_corrupted_echo_names_the_round_trip_and_the_offset() {
        let sent = host_message((0..1000).map(|i| (i % 251) as u8).collect());
        let mut got = host_message(sent.frames[0].as_host().unwrap().to_vec());
        check_echo(7, &sent, &got).unwrap();
        assert_eq!(corrupt_for_test(&mut got).unwrap(), 500);
        let e = check_echo(7, &sent, &got).unwrap_err().to_string();
        assert!(e.contains("round trip 7") && e.contains("byte offset 500"), "{e}");
        assert!(e.contains("sent 0xf9, echoed 0x06"), "{e}");
    }

    #[test]
    fn a_missing_frame_or_a_short_echo_is_an_error() {
        let sent = host_message(vec![1; 10]);
        let none = Message::new(Vec::new(), Vec::new());
        assert!(check_echo(0, &sent, &none).unwrap_err().to_string().contains("0 frame(s), 1 were sent"));
        let short = host_message(vec![1; 9]);
        let e = check_echo(0, &sent, &short).unwrap_err().to_string();
        assert!(e.contains("byte offset 9") && e.contains("echoed nothing"), "{e}");
        assert!(corrupt_for_test(&mut host_message(Vec::new())).is_err());
    }

    #[test]
    fn stamps_tell_round_trips_apart() {
        let mut a = host_message(vec![0xaa; 20]);
        stamp_round_trip(&mut a, 1).unwrap();
        let earlier = host_message(a.frames[0].as_host().unwrap().to_vec());
        stamp_round_trip(&mut a, 258).unwrap();
        assert_eq!(&a.frames[0].as_host().unwrap().as_slice()[..9], &[2, 1, 0, 0, 0, 0, 0, 0, 0xaa]);
        assert!(check_echo(258, &a, &earlier).is_err());
        let mut tiny = host_message(vec![0xaa; 3]);
        stamp_round_trip(&mut tiny, 0x0102_0304).unwrap();
        assert_eq!(tiny.frames[0].as_host().unwrap().as_slice(), &[4, 3, 2]);
    }
}
