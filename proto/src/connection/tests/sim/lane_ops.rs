//! The simulated lane's answers to the protocol core: `CoreLane` for [`SimLane`].

use super::*;
use crate::test_payload::TestPayload;

impl CoreLane<TestPayload> for SimLane {
    fn order_producer(&mut self, _id: u64, _message: &Message) -> Result<ProducerState, TransportError> {
        if let Some(error) = self.producer_error.take() {
            return Err(error);
        }
        Ok(if self.producer_running { ProducerState::Running } else { ProducerState::Ready })
    }

    fn discard_send(&mut self, id: u64) {
        self.discarded.push(id);
    }

    fn transfer_producer(&mut self, id: u64, _t: &LocalTransfer<'_, TestPayload>) -> Result<ProducerState, String> {
        self.transfer_producers_asked.push(id);
        if let Some(reason) = self.transfer_producer_error.take() {
            return Err(reason);
        }
        Ok(if self.transfer_producers_running.contains(&id) { ProducerState::Running } else { ProducerState::Ready })
    }

    fn discard_transfer_producer(&mut self, id: u64) {
        self.discarded.push(id);
    }

    fn describe(&mut self, _id: u64, seq: u64, message: &mut Message) -> Result<Described, DescribeError> {
        if let Some(reason) = self.describe_connection_error.take() {
            return Err(DescribeError::Connection(reason));
        }
        if let Some(error) = self.describe_send_error.take() {
            return Err(DescribeError::Send(error));
        }
        let to_stage: usize = message
            .frames
            .iter()
            .filter(|f| f.as_host().is_some_and(|h| h.len() > self.inline_max))
            .map(Frame::len)
            .sum();
        if to_stage > 0 && self.staged_bytes() + to_stage > self.staging_capacity {
            return Err(DescribeError::StagingFull);
        }
        let mut regions = Vec::new();
        let mut staged = 0;
        let frames = message.frames.iter().map(|f| self.describe_frame(f, &mut regions, &mut staged)).collect();
        self.staged.insert(seq, staged);
        // Like UCX, the lane keeps the frames while the transfer may still read them.
        self.held.insert(seq, std::mem::take(&mut message.frames));
        Ok(Described { frames, regions, staged_bytes: staged as u64, bounced_bytes: 0 })
    }

    fn release(&mut self, seq: u64, message: &mut Message, acknowledged: bool) -> Released {
        if self.frames_lost {
            self.held.remove(&seq);
            self.staged.remove(&seq);
            return Released::FramesLost;
        }
        if acknowledged && self.release_pending && self.held.contains_key(&seq) && !self.finished.contains(&seq) {
            self.unfinished.insert(seq);
            return Released::Pending;
        }
        self.unfinished.remove(&seq);
        self.finished.remove(&seq);
        self.staged.remove(&seq);
        if let Some(frames) = self.held.remove(&seq) {
            message.frames = frames;
        }
        Released::Whole
    }

    fn settle(&mut self, acknowledged: &[u64]) {
        for seq in acknowledged {
            if self.unfinished.remove(seq) {
                self.finished.insert(*seq);
            }
        }
    }

    fn push(&mut self, seq: u64, message: &Message, targets: &[DeviceFrameDescriptor]) -> Result<(), LaneFailure> {
        let frames = self.held.get(&seq).unwrap_or(&message.frames);
        let device: Vec<&Frame> = frames.iter().filter(|f| f.as_device().is_some()).collect();
        if device.len() != targets.len() {
            return Err(LaneFailure::peer(format!("{} targets for {} device frames", targets.len(), device.len())));
        }
        let mut mem = self.mem.borrow_mut();
        for (f, t) in device.iter().zip(targets) {
            let bytes = mem.device.get(&f.as_device().expect("device").device_ptr()).cloned().expect("source");
            let target = mem.device.get_mut(&sim_buffer(t)).ok_or_else(|| LaneFailure::peer("unknown target"))?;
            if target.len() != bytes.len() {
                return Err(LaneFailure::peer("target of the wrong length"));
            }
            *target = bytes;
        }
        self.pushes += 1;
        Ok(())
    }

    fn send_into_offer(
        &mut self,
        _id: u64,
        seq: u64,
        message: &Message,
        offer: u64,
        targets: &[DeviceFrameDescriptor],
    ) -> Result<Vec<FrameDescriptor>, LaneFailure> {
        let mut mem = self.mem.borrow_mut();
        let mut out = Vec::new();
        for (i, (f, t)) in message.frames.iter().zip(targets).enumerate() {
            let d = f.as_device().ok_or_else(|| LaneFailure::local("a host frame"))?;
            let bytes = mem.device.get(&d.device_ptr()).cloned().expect("source");
            let target = mem.device.get_mut(&sim_buffer(t)).ok_or_else(|| LaneFailure::peer("unknown offer buffer"))?;
            *target = bytes;
            out.push(FrameDescriptor::DeviceOffered {
                offer,
                index: i as u32,
                len: t.len,
                ready: Some([3; 64]),
                gate: None,
            });
        }
        self.events.push(LaneEvent::OfferedSendDone { seq });
        Ok(out)
    }

    fn readiness(&mut self, _data: &DataMessage) -> Readiness {
        match self.readiness_pending {
            true => Readiness::Pending,
            false => Readiness::Ready,
        }
    }

    fn land(
        &mut self,
        data: &DataMessage,
        into: Option<Vec<Frame>>,
        offer: Option<u64>,
        on: Option<&ProducerStream>,
    ) -> Landing<TestPayload> {
        if let Some(offer) = offer {
            return self.land_offered(data, offer);
        }
        match &self.land_mode {
            LandMode::Refuse(reason) => return Landing::Refused { reason: reason.clone(), into },
            LandMode::FailLocal(reason) => return Landing::Failed(LaneFailure::local(reason.clone())),
            _ => {}
        }
        if data.frames.iter().any(|f| matches!(f, FrameDescriptor::DevicePush { .. })) {
            return self.land_pushed(data, into);
        }
        let mut frames = Vec::new();
        for d in &data.frames {
            match self.land_frame(d) {
                Ok(f) => frames.push(f),
                Err(failure) => return Landing::Failed(failure),
            }
        }
        let frames = match into {
            Some(buffers) => match self.copy_into(&Message { header: vec![], frames }, buffers) {
                Ok(frames) => {
                    self.landed_into_callers.push(data.seq);
                    frames
                }
                Err(m) => return Landing::Refused { reason: m.reason, into: Some(m.buffers) },
            },
            None => frames,
        };
        let message = Message { header: data.header.clone(), frames };
        match self.land_mode {
            LandMode::InProgress => {
                self.in_progress.push_back((data.seq, message));
                Landing::InProgress
            }
            _ if on.is_some() && data.frames.iter().any(|f| matches!(f, FrameDescriptor::Device(_))) => {
                self.copying.push(data.seq);
                Landing::DoneCopying(message)
            }
            _ => Landing::Done(message),
        }
    }

    fn wait_copies(&mut self, seq: u64) -> Result<(), LaneFailure> {
        let at = self.copying.iter().position(|&s| s == seq).ok_or_else(|| LaneFailure::local("no such copies"))?;
        self.copies_waited.push(self.copying.remove(at));
        Ok(())
    }

    fn finish_push(&mut self, seq: u64) -> Result<Message, LaneFailure> {
        let (header, slots) = self.push_targets.remove(&seq).ok_or_else(|| LaneFailure::local("no such push"))?;
        let frames = slots
            .into_iter()
            .map(|slot| match slot {
                PushSlot::Landed(f) | PushSlot::Given(f) => f,
                PushSlot::Target(ptr) => self.device_frame_at(ptr),
            })
            .collect();
        Ok(Message { header, frames })
    }

    fn copy_into(
        &mut self,
        message: &Message,
        mut buffers: Vec<Frame>,
    ) -> Result<Vec<Frame>, CopyMismatch<TestPayload>> {
        let fits = buffers.len() == message.frames.len()
            && buffers.iter().zip(&message.frames).all(|(b, f)| b.len() == f.len() && b.kind() == f.kind());
        if !fits {
            return Err(CopyMismatch { reason: "buffers do not fit".into(), buffers });
        }
        for (b, f) in buffers.iter_mut().zip(&message.frames) {
            let bytes = frame_bytes(&self.mem, f);
            match b {
                Frame::Host(h) => h.as_mut_slice().copy_from_slice(&bytes),
                Frame::Device(d) => {
                    self.mem.borrow_mut().device.insert(d.device_ptr(), bytes);
                }
            }
        }
        Ok(buffers)
    }

    fn make_offer(&mut self, offer: u64, lens: &[u64]) -> Option<Vec<DeviceFrameDescriptor>> {
        if !self.offers_enabled {
            return None;
        }
        let mut targets = Vec::new();
        for (i, &len) in lens.iter().enumerate() {
            let ptr = offer_buffer_id(offer, i as u64);
            self.mem.borrow_mut().device.insert(ptr, vec![0; len as usize]);
            targets.push(device_desc(ptr, len));
        }
        self.offers_made.insert(offer, lens.to_vec());
        Some(targets)
    }

    fn drop_offer(&mut self, offer: u64) {
        self.offers_made.remove(&offer);
        self.offers_dropped.push(offer);
    }

    fn offer_receive_buffers(&mut self, offer: u64, _recv: u64, buffers: Vec<Frame>) -> ReceiveOffer<TestPayload> {
        if !self.offers_enabled || buffers.iter().any(|f| f.as_device().is_none()) {
            return ReceiveOffer::Never(buffers);
        }
        if self.receive_offer_delays > 0 {
            self.receive_offer_delays -= 1;
            return ReceiveOffer::NotYet(buffers);
        }
        let targets =
            buffers.iter().filter_map(Frame::as_device).map(|d| device_desc(d.device_ptr(), d.len() as u64)).collect();
        self.receive_offers.insert(offer, buffers);
        ReceiveOffer::Made { targets, regions: Vec::new() }
    }

    fn take_back_offer(&mut self, offer: u64) -> Option<Vec<Frame>> {
        self.offers_dropped.push(offer);
        self.receive_offers.remove(&offer)
    }

    fn grant_import(&mut self, key: &RemoteKey) -> Result<LaneGrant<TestPayload>, String> {
        let registration = self.registry.grant(key)?;
        let d = registration.frame.as_device().ok_or("sim registrations are device frames")?;
        let memory = GrantedMemory::Device(device_desc(d.device_ptr(), d.len() as u64));
        Ok(LaneGrant { registration, memory, regions: Vec::new() })
    }

    fn release_grant(&mut self, registration: u64) {
        self.released.push(registration);
        self.registry.release_grant(registration);
    }

    fn open_grant(&mut self, granted: &GrantedRegion) -> Result<(), String> {
        let GrantedMemory::Device(desc) = &granted.memory else { return Err("not sim memory".into()) };
        let ptr = sim_buffer(desc);
        let len = self.mem.borrow().device.get(&ptr).map(|b| b.len() as u64);
        if len != Some(granted.len) {
            return Err(format!("buffer {ptr} is not {} bytes", granted.len));
        }
        self.opened.insert(granted.grant, (ptr, granted.len));
        Ok(())
    }

    fn close_grant(&mut self, grant: u64) {
        self.opened.remove(&grant);
        self.closed_grants.push(grant);
    }

    fn runs_own_transfer(&self, _t: &LocalTransfer<'_, TestPayload>) -> bool {
        self.runs_own
    }

    fn start_transfer(&mut self, id: u64, t: &LocalTransfer<'_, TestPayload>) -> Result<(), String> {
        self.prepared_runs.extend(t.prepared.map(|p| (true, p)));
        let &(theirs, _) = self.opened.get(&t.grant).ok_or("grant not open")?;
        let mine = t.local.frame.as_device().ok_or("a host registration")?.device_ptr();
        let spans: Vec<(u64, u64, u64)> = t.spans.iter().map(|s| (s.local_offset, s.remote_offset, s.len)).collect();
        self.sim_copies(mine, theirs, &spans, t.op == TransferOp::Put)?;
        self.take_gate(id);
        self.finished(true, id);
        Ok(())
    }

    fn early_notify_gate(&mut self, id: u64) -> Option<crate::wire::NotifyGate> {
        self.gate_of.get(&id).copied()
    }

    fn gate_open(&self, gate: crate::wire::NotifyGate) -> Result<bool, String> {
        if gate.index >= 16 {
            return Err(format!("no gate word {}", gate.index));
        }
        Ok(gate.opened_by(self.mem.borrow().gates.get(&gate.index).copied().unwrap_or(0)))
    }

    fn describe_transfer(
        &mut self,
        id: u64,
        t: &LocalTransfer<'_, TestPayload>,
    ) -> Result<Option<DescribedTransfer>, String> {
        if let Some(reason) = &self.describe_transfer_error {
            return Err(reason.clone());
        }
        let d = t.local.frame.as_device().ok_or("sim registrations are device frames")?;
        let memory = GrantedMemory::Device(device_desc(d.device_ptr(), d.len() as u64));
        let described = DescribedTransfer { memory, len: t.local.len(), spans: None, regions: Vec::new() };
        if self.describe_later {
            self.described_later.push((id, described));
            return Ok(None);
        }
        Ok(Some(described))
    }

    fn transfer_answered(&mut self, id: u64, done: bool) -> Result<bool, String> {
        self.answered.push((id, done));
        if let Some(reason) = self.finish_error.take() {
            return Err(reason);
        }
        if done && self.finish_later {
            self.finishing.push(id);
            return Ok(false);
        }
        Ok(true)
    }

    fn keeps_prepared_transfers(&self) -> bool {
        self.keeps_prepared
    }

    fn release_prepared(&mut self, prepared: u64, own: bool) {
        self.prepared_released.push((prepared, own));
    }

    fn run_peer_transfer(&mut self, id: u64, t: &PeerTransfer<'_, TestPayload>) -> Result<(), LaneFailure> {
        self.prepared_runs.extend(t.prepared.map(|p| (false, p)));
        let GrantedMemory::Device(desc) = t.peer_memory else { return Err(LaneFailure::peer("not sim memory")) };
        let theirs = sim_buffer(desc);
        let mine = t.registration.frame.as_device().ok_or_else(|| LaneFailure::local("host"))?.device_ptr();
        // The owner copies: its registration is "mine".
        let spans: Vec<(u64, u64, u64)> = t.spans.iter().map(|s| (s.remote_offset, s.local_offset, s.len)).collect();
        self.sim_copies(mine, theirs, &spans, t.op == TransferOp::Get).map_err(LaneFailure::peer)?;
        self.finished(false, id);
        Ok(())
    }

    fn import_regions(&mut self, list: &[RegionAnnouncement], fds: &mut VecDeque<OwnedFd>) -> Result<(), String> {
        for a in list {
            fds.pop_front().ok_or_else(|| format!("region {} came without its descriptor", a.region_id))?;
            self.imported.insert(a.region_id, a.len);
        }
        Ok(())
    }

    fn forget_region(&mut self, region_id: u64) {
        self.imported.remove(&region_id);
        self.forgotten.push(region_id);
    }

    fn dropped_regions(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.dropped)
    }

    fn poll(&mut self, events: &mut Vec<LaneEvent<TestPayload>>) -> bool {
        events.append(&mut self.events);
        !self.in_progress.is_empty() || !self.unfinished.is_empty() || !self.copying.is_empty()
    }

    fn offer_received(&mut self, offer: u64, _targets: &[DeviceFrameDescriptor]) {
        self.offers_received.push(offer);
    }

    fn offer_given_up(&mut self, offer: u64) {
        self.offers_given_up.push(offer);
    }

    fn has_lent_buffers(&self) -> bool {
        !self.offers_made.is_empty()
    }

    fn hold_lent_buffers(&mut self) {
        self.lent_held = true;
    }

    fn release_lent_buffers(&mut self) {
        self.lent_held = false;
        self.lent_released += 1;
        self.offers_made.clear();
    }

    fn close(&mut self) {
        self.closed += 1;
        self.in_progress.clear();
        self.copying.clear();
    }
}
