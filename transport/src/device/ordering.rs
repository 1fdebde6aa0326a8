//! Ordering a device send after the GPU work that produced its frames: events recorded
//! on the legacy default stream (polled, or waited on by this process's copies), the
//! legacy default stream itself, or `cuCtxSynchronize`, by who copies. A frame that names
//! its producer stream (`DeviceBuffer::produced_on`, every cudarc slice) gets an event
//! recorded on that stream too: non-blocking streams are invisible to the legacy stream.

use super::{DeviceFrameError, DeviceState};
use crate::config::ProducerOrdering;
use ferrylink_memory::cuda::{self, PooledEvent, Stream};
use ferrylink_memory::{DeviceBuffer, Frame, Message};

/// Per device, an event recorded on its legacy default stream after the producer's work:
/// the copies this process runs wait on it on the GPU (`cuStreamWaitEvent`), or the
/// progress thread polls it before a peer may copy (`ProducerOrder`).
#[derive(Default)]
pub(crate) struct ProducerMarks {
    pub(super) marks: Vec<(usize, PooledEvent)>,
    /// No marks: the copies go on the legacy default stream of their device, which
    /// orders them after the producer's work by itself (connector side).
    pub(super) on_legacy_stream: bool,
}

/// Who copies a device send's frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Copier {
    /// This process (connector-copies mode, connector side).
    Local,
    /// The peer, through CUDA IPC.
    Peer,
    /// UCX, on streams of its own.
    Ucx,
}

impl ProducerMarks {
    /// Order by stream position: the copies run on the legacy default stream.
    pub fn legacy_stream_order() -> Self {
        ProducerMarks { marks: Vec::new(), on_legacy_stream: true }
    }

    /// Waits for every event (after a failure, before what the copies use goes).
    pub fn wait_all(&self) {
        for (_, ev) in &self.marks {
            let _ = ev.synchronize();
        }
    }

    /// Whether every event completed (`cuEventQuery`; never blocks).
    pub fn all_done(&self) -> Result<bool, DeviceFrameError> {
        for (_, ev) in &self.marks {
            if !ev.query()? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The first mark on device `ordinal` (the one a ready event is taken from).
    pub fn on_device(&self, ordinal: usize) -> Option<&PooledEvent> {
        self.marks.iter().find(|(o, _)| *o == ordinal).map(|(_, e)| e)
    }

    /// Every mark on device `ordinal` (a copy stream there waits on each).
    pub fn all_on_device(&self, ordinal: usize) -> impl Iterator<Item = &PooledEvent> {
        self.marks.iter().filter(move |(o, _)| *o == ordinal).map(|(_, e)| e)
    }
}

/// How a queued device send is ordered after its producer's work.
pub(crate) enum ProducerOrder {
    /// The progress thread polls these before the descriptor goes out.
    Poll(ProducerMarks),
    /// The descriptor may go out now: the copies this process runs wait on these on
    /// the GPU.
    GpuWait(ProducerMarks),
    /// The producer's work is done (`cuCtxSynchronize` ran).
    Done,
}

impl ProducerOrder {
    /// How recorded marks order a send whose frames `copier` copies.
    pub fn with_marks(marks: ProducerMarks, copier: Copier) -> Self {
        if copier == Copier::Local {
            ProducerOrder::GpuWait(marks)
        } else {
            ProducerOrder::Poll(marks)
        }
    }
}

impl DeviceState {
    /// Orders a device send after its producer's work, as configured, on the progress
    /// thread (when the sending thread could not: `mark_producers_on_caller_thread`).
    /// When this process copies (`Copier::Local`), the copies wait for the producer's
    /// event on the GPU and the descriptor goes out at once; otherwise the peer (or UCX,
    /// on streams of its own) copies, and the progress thread polls the event first.
    pub fn order_producers(&self, message: &Message, copier: Copier) -> Result<ProducerOrder, DeviceFrameError> {
        let ordinals = devices_of(message);
        match self.producer_ordering {
            ProducerOrdering::ContextSynchronize => {
                self.synchronize_devices(&ordinals)?;
                Ok(ProducerOrder::Done)
            }
            ProducerOrdering::LegacyStreamEvent if copier == Copier::Local => {
                Ok(ProducerOrder::GpuWait(self.record_stream_marks(message, true)?))
            }
            ProducerOrdering::LegacyStreamEvent => {
                let mut marks = self.record_marks(&ordinals)?;
                marks.marks.extend(self.record_stream_marks(message, false)?.marks);
                Ok(ProducerOrder::with_marks(marks, copier))
            }
        }
    }

    /// Called on the sending thread by `Endpoint::send`. `LegacyStreamEvent`: records the
    /// producer's events there and then, so the GPU runs them while the send travels to
    /// the progress thread (and they order after exactly the work submitted before
    /// `send`). `ContextSynchronize`: runs `cuCtxSynchronize` there (the caller waits, the
    /// progress thread never does) and returns no marks. The thread's current context is
    /// restored. `None` when the message has no device frames or anything fails: the
    /// progress thread then orders it itself (and reports what failed).
    ///
    /// `copies_locally` (this side runs the copies: connector-copies mode, connector side):
    /// in `LegacyStreamEvent` mode no event is needed: the copies go on the legacy default
    /// stream, which orders them after the same work (H200, 1 MB round trip: the record
    /// and the copy stream's wait cost 2.2 µs of the connector's critical path).
    pub fn mark_producers_on_caller_thread(&self, message: &Message, copies_locally: bool) -> Option<ProducerMarks> {
        let ordinals = devices_of(message);
        if ordinals.is_empty() {
            return None;
        }
        let named_streams = message.frames.iter().filter_map(Frame::as_device).any(names_other_stream);
        if copies_locally && self.producer_ordering == ProducerOrdering::LegacyStreamEvent && !named_streams {
            return Some(ProducerMarks::legacy_stream_order());
        }
        let _restore = cuda::CurrentContextGuard::save().ok()?;
        if copies_locally && self.producer_ordering == ProducerOrdering::LegacyStreamEvent {
            return self.record_stream_marks(message, true).ok();
        }
        match self.producer_ordering {
            ProducerOrdering::ContextSynchronize => {
                self.synchronize_devices(&ordinals).ok()?;
                Some(ProducerMarks::default())
            }
            ProducerOrdering::LegacyStreamEvent => {
                let mut marks = self.record_marks(&ordinals).ok()?;
                marks.marks.extend(self.record_stream_marks(message, false).ok()?.marks);
                tracing::trace!("producer's event recorded");
                Some(marks)
            }
        }
    }

    /// An event recorded on the producer stream `buf` names (the legacy default one
    /// too), or `None` when it names none or that stream is idle now (`cuStreamQuery`:
    /// the work queued there so far is done). One query answers an idle stream at once,
    /// where a mark costs a record and at least one poll on a later turn (a PyTorch
    /// tensor names the legacy default stream, usually idle by the transfer).
    pub fn mark_busy_named_producer(&self, buf: &DeviceBuffer) -> Result<Option<PooledEvent>, DeviceFrameError> {
        let Some(producer) = buf.producer_stream() else { return Ok(None) };
        let dev = self.device(buf.device_ordinal())?;
        if Stream::producer_idle(&dev.gpu, producer)? {
            return Ok(None);
        }
        let mark = dev.marks.acquire()?;
        mark.record_on_producer(producer)?;
        Ok(Some(mark))
    }

    /// `cuCtxSynchronize` on each device: all work submitted there so far is done.
    fn synchronize_devices(&self, ordinals: &[usize]) -> Result<(), DeviceFrameError> {
        for &ordinal in ordinals {
            self.device(ordinal)?.gpu.synchronize()?;
        }
        Ok(())
    }

    /// Records, on the legacy default stream of each device, an event that completes when
    /// the work submitted there so far is done.
    fn record_marks(&self, ordinals: &[usize]) -> Result<ProducerMarks, DeviceFrameError> {
        let mut marks = Vec::with_capacity(ordinals.len());
        for &ordinal in ordinals {
            let ev = self.device(ordinal)?.marks.acquire()?;
            ev.record_on_legacy_default_stream()?;
            marks.push((ordinal, ev));
        }
        Ok(ProducerMarks { marks, on_legacy_stream: false })
    }
}

impl DeviceState {
    /// Records an event on each distinct producer stream the message's device frames
    /// name, but the legacy default stream: the copies either run on it (which orders them
    /// after its work) or wait for an event recorded there anyway (`record_marks`).
    /// `on_legacy_stream`: the copies run on the legacy default stream and wait on these
    /// too.
    fn record_stream_marks(
        &self,
        message: &Message,
        on_legacy_stream: bool,
    ) -> Result<ProducerMarks, DeviceFrameError> {
        let mut seen: Vec<(usize, usize)> = Vec::new();
        let mut marks = Vec::new();
        for buf in message.frames.iter().filter_map(Frame::as_device) {
            let Some(producer) = buf.producer_stream().filter(|p| !p.is_legacy_default()) else { continue };
            let key = (buf.device_ordinal(), producer.raw() as usize);
            if seen.contains(&key) {
                continue;
            }
            seen.push(key);
            let ev = self.device(buf.device_ordinal())?.marks.acquire()?;
            ev.record_on_producer(producer)?;
            marks.push((buf.device_ordinal(), ev));
        }
        Ok(ProducerMarks { marks, on_legacy_stream })
    }
}

/// Whether a device frame names a producer stream other than the legacy default stream
/// (cudarc's default stream is the legacy one: its slices need no event of their own).
fn names_other_stream(frame: &ferrylink_memory::DeviceBuffer) -> bool {
    frame.producer_stream().is_some_and(|p| !p.is_legacy_default())
}

/// The distinct devices a message's device frames live on, in order.
fn devices_of(message: &Message) -> Vec<usize> {
    let mut ordinals: Vec<usize> =
        message.frames.iter().filter_map(Frame::as_device).map(|d| d.device_ordinal()).collect();
    ordinals.sort_unstable();
    ordinals.dedup();
    ordinals
}

/// How each queued device send of one connection is ordered after its producer, by
/// request id, until it is described.
pub(crate) struct ProducerOrders {
    copier: Copier,
    /// Marks the sending thread recorded, not looked at yet.
    noted: std::collections::HashMap<u64, ProducerMarks>,
    orders: std::collections::HashMap<u64, ProducerOrder>,
}

impl ProducerOrders {
    /// Orders for sends whose frames `copier` copies.
    pub fn new(copier: Copier) -> Self {
        Self { copier, noted: Default::default(), orders: Default::default() }
    }

    /// The sending thread recorded marks for request `id`.
    pub fn note(&mut self, id: u64, marks: ProducerMarks) {
        self.noted.insert(id, marks);
    }

    /// Whether request `id` may be described now: its order is decided once (from the
    /// sending thread's marks, or here), then polled.
    pub fn order(
        &mut self,
        device: &DeviceState,
        id: u64,
        message: &Message,
    ) -> Result<ferrylink_proto::connection::lane::ProducerState, crate::error::TransportError> {
        use ferrylink_proto::connection::lane::ProducerState;
        if !self.orders.contains_key(&id) {
            let order = match self.noted.remove(&id) {
                Some(marks) => ProducerOrder::with_marks(marks, self.copier),
                None => device.order_producers(message, self.copier).map_err(super::send_error)?,
            };
            self.orders.insert(id, order);
        }
        let Some(ProducerOrder::Poll(marks)) = self.orders.get(&id) else { return Ok(ProducerState::Ready) };
        match marks.all_done() {
            Ok(true) => {
                tracing::trace!("producer's work done");
                self.orders.insert(id, ProducerOrder::Done);
                Ok(ProducerState::Ready)
            }
            Ok(false) => Ok(ProducerState::Running),
            Err(e) => {
                self.orders.remove(&id);
                Err(super::send_error(e))
            }
        }
    }

    /// Whether the GPU work queued on the producer stream `local` names is done, for
    /// one-sided transfer `id`, whose memory the peer or UCX reads or writes (memory
    /// naming none waits for nothing): the stream is asked the first time, and a mark
    /// recorded there if it is busy, polled after, and forgotten once done or failed.
    pub fn order_transfer(
        &mut self,
        device: &DeviceState,
        id: u64,
        local: &Frame,
    ) -> Result<ferrylink_proto::connection::lane::ProducerState, String> {
        use ferrylink_proto::connection::lane::ProducerState;
        let done = match self.orders.entry(id) {
            std::collections::hash_map::Entry::Vacant(vacant) => {
                let Some(buf) = local.as_device() else { return Ok(ProducerState::Ready) };
                let Some(mark) = device.mark_busy_named_producer(buf).map_err(super::describe)? else {
                    return Ok(ProducerState::Ready);
                };
                tracing::trace!("transfer's producer marked");
                let marks = ProducerMarks { marks: vec![(buf.device_ordinal(), mark)], on_legacy_stream: false };
                vacant.insert(ProducerOrder::Poll(marks));
                return Ok(ProducerState::Running);
            }
            std::collections::hash_map::Entry::Occupied(order) => match order.get() {
                ProducerOrder::Poll(marks) => marks.all_done(),
                _ => Ok(true),
            },
        };
        match done {
            Ok(false) => Ok(ProducerState::Running),
            Ok(true) => {
                tracing::trace!("transfer's producer done");
                self.orders.remove(&id);
                Ok(ProducerState::Ready)
            }
            Err(e) => {
                self.orders.remove(&id);
                Err(format!("waiting for the local memory's producer stream: {}", super::describe(e)))
            }
        }
    }

    /// The marks request `id`'s copies wait on, once it is described (none when its
    /// producer's work is done or the copies run on the legacy default stream).
    pub fn take_marks(&mut self, id: u64) -> ProducerMarks {
        self.noted.remove(&id);
        match self.orders.remove(&id) {
            Some(ProducerOrder::GpuWait(marks)) => marks,
            _ => ProducerMarks::default(),
        }
    }

    /// Request `id` is gone.
    pub fn discard(&mut self, id: u64) {
        self.noted.remove(&id);
        self.orders.remove(&id);
    }

    /// Every connection's request is gone.
    pub fn clear(&mut self) {
        self.noted.clear();
        self.orders.clear();
    }
}
