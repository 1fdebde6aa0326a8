//! The invariant of [`decode_frame`] on any bytes, in one place: the fuzz target
//! (`fuzz/fuzz_targets/decode_frame.rs`) panics when it breaks, the codec's tests assert
//! it over structured inputs and over the committed seed corpus.

use super::codec::{decode_frame, encode_frame, Limits, WireError, FRAME_PREFIX_LEN};
use super::messages::WireMessage;

/// What `decode_frame` made of some bytes (once the invariant held).
#[derive(Debug, Clone, PartialEq)]
pub enum DecodeOutcome {
    /// A valid frame of `used` bytes at the start.
    Accepted {
        /// The message.
        message: WireMessage,
        /// The frame's length.
        used: usize,
    },
    /// A frame's start that needs more bytes.
    NeedsMore,
    /// Not a valid frame.
    Rejected(WireError),
}

/// Decodes `bytes` and checks what must hold whatever they are:
///
/// - an accepted frame is its prefix and its declared body, within `bytes`;
/// - only the frame's own bytes count: the frame alone decodes the same, and so does the
///   frame followed by other bytes (for a rejected complete frame too);
/// - an accepted message survives a round trip: re-encoded, it decodes whole and equal;
/// - the key bytes of an accepted `ImportKey` (untrusted until the owner parses them)
///   parse without panicking, and a key they parse to encodes back to them;
/// - more bytes are asked for only while the prefix or the declared body is incomplete.
///
/// `Err` says which part broke (the fuzz target panics with it).
pub fn check_decode_invariant(bytes: &[u8], limits: &Limits) -> Result<DecodeOutcome, String> {
    let declared_end = declared_body_len(bytes).map(|len| FRAME_PREFIX_LEN.saturating_add(len));
    match decode_frame(bytes, limits) {
        Ok(Some((message, used))) => {
            if used > bytes.len() || Some(used) != declared_end {
                return Err(format!(
                    "used {used} of {} bytes, the prefix declares a frame of {declared_end:?}",
                    bytes.len()
                ));
            }
            let alone = decode_frame(&bytes[..used], limits);
            if alone.as_ref().ok().and_then(Option::as_ref) != Some(&(message.clone(), used)) {
                return Err(format!("the frame alone decodes differently: {alone:?}"));
            }
            same_with_bytes_after(&bytes[..used], limits, &Ok(Some((message.clone(), used))))?;
            if let WireMessage::ImportKey { key, .. } = &message {
                if let Ok(parsed) = crate::region::RemoteKey::from_bytes(key) {
                    if parsed.to_bytes().as_slice() != key.as_slice() {
                        return Err(format!("key bytes {key:?} parse to {parsed:?}, which encodes otherwise"));
                    }
                }
            }
            let again = encode_frame(&message);
            match decode_frame(&again, limits) {
                Ok(Some((back, n))) if n == again.len() && back == message => {}
                other => return Err(format!("{message:?} re-encoded decodes as {other:?}")),
            }
            Ok(DecodeOutcome::Accepted { message, used })
        }
        Ok(None) => {
            let complete = declared_end.is_some_and(|end| bytes.len() >= end);
            if complete {
                return Err(format!("asks for more than the {} bytes of a complete frame", bytes.len()));
            }
            Ok(DecodeOutcome::NeedsMore)
        }
        Err(error) => {
            if let Some(end) = declared_end.filter(|&end| end <= bytes.len()) {
                same_with_bytes_after(&bytes[..end], limits, &Err(error.clone()))?;
            }
            Ok(DecodeOutcome::Rejected(error))
        }
    }
}

/// The body length the prefix declares, once the prefix is there.
fn declared_body_len(bytes: &[u8]) -> Option<usize> {
    let len: [u8; 4] = bytes.get(8..12)?.try_into().ok()?;
    Some(u32::from_le_bytes(len) as usize)
}

/// `frame` followed by more bytes decodes as `frame` did.
fn same_with_bytes_after(
    frame: &[u8],
    limits: &Limits,
    expected: &Result<Option<(WireMessage, usize)>, WireError>,
) -> Result<(), String> {
    let mut longer = frame.to_vec();
    longer.extend_from_slice(b"FLNK\x04\0\0\0\xff");
    let got = decode_frame(&longer, limits);
    if &got != expected {
        return Err(format!("bytes after the frame change its decoding: {expected:?} became {got:?}"));
    }
    Ok(())
}
