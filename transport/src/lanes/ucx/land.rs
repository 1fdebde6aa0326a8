//! Landing a message on the UCX lane: targets allocated (or the receive's own), receives
//! posted; the message is reported landed, in order, once they all completed.

use super::engine::MAX_FRAMES;
use super::landing_state::UcxLanding;
use super::ops::{Progress, RecvOp, StagedRecv};
use super::UcxLane;
use crate::payload::{Landing, LaneEvent};
use ferrylink_memory::{Frame, Message};
use ferrylink_proto::connection::lane::LaneFailure;
use ferrylink_proto::wire::{DataMessage, FrameDescriptor};

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

impl UcxLane {
    /// Starts landing `data`: targets allocated (or `into`), receives posted.
    pub(super) fn start_landing(&mut self, data: &DataMessage, into: Option<Vec<Frame>>) -> Landing {
        let total: u64 = data.frames.iter().map(FrameDescriptor::len).sum();
        if total > self.settings.max_message_bytes {
            let limit = self.settings.max_message_bytes;
            let reason = format!("a message of {total} bytes exceeds this receiver's limit of {limit}");
            return Landing::Failed(LaneFailure::local(reason));
        }
        if let Err(reason) = check_ucx_descriptors(data, self.device.has_cuda()) {
            return Landing::Failed(LaneFailure::peer(reason));
        }
        let targets = match into {
            Some(buffers) => {
                // UCX (or the staging copies) write them: the caller's work queued on them
                // comes first.
                if let Err(e) = self.device.wait_for_target_producers(buffers.iter().filter_map(Frame::as_device)) {
                    return Landing::Failed(LaneFailure::local(format!(
                        "a receive target's stream: {}",
                        crate::device::describe(e)
                    )));
                }
                buffers
            }
            None => match self.allocate_targets(data) {
                Ok(targets) => targets,
                Err(reason) => return Landing::Failed(LaneFailure::local(reason)),
            },
        };
        let Some(conn) = &self.conn else { return Landing::Failed(LaneFailure::local("the UCX endpoint is closed")) };
        let prefix = conn.recv_prefix;
        let mut frames: Vec<Option<Frame>> = Vec::with_capacity(targets.len());
        let mut ops = Vec::new();
        for (index, (desc, target)) in data.frames.iter().zip(targets).enumerate() {
            match (desc, target) {
                (FrameDescriptor::Inline(bytes), Frame::Host(mut h)) => {
                    h.as_mut_slice().copy_from_slice(bytes);
                    frames.push(Some(Frame::Host(h)));
                }
                (FrameDescriptor::Remote { chunk: 0, .. }, target) => {
                    match RecvOp::whole(&self.engine.worker, prefix, data.seq, index, target) {
                        Ok(op) => ops.push(op),
                        Err(e) => {
                            return Landing::Failed(LaneFailure::local(format!("posting a UCX receive failed: {e}")))
                        }
                    }
                    frames.push(None);
                }
                (FrameDescriptor::Remote { chunk, .. }, Frame::Device(d)) => {
                    match StagedRecv::start(d, *chunk, data.seq, index) {
                        Ok(op) => ops.push(RecvOp::Staged(op)),
                        Err(e) => {
                            return Landing::Failed(LaneFailure::local(format!(
                                "starting a staged receive failed: {e}"
                            )))
                        }
                    }
                    frames.push(None);
                }
                _ => return Landing::Failed(LaneFailure::peer("a frame does not fit the UCX lane")),
            }
        }
        let done = vec![false; ops.len()];
        self.landings.push_back(UcxLanding { seq: data.seq, header: data.header.clone(), frames, ops, done });
        Landing::InProgress
    }

    fn allocate_targets(&self, data: &DataMessage) -> Result<Vec<Frame>, String> {
        let mut targets = Vec::with_capacity(data.frames.len());
        for desc in &data.frames {
            targets.push(match desc {
                FrameDescriptor::Remote { len, device: true, .. } => {
                    match self.device.allocate(self.device.default_landing_device(), *len as usize) {
                        Ok(buf) => Frame::Device(buf),
                        Err(e) => return Err(format!("cannot allocate a received device frame: {e:?}")),
                    }
                }
                other => match crate::lanes::landing_buffer(&self.landing, other.len() as usize) {
                    Some(buf) => Frame::Host(buf),
                    None => return Err(format!("cannot allocate {} bytes for a received frame", other.len())),
                },
            });
        }
        Ok(targets)
    }

    /// Progresses the receives; reports the messages landed, in order. Whether any is
    /// still landing.
    pub(super) fn poll_landings(&mut self, events: &mut Vec<LaneEvent>) -> bool {
        let Some(conn) = &self.conn else { return false };
        let prefix = conn.recv_prefix;
        for landing in self.landings.iter_mut() {
            for (op, done) in landing.ops.iter_mut().zip(landing.done.iter_mut()) {
                if *done {
                    continue;
                }
                match op.poll(&self.engine.worker, prefix, &self.engine) {
                    Progress::Pending => {}
                    Progress::Done => *done = true,
                    Progress::Failed(reason) => {
                        events.push(LaneEvent::Failed { reason });
                        return false;
                    }
                }
            }
        }
        while self.landings.front().is_some_and(|l| l.done.iter().all(|&d| d)) {
            let Some(mut landing) = self.landings.pop_front() else { break };
            for op in landing.ops.drain(..) {
                if let Some((i, frame)) = op.finish() {
                    landing.frames[i] = Some(frame);
                }
            }
            let Some(frames) = landing.frames.into_iter().collect::<Option<Vec<Frame>>>() else {
                events.push(LaneEvent::Failed { reason: "a received frame went missing".into() });
                return false;
            };
            let message = Message { header: landing.header, frames };
            events.push(LaneEvent::Landed { seq: landing.seq, message });
        }
        !self.landings.is_empty()
    }
}
