//! The seam between the protocol core and a lane: what the core asks a lane to do with
//! the bytes of a message, and what a lane reports back later.
//!
//! The core decides *what* happens (which wire messages, in which order, when a request
//! completes); a lane moves the bytes (stages, exports, maps, copies, posts transfers).
//! The core calls [`CoreLane`] synchronously from its handlers; work that finishes later
//! (a UCX transfer, copies into an offer) comes back as [`LaneEvent`]s from
//! [`CoreLane::poll`]. Every method has a default that refuses: a lane implements what it
//! carries, and a peer that asks a lane for something it never carries gets a protocol
//! error, so shared code never asks which lane it is on.

use crate::error::TransportError;
use crate::payload::Payload;
use crate::region::{RegistrationInner, RemoteKey};
use crate::wire::{
    DataMessage, DeviceFrameDescriptor, FrameDescriptor, GrantedMemory, GrantedRegion, NotifyGate, RegionAnnouncement,
    TransferOp, WireSpan,
};
use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::Arc;

/// A send turned into its wire description.
pub struct Described {
    /// One descriptor per frame, in order.
    pub frames: Vec<FrameDescriptor>,
    /// Shared regions the peer must map first, with the descriptors to pass.
    pub regions: Vec<(RegionAnnouncement, OwnedFd)>,
    /// Bytes copied into staging memory for this send.
    pub staged_bytes: u64,
    /// Device bytes bounced through the exportable pool (memory nothing could export).
    pub bounced_bytes: u64,
}

/// Why a send could not be described now.
pub enum DescribeError {
    /// Staging memory is full until an earlier send is acknowledged: try again then.
    StagingFull,
    /// This send cannot go: it fails, the connection stays.
    Send(TransportError),
    /// The lane broke: the connection fails (the send stays in flight and ends with it).
    Connection(String),
}

/// Whether the GPU work that produced a send's device frames is done enough for the
/// send to go.
pub enum ProducerState {
    /// The send may be described now.
    Ready,
    /// The producer's work is still running: ask again on the next turn.
    Running,
}

/// What became of a message handed back by a lane.
pub enum Released {
    /// Every frame is back in the message.
    Whole,
    /// The lane still uses some frames (a UCX send not yet complete): it reports
    /// [`LaneEvent::SendFinished`] when they are back.
    Pending,
    /// Some frames stay with the lane (a UCX request that had to be cancelled): the
    /// message cannot be handed back.
    FramesLost,
}

/// A failure a lane reports: the peer's fault (a protocol violation) or a local one.
pub struct LaneFailure {
    /// Whether the peer's descriptor was at fault.
    pub peer_at_fault: bool,
    /// What happened.
    pub reason: String,
}

impl LaneFailure {
    /// The peer sent something that does not hold.
    pub fn peer(reason: impl Into<String>) -> Self {
        Self { peer_at_fault: true, reason: reason.into() }
    }

    /// Something failed on this side.
    pub fn local(reason: impl Into<String>) -> Self {
        Self { peer_at_fault: false, reason: reason.into() }
    }
}

/// Whether a described message's bytes can be read yet (the peer's GPU work on them).
pub enum Readiness {
    /// They can.
    Ready,
    /// Not yet: ask again on the next turn.
    Pending,
    /// Checking failed.
    Failed(LaneFailure),
}

/// What landing a message started.
pub enum Landing<P: Payload> {
    /// The message is in this process's memory.
    Done(P::Message),
    /// The message's copies are enqueued and the stream the receive named waits for
    /// them: it is delivered now, but the peer may reuse its memory only after
    /// [`LaneEvent::CopiesDone`] (the lane keeps what the copies read until then).
    DoneCopying(P::Message),
    /// Connector-copies mode: buffers are allocated and exported; the connector fills
    /// them (`PushTargets` carries these descriptors, after the regions they lie in are
    /// announced) and says `PushDone`.
    AwaitsPush {
        /// Where the connector is to copy each device frame.
        targets: Vec<DeviceFrameDescriptor>,
        /// Regions the targets lie in, with their fds, to announce first.
        regions: Vec<(RegionAnnouncement, OwnedFd)>,
    },
    /// The bytes are on their way (UCX): [`LaneEvent::Landed`] reports the message.
    InProgress,
    /// This side cannot take the message (no memory, no GPU); `into` comes back.
    Refused {
        /// Why.
        reason: String,
        /// The receive's own buffers, handed back.
        into: Option<Vec<P::Frame>>,
    },
    /// The message cannot land and the connection fails (the peer lied, or this side
    /// cannot hold what the lane already started).
    Failed(LaneFailure),
}

/// What a lane made of a posted receive's buffers offered to the connector
/// ([`CoreLane::offer_receive_buffers`]).
pub enum ReceiveOffer<P: Payload> {
    /// Exported: the buffers are the lane's until the offer is filled (they come back as
    /// the message's frames) or taken back ([`CoreLane::take_back_offer`]). The regions
    /// must reach the peer before the offer.
    Made {
        /// The buffers as the connector is to copy into them.
        targets: Vec<DeviceFrameDescriptor>,
        /// Regions the buffers lie in, with their fds, to announce first.
        regions: Vec<(RegionAnnouncement, OwnedFd)>,
    },
    /// Not yet (work queued on a buffer's producer stream still runs): ask again later.
    NotYet(Vec<P::Frame>),
    /// Never for these buffers (host memory, memory that cannot be exported, no CUDA).
    Never(Vec<P::Frame>),
}

/// One-sided, owner side: a registration granted to the peer, described for it.
pub struct LaneGrant<P: Payload> {
    /// The registration granted.
    pub registration: Arc<RegistrationInner<P>>,
    /// How the peer reaches its memory.
    pub memory: GrantedMemory,
    /// Regions the peer must map first (the fds travel with them).
    pub regions: Vec<(RegionAnnouncement, OwnedFd)>,
}

/// One-sided, initiator side: a transfer as the user asked for it (run by this side, or
/// described for the owner, who runs it).
pub struct LocalTransfer<'a, P: Payload> {
    /// Put or get.
    pub op: TransferOp,
    /// This side's registration the transfer reads or writes.
    pub local: &'a Arc<RegistrationInner<P>>,
    /// The imported grant (opened by [`CoreLane::open_grant`]).
    pub grant: u64,
    /// The spans, offsets into the local registration and the grant.
    pub spans: &'a [WireSpan],
    /// The prepared transfer these spans are (the same spans each time it runs), if any.
    pub prepared: Option<u64>,
}

/// One-sided, initiator side: this side's memory of a transfer the owner runs, described
/// for the owner.
#[derive(Debug)]
pub struct DescribedTransfer {
    /// Where the owner reaches it.
    pub memory: GrantedMemory,
    /// Bytes of it the owner may reach.
    pub len: u64,
    /// The spans as the owner is to see them, when the lane moved this side's bytes
    /// elsewhere (a staging buffer); `None`: the user's spans.
    pub spans: Option<Vec<WireSpan>>,
    /// Regions the peer must map first (the fds travel with them).
    pub regions: Vec<(RegionAnnouncement, OwnedFd)>,
}

/// One-sided, owner side: a transfer the peer asked this side to run, between this
/// side's registration and the peer's described memory.
pub struct PeerTransfer<'a, P: Payload> {
    /// Put or get, as the peer (the initiator) sees it.
    pub op: TransferOp,
    /// This side's registration the peer was granted.
    pub registration: &'a Arc<RegistrationInner<P>>,
    /// How this side reaches the peer's memory.
    pub peer_memory: &'a GrantedMemory,
    /// Bytes of the peer's memory this side may reach.
    pub peer_len: u64,
    /// The spans, offsets into the registration and the peer's memory.
    pub spans: &'a [WireSpan],
    /// The peer's prepared transfer these spans are (the same each time it runs), if any.
    pub prepared: Option<u64>,
}

/// A buffer copy into a receive's own buffers that did not fit; the buffers come back.
pub struct CopyMismatch<P: Payload> {
    /// Why it did not fit.
    pub reason: String,
    /// The receive's buffers, handed back.
    pub buffers: Vec<P::Frame>,
}

/// Work a lane finished after the call that started it.
// Clippy cannot size `P::Message` (in `Landed`) here, so it weighs the transfer's
// description against the small variants; built for a real message type the enum is laid
// out as before, and boxing the description would add an allocation per transfer.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum LaneEvent<P: Payload> {
    /// The lane gave back the frames of acknowledged send `seq`.
    SendFinished {
        /// The send's sequence number.
        seq: u64,
    },
    /// Message `seq`, whose landing was [`Landing::InProgress`], is in this process's memory.
    Landed {
        /// The message's sequence number.
        seq: u64,
        /// The message, whole.
        message: P::Message,
    },
    /// The copies of send `seq` into the listener's offer completed.
    OfferedSendDone {
        /// The send's sequence number.
        seq: u64,
    },
    /// The copies of send `seq` into the listener's offer failed.
    OfferedSendFailed {
        /// The send's sequence number.
        seq: u64,
        /// Why.
        reason: String,
    },
    /// The copies of message `seq`, whose landing was [`Landing::DoneCopying`], completed:
    /// the lane let go of the peer's memory they read.
    CopiesDone {
        /// The message's sequence number.
        seq: u64,
    },
    /// One-sided: the copies of transfer `id`, which this side initiated and runs,
    /// finished; or, for a transfer the owner ran, this side's part after the owner's
    /// answer ([`CoreLane::transfer_answered`] said `false`).
    TransferFinished {
        /// The transfer.
        id: u64,
        /// How it ended.
        result: Result<(), String>,
    },
    /// One-sided: this side's memory of transfer `id`, which the owner runs, is ready
    /// for the owner ([`CoreLane::describe_transfer`] said `None`).
    TransferDescribed {
        /// The transfer.
        id: u64,
        /// This side's memory as the owner is to reach it, or why not.
        result: Result<DescribedTransfer, String>,
    },
    /// One-sided: the copies of transfer `id`, which the peer asked for, finished.
    PeerTransferFinished {
        /// The transfer (the peer's id).
        id: u64,
        /// How it ended.
        result: Result<(), String>,
    },
    /// The lane failed: the connection ends.
    Failed {
        /// Why.
        reason: String,
    },
}

/// Refusal of the defaults: this lane never carries what was asked.
fn not_on_this_lane(what: &str) -> LaneFailure {
    LaneFailure::peer(format!("{what}, which this lane never carries"))
}

/// A lane as the protocol core sees it: what the core asks of a lane. Defaults refuse
/// (see the module docs). The driver holds the fuller `lanes::Lane`, of which this is
/// the core's part.
pub trait CoreLane<P: Payload> {
    /// Whether the producer of request `id`'s device frames is done enough for the send
    /// to be described (the lane keeps the ordering marks it recorded).
    fn order_producer(&mut self, _id: u64, _message: &P::Message) -> Result<ProducerState, TransportError> {
        Ok(ProducerState::Ready)
    }

    /// Request `id` left the queue before it was described: forget what the lane keeps
    /// for it (its producer's ordering marks).
    fn discard_send(&mut self, _id: u64) {}

    /// One-sided: whether the GPU work queued on the producer stream that transfer
    /// `id`'s local memory names is done, where someone other than this side's own
    /// copies (which wait for it on the GPU) reads or writes that memory: the peer, or
    /// UCX. The lane records a mark the first time, polls it after, and forgets it once
    /// it answers `Ready` or an error (which fails the transfer).
    fn transfer_producer(&mut self, _id: u64, _t: &LocalTransfer<'_, P>) -> Result<ProducerState, String> {
        Ok(ProducerState::Ready)
    }

    /// Transfer `id` ended while its producer ran: forget its mark.
    fn discard_transfer_producer(&mut self, _id: u64) {}

    /// Describes send `seq` (request `id`). A lane may take frames out of `message`
    /// (UCX sends them from their requests); [`CoreLane::release`] puts them back.
    fn describe(&mut self, id: u64, seq: u64, message: &mut P::Message) -> Result<Described, DescribeError>;

    /// Send `seq` is over for the lane: `acknowledged`, or ended by a failure. Puts
    /// back any frames the lane took and lets go of what it held for the send.
    fn release(&mut self, seq: u64, message: &mut P::Message, acknowledged: bool) -> Released;

    /// Before the connection fails: gives sends the peer acknowledged a bounded moment
    /// to hand their frames back.
    fn settle(&mut self, _acknowledged: &[u64]) {}

    /// Connector-copies mode, connector side: copies send `seq`'s device frames into the
    /// listener's `targets` and waits for the copies.
    fn push(
        &mut self,
        _seq: u64,
        _message: &P::Message,
        _targets: &[DeviceFrameDescriptor],
    ) -> Result<(), LaneFailure> {
        Err(not_on_this_lane("push targets"))
    }

    /// Connector-copies mode, connector side: enqueues the copies of send `seq` into
    /// `offer`'s `targets` and describes its frames (completion: `OfferedSendDone`).
    /// `Err((true, _))`: the offer does not map (the peer's fault).
    fn send_into_offer(
        &mut self,
        _id: u64,
        _seq: u64,
        _message: &P::Message,
        _offer: u64,
        _targets: &[DeviceFrameDescriptor],
    ) -> Result<Vec<FrameDescriptor>, LaneFailure> {
        Err(LaneFailure::local("this lane does not copy into offers"))
    }

    /// Whether the bytes of a described message can be read yet.
    fn readiness(&mut self, _data: &DataMessage) -> Readiness {
        Readiness::Ready
    }

    /// Lands message `data` (into `into` when given, which the core checked against the
    /// descriptors; into `offer`'s buffers when it fills one). `on`: the stream the
    /// receive named; copies this process runs may then end in [`Landing::DoneCopying`]
    /// instead of a host wait.
    fn land(
        &mut self,
        data: &DataMessage,
        into: Option<Vec<P::Frame>>,
        offer: Option<u64>,
        on: Option<&P::Stream>,
    ) -> Landing<P>;

    /// Blocks until the copies of message `seq` (a [`Landing::DoneCopying`]) completed and
    /// lets go of what they read; no [`LaneEvent::CopiesDone`] follows for it.
    fn wait_copies(&mut self, _seq: u64) -> Result<(), LaneFailure> {
        Err(LaneFailure::local("copies waited for on a lane that never leaves them running"))
    }

    /// Connector-copies mode, listener side: the connector filled message `seq`.
    fn finish_push(&mut self, _seq: u64) -> Result<P::Message, LaneFailure> {
        Err(not_on_this_lane("a push"))
    }

    /// Copies a landed message into a receive's own buffers.
    fn copy_into(&mut self, message: &P::Message, buffers: Vec<P::Frame>) -> Result<Vec<P::Frame>, CopyMismatch<P>>;

    /// Listener side: allocates and exports buffers of these lengths for a push offer;
    /// `None` when it cannot (only a missed shortcut).
    fn make_offer(&mut self, _offer: u64, _lens: &[u64]) -> Option<Vec<DeviceFrameDescriptor>> {
        None
    }

    /// Listener side: the connector declined `offer`: its buffers go.
    fn drop_offer(&mut self, _offer: u64) {}

    /// Listener side: exports the buffers of posted receive `recv` for offer `offer`, once
    /// the work queued on their producer streams is done (never blocking: the core asks
    /// again while the answer is [`ReceiveOffer::NotYet`]).
    fn offer_receive_buffers(&mut self, _offer: u64, _recv: u64, buffers: Vec<P::Frame>) -> ReceiveOffer<P> {
        ReceiveOffer::Never(buffers)
    }

    /// Listener side: the buffers of receive offer `offer` back (declined, or the
    /// connection ended); `None` when the lane holds none for it.
    fn take_back_offer(&mut self, _offer: u64) -> Option<Vec<P::Frame>> {
        None
    }

    /// One-sided, owner side: grants the registration `key` names (checked against this
    /// context's registrations: its own, live, the secret matching), described for the
    /// peer; why not.
    fn grant_import(&mut self, _key: &RemoteKey) -> Result<LaneGrant<P>, String> {
        Err("this lane carries no one-sided transfers".into())
    }

    /// One-sided, owner side: a grant of registration `registration` ended.
    fn release_grant(&mut self, _registration: u64) {}

    /// One-sided, importer side: opens the granted region for copies; why not (the
    /// owner's description does not hold).
    fn open_grant(&mut self, _granted: &GrantedRegion) -> Result<(), String> {
        Err("this lane carries no one-sided transfers".into())
    }

    /// One-sided, importer side: lets go of grant `grant` (no copy of this side uses it).
    fn close_grant(&mut self, _grant: u64) {}

    /// One-sided: whether this side runs the copies of transfer `t`, which it initiates
    /// (else the owner of the remote region runs them, `Transfer` messages).
    fn runs_own_transfer(&self, _t: &LocalTransfer<'_, P>) -> bool {
        false
    }

    /// One-sided, initiator side, runs its own: starts transfer `id` (completion:
    /// [`LaneEvent::TransferFinished`]).
    fn start_transfer(&mut self, _id: u64, _t: &LocalTransfer<'_, P>) -> Result<(), String> {
        Err("this lane carries no one-sided transfers".into())
    }

    /// One-sided, initiator side, the owner runs: describes this side's memory of
    /// transfer `id` for the peer, now (`Some`) or, when the lane must first move bytes
    /// (a staging copy), later as [`LaneEvent::TransferDescribed`] (`None`).
    fn describe_transfer(&mut self, _id: u64, _t: &LocalTransfer<'_, P>) -> Result<Option<DescribedTransfer>, String> {
        Err("this lane carries no one-sided transfers".into())
    }

    /// One-sided, initiator side, the owner runs: the owner answered transfer `id`
    /// (`done`: every byte moved), or it ended before the owner was asked (`done` false:
    /// the region went meanwhile). Whether the transfer is over for this side; `false`:
    /// the lane has its own part to finish (a staging copy into the user's memory) and
    /// reports it as [`LaneEvent::TransferFinished`]; an error: that part could not
    /// start (the transfer fails with it).
    fn transfer_answered(&mut self, _id: u64, _done: bool) -> Result<bool, String> {
        Ok(true)
    }

    /// One-sided: whether this lane keeps the peer's prepared transfers it runs (work
    /// done once per prepared transfer, reused by each run), so an initiator describes
    /// one once (`Prepare`) rather than with every transfer. Both sides of a connection
    /// run the same lane: the initiator's answer stands for the owner's.
    fn keeps_prepared_transfers(&self) -> bool {
        false
    }

    /// One-sided: prepared transfer `prepared` ended (`own`: this side's, else the
    /// peer's): what the lane kept for it goes (copies in flight keep what they use).
    fn release_prepared(&mut self, _prepared: u64, _own: bool) {}

    /// One-sided, owner side: runs transfer `id` the peer asked for (completion:
    /// [`LaneEvent::PeerTransferFinished`]).
    fn run_peer_transfer(&mut self, _id: u64, _t: &PeerTransfer<'_, P>) -> Result<(), LaneFailure> {
        Err(not_on_this_lane("one-sided transfers"))
    }

    /// Maps regions the peer announced (their descriptors taken from `fds`, in order).
    fn import_regions(&mut self, list: &[RegionAnnouncement], _fds: &mut VecDeque<OwnedFd>) -> Result<(), String> {
        match list.first() {
            None => Ok(()),
            Some(_) => Err(not_on_this_lane("shared regions").reason),
        }
    }

    /// The peer dropped a region it announced.
    fn forget_region(&mut self, _region_id: u64) {}

    /// Regions this side announced and has dropped since: the peer is told to unmap them.
    fn dropped_regions(&mut self) -> Vec<u64> {
        Vec::new()
    }

    /// Transfer `id` was just started here (`start_transfer`) and has a notification:
    /// the gate its copies' end will open, when the lane has one (the notification then
    /// goes ahead of the copies, `connection/gated.rs`).
    fn early_notify_gate(&mut self, _id: u64) -> Option<NotifyGate> {
        None
    }

    /// Whether the peer's gate `gate` opened (its copies are done); an error (the
    /// connection's protocol error) for a gate that cannot exist here.
    fn gate_open(&self, gate: NotifyGate) -> Result<bool, String> {
        Err(format!("a notification gated on word {}, and this lane has no gate words", gate.index))
    }

    /// Progresses work in flight; appends what finished. Whether anything is pending.
    fn poll(&mut self, _events: &mut Vec<LaneEvent<P>>) -> bool {
        false
    }

    /// Connector side: receive offer `offer` (buffers of the listener's, for the next
    /// message) is held: the lane may open them now, while it is idle, and must let go
    /// of what it opened when the offer is used or given up (`offer_given_up`), or the
    /// lane closes.
    fn offer_received(&mut self, _offer: u64, _targets: &[DeviceFrameDescriptor]) {}

    /// Connector side: receive offer `offer` is given up (declined; a `DeclineOffer`
    /// follows, after which the listener may hand its buffers back): what the lane
    /// opened of them goes now.
    fn offer_given_up(&mut self, _offer: u64) {}

    /// Listener side: whether buffers are lent to the peer (offers made and not yet
    /// used or declined), which it may still copy into.
    fn has_lent_buffers(&self) -> bool {
        false
    }

    /// The connection ends while the peer may still copy into lent buffers: `close`
    /// keeps them until [`CoreLane::release_lent_buffers`] (`recv/hangup.rs`).
    fn hold_lent_buffers(&mut self) {}

    /// The peer hung up: the lent buffers held past `close` go.
    fn release_lent_buffers(&mut self) {}

    /// The connection ended: waits for GPU work that reads what the lane holds, then
    /// lets go of everything (mappings of the peer included), lent buffers held
    /// excepted.
    fn close(&mut self) {}
}

/// The lane of a connection still shaking hands: it carries nothing.
pub struct NoLane;

impl<P: Payload> CoreLane<P> for NoLane {
    fn describe(&mut self, _id: u64, _seq: u64, _message: &mut P::Message) -> Result<Described, DescribeError> {
        Err(DescribeError::Connection("no lane yet".into()))
    }

    fn release(&mut self, _seq: u64, _message: &mut P::Message, _acknowledged: bool) -> Released {
        Released::Whole
    }

    fn land(
        &mut self,
        _data: &DataMessage,
        into: Option<Vec<P::Frame>>,
        _offer: Option<u64>,
        _on: Option<&P::Stream>,
    ) -> Landing<P> {
        drop(into);
        Landing::Failed(LaneFailure::peer("a message before the handshake finished"))
    }

    fn copy_into(&mut self, _message: &P::Message, buffers: Vec<P::Frame>) -> Result<Vec<P::Frame>, CopyMismatch<P>> {
        Err(CopyMismatch { reason: "no lane yet".into(), buffers })
    }
}
