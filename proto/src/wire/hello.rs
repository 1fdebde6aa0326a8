//! The handshake introduction.

use crate::lane_kind::LaneKind;
use crate::policy::{DeviceCopies, LanePolicy};
use bincode::{Decode, Encode};

/// What a side says about itself when it connects.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct Hello {
    /// The protocol version the side speaks.
    pub protocol_version: u16,
    /// Which machine, and which boot of it.
    pub host: HostIdentity,
    /// Effective user id.
    pub uid: u32,
    /// Process id.
    pub pid: u32,
    /// The side's lane policy (`FERRYLINK_TRANSPORT`).
    pub policy: WirePolicy,
    /// Whether the native lane is available on this side.
    pub native_available: bool,
    /// The UCX lane on this side, when UCX could be loaded.
    pub ucx: Option<UcxInfo>,
    /// The side's GPUs.
    pub gpus: Vec<GpuInfo>,
    /// Pairs of device ordinals with peer access (`cuDeviceCanAccessPeer`).
    pub peer_access: Vec<(u32, u32)>,
    /// Who copies device frames on the native lane; the connecting side's choice holds.
    pub device_copies: WireCopies,
    /// The connecting side offers control rings of this many bytes per direction; their
    /// memfd travels with the `Hello` (`SCM_RIGHTS`). `None` from an acceptor, over TCP,
    /// or when turned off (`FERRYLINK_CONTROL_RING_BYTES=0`).
    pub control_ring: Option<u64>,
}

/// Which process runs the copies of device frames on the native lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Encode, Decode)]
pub enum WireCopies {
    /// Each receiver maps the sender's buffer and copies (pull).
    Receiver,
    /// The connecting side runs every copy: it pushes into buffers the listener
    /// exports when it sends, and pulls when it receives. Two processes on one GPU then
    /// never make the GPU switch between their contexts for a transfer.
    Connector,
}

/// Identifies a machine and its current boot: same identity means shared memory works.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct HostIdentity {
    /// `gethostname`.
    pub hostname: String,
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: String,
}

/// A side's UCX.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct UcxInfo {
    /// Whether the loaded UCX handles CUDA memory itself.
    pub cuda_aware: bool,
    /// The side's UCX worker address.
    pub worker_address: Vec<u8>,
    /// The tag prefix the peer must put on payload messages to this side (unique per
    /// connection of this side).
    pub tag_prefix: u16,
    /// The TCP receive segment of this side's UCX (bytes, or as configured), `None`
    /// without TCP. Both sides must agree: UCX aborts a receiver with smaller segments.
    pub tcp_segment: Option<String>,
}

/// One GPU of a side.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct GpuInfo {
    /// CUDA ordinal.
    pub ordinal: u32,
    /// Device UUID.
    pub uuid: [u8; 16],
}

/// A lane as it travels (`Welcome`); the public type is [`LaneKind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub enum WireLane {
    /// [`LaneKind::Native`].
    Native,
    /// [`LaneKind::Ucx`].
    Ucx,
}

/// A lane policy as it travels (`Hello`); the public type is [`LanePolicy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub enum WirePolicy {
    /// [`LanePolicy::Auto`].
    Auto,
    /// [`LanePolicy::Native`].
    Native,
    /// [`LanePolicy::Ucx`].
    Ucx,
}

impl From<LaneKind> for WireLane {
    fn from(lane: LaneKind) -> Self {
        match lane {
            LaneKind::Native => WireLane::Native,
            LaneKind::Ucx => WireLane::Ucx,
        }
    }
}

impl From<WireLane> for LaneKind {
    fn from(lane: WireLane) -> Self {
        match lane {
            WireLane::Native => LaneKind::Native,
            WireLane::Ucx => LaneKind::Ucx,
        }
    }
}

impl From<LanePolicy> for WirePolicy {
    fn from(policy: LanePolicy) -> Self {
        match policy {
            LanePolicy::Auto => WirePolicy::Auto,
            LanePolicy::Native => WirePolicy::Native,
            LanePolicy::Ucx => WirePolicy::Ucx,
        }
    }
}

impl From<WirePolicy> for LanePolicy {
    fn from(policy: WirePolicy) -> Self {
        match policy {
            WirePolicy::Auto => LanePolicy::Auto,
            WirePolicy::Native => LanePolicy::Native,
            WirePolicy::Ucx => LanePolicy::Ucx,
        }
    }
}

impl From<DeviceCopies> for WireCopies {
    fn from(copies: DeviceCopies) -> Self {
        match copies {
            DeviceCopies::Receiver => WireCopies::Receiver,
            DeviceCopies::Connector => WireCopies::Connector,
        }
    }
}

impl From<WireCopies> for DeviceCopies {
    fn from(copies: WireCopies) -> Self {
        match copies {
            WireCopies::Receiver => DeviceCopies::Receiver,
            WireCopies::Connector => DeviceCopies::Connector,
        }
    }
}
