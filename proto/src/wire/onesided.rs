//! The messages of one-sided transfers (registrations, `put`, `get`).
//!
//! - `ImportKey` / `ImportAnswer`: a peer presents a key; the owner grants the region it
//!   names (described for this connection) or refuses with a reason.
//! - `Transfer` / `TransferDone`: the initiator asks the side that runs the copies (the
//!   owner of the remote region, on the native lane: the connector) to move the bytes
//!   between its region and the initiator's described memory.
//! - `Prepare` / `RunPrepared` / `Unprepare`: a transfer described once and kept by
//!   the side that runs it, then run by name (`TransferDone` answers each run).
//! - `Notify`: the data of a `put` the initiator moved itself is visible: deliver this
//!   (with a gate: once the GPU wrote the gate word; `NotifyCancelled`: it never will).
//! - `Revoke` / `RevokeDone` / `Unimport`: a grant ends.

use super::device_frame::DeviceFrameDescriptor;
use bincode::{Decode, Encode};

/// Spans one transfer may have.
pub const MAX_SPANS: usize = 1 << 16;
/// Prepared transfers one side keeps for its peer on one connection.
pub const MAX_PREPARED: usize = 1024;
/// Spans of all the prepared transfers one side keeps for its peer on one connection.
pub const MAX_PREPARED_SPANS: usize = 1 << 20;
/// Largest notification.
pub const MAX_NOTIFY_BYTES: usize = 64 << 10;
/// Largest key presented for import (keys are 48 bytes).
pub const MAX_KEY_BYTES: usize = 64;
/// Largest packed UCX remote key.
pub const MAX_RKEY_BYTES: usize = 4096;
/// Bytes a span takes on the wire (three little-endian u64s, `transfer_codec.rs`).
pub(super) const SPAN_WIRE_BYTES: usize = 3 * 8;

/// What a grant lets the importer do (a registration's access).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub enum WireAccess {
    /// Read (`get`).
    Read,
    /// Write (`put`).
    Write,
    /// Both.
    ReadWrite,
}

/// Where granted (or described) memory can be reached by the peer.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum GrantedMemory {
    /// Host memory in a memfd region announced before (`RegionKind::HostGrant`), at
    /// `offset`.
    Host {
        /// The region.
        region_id: u64,
        /// Where the memory starts in it.
        offset: u64,
    },
    /// Device memory, opened as a device frame is.
    Device(DeviceFrameDescriptor),
    /// Memory registered with UCX (`ucp_mem_map`): its address and packed remote key.
    Rma {
        /// Address of its first byte in the owner's process.
        address: u64,
        /// `ucp_rkey_pack`'s bytes.
        rkey: Vec<u8>,
        /// Whether it is device memory.
        device: bool,
    },
    /// Memory its owner reaches only through pinned host memory of its own (device
    /// memory where the two sides' UCX cannot move it directly, or any memory with
    /// `FERRYLINK_UCX_STAGED=1`): the owner runs every transfer on it.
    Staged {
        /// Whether it is device memory.
        device: bool,
    },
    /// One transfer's bytes on the initiator's side, packed span after span (in the
    /// spans' order) in pinned host memory registered with UCX, standing in for the
    /// initiator's memory of kind `device`: a put's bytes copied there, a get's to be
    /// written there by the owner.
    Staging {
        /// Address of its first byte in the initiator's process.
        address: u64,
        /// `ucp_rkey_pack`'s bytes.
        rkey: Vec<u8>,
        /// Whether the memory it stands in for is device memory.
        device: bool,
    },
}

impl GrantedMemory {
    /// Whether the memory (or the memory a staging buffer stands in for) is device
    /// memory.
    pub fn is_device(&self) -> bool {
        match self {
            GrantedMemory::Host { .. } => false,
            GrantedMemory::Device(_) => true,
            GrantedMemory::Rma { device, .. }
            | GrantedMemory::Staged { device }
            | GrantedMemory::Staging { device, .. } => *device,
        }
    }
}

/// A region the owner granted: the importer's handle on it, and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct GrantedRegion {
    /// The owner's id for this grant on this connection.
    pub grant: u64,
    /// Bytes granted.
    pub len: u64,
    /// What the importer may do.
    pub access: WireAccess,
    /// Where it is.
    pub memory: GrantedMemory,
}

/// The owner's answer to `ImportKey`.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum ImportAnswer {
    /// Granted.
    Granted(GrantedRegion),
    /// Refused, with the reason (an unknown, revoked or foreign key, memory this lane
    /// cannot share).
    Refused(String),
}

/// `put` (initiator → remote) or `get` (remote → initiator).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub enum TransferOp {
    /// Into the remote region.
    Put,
    /// Out of the remote region.
    Get,
}

/// A gate word of the connection's control rings (`ferrylink_ipc::control_ring`) and
/// the value the GPU writes there once a transfer's copies are done: a `Notify` sent
/// while they run is delivered when the word reaches it (compared wrapping, as words
/// only count up).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub struct NotifyGate {
    /// The word's index.
    pub index: u32,
    /// The value that opens it.
    pub value: u32,
}

impl NotifyGate {
    /// Whether `word` (the gate word's current value) reached this gate's value.
    pub fn opened_by(&self, word: u32) -> bool {
        (word.wrapping_sub(self.value) as i32) >= 0
    }
}

/// One piece of a transfer: `len` bytes at `local_offset` of the initiator's memory and
/// at `remote_offset` of the granted region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub struct WireSpan {
    /// Offset in the initiator's memory.
    pub local_offset: u64,
    /// Offset in the granted region.
    pub remote_offset: u64,
    /// Bytes.
    pub len: u64,
}

/// A transfer the initiator asks the other side to run (encoded by hand, its spans
/// packed: `transfer_codec.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferMessage {
    /// The initiator's id of the transfer (answered by `TransferDone`).
    pub id: u64,
    /// Which way the bytes go.
    pub op: TransferOp,
    /// The grant (the other side's region) it moves bytes in or out of.
    pub grant: u64,
    /// The initiator's memory, described for this side.
    pub local: GrantedMemory,
    /// Bytes of it the initiator registered.
    pub local_len: u64,
    /// The pieces, in order.
    pub spans: Vec<WireSpan>,
    /// Delivered to the owner of the region after a `Put`'s data is there.
    pub notify: Option<Vec<u8>>,
}

/// How a transfer the other side ran ended.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum TransferOutcome {
    /// Every byte moved.
    Done,
    /// Nothing to rely on moved; why.
    Failed(String),
}
