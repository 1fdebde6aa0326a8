//! Sending on the native lane: describing a message's frames (inline, shared region,
//! staged copy, CUDA IPC export or push placeholder), pushing device frames into the
//! listener's buffers, copying into push offers.

use super::{NativeLane, SendHold};
use crate::device::{describe, send_error, DeviceFrameError, DeviceHold, PushInFlight};
use crate::error::TransportError;
use crate::payload::LaneEvent;
use ferrylink_memory::{DeviceBuffer, Frame, HostBuffer, Message};
use ferrylink_proto::connection::lane::{DescribeError, Described, LaneFailure};
use ferrylink_proto::connection::PushRole;
use ferrylink_proto::wire::{DeviceFrameDescriptor, FrameDescriptor, RegionAnnouncement, INLINE_BUDGET};
use std::os::fd::OwnedFd;
use std::sync::Arc;

impl NativeLane {
    /// Describes `message`'s frames; `StagingFull` when staging has no room for now.
    pub(super) fn describe_send(&mut self, id: u64, seq: u64, message: &Message) -> Result<Described, DescribeError> {
        let mut frames = Vec::with_capacity(message.frames.len());
        let mut regions: Vec<(RegionAnnouncement, OwnedFd)> = Vec::new();
        let mut announced = Vec::new();
        let mut staging: Vec<HostBuffer> = Vec::new();
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
            if len <= self.settings.inline_threshold && inline_total + len <= INLINE_BUDGET {
                inline_total += len;
                frames.push(Some(FrameDescriptor::Inline(host.to_vec())));
                continue;
            }
            let shared = host.region().filter(|(r, _)| r.shareable_fd().is_some()).map(|(r, off)| (r.clone(), off));
            let (region, offset) = match shared {
                Some(found) => found,
                None => {
                    let mut buf = self.stage(len, staging.is_empty())?;
                    buf.as_mut_slice().copy_from_slice(host.as_slice());
                    staged_bytes += len as u64;
                    let (r, off) = buf.region().map(|(r, off)| (r.clone(), off)).ok_or_else(|| {
                        DescribeError::Send(TransportError::Unsupported("a staging buffer has no region".into()))
                    })?;
                    staging.push(buf);
                    (r, off)
                }
            };
            let region_id = region.region_id();
            let already =
                self.announced.contains_key(&region_id) || regions.iter().any(|(a, _)| a.region_id == region_id);
            if !already {
                let fd = region
                    .shareable_fd()
                    .ok_or_else(|| DescribeError::Send(TransportError::Unsupported("a region lost its fd".into())))?
                    .try_clone_to_owned()
                    .map_err(|e| {
                        DescribeError::Send(TransportError::Unsupported(format!("cannot duplicate a region's fd: {e}")))
                    })?;
                regions.push((RegionAnnouncement::host(region_id, region.len() as u64), fd));
                announced.push((region_id, Arc::downgrade(&region)));
            }
            frames.push(Some(FrameDescriptor::HostRegion { region_id, offset: offset as u64, len: len as u64 }));
        }
        let mut device = DeviceHold::with_producer(self.producers.take_marks(id));
        let device_frames: Vec<&DeviceBuffer> = message.frames.iter().filter_map(Frame::as_device).collect();
        let mut device_descs = if self.push == PushRole::Pusher {
            // Connector-copies mode: the listener provides the buffers (PushTargets).
            device_frames.iter().map(|d| FrameDescriptor::DevicePush { len: d.len() as u64 }).collect::<Vec<_>>()
        } else if device_frames.is_empty() {
            Vec::new()
        } else {
            let exported = self
                .device
                .export(&device_frames, &mut device, &mut self.device_announced)
                .map_err(|e| DescribeError::Send(send_error(e)))?;
            regions.extend(exported.regions);
            exported.descriptors.into_iter().map(FrameDescriptor::Device).collect()
        }
        .into_iter();
        let mut described = Vec::with_capacity(frames.len());
        for f in frames {
            match f.or_else(|| device_descs.next()) {
                Some(d) => described.push(d),
                None => return Err(DescribeError::Send(TransportError::InvalidMessage("a frame went missing".into()))),
            }
        }
        for (region_id, weak) in announced {
            self.announced.insert(region_id, weak);
        }
        let bounced_bytes = device.bounced_bytes;
        self.holds.insert(seq, SendHold { _staging: staging, device });
        Ok(Described { frames: described, regions, staged_bytes, bounced_bytes })
    }

    /// A staging buffer of `len` bytes; `StagingFull` when earlier sends hold the room,
    /// an error when the frame can never fit.
    fn stage(&mut self, len: usize, first_of_message: bool) -> Result<HostBuffer, DescribeError> {
        match self.staging.alloc(len) {
            Ok(Some(buf)) => Ok(buf),
            Ok(None) if self.holds.is_empty() && first_of_message => {
                Err(DescribeError::Send(TransportError::InvalidMessage(format!(
                    "a host frame of {len} bytes does not fit the staging limit of {} bytes; \
                     send it from a shared buffer (ferrylink_ipc::shared_host_buffer) instead",
                    self.settings.staging_max_bytes
                ))))
            }
            Ok(None) => Err(DescribeError::StagingFull),
            Err(e) => {
                Err(DescribeError::Send(TransportError::Unsupported(format!("cannot create staging memory: {e}"))))
            }
        }
    }

    /// Copies send `seq`'s device frames into the listener's targets and waits.
    pub(super) fn push_into_targets(
        &mut self,
        seq: u64,
        message: &Message,
        targets: &[DeviceFrameDescriptor],
    ) -> Result<(), LaneFailure> {
        let sources: Vec<&DeviceBuffer> = message.frames.iter().filter_map(Frame::as_device).collect();
        let empty = Default::default();
        let producer = self.holds.get(&seq).map_or(&empty, |h| &h.device.producer);
        self.device.push_into(self.peer_pid, &sources, targets, producer, &mut self.device_regions).map_err(|e| match e
        {
            DeviceFrameError::BadDescriptor(_) => LaneFailure::peer(describe(e)),
            other => LaneFailure::local(describe(other)),
        })
    }

    /// Enqueues the copies of `message` into the offered buffers and describes its
    /// frames, each with the event that completes after its copy.
    pub(super) fn copy_into_offer(
        &mut self,
        id: u64,
        seq: u64,
        message: &Message,
        offer: u64,
        targets: &[DeviceFrameDescriptor],
    ) -> Result<Vec<FrameDescriptor>, LaneFailure> {
        let sources: Vec<&DeviceBuffer> = message.frames.iter().filter_map(Frame::as_device).collect();
        let producer = self.producers.take_marks(id);
        // The copy streams' waits on the producer's marks are enqueued: the marks may go.
        let opened = match self.opened_ahead.take() {
            Some((held, opened)) if held == offer => opened,
            // Another offer's (it cannot be used any more): let go of it.
            _ => Vec::new(),
        };
        // One device: the copies' end may write a gate word the listener reads, instead
        // of an interprocess event it queries
        // (docs/decisions/0029-copies-signal-their-own-end.md).
        let device =
            sources.first().map(|s| s.device_ordinal()).filter(|&d| sources.iter().all(|s| s.device_ordinal() == d));
        let gate = device.and_then(|d| self.gates.as_mut().and_then(|g| g.take(id, d)));
        let regions = &mut self.device_regions;
        let pushed =
            self.device.push_into_offer(self.peer_pid, &sources, targets, &producer, regions, opened, gate.as_ref());
        drop(producer);
        let gated = pushed.as_ref().is_ok_and(PushInFlight::gated);
        if !gated {
            if let Some(gates) = self.gates.as_mut() {
                gates.unused(id);
            }
        }
        let gate = gate.filter(|_| gated).map(|g| g.notify_gate());
        match pushed {
            Ok(push) => {
                let frames = sources
                    .iter()
                    .enumerate()
                    .map(|(i, s)| FrameDescriptor::DeviceOffered {
                        offer,
                        index: i as u32,
                        len: s.len() as u64,
                        ready: push.done.on_device(s.device_ordinal()).map(|ev| ev.handle()),
                        gate,
                    })
                    .collect();
                self.offered_sends.push_back((seq, id, push));
                Ok(frames)
            }
            Err(DeviceFrameError::BadDescriptor(e)) => Err(LaneFailure::peer(e)),
            Err(DeviceFrameError::NoCuda(e)) => Err(LaneFailure::local(format!("device frames need CUDA: {e}"))),
            Err(DeviceFrameError::Local(e)) => Err(LaneFailure::local(e)),
        }
    }

    /// Reports the offered sends whose copies completed, in order.
    pub(super) fn poll_offered_sends(&mut self, events: &mut Vec<LaneEvent>) {
        while let Some((seq, id, front)) = self.offered_sends.front_mut() {
            let (seq, id) = (*seq, *id);
            match front.is_done() {
                Ok(false) => return,
                Ok(true) => {
                    self.offered_sends.pop_front();
                    self.release_gate(id, true);
                    events.push(LaneEvent::OfferedSendDone { seq });
                }
                Err(e) => {
                    if let Some((_, _, mut push)) = self.offered_sends.pop_front() {
                        push.wait();
                    }
                    self.release_gate(id, false);
                    events.push(LaneEvent::OfferedSendFailed { seq, reason: describe(e) });
                }
            }
        }
    }
}
