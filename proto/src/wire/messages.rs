//! The messages of the protocol.

use super::device_frame::DeviceFrameDescriptor;
use super::hello::Hello;
use super::hello::WireLane;
use super::onesided::{ImportAnswer, NotifyGate, TransferMessage, TransferOutcome};
use bincode::{Decode, Encode};

/// Everything that travels on a control stream.
#[derive(Debug, Clone, PartialEq, Encode, Decode)]
pub enum WireMessage {
    /// The connecting side introduces itself.
    Hello(Hello),
    /// The accepting side agrees: its own introduction and the lane both ends use.
    Welcome {
        /// The acceptor's introduction.
        hello: Hello,
        /// The negotiated lane.
        lane: WireLane,
        /// Whether the acceptor mapped the connector's control rings: from now on both
        /// sides write their control messages there (`ferrylink_ipc::control_ring`), and
        /// the socket carries only `Wake` messages.
        control_ring: bool,
    },
    /// The connection is refused; the reason is for humans.
    Reject {
        /// Why.
        reason: String,
    },
    /// Shared regions whose fds are attached to this message (`SCM_RIGHTS`), in order.
    /// Later data messages refer to them by id.
    Regions(Vec<RegionAnnouncement>),
    /// A user message: its header and where each frame's bytes can be found.
    Data(DataMessage),
    /// The receiver landed (or refused) message `seq`; the sender may now reuse its buffers.
    Ack {
        /// The acknowledged message.
        seq: u64,
        /// Whether it was delivered.
        result: AckResult,
    },
    /// The sender dropped a shared region whose fd it sent: unmap it.
    ForgetRegion {
        /// The region.
        region_id: u64,
    },
    /// An orderly close.
    Goodbye,
    /// Connector-copies mode: where the connector is to copy the `DevicePush` frames of
    /// message `seq` (buffers the listener allocated and exported), in frame order.
    PushTargets {
        /// The message.
        seq: u64,
        /// One exported buffer per `DevicePush` frame.
        targets: Vec<DeviceFrameDescriptor>,
    },
    /// Connector-copies mode: the connector finished copying message `seq` into the
    /// targets: the listener may deliver it.
    PushDone {
        /// The message.
        seq: u64,
    },
    /// Connector-copies mode: buffers the listener exported ahead of time, for the
    /// connector's next message whose device frames have exactly these lengths, in order.
    /// The connector fills them before it sends that message (its frames are then
    /// `DeviceOffered`), which saves the `PushTargets` round trip.
    PushOffer {
        /// The offer's id (the listener's, increasing).
        offer: u64,
        /// One exported buffer per device frame.
        targets: Vec<DeviceFrameDescriptor>,
        /// `None`: buffers the listener allocated, for the next device message that fits.
        /// `Some(seq)`: the buffers of the listener's posted `recv_into`, for message
        /// `seq` only: the connector fills them with message `seq` or declines them
        /// before it sends message `seq` (at once, when `seq` went before the offer came).
        for_seq: Option<u64>,
    },
    /// Connector-copies mode: the connector will not use offer `offer` (its next message
    /// looks different, or the listener withdrew it); the listener takes the buffers back.
    DeclineOffer {
        /// The offer.
        offer: u64,
    },
    /// Connector-copies mode: the listener wants the buffers of offer `offer` back (the
    /// receive they belong to ended). The connector answers `DeclineOffer` when it has not
    /// used the offer; one it used is answered by the message that fills it.
    WithdrawOffer {
        /// The offer.
        offer: u64,
    },
    /// One-sided: a peer presents a registration's key (`wire/onesided.rs`); answered
    /// by `ImportAnswer` with the same `request`.
    ImportKey {
        /// The importer's id of the request.
        request: u64,
        /// The key's bytes, as the user gave them.
        key: Vec<u8>,
    },
    /// One-sided: the owner grants the region a key named (after the `Regions` it needs),
    /// or refuses.
    ImportAnswer {
        /// The request answered.
        request: u64,
        /// The grant or the reason.
        answer: ImportAnswer,
    },
    /// One-sided: the initiator asks this side to run a transfer (boxed: the largest
    /// message by far, kept off the other messages' size).
    Transfer(Box<TransferMessage>),
    /// One-sided: the initiator prepares a transfer with this side, which runs it each
    /// time `RunPrepared` names it (`id` is the prepared transfer's; no notification).
    Prepare(Box<TransferMessage>),
    /// One-sided: run prepared transfer `prepared` as transfer `id` (answered by
    /// `TransferDone`).
    RunPrepared {
        /// The initiator's id of this transfer.
        id: u64,
        /// The prepared transfer (`Prepare`'s id).
        prepared: u64,
        /// Delivered to the owner of the region after a `Put`'s data is there.
        notify: Option<Vec<u8>>,
    },
    /// One-sided: the initiator dropped prepared transfer `prepared`.
    Unprepare {
        /// The prepared transfer.
        prepared: u64,
    },
    /// One-sided: how transfer `id` ended.
    TransferDone {
        /// The initiator's id of the transfer.
        id: u64,
        /// Done or failed.
        outcome: TransferOutcome,
    },
    /// One-sided: a `put` into grant `grant` is visible (with `gate`: once the gate word
    /// holds its value); deliver `data` to the owner.
    Notify {
        /// The grant written.
        grant: u64,
        /// The notification.
        data: Vec<u8>,
        /// Sent while the copies ran: deliver once this gate opens (or drop it at its
        /// `NotifyCancelled`).
        gate: Option<NotifyGate>,
    },
    /// One-sided: the transfer behind the gated `Notify` with `gate` failed: drop it.
    NotifyCancelled {
        /// The grant of that notification.
        grant: u64,
        /// Its gate.
        gate: NotifyGate,
    },
    /// One-sided: the owner revoked the registration behind `grant`: let go of it and
    /// answer `RevokeDone` once no copy of this side uses it any more.
    Revoke {
        /// The grant.
        grant: u64,
    },
    /// One-sided: the importer no longer uses revoked `grant`.
    RevokeDone {
        /// The grant.
        grant: u64,
    },
    /// One-sided: the importer gave `grant` up (it dropped the remote region).
    Unimport {
        /// The grant.
        grant: u64,
    },
    /// Control-ring mode, on the socket only: wakes a peer that said it may sleep, and
    /// carries the file descriptors (`SCM_RIGHTS`) of the next ring message that needs
    /// some. Otherwise it means nothing.
    Wake,
}

/// The outcome the receiver reports for one message.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum AckResult {
    /// Landed in the receiver's memory.
    Delivered,
    /// Not delivered (for example a `recv_into` target of the wrong size).
    Refused(String),
}

/// One user message.
#[derive(Debug, Clone, PartialEq, Encode, Decode)]
pub struct DataMessage {
    /// Sequence number, consecutive per endpoint and direction, starting at 0.
    pub seq: u64,
    /// The user's header bytes.
    pub header: Vec<u8>,
    /// Where each frame is.
    pub frames: Vec<FrameDescriptor>,
}

/// A shared region whose fd travels with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub struct RegionAnnouncement {
    /// The sender's id for the region.
    pub region_id: u64,
    /// Its length in bytes (0 for a device pool, whose size is not fixed).
    pub len: u64,
    /// What the fd is.
    pub kind: RegionKind,
}

impl RegionAnnouncement {
    /// A host memfd region of `len` bytes.
    pub fn host(region_id: u64, len: u64) -> Self {
        Self { region_id, len, kind: RegionKind::HostMemfd }
    }
}

/// What a region's fd stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub enum RegionKind {
    /// A memfd of host memory (mapped with `mmap`, read-only).
    HostMemfd,
    /// A memfd of host memory a one-sided transfer may write (mapped read-write).
    HostGrant,
    /// One physical chunk of VMM device memory (`cuMemExportToShareableHandle`, POSIX
    /// fd), `len` bytes, imported with `cuMemImportFromShareableHandle` and mapped.
    DeviceVmmChunk {
        /// UUID of the device the memory lives on.
        device_uuid: [u8; 16],
    },
    /// A stream-ordered memory pool (`cuMemPoolExportToShareableHandle`): frames refer to
    /// pointers of it exported one by one.
    DevicePool {
        /// UUID of the device the pool allocates on.
        device_uuid: [u8; 16],
    },
}

/// Where one frame's bytes are.
#[derive(Debug, Clone, PartialEq, Encode, Decode)]
pub enum FrameDescriptor {
    /// A small host frame, carried in the control message.
    Inline(Vec<u8>),
    /// A host frame in a shared region the receiver has (or gets with this message).
    HostRegion {
        /// The region.
        region_id: u64,
        /// Offset of the frame in it.
        offset: u64,
        /// Length of the frame.
        len: u64,
    },
    /// A device frame exported with CUDA IPC.
    Device(DeviceFrameDescriptor),
    /// A device frame the connector will copy into a buffer the listener provides
    /// (connector-copies mode of the native lane).
    DevicePush {
        /// Length of the frame.
        len: u64,
    },
    /// A device frame the connector already copied into target `index` of the
    /// listener's offer `offer` (connector-copies mode of the native lane).
    DeviceOffered {
        /// The offer (see [`WireMessage::PushOffer`]).
        offer: u64,
        /// Which of the offer's buffers.
        index: u32,
        /// Length of the frame.
        len: u64,
        /// An interprocess event the connector recorded after its copy: the bytes are
        /// there once it completed (the listener polls it before delivering).
        ready: Option<[u8; 64]>,
        /// Or a gate word of the connection's control rings the copy's end writes (the
        /// listener reads it before delivering; since protocol version 10).
        gate: Option<NotifyGate>,
    },
    /// A frame whose bytes follow as UCX tagged messages (UCX lane).
    Remote {
        /// Length of the frame.
        len: u64,
        /// Whether it is device memory (lands in device memory).
        device: bool,
        /// 0: one tagged message; otherwise staged in chunks of this many bytes.
        chunk: u64,
    },
}

impl FrameDescriptor {
    /// Length of the frame the descriptor stands for.
    pub fn len(&self) -> u64 {
        match self {
            Self::Inline(bytes) => bytes.len() as u64,
            Self::HostRegion { len, .. } => *len,
            Self::Device(d) => d.len,
            Self::Remote { len, .. } => *len,
            Self::DevicePush { len } => *len,
            Self::DeviceOffered { len, .. } => *len,
        }
    }
    /// Whether the frame is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
