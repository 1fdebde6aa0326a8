//! The native lane: data through shared memory between two processes of one user.
//!
//! Host frames: small ones (up to `inline_threshold`) travel inside the control message;
//! a frame already in a memfd region (`ferrylink_ipc::shared_host_buffer`, a staging
//! buffer) travels as region id + offset + length, the region's fd passed once; any
//! other frame is copied once into the connection's staging pool. The receiver copies
//! each frame into its own memory before the acknowledgement; only then is staging
//! space released. Every descriptor is checked against the mapped region before
//! anything is allocated or copied.
//!
//! Device frames: CUDA IPC handles the receiver maps and copies from (pull), or, in
//! connector-copies mode, buffers the listener exports for the connector to copy into
//! (`PushTargets`, or ahead of time through a push offer).
//!
//! - `send.rs`: describing sends, pushing into the listener's buffers and offers.
//! - `land.rs`: landing messages, push targets.
//! - `offers.rs`: the listener's offers: allocated buffers, and posted receives' own.
//! - `onesided.rs`: registrations granted to the peer, grants opened, one-sided copies.

mod gates;
mod land;
mod offers;
mod onesided;
mod onesided_state;
mod prepared;
mod send;

use super::{copy_landed_into, Lane};
use crate::config::Config;
use crate::device::{
    Copier, CopiesInFlight, DeviceAnnouncements, DeviceHold, DeviceState, ImportedDeviceRegions, PeerMemory,
    ProducerMarks, ProducerOrders, PushInFlight, ReceiveMarks, TargetMarks,
};
use crate::error::TransportError;
use crate::payload::{
    CopyMismatch, Landing, LaneEvent, LaneGrant, LocalTransfer, MemoryPayload, PeerTransfer, ReceiveOffer, Registry,
};
use ferrylink_ipc::control_ring::ControlRingMemory;
use ferrylink_ipc::memfd::ImportedMemfd;
use ferrylink_ipc::MemfdPool;
use ferrylink_memory::{DeviceBuffer, Frame, HostBuffer, HostRegion, Message, ProducerStream};
use ferrylink_proto::connection::lane::{
    CoreLane, DescribeError, Described, DescribedTransfer, LaneFailure, ProducerState, Readiness, Released,
};
use ferrylink_proto::connection::PushRole;
use ferrylink_proto::region::RemoteKey;
use ferrylink_proto::stats::ContextStats;
use ferrylink_proto::wire::{
    DataMessage, DeviceFrameDescriptor, FrameDescriptor, GrantedRegion, NotifyGate, RegionAnnouncement, RegionKind,
};
use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Weak};

/// What the native lane takes from the configuration.
#[derive(Debug, Clone)]
pub(crate) struct NativeSettings {
    pub inline_threshold: usize,
    pub staging_region_bytes: usize,
    pub staging_max_bytes: usize,
    pub landing_max_bytes: usize,
    pub max_message_bytes: u64,
    pub max_region_bytes: u64,
    /// VMM chunk bytes a peer may have this side import.
    pub max_mapped_device_bytes: u64,
}

impl NativeSettings {
    pub fn from_config(config: &Config) -> Self {
        Self {
            inline_threshold: config.inline_threshold,
            staging_region_bytes: config.staging_region_bytes,
            staging_max_bytes: config.staging_max_bytes,
            landing_max_bytes: config.landing_max_bytes,
            max_message_bytes: config.max_message_bytes,
            max_region_bytes: config.max_region_bytes,
            max_mapped_device_bytes: config.max_mapped_device_bytes,
        }
    }
}

/// What a described send holds until it is acknowledged.
struct SendHold {
    /// Staging buffers holding copies of frames.
    _staging: Vec<HostBuffer>,
    /// Events and bounce buffers of device frames.
    device: DeviceHold,
}

/// A landed message whose device frames wait for the connector's copies.
struct AwaitingPush {
    message: Message,
    /// Frames filled through pool buffers, to copy into the caller's buffers afterwards.
    copy_back: Vec<(usize, Frame)>,
}

/// The native lane of one connection.
pub(crate) struct NativeLane {
    device: Arc<DeviceState>,
    push: PushRole,
    peer_pid: u32,
    settings: NativeSettings,
    producers: ProducerOrders,
    // Sending side.
    staging: MemfdPool,
    /// Regions whose fds went to the peer, to tell it when they are dropped.
    announced: HashMap<u64, Weak<dyn HostRegion>>,
    /// Device regions (VMM chunks, pools) announced to the peer.
    device_announced: DeviceAnnouncements,
    holds: HashMap<u64, SendHold>,
    /// Connector side: sends whose copies into offers run, in order.
    /// Sends copied into offers, by seq and request id, until their copies completed.
    offered_sends: VecDeque<(u64, u64, PushInFlight)>,
    // Receiving side.
    /// Shared memory received host frames land in (reused when the user drops them).
    landing: MemfdPool,
    regions: HashMap<u64, ImportedMemfd>,
    /// Device regions the peer announced.
    device_regions: ImportedDeviceRegions,
    awaiting_push: HashMap<u64, AwaitingPush>,
    /// Messages delivered while their device copies run (a receive's stream waits for
    /// them), in order: acknowledged once the copies completed.
    copying: VecDeque<(u64, CopiesInFlight)>,
    /// Listener side: buffers of the offers made (allocated, or a receive's own), by
    /// offer id.
    offers_made: HashMap<u64, Vec<DeviceBuffer>>,
    /// The connection ended while the peer may still copy into `offers_made` (listener
    /// side) or out of sends it was told of: those stay past `close` until the peer hung
    /// up (`connection/recv/hangup.rs`).
    lent_held: bool,
    /// What unacknowledged sends held (staging copies, bounce buffers) when the
    /// connection ended with `lent_held`.
    held_sends: Vec<SendHold>,
    /// Connector side: the receive offer held, with its targets opened when it arrived
    /// (pool pointers imported while the lane was idle), by index; let go of when the
    /// offer is used or given up, or the lane closes.
    opened_ahead: Option<(u64, Vec<Option<PeerMemory>>)>,
    /// Listener side: marks on receive buffers' producer streams, recorded by the posting
    /// threads or by the offer's first try, polled by the offer.
    receive_marks: ReceiveMarks,
    // One-sided.
    /// This context's registrations (set by `with_registry`).
    registry: Option<Arc<Registry>>,
    /// Host regions announced to the peer for one-sided transfers (`HostGrant`).
    announced_grants: HashMap<u64, Weak<dyn HostRegion>>,
    /// The peer's `HostGrant` regions, mapped read-write.
    grant_regions: HashMap<u64, ImportedMemfd>,
    /// Grants of the peer's registrations this side opened.
    opened_grants: HashMap<u64, onesided_state::OpenedGrant>,
    /// One-sided device copies running.
    onesided_copies: Vec<onesided_state::OneSidedCopies>,
    /// The connection's gate words, once its control rings are in use.
    gates: Option<gates::Gates>,
    /// One-sided transfers finished on the spot (host copies), to report.
    onesided_done: Vec<LaneEvent>,
    /// This side's prepared device transfers this side runs, by prepared id.
    own_prepared: HashMap<u64, prepared::KeptOwn>,
    /// The peer's prepared device transfers this side runs, by the peer's id.
    peer_prepared: HashMap<u64, prepared::KeptPeer>,
}

fn staging_pool(s: &NativeSettings) -> MemfdPool {
    MemfdPool::new("ferrylink-staging", s.staging_region_bytes, s.staging_max_bytes)
}

fn landing_pool(s: &NativeSettings) -> MemfdPool {
    MemfdPool::new("ferrylink-landing", s.staging_region_bytes, s.landing_max_bytes)
}

impl NativeLane {
    pub fn new(device: Arc<DeviceState>, push: PushRole, peer_pid: u32, settings: NativeSettings) -> Self {
        let copier = if push == PushRole::Pusher { Copier::Local } else { Copier::Peer };
        Self {
            device,
            push,
            peer_pid,
            producers: ProducerOrders::new(copier),
            staging: staging_pool(&settings),
            announced: HashMap::new(),
            device_announced: DeviceAnnouncements::default(),
            holds: HashMap::new(),
            offered_sends: VecDeque::new(),
            landing: landing_pool(&settings),
            regions: HashMap::new(),
            device_regions: ImportedDeviceRegions::default(),
            awaiting_push: HashMap::new(),
            copying: VecDeque::new(),
            offers_made: HashMap::new(),
            lent_held: false,
            held_sends: Vec::new(),
            opened_ahead: None,
            receive_marks: ReceiveMarks::default(),
            registry: None,
            announced_grants: HashMap::new(),
            grant_regions: HashMap::new(),
            opened_grants: HashMap::new(),
            onesided_copies: Vec::new(),
            gates: None,
            onesided_done: Vec::new(),
            own_prepared: HashMap::new(),
            peer_prepared: HashMap::new(),
            settings,
        }
    }

    /// The lane with this context's registrations (one-sided transfers).
    pub fn with_registry(mut self, registry: Arc<Registry>) -> Self {
        self.registry = Some(registry);
        self
    }
}

impl CoreLane<MemoryPayload> for NativeLane {
    fn order_producer(&mut self, id: u64, message: &Message) -> Result<ProducerState, TransportError> {
        self.producers.order(&self.device, id, message)
    }

    fn discard_send(&mut self, id: u64) {
        self.producers.discard(id);
    }

    fn transfer_producer(&mut self, id: u64, t: &LocalTransfer<'_>) -> Result<ProducerState, String> {
        if self.runs_own() {
            // Its copies wait for the producer's work on the GPU (`order_after_target_producer`).
            return Ok(ProducerState::Ready);
        }
        self.producers.order_transfer(&self.device, id, &t.local.frame)
    }

    fn discard_transfer_producer(&mut self, id: u64) {
        self.producers.discard(id);
    }

    fn describe(&mut self, id: u64, seq: u64, message: &mut Message) -> Result<Described, DescribeError> {
        self.describe_send(id, seq, message)
    }

    fn release(&mut self, seq: u64, _message: &mut Message, acknowledged: bool) -> Released {
        let hold = self.holds.remove(&seq);
        if self.lent_held && !acknowledged {
            // The peer may still be copying out of the send's staging and bounce
            // buffers: they stay until it hung up (`connection/recv/hangup.rs`).
            self.held_sends.extend(hold);
        }
        if let Some(i) = self.offered_sends.iter().position(|(s, _, _)| *s == seq) {
            if let Some((_, id, mut push)) = self.offered_sends.remove(i) {
                // The copies read the message's buffers: they finish before it goes back.
                let written = push.wait();
                self.release_gate(id, written);
            }
        }
        Released::Whole
    }

    fn push(&mut self, seq: u64, message: &Message, targets: &[DeviceFrameDescriptor]) -> Result<(), LaneFailure> {
        self.push_into_targets(seq, message, targets)
    }

    fn send_into_offer(
        &mut self,
        id: u64,
        seq: u64,
        message: &Message,
        offer: u64,
        targets: &[DeviceFrameDescriptor],
    ) -> Result<Vec<FrameDescriptor>, LaneFailure> {
        self.copy_into_offer(id, seq, message, offer, targets)
    }

    fn readiness(&mut self, data: &DataMessage) -> Readiness {
        self.ready_events(data)
    }

    fn land(
        &mut self,
        data: &DataMessage,
        into: Option<Vec<Frame>>,
        offer: Option<u64>,
        on: Option<&ProducerStream>,
    ) -> Landing {
        self.land_message(data, into, offer, on)
    }

    fn wait_copies(&mut self, seq: u64) -> Result<(), LaneFailure> {
        let Some(i) = self.copying.iter().position(|(s, _)| *s == seq) else {
            return Err(LaneFailure::local(format!("no copies of message {seq} run")));
        };
        let Some((_, copies)) = self.copying.remove(i) else { return Ok(()) };
        copies.wait().map_err(|e| LaneFailure::local(e.to_string()))
    }

    fn finish_push(&mut self, seq: u64) -> Result<Message, LaneFailure> {
        self.finish_pushed(seq)
    }

    fn copy_into(&mut self, message: &Message, buffers: Vec<Frame>) -> Result<Vec<Frame>, CopyMismatch> {
        copy_landed_into(&self.device, message, buffers)
    }

    fn make_offer(&mut self, offer: u64, lens: &[u64]) -> Option<Vec<DeviceFrameDescriptor>> {
        self.offer_buffers(offer, lens)
    }

    fn drop_offer(&mut self, offer: u64) {
        self.offers_made.remove(&offer);
    }

    fn offer_receive_buffers(&mut self, offer: u64, recv: u64, buffers: Vec<Frame>) -> ReceiveOffer {
        self.offer_receive(offer, recv, buffers)
    }

    fn take_back_offer(&mut self, offer: u64) -> Option<Vec<Frame>> {
        self.take_back_receive_offer(offer)
    }

    fn import_regions(&mut self, list: &[RegionAnnouncement], fds: &mut VecDeque<OwnedFd>) -> Result<(), String> {
        for announcement in list {
            let Some(fd) = fds.pop_front() else {
                return Err(format!("region {} came without its descriptor", announcement.region_id));
            };
            if announcement.kind == RegionKind::HostGrant {
                let region = ImportedMemfd::import_writable(fd, self.settings.max_region_bytes)
                    .map_err(|e| format!("region {}: {e}", announcement.region_id))?;
                if region.len() as u64 != announcement.len {
                    return Err(format!(
                        "region {} announced as {} bytes is {}",
                        announcement.region_id,
                        announcement.len,
                        region.len()
                    ));
                }
                self.grant_regions.insert(announcement.region_id, region);
                continue;
            }
            if announcement.kind != RegionKind::HostMemfd {
                let max = self.settings.max_mapped_device_bytes;
                self.device_regions
                    .import(&self.device, announcement, fd, max)
                    .map_err(|e| format!("device region {}: {e}", announcement.region_id))?;
                continue;
            }
            match ImportedMemfd::import(fd, self.settings.max_region_bytes) {
                Ok(region) if region.len() as u64 == announcement.len => {
                    self.regions.insert(announcement.region_id, region);
                }
                Ok(region) => {
                    return Err(format!(
                        "region {} announced as {} bytes is {} bytes",
                        announcement.region_id,
                        announcement.len,
                        region.len()
                    ))
                }
                Err(e) => return Err(format!("region {}: {e}", announcement.region_id)),
            }
        }
        Ok(())
    }

    fn forget_region(&mut self, region_id: u64) {
        self.regions.remove(&region_id);
        self.grant_regions.remove(&region_id);
        self.device_regions.forget(region_id);
    }

    fn dropped_regions(&mut self) -> Vec<u64> {
        let mut dropped: Vec<u64> =
            self.announced.iter().filter(|(_, w)| w.strong_count() == 0).map(|(&id, _)| id).collect();
        dropped.extend(self.announced_grants.iter().filter(|(_, w)| w.strong_count() == 0).map(|(&id, _)| id));
        dropped.sort_unstable();
        dropped.dedup();
        for id in &dropped {
            self.announced.remove(id);
            self.announced_grants.remove(id);
        }
        dropped.extend(self.device_announced.take_forgotten());
        dropped
    }

    fn poll(&mut self, events: &mut Vec<LaneEvent>) -> bool {
        self.poll_offered_sends(events);
        self.poll_copies(events);
        self.poll_onesided(events);
        !self.offered_sends.is_empty() || !self.copying.is_empty() || !self.onesided_copies.is_empty()
    }

    fn grant_import(&mut self, key: &RemoteKey) -> Result<LaneGrant, String> {
        self.grant(key)
    }

    fn release_grant(&mut self, registration: u64) {
        self.release(registration);
    }

    fn open_grant(&mut self, granted: &GrantedRegion) -> Result<(), String> {
        self.open(granted)
    }

    fn close_grant(&mut self, grant: u64) {
        self.own_prepared.retain(|_, kept| kept.grant != grant);
        self.opened_grants.remove(&grant);
    }

    fn keeps_prepared_transfers(&self) -> bool {
        true
    }

    fn release_prepared(&mut self, prepared: u64, own: bool) {
        if own {
            self.own_prepared.remove(&prepared);
        } else {
            self.peer_prepared.remove(&prepared);
        }
    }

    fn runs_own_transfer(&self, _t: &LocalTransfer<'_>) -> bool {
        self.runs_own()
    }

    fn start_transfer(&mut self, id: u64, t: &LocalTransfer<'_>) -> Result<(), String> {
        self.start_own(id, t)
    }

    fn early_notify_gate(&mut self, id: u64) -> Option<NotifyGate> {
        self.gates.as_ref().and_then(|g| g.notify_gate(id))
    }

    fn gate_open(&self, gate: NotifyGate) -> Result<bool, String> {
        match &self.gates {
            Some(gates) => gates.is_open(gate),
            None => Err(format!("a notification gated on word {} without control rings", gate.index)),
        }
    }

    fn describe_transfer(&mut self, _id: u64, t: &LocalTransfer<'_>) -> Result<Option<DescribedTransfer>, String> {
        let (memory, regions) = self.describe_own(t.local)?;
        Ok(Some(DescribedTransfer { memory, len: t.local.len(), spans: None, regions }))
    }

    fn run_peer_transfer(&mut self, id: u64, t: &PeerTransfer<'_>) -> Result<(), LaneFailure> {
        self.run_peer(id, t)
    }

    fn offer_received(&mut self, offer: u64, targets: &[DeviceFrameDescriptor]) {
        let opened = self.device.open_ahead(targets, &mut self.device_regions);
        self.opened_ahead = Some((offer, opened));
    }

    fn offer_given_up(&mut self, offer: u64) {
        if self.opened_ahead.as_ref().is_some_and(|(held, _)| *held == offer) {
            self.opened_ahead = None;
        }
    }

    fn has_lent_buffers(&self) -> bool {
        !self.offers_made.is_empty()
    }

    fn hold_lent_buffers(&mut self) {
        self.lent_held = true;
    }

    fn release_lent_buffers(&mut self) {
        self.lent_held = false;
        self.offers_made.clear();
        self.held_sends.clear();
    }

    fn close(&mut self) {
        // Imports of the listener's buffers go before the connection's socket closes.
        self.opened_ahead = None;
        self.close_onesided();
        for (_, id, mut push) in std::mem::take(&mut self.offered_sends) {
            let written = push.wait();
            self.release_gate(id, written);
        }
        // Copies into delivered messages read the peer's memory: they finish first.
        for (seq, copies) in self.copying.drain(..) {
            if let Err(e) = copies.wait() {
                tracing::warn!(seq, error = %e, "waiting for the copies of a delivered message failed");
            }
        }
        self.producers.clear();
        self.holds.clear();
        self.awaiting_push.clear();
        if !self.lent_held {
            self.offers_made.clear();
        }
        self.regions.clear();
        self.device_regions.clear();
        self.announced.clear();
        self.device_announced.clear();
        self.staging = staging_pool(&self.settings);
        // Buffers already delivered keep their regions alive; the idle rest goes now.
        self.landing = landing_pool(&self.settings);
        self.device.close_peer(self.peer_pid);
    }
}

impl NativeLane {
    /// Transfer or send `id`'s copies ended: its gate word (if it took one) goes back, or
    /// out of use when the copies did not complete (`written` false).
    fn release_gate(&mut self, id: u64, written: bool) {
        if let Some(gates) = &mut self.gates {
            gates.release(id, written);
        }
    }

    /// Reports the messages whose copies a receive's stream waits for that completed
    /// (their events polled, never waited on); what the copies read goes with them.
    fn poll_copies(&mut self, events: &mut Vec<LaneEvent>) {
        let mut i = 0;
        while let Some((seq, copies)) = self.copying.get(i) {
            match copies.done() {
                Ok(true) => {
                    events.push(LaneEvent::CopiesDone { seq: *seq });
                    self.copying.remove(i);
                }
                Ok(false) => i += 1,
                Err(e) => {
                    let reason = format!("polling the copies of message {seq}: {e}");
                    return events.push(LaneEvent::Failed { reason });
                }
            }
        }
    }
}

impl Lane for NativeLane {
    fn use_control_ring(&mut self, ring: &Arc<ControlRingMemory>, connector: bool) {
        self.gates = Some(gates::Gates::new(ring.clone(), connector));
    }

    fn note_producer(&mut self, id: u64, marks: ProducerMarks) {
        self.producers.note(id, marks);
    }

    fn note_target_marks(&mut self, id: u64, marks: TargetMarks) {
        self.receive_marks.note(id, marks);
    }

    fn add_stats(&self, s: &mut ContextStats) {
        s.imported_regions += self.regions.len();
        s.imported_bytes += self.regions.values().map(|r| r.len() as u64).sum::<u64>();
        s.staging_mapped_bytes += self.staging.mapped_bytes() as u64;
        s.staging_used_bytes += self.staging.used_bytes() as u64;
        s.landing_mapped_bytes += self.landing.mapped_bytes() as u64;
        let (device_regions, vmm_bytes) = self.device_regions.usage();
        s.imported_device_regions += device_regions;
        s.imported_vmm_bytes += vmm_bytes;
    }
}

#[cfg(test)]
mod tests;
