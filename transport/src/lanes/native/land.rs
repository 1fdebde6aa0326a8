//! Landing on the native lane: a message's descriptors are checked against the regions
//! and allocations they name before anything is allocated or copied; frames are copied
//! out of shared memory (host) or through IPC mappings (device); in connector-copies
//! mode buffers are exported for the connector to fill. Device copies are waited for
//! here, unless the receive named a stream: that stream then waits for them, and the
//! message is acknowledged once their events completed (`NativeLane::poll`).

use super::{AwaitingPush, NativeLane};
use crate::device::DeviceState;
use crate::device::{describe, CopiesInFlight, DeviceFrameError, ExportedFrames, PeerMemory};
use crate::payload::Landing;
use ferrylink_memory::cuda::PooledEvent;
use ferrylink_memory::{DeviceBuffer, Frame, HostBuffer, Message, ProducerStream};
use ferrylink_proto::connection::lane::{LaneFailure, Readiness};
use ferrylink_proto::connection::PushRole;
use ferrylink_proto::wire::{DataMessage, DeviceFrameDescriptor, FrameDescriptor};

/// Why a message cannot land.
enum LandError {
    /// The peer lied: close the connection.
    Protocol(String),
    /// This side cannot take the message: refuse it, hand `recv_into` buffers back.
    Refuse(String, Option<Vec<Frame>>),
}

/// A message in this process's memory (or on its way there).
struct Landed {
    message: Message,
    /// Connector-copies mode: the targets the connector is to fill.
    push: ExportedFrames,
    /// Frames filled through pool buffers, to copy into the caller's buffers after the push.
    copy_back: Vec<(usize, Frame)>,
    /// Device copies the receive's stream waits for, still running.
    copies: Option<CopiesInFlight>,
}

impl NativeLane {
    /// Whether the peer's GPU work on a message's frames (its producer's, or its copies
    /// into our offer) is done: its ready events are polled, never waited on.
    pub(super) fn ready_events(&mut self, data: &DataMessage) -> Readiness {
        match self.gates_open(data) {
            Ok(true) => {}
            Ok(false) => return Readiness::Pending,
            Err(reason) => return Readiness::Failed(LaneFailure::peer(reason)),
        }
        let ready: Vec<([u8; 64], Option<usize>)> = data
            .frames
            .iter()
            .filter_map(|f| match f {
                FrameDescriptor::Device(d) => d.event.map(|h| (h, DeviceState::visible_device(&d.device_uuid))),
                FrameDescriptor::DeviceOffered { ready, .. } => ready.map(|h| (h, None)),
                _ => None,
            })
            .collect();
        match self.device.events_ready(self.peer_pid, &ready) {
            Ok(true) => {
                if !ready.is_empty() {
                    tracing::trace!("peer's ready events complete");
                }
                Readiness::Ready
            }
            Ok(false) => Readiness::Pending,
            // No CUDA here: landing refuses the message, the connection stays.
            Err(DeviceFrameError::NoCuda(_)) => Readiness::Ready,
            Err(DeviceFrameError::BadDescriptor(e)) => Readiness::Failed(LaneFailure::peer(e)),
            Err(e) => Readiness::Failed(LaneFailure::local(describe(e))),
        }
    }

    /// Whether the gate words the peer's copies into our offer write (frames that name
    /// one, instead of a ready event) hold their values: a read of the control rings'
    /// page each, no driver call. A gate without control rings, or outside the words, is
    /// the peer's error.
    fn gates_open(&self, data: &DataMessage) -> Result<bool, String> {
        let mut gated = false;
        for frame in &data.frames {
            let FrameDescriptor::DeviceOffered { gate: Some(gate), .. } = frame else { continue };
            let gates = self.gates.as_ref().ok_or("a frame gated on a word of control rings this connection lacks")?;
            if !gates.is_open(*gate)? {
                return Ok(false);
            }
            gated = true;
        }
        if gated {
            tracing::trace!("peer's gate words open");
        }
        Ok(true)
    }

    pub(super) fn land_message(
        &mut self,
        data: &DataMessage,
        into: Option<Vec<Frame>>,
        offer: Option<u64>,
        on: Option<&ProducerStream>,
    ) -> Landing {
        let offered = match offer {
            Some(id) => match self.offers_made.remove(&id) {
                Some(buffers) => Some(buffers),
                None => {
                    return Landing::Failed(LaneFailure::peer(format!("message {} fills unknown offer {id}", data.seq)))
                }
            },
            None => None,
        };
        let started = std::time::Instant::now();
        // A pushed message is filled by the connector: nothing for a stream to wait for.
        let on = on.filter(|_| !data.frames.iter().any(|f| matches!(f, FrameDescriptor::DevicePush { .. })));
        let landed = self.land(data, into, offered, on);
        tracing::trace!(seq = data.seq, us = started.elapsed().as_micros() as u64, "message landed");
        match landed {
            Ok(Landed { message, push, copy_back, .. }) if !push.descriptors.is_empty() => {
                self.awaiting_push.insert(data.seq, AwaitingPush { message, copy_back });
                Landing::AwaitsPush { targets: push.descriptors, regions: push.regions }
            }
            Ok(Landed { message, copies: Some(copies), .. }) => {
                self.copying.push_back((data.seq, copies));
                Landing::DoneCopying(message)
            }
            Ok(Landed { message, .. }) => Landing::Done(message),
            Err(LandError::Refuse(reason, into)) => Landing::Refused { reason, into },
            Err(LandError::Protocol(reason)) => Landing::Failed(LaneFailure::peer(reason)),
        }
    }

    /// Checks every descriptor; returns the device descriptors and, for each, the
    /// device whose copy lands it.
    fn check_descriptors<'d>(
        &self,
        data: &'d DataMessage,
        into: Option<&Vec<Frame>>,
        offered: bool,
    ) -> Result<(Vec<&'d DeviceFrameDescriptor>, Vec<usize>), String> {
        let mut device_descs = Vec::new();
        let mut copiers = Vec::new();
        for (i, desc) in data.frames.iter().enumerate() {
            match desc {
                FrameDescriptor::Inline(_) => {}
                FrameDescriptor::HostRegion { region_id, offset, len } => {
                    let Some(region) = self.regions.get(region_id) else {
                        return Err(format!("frame {i} refers to unknown region {region_id}"));
                    };
                    if offset.checked_add(*len).is_none_or(|end| end > region.len() as u64) {
                        return Err(format!(
                            "frame {i} ({offset}+{len}) lies outside region {region_id} of {} bytes",
                            region.len()
                        ));
                    }
                }
                FrameDescriptor::Device(d) => {
                    device_descs.push(d);
                    copiers.push(match into.and_then(|b| b.get(i)).and_then(Frame::as_device) {
                        Some(target) => target.device_ordinal(),
                        None => self.device.landing_device(d),
                    });
                }
                FrameDescriptor::DevicePush { .. } if self.push == PushRole::Target => {}
                FrameDescriptor::DeviceOffered { .. } if offered => {}
                FrameDescriptor::DeviceOffered { .. } => {
                    return Err(format!("frame {i} fills a push offer this side did not make"))
                }
                FrameDescriptor::DevicePush { .. } => {
                    return Err(format!("frame {i} is a push frame, but this side is no push target"))
                }
                FrameDescriptor::Remote { .. } => return Err(format!("frame {i} is a UCX frame, on the native lane")),
            }
        }
        Ok((device_descs, copiers))
    }

    /// Copies a message's frames out of shared memory into this process's memory (device
    /// copies left running for `on` to wait for, when given).
    fn land(
        &mut self,
        data: &DataMessage,
        into: Option<Vec<Frame>>,
        offered: Option<Vec<DeviceBuffer>>,
        on: Option<&ProducerStream>,
    ) -> Result<Landed, LandError> {
        let total: u64 = data.frames.iter().map(FrameDescriptor::len).sum();
        if total > self.settings.max_message_bytes && offered.is_none() {
            let limit = self.settings.max_message_bytes;
            let reason = format!("a message of {total} bytes exceeds this receiver's limit of {limit}");
            return Err(LandError::Refuse(reason, into));
        }
        let (device_descs, copiers) =
            self.check_descriptors(data, into.as_ref(), offered.is_some()).map_err(LandError::Protocol)?;
        let leases = if device_descs.is_empty() {
            Vec::new()
        } else {
            match self.device.map_all(self.peer_pid, &device_descs, &copiers, &mut self.device_regions) {
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
        let mut targets = match into {
            Some(buffers) => buffers,
            None => self.allocate_targets(data, offered)?,
        };
        // A refusal hands the targets back (they may be the caller's `recv_into` buffers).
        let with_targets = |e: LandError, targets: Vec<Frame>| match e {
            LandError::Refuse(reason, _) => LandError::Refuse(reason, Some(targets)),
            other => other,
        };
        let running = match self.copy_frames(data, &leases, &mut targets, on) {
            Ok(running) => running,
            Err(e) => {
                drop(leases);
                return Err(with_targets(e, targets));
            }
        };
        // Running copies keep what they read; with none running the openings go now.
        let copies = (!running.is_empty()).then(|| CopiesInFlight::new(running, leases));
        let (copy_back, push) = match self.export_push_targets(data, &mut targets) {
            Ok(exported) => exported,
            Err(e) => {
                if let Some(Err(e)) = copies.map(|c| c.wait()) {
                    tracing::warn!(error = %e, "waiting for the copies of a refused message");
                }
                return Err(with_targets(e, targets));
            }
        };
        let message = Message { header: data.header.clone(), frames: targets };
        Ok(Landed { message, push, copy_back, copies })
    }

    /// Fresh memory for each frame (the offer's buffers for offered frames).
    fn allocate_targets(
        &self,
        data: &DataMessage,
        offered: Option<Vec<DeviceBuffer>>,
    ) -> Result<Vec<Frame>, LandError> {
        let mut offered = offered.unwrap_or_default().into_iter();
        let mut targets = Vec::with_capacity(data.frames.len());
        for desc in &data.frames {
            let refuse = |e| LandError::Refuse(describe(e), None);
            targets.push(match desc {
                FrameDescriptor::DeviceOffered { .. } => match offered.next() {
                    Some(buf) => Frame::Device(buf),
                    None => return Err(LandError::Protocol("more offered frames than the offer has".into())),
                },
                FrameDescriptor::Device(d) => {
                    Frame::Device(self.device.allocate(self.device.landing_device(d), d.len as usize).map_err(refuse)?)
                }
                FrameDescriptor::DevicePush { len } => Frame::Device(
                    self.device.allocate(self.device.default_landing_device(), *len as usize).map_err(refuse)?,
                ),
                FrameDescriptor::Inline(bytes) => Frame::Host(HostBuffer::zeroed(bytes.len())),
                other => match crate::lanes::landing_buffer(&self.landing, other.len() as usize) {
                    Some(buf) => Frame::Host(buf),
                    None => {
                        let reason = format!("cannot allocate {} bytes for a received frame", other.len());
                        return Err(LandError::Refuse(reason, None));
                    }
                },
            });
        }
        Ok(targets)
    }

    /// Copies inline and region frames, and device frames through their mappings: waited
    /// for, or left running for `on` to wait for (their events come back).
    fn copy_frames(
        &self,
        data: &DataMessage,
        leases: &[PeerMemory],
        targets: &mut [Frame],
        on: Option<&ProducerStream>,
    ) -> Result<Vec<PooledEvent>, LandError> {
        let mut device_copies = Vec::with_capacity(leases.len());
        let mut leases = leases.iter();
        for (i, (desc, target)) in data.frames.iter().zip(targets.iter_mut()).enumerate() {
            match (desc, target) {
                (FrameDescriptor::Inline(bytes), Frame::Host(dst)) => dst.as_mut_slice().copy_from_slice(bytes),
                (FrameDescriptor::HostRegion { region_id, offset, .. }, Frame::Host(dst)) => {
                    let copied =
                        self.regions.get(region_id).is_some_and(|r| r.copy_out(*offset as usize, dst.as_mut_slice()));
                    if !copied {
                        return Err(LandError::Protocol(format!("frame {i} does not fit its region")));
                    }
                }
                (FrameDescriptor::Device(d), Frame::Device(dst)) => match leases.next() {
                    Some(lease) => device_copies.push((d, lease, &*dst)),
                    None => return Err(LandError::Protocol(format!("frame {i} has no mapping"))),
                },
                (FrameDescriptor::DevicePush { .. }, Frame::Device(_)) => {}
                // Landed already: the target is the offered buffer itself.
                (FrameDescriptor::DeviceOffered { .. }, Frame::Device(_)) => {}
                _ => return Err(LandError::Protocol(format!("frame {i} does not match its target"))),
            }
        }
        if device_copies.is_empty() {
            return Ok(Vec::new());
        }
        let copied = match on {
            Some(stream) => self.device.copy_in_on(&device_copies, stream),
            None => self.device.copy_in(&device_copies).map(|()| Vec::new()),
        };
        copied.map_err(|e| match e {
            DeviceFrameError::BadDescriptor(e) => LandError::Protocol(e),
            other => LandError::Refuse(describe(other), None),
        })
    }

    /// Connector-copies mode: exports the buffers the connector is to fill. A caller's
    /// buffer that cannot be exported is filled through a pool buffer, copied after.
    #[allow(clippy::type_complexity)]
    fn export_push_targets(
        &mut self,
        data: &DataMessage,
        targets: &mut [Frame],
    ) -> Result<(Vec<(usize, Frame)>, ExportedFrames), LandError> {
        let mut copy_back = Vec::new();
        let mut push_sources = Vec::new();
        for (i, desc) in data.frames.iter().enumerate() {
            if let (FrameDescriptor::DevicePush { len }, Frame::Device(target)) = (desc, &targets[i]) {
                if !self.device.is_exportable(target) {
                    let ordinal = target.device_ordinal();
                    let pooled = self
                        .device
                        .allocate(ordinal, *len as usize)
                        .map_err(|e| LandError::Refuse(describe(e), None))?;
                    let user = std::mem::replace(&mut targets[i], Frame::Device(pooled));
                    copy_back.push((i, user));
                }
                push_sources.push(i);
            }
        }
        if push_sources.is_empty() {
            return Ok((copy_back, ExportedFrames::default()));
        }
        let bufs: Vec<&DeviceBuffer> = push_sources.iter().filter_map(|&i| targets[i].as_device()).collect();
        // The connector writes them: the caller's work queued on them comes first.
        self.device
            .wait_for_target_producers(bufs.iter().copied())
            .map_err(|e| LandError::Refuse(describe(e), None))?;
        let exported = self
            .device
            .export_targets(&bufs, &mut self.device_announced)
            .map_err(|e| LandError::Refuse(describe(e), None))?;
        Ok((copy_back, exported))
    }

    /// Connector-copies mode, listener side: the connector filled message `seq`.
    pub(super) fn finish_pushed(&mut self, seq: u64) -> Result<Message, LaneFailure> {
        let Some(AwaitingPush { mut message, copy_back }) = self.awaiting_push.remove(&seq) else {
            return Err(LaneFailure::peer(format!("push of message {seq}, which awaits none")));
        };
        for (i, user) in copy_back {
            if let (Frame::Device(pooled), Frame::Device(dst)) = (&message.frames[i], &user) {
                self.device.copy_device_to_device(pooled, dst).map_err(|e| LaneFailure::local(describe(e)))?;
            }
            message.frames[i] = user;
        }
        Ok(message)
    }
}
