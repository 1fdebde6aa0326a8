//! A connection on the UCX lane: describing and posting sends, landing messages whose
//! payload arrives as tagged messages, and polling both from the progress loop.

use super::conn::{Conn, Phase};
use super::native::{InFlight, PostedRecv, RecvSlot};
use super::ucx_lane::{stage_chunk, Progress, RecvOp, SendOp, StagedRecv, StagedSend, UcxConn, MAX_FRAMES};
use crate::config::Config;
use crate::endpoint::Counters;
use crate::error::{RecvError, SendError, TransportError};
use crate::wire::{encode_frame, AckResult, DataMessage, FrameDescriptor, WireMessage, INLINE_BUDGET};
use ferrylink_memory::{Frame, HostBuffer, Message};

/// How one frame travels on the UCX lane.
enum Plan {
    Inline,
    Whole,
    Staged,
}

fn plan_frames(message: &Message, ucx: &UcxConn, config: &Config) -> Vec<Plan> {
    let mut inline_total = 0usize;
    message
        .frames
        .iter()
        .map(|frame| match frame {
            Frame::Host(h) if h.len() <= config.inline_threshold && inline_total + h.len() <= INLINE_BUDGET => {
                inline_total += h.len();
                Plan::Inline
            }
            Frame::Host(_) => Plan::Whole,
            Frame::Device(_) if ucx.direct_device => Plan::Whole,
            Frame::Device(_) => Plan::Staged,
        })
        .collect()
}

/// The descriptor of a message on the UCX lane.
pub(super) fn describe_for_ucx(
    message: &Message,
    seq: u64,
    ucx: &UcxConn,
    config: &Config,
) -> Result<DataMessage, TransportError> {
    if message.frames.len() > MAX_FRAMES {
        return Err(TransportError::InvalidMessage(format!(
            "{} frames; the UCX lane carries at most {MAX_FRAMES}",
            message.frames.len()
        )));
    }
    let frames = message
        .frames
        .iter()
        .zip(plan_frames(message, ucx, config))
        .map(|(frame, plan)| match (plan, frame) {
            (Plan::Inline, Frame::Host(h)) => FrameDescriptor::Inline(h.to_vec()),
            (Plan::Staged, f) => {
                FrameDescriptor::Remote { len: f.len() as u64, device: true, chunk: stage_chunk(f.len() as u64) }
            }
            (_, f) => FrameDescriptor::Remote { len: f.len() as u64, device: f.as_device().is_some(), chunk: 0 },
        })
        .collect();
    Ok(DataMessage { seq, header: message.header.clone(), frames })
}

/// A message whose payload is arriving.
pub(crate) struct UcxLanding {
    seq: u64,
    header: Vec<u8>,
    frames: Vec<Option<Frame>>,
    ops: Vec<RecvOp>,
    done: Vec<bool>,
    pub(super) slot: Option<RecvSlot>,
    pub(super) payload: u64,
}

impl Conn {
    /// Posts the tagged sends of a message just described (frames sent whole move into
    /// their requests and come back when they complete).
    pub(super) fn ucx_post_sends(
        &mut self,
        seq: u64,
        descriptors: &[FrameDescriptor],
        flight: &mut InFlight,
    ) -> Result<(), String> {
        let Some(ucx) = &self.ucx else { return Err("no UCX endpoint".into()) };
        let plans = descriptors.iter().map(|d| match d {
            FrameDescriptor::Remote { chunk: 0, .. } => Plan::Whole,
            FrameDescriptor::Remote { .. } => Plan::Staged,
            _ => Plan::Inline,
        });
        for (index, plan) in plans.enumerate() {
            match plan {
                Plan::Inline => {}
                Plan::Whole => {
                    // Device frames: their producers' work is done (the send waited for it
                    // before it was described), so UCX may copy them on its own streams.
                    let frame =
                        std::mem::replace(&mut flight.message.frames[index], Frame::Host(HostBuffer::zeroed(0)));
                    match SendOp::whole(ucx, seq, index, frame) {
                        Ok(op) => flight.ucx_ops.push(op),
                        Err((reason, frame)) => {
                            flight.message.frames[index] = frame;
                            return Err(format!("posting a UCX send failed: {reason}"));
                        }
                    }
                }
                Plan::Staged => {
                    let Frame::Device(d) = &flight.message.frames[index] else {
                        unreachable!("staged frames are device frames")
                    };
                    flight.ucx_ops.push(SendOp::Staged(StagedSend::start(d, seq, index)?));
                }
            }
        }
        Ok(())
    }

    /// Starts landing a message: targets allocated (or the receive's own), receives
    /// posted. It is delivered, in order, once they all completed.
    pub(super) fn ucx_start_landing(
        &mut self,
        data: DataMessage,
        recv: Option<PostedRecv>,
        payload: u64,
        config: &Config,
    ) {
        let total: u64 = data.frames.iter().map(FrameDescriptor::len).sum();
        if total > config.max_message_bytes {
            let limit = config.max_message_bytes;
            return self.fail_peer(format!("a message of {total} bytes exceeds this receiver's limit of {limit}"));
        }
        if let Err(reason) = check_ucx_descriptors(&data, self.device.has_cuda()) {
            if let Some(r) = recv {
                self.native.posted.push_front(r);
            }
            return self.protocol_error(&reason);
        }
        // Buffers that do not fit fail that receive only; the message lands in fresh memory.
        let (mut into, mut slot) = match recv {
            Some(r) => (r.into, Some(r.slot)),
            None => (None, None),
        };
        if let Some(buffers) = into.take() {
            match super::native::check_targets(&data.frames, &buffers) {
                Ok(()) => into = Some(buffers),
                Err(reason) => {
                    if let Some(s) = slot.take() {
                        s.complete(Err(RecvError {
                            error: TransportError::BufferMismatch(reason),
                            buffers: Some(buffers),
                        }));
                    }
                }
            }
        }
        let mut targets = match into {
            Some(buffers) => buffers,
            None => {
                let mut targets = Vec::with_capacity(data.frames.len());
                for desc in &data.frames {
                    targets.push(match desc {
                        FrameDescriptor::Remote { len, device: true, .. } => {
                            match self.device.allocate(self.device.default_landing_device(), *len as usize) {
                                Ok(buf) => Frame::Device(buf),
                                Err(e) => {
                                    return self.fail_peer(format!("cannot allocate a received device frame: {e:?}"))
                                }
                            }
                        }
                        other => match self.landing_buffer(other.len() as usize) {
                            Some(buf) => Frame::Host(buf),
                            None => {
                                return self
                                    .fail_peer(format!("cannot allocate {} bytes for a received frame", other.len()))
                            }
                        },
                    });
                }
                targets
            }
        };
        let Some(engine) = self.ucx_engine.clone() else { return self.fail_peer("UCX is not loaded".into()) };
        let prefix = self.ucx.as_ref().map_or(0, |u| u.recv_prefix);
        let mut frames: Vec<Option<Frame>> = Vec::with_capacity(targets.len());
        let mut ops = Vec::new();
        for (index, (desc, target)) in data.frames.iter().zip(targets.drain(..)).enumerate() {
            match (desc, target) {
                (FrameDescriptor::Inline(bytes), Frame::Host(mut h)) => {
                    h.as_mut_slice().copy_from_slice(bytes);
                    frames.push(Some(Frame::Host(h)));
                }
                (FrameDescriptor::Remote { chunk: 0, .. }, target) => {
                    match RecvOp::whole(&engine.worker, prefix, data.seq, index, target) {
                        Ok(op) => ops.push(op),
                        Err(e) => return self.fail_peer(format!("posting a UCX receive failed: {e}")),
                    }
                    frames.push(None);
                }
                (FrameDescriptor::Remote { chunk, .. }, Frame::Device(d)) => {
                    match StagedRecv::start(d, *chunk, data.seq, index) {
                        Ok(op) => ops.push(RecvOp::Staged(op)),
                        Err(e) => return self.fail_peer(format!("starting a staged receive failed: {e}")),
                    }
                    frames.push(None);
                }
                _ => return self.protocol_error("a frame does not fit the UCX lane"),
            }
        }
        if slot.is_none() {
            self.native.landed_bytes += payload as usize;
        }
        let done = vec![false; ops.len()];
        self.native.ucx_landing.push_back(UcxLanding {
            seq: data.seq,
            header: data.header,
            frames,
            ops,
            done,
            slot,
            payload,
        });
    }

    /// Progresses this connection's UCX transfers; whether any is still pending.
    pub fn poll_ucx(&mut self, config: &Config) -> bool {
        if self.phase != Phase::Established {
            return false;
        }
        let (Some(ucx), Some(engine)) = (&self.ucx, self.ucx_engine.clone()) else { return false };
        if let Some(status) = ucx.endpoint.error() {
            self.fail_peer(format!("the UCX endpoint failed: {status}"));
            return false;
        }
        let prefix = ucx.recv_prefix;
        let mut busy = false;
        let mut finished = Vec::new();
        let mut failure = None;
        let device = &self.device;
        for (&seq, flight) in self.native.in_flight.iter_mut() {
            let mut all_done = true;
            for op in &mut flight.ucx_ops {
                match op.poll(ucx, device) {
                    Progress::Pending => all_done = false,
                    Progress::Done => {}
                    Progress::Failed(e) => failure = Some(e),
                }
            }
            busy |= !all_done;
            if all_done && flight.acked.is_some() {
                finished.push(seq);
            }
        }
        if let Some(reason) = failure {
            self.fail_peer(reason);
            return false;
        }
        for seq in &finished {
            let mut flight = self.native.in_flight.remove(seq).expect("listed above");
            let result = flight.acked.take().expect("acked");
            if flight.take_back_frames() {
                self.complete_send(flight, result);
            } else {
                let error = TransportError::InvalidMessage("a frame stayed inside UCX after its send completed".into());
                flight.slot.complete(Err(SendError { error, message: None }));
            }
        }
        // Receives.
        for landing in self.native.ucx_landing.iter_mut() {
            for (op, done) in landing.ops.iter_mut().zip(landing.done.iter_mut()) {
                if *done {
                    continue;
                }
                match op.poll(&engine.worker, prefix, &self.device) {
                    Progress::Pending => {}
                    Progress::Done => *done = true,
                    Progress::Failed(e) => failure = Some(e),
                }
            }
        }
        if let Some(reason) = failure {
            self.fail_peer(reason);
            return false;
        }
        let mut delivered = false;
        while self.native.ucx_landing.front().is_some_and(|l| l.done.iter().all(|&d| d)) {
            let mut landing = self.native.ucx_landing.pop_front().expect("checked");
            for op in landing.ops.drain(..) {
                if let Some((i, frame)) = op.finish() {
                    landing.frames[i] = Some(frame);
                }
            }
            let Some(frames) = landing.frames.into_iter().collect::<Option<Vec<Frame>>>() else {
                self.fail_peer("a received frame went missing".into());
                return false;
            };
            self.queue(encode_frame(&WireMessage::Ack { seq: landing.seq, result: AckResult::Delivered }), Vec::new());
            if let Some(c) = self.counters() {
                Counters::add(&c.messages_received, 1);
                Counters::add(&c.payload_bytes_received, landing.payload);
            }
            let message = Message { header: landing.header, frames };
            match landing.slot {
                Some(slot) => slot.complete(Ok(message)),
                None => self.native.landed.push_back(message),
            }
            delivered = true;
        }
        if delivered || !finished.is_empty() {
            self.flush();
            self.match_posted(config);
            self.pump_sends_pub(config);
        }
        busy || !self.native.ucx_landing.is_empty()
    }
}

impl Conn {
    /// Before a UCX connection is failed: sends the peer already acknowledged are
    /// delivered; give their local requests a bounded moment to report completion (the
    /// peer may close right after its ack), then hand them back as successes.
    pub(super) fn settle_acknowledged_sends(&mut self) {
        let (Some(ucx), Some(engine)) = (&self.ucx, self.ucx_engine.clone()) else { return };
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(200);
        loop {
            let mut pending = false;
            for flight in self.native.in_flight.values_mut().filter(|f| f.acked.is_some()) {
                for op in &mut flight.ucx_ops {
                    pending |= matches!(op.poll(ucx, &self.device), Progress::Pending);
                }
            }
            if !pending || std::time::Instant::now() > deadline {
                break;
            }
            engine.worker.progress();
        }
        let settled: Vec<u64> = self
            .native
            .in_flight
            .iter_mut()
            .filter(|(_, f)| f.acked.is_some())
            .filter_map(|(&seq, f)| {
                let done = f.ucx_ops.iter_mut().all(|op| !matches!(op.poll(ucx, &self.device), Progress::Pending));
                done.then_some(seq)
            })
            .collect();
        for seq in settled {
            let mut flight = self.native.in_flight.remove(&seq).expect("listed above");
            let result = flight.acked.take().expect("acked");
            if flight.take_back_frames() {
                self.complete_send(flight, result);
            } else {
                // Delivered, but a frame is still UCX's: the message cannot come back.
                let peer = self.peer.clone();
                flight.slot.complete(Err(SendError { error: TransportError::PeerClosed { peer }, message: None }));
            }
        }
    }
}

/// Descriptors a UCX-lane message may carry.
fn check_ucx_descriptors(data: &DataMessage, has_cuda: bool) -> Result<(), String> {
    if data.frames.len() > MAX_FRAMES {
        return Err(format!("{} frames; the UCX lane carries at most {MAX_FRAMES}", data.frames.len()));
    }
    for (i, d) in data.frames.iter().enumerate() {
        match d {
            FrameDescriptor::Inline(_) => {}
            FrameDescriptor::Remote { device: true, .. } if !has_cuda => {
                return Err(format!("frame {i} is device memory, and this process has no CUDA device to land it on"))
            }
            FrameDescriptor::Remote { device: false, chunk, .. } if *chunk != 0 => {
                return Err(format!("frame {i}: host frames are never staged"))
            }
            FrameDescriptor::Remote { .. } => {}
            FrameDescriptor::HostRegion { .. }
            | FrameDescriptor::Device(_)
            | FrameDescriptor::DevicePush { .. }
            | FrameDescriptor::DeviceOffered { .. } => {
                return Err(format!("frame {i} is a shared-memory descriptor, which the UCX lane never carries"))
            }
        }
    }
    Ok(())
}
