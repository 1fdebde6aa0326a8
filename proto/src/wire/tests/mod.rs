//! The codec's tests.
//!
//! - here: framing (round trips, partial frames, the prefix checks, trailing bytes).
//! - `coverage.rs`: the samples hold every message and every variant inside one.
//! - `limits.rs`: every bound the decoder enforces, at the bound and one past it.
//! - `one_sided_limits.rs`: the same for the one-sided messages, one row per bound.
//! - `props.rs`: properties over generated messages, mutated frames and random bodies.
//! - `corpus.rs`: the fuzz target's committed seed corpus.

mod corpus;
mod coverage;
mod limits;
mod one_sided_limits;
mod props;
mod transfer_codec;

use super::codec::*;
use super::*;

fn limits() -> Limits {
    Limits::default()
}

/// A frame with a valid prefix around `body`.
fn frame_of_body(body: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(FRAME_PREFIX_LEN + body.len());
    frame.extend_from_slice(&MAGIC);
    frame.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    frame.extend_from_slice(&[0, 0]);
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(body);
    frame
}

#[test]
fn every_sample_round_trips() {
    for (name, m) in sample_messages() {
        let bytes = encode_frame(&m);
        let (back, used) = decode_frame(&bytes, &limits()).unwrap().unwrap_or_else(|| panic!("{name}: incomplete"));
        assert_eq!(back, m, "{name}");
        assert_eq!(used, bytes.len(), "{name}");
    }
}

#[test]
fn partial_frames_ask_for_more_and_two_frames_decode_in_turn() {
    let mut bytes = encode_frame(&WireMessage::Data(samples::data_with_every_frame_kind()));
    for cut in 0..bytes.len() {
        assert_eq!(decode_frame(&bytes[..cut], &limits()).unwrap(), None, "cut at {cut}");
    }
    let first_len = bytes.len();
    bytes.extend(encode_frame(&WireMessage::Goodbye));
    let (_, used) = decode_frame(&bytes, &limits()).unwrap().unwrap();
    assert_eq!(used, first_len);
    let (m, _) = decode_frame(&bytes[used..], &limits()).unwrap().unwrap();
    assert_eq!(m, WireMessage::Goodbye);
}

#[test]
fn bad_magic_is_rejected_from_its_first_wrong_byte() {
    let mut bytes = encode_frame(&WireMessage::Goodbye);
    bytes[0] = b'G';
    assert_eq!(decode_frame(&bytes, &limits()), Err(WireError::BadMagic(*b"GLNK")));
    assert_eq!(decode_frame(b"GET / HTTP/1.1", &limits()), Err(WireError::BadMagic(*b"GET ")));
    // Shorter than a prefix: a wrong byte is an error now, a right start asks for more.
    assert_eq!(decode_frame(b"G", &limits()), Err(WireError::BadMagic(*b"G\0\0\0")));
    assert_eq!(decode_frame(b"FLX", &limits()), Err(WireError::BadMagic(*b"FLX\0")));
    assert_eq!(decode_frame(b"FLNK\x04", &limits()), Ok(None));
    assert_eq!(decode_frame(b"", &limits()), Ok(None));
}

#[test]
fn unknown_versions_are_rejected() {
    for version in [0u16, PROTOCOL_VERSION - 1, PROTOCOL_VERSION + 1, 99] {
        let mut bytes = encode_frame(&WireMessage::Goodbye);
        bytes[4..6].copy_from_slice(&version.to_le_bytes());
        assert_eq!(decode_frame(&bytes, &limits()), Err(WireError::UnknownVersion { found: version }));
    }
}

#[test]
fn a_body_longer_than_the_limits_allow_is_refused_before_it_arrives() {
    let max = limits().max_body_bytes();
    let mut prefix = encode_frame(&WireMessage::Goodbye)[..FRAME_PREFIX_LEN].to_vec();
    prefix[8..12].copy_from_slice(&((max + 1) as u32).to_le_bytes());
    assert_eq!(decode_frame(&prefix, &limits()), Err(WireError::Oversized { len: max + 1, max }));
    prefix[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(decode_frame(&prefix, &limits()), Err(WireError::Oversized { len: u32::MAX as usize, max }));
    // At the limit, the body is waited for.
    prefix[8..12].copy_from_slice(&(max as u32).to_le_bytes());
    assert_eq!(decode_frame(&prefix, &limits()), Ok(None));
}

#[test]
fn trailing_bytes_and_truncated_bodies_are_malformed() {
    let mut bytes = encode_frame(&WireMessage::Goodbye);
    bytes.push(0);
    let len = (bytes.len() - FRAME_PREFIX_LEN) as u32;
    bytes[8..12].copy_from_slice(&len.to_le_bytes());
    let err = decode_frame(&bytes, &limits()).unwrap_err();
    assert_eq!(err, WireError::Malformed("1 trailing bytes after the message".into()));
    let mut bytes = encode_frame(&WireMessage::Data(samples::data_with_every_frame_kind()));
    let short = (bytes.len() - FRAME_PREFIX_LEN - 5) as u32;
    bytes[8..12].copy_from_slice(&short.to_le_bytes());
    bytes.truncate(FRAME_PREFIX_LEN + short as usize);
    let err = decode_frame(&bytes, &limits()).unwrap_err();
    assert!(matches!(&err, WireError::Malformed(e) if e.contains("UnexpectedEnd")), "{err:?}");
}
