//! The wire format of control messages: bincode 2 behind this one module.
//!
//! Every message on a bootstrap or control stream is one frame:
//!
//! ```text
//! magic "FLNK" (4) | protocol version u16 LE | reserved u16 | body length u32 LE | body
//! ```
//!
//! The body is a bincode-encoded [`WireMessage`]. Decoding is bounded: the body length is
//! checked against [`Limits`] before a byte of it is read, bincode itself runs with a hard
//! allocation limit, and the decoded message is validated (header size, frame count,
//! frame lengths, inline sizes) before anything acts on it. Decoding never panics on
//! arbitrary input, and what it accepts survives a round trip: `check_decode_invariant`
//! states that once, for the fuzz target (`fuzz/`) and the property tests, which feed it
//! mutated and random frames behind valid prefixes, generated messages and the fuzz
//! target's committed seed corpus (one frame per sample of `sample_messages`).
//!
//! bincode 2 carries an "unmaintained" advisory (see `deny.toml`); keeping it behind this
//! module is what makes replacing it a local change.

mod codec;
mod device_frame;
#[cfg(any(test, feature = "testing"))]
mod fuzzing;
mod hello;
mod messages;
mod onesided;
#[cfg(any(test, feature = "testing"))]
mod samples;
#[cfg(test)]
mod tests;
mod transfer_codec;

pub use codec::{
    decode_frame, encode_frame, Limits, WireError, FRAME_PREFIX_LEN, INLINE_BUDGET, MAGIC, MAX_NEW_REGIONS,
    PROTOCOL_VERSION,
};
pub use device_frame::{DeviceFrameDescriptor, DeviceMemory};
#[cfg(any(test, feature = "testing"))]
pub use fuzzing::{check_decode_invariant, DecodeOutcome};
pub use hello::{GpuInfo, Hello, HostIdentity, UcxInfo, WireCopies, WireLane, WirePolicy};
pub use messages::{AckResult, DataMessage, FrameDescriptor, RegionAnnouncement, RegionKind, WireMessage};
pub use onesided::{
    GrantedMemory, GrantedRegion, ImportAnswer, NotifyGate, TransferMessage, TransferOp, TransferOutcome, WireAccess,
    WireSpan, MAX_KEY_BYTES, MAX_NOTIFY_BYTES, MAX_PREPARED, MAX_PREPARED_SPANS, MAX_RKEY_BYTES, MAX_SPANS,
};
#[cfg(any(test, feature = "testing"))]
pub use samples::sample_messages;
