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
