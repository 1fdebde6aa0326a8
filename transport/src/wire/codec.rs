//! Framing, bounded decoding and validation.

use super::messages::{DeviceFrameDescriptor, DeviceMemory, FrameDescriptor, WireMessage};
use crate::config::Config;
use thiserror::Error;

/// The first bytes of every frame.
pub const MAGIC: [u8; 4] = *b"FLNK";
/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u16 = 4;
/// Bytes before the body: magic, version, reserved, body length.
pub const FRAME_PREFIX_LEN: usize = 12;
/// bincode's own allocation ceiling, whatever the configured limits say.
const BINCODE_LIMIT: usize = 64 << 20;
/// Inline frames of one message may add up to this much.
pub const INLINE_BUDGET: usize = 256 << 10;
/// Bytes a frame descriptor may take on the wire (device descriptors are the largest).
const DESCRIPTOR_WIRE_BYTES: usize = 256;
/// Chunks a staged remote frame may have (its tag has 12 bits for them).
const MAX_REMOTE_CHUNKS: u64 = 1 << 12;
/// Regions whose fds may ride on one message.
pub(crate) const MAX_NEW_REGIONS: usize = ferrylink_ipc::fd_passing::MAX_FDS_PER_CALL;

fn bincode_config() -> impl bincode::config::Config {
    bincode::config::standard().with_little_endian().with_variable_int_encoding().with_limit::<BINCODE_LIMIT>()
}

/// Decoded values are at most this many times larger than their encoding (a frame
/// descriptor of a few encoded bytes is about 170 bytes in memory).
const EXPANSION: usize = 128;

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

impl Limits {
    /// The limits of a configuration.
    pub fn from_config(config: &Config) -> Self {
        Self {
            max_header_bytes: config.max_header_bytes,
            max_frames: config.max_frames,
            max_frame_len: config.max_frame_len,
            inline_threshold: config.inline_threshold,
        }
    }

    /// The largest body a well-formed message under these limits can have.
    pub fn max_body_bytes(&self) -> usize {
        let bound = self
            .max_header_bytes
            .saturating_add(self.max_frames.saturating_mul(DESCRIPTOR_WIRE_BYTES))
            .saturating_add(INLINE_BUDGET)
            .saturating_add(64 << 10);
        bound.min(BINCODE_LIMIT)
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
pub(crate) fn validate(message: &WireMessage, limits: &Limits) -> Result<(), WireError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::*;
    use proptest::prelude::*;

    fn limits() -> Limits {
        Limits::from_config(&Config::default())
    }

    fn hello() -> Hello {
        Hello {
            protocol_version: PROTOCOL_VERSION,
            host: HostIdentity { hostname: "h".into(), boot_id: "b".into() },
            uid: 1000,
            pid: 42,
            policy: WirePolicy::Auto,
            native_available: true,
            ucx: Some(UcxInfo {
                cuda_aware: false,
                worker_address: vec![1, 2, 3],
                tag_prefix: 9,
                tcp_segment: Some("524288".into()),
            }),
            gpus: vec![GpuInfo { ordinal: 0, uuid: [7; 16] }],
            peer_access: vec![(0, 0)],
            device_copies: WireCopies::Connector,
            control_ring: Some(1 << 20),
        }
    }

    fn data() -> DataMessage {
        DataMessage {
            seq: 9,
            header: b"hdr".to_vec(),
            frames: vec![
                FrameDescriptor::Inline(vec![1, 2, 3]),
                FrameDescriptor::DevicePush { len: 4096 },
                FrameDescriptor::DeviceOffered { offer: 2, index: 0, len: 4096, ready: None },
                FrameDescriptor::Remote { len: 1 << 30, device: true, chunk: 8 << 20 },
                FrameDescriptor::HostRegion { region_id: 3, offset: 64, len: 100 },
                FrameDescriptor::Device(DeviceFrameDescriptor {
                    memory: DeviceMemory::LegacyIpc { handle: [5; 64], buffer_id: 11, alloc_len: 1 << 20 },
                    offset: 512,
                    len: 1024,
                    device_uuid: [1; 16],
                    event: Some([2; 64]),
                }),
                FrameDescriptor::Device(DeviceFrameDescriptor {
                    memory: DeviceMemory::Vmm { chunks: vec![1 << 63, (1 << 63) + 1] },
                    offset: 4096,
                    len: 1 << 21,
                    device_uuid: [1; 16],
                    event: None,
                }),
                FrameDescriptor::Device(DeviceFrameDescriptor {
                    memory: DeviceMemory::PoolPointer { pool: 1 << 62, export: [9; 64], alloc_len: 1 << 20 },
                    offset: 0,
                    len: 1 << 20,
                    device_uuid: [1; 16],
                    event: None,
                }),
            ],
        }
    }

    fn all_messages() -> Vec<WireMessage> {
        vec![
            WireMessage::Hello(hello()),
            WireMessage::Welcome { hello: hello(), lane: WireLane::Native, control_ring: true },
            WireMessage::Wake,
            WireMessage::Reject { reason: "no".into() },
            WireMessage::Data(data()),
            WireMessage::Regions(vec![
                RegionAnnouncement::host(3, 4096),
                RegionAnnouncement {
                    region_id: 1 << 63,
                    len: 2 << 20,
                    kind: RegionKind::DeviceVmmChunk { device_uuid: [3; 16] },
                },
                RegionAnnouncement {
                    region_id: (1 << 63) + 1,
                    len: 0,
                    kind: RegionKind::DevicePool { device_uuid: [3; 16] },
                },
            ]),
            WireMessage::Ack { seq: 1, result: AckResult::Delivered },
            WireMessage::Ack { seq: 2, result: AckResult::Refused("size".into()) },
            WireMessage::ForgetRegion { region_id: 5 },
            WireMessage::Goodbye,
            WireMessage::PushTargets { seq: 4, targets: vec![] },
            WireMessage::PushDone { seq: 4 },
            WireMessage::PushOffer { offer: 7, targets: vec![] },
            WireMessage::DeclineOffer { offer: 7 },
        ]
    }

    #[test]
    fn every_message_round_trips() {
        for m in all_messages() {
            let bytes = encode_frame(&m);
            let (back, used) = decode_frame(&bytes, &limits()).unwrap().unwrap();
            assert_eq!(back, m);
            assert_eq!(used, bytes.len());
        }
    }

    #[test]
    fn partial_frames_ask_for_more_and_two_frames_decode_in_turn() {
        let mut bytes = encode_frame(&WireMessage::Data(data()));
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
    fn bad_magic_unknown_version_and_oversize_are_rejected() {
        let mut bytes = encode_frame(&WireMessage::Goodbye);
        bytes[0] = b'G';
        assert!(matches!(decode_frame(&bytes, &limits()), Err(WireError::BadMagic(_))));
        assert!(matches!(decode_frame(b"GET / HTTP/1.1", &limits()), Err(WireError::BadMagic(_))));
        assert!(matches!(decode_frame(b"G", &limits()), Err(WireError::BadMagic(_))));
        let mut bytes = encode_frame(&WireMessage::Goodbye);
        bytes[4] = 99;
        assert_eq!(decode_frame(&bytes, &limits()), Err(WireError::UnknownVersion { found: 99 }));
        let mut bytes = encode_frame(&WireMessage::Goodbye);
        bytes[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decode_frame(&bytes, &limits()), Err(WireError::Oversized { .. })));
    }

    #[test]
    fn trailing_bytes_and_truncated_bodies_are_malformed() {
        let mut bytes = encode_frame(&WireMessage::Goodbye);
        bytes.push(0);
        let len = (bytes.len() - FRAME_PREFIX_LEN) as u32;
        bytes[8..12].copy_from_slice(&len.to_le_bytes());
        assert!(matches!(decode_frame(&bytes, &limits()), Err(WireError::Malformed(_))));
        let mut bytes = encode_frame(&WireMessage::Data(data()));
        let short = (bytes.len() - FRAME_PREFIX_LEN - 5) as u32;
        bytes[8..12].copy_from_slice(&short.to_le_bytes());
        bytes.truncate(FRAME_PREFIX_LEN + short as usize);
        assert!(matches!(decode_frame(&bytes, &limits()), Err(WireError::Malformed(_))));
    }

    #[test]
    fn limits_are_enforced_after_decoding() {
        let tight = Limits { max_header_bytes: 2, max_frames: 2, max_frame_len: 50, inline_threshold: 2 };
        let bytes = encode_frame(&WireMessage::Data(data()));
        let err = decode_frame(&bytes, &tight).unwrap_err();
        assert!(matches!(err, WireError::LimitExceeded(_)), "{err}");
        let mut d = data();
        d.frames = vec![FrameDescriptor::HostRegion { region_id: 1, offset: u64::MAX, len: 2 }];
        let err = decode_frame(&encode_frame(&WireMessage::Data(d)), &limits()).unwrap_err();
        assert!(err.to_string().contains("overflows"), "{err}");
        let mut d = data();
        for f in &mut d.frames {
            if let FrameDescriptor::Device(dev) = f {
                dev.offset = dev.alloc_len().unwrap_or(0);
            }
        }
        let err = decode_frame(&encode_frame(&WireMessage::Data(d)), &limits()).unwrap_err();
        assert!(err.to_string().contains("outside its allocation"), "{err}");
        for chunks in [vec![], vec![7; MAX_VMM_CHUNKS_PER_FRAME + 1]] {
            let mut d = data();
            d.frames = vec![FrameDescriptor::Device(DeviceFrameDescriptor {
                memory: DeviceMemory::Vmm { chunks },
                offset: 0,
                len: 1,
                device_uuid: [0; 16],
                event: None,
            })];
            let err = decode_frame(&encode_frame(&WireMessage::Data(d)), &limits()).unwrap_err();
            assert!(err.to_string().contains("VMM chunks"), "{err}");
        }
        let mut d = data();
        d.frames = (0..40).map(|_| FrameDescriptor::Inline(vec![0; 8 << 10])).collect();
        let err = decode_frame(&encode_frame(&WireMessage::Data(d)), &limits()).unwrap_err();
        assert!(err.to_string().contains("inline bytes"), "{err}");
        let mut d = data();
        d.frames = vec![FrameDescriptor::Remote { len: 1 << 40, device: true, chunk: 1 }];
        let err = decode_frame(&encode_frame(&WireMessage::Data(d)), &limits()).unwrap_err();
        assert!(err.to_string().contains("chunks"), "{err}");
    }

    #[test]
    fn absurd_claimed_lengths_inside_the_body_do_not_allocate() {
        // A Data message whose header claims 2^60 bytes: bincode's limit refuses it.
        let mut body = vec![4u8]; // variant index of Data
        body.push(0); // seq = 0
        body.push(253); // bincode 2's varint marker for a u64 that follows
        body.extend_from_slice(&(1u64 << 60).to_le_bytes());
        let mut frame = Vec::new();
        frame.extend_from_slice(&MAGIC);
        frame.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        frame.extend_from_slice(&[0, 0]);
        frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
        frame.extend_from_slice(&body);
        let err = decode_frame(&frame, &limits()).unwrap_err();
        assert!(err.to_string().contains("imit"), "refused by the allocation limit: {err}");
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = decode_frame(&bytes, &limits());
        }

        #[test]
        fn arbitrary_bodies_behind_a_valid_prefix_never_panic(body in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let mut frame = Vec::new();
            frame.extend_from_slice(&MAGIC);
            frame.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
            frame.extend_from_slice(&[0, 0]);
            frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
            frame.extend_from_slice(&body);
            let _ = decode_frame(&frame, &limits());
        }

        #[test]
        fn mutated_valid_frames_never_panic(index in any::<prop::sample::Index>(), byte in any::<u8>(), which in 0usize..11) {
            let mut bytes = encode_frame(&all_messages()[which]);
            let i = index.index(bytes.len());
            bytes[i] = byte;
            let _ = decode_frame(&bytes, &limits());
        }
    }
}
