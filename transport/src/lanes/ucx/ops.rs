//! Payload transfers of one frame on the UCX lane: whole (one tagged message straight
//! from or into the frame) or staged through pinned host chunks, copied on a stream and
//! sent as soon as each copy finished, several in flight.

use super::engine::{stage_chunk, tag, UcxConn, UcxEngine, STAGE_DEPTH};
use ferrylink_memory::cuda::{self, Event, Gpu, Stream};
use ferrylink_memory::{DeviceBuffer, Frame, HostBuffer};
use ferrylink_ucx::{TagRecv, TagSend, UcxWorker};
use std::collections::VecDeque;

/// A frame in flight from this side.
pub(crate) enum SendOp {
    /// One tagged message straight from the frame (which the request holds).
    Whole { index: usize, request: Option<TagSend<Frame>> },
    /// A device frame staged through pinned chunks.
    Staged(StagedSend),
}

/// A frame in flight to this side.
pub(crate) enum RecvOp {
    /// One tagged message straight into the target frame (which the request holds).
    Whole { index: usize, request: Option<TagRecv<Frame>> },
    /// A device frame received through pinned chunks.
    Staged(StagedRecv),
}

/// What polling an operation found.
pub(crate) enum Progress {
    Pending,
    Done,
    Failed(String),
}

impl SendOp {
    /// Posts the tag send of `frame` (taken out of the message; given back by `finish`).
    pub fn whole(ucx: &UcxConn, seq: u64, index: usize, frame: Frame) -> Result<Self, (String, Frame)> {
        let t = tag(ucx.send_prefix, seq, index, 0);
        match ucx.endpoint.tag_send(t, frame) {
            Ok(request) => Ok(SendOp::Whole { index, request: Some(request) }),
            Err(rejected) => Err((rejected.error.to_string(), rejected.buf)),
        }
    }

    pub fn poll(&mut self, ucx: &UcxConn, engine: &UcxEngine) -> Progress {
        match self {
            SendOp::Whole { request, .. } => match request.as_mut().map(|r| r.poll()) {
                Some(None) => Progress::Pending,
                Some(Some(Err(status))) => Progress::Failed(format!("UCX send failed: {status}")),
                Some(Some(Ok(_))) | None => Progress::Done,
            },
            SendOp::Staged(s) => s.poll(ucx, engine),
        }
    }

    /// Whether UCX still holds a whole send's buffer (its request not complete). Never
    /// true of staged sends, whose device frame stays in the message throughout.
    pub fn holds_buffer(&mut self) -> bool {
        match self {
            SendOp::Whole { request: Some(r), .. } => r.poll().is_none(),
            _ => false,
        }
    }

    /// The frame a whole send held, to put back into the message: `Ok(None)` when the op
    /// never took one (staged), `Err(())` when UCX still uses it (the worker keeps it
    /// until UCX is done; dropping the request cancelled it).
    #[allow(clippy::result_unit_err)]
    pub fn finish(self) -> Result<Option<(usize, Frame)>, ()> {
        match self {
            SendOp::Whole { index, request: Some(r), .. } => r.into_buf().map(|f| Some((index, f))).map_err(|_| ()),
            SendOp::Whole { request: None, .. } => Err(()),
            SendOp::Staged(_) => Ok(None),
        }
    }
}

/// Sender side of a staged device frame.
pub(crate) struct StagedSend {
    src: u64,
    len: usize,
    chunk: usize,
    chunks: usize,
    seq: u64,
    index: usize,
    next: usize,
    copying: VecDeque<(usize, HostBuffer, Event)>,
    sending: Vec<TagSend<HostBuffer>>,
    sent: usize,
    stream: Stream,
    gpu: Gpu,
}

impl StagedSend {
    /// Starts staging `buf` (which the in-flight message keeps alive until this is done).
    pub fn start(buf: &DeviceBuffer, seq: u64, index: usize) -> Result<Self, String> {
        let gpu = Gpu::get(buf.device_ordinal()).map_err(|e| e.to_string())?;
        // The producer's work is done: the send waited for it before it was described.
        let stream = Stream::new(&gpu).map_err(|e| e.to_string())?;
        let chunk = stage_chunk(buf.len() as u64) as usize;
        Ok(Self {
            src: buf.device_ptr(),
            len: buf.len(),
            chunk,
            chunks: buf.len().div_ceil(chunk),
            seq,
            index,
            next: 0,
            copying: VecDeque::new(),
            sending: Vec::new(),
            sent: 0,
            stream,
            gpu,
        })
    }

    fn poll(&mut self, ucx: &UcxConn, engine: &UcxEngine) -> Progress {
        if let Err(e) = self.gpu.bind_to_current_thread() {
            return Progress::Failed(e.to_string());
        }
        // Start copies while there is room in the pipeline.
        while self.next < self.chunks && self.copying.len() + self.sending.len() < STAGE_DEPTH {
            let offset = self.next * self.chunk;
            let n = self.chunk.min(self.len - offset);
            let mut host = match engine.pinned().and_then(|p| p.alloc(n).map_err(|e| e.to_string())) {
                Ok(h) => h,
                Err(e) => return Progress::Failed(format!("pinned staging memory: {e}")),
            };
            let event = match Event::new(&self.gpu) {
                Ok(e) => e,
                Err(e) => return Progress::Failed(e.to_string()),
            };
            // SAFETY: the source lies in the device buffer the in-flight message keeps
            // alive; the destination is our pinned chunk, kept in `copying` until the
            // event says the copy is done (and the stream is synchronised on drop).
            let copied = unsafe {
                cuda::copy::memcpy_dtoh_async(
                    host.as_mut_slice().as_mut_ptr(),
                    self.src + offset as u64,
                    n,
                    &self.stream,
                )
            };
            if let Err(e) = copied.and_then(|_| event.record(&self.stream)) {
                return Progress::Failed(e.to_string());
            }
            self.copying.push_back((self.next, host, event));
            self.next += 1;
        }
        // Send the chunks whose copies finished, in order.
        while let Some((_, _, event)) = self.copying.front() {
            match event.query() {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => return Progress::Failed(e.to_string()),
            }
            let (chunk, host, _) = self.copying.pop_front().expect("front exists");
            match ucx.endpoint.tag_send(tag(ucx.send_prefix, self.seq, self.index, chunk), host) {
                Ok(r) => self.sending.push(r),
                Err(rejected) => return Progress::Failed(format!("UCX send of a staged chunk: {}", rejected.error)),
            }
        }
        let mut failed = None;
        self.sending.retain_mut(|r| match r.poll() {
            None => true,
            Some(Ok(_)) => false,
            Some(Err(status)) => {
                failed = Some(status);
                false
            }
        });
        if let Some(status) = failed {
            return Progress::Failed(format!("UCX send of a staged chunk failed: {status}"));
        }
        self.sent = self.next - self.copying.len() - self.sending.len();
        if self.sent == self.chunks {
            Progress::Done
        } else {
            Progress::Pending
        }
    }
}

impl Drop for StagedSend {
    fn drop(&mut self) {
        // Copies into the pinned chunks must finish before the chunks go back to the pool.
        if let Err(e) = self.stream.synchronize() {
            tracing::warn!("synchronising a staging stream failed: {e}");
        }
    }
}

impl RecvOp {
    /// Posts the receive of frame `index` into `target` (given back by `finish`).
    pub fn whole(worker: &UcxWorker, prefix: u16, seq: u64, index: usize, target: Frame) -> Result<Self, String> {
        let t = tag(prefix, seq, index, 0);
        match worker.tag_recv(t, u64::MAX, target) {
            Ok(request) => Ok(RecvOp::Whole { index, request: Some(request) }),
            Err(rejected) => Err(rejected.error.to_string()),
        }
    }

    pub fn poll(&mut self, worker: &UcxWorker, prefix: u16, engine: &UcxEngine) -> Progress {
        match self {
            RecvOp::Whole { request, .. } => match request.as_mut().map(|r| r.poll()) {
                Some(None) => Progress::Pending,
                Some(Some(Err(status))) => Progress::Failed(format!("UCX receive failed: {status}")),
                Some(Some(Ok(_))) | None => Progress::Done,
            },
            RecvOp::Staged(s) => s.poll(worker, prefix, engine),
        }
    }

    /// The received frame, once done.
    pub fn finish(self) -> Option<(usize, Frame)> {
        match self {
            RecvOp::Whole { index, request: Some(r) } => r.into_buf().ok().map(|f| (index, f)),
            RecvOp::Whole { .. } => None,
            RecvOp::Staged(mut s) => s.target.take().map(|t| (s.index, Frame::Device(t))),
        }
    }
}

/// Receiver side of a staged device frame.
pub(crate) struct StagedRecv {
    target: Option<DeviceBuffer>,
    len: usize,
    chunk: usize,
    chunks: usize,
    seq: u64,
    index: usize,
    next: usize,
    receiving: VecDeque<(usize, TagRecv<HostBuffer>)>,
    uploading: VecDeque<(HostBuffer, Event)>,
    uploaded: usize,
    stream: Stream,
    gpu: Gpu,
}

impl StagedRecv {
    pub fn start(target: DeviceBuffer, chunk: u64, seq: u64, index: usize) -> Result<Self, String> {
        let gpu = Gpu::get(target.device_ordinal()).map_err(|e| e.to_string())?;
        let stream = Stream::new(&gpu).map_err(|e| e.to_string())?;
        let chunk = chunk as usize;
        Ok(Self {
            len: target.len(),
            chunks: target.len().div_ceil(chunk),
            chunk,
            target: Some(target),
            seq,
            index,
            next: 0,
            receiving: VecDeque::new(),
            uploading: VecDeque::new(),
            uploaded: 0,
            stream,
            gpu,
        })
    }

    fn poll(&mut self, worker: &UcxWorker, prefix: u16, engine: &UcxEngine) -> Progress {
        if let Err(e) = self.gpu.bind_to_current_thread() {
            return Progress::Failed(e.to_string());
        }
        let Some(target) = &self.target else { return Progress::Failed("staged receive lost its target".into()) };
        while self.next < self.chunks && self.receiving.len() + self.uploading.len() < STAGE_DEPTH {
            let n = self.chunk.min(self.len - self.next * self.chunk);
            let host = match engine.pinned().and_then(|p| p.alloc(n).map_err(|e| e.to_string())) {
                Ok(h) => h,
                Err(e) => return Progress::Failed(format!("pinned staging memory: {e}")),
            };
            match worker.tag_recv(tag(prefix, self.seq, self.index, self.next), u64::MAX, host) {
                Ok(r) => self.receiving.push_back((self.next, r)),
                Err(rejected) => return Progress::Failed(format!("UCX receive of a staged chunk: {}", rejected.error)),
            }
            self.next += 1;
        }
        // Upload the chunks that arrived (any order).
        let mut i = 0;
        while i < self.receiving.len() {
            match self.receiving[i].1.poll() {
                None => i += 1,
                Some(Err(status)) => {
                    return Progress::Failed(format!("UCX receive of a staged chunk failed: {status}"))
                }
                Some(Ok(n)) => {
                    let (chunk, request) = self.receiving.remove(i).expect("index exists");
                    let Ok(host) = request.into_buf() else { return Progress::Failed("chunk buffer lost".into()) };
                    let offset = chunk * self.chunk;
                    if n != self.chunk.min(self.len - offset) {
                        return Progress::Failed(format!("staged chunk {chunk} held {n} bytes"));
                    }
                    let event = match Event::new(&self.gpu) {
                        Ok(e) => e,
                        Err(e) => return Progress::Failed(e.to_string()),
                    };
                    // SAFETY: the destination lies inside our target buffer; the pinned
                    // source stays in `uploading` until the event says the copy is done.
                    let copied = unsafe {
                        cuda::copy::memcpy_htod_async(
                            target.device_ptr() + offset as u64,
                            host.as_slice().as_ptr(),
                            n,
                            &self.stream,
                        )
                    };
                    if let Err(e) = copied.and_then(|_| event.record(&self.stream)) {
                        return Progress::Failed(e.to_string());
                    }
                    self.uploading.push_back((host, event));
                }
            }
        }
        while let Some((_, event)) = self.uploading.front() {
            match event.query() {
                Ok(true) => {
                    self.uploading.pop_front();
                    self.uploaded += 1;
                }
                Ok(false) => break,
                Err(e) => return Progress::Failed(e.to_string()),
            }
        }
        if self.uploaded == self.chunks {
            Progress::Done
        } else {
            Progress::Pending
        }
    }
}

impl Drop for StagedRecv {
    fn drop(&mut self) {
        if let Err(e) = self.stream.synchronize() {
            tracing::warn!("synchronising a staging stream failed: {e}");
        }
    }
}
