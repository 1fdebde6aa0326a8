//! The native lane: control messages over the Unix socket, data through shared memory.
//!
//! Sending a host frame:
//! - small frames (up to `inline_threshold`) travel inside the control message;
//! - a frame already in a memfd region (`ferrylink_ipc::shared_host_buffer`, a staging
//!   buffer) travels as region id + offset + length, the region's fd passed once;
//! - any other frame is copied once into the endpoint's staging pool (memfd regions the
//!   sender owns) and travels like the above.
//!
//! The receiver copies each frame out into its own memory (or the `recv_into` target),
//! then acknowledges; only then does the sender release staging space and hand the message
//! back. Every descriptor is checked against the mapped region before anything is
//! allocated or copied, so a lying peer gets its connection closed, not our memory read.

use super::conn::{Conn, Phase, PushRole};
use super::device::{Copier, DeviceFrameError, DeviceHold, DeviceLane, ProducerMarks, ProducerOrder};
use super::offers::{device_layout, Offers};
use super::ucx_conn::UcxLanding;
use super::ucx_lane::SendOp;
use crate::config::Config;
use crate::context::ContextStats;
use crate::endpoint::Counters;
use crate::error::{RecvError, SendError, TransportError};
use crate::request::Slot;
use crate::wire::INLINE_BUDGET;
use crate::wire::{encode_frame, AckResult, DataMessage, FrameDescriptor, Limits, RegionAnnouncement, WireMessage};
use ferrylink_ipc::fd_passing::MAX_FDS_PER_CALL;
use ferrylink_ipc::memfd::ImportedMemfd;
use ferrylink_ipc::MemfdPool;
use ferrylink_memory::{DeviceBuffer, Frame, HostBuffer, HostRegion, Message};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How long a pushed message that arrived before its receive waits for one before it
/// lands in pool memory (see `deliver_parked`).
const PUSH_RECV_GRACE: Duration = Duration::from_millis(1);

pub(super) type SendSlot = Arc<Slot<Result<Message, SendError>>>;
pub(super) type RecvSlot = Arc<Slot<Result<Message, RecvError>>>;

struct QueuedSend {
    id: u64,
    message: Message,
    slot: SendSlot,
    /// Device messages: how they are ordered after the producer's work (see
    /// `engine/device.rs`), once decided.
    producer: Option<ProducerOrder>,
    /// The producer's events, when the sending thread recorded them.
    marked: Option<ProducerMarks>,
}

pub(super) struct InFlight {
    pub id: u64,
    pub message: Message,
    /// Staging buffers holding copies of frames; released when the peer acknowledges.
    pub _staging: Vec<HostBuffer>,
    /// Events and bounce buffers of device frames, held until the acknowledgement.
    pub _device: DeviceHold,
    pub slot: SendSlot,
    pub sent_at: Instant,
    /// UCX lane: the frames' tagged sends (each holds its frame until done).
    pub ucx_ops: Vec<SendOp>,
    /// UCX lane: the peer's answer, when it came before every send completed locally.
    pub acked: Option<AckResult>,
    /// Connector-copies mode: the device frames wait for the listener's `PushTargets`.
    pub awaits_targets: bool,
}

impl InFlight {
    /// Puts the frames the UCX sends held back into the message; whether all came back
    /// (a frame UCX still uses stays with the worker until UCX is done with it).
    pub fn take_back_frames(&mut self) -> bool {
        let mut whole = true;
        for op in self.ucx_ops.drain(..) {
            match op.finish() {
                Ok(Some((i, frame))) => self.message.frames[i] = frame,
                Ok(None) => {}
                Err(()) => whole = false,
            }
        }
        whole
    }
}

pub(super) struct PostedRecv {
    pub id: u64,
    pub into: Option<Vec<Frame>>,
    pub slot: RecvSlot,
}

/// A send turned into wire messages.
struct Prepared {
    data: DataMessage,
    announcements: Vec<(RegionAnnouncement, OwnedFd, Weak<dyn HostRegion>)>,
    staging: Vec<HostBuffer>,
    staged_bytes: u64,
    device: DeviceHold,
}

enum LandError {
    /// The peer lied: close the connection.
    Protocol(String),
    /// This side cannot take the message (no GPU, out of device memory): refuse it,
    /// hand the `recv_into` buffers back, keep the connection.
    Refuse(String, Option<Vec<Frame>>),
}

/// Per-connection state of the native lane.
/// Per-connection message state: the native lane's shared memory, and the ordering,
/// matching and acknowledgement logic both lanes share.
pub(crate) struct NativeLane {
    // Sending side.
    pub(super) next_seq: u64,
    staging: MemfdPool,
    staging_region_bytes: usize,
    staging_max_bytes: usize,
    landing_max_bytes: usize,
    pub(super) announced: HashMap<u64, Weak<dyn HostRegion>>,
    queued: VecDeque<QueuedSend>,
    pub(super) in_flight: BTreeMap<u64, InFlight>,
    // Receiving side.
    /// Shared memory received host frames land in: reused when the user drops them, and
    /// sent back without a copy (the fd is already shareable).
    landing: MemfdPool,
    pub(super) expected_seq: u64,
    regions: HashMap<u64, ImportedMemfd>,
    pub(super) posted: VecDeque<PostedRecv>,
    pub(super) landed: VecDeque<Message>,
    pub(super) landed_bytes: usize,
    /// Messages described but not landed yet, with their arrival time.
    pub(super) parked: VecDeque<(DataMessage, Instant)>,
    /// UCX lane: messages whose payload is arriving, in order.
    pub(super) ucx_landing: VecDeque<UcxLanding>,
    /// Connector-copies mode: landed messages waiting for the connector's copies.
    pub(super) awaiting_push: VecDeque<AwaitingPush>,
    /// Connector-copies mode: buffers offered ahead of time (`engine/offers.rs`).
    pub(super) offers: Offers,
}

impl NativeLane {
    pub fn new(config: &Config) -> Self {
        Self {
            next_seq: 0,
            staging: MemfdPool::new("ferrylink-staging", config.staging_region_bytes, config.staging_max_bytes),
            staging_region_bytes: config.staging_region_bytes,
            staging_max_bytes: config.staging_max_bytes,
            landing_max_bytes: config.landing_max_bytes,
            announced: HashMap::new(),
            queued: VecDeque::new(),
            in_flight: BTreeMap::new(),
            landing: MemfdPool::new("ferrylink-landing", config.staging_region_bytes, config.landing_max_bytes),
            expected_seq: 0,
            regions: HashMap::new(),
            posted: VecDeque::new(),
            landed: VecDeque::new(),
            landed_bytes: 0,
            parked: VecDeque::new(),
            ucx_landing: VecDeque::new(),
            awaiting_push: VecDeque::new(),
            offers: Offers::default(),
        }
    }

    /// Ends every pending request with `error` and lets go of shared memory. Messages
    /// that landed whole stay receivable.
    pub fn fail_all(&mut self, error: &TransportError) {
        for q in self.queued.drain(..) {
            q.slot.complete(Err(SendError { error: error.clone(), message: Some(q.message) }));
        }
        for (_, mut f) in std::mem::take(&mut self.in_flight) {
            // Frames still inside UCX requests stay with the UCX worker until it is done
            // with them: the message cannot come back whole then.
            let message = f.take_back_frames().then_some(f.message);
            f.slot.complete(Err(SendError { error: error.clone(), message }));
        }
        for a in self.awaiting_push.drain(..) {
            match a.slot {
                Some(slot) => slot.complete(Err(RecvError { error: error.clone(), buffers: None })),
                None => self.landed_bytes -= a.payload as usize,
            }
        }
        for l in self.ucx_landing.drain(..) {
            match l.slot {
                Some(slot) => slot.complete(Err(RecvError { error: error.clone(), buffers: None })),
                // Its bytes were counted as unclaimed when it started landing.
                None => self.landed_bytes -= l.payload as usize,
            }
        }
        for r in self.posted.drain(..) {
            r.slot.complete(Err(RecvError { error: error.clone(), buffers: r.into }));
        }
        self.parked.clear();
        self.offers.clear(error);
        self.regions.clear();
        self.announced.clear();
        self.staging = MemfdPool::new("ferrylink-staging", self.staging_region_bytes, self.staging_max_bytes);
        // Buffers already delivered keep their regions alive; the idle rest goes now.
        self.landing = MemfdPool::new("ferrylink-landing", self.staging_region_bytes, self.landing_max_bytes);
    }

    /// The oldest unacknowledged message, when it has waited longer than `timeout`.
    pub fn overdue_send(&self, timeout: Duration) -> Option<u64> {
        self.in_flight.iter().find(|(_, f)| f.sent_at.elapsed() > timeout).map(|(&seq, _)| seq)
    }

    pub fn add_stats(&self, s: &mut ContextStats) {
        s.imported_regions += self.regions.len();
        s.imported_bytes += self.regions.values().map(|r| r.len() as u64).sum::<u64>();
        s.staging_mapped_bytes += self.staging.mapped_bytes() as u64;
        s.staging_used_bytes += self.staging.used_bytes() as u64;
        s.landing_mapped_bytes += self.landing.mapped_bytes() as u64;
        s.sends_in_flight += self.queued.len() + self.in_flight.len();
        s.recvs_posted += self.posted.len();
        s.unclaimed_bytes += self.landed_bytes as u64;
    }
}

impl Conn {
    pub fn submit_send(
        &mut self,
        id: u64,
        message: Message,
        slot: SendSlot,
        marked: Option<ProducerMarks>,
        config: &Config,
        limits: &Limits,
    ) {
        if self.phase == Phase::Dead {
            let error = self.error.clone().unwrap_or(TransportError::EndpointClosed);
            slot.complete(Err(SendError { error, message: Some(message) }));
            return;
        }
        if let Err(reason) = check_outgoing(&message, limits) {
            slot.complete(Err(SendError { error: TransportError::InvalidMessage(reason), message: Some(message) }));
            return;
        }
        self.native.queued.push_back(QueuedSend { id, message, slot, producer: None, marked });
        self.pump_sends(config);
    }

    /// Retries sends that wait for their producer's GPU work; lands a pushed message
    /// whose grace for a receive is over; makes a push offer that waited long enough for
    /// a send to ride along with.
    pub fn retry_sends(&mut self, config: &Config) {
        if self.phase != Phase::Established {
            return;
        }
        if self.awaiting_producer {
            self.pump_sends(config);
        }
        if self.awaiting_peer_gpu || self.parked_push().is_some_and(|arrived| arrived.elapsed() >= PUSH_RECV_GRACE) {
            self.deliver_parked(config);
        }
        self.poll_offered_sends();
        self.make_offer(false);
    }

    /// Whether a pushed message waits, within its grace, for a receive: the progress
    /// thread keeps turning (no sleep) until the grace is over.
    pub fn push_waits_for_recv(&self) -> bool {
        self.parked_push().is_some_and(|arrived| arrived.elapsed() < PUSH_RECV_GRACE)
    }

    /// When the first parked message is a push and no receive is posted: its arrival.
    fn parked_push(&self) -> Option<Instant> {
        if self.ucx.is_some() || !self.native.posted.is_empty() {
            return None;
        }
        let (data, arrived) = self.native.parked.front()?;
        data.frames.iter().any(|f| matches!(f, FrameDescriptor::DevicePush { .. })).then_some(*arrived)
    }

    /// [`Conn::pump_sends`] for the UCX lane's completions.
    pub(super) fn pump_sends_pub(&mut self, config: &Config) {
        self.pump_sends(config);
    }

    /// Turns queued sends into wire messages while staging room lasts.
    fn pump_sends(&mut self, config: &Config) {
        self.forget_dropped_regions();
        self.awaiting_producer = false;
        let mut sent_data = false;
        while let Some(mut q) = self.native.queued.pop_front() {
            let mut marks = ProducerMarks::default();
            if q.message.frames.iter().any(|f| f.as_device().is_some()) {
                if q.producer.is_none() {
                    let copier = match (self.ucx.is_some(), self.push) {
                        (true, _) => Copier::Ucx,
                        (false, PushRole::Pusher) => Copier::Local,
                        (false, _) => Copier::Peer,
                    };
                    let order = match q.marked.take() {
                        Some(marks) => Ok(ProducerOrder::with_marks(marks, copier)),
                        None => self.device.order_producers(&q.message, copier),
                    };
                    match order {
                        Ok(order) => q.producer = Some(order),
                        Err(e) => {
                            q.slot.complete(Err(SendError { error: send_error(e), message: Some(q.message) }));
                            continue;
                        }
                    }
                }
                match q.producer.take() {
                    Some(ProducerOrder::Poll(marks)) => match marks.all_done() {
                        Ok(true) => {
                            tracing::trace!("producer's work done");
                            q.producer = Some(ProducerOrder::Done)
                        }
                        Ok(false) => {
                            // The producer's GPU work is still running: try again next turn.
                            q.producer = Some(ProducerOrder::Poll(marks));
                            self.native.queued.push_front(q);
                            self.awaiting_producer = true;
                            break;
                        }
                        Err(e) => {
                            q.slot.complete(Err(SendError { error: send_error(e), message: Some(q.message) }));
                            continue;
                        }
                    },
                    Some(ProducerOrder::GpuWait(m)) => marks = m,
                    Some(ProducerOrder::Done) | None => q.producer = Some(ProducerOrder::Done),
                }
                if let Some(offer) = self.take_fitting_offer(&q.message) {
                    self.send_into_offer(q.message, q.slot, offer, marks);
                    sent_data = true;
                    if self.phase == Phase::Dead {
                        return;
                    }
                    continue;
                }
            }
            match self.prepare(&q.message, &mut marks, config) {
                Ok(Some(prepared)) => {
                    self.write_prepared(q, prepared);
                    sent_data = true;
                }
                Ok(None) => {
                    if !marks.is_empty() {
                        q.producer = Some(ProducerOrder::GpuWait(marks));
                    }
                    self.native.queued.push_front(q);
                    break;
                }
                Err(error) => q.slot.complete(Err(SendError { error, message: Some(q.message) })),
            }
        }
        self.flush();
        if sent_data {
            // A wanted push offer follows the data, written after it (its allocation
            // and export would otherwise delay the data).
            self.make_offer(true);
        }
    }

    fn write_prepared(&mut self, q: QueuedSend, prepared: Prepared) {
        let Prepared { data, announcements, staging, staged_bytes, device } = prepared;
        let mut announcements = announcements.into_iter().peekable();
        while announcements.peek().is_some() {
            let mut list = Vec::new();
            let mut fds = Vec::new();
            for (announcement, fd, weak) in announcements.by_ref().take(MAX_FDS_PER_CALL) {
                self.native.announced.insert(announcement.region_id, weak);
                list.push(announcement);
                fds.push(fd);
            }
            self.queue(encode_frame(&WireMessage::Regions(list)), fds);
        }
        let seq = data.seq;
        let pushed = data.frames.iter().any(|f| matches!(f, FrameDescriptor::DevicePush { .. }));
        let descriptors = if self.ucx.is_some() { data.frames.clone() } else { Vec::new() };
        self.queue(encode_frame(&WireMessage::Data(data)), Vec::new());
        tracing::trace!(seq, pushed, "data message queued");
        if let Some(c) = self.counters() {
            Counters::add(&c.staged_bytes, staged_bytes);
        }
        let mut flight = InFlight {
            id: q.id,
            message: q.message,
            _staging: staging,
            _device: device,
            slot: q.slot,
            sent_at: Instant::now(),
            ucx_ops: Vec::new(),
            acked: None,
            awaits_targets: pushed,
        };
        if self.ucx.is_some() {
            if let Err(reason) = self.ucx_post_sends(seq, &descriptors, &mut flight) {
                self.native.in_flight.insert(seq, flight);
                self.native.next_seq += 1;
                return self.fail_peer(reason);
            }
        }
        self.native.in_flight.insert(seq, flight);
        self.native.next_seq += 1;
    }

    /// Describes `message`'s frames; `Ok(None)` when staging is full for now.
    /// `producer` moves into the prepared send's hold when it succeeds.
    fn prepare(
        &mut self,
        message: &Message,
        producer: &mut ProducerMarks,
        config: &Config,
    ) -> Result<Option<Prepared>, TransportError> {
        if let Some(ucx) = &self.ucx {
            let data = super::ucx_conn::describe_for_ucx(message, self.native.next_seq, ucx, config)?;
            return Ok(Some(Prepared {
                data,
                announcements: Vec::new(),
                staging: Vec::new(),
                staged_bytes: 0,
                device: DeviceHold::default(),
            }));
        }
        let native = &mut self.native;
        let mut frames = Vec::with_capacity(message.frames.len());
        let mut announcements: Vec<(RegionAnnouncement, OwnedFd, Weak<dyn HostRegion>)> = Vec::new();
        let mut staging = Vec::new();
        let mut staged_bytes = 0u64;
        let mut inline_total = 0usize;
        for frame in &message.frames {
            let host = match frame {
                Frame::Host(h) => h,
                Frame::Device(_) => {
                    // Filled in below, once staging room for the host frames is certain.
                    frames.push(None);
                    continue;
                }
            };
            let len = host.len();
            if len <= config.inline_threshold && inline_total + len <= INLINE_BUDGET {
                inline_total += len;
                frames.push(Some(FrameDescriptor::Inline(host.to_vec())));
                continue;
            }
            let shared = host.region().filter(|(r, _)| r.shareable_fd().is_some()).map(|(r, off)| (r.clone(), off));
            let (region, offset) = match shared {
                Some(found) => found,
                None => {
                    let mut buf = match native.staging.alloc(len) {
                        Ok(Some(buf)) => buf,
                        Ok(None) if native.in_flight.is_empty() && staging.is_empty() => {
                            return Err(TransportError::InvalidMessage(format!(
                                "a host frame of {len} bytes does not fit the staging limit of {} bytes; \
                                 send it from a shared buffer (ferrylink_ipc::shared_host_buffer) instead",
                                config.staging_max_bytes
                            )))
                        }
                        Ok(None) => return Ok(None),
                        Err(e) => {
                            return Err(TransportError::Unsupported(format!("cannot create staging memory: {e}")))
                        }
                    };
                    buf.as_mut_slice().copy_from_slice(host.as_slice());
                    staged_bytes += len as u64;
                    let (r, off) = buf.region().map(|(r, off)| (r.clone(), off)).expect("staging buffers are regions");
                    staging.push(buf);
                    (r, off)
                }
            };
            let region_id = region.region_id();
            let already = native.announced.contains_key(&region_id)
                || announcements.iter().any(|(a, _, _)| a.region_id == region_id);
            if !already {
                let fd = region
                    .shareable_fd()
                    .expect("checked above")
                    .try_clone_to_owned()
                    .map_err(|e| TransportError::Unsupported(format!("cannot duplicate a region's fd: {e}")))?;
                let announcement = RegionAnnouncement { region_id, len: region.len() as u64 };
                announcements.push((announcement, fd, Arc::downgrade(&region)));
            }
            frames.push(Some(FrameDescriptor::HostRegion { region_id, offset: offset as u64, len: len as u64 }));
        }
        let mut device = DeviceHold::default();
        device.producer = std::mem::take(producer);
        let device_frames: Vec<&DeviceBuffer> = message.frames.iter().filter_map(Frame::as_device).collect();
        let mut device_descs = if self.push == PushRole::Pusher {
            // Connector-copies mode: the listener provides the buffers (PushTargets).
            device_frames.iter().map(|d| FrameDescriptor::DevicePush { len: d.len() as u64 }).collect::<Vec<_>>()
        } else if device_frames.is_empty() {
            Vec::new()
        } else {
            let descs = self.device.export(&device_frames, &mut device).map_err(send_error)?;
            descs.into_iter().map(FrameDescriptor::Device).collect()
        }
        .into_iter();
        let frames = frames
            .into_iter()
            .map(|f| f.unwrap_or_else(|| device_descs.next().expect("one per device frame")))
            .collect();
        let data = DataMessage { seq: native.next_seq, header: message.header.clone(), frames };
        Ok(Some(Prepared { data, announcements, staging, staged_bytes, device }))
    }

    /// Tells the peer to unmap regions this process has dropped.
    pub(super) fn forget_dropped_regions(&mut self) {
        let dropped: Vec<u64> =
            self.native.announced.iter().filter(|(_, w)| w.strong_count() == 0).map(|(&id, _)| id).collect();
        for region_id in dropped {
            self.native.announced.remove(&region_id);
            self.queue(encode_frame(&WireMessage::ForgetRegion { region_id }), Vec::new());
        }
    }

    pub fn submit_recv(&mut self, id: u64, into: Option<Vec<Frame>>, slot: RecvSlot, config: &Config) {
        if self.phase == Phase::Dead && self.native.landed.is_empty() {
            let error = self.error.clone().unwrap_or(TransportError::EndpointClosed);
            slot.complete(Err(RecvError { error, buffers: into }));
            return;
        }
        self.native.posted.push_back(PostedRecv { id, into, slot });
        self.match_posted(config);
    }

    /// Gives landed messages to posted receives, in order, then lands what waits.
    pub(super) fn match_posted(&mut self, config: &Config) {
        self.pair_landed();
        if self.phase == Phase::Dead {
            let error = self.error.clone().unwrap_or(TransportError::EndpointClosed);
            for r in self.native.posted.drain(..) {
                r.slot.complete(Err(RecvError { error: error.clone(), buffers: r.into }));
            }
            return;
        }
        self.deliver_parked(config);
    }

    /// Gives landed messages to posted receives, in order.
    fn pair_landed(&mut self) {
        while !self.native.landed.is_empty() && !self.native.posted.is_empty() {
            let message = self.native.landed.pop_front().expect("checked");
            let recv = self.native.posted.pop_front().expect("checked");
            self.native.landed_bytes -= message.payload_len();
            match recv.into {
                None => recv.slot.complete(Ok(message)),
                Some(buffers) => {
                    if message.frames.iter().any(|f| f.as_device().is_some()) {
                        // This receiver copies device frames out of landed memory: offers
                        // would only add such copies (see `engine/offers.rs`).
                        self.native.offers.pause();
                    }
                    match copy_landed_into(&self.device, &message, buffers) {
                        Ok(filled) => recv.slot.complete(Ok(Message { header: message.header, frames: filled })),
                        Err((reason, buffers)) => {
                            self.native.landed_bytes += message.payload_len();
                            self.native.landed.push_front(message);
                            recv.slot.complete(Err(RecvError {
                                error: TransportError::BufferMismatch(reason),
                                buffers: Some(buffers),
                            }));
                        }
                    }
                }
            }
        }
    }

    /// A request's waiter timed out.
    pub fn cancel(&mut self, id: u64, config: &Config) {
        let timed_out = TransportError::TimedOut(config.request_timeout);
        if let Some(i) = self.native.queued.iter().position(|q| q.id == id) {
            let q = self.native.queued.remove(i).expect("index exists");
            q.slot.complete(Err(SendError { error: timed_out, message: Some(q.message) }));
        } else if let Some(i) = self.native.posted.iter().position(|r| r.id == id) {
            let r = self.native.posted.remove(i).expect("index exists");
            r.slot.complete(Err(RecvError { error: timed_out, buffers: r.into }));
        } else if let Some(seq) = self.native.in_flight.iter().find(|(_, f)| f.id == id).map(|(&s, _)| s) {
            // The peer holds our memory and has not answered in time: treat it as dead.
            self.fail_peer(format!("message {seq} not acknowledged within {:?}", config.request_timeout));
        }
    }

    pub fn handle_lane_message(&mut self, message: WireMessage, config: &Config) {
        match message {
            WireMessage::Regions(list) => self.import_regions(list, config),
            WireMessage::Data(data) => {
                if data.seq != self.native.expected_seq {
                    let expected = self.native.expected_seq;
                    return self.protocol_error(&format!("message {} arrived where {expected} was due", data.seq));
                }
                self.native.expected_seq += 1;
                self.native.parked.push_back((data, Instant::now()));
                self.deliver_parked(config);
            }
            WireMessage::Ack { seq, result } => {
                let Some(mut flight) = self.native.in_flight.remove(&seq) else {
                    return self.protocol_error(&format!("acknowledgement of unknown message {seq}"));
                };
                if flight.acked.is_some() || flight.awaits_targets {
                    return self.protocol_error(&format!("message {seq} acknowledged out of turn"));
                }
                if !flight.ucx_ops.is_empty() {
                    // UCX lane: hand the message back once every send gave its frame back.
                    flight.acked = Some(result);
                    self.native.in_flight.insert(seq, flight);
                    return;
                }
                self.complete_send(flight, result);
                self.pump_sends(config);
            }
            WireMessage::ForgetRegion { region_id } => {
                self.native.regions.remove(&region_id);
            }
            WireMessage::PushTargets { seq, targets } if self.push == PushRole::Pusher => {
                self.push_message(seq, targets, config)
            }
            WireMessage::PushDone { seq } if self.push == PushRole::Target => self.push_done(seq, config),
            WireMessage::PushOffer { offer, targets } => self.on_push_offer(offer, targets),
            WireMessage::DeclineOffer { offer } => self.on_decline_offer(offer),
            other => self.protocol_error(&format!("unexpected message {}", super::conn::kind(&other))),
        }
    }

    /// Connector-copies mode, connector side: fill the listener's buffers, say so, and
    /// hand the message back.
    fn push_message(&mut self, seq: u64, targets: Vec<crate::wire::DeviceFrameDescriptor>, config: &Config) {
        let Some(mut flight) = self.native.in_flight.remove(&seq) else {
            return self.protocol_error(&format!("push targets for unknown message {seq}"));
        };
        if !flight.awaits_targets {
            self.native.in_flight.insert(seq, flight);
            return self.protocol_error(&format!("push targets for message {seq}, which has none to fill"));
        }
        flight.awaits_targets = false;
        let peer_pid = self.shared.as_ref().map_or(0, |s| s.peer.pid);
        let sources: Vec<&DeviceBuffer> = flight.message.frames.iter().filter_map(Frame::as_device).collect();
        match self.device.push_into(peer_pid, &sources, &targets, &flight._device.producer) {
            Ok(()) => {
                self.queue(encode_frame(&WireMessage::PushDone { seq }), Vec::new());
                self.complete_send(flight, AckResult::Delivered);
                self.pump_sends(config);
            }
            Err(e) => {
                let bad = matches!(e, DeviceFrameError::BadDescriptor(_));
                self.native.in_flight.insert(seq, flight);
                let reason = format!("copying message {seq} into the listener's buffers: {}", describe(e));
                if bad {
                    self.protocol_error(&reason)
                } else {
                    self.fail_peer(reason)
                }
            }
        }
    }

    /// Connector-copies mode, listener side: the connector filled message `seq`.
    fn push_done(&mut self, seq: u64, config: &Config) {
        if self.native.awaiting_push.front().is_none_or(|a| a.seq != seq) {
            return self.protocol_error(&format!("push of message {seq} done out of turn"));
        }
        let AwaitingPush { landed, slot, payload, into_callers_buffers, .. } =
            self.native.awaiting_push.pop_front().expect("checked");
        let Landed { mut message, copy_back, .. } = landed;
        for (i, user) in copy_back {
            if let (Frame::Device(pooled), Frame::Device(dst)) = (&message.frames[i], &user) {
                if let Err(e) = self.device.copy_device_to_device(pooled, dst) {
                    return self.fail_peer(describe(e));
                }
            }
            message.frames[i] = user;
        }
        if let Some(c) = self.counters() {
            Counters::add(&c.messages_received, 1);
            Counters::add(&c.payload_bytes_received, payload);
        }
        // Receives into the caller's buffers get no offers (see `deliver_parked`).
        let layout = if into_callers_buffers { None } else { device_layout(&message) };
        if slot.is_some() && !into_callers_buffers {
            self.native.offers.resume();
        }
        match slot {
            Some(slot) => slot.complete(Ok(message)),
            None => self.native.landed.push_back(message),
        }
        self.want_offer(layout, config);
        self.match_posted(config);
    }

    /// Hands an acknowledged message back to its sender.
    pub(super) fn complete_send(&mut self, flight: InFlight, result: AckResult) {
        match result {
            AckResult::Delivered => {
                if let Some(c) = self.counters() {
                    Counters::add(&c.messages_sent, 1);
                    Counters::add(&c.payload_bytes_sent, flight.message.payload_len() as u64);
                }
                flight.slot.complete(Ok(flight.message));
            }
            AckResult::Refused(reason) => {
                let peer = self.peer.clone();
                flight.slot.complete(Err(SendError {
                    error: TransportError::Refused { peer, reason },
                    message: Some(flight.message),
                }));
            }
        }
    }

    fn import_regions(&mut self, list: Vec<RegionAnnouncement>, config: &Config) {
        if self.fds_in.len() < list.len() {
            let have = self.fds_in.len();
            return self.protocol_error(&format!("{} regions announced but {have} descriptors arrived", list.len()));
        }
        for announcement in list {
            let fd = self.fds_in.pop_front().expect("counted above");
            match ImportedMemfd::import(fd, config.max_region_bytes) {
                Ok(region) if region.len() as u64 == announcement.len => {
                    self.native.regions.insert(announcement.region_id, region);
                }
                Ok(region) => {
                    return self.protocol_error(&format!(
                        "region {} announced as {} bytes is {} bytes",
                        announcement.region_id,
                        announcement.len,
                        region.len()
                    ))
                }
                Err(e) => return self.protocol_error(&format!("region {}: {e}", announcement.region_id)),
            }
        }
    }

    /// Lands parked messages while someone waits for them or the unclaimed budget allows.
    fn deliver_parked(&mut self, config: &Config) {
        self.awaiting_peer_gpu = false;
        while let Some((front, arrived)) = self.native.parked.front() {
            // The peer's GPU work on the frames (its producer's, or its copies into our
            // offer) must be done: poll its ready events; `retry_sends` comes back.
            if self.ucx.is_none() {
                let ready: Vec<([u8; 64], Option<usize>)> = front
                    .frames
                    .iter()
                    .filter_map(|f| match f {
                        FrameDescriptor::Device(d) => d.event.map(|h| (h, DeviceLane::visible_device(&d.device_uuid))),
                        FrameDescriptor::DeviceOffered { ready, .. } => ready.map(|h| (h, None)),
                        _ => None,
                    })
                    .collect();
                let peer_pid = self.shared.as_ref().map_or(0, |s| s.peer.pid);
                match self.device.events_ready(peer_pid, &ready) {
                    Ok(true) if !ready.is_empty() => tracing::trace!("peer's ready events complete"),
                    Ok(true) => {}
                    Ok(false) => {
                        self.awaiting_peer_gpu = true;
                        break;
                    }
                    // No CUDA here: landing refuses the message, the connection stays.
                    Err(DeviceFrameError::NoCuda(_)) => {}
                    Err(DeviceFrameError::BadDescriptor(e)) => return self.protocol_error(&e),
                    Err(e) => {
                        let reason = format!("polling the peer's ready event: {}", describe(e));
                        return self.fail_peer(reason);
                    }
                }
            }
            let payload: u64 = front.frames.iter().map(FrameDescriptor::len).sum();
            let is_push = front.frames.iter().any(|f| matches!(f, FrameDescriptor::DevicePush { .. }));
            let arrived = *arrived;
            // A receive may take a message as it lands only when no unclaimed message is
            // still landing ahead of it (UCX landings complete later, in order).
            let unclaimed_ahead = self.native.ucx_landing.iter().any(|l| l.slot.is_none())
                || self.native.awaiting_push.iter().any(|a| a.slot.is_none());
            let recv = if unclaimed_ahead { None } else { self.native.posted.pop_front() };
            if recv.is_none() && is_push && arrived.elapsed() < PUSH_RECV_GRACE {
                // A pushed message waits a moment for its receive, so a `recv_into` posted
                // just after it arrived gets the connector's copy directly (landing it in
                // pool memory now would cost this side a copy later). `poll_parked` lands
                // it once the grace is over.
                break;
            }
            if recv.is_none()
                && self.native.landed_bytes > 0
                && self.native.landed_bytes as u64 + payload > config.unexpected_max_bytes as u64
            {
                if let Some(r) = recv {
                    self.native.posted.push_front(r);
                }
                break;
            }
            let (data, _) = self.native.parked.pop_front().expect("front exists");
            if self.ucx.is_some() {
                self.ucx_start_landing(data, recv, payload, config);
                if self.phase == Phase::Dead {
                    return;
                }
                continue;
            }
            // Connector-copies mode: a message the connector already copied into our offer.
            let offered = match self.take_offered(&data) {
                Ok(offered) => offered,
                Err(reason) => {
                    if let Some(r) = recv {
                        self.native.posted.push_front(r);
                    }
                    return self.protocol_error(&reason);
                }
            };
            let is_offered = offered.is_some();
            // Offers pay only when receives take the transport's memory: a receive into
            // the caller's buffers costs this side a copy out of the offer (a GPU context
            // switch on a shared GPU), where a push lands in those buffers directly.
            let mut offer_again = true;
            let recv = match recv {
                // Already in our memory: it lands as it is, and `pair_landed` copies it into
                // the caller's buffers (a failure there hands them back, the message stays).
                Some(r) if is_offered && r.into.is_some() => {
                    self.native.posted.push_front(r);
                    offer_again = false;
                    None
                }
                other => other,
            };
            let recv_id = recv.as_ref().map(|r| r.id);
            let (mut into, mut slot) = match recv {
                Some(r) => (r.into, Some(r.slot)),
                None => (None, None),
            };
            // Buffers that do not fit fail that receive only; the message lands in fresh
            // memory and stays for the next receive, so nothing is lost.
            if let Some(buffers) = into.take() {
                match check_targets(&data.frames, &buffers) {
                    Ok(()) => into = Some(buffers),
                    Err(reason) => {
                        if let Some(slot) = slot.take() {
                            let error = TransportError::BufferMismatch(reason);
                            slot.complete(Err(RecvError { error, buffers: Some(buffers) }));
                        }
                    }
                }
            }
            let into_callers_buffers = into.is_some();
            let started = Instant::now();
            let landed = self.land(&data, into, offered, config);
            tracing::trace!(seq = data.seq, us = started.elapsed().as_micros() as u64, "message landed");
            match landed {
                Ok(landed) if !landed.push_targets.is_empty() => {
                    let targets = landed.push_targets.clone();
                    self.queue(encode_frame(&WireMessage::PushTargets { seq: data.seq, targets }), Vec::new());
                    if slot.is_none() {
                        self.native.landed_bytes += payload as usize;
                    }
                    self.native.awaiting_push.push_back(AwaitingPush {
                        seq: data.seq,
                        landed,
                        slot,
                        payload,
                        into_callers_buffers,
                    });
                }
                Ok(Landed { message, .. }) => {
                    // An offered message is not acknowledged: its sender is done already.
                    if !is_offered {
                        let ack = WireMessage::Ack { seq: data.seq, result: AckResult::Delivered };
                        self.queue(encode_frame(&ack), Vec::new());
                    }
                    if let Some(c) = self.counters() {
                        Counters::add(&c.messages_received, 1);
                        Counters::add(&c.payload_bytes_received, payload);
                    }
                    let layout = if is_offered && offer_again { device_layout(&message) } else { None };
                    if is_offered && slot.is_some() {
                        self.native.offers.resume();
                    }
                    match slot {
                        Some(slot) => {
                            tracing::trace!("message delivered to a receive");
                            slot.complete(Ok(message))
                        }
                        None => {
                            self.native.landed_bytes += message.payload_len();
                            self.native.landed.push_back(message);
                        }
                    }
                    self.want_offer(layout, config);
                }
                Err(LandError::Refuse(reason, buffers)) if is_offered => {
                    // Cannot happen (an offered message needs no memory or mapping); its
                    // sender expects no answer, so it could not be told of a refusal.
                    if let (Some(slot), Some(id)) = (slot, recv_id) {
                        self.native.posted.push_front(PostedRecv { id, into: buffers, slot });
                    }
                    return self.fail_peer(format!("offered message {} could not land: {reason}", data.seq));
                }
                Err(LandError::Refuse(reason, buffers)) => {
                    tracing::warn!("refusing message {} from {}: {reason}", data.seq, self.peer);
                    let ack = WireMessage::Ack { seq: data.seq, result: AckResult::Refused(reason) };
                    self.queue(encode_frame(&ack), Vec::new());
                    // The receive got nothing: it waits for the next message.
                    if let (Some(slot), Some(id)) = (slot, recv_id) {
                        self.native.posted.push_front(PostedRecv { id, into: buffers, slot });
                    }
                }
                Err(LandError::Protocol(reason)) => {
                    if let Some(slot) = slot {
                        let peer = self.peer.clone();
                        slot.complete(Err(RecvError {
                            error: TransportError::PeerFailed { peer, reason: reason.clone() },
                            buffers: None,
                        }));
                    }
                    return self.protocol_error(&reason);
                }
            }
        }
        // An offered message that landed unclaimed may have a `recv_into` waiting for it.
        self.pair_landed();
        self.flush();
    }

    /// Copies a message's frames out of shared memory into this process's memory
    /// (`into`, when given, was checked with `check_targets`). `offered`: the buffers of
    /// the offer a `DeviceOffered` message filled (checked by `take_offered`).
    fn land(
        &self,
        data: &DataMessage,
        into: Option<Vec<Frame>>,
        offered: Option<Vec<DeviceBuffer>>,
        config: &Config,
    ) -> Result<Landed, LandError> {
        // Check every descriptor before allocating or copying anything.
        let total: u64 = data.frames.iter().map(FrameDescriptor::len).sum();
        if total > config.max_message_bytes && offered.is_none() {
            let reason =
                format!("a message of {total} bytes exceeds this receiver's limit of {}", config.max_message_bytes);
            return Err(LandError::Refuse(reason, into));
        }
        let mut device_descs = Vec::new();
        // The device each device frame lands on, which runs its copy.
        let mut copiers = Vec::new();
        for (i, desc) in data.frames.iter().enumerate() {
            match desc {
                FrameDescriptor::Inline(_) => {}
                FrameDescriptor::HostRegion { region_id, offset, len } => {
                    let Some(region) = self.native.regions.get(region_id) else {
                        return Err(LandError::Protocol(format!("frame {i} refers to unknown region {region_id}")));
                    };
                    if offset.checked_add(*len).is_none_or(|end| end > region.len() as u64) {
                        return Err(LandError::Protocol(format!(
                            "frame {i} ({offset}+{len}) lies outside region {region_id} of {} bytes",
                            region.len()
                        )));
                    }
                }
                FrameDescriptor::Device(d) => {
                    device_descs.push(d);
                    copiers.push(match into.as_ref().and_then(|b| b.get(i)).and_then(Frame::as_device) {
                        Some(target) => target.device_ordinal(),
                        None => self.device.landing_device(d),
                    });
                }
                FrameDescriptor::DevicePush { .. } if self.push == PushRole::Target => {}
                FrameDescriptor::DeviceOffered { .. } if offered.is_some() => {}
                FrameDescriptor::DeviceOffered { .. } => {
                    return Err(LandError::Protocol(format!("frame {i} fills a push offer this side did not make")))
                }
                FrameDescriptor::DevicePush { .. } => {
                    return Err(LandError::Protocol(format!(
                        "frame {i} is a push frame, but this side is no push target"
                    )))
                }
                FrameDescriptor::Remote { .. } => {
                    return Err(LandError::Protocol(format!("frame {i} is a UCX frame, on the native lane")))
                }
            }
        }
        let peer_pid = self.shared.as_ref().map_or(0, |s| s.peer.pid);
        let leases = if device_descs.is_empty() {
            Vec::new()
        } else {
            match self.device.map_all(peer_pid, &device_descs, &copiers) {
                Ok(leases) => leases,
                Err(DeviceFrameError::BadDescriptor(e)) => {
                    return Err(LandError::Protocol(format!("a device frame does not map: {e}")))
                }
                Err(DeviceFrameError::NoCuda(e)) => {
                    return Err(LandError::Refuse(format!("device frames need CUDA on the receiver: {e}"), into))
                }
                Err(DeviceFrameError::Local(e)) => return Err(LandError::Refuse(e, into)),
            }
        };
        let is_offered = offered.is_some();
        let mut offered = offered.unwrap_or_default().into_iter();
        let mut targets = match into {
            Some(buffers) => {
                debug_assert!(!is_offered, "offered messages land in the offered buffers");
                buffers
            }
            None => {
                let mut targets = Vec::with_capacity(data.frames.len());
                for desc in &data.frames {
                    targets.push(match desc {
                        FrameDescriptor::DeviceOffered { .. } => {
                            Frame::Device(offered.next().expect("take_offered checked the count"))
                        }
                        FrameDescriptor::Device(d) => {
                            match self.device.allocate(self.device.landing_device(d), d.len as usize) {
                                Ok(buf) => Frame::Device(buf),
                                Err(e) => return Err(LandError::Refuse(describe(e), None)),
                            }
                        }
                        FrameDescriptor::DevicePush { len } => {
                            match self.device.allocate(self.device.default_landing_device(), *len as usize) {
                                Ok(buf) => Frame::Device(buf),
                                Err(e) => return Err(LandError::Refuse(describe(e), None)),
                            }
                        }
                        FrameDescriptor::Inline(bytes) => Frame::Host(HostBuffer::zeroed(bytes.len())),
                        other => match self.landing_buffer(other.len() as usize) {
                            Some(buf) => Frame::Host(buf),
                            None => {
                                let reason = format!("cannot allocate {} bytes for a received frame", other.len());
                                return Err(LandError::Refuse(reason, None));
                            }
                        },
                    });
                }
                targets
            }
        };
        let mut device_copies = Vec::with_capacity(leases.len());
        let mut leases = leases.iter();
        for (desc, target) in data.frames.iter().zip(targets.iter_mut()) {
            match (desc, target) {
                (FrameDescriptor::Inline(bytes), Frame::Host(dst)) => dst.as_mut_slice().copy_from_slice(bytes),
                (FrameDescriptor::HostRegion { region_id, offset, .. }, Frame::Host(dst)) => {
                    let copied = self.native.regions[region_id].copy_out(*offset as usize, dst.as_mut_slice());
                    debug_assert!(copied, "bounds were checked above");
                }
                (FrameDescriptor::Device(d), Frame::Device(dst)) => {
                    device_copies.push((d, leases.next().expect("one lease per device frame"), &*dst));
                }
                (FrameDescriptor::DevicePush { .. }, Frame::Device(_)) => {}
                // Landed already: the target is the offered buffer itself.
                (FrameDescriptor::DeviceOffered { .. }, Frame::Device(_)) => {}
                _ => unreachable!("targets were checked against the descriptors"),
            }
        }
        if !device_copies.is_empty() {
            if let Err(e) = self.device.copy_in(&device_copies) {
                drop(device_copies);
                return match e {
                    DeviceFrameError::BadDescriptor(e) => Err(LandError::Protocol(e)),
                    other => Err(LandError::Refuse(describe(other), Some(targets))),
                };
            }
        }
        // Connector-copies mode: export the buffers the connector is to fill. A caller's
        // buffer that cannot be exported is filled through a pool buffer, copied after.
        let mut copy_back = Vec::new();
        let mut push_sources = Vec::new();
        for (i, desc) in data.frames.iter().enumerate() {
            if let (FrameDescriptor::DevicePush { len }, Frame::Device(target)) = (desc, &targets[i]) {
                if !self.device.is_exportable(target) {
                    let ordinal = target.device_ordinal();
                    let pooled = match self.device.allocate(ordinal, *len as usize) {
                        Ok(buf) => buf,
                        Err(e) => return Err(LandError::Refuse(describe(e), Some(targets))),
                    };
                    let user = std::mem::replace(&mut targets[i], Frame::Device(pooled));
                    copy_back.push((i, user));
                }
                push_sources.push(i);
            }
        }
        let push_targets = if push_sources.is_empty() {
            Vec::new()
        } else {
            let bufs: Vec<&DeviceBuffer> = push_sources.iter().filter_map(|&i| targets[i].as_device()).collect();
            match self.device.export_targets(&bufs) {
                Ok(t) => t,
                Err(e) => return Err(LandError::Refuse(describe(e), None)),
            }
        };
        Ok(Landed { message: Message { header: data.header.clone(), frames: targets }, push_targets, copy_back })
    }
}

/// A message landed in this process's memory; in connector-copies mode its device
/// frames still wait for the connector to fill `push_targets`.
pub(super) struct Landed {
    message: Message,
    push_targets: Vec<crate::wire::DeviceFrameDescriptor>,
    /// Frames filled through pool buffers, to copy into the caller's buffers afterwards.
    copy_back: Vec<(usize, Frame)>,
}

/// A landed message waiting for the connector's `PushDone`.
pub(super) struct AwaitingPush {
    seq: u64,
    landed: Landed,
    pub(super) slot: Option<RecvSlot>,
    pub(super) payload: u64,
    /// The targets are the caller's `recv_into` buffers.
    into_callers_buffers: bool,
}

impl Conn {
    /// Memory for a received host frame: from the landing pool when it has room.
    /// `None` when the memory cannot be had (the message is then refused).
    pub(super) fn landing_buffer(&self, len: usize) -> Option<HostBuffer> {
        match self.native.landing.alloc(len) {
            Ok(Some(buf)) => Some(buf),
            Ok(None) => HostBuffer::try_zeroed(len),
            Err(e) => {
                tracing::warn!("landing pool: {e}; receiving into a plain vector");
                HostBuffer::try_zeroed(len)
            }
        }
    }
}

pub(super) fn describe(e: DeviceFrameError) -> String {
    match e {
        DeviceFrameError::NoCuda(e) => format!("device frames need CUDA on the receiver: {e}"),
        DeviceFrameError::BadDescriptor(e) | DeviceFrameError::Local(e) => e,
    }
}

fn send_error(e: DeviceFrameError) -> TransportError {
    match e {
        DeviceFrameError::NoCuda(e) => TransportError::Unsupported(format!("device frames need CUDA: {e}")),
        DeviceFrameError::BadDescriptor(e) | DeviceFrameError::Local(e) => {
            TransportError::InvalidMessage(format!("cannot export a device frame: {e}"))
        }
    }
}

/// Checks an outgoing message against the limits the peer enforces.
fn check_outgoing(message: &Message, limits: &Limits) -> Result<(), String> {
    if message.header.len() > limits.max_header_bytes {
        return Err(format!("header of {} bytes (at most {})", message.header.len(), limits.max_header_bytes));
    }
    if message.frames.len() > limits.max_frames {
        return Err(format!("{} frames (at most {})", message.frames.len(), limits.max_frames));
    }
    if let Some((i, f)) = message.frames.iter().enumerate().find(|(_, f)| f.len() as u64 > limits.max_frame_len) {
        return Err(format!("frame {i} of {} bytes (at most {})", f.len(), limits.max_frame_len));
    }
    Ok(())
}

pub(super) fn check_targets(descs: &[FrameDescriptor], buffers: &[Frame]) -> Result<(), String> {
    if descs.len() != buffers.len() {
        return Err(format!("{} frames arrived for {} buffers", descs.len(), buffers.len()));
    }
    for (i, (d, b)) in descs.iter().zip(buffers).enumerate() {
        match (d, b) {
            (
                FrameDescriptor::Device(_) | FrameDescriptor::DevicePush { .. } | FrameDescriptor::DeviceOffered { .. },
                Frame::Device(_),
            ) => {}
            (
                FrameDescriptor::Device(_) | FrameDescriptor::DevicePush { .. } | FrameDescriptor::DeviceOffered { .. },
                Frame::Host(_),
            ) => return Err(format!("frame {i} is a device frame, buffer {i} is host memory")),
            (_, Frame::Device(_)) => return Err(format!("frame {i} is a host frame, buffer {i} is device memory")),
            (_, Frame::Host(_)) => {}
        }
        if d.len() != b.len() as u64 {
            return Err(format!("frame {i} holds {} bytes, buffer {i} {}", d.len(), b.len()));
        }
    }
    Ok(())
}

/// Copies a landed message into the user's buffers; hands them back on a mismatch.
fn copy_landed_into(
    device: &DeviceLane,
    message: &Message,
    mut buffers: Vec<Frame>,
) -> Result<Vec<Frame>, (String, Vec<Frame>)> {
    if message.frames.len() != buffers.len() {
        return Err((format!("{} frames arrived for {} buffers", message.frames.len(), buffers.len()), buffers));
    }
    for (i, (src, dst)) in message.frames.iter().zip(&buffers).enumerate() {
        if src.len() != dst.len() || src.kind() != dst.kind() {
            return Err((
                format!("frame {i} ({} bytes) does not fit buffer {i} ({} bytes)", src.len(), dst.len()),
                buffers,
            ));
        }
    }
    for i in 0..buffers.len() {
        match (&message.frames[i], &mut buffers[i]) {
            (Frame::Host(s), Frame::Host(d)) => d.as_mut_slice().copy_from_slice(s.as_slice()),
            (Frame::Device(s), Frame::Device(d)) => {
                if let Err(e) = device.copy_device_to_device(s, d) {
                    return Err((describe(e), buffers));
                }
            }
            _ => unreachable!("kinds were checked above"),
        }
    }
    Ok(buffers)
}
