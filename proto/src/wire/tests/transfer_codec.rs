//! `TransferMessage`'s spans on the wire (`wire/transfer_codec.rs`): packed, exact, and a
//! lying count refused.

use super::super::*;
use super::{frame_of_body, limits};

fn transfer(spans: Vec<WireSpan>) -> WireMessage {
    let local = GrantedMemory::Host { region_id: 5, offset: 0 };
    let t = TransferMessage { id: 7, op: TransferOp::Put, grant: 1, local, local_len: 1 << 30, spans, notify: None };
    WireMessage::Transfer(Box::new(t))
}

fn span(i: u64) -> WireSpan {
    WireSpan { local_offset: i << 16, remote_offset: (u64::MAX >> 1) - (i << 20), len: 1 + i }
}

/// The frame of a three-span transfer with its span count (one byte) replaced by
/// `count_bytes` (a bincode varint).
fn three_spans_counted_as(count_bytes: &[u8]) -> Vec<u8> {
    let body = |spans: u64| encode_frame(&transfer((0..spans).map(span).collect()))[FRAME_PREFIX_LEN..].to_vec();
    let (three, four) = (body(3), body(4));
    let at = three.iter().zip(&four).position(|(a, b)| a != b).expect("the counts differ");
    assert_eq!((three[at], four[at]), (3, 4), "the span count's byte");
    let mut patched = three[..at].to_vec();
    patched.extend_from_slice(count_bytes);
    patched.extend_from_slice(&three[at + 1..]);
    frame_of_body(&patched)
}

#[test]
fn spans_travel_packed_and_come_back_exactly() {
    let m = transfer((0..1000).map(span).collect());
    let frame = encode_frame(&m);
    // 24 bytes per span, whatever the values (the count: 3 bytes for 1000, 1 for 3).
    let three = encode_frame(&transfer((0..3).map(span).collect()));
    assert_eq!(frame.len() - three.len(), 997 * 24 + 2, "packed spans");
    let (back, used) = decode_frame(&frame, &limits()).unwrap().unwrap();
    assert_eq!((back, used), (m, frame.len()));
}

#[test]
fn a_count_past_the_limit_or_past_the_bytes_is_refused() {
    assert!(decode_frame(&three_spans_counted_as(&[3]), &limits()).unwrap().is_some(), "the frame as it was");
    // 65,537 spans claimed (a u32 varint): refused before anything is read.
    let too_many = three_spans_counted_as(&[252, 0x01, 0x00, 0x01, 0x00]);
    let e = decode_frame(&too_many, &limits()).unwrap_err().to_string();
    assert!(e.contains("65537 spans"), "{e}");
    // 200 spans claimed where 3 are: the bytes run out.
    let short = three_spans_counted_as(&[200]);
    assert!(matches!(decode_frame(&short, &limits()), Err(WireError::Malformed(_))));
    // The 3 spans claimed as 2: the rest is read as what follows and the frame fails.
    assert!(decode_frame(&three_spans_counted_as(&[2]), &limits()).is_err());
    // u64::MAX spans (a u64 varint): refused, no overflow.
    let huge = three_spans_counted_as(&[253, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
    assert!(decode_frame(&huge, &limits()).unwrap_err().to_string().contains("spans"));
}
