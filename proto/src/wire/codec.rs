//! Framing, bounded decoding and validation.

use super::device_frame::{DeviceFrameDescriptor, DeviceMemory};
use super::messages::{FrameDescriptor, WireMessage};
use super::onesided::{
    GrantedMemory, ImportAnswer, TransferMessage, MAX_KEY_BYTES, MAX_NOTIFY_BYTES, MAX_RKEY_BYTES, MAX_SPANS,
    SPAN_WIRE_BYTES,
};
use thiserror::Error;

/// The first bytes of every frame.
pub const MAGIC: [u8; 4] = *b"FLNK";
/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u16 = 10;
/// Bytes before the body: magic, version, reserved, body length.
pub const FRAME_PREFIX_LEN: usize = 12;
/// bincode's own allocation ceiling, whatever the configured limits say.
pub(super) const BINCODE_LIMIT: usize = 64 << 20;
/// Inline frames of one message may add up to this much.
pub const INLINE_BUDGET: usize = 256 << 10;
/// Bytes a frame descriptor may take on the wire: device descriptors are the largest,
/// under 256 bytes plus a u64 (at most 9 bytes) per VMM chunk they name.
pub(super) const DESCRIPTOR_WIRE_BYTES: usize = 256 + 9 * MAX_VMM_CHUNKS_PER_FRAME;
/// Chunks a staged remote frame may have (its tag has 12 bits for them).
pub(super) const MAX_REMOTE_CHUNKS: u64 = 1 << 12;
/// Regions whose fds may ride on one message: as many descriptors as one socket call
/// passes (`ferrylink_ipc::fd_passing::MAX_FDS_PER_CALL`, checked where the transport
/// passes them).
pub const MAX_NEW_REGIONS: usize = 32;

fn bincode_config() -> impl bincode::config::Config {
    bincode::config::standard().with_little_endian().with_variable_int_encoding().with_limit::<BINCODE_LIMIT>()
}

/// Decoded values are at most this many times larger than their encoding (a frame
/// descriptor of a few encoded bytes is about 170 bytes in memory).
pub(super) const EXPANSION: usize = 128;

/// Decodes `body` with bincode's allocation limit scaled to the body: a length claimed
/// inside a small body cannot make the decoder allocate more than that body could hold.
fn decode_body(body: &[u8]) -> Result<(WireMessage, usize), bincode::error::DecodeError> {
    fn with<const N: usize>(body: &[u8]) -> Result<(WireMessage, usize), bincode::error::DecodeError> {
        let config = bincode::config::standard().with_little_endian().with_variable_int_encoding().with_limit::<N>();
        bincode::decode_from_slice(body, config)
    }
    match body.len().saturating_mul(EXPANSION) {
        n if n <= 4 << 10 => with::<{ 4 << 10 }>(body),
        n if n <= 64 << 10 => with::<{ 64 << 10 }>(body),
        n if n <= 1 << 20 => with::<{ 1 << 20 }>(body),
        n if n <= 16 << 20 => with::<{ 16 << 20 }>(body),
        _ => with::<BINCODE_LIMIT>(body),
    }
}

/// What a decoder accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest user header.
    pub max_header_bytes: usize,
    /// Most frames in a message.
    pub max_frames: usize,
    /// Largest frame.
    pub max_frame_len: u64,
    /// Largest inline frame.
    pub inline_threshold: usize,
}

impl Default for Limits {
    /// The limits of ferrylink's default configuration (the transport's `Config`).
    fn default() -> Self {
        Self { max_header_bytes: 1 << 20, max_frames: 4096, max_frame_len: 1 << 40, inline_threshold: 8 << 10 }
    }
}

impl Limits {
    /// The largest body a well-formed message under these limits can have (a data
    /// message, or a one-sided transfer of [`MAX_SPANS`] spans with a notification).
    pub fn max_body_bytes(&self) -> usize {
        let data = self
            .max_header_bytes
            .saturating_add(self.max_frames.saturating_mul(DESCRIPTOR_WIRE_BYTES))
            .saturating_add(INLINE_BUDGET)
            .saturating_add(64 << 10);
        let transfer = (MAX_SPANS * SPAN_WIRE_BYTES + MAX_NOTIFY_BYTES + MAX_RKEY_BYTES + DESCRIPTOR_WIRE_BYTES)
            .saturating_add(64 << 10);
        data.max(transfer).min(BINCODE_LIMIT)
    }
}

/// Why bytes from a peer are not a valid message.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum WireError {
    /// The frame does not start with the magic bytes.
    #[error("not a ferrylink frame (bad magic {0:02x?})")]
    BadMagic([u8; 4]),
    /// The peer speaks another protocol version.
    #[error("unknown protocol version {found} (this side speaks {PROTOCOL_VERSION})")]
    UnknownVersion {
        /// What the peer sent.
        found: u16,
    },
    /// The body is larger than any valid message.
    #[error("message body of {len} bytes exceeds the limit of {max}")]
    Oversized {
        /// Claimed length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The body does not decode.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// The message decodes but breaks a limit.
    #[error("message breaks a limit: {0}")]
    LimitExceeded(String),
}

/// Encodes one message as a frame.
pub fn encode_frame(message: &WireMessage) -> Vec<u8> {
    let mut out = vec![0u8; FRAME_PREFIX_LEN];
    // Encoding into a Vec cannot fail except past BINCODE_LIMIT, which senders never reach
    // because they validate their own messages against the same limits first.
    bincode::encode_into_std_write(message, &mut out, bincode_config()).expect("encoding into a Vec cannot fail");
    let body_len = (out.len() - FRAME_PREFIX_LEN) as u32;
    out[0..4].copy_from_slice(&MAGIC);
    out[4..6].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    out[8..12].copy_from_slice(&body_len.to_le_bytes());
    out
}

/// Decodes the frame at the start of `buf`: `Ok(None)` when more bytes are needed,
/// `Ok(Some((message, bytes_consumed)))` for a complete, valid message.
pub fn decode_frame(buf: &[u8], limits: &Limits) -> Result<Option<(WireMessage, usize)>, WireError> {
    if buf.len() < FRAME_PREFIX_LEN {
        // Reject a bad magic as early as possible (a stray HTTP client, random bytes).
        let seen = buf.len().min(4);
        if buf[..seen] != MAGIC[..seen] {
            let mut magic = [0u8; 4];
            magic[..seen].copy_from_slice(&buf[..seen]);
            return Err(WireError::BadMagic(magic));
        }
        return Ok(None);
    }
    let magic: [u8; 4] = buf[0..4].try_into().expect("4 bytes");
    if magic != MAGIC {
        return Err(WireError::BadMagic(magic));
    }
    let version = u16::from_le_bytes([buf[4], buf[5]]);
    if version != PROTOCOL_VERSION {
        return Err(WireError::UnknownVersion { found: version });
    }
    let body_len = u32::from_le_bytes(buf[8..12].try_into().expect("4 bytes")) as usize;
    let max = limits.max_body_bytes();
    if body_len > max {
        return Err(WireError::Oversized { len: body_len, max });
    }
    let end = FRAME_PREFIX_LEN + body_len;
    if buf.len() < end {
        return Ok(None);
    }
    let body = &buf[FRAME_PREFIX_LEN..end];
    let (message, used) = decode_body(body).map_err(|e| WireError::Malformed(e.to_string()))?;
    if used != body.len() {
        return Err(WireError::Malformed(format!("{} trailing bytes after the message", body.len() - used)));
    }
    validate(&message, limits)?;
    Ok(Some((message, end)))
}

/// Checks a decoded (or about to be encoded) message against the limits.
pub fn validate(message: &WireMessage, limits: &Limits) -> Result<(), WireError> {
    let data = match message {
        WireMessage::Data(data) => data,
        WireMessage::Regions(regions) if regions.len() > MAX_NEW_REGIONS => {
            return Err(WireError::LimitExceeded(format!(
                "{} regions announced at once (at most {MAX_NEW_REGIONS})",
                regions.len()
            )))
        }
        WireMessage::PushTargets { targets, .. } | WireMessage::PushOffer { targets, .. } => {
            for (i, d) in targets.iter().enumerate() {
                check_device_descriptor(d).map_err(|e| WireError::LimitExceeded(format!("push target {i}: {e}")))?;
            }
            if targets.len() > limits.max_frames {
                return Err(WireError::LimitExceeded(format!("{} push targets", targets.len())));
            }
            return Ok(());
        }
        WireMessage::ImportKey { key, .. } if key.len() > MAX_KEY_BYTES => {
            return Err(WireError::LimitExceeded(format!("a key of {} bytes (at most {MAX_KEY_BYTES})", key.len())))
        }
        WireMessage::ImportAnswer { answer: ImportAnswer::Granted(region), .. } => {
            return check_granted_memory(&region.memory).map_err(|e| WireError::LimitExceeded(format!("grant: {e}")))
        }
        WireMessage::Transfer(t) => return check_transfer(t).map_err(WireError::LimitExceeded),
        WireMessage::Prepare(t) if t.notify.is_some() => {
            return Err(WireError::LimitExceeded("a prepared transfer with a notification".into()))
        }
        WireMessage::Prepare(t) => return check_transfer(t).map_err(WireError::LimitExceeded),
        WireMessage::RunPrepared { notify: Some(data), .. } if data.len() > MAX_NOTIFY_BYTES => {
            return Err(WireError::LimitExceeded(format!("a notification of {} bytes", data.len())))
        }
        WireMessage::Notify { data, .. } if data.len() > MAX_NOTIFY_BYTES => {
            return Err(WireError::LimitExceeded(format!("a notification of {} bytes", data.len())))
        }
        _ => return Ok(()),
    };
    if data.header.len() > limits.max_header_bytes {
        return Err(WireError::LimitExceeded(format!(
            "header of {} bytes (at most {})",
            data.header.len(),
            limits.max_header_bytes
        )));
    }
    if data.frames.len() > limits.max_frames {
        return Err(WireError::LimitExceeded(format!("{} frames (at most {})", data.frames.len(), limits.max_frames)));
    }
    let mut inline_total = 0usize;
    for (i, frame) in data.frames.iter().enumerate() {
        if frame.len() > limits.max_frame_len {
            return Err(WireError::LimitExceeded(format!(
                "frame {i} of {} bytes (at most {})",
                frame.len(),
                limits.max_frame_len
            )));
        }
        match frame {
            FrameDescriptor::Inline(bytes) => {
                if bytes.len() > limits.inline_threshold {
                    return Err(WireError::LimitExceeded(format!(
                        "inline frame {i} of {} bytes (at most {})",
                        bytes.len(),
                        limits.inline_threshold
                    )));
                }
                inline_total += bytes.len();
            }
            FrameDescriptor::HostRegion { offset, len, .. } => {
                if offset.checked_add(*len).is_none() {
                    return Err(WireError::LimitExceeded(format!("frame {i}: offset + length overflows")));
                }
            }
            FrameDescriptor::DevicePush { .. } | FrameDescriptor::DeviceOffered { .. } => {}
            FrameDescriptor::Remote { len, chunk, .. } => {
                if *chunk > 0 && len.div_ceil(*chunk) > MAX_REMOTE_CHUNKS {
                    return Err(WireError::LimitExceeded(format!(
                        "frame {i}: {len} bytes in chunks of {chunk} is more than {MAX_REMOTE_CHUNKS} chunks"
                    )));
                }
            }
            FrameDescriptor::Device(d) => {
                check_device_descriptor(d).map_err(|e| WireError::LimitExceeded(format!("device frame {i}: {e}")))?;
            }
        }
    }
    if inline_total > INLINE_BUDGET {
        return Err(WireError::LimitExceeded(format!(
            "{inline_total} inline bytes in one message (at most {INLINE_BUDGET})"
        )));
    }
    Ok(())
}

/// What a transfer message alone can tell: its spans, notification and local memory
/// description are within bounds, and no span overflows.
fn check_transfer(t: &TransferMessage) -> Result<(), String> {
    if t.spans.is_empty() || t.spans.len() > MAX_SPANS {
        return Err(format!("a transfer of {} spans (1 to {MAX_SPANS})", t.spans.len()));
    }
    if t.notify.as_ref().is_some_and(|n| n.len() > MAX_NOTIFY_BYTES) {
        return Err(format!("a notification over {MAX_NOTIFY_BYTES} bytes"));
    }
    for (i, s) in t.spans.iter().enumerate() {
        if s.local_offset.checked_add(s.len).is_none() || s.remote_offset.checked_add(s.len).is_none() {
            return Err(format!("span {i}: offset + length overflows"));
        }
    }
    check_granted_memory(&t.local).map_err(|e| format!("the initiator's memory: {e}"))
}

/// A granted (or described) memory's descriptor is within bounds.
fn check_granted_memory(m: &GrantedMemory) -> Result<(), String> {
    match m {
        GrantedMemory::Host { .. } => Ok(()),
        GrantedMemory::Device(d) => check_device_descriptor(d),
        GrantedMemory::Rma { rkey, .. } | GrantedMemory::Staging { rkey, .. } if rkey.len() > MAX_RKEY_BYTES => {
            Err(format!("a remote key of {} bytes (at most {MAX_RKEY_BYTES})", rkey.len()))
        }
        GrantedMemory::Rma { .. } | GrantedMemory::Staged { .. } | GrantedMemory::Staging { .. } => Ok(()),
    }
}

/// At most this many VMM chunks under one device frame.
pub const MAX_VMM_CHUNKS_PER_FRAME: usize = 64;

/// What the descriptor alone can tell: the frame lies in its allocation, a VMM frame
/// names between 1 and [`MAX_VMM_CHUNKS_PER_FRAME`] chunks (their lengths are checked
/// against the announced regions when the frame is mapped).
fn check_device_descriptor(d: &DeviceFrameDescriptor) -> Result<(), String> {
    let end = d.offset.checked_add(d.len).ok_or("offset + length overflows")?;
    if let Some(alloc_len) = d.alloc_len() {
        if end > alloc_len {
            return Err(format!("{}+{} lies outside its allocation of {alloc_len} bytes", d.offset, d.len));
        }
    }
    if let DeviceMemory::Vmm { chunks } = &d.memory {
        if chunks.is_empty() || chunks.len() > MAX_VMM_CHUNKS_PER_FRAME {
            return Err(format!("{} VMM chunks (1 to {MAX_VMM_CHUNKS_PER_FRAME})", chunks.len()));
        }
    }
    Ok(())
}
