//! One-sided transfers on the native lane: registrations granted to the peer (host
//! memory as memfd regions announced `HostGrant` and mapped read-write by the peer; device
//! memory as it is exported for a frame), grants opened and kept for their life (a pool
//! pointer stays imported until the grant ends: the owner keeps the memory until then),
//! and the copies.
//!
//! Who copies follows the connection's copy mode: with connector copies the connector
//! runs every transfer (a listener's `put` or `get` is run by the connector, between its
//! own registration and the listener's memory described in the `Transfer` message), so
//! the GPU never switches between the two processes' contexts for them; in pull mode each
//! initiator copies. Host copies are `memcpy`s on the progress thread; device copies run
//! on the device's stream and are polled.

use super::onesided_state::{OneSidedCopies, OpenedGrant};
use super::prepared::{KeptOwn, KeptPeer};
use super::NativeLane;
use crate::device::{copy_spans, describe, DeviceFrameError, Direction};
use crate::payload::{LaneEvent, LaneGrant, LocalTransfer, PeerTransfer, RegistrationInner, Registry};
use ferrylink_memory::{Frame, HostRegion};
use ferrylink_proto::connection::lane::LaneFailure;
use ferrylink_proto::connection::PushRole;
use ferrylink_proto::region::RemoteKey;
use ferrylink_proto::wire::{GrantedMemory, GrantedRegion, RegionAnnouncement, RegionKind, TransferOp};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Weak};

/// The start of a host registration's bytes in this process.
fn host_base(frame: &Frame) -> Option<*mut u8> {
    let host = frame.as_host()?;
    let (region, offset) = host.region()?;
    // A pointer into the live mapping of the region (kept by the frame's registration).
    Some(region.base_ptr().wrapping_add(offset))
}

impl NativeLane {
    fn registry_or_err(&self) -> Result<&Arc<Registry>, String> {
        self.registry.as_ref().ok_or_else(|| "this lane has no registrations".to_owned())
    }

    /// Describes a registration of this side for the peer (regions announced once).
    fn describe_for_peer(
        &mut self,
        registration: &RegistrationInner,
    ) -> Result<(GrantedMemory, Vec<(RegionAnnouncement, OwnedFd)>), String> {
        match &registration.frame {
            Frame::Host(host) => {
                let (region, offset) = host.region().ok_or("host memory that is not shared (a memfd region)")?;
                let region_id = region.region_id();
                let mut regions = Vec::new();
                let announced = self.announced_grants.get(&region_id).is_some_and(|w| w.strong_count() > 0);
                if !announced {
                    let fd = region.shareable_fd().ok_or("a region without a shareable fd")?;
                    let fd = fd.try_clone_to_owned().map_err(|e| format!("duplicating a region's fd: {e}"))?;
                    let kind = RegionKind::HostGrant;
                    regions.push((RegionAnnouncement { region_id, len: region.len() as u64, kind }, fd));
                    let weak: Weak<dyn HostRegion> = Arc::downgrade(region);
                    self.announced_grants.insert(region_id, weak);
                }
                Ok((GrantedMemory::Host { region_id, offset: offset as u64 }, regions))
            }
            Frame::Device(buf) => {
                let exported = self.device.export_targets(&[buf], &mut self.device_announced).map_err(describe)?;
                let desc = exported.descriptors.into_iter().next().ok_or("the export described nothing")?;
                Ok((GrantedMemory::Device(desc), exported.regions))
            }
        }
    }

    pub(super) fn grant(&mut self, key: &RemoteKey) -> Result<LaneGrant, String> {
        let registration = self.registry_or_err()?.grant(key)?;
        match self.describe_for_peer(&registration) {
            Ok((memory, regions)) => Ok(LaneGrant { registration, memory, regions }),
            Err(reason) => {
                self.registry_or_err()?.release_grant(registration.id);
                Err(reason)
            }
        }
    }

    pub(super) fn release(&mut self, registration: u64) {
        if let Some(r) = &self.registry {
            r.release_grant(registration);
        }
    }

    /// Opens a peer's host or device memory of `len` bytes described by `memory`.
    fn open_peer_memory(&mut self, memory: &GrantedMemory, len: u64) -> Result<OpenedGrant, String> {
        match memory {
            GrantedMemory::Host { region_id, offset } => {
                let region =
                    self.grant_regions.get(region_id).ok_or(format!("region {region_id} was never announced"))?;
                if offset.checked_add(len).is_none_or(|end| end > region.len() as u64) {
                    return Err(format!("{offset}+{len} lies outside region {region_id} of {} bytes", region.len()));
                }
                Ok(OpenedGrant::Host { region_id: *region_id, offset: *offset })
            }
            GrantedMemory::Device(desc) => {
                if desc.len != len {
                    return Err(format!("a device description of {} bytes for {len}", desc.len));
                }
                let copier = self.device.landing_device(desc);
                let opened = self.device.map_all(self.peer_pid, &[desc], &[copier], &mut self.device_regions);
                let memory = opened.map_err(describe)?.into_iter().next().ok_or("nothing was opened")?;
                Ok(OpenedGrant::Device(Box::new((desc.clone(), memory))))
            }
            GrantedMemory::Rma { .. } | GrantedMemory::Staged { .. } | GrantedMemory::Staging { .. } => {
                Err("UCX memory on the native lane".into())
            }
        }
    }

    pub(super) fn open(&mut self, granted: &GrantedRegion) -> Result<(), String> {
        let opened = self.open_peer_memory(&granted.memory, granted.len)?;
        self.opened_grants.insert(granted.grant, opened);
        Ok(())
    }

    pub(super) fn runs_own(&self) -> bool {
        self.push != PushRole::Target
    }

    /// Host copies of `spans`: `into_peer`, from `local` (this side's registration, at
    /// the spans' `mine` offsets) into the peer's region, else back.
    fn host_copies(
        &self,
        local: &RegistrationInner,
        (region_id, offset): (u64, u64),
        spans: &[(u64, u64, u64)],
        into_peer: bool,
    ) -> Result<(), String> {
        let region = self.grant_regions.get(&region_id).ok_or(format!("region {region_id} is gone"))?;
        let base = host_base(&local.frame).ok_or("host memory that is not shared")?;
        for &(mine, theirs, len) in spans {
            if mine.checked_add(len).is_none_or(|end| end > local.len()) {
                return Err(format!("a span past this side's memory ({mine}+{len})"));
            }
            let at = (offset + theirs) as usize;
            // SAFETY: `mine..mine+len` lies in the registration (checked above), a live
            // shared mapping its `Arc` keeps; one-sided memory is written by its peers by
            // design (its owner reads it only after a notification, or accepts the race).
            let mine = unsafe { std::slice::from_raw_parts_mut(base.add(mine as usize), len as usize) };
            let copied = if into_peer { region.copy_in(at, mine) } else { region.copy_out(at, mine) };
            if !copied {
                return Err(format!("{theirs}+{len} lies outside the peer's region"));
            }
        }
        Ok(())
    }

    pub(super) fn start_own(&mut self, id: u64, t: &LocalTransfer<'_>) -> Result<(), String> {
        let into_peer = t.op == TransferOp::Put;
        match self.opened_grants.get(&t.grant) {
            Some(OpenedGrant::Host { region_id, offset }) => {
                let (region_id, offset) = (*region_id, *offset);
                let spans = copy_spans(t.spans, true);
                let result = self.host_copies(t.local, (region_id, offset), &spans, into_peer);
                self.onesided_done.push(LaneEvent::TransferFinished { id, result });
                Ok(())
            }
            Some(OpenedGrant::Device(opened)) => {
                let (desc, memory) = opened.as_ref();
                let local = t.local.frame.as_device().ok_or("host memory for a device region")?;
                let direction = if into_peer { Direction::LocalToPeer } else { Direction::PeerToLocal };
                // A prepared transfer's table is listed by its first run and kept.
                let listed = match t.prepared {
                    Some(prepared) => match self.own_prepared.get(&prepared) {
                        Some(kept) => kept.listed.clone(),
                        None => {
                            let spans = (t.spans, true);
                            let listed = self
                                .device
                                .list_for_prepared(local, memory, desc, spans, direction)
                                .map_err(describe)?;
                            self.own_prepared.insert(prepared, KeptOwn { grant: t.grant, listed: listed.clone() });
                            listed
                        }
                    },
                    None => None,
                };
                let gate = self.gates.as_mut().and_then(|g| g.take(id, local.device_ordinal()));
                let copies = match listed {
                    Some(listed) => self.device.enqueue_listed(local, &listed, gate.as_ref()),
                    None => {
                        let peer = (memory, desc);
                        self.device.enqueue_span_copies(local, peer, (t.spans, true), direction, gate.as_ref())
                    }
                }
                .map_err(describe)
                .inspect_err(|_| self.release_gate(id, false))?;
                let registration = t.local.clone();
                self.onesided_copies.push(OneSidedCopies {
                    id,
                    own: true,
                    copies,
                    _registration: registration,
                    _peer: None,
                });
                Ok(())
            }
            None => Err("the remote region is not open".into()),
        }
    }

    pub(super) fn describe_own(
        &mut self,
        registration: &RegistrationInner,
    ) -> Result<(GrantedMemory, Vec<(RegionAnnouncement, OwnedFd)>), String> {
        self.describe_for_peer(registration)
    }

    pub(super) fn run_peer(&mut self, id: u64, t: &PeerTransfer<'_>) -> Result<(), LaneFailure> {
        if let Some(kept) = t.prepared.and_then(|p| self.peer_prepared.get(&p)) {
            let (memory, listed) = (kept.memory.clone(), kept.listed.clone());
            let local = t.registration.frame.as_device().ok_or_else(|| LaneFailure::local("a host registration"))?;
            let copies =
                self.device.enqueue_listed(local, &listed, None).map_err(|e| LaneFailure::local(describe(e)))?;
            let registration = t.registration.clone();
            let copies = OneSidedCopies { id, own: false, copies, _registration: registration, _peer: Some(memory) };
            self.onesided_copies.push(copies);
            return Ok(());
        }
        let opened = self.open_peer_memory(t.peer_memory, t.peer_len).map_err(LaneFailure::peer)?;
        // The owner copies: its registration is "mine", the initiator's memory "theirs".
        let into_peer = t.op == TransferOp::Get;
        match opened {
            OpenedGrant::Host { region_id, offset } => {
                let spans = copy_spans(t.spans, false);
                let result = self.host_copies(t.registration, (region_id, offset), &spans, into_peer);
                self.onesided_done.push(LaneEvent::PeerTransferFinished { id, result });
            }
            OpenedGrant::Device(opened) => {
                let (desc, memory) = *opened;
                let local =
                    t.registration.frame.as_device().ok_or_else(|| LaneFailure::local("a host registration"))?;
                let direction = if into_peer { Direction::LocalToPeer } else { Direction::PeerToLocal };
                let blame = |e| match e {
                    DeviceFrameError::BadDescriptor(r) => LaneFailure::peer(r),
                    other => LaneFailure::local(describe(other)),
                };
                let memory = Arc::new(memory);
                // A prepared transfer's table is listed by its first run and kept, with
                // the mapping, where the mapping cache keeps such mappings anyway.
                let keep = t.prepared.filter(|_| memory.is_cached_mapping());
                let listed = match keep {
                    Some(_) => self.device.list_for_prepared(local, &memory, &desc, (t.spans, false), direction),
                    None => Ok(None),
                }
                .map_err(blame)?;
                let copies = match (keep, listed) {
                    (Some(prepared), Some(listed)) => {
                        let kept = KeptPeer { memory: memory.clone(), listed: listed.clone() };
                        self.peer_prepared.insert(prepared, kept);
                        self.device.enqueue_listed(local, &listed, None)
                    }
                    _ => self.device.enqueue_span_copies(local, (&memory, &desc), (t.spans, false), direction, None),
                }
                .map_err(blame)?;
                let registration = t.registration.clone();
                self.onesided_copies.push(OneSidedCopies {
                    id,
                    own: false,
                    copies,
                    _registration: registration,
                    _peer: Some(memory),
                });
            }
        }
        Ok(())
    }

    /// Reports one-sided transfers whose copies finished.
    pub(super) fn poll_onesided(&mut self, events: &mut Vec<LaneEvent>) {
        events.append(&mut self.onesided_done);
        let mut still = Vec::with_capacity(self.onesided_copies.len());
        let running = std::mem::take(&mut self.onesided_copies);
        for mut c in running {
            let result = match c.copies.is_done() {
                Ok(false) => {
                    still.push(c);
                    continue;
                }
                Ok(true) => Ok(()),
                Err(e) => Err(e.to_string()),
            };
            if c.own {
                self.release_gate(c.id, result.is_ok());
            }
            events.push(if c.own {
                LaneEvent::TransferFinished { id: c.id, result }
            } else {
                LaneEvent::PeerTransferFinished { id: c.id, result }
            });
        }
        self.onesided_copies = still;
    }

    /// The connection ends: waits for the copies still running, lets go of every grant.
    pub(super) fn close_onesided(&mut self) {
        for mut c in self.onesided_copies.drain(..) {
            if let Err(e) = c.copies.wait() {
                tracing::warn!(error = %e, "waiting for one-sided copies of a closing connection");
            }
        }
        self.onesided_done.clear();
        self.own_prepared.clear();
        self.peer_prepared.clear();
        self.opened_grants.clear();
        self.grant_regions.clear();
        self.announced_grants.clear();
    }
}
