//! `TransferMessage` on the wire: its fields as bincode encodes them, but its spans as
//! one block of little-endian u64 triples after their count, instead of bincode's
//! varints. A batch of KV-cache blocks is thousands of spans: on the dev VM, 1000 spans
//! took 15 µs to encode and 14 µs to decode and validate as varints, in every round trip
//! of a batched `put` (the owner's answer travels as a `Transfer`).
//!
//! Decoding is bounded as the rest of the wire format is: the count is checked against
//! [`MAX_SPANS`] and the bytes claimed against the decoder's limit before anything is
//! allocated, and the spans are read out of the bytes already received.

use super::onesided::{TransferMessage, WireSpan, MAX_SPANS, SPAN_WIRE_BYTES};
use bincode::de::read::Reader;
use bincode::de::{Decode, Decoder};
use bincode::enc::write::Writer;
use bincode::enc::{Encode, Encoder};
use bincode::error::{DecodeError, EncodeError};

impl Encode for TransferMessage {
    fn encode<E: Encoder>(&self, encoder: &mut E) -> Result<(), EncodeError> {
        self.id.encode(encoder)?;
        self.op.encode(encoder)?;
        self.grant.encode(encoder)?;
        self.local.encode(encoder)?;
        self.local_len.encode(encoder)?;
        encode_spans(&self.spans, encoder)?;
        self.notify.encode(encoder)
    }
}

impl<Context> Decode<Context> for TransferMessage {
    fn decode<D: Decoder<Context = Context>>(decoder: &mut D) -> Result<Self, DecodeError> {
        Ok(TransferMessage {
            id: Decode::decode(decoder)?,
            op: Decode::decode(decoder)?,
            grant: Decode::decode(decoder)?,
            local: Decode::decode(decoder)?,
            local_len: Decode::decode(decoder)?,
            spans: decode_spans(decoder)?,
            notify: Decode::decode(decoder)?,
        })
    }
}

bincode::impl_borrow_decode!(TransferMessage);

fn encode_spans<E: Encoder>(spans: &[WireSpan], encoder: &mut E) -> Result<(), EncodeError> {
    (spans.len() as u64).encode(encoder)?;
    let mut packed = Vec::with_capacity(spans.len() * SPAN_WIRE_BYTES);
    for s in spans {
        packed.extend_from_slice(&s.local_offset.to_le_bytes());
        packed.extend_from_slice(&s.remote_offset.to_le_bytes());
        packed.extend_from_slice(&s.len.to_le_bytes());
    }
    encoder.writer().write(&packed)
}

fn decode_spans<D: Decoder>(decoder: &mut D) -> Result<Vec<WireSpan>, DecodeError> {
    let count = u64::decode(decoder)?;
    let count = usize::try_from(count)
        .ok()
        .filter(|&c| c <= MAX_SPANS)
        .ok_or_else(|| DecodeError::OtherString(format!("a transfer of {count} spans (at most {MAX_SPANS})")))?;
    let len = count * SPAN_WIRE_BYTES;
    decoder.claim_bytes_read(len)?;
    if let Some(bytes) = decoder.reader().peek_read(len) {
        let spans = unpack(bytes);
        decoder.reader().consume(len);
        return Ok(spans);
    }
    // A reader without a buffer to look into (not the codec's): read a copy.
    let mut bytes = vec![0u8; len];
    decoder.reader().read(&mut bytes)?;
    Ok(unpack(&bytes))
}

/// The spans of whole 24-byte groups of `bytes`.
fn unpack(bytes: &[u8]) -> Vec<WireSpan> {
    let (words, _) = bytes.as_chunks::<8>();
    words
        .chunks_exact(3)
        .map(|w| WireSpan {
            local_offset: u64::from_le_bytes(w[0]),
            remote_offset: u64::from_le_bytes(w[1]),
            len: u64::from_le_bytes(w[2]),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::wire::*;

    fn limits() -> Limits {
        Limits { max_header_bytes: 1 << 20, max_frames: 1024, max_frame_len: 1 << 40, inline_threshold: 4096 }
    }

    fn transfer(spans: Vec<WireSpan>) -> WireMessage {
        let local = GrantedMemory::Host { region_id: 5, offset: 0 };
        let t =
            TransferMessage { id: 7, op: TransferOp::Put, grant: 1, local, local_len: 1 << 30, spans, notify: None };
        WireMessage::Transfer(Box::new(t))
    }

    fn span(i: u64) -> WireSpan {
        WireSpan { local_offset: i << 16, remote_offset: (u64::MAX >> 1) - (i << 20), len: 1 + i }
    }

    /// The frame of `message` with its span count (one byte, under 251 spans) replaced by
    /// `count_bytes` (a bincode varint), the body length fixed up.
    fn with_span_count(message: &WireMessage, count_bytes: &[u8]) -> Vec<u8> {
        let (three, four) = (encode_frame(&transfer((0..3).map(span).collect())), {
            let mut spans: Vec<WireSpan> = (0..3).map(span).collect();
            spans.push(span(3));
            encode_frame(&transfer(spans))
        });
        let body = |f: &[u8]| f[FRAME_PREFIX_LEN..].to_vec();
        let at = FRAME_PREFIX_LEN
            + body(&three).iter().zip(&body(&four)).position(|(a, b)| a != b).expect("the counts differ");
        assert_eq!((three[at], four[at]), (3, 4), "the span count's byte");
        let frame = encode_frame(message);
        let mut out = frame[..at].to_vec();
        out.extend_from_slice(count_bytes);
        out.extend_from_slice(&frame[at + 1..]);
        let body_len = (out.len() - FRAME_PREFIX_LEN) as u32;
        out[8..12].copy_from_slice(&body_len.to_le_bytes());
        out
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
        let m = transfer((0..3).map(span).collect());
        // 65,537 spans claimed (a u32 varint): refused before anything is read.
        let too_many = with_span_count(&m, &[252, 0x01, 0x00, 0x01, 0x00]);
        let e = decode_frame(&too_many, &limits()).unwrap_err().to_string();
        assert!(e.contains("65537 spans"), "{e}");
        // 200 spans claimed where 3 are: the bytes run out.
        let short = with_span_count(&m, &[200]);
        assert!(matches!(decode_frame(&short, &limits()), Err(WireError::Malformed(_))));
        // The 3 spans claimed as 2: the rest is read as what follows and the frame fails.
        let fewer = with_span_count(&m, &[2]);
        assert!(decode_frame(&fewer, &limits()).is_err());
        // u64::MAX spans (a u64 varint): refused, no overflow.
        let huge = with_span_count(&m, &[253, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
        assert!(decode_frame(&huge, &limits()).unwrap_err().to_string().contains("spans"));
    }
}
