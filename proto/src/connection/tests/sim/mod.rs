//! A simulated lane: host frames inline or in a simulated shared store, device frames as
//! fake buffers (never dereferenced) whose bytes live in the same store, and knobs that
//! make it answer the way a real lane answers under pressure or failure.

use crate::connection::lane::{
    CopyMismatch, CoreLane, DescribeError, Described, DescribedTransfer, Landing, LaneEvent, LaneFailure, LaneGrant,
    LocalTransfer, PeerTransfer, ProducerState, Readiness, ReceiveOffer, Released,
};
use crate::error::TransportError;
use crate::region::{Registry, RemoteKey};
use crate::test_payload::TestPayload;
use crate::wire::{
    DataMessage, DeviceFrameDescriptor, DeviceMemory, FrameDescriptor, GrantedMemory, GrantedRegion,
    RegionAnnouncement, TransferOp,
};
use ferrylink_memory::{DeviceBuffer, DeviceMemoryOwner, Frame, HostBuffer, Message, ProducerStream};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::sync::Arc;

mod lane_ops;

/// Memory both simulated processes see: shared host regions and device allocations,
/// by id.
#[derive(Default)]
pub struct SharedMem {
    pub regions: HashMap<u64, Vec<u8>>,
    pub device: HashMap<u64, Vec<u8>>,
    /// Gate words both sides read: index → value.
    pub gates: HashMap<u32, u32>,
    next_id: u64,
}

impl SharedMem {
    fn alloc(&mut self) -> u64 {
        self.next_id += 1;
        // Far from 0 so a fake device pointer never looks like a real small one.
        0x1000_0000 + self.next_id * 0x1000
    }
}

pub type Mem = Rc<RefCell<SharedMem>>;

/// The owner of fake device buffers: nothing to free.
struct FakeOwner;

impl DeviceMemoryOwner for FakeOwner {
    fn describe(&self) -> String {
        "simulated device memory".into()
    }
}

/// A device frame whose bytes live in `mem` under its pointer.
pub fn device_frame(mem: &Mem, bytes: Vec<u8>) -> Frame {
    let ptr = mem.borrow_mut().alloc();
    let len = bytes.len();
    mem.borrow_mut().device.insert(ptr, bytes);
    // SAFETY: the pointer is never dereferenced: the core only reads lengths and the
    // simulated lane keeps the bytes in `SharedMem::device` under the pointer (the same
    // fake-buffer pattern as memory/src/serialize.rs's tests); dropping it only calls
    // `FakeOwner::release`, which does nothing.
    Frame::Device(unsafe { DeviceBuffer::from_raw_parts(ptr, len, 0, Arc::new(FakeOwner)) })
}

/// The bytes of any frame (device frames through `mem`).
pub fn frame_bytes(mem: &Mem, frame: &Frame) -> Vec<u8> {
    match frame {
        Frame::Host(h) => h.to_vec(),
        Frame::Device(d) => mem.borrow().device.get(&d.device_ptr()).cloned().expect("a simulated device buffer"),
    }
}

pub fn device_desc(ptr: u64, len: u64) -> DeviceFrameDescriptor {
    DeviceFrameDescriptor {
        memory: DeviceMemory::LegacyIpc { handle: [7; 64], buffer_id: ptr, alloc_len: len },
        offset: 0,
        len,
        device_uuid: [1; 16],
        event: None,
    }
}

/// The simulated buffer a descriptor names (its legacy IPC buffer id; 0 for others,
/// which no simulated buffer has).
fn sim_buffer(d: &DeviceFrameDescriptor) -> u64 {
    match d.memory {
        DeviceMemory::LegacyIpc { buffer_id, .. } => buffer_id,
        _ => 0,
    }
}

/// How `land` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LandMode {
    Done,
    /// `InProgress`; [`SimLane::complete_landings`] reports them.
    InProgress,
    Refuse(String),
    FailLocal(String),
}

/// One frame of a pushed message landing.
enum PushSlot {
    /// Not pushed: landed already.
    Landed(Frame),
    /// A `recv_into`'s own device buffer, the push's target.
    Given(Frame),
    /// A target the lane allocated.
    Target(u64),
}

/// The simulated lane of one side.
pub struct SimLane {
    pub mem: Mem,
    /// Host frames above this many bytes go through a shared region.
    pub inline_max: usize,
    /// Staging bytes (region frames) that may be unacknowledged at once.
    pub staging_capacity: usize,
    staged: BTreeMap<u64, usize>,
    /// Connector-copies mode, pushing side: device frames are described `DevicePush`.
    pub push_device: bool,
    /// Acknowledged sends are released `Pending` until [`SimLane::finish_sends`].
    pub release_pending: bool,
    /// Releases report `FramesLost`.
    pub frames_lost: bool,
    /// Taken frames of sends that may stay with the lane: seq → frames.
    held: BTreeMap<u64, Vec<Frame>>,
    unfinished: BTreeSet<u64>,
    finished: BTreeSet<u64>,
    pub land_mode: LandMode,
    in_progress: VecDeque<(u64, Message)>,
    /// Messages with device frames landed for a receive naming a stream, copies running.
    pub copying: Vec<u64>,
    /// Messages landed straight into a receive's own buffers (one copy, no pool memory).
    pub landed_into_callers: Vec<u64>,
    /// Messages whose running copies the core waited for.
    pub copies_waited: Vec<u64>,
    pub readiness_pending: bool,
    /// The next `describe` fails the connection with this.
    pub describe_connection_error: Option<String>,
    /// The next `describe` refuses the send with this.
    pub describe_send_error: Option<TransportError>,
    /// Listener side: make offers.
    pub offers_enabled: bool,
    pub offers_made: BTreeMap<u64, Vec<u64>>,
    pub offers_dropped: Vec<u64>,
    /// Receive offers: the receive's own buffers, lent to the lane, by offer id.
    pub receive_offers: BTreeMap<u64, Vec<Frame>>,
    /// Receive offers answer "not yet" this many more times before they are made.
    pub receive_offer_delays: usize,
    /// Frames of pushes awaiting `PushDone`: seq → (header, frames).
    push_targets: BTreeMap<u64, (Vec<u8>, Vec<PushSlot>)>,
    /// Region ids this side exported, and whether they were imported on the peer.
    imported: HashMap<u64, u64>,
    pub dropped: Vec<u64>,
    pub forgotten: Vec<u64>,
    pub events: Vec<LaneEvent<TestPayload>>,
    pub closed: usize,
    /// Connector: receive offers the lane was told of (`offer_received`), and those it
    /// was told were given up (`offer_given_up`), in order.
    pub offers_received: Vec<u64>,
    pub offers_given_up: Vec<u64>,
    /// Lent buffers held past `close` (`hold_lent_buffers`), until released.
    pub lent_held: bool,
    /// Times `release_lent_buffers` ran.
    pub lent_released: usize,
    pub pushes: usize,
    /// The producers of device sends are still running.
    pub producer_running: bool,
    /// The next producer check fails with this.
    pub producer_error: Option<TransportError>,
    /// Requests whose producer marks were discarded.
    pub discarded: Vec<u64>,
    /// Transfers whose local memory's producer still runs.
    pub transfer_producers_running: BTreeSet<u64>,
    /// The next transfer's producer check fails with this.
    pub transfer_producer_error: Option<String>,
    /// Transfers whose producer the core asked about, in order (once per ask).
    pub transfer_producers_asked: Vec<u64>,
    // One-sided.
    /// This side's registrations.
    pub registry: Arc<Registry<TestPayload>>,
    /// Whether this side runs the transfers it initiates.
    pub runs_own: bool,
    /// Grants opened: grant → (pointer, length) in the shared store.
    pub opened: BTreeMap<u64, (u64, u64)>,
    /// Grants closed, and registrations whose grant was released.
    pub closed_grants: Vec<u64>,
    pub released: Vec<u64>,
    /// Transfers whose copies are done but not reported yet: (own, id).
    pub transfers_running: Vec<(bool, u64)>,
    /// Report transfers only at [`SimLane::complete_transfers`].
    pub hold_transfers: bool,
    /// Describe transfers the owner runs later ([`SimLane::describe_now`]).
    pub describe_later: bool,
    /// Descriptions held back by `describe_later`.
    pub described_later: Vec<(u64, DescribedTransfer)>,
    /// Refuse to describe transfers, with this reason.
    pub describe_transfer_error: Option<String>,
    /// Keep transfers the owner ran until [`SimLane::finish_answered`].
    pub finish_later: bool,
    /// The owner's answers the lane heard: (id, done).
    pub answered: Vec<(u64, bool)>,
    /// Transfers the owner ran that this side still finishes.
    pub finishing: Vec<u64>,
    /// This side's part after the owner's next answer cannot start, with this reason.
    pub finish_error: Option<String>,
    /// Keep the peer's prepared transfers (`keeps_prepared_transfers`).
    pub keeps_prepared: bool,
    /// Prepared transfers runs named: (own, prepared id).
    pub prepared_runs: Vec<(bool, u64)>,
    /// Prepared transfers released: (prepared id, own).
    pub prepared_released: Vec<(u64, bool)>,
    /// Give transfers this side runs a gate (their notification goes ahead), written
    /// when they complete.
    pub early_gates: bool,
    /// Gates of the transfers running here, by id.
    pub gate_of: HashMap<u64, crate::wire::NotifyGate>,
    next_gate_value: u32,
}

impl SimLane {
    pub fn new(mem: Mem) -> Self {
        Self {
            mem,
            inline_max: 64,
            staging_capacity: usize::MAX,
            staged: BTreeMap::new(),
            push_device: false,
            release_pending: false,
            frames_lost: false,
            held: BTreeMap::new(),
            unfinished: BTreeSet::new(),
            finished: BTreeSet::new(),
            land_mode: LandMode::Done,
            in_progress: VecDeque::new(),
            copying: Vec::new(),
            landed_into_callers: Vec::new(),
            copies_waited: Vec::new(),
            readiness_pending: false,
            describe_connection_error: None,
            describe_send_error: None,
            offers_enabled: false,
            offers_made: BTreeMap::new(),
            lent_held: false,
            lent_released: 0,
            offers_received: Vec::new(),
            offers_given_up: Vec::new(),
            offers_dropped: Vec::new(),
            receive_offers: BTreeMap::new(),
            receive_offer_delays: 0,
            push_targets: BTreeMap::new(),
            imported: HashMap::new(),
            dropped: Vec::new(),
            forgotten: Vec::new(),
            events: Vec::new(),
            closed: 0,
            pushes: 0,
            producer_running: false,
            producer_error: None,
            transfer_producers_running: BTreeSet::new(),
            transfer_producer_error: None,
            transfer_producers_asked: Vec::new(),
            discarded: Vec::new(),
            registry: Registry::new(crate::region::counted_ids),
            runs_own: true,
            opened: BTreeMap::new(),
            closed_grants: Vec::new(),
            released: Vec::new(),
            transfers_running: Vec::new(),
            hold_transfers: false,
            describe_later: false,
            described_later: Vec::new(),
            describe_transfer_error: None,
            finish_later: false,
            answered: Vec::new(),
            finishing: Vec::new(),
            finish_error: None,
            keeps_prepared: true,
            prepared_runs: Vec::new(),
            prepared_released: Vec::new(),
            early_gates: false,
            gate_of: HashMap::new(),
            next_gate_value: 0,
        }
    }

    /// Reports the descriptions `describe_later` held back (`error`: as failed).
    pub fn describe_now(&mut self, error: Option<&str>) {
        for (id, described) in std::mem::take(&mut self.described_later) {
            let result = error.map_or(Ok(described), |e| Err(e.to_owned()));
            self.events.push(LaneEvent::TransferDescribed { id, result });
        }
    }

    /// Reports this side's part of the transfers the owner ran as finished.
    pub fn finish_answered(&mut self) {
        for id in std::mem::take(&mut self.finishing) {
            self.events.push(LaneEvent::TransferFinished { id, result: Ok(()) });
        }
    }

    /// Transfer `id` starts here: a gate for it when `early_gates`.
    fn take_gate(&mut self, id: u64) {
        if self.early_gates {
            self.next_gate_value += 1;
            let gate = crate::wire::NotifyGate { index: (id % 4) as u32, value: self.next_gate_value };
            self.gate_of.insert(id, gate);
        }
    }

    /// Reports every transfer whose copies ran as failed with `reason` (gates stay shut).
    pub fn fail_transfers(&mut self, reason: &str) {
        for (own, id) in std::mem::take(&mut self.transfers_running) {
            self.gate_of.remove(&id);
            let result = Err(reason.to_owned());
            self.events.push(if own {
                LaneEvent::TransferFinished { id, result }
            } else {
                LaneEvent::PeerTransferFinished { id, result }
            });
        }
    }

    /// Reports every transfer whose copies ran.
    pub fn complete_transfers(&mut self) {
        for (own, id) in std::mem::take(&mut self.transfers_running) {
            if let Some(gate) = self.gate_of.remove(&id) {
                self.mem.borrow_mut().gates.insert(gate.index, gate.value);
            }
            self.events.push(if own {
                LaneEvent::TransferFinished { id, result: Ok(()) }
            } else {
                LaneEvent::PeerTransferFinished { id, result: Ok(()) }
            });
        }
    }

    /// Copies `spans` (mine, theirs, len) between buffer `mine` and buffer `theirs` of
    /// the store, `into_theirs` or back.
    fn sim_copies(&self, mine: u64, theirs: u64, spans: &[(u64, u64, u64)], into_theirs: bool) -> Result<(), String> {
        let mut mem = self.mem.borrow_mut();
        for &(m, t, len) in spans {
            let (src, so, dst, d) = if into_theirs { (mine, m, theirs, t) } else { (theirs, t, mine, m) };
            let bytes = mem.device.get(&src).ok_or("no source")?[so as usize..(so + len) as usize].to_vec();
            let target = mem.device.get_mut(&dst).ok_or("no target")?;
            target[d as usize..(d + len) as usize].copy_from_slice(&bytes);
        }
        Ok(())
    }

    fn finished(&mut self, own: bool, id: u64) {
        self.transfers_running.push((own, id));
        if !self.hold_transfers {
            self.complete_transfers();
        }
    }

    /// Sends whose frames the lane still uses after their acknowledgement.
    pub fn unfinished(&self) -> Vec<u64> {
        self.unfinished.iter().copied().collect()
    }

    /// The lane gave back the frames of every acknowledged send it still used.
    pub fn finish_sends(&mut self) {
        for seq in std::mem::take(&mut self.unfinished) {
            self.finished.insert(seq);
            self.events.push(LaneEvent::SendFinished { seq });
        }
    }

    /// Landings in progress.
    pub fn landings(&self) -> usize {
        self.in_progress.len()
    }

    /// Every landing in progress completes (newest first when `reverse`).
    pub fn complete_landings(&mut self, reverse: bool) {
        let mut done: Vec<_> = self.in_progress.drain(..).collect();
        if reverse {
            done.reverse();
        }
        for (seq, message) in done {
            self.events.push(LaneEvent::Landed { seq, message });
        }
    }

    /// The running copies of these messages complete.
    pub fn complete_copies(&mut self, seqs: &[u64]) {
        self.copying.retain(|s| !seqs.contains(s));
        self.events.extend(seqs.iter().map(|&seq| LaneEvent::CopiesDone { seq }));
    }

    /// Staging bytes in use.
    pub fn staged_bytes(&self) -> usize {
        self.staged.values().sum()
    }

    fn export_region(&mut self, bytes: Vec<u8>) -> (u64, RegionAnnouncement, OwnedFd) {
        let id = self.mem.borrow_mut().alloc();
        let len = bytes.len() as u64;
        self.mem.borrow_mut().regions.insert(id, bytes);
        let fd: OwnedFd = std::fs::File::open("/dev/null").expect("/dev/null opens").into();
        (id, RegionAnnouncement::host(id, len), fd)
    }

    fn describe_frame(
        &mut self,
        frame: &Frame,
        regions: &mut Vec<(RegionAnnouncement, OwnedFd)>,
        staged: &mut usize,
    ) -> FrameDescriptor {
        match frame {
            Frame::Device(d) if self.push_device => FrameDescriptor::DevicePush { len: d.len() as u64 },
            Frame::Device(d) => FrameDescriptor::Device(device_desc(d.device_ptr(), d.len() as u64)),
            Frame::Host(h) if h.len() <= self.inline_max => FrameDescriptor::Inline(h.to_vec()),
            Frame::Host(h) => {
                let (id, ann, fd) = self.export_region(h.to_vec());
                regions.push((ann, fd));
                *staged += h.len();
                FrameDescriptor::HostRegion { region_id: id, offset: 0, len: h.len() as u64 }
            }
        }
    }

    /// The frame a descriptor stands for, built from the shared store; a descriptor
    /// that points at nothing is the peer's lie.
    fn land_frame(&self, desc: &FrameDescriptor) -> Result<Frame, LaneFailure> {
        match desc {
            FrameDescriptor::Inline(bytes) => Ok(Frame::from(bytes.clone())),
            FrameDescriptor::HostRegion { region_id, offset, len } => {
                if !self.imported.contains_key(region_id) {
                    return Err(LaneFailure::peer(format!("unknown region {region_id}")));
                }
                let mem = self.mem.borrow();
                let region = mem.regions.get(region_id).ok_or_else(|| LaneFailure::peer("region gone"))?;
                let end = offset.checked_add(*len).filter(|&e| e <= region.len() as u64);
                let end = end.ok_or_else(|| LaneFailure::peer(format!("frame outside region {region_id}")))?;
                Ok(Frame::from(region[*offset as usize..end as usize].to_vec()))
            }
            FrameDescriptor::Device(d) => {
                let bytes = self.mem.borrow().device.get(&sim_buffer(d)).cloned();
                let bytes = bytes.filter(|b| b.len() as u64 == d.len);
                let bytes = bytes.ok_or_else(|| LaneFailure::peer(format!("device buffer {} lies", sim_buffer(d))))?;
                Ok(device_frame(&self.mem, bytes))
            }
            other => Err(LaneFailure::peer(format!("descriptor {other:?} where none was expected"))),
        }
    }

    fn land_offered(&mut self, data: &DataMessage, offer: u64) -> Landing<TestPayload> {
        if let Some(frames) = self.receive_offers.remove(&offer) {
            // The connector wrote the bytes straight into the receive's own buffers.
            return Landing::Done(Message { header: data.header.clone(), frames });
        }
        if self.offers_made.remove(&offer).is_none() {
            return Landing::Failed(LaneFailure::local(format!("offer {offer} unknown to the lane")));
        }
        let ids = self.offer_ids(offer, data.frames.len());
        let frames = ids.into_iter().map(|ptr| self.device_frame_at(ptr)).collect();
        Landing::Done(Message { header: data.header.clone(), frames })
    }

    /// Connector-copies mode, listener side: targets for the `DevicePush` frames (the
    /// caller's own buffers when given), the other frames landed now.
    fn land_pushed(&mut self, data: &DataMessage, into: Option<Vec<Frame>>) -> Landing<TestPayload> {
        let mut into = into.map(|v| v.into_iter());
        let mut slots = Vec::new();
        let mut targets = Vec::new();
        for d in &data.frames {
            let given = into.as_mut().and_then(|i| i.next());
            let FrameDescriptor::DevicePush { len } = d else {
                let landed = match self.land_frame(d) {
                    Ok(f) => f,
                    Err(failure) => return Landing::Failed(failure),
                };
                let slot = match given {
                    Some(mut b) => {
                        let bytes = frame_bytes(&self.mem, &landed);
                        b.as_host_mut().expect("checked by the core").as_mut_slice().copy_from_slice(&bytes);
                        b
                    }
                    None => landed,
                };
                slots.push(PushSlot::Landed(slot));
                continue;
            };
            let slot = match given {
                Some(b) => PushSlot::Given(b),
                None => {
                    let ptr = self.mem.borrow_mut().alloc();
                    self.mem.borrow_mut().device.insert(ptr, vec![0; *len as usize]);
                    PushSlot::Target(ptr)
                }
            };
            let ptr = match &slot {
                PushSlot::Given(b) => b.as_device().expect("checked by the core").device_ptr(),
                PushSlot::Target(ptr) => *ptr,
                PushSlot::Landed(_) => unreachable!(),
            };
            self.mem.borrow_mut().device.entry(ptr).or_insert_with(|| vec![0; *len as usize]);
            targets.push(device_desc(ptr, *len));
            slots.push(slot);
        }
        self.push_targets.insert(data.seq, (data.header.clone(), slots));
        Landing::AwaitsPush { targets, regions: Vec::new() }
    }

    fn offer_ids(&self, offer: u64, n: usize) -> Vec<u64> {
        (0..n as u64).map(|i| offer_buffer_id(offer, i)).collect()
    }

    fn device_frame_at(&self, ptr: u64) -> Frame {
        let bytes = self.mem.borrow_mut().device.remove(&ptr).expect("target buffer exists");
        device_frame(&self.mem, bytes)
    }
}

/// Where offer `offer`'s buffer `i` lives in the store (offers made by the acceptor).
fn offer_buffer_id(offer: u64, i: u64) -> u64 {
    0x7000_0000_0000 + offer * 0x1000 + i
}

/// A host buffer of `bytes`.
pub fn host(bytes: Vec<u8>) -> Frame {
    Frame::Host(HostBuffer::from(bytes))
}
