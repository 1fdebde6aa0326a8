//! The lanes: how the bytes of a message travel, each behind [`Lane`] (the protocol
//! core's [`CoreLane`] plus what the driver asks of a lane).
//!
//! - `native/`: same machine and user: host frames through memfds, device frames as
//!   CUDA IPC handles (pull, or connector copies with push offers).
//! - `ucx/`: frame payloads as UCX tagged messages, device frames whole or staged.
//!
//! The CUDA state both lanes share (export, mapping, copies, producer order) is not a
//! lane: it is [`DeviceState`], in `device/` beside this folder.
//!
//! Adding a lane: a folder here with a type implementing [`Lane`], a [`crate::LaneKind`]
//! variant and its rule in `negotiate.rs`, and its construction in `driver/lane.rs`.

pub(crate) mod native;
pub(crate) mod ucx;

use crate::device::{describe, DeviceState, ProducerMarks};
use crate::payload::{CopyMismatch, MemoryPayload};
use ferrylink_ipc::control_ring::ControlRingMemory;
use ferrylink_ipc::MemfdPool;
use ferrylink_memory::{Frame, HostBuffer, Message};
use ferrylink_proto::connection::lane::CoreLane;
use ferrylink_proto::stats::ContextStats;
use std::sync::Arc;

/// A lane as the driver holds it.
pub(crate) trait Lane: CoreLane<MemoryPayload> {
    /// The sending thread recorded producer marks for request `id`.
    fn note_producer(&mut self, id: u64, marks: ProducerMarks);

    /// The posting thread recorded events on receive `id`'s buffers' producer streams
    /// (kept by lanes that offer receive buffers to the peer; dropped otherwise).
    fn note_target_marks(&mut self, _id: u64, _marks: crate::device::TargetMarks) {}

    /// Adds what the lane holds to the context's statistics.
    fn add_stats(&self, _s: &mut ContextStats) {}

    /// The connection's control rings are in use (`connector`: this side connected):
    /// a lane may use their gate words.
    fn use_control_ring(&mut self, _ring: &Arc<ControlRingMemory>, _connector: bool) {}

    /// Whether this lane's transfers need the UCX worker progressed.
    fn uses_ucx(&self) -> bool {
        false
    }
}

/// Copies a landed message into a receive's own buffers; hands them back on a mismatch.
pub(crate) fn copy_landed_into(
    device: &DeviceState,
    message: &Message,
    mut buffers: Vec<Frame>,
) -> Result<Vec<Frame>, CopyMismatch> {
    if message.frames.len() != buffers.len() {
        let reason = format!("{} frames arrived for {} buffers", message.frames.len(), buffers.len());
        return Err(CopyMismatch { reason, buffers });
    }
    for (i, (src, dst)) in message.frames.iter().zip(&buffers).enumerate() {
        if src.len() != dst.len() || src.kind() != dst.kind() {
            let reason = format!("frame {i} ({} bytes) does not fit buffer {i} ({} bytes)", src.len(), dst.len());
            return Err(CopyMismatch { reason, buffers });
        }
    }
    for i in 0..buffers.len() {
        match (&message.frames[i], &mut buffers[i]) {
            (Frame::Host(s), Frame::Host(d)) => d.as_mut_slice().copy_from_slice(s.as_slice()),
            (Frame::Device(s), Frame::Device(d)) => {
                if let Err(e) = device.copy_device_to_device(s, d) {
                    return Err(CopyMismatch { reason: describe(e), buffers });
                }
            }
            _ => return Err(CopyMismatch { reason: format!("frame {i} changed kind"), buffers }),
        }
    }
    Ok(buffers)
}

/// Memory for a received host frame: from the landing pool when it has room, else a
/// plain vector; `None` when the memory cannot be had (the message is then refused).
pub(crate) fn landing_buffer(pool: &MemfdPool, len: usize) -> Option<HostBuffer> {
    match pool.alloc(len) {
        Ok(Some(buf)) => Some(buf),
        Ok(None) => HostBuffer::try_zeroed(len),
        Err(e) => {
            tracing::warn!("landing pool: {e}; receiving into a plain vector");
            HostBuffer::try_zeroed(len)
        }
    }
}
