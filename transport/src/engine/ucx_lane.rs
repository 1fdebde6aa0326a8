//! The UCX lane: control messages on the bootstrap stream (Unix or TCP), frame payloads as
//! UCX tagged messages.
//!
//! Each side tells the other, in its `Hello`, the 16-bit tag prefix to use for messages
//! to it; a payload's tag is `prefix | seq (24 bits) | frame index (12) | chunk (12)`.
//! The sender posts its tag sends right after writing the `Data` descriptor; the receiver
//! posts matching receives when it lands the message, delivers it when every receive
//! completed, and acknowledges on the control stream.
//!
//! - Host frames and, when both sides' UCX is CUDA-aware, device frames travel as one
//!   tagged message each, straight from and into the buffers (ownership moves into the
//!   UCX request and back, so a failed connection can never free memory UCX still uses).
//! - Device frames through a UCX without CUDA support are **staged**: cut into chunks
//!   copied device → pinned host memory on a stream, each chunk sent as soon as its copy
//!   finished, several in flight, so the copies overlap the network; the receiver
//!   receives chunks into pinned memory and copies them host → device as they arrive.

use super::device::DeviceLane;
use ferrylink_memory::cuda::{self, Event, Gpu, Stream};
use ferrylink_memory::{DeviceBuffer, Frame, HostBuffer, PinnedPool};
use ferrylink_ucx::{TagRecv, TagSend, UcxConfig, UcxContext, UcxEndpoint, UcxError, UcxWorker, WorkerAddress};
use std::collections::VecDeque;

/// Bytes per staged chunk, at least.
const STAGE_CHUNK: usize = 8 << 20;
/// Staged chunks in flight per frame.
const STAGE_DEPTH: usize = 8;
/// Chunks a staged frame may have (12 tag bits).
pub(crate) const MAX_CHUNKS: u64 = 1 << 12;
/// Frames a message may have on this lane (12 tag bits).
pub(crate) const MAX_FRAMES: usize = 1 << 12;

/// The tag of one payload message.
pub(crate) fn tag(prefix: u16, seq: u64, frame: usize, chunk: usize) -> u64 {
    ((prefix as u64) << 48) | ((seq & 0xFF_FFFF) << 24) | (((frame as u64) & 0xFFF) << 12) | ((chunk as u64) & 0xFFF)
}

/// The chunk size a sender uses to stage a device frame of `len` bytes.
pub(crate) fn stage_chunk(len: u64) -> u64 {
    (STAGE_CHUNK as u64).max(len.div_ceil(MAX_CHUNKS))
}

/// The context-wide UCX state, created and owned by the progress thread.
pub(crate) struct UcxEngine {
    pub worker: UcxWorker,
    pub address: Vec<u8>,
    pub cuda_aware: bool,
    /// The TCP receive segment of this side's UCX (`UcxContext::tcp_segment`).
    pub tcp_segment: Option<String>,
    _context: UcxContext,
}

impl UcxEngine {
    /// Loads UCX (the library `config` names, else `libucp.so.0`), creates a context and a
    /// worker. UCX reads its own `UCX_*` variables (`UCX_TLS`, `UCX_NET_DEVICES`, …).
    pub fn start(config: &UcxConfig) -> Result<Self, UcxError> {
        let context = UcxContext::new(config)?;
        let worker = UcxWorker::new(&context)?;
        let address = worker.address()?.into_bytes();
        let cuda_aware = context.supports_cuda_memory();
        let tcp_segment = context.tcp_segment().map(str::to_owned);
        tracing::debug!(cuda_aware, version = ?context.version(), ?tcp_segment, "UCX lane available");
        Ok(Self { worker, address, cuda_aware, tcp_segment, _context: context })
    }
}

/// One UCX connection's state.
pub(crate) struct UcxConn {
    pub endpoint: UcxEndpoint,
    /// The prefix the peer asked for: tags of what we send.
    pub send_prefix: u16,
    /// Our prefix: tags of what we receive.
    pub recv_prefix: u16,
    /// Whether device frames travel without staging (both sides CUDA-aware).
    pub direct_device: bool,
}

impl UcxConn {
    /// Connects to the peer's worker.
    pub fn connect(
        worker: &UcxWorker,
        peer_address: &[u8],
        send_prefix: u16,
        recv_prefix: u16,
        direct_device: bool,
    ) -> Result<Self, UcxError> {
        // SAFETY: the bytes come from the peer's Hello, which an authenticated handshake
        // delivered; UCX parses them. A peer that lies can only hurt its own connection.
        let address = unsafe { WorkerAddress::from_bytes_unchecked(peer_address.to_vec()) };
        let endpoint = worker.connect(&address)?;
        Ok(Self { endpoint, send_prefix, recv_prefix, direct_device })
    }
}

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

    pub fn poll(&mut self, ucx: &UcxConn, device: &DeviceLane) -> Progress {
        match self {
            SendOp::Whole { request, .. } => match request.as_mut().map(|r| r.poll()) {
                Some(None) => Progress::Pending,
                Some(Some(Err(status))) => Progress::Failed(format!("UCX send failed: {status}")),
                Some(Some(Ok(_))) | None => Progress::Done,
            },
            SendOp::Staged(s) => s.poll(ucx, device),
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

    fn poll(&mut self, ucx: &UcxConn, device: &DeviceLane) -> Progress {
        if let Err(e) = self.gpu.bind_to_current_thread() {
            return Progress::Failed(e.to_string());
        }
        // Start copies while there is room in the pipeline.
        while self.next < self.chunks && self.copying.len() + self.sending.len() < STAGE_DEPTH {
            let offset = self.next * self.chunk;
            let n = self.chunk.min(self.len - offset);
            let mut host = match device.pinned().and_then(|p| p.alloc(n).map_err(|e| e.to_string())) {
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

    pub fn poll(&mut self, worker: &UcxWorker, prefix: u16, device: &DeviceLane) -> Progress {
        match self {
            RecvOp::Whole { request, .. } => match request.as_mut().map(|r| r.poll()) {
                Some(None) => Progress::Pending,
                Some(Some(Err(status))) => Progress::Failed(format!("UCX receive failed: {status}")),
                Some(Some(Ok(_))) | None => Progress::Done,
            },
            RecvOp::Staged(s) => s.poll(worker, prefix, device),
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

    fn poll(&mut self, worker: &UcxWorker, prefix: u16, device: &DeviceLane) -> Progress {
        if let Err(e) = self.gpu.bind_to_current_thread() {
            return Progress::Failed(e.to_string());
        }
        let Some(target) = &self.target else { return Progress::Failed("staged receive lost its target".into()) };
        while self.next < self.chunks && self.receiving.len() + self.uploading.len() < STAGE_DEPTH {
            let n = self.chunk.min(self.len - self.next * self.chunk);
            let host = match device.pinned().and_then(|p| p.alloc(n).map_err(|e| e.to_string())) {
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

/// The pinned pool staged frames use (created on first use).
pub(crate) fn new_staging_pool() -> Result<PinnedPool, String> {
    PinnedPool::new(ferrylink_memory::PinnedPoolConfig {
        chunk_size: STAGE_CHUNK,
        region_size: 4 * STAGE_DEPTH * STAGE_CHUNK,
        ..Default::default()
    })
    .map_err(|e| e.to_string())
}

/// Whether device frames can travel without staging: both sides' UCX handle CUDA memory.
pub(crate) fn direct_device(local_cuda_aware: bool, remote_cuda_aware: bool) -> bool {
    local_cuda_aware && remote_cuda_aware
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_keep_their_fields_apart() {
        let t = tag(0xBEEF, 0x12_3456, 0xABC, 0xDEF);
        assert_eq!(t >> 48, 0xBEEF);
        assert_eq!((t >> 24) & 0xFF_FFFF, 0x12_3456);
        assert_eq!((t >> 12) & 0xFFF, 0xABC);
        assert_eq!(t & 0xFFF, 0xDEF);
        assert_ne!(tag(1, 0, 0, 0), tag(2, 0, 0, 0));
        assert_ne!(tag(1, 1, 0, 0), tag(1, 2, 0, 0));
        assert_eq!(tag(1, 1 << 24, 0, 0), tag(1, 0, 0, 0), "sequence numbers wrap");
    }

    #[test]
    fn staging_chunks_never_exceed_the_tag_space() {
        for len in [1u64, 8 << 20, 1 << 30, 1 << 40] {
            let chunk = stage_chunk(len);
            assert!(chunk >= STAGE_CHUNK as u64);
            assert!(len.div_ceil(chunk) <= MAX_CHUNKS, "{len}");
        }
    }
}
