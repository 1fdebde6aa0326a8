//! The UCX lane: control messages on the bootstrap stream (Unix or TCP), frame payloads
//! as UCX tagged messages.
//!
//! The sender posts its tag sends as it describes a message; the receiver posts matching
//! receives when it lands the message and reports it landed, in order, when every
//! receive completed. Host frames and, when both sides' UCX is CUDA-aware, device frames
//! travel as one tagged message each, straight from and into the buffers (ownership
//! moves into the UCX request and back, so a failed connection never frees memory UCX
//! still uses). Device frames through a UCX without CUDA support are staged through
//! pinned host memory (`ops.rs`).
//!
//! - `engine.rs`: context-wide UCX state, the endpoint, the tag layout.
//! - `ops.rs`: one frame's transfer, whole or staged.
//! - `land.rs`: landing a message.
//! - `onesided.rs`: one-sided transfers with UCX's RMA (opt-in, `FERRYLINK_UCX_RMA=1`).
//! - `staged.rs`: one-sided transfers through pinned host memory, for memory this UCX
//!   does not move itself.
//! - `wakeups.rs`: what woke the progress thread while the worker was armed (its event
//!   fd, or the tick's re-poll), counted for tests.

mod engine;
mod land;
mod landing_state;
mod onesided;
mod onesided_state;
mod ops;
mod staged;
mod wakeups;

pub(crate) use engine::{direct_device, UcxConn, UcxEngine};
pub(crate) use wakeups::WakeupWatch;
#[cfg(feature = "testing")]
pub use wakeups::{ucx_wakeups, UcxWakeups};

use super::{copy_landed_into, Lane};
use crate::device::{Copier, DeviceState, ProducerMarks, ProducerOrders};
use crate::error::TransportError;
use crate::payload::{
    CopyMismatch, Landing, LaneEvent, LaneGrant, LocalTransfer, MemoryPayload, PeerTransfer, Registry,
};
use engine::{stage_chunk, MAX_FRAMES};
use ferrylink_ipc::MemfdPool;
use ferrylink_memory::{Frame, HostBuffer, Message};
use ferrylink_proto::connection::lane::{
    CoreLane, DescribeError, Described, DescribedTransfer, LaneFailure, ProducerState, Released,
};
use ferrylink_proto::region::RemoteKey;
use ferrylink_proto::stats::ContextStats;
use ferrylink_proto::wire::{DataMessage, FrameDescriptor, GrantedRegion, INLINE_BUDGET};
use landing_state::UcxLanding;
use onesided_state::UcxOneSided;
use ops::{Progress, SendOp, StagedSend};
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a failing connection waits for acknowledged sends to hand their frames back.
const SETTLE_WITHIN: Duration = Duration::from_millis(200);

/// What the UCX lane takes from the configuration.
#[derive(Debug, Clone)]
pub(crate) struct UcxSettings {
    pub inline_threshold: usize,
    pub max_message_bytes: u64,
    pub staging_region_bytes: usize,
    pub landing_max_bytes: usize,
    /// One-sided transfers go through pinned host memory whatever the memory
    /// (`FERRYLINK_UCX_STAGED=1`).
    pub staged_onesided: bool,
}

/// A message's frames in flight from this side.
struct SendOps {
    ops: Vec<SendOp>,
    /// Reported finished to the core already.
    reported: bool,
}

/// The UCX lane of one connection.
pub(crate) struct UcxLane {
    engine: Rc<UcxEngine>,
    /// The endpoint (gone once the connection closed).
    conn: Option<UcxConn>,
    device: Arc<DeviceState>,
    settings: UcxSettings,
    producers: ProducerOrders,
    sends: BTreeMap<u64, SendOps>,
    landings: VecDeque<UcxLanding>,
    /// Host memory received frames land in.
    landing: MemfdPool,
    /// This context's registrations (set by `with_registry`).
    registry: Option<Arc<Registry>>,
    onesided: UcxOneSided,
}

/// How one frame travels on the UCX lane.
enum Plan {
    Inline,
    Whole,
    Staged,
}

impl UcxLane {
    pub fn new(engine: Rc<UcxEngine>, conn: UcxConn, device: Arc<DeviceState>, settings: UcxSettings) -> Self {
        Self {
            landing: MemfdPool::new("ferrylink-landing", settings.staging_region_bytes, settings.landing_max_bytes),
            engine,
            conn: Some(conn),
            device,
            settings,
            producers: ProducerOrders::new(Copier::Ucx),
            sends: BTreeMap::new(),
            landings: VecDeque::new(),
            registry: None,
            onesided: UcxOneSided::default(),
        }
    }

    /// The lane grants imports of this context's registrations.
    pub fn with_registry(mut self, registry: Arc<Registry>) -> Self {
        self.registry = Some(registry);
        self
    }

    fn plan_frames(&self, message: &Message, conn: &UcxConn) -> Vec<Plan> {
        let mut inline_total = 0usize;
        message
            .frames
            .iter()
            .map(|frame| match frame {
                Frame::Host(h)
                    if h.len() <= self.settings.inline_threshold && inline_total + h.len() <= INLINE_BUDGET =>
                {
                    inline_total += h.len();
                    Plan::Inline
                }
                Frame::Host(_) => Plan::Whole,
                Frame::Device(d) if conn.direct_device && !spans_several_vmm_chunks(d) => Plan::Whole,
                Frame::Device(_) => Plan::Staged,
            })
            .collect()
    }

    /// Posts the tagged sends of a message being described (frames sent whole move into
    /// their requests and come back through `release`).
    fn post_sends(&mut self, seq: u64, message: &mut Message, plans: &[Plan]) -> Result<(), String> {
        let Some(conn) = &self.conn else { return Err("the UCX endpoint is closed".into()) };
        let mut ops = Vec::new();
        let mut failure = None;
        for (index, plan) in plans.iter().enumerate() {
            match plan {
                Plan::Inline => {}
                Plan::Whole => {
                    // Device frames: their producers' work is done (the send waited for it
                    // before it was described), so UCX may copy them on its own streams.
                    let frame = std::mem::replace(&mut message.frames[index], Frame::Host(HostBuffer::zeroed(0)));
                    match SendOp::whole(conn, seq, index, frame) {
                        Ok(op) => ops.push(op),
                        Err((reason, frame)) => {
                            message.frames[index] = frame;
                            failure = Some(format!("posting a UCX send failed: {reason}"));
                            break;
                        }
                    }
                }
                Plan::Staged => match &message.frames[index] {
                    Frame::Device(d) => match StagedSend::start(d, seq, index) {
                        Ok(op) => ops.push(SendOp::Staged(op)),
                        Err(e) => {
                            failure = Some(e);
                            break;
                        }
                    },
                    Frame::Host(_) => {
                        failure = Some("a staged frame is host memory".into());
                        break;
                    }
                },
            }
        }
        // Even after a failure, the ops posted so far keep their frames until `release`.
        self.sends.insert(seq, SendOps { ops, reported: false });
        failure.map_or(Ok(()), Err)
    }

    /// Whether every transfer of send `seq` is done; why not, when one failed.
    fn sends_done(&mut self, seq: u64) -> Result<bool, String> {
        let (Some(conn), Some(s)) = (&self.conn, self.sends.get_mut(&seq)) else { return Ok(true) };
        let mut done = true;
        for op in &mut s.ops {
            match op.poll(conn, &self.engine) {
                Progress::Pending => done = false,
                Progress::Done => {}
                Progress::Failed(reason) => return Err(reason),
            }
        }
        Ok(done)
    }

    /// The connection failed (a send is released unacknowledged only then) while UCX
    /// still holds buffers of message `seq` (a send queued behind others, a rendezvous
    /// the peer never matched): force-closes the endpoint, once, which cancels every
    /// outstanding request, and progresses the worker until this message's requests
    /// completed, for at most `SETTLE_WITHIN`, so its frames come back instead of staying
    /// with the worker.
    fn cancel_held_sends(&mut self, seq: u64) {
        let held =
            |lane: &mut Self| lane.sends.get_mut(&seq).is_some_and(|s| s.ops.iter_mut().any(SendOp::holds_buffer));
        if !held(self) {
            return;
        }
        if let Some(conn) = self.conn.take() {
            if let Err(e) = conn.endpoint.close(ferrylink_ucx::CloseMode::Force).wait(SETTLE_WITHIN) {
                tracing::debug!(error = %e, "force-closing the failed UCX endpoint");
            }
        }
        let deadline = Instant::now() + SETTLE_WITHIN;
        while held(self) && Instant::now() < deadline {
            self.engine.worker.progress();
        }
    }
}

/// Puts the frames the sends held back into the message; whether all came back.
fn take_back_frames(ops: Vec<SendOp>, message: &mut Message) -> bool {
    let mut whole = true;
    for op in ops {
        match op.finish() {
            Ok(Some((i, frame))) => message.frames[i] = frame,
            Ok(None) => {}
            Err(()) => whole = false,
        }
    }
    whole
}

impl CoreLane<MemoryPayload> for UcxLane {
    fn order_producer(&mut self, id: u64, message: &Message) -> Result<ProducerState, TransportError> {
        self.producers.order(&self.device, id, message)
    }

    fn discard_send(&mut self, id: u64) {
        self.producers.discard(id);
    }

    fn transfer_producer(&mut self, id: u64, t: &LocalTransfer<'_>) -> Result<ProducerState, String> {
        // UCX reads and writes the memory on streams of its own (a staged transfer's
        // copies would wait on the GPU; they wait here too, at no cost that matters there).
        self.producers.order_transfer(&self.device, id, &t.local.frame)
    }

    fn discard_transfer_producer(&mut self, id: u64) {
        self.producers.discard(id);
    }

    fn describe(&mut self, id: u64, seq: u64, message: &mut Message) -> Result<Described, DescribeError> {
        // UCX copies on streams of its own once the producer's work is done.
        drop(self.producers.take_marks(id));
        if message.frames.len() > MAX_FRAMES {
            let n = message.frames.len();
            let reason = format!("{n} frames; the UCX lane carries at most {MAX_FRAMES}");
            return Err(DescribeError::Send(TransportError::InvalidMessage(reason)));
        }
        let Some(conn) = &self.conn else { return Err(DescribeError::Connection("the UCX endpoint is closed".into())) };
        let plans = self.plan_frames(message, conn);
        let frames = message
            .frames
            .iter()
            .zip(&plans)
            .map(|(frame, plan)| match (plan, frame) {
                (Plan::Inline, Frame::Host(h)) => FrameDescriptor::Inline(h.to_vec()),
                (Plan::Staged, f) => {
                    FrameDescriptor::Remote { len: f.len() as u64, device: true, chunk: stage_chunk(f.len() as u64) }
                }
                (_, f) => FrameDescriptor::Remote { len: f.len() as u64, device: f.as_device().is_some(), chunk: 0 },
            })
            .collect();
        self.post_sends(seq, message, &plans).map_err(DescribeError::Connection)?;
        Ok(Described { frames, regions: Vec::new(), staged_bytes: 0, bounced_bytes: 0 })
    }

    fn release(&mut self, seq: u64, message: &mut Message, acknowledged: bool) -> Released {
        if acknowledged && self.sends_done(seq) != Ok(true) {
            return Released::Pending;
        }
        if !acknowledged {
            self.cancel_held_sends(seq);
        }
        let Some(sends) = self.sends.remove(&seq) else { return Released::Whole };
        if take_back_frames(sends.ops, message) {
            Released::Whole
        } else {
            Released::FramesLost
        }
    }

    fn settle(&mut self, acknowledged: &[u64]) {
        let deadline = Instant::now() + SETTLE_WITHIN;
        loop {
            let pending = acknowledged.iter().any(|&seq| self.sends_done(seq) == Ok(false));
            if !pending || Instant::now() > deadline {
                break;
            }
            self.engine.worker.progress();
        }
    }

    /// A stream the receive names has nothing to wait for: the message is delivered
    /// once its transfers completed.
    fn land(
        &mut self,
        data: &DataMessage,
        into: Option<Vec<Frame>>,
        _offer: Option<u64>,
        _on: Option<&ferrylink_memory::ProducerStream>,
    ) -> Landing {
        self.start_landing(data, into)
    }

    fn copy_into(&mut self, message: &Message, buffers: Vec<Frame>) -> Result<Vec<Frame>, CopyMismatch> {
        copy_landed_into(&self.device, message, buffers)
    }

    fn poll(&mut self, events: &mut Vec<LaneEvent>) -> bool {
        let Some(conn) = &self.conn else { return false };
        if let Some(status) = conn.endpoint.error() {
            events.push(LaneEvent::Failed { reason: format!("the UCX endpoint failed: {status}") });
            return false;
        }
        let mut busy = false;
        let seqs: Vec<u64> = self.sends.iter().filter(|(_, s)| !s.reported).map(|(&seq, _)| seq).collect();
        for seq in seqs {
            match self.sends_done(seq) {
                Ok(true) => {
                    if let Some(s) = self.sends.get_mut(&seq) {
                        s.reported = true;
                    }
                    events.push(LaneEvent::SendFinished { seq });
                }
                Ok(false) => busy = true,
                Err(reason) => {
                    events.push(LaneEvent::Failed { reason });
                    return false;
                }
            }
        }
        busy | self.poll_landings(events) | self.rma_poll(events)
    }

    fn grant_import(&mut self, key: &RemoteKey) -> Result<LaneGrant, String> {
        self.rma_grant(key)
    }

    fn release_grant(&mut self, registration: u64) {
        self.rma_release(registration);
    }

    fn open_grant(&mut self, granted: &GrantedRegion) -> Result<(), String> {
        self.rma_open(granted)
    }

    fn close_grant(&mut self, grant: u64) {
        self.rma_close(grant);
    }

    /// Each side runs the transfers it initiates (UCX's RMA), but on staged grants,
    /// whose owner runs them.
    fn runs_own_transfer(&self, t: &LocalTransfer<'_>) -> bool {
        self.rma_runs(t)
    }

    fn start_transfer(&mut self, id: u64, t: &LocalTransfer<'_>) -> Result<(), String> {
        self.rma_start(id, t)
    }

    fn describe_transfer(&mut self, id: u64, t: &LocalTransfer<'_>) -> Result<Option<DescribedTransfer>, String> {
        self.staged_describe(id, t)
    }

    fn transfer_answered(&mut self, id: u64, done: bool) -> Result<bool, String> {
        self.staged_answered(id, done)
    }

    fn run_peer_transfer(&mut self, id: u64, t: &PeerTransfer<'_>) -> Result<(), LaneFailure> {
        self.staged_run(id, t)
    }

    fn close(&mut self) {
        self.onesided.clear();
        self.producers.clear();
        self.sends.clear();
        self.landings.clear();
        // Dropping the endpoint closes it (forced); requests it still had are the worker's.
        self.conn = None;
    }
}

impl Lane for UcxLane {
    fn note_producer(&mut self, id: u64, marks: ProducerMarks) {
        self.producers.note(id, marks);
    }

    fn add_stats(&self, s: &mut ContextStats) {
        s.landing_mapped_bytes += self.landing.mapped_bytes() as u64;
    }

    fn uses_ucx(&self) -> bool {
        self.conn.is_some()
    }
}

/// Whether `buf` is VMM memory over more than one physical chunk: CUDA-aware UCX reads
/// only the first chunk of such a range and sends wrong bytes without an error (UCX PR
/// #11283), so such frames are staged through pinned host memory instead (a plain CUDA
/// copy reads every chunk). Legacy IPC memory (the exportable pool) answers from its
/// owner's record without a driver query.
fn spans_several_vmm_chunks(buf: &ferrylink_memory::DeviceBuffer) -> bool {
    use ferrylink_memory::cuda;
    if cuda::is_ipc_exportable(buf).unwrap_or(false) {
        return false;
    }
    match (cuda::export_route(buf), cuda::Gpu::get(buf.device_ordinal())) {
        (Ok(cuda::ExportRoute::Vmm), Ok(gpu)) => {
            cuda::vmm_chunks(&gpu, buf.device_ptr(), buf.len()).map_or(true, |chunks| chunks.len() > 1)
        }
        _ => false,
    }
}
