//! [`DeviceState`]: the CUDA state both lanes (and every connection of one context)
//! share: the IPC exporter, the mapping and event caches, per-device streams, pools and
//! event pools. It is not a lane; the lanes (`lanes/`) and the user's threads use it.
//!
//! Sender: a device frame's allocation is exported once (`cuIpcGetMemHandle`, cached);
//! memory legacy IPC cannot export (cudarc's stream-ordered pool) is bounced into the
//! exportable pool first. Receiver: a descriptor's ready events are polled, every device
//! descriptor is mapped (the mapping cache validates it against the real allocation),
//! room is asked of the spill store, targets are allocated from the exportable pool (or
//! taken from `recv_into`), the copies run on a per-device stream (same-device copies by
//! the copy kernel up to its limit) and the stream is synchronised before the message is
//! acknowledged: the sender never frees memory a copy still reads. A receive that named a
//! stream instead gets its message at once, the stream waiting for the copies, and the
//! acknowledgement waits for their polled events (`copies.rs`).
//!
//! - `ordering.rs`: ordering a send after the GPU work that produced it.
//! - `landing.rs`: copies of a received message into its targets, on the stream that
//!   orders them after the targets' producers.
//! - `copies.rs`: copies in that a receive's stream, not the host, waits for.
//! - `push.rs`: connector copies into the listener's buffers.
//! - `export.rs`: describing a frame by its kind of memory (legacy IPC, VMM, pool
//!   pointer, bounce), with the regions one peer must import first.
//! - `targets.rs`: receive targets still in use on their producer stream: copies into
//!   them wait for it on the GPU, another process's writes on the host.
//! - `peer_memory.rs`: the VMM chunks and pools a peer announced, and opening a frame
//!   of them for one copy.
//! - `onesided.rs`: one-sided transfers' copies between a registration and a peer's
//!   memory, span by span.
//!
//! Why connector copies, polled events and the legacy default stream:
//! `docs/architecture.md`, "Design decisions".

mod completion;
mod copies;
mod export;
mod gate;
mod landing;
mod onesided;
mod ordering;
mod peer_memory;
mod push;
mod staging;
mod targets;

pub(crate) use copies::CopiesInFlight;
pub(crate) use export::{DeviceAnnouncements, ExportedFrames};
pub(crate) use gate::{read_gate, GateSignal, GateWords};
pub(crate) use onesided::{copy_spans, Direction, SpanCopies};
pub(crate) use ordering::{Copier, ProducerMarks, ProducerOrders};
pub(crate) use peer_memory::{ImportedDeviceRegions, PeerMemory};
pub(crate) use push::PushInFlight;
pub(crate) use staging::{check_staging_pieces, StagingPiece};
pub(crate) use targets::{ReceiveMarks, TargetMarks};

use crate::config::{Config, ProducerOrdering};
use crate::error::TransportError;
use crate::wire::DeviceFrameDescriptor;
use ferrylink_ipc::cuda_ipc::{
    CacheConfig, CudaIpcError, ImportedEventCache, IpcEventDescriptor, IpcExporter, MappingCache,
};
use ferrylink_memory::cuda::{self, CudaError, DevicePool, EventPool, Gpu, LingeringCopier, Stream};
use ferrylink_memory::{DeviceBuffer, MakeRoom};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Why a device frame could not be sent or landed.
#[derive(Debug)]
pub(crate) enum DeviceFrameError {
    /// This process has no CUDA.
    NoCuda(String),
    /// The peer's descriptor does not map: its fault.
    BadDescriptor(String),
    /// A local CUDA or memory failure: refuse the message, keep the connection.
    Local(String),
}

impl From<CudaError> for DeviceFrameError {
    fn from(e: CudaError) -> Self {
        DeviceFrameError::Local(e.to_string())
    }
}

struct PerDevice {
    gpu: Gpu,
    stream: Stream,
    /// The legacy default stream: where a connector's own copies run when their order
    /// after the producer comes from stream order (`ProducerMarks::on_legacy_stream`).
    legacy: Stream,
    pool: DevicePool,
    /// Events marking producers' work for copies this process runs
    /// (`ProducerOrdering::LegacyStreamEvent`, connector side), and for polls.
    marks: EventPool,
    /// Interprocess events recorded after pushes into offers, which the listener polls
    /// ("ready events" above).
    /// Never destroyed while the lane lives: a peer may hold one open, and a new event
    /// could get a destroyed one's handle.
    ready_marks: EventPool,
    /// The lingering copy kernel's host side (`Config::linger_copies`), when on.
    linger: Option<Mutex<LingeringCopier>>,
    /// Pushes into offers made by one copy kernel that wrote the gate word itself.
    signalled_pushes: std::sync::atomic::AtomicU64,
}

impl PerDevice {
    /// The legacy default stream when `on_legacy`, else the lane's own stream.
    fn stream_for(&self, on_legacy: bool) -> &Stream {
        if on_legacy {
            &self.legacy
        } else {
            &self.stream
        }
    }
}

/// Waits for the work enqueued on `stream` after a failure, so that what the copies use
/// may go; an error of its own is logged (the caller returns the first one).
fn synchronize_after_failure(stream: &Stream) {
    if let Err(e) = stream.synchronize() {
        tracing::warn!(error = %e, device = stream.gpu().ordinal(), "synchronising a copy stream after a failure failed");
    }
}

/// The CUDA state both lanes share, for every connection of one context (progress thread
/// only).
pub(crate) struct DeviceState {
    state: OnceLock<Result<CudaState, String>>,
    recv_device: Option<usize>,
    producer_ordering: ProducerOrdering,
    make_room: Option<Arc<dyn MakeRoom>>,
    max_mapped_bytes: u64,
    linger: std::time::Duration,
}

struct CudaState {
    exporter: IpcExporter,
    mappings: MappingCache,
    events: ImportedEventCache,
    devices: Mutex<HashMap<usize, Arc<PerDevice>>>,
}

/// What a sent message holds until the peer acknowledges it.
#[derive(Default)]
pub(crate) struct DeviceHold {
    /// Copies of frames nothing could export, in the exportable pool.
    bounces: Vec<DeviceBuffer>,
    /// Bytes bounced for this send.
    pub bounced_bytes: u64,
    /// The producer marks the copies wait on (returned to the pool only after the ack,
    /// when the peer's wait on them was long enqueued).
    pub producer: ProducerMarks,
}

impl DeviceHold {
    /// A hold for a send whose copies wait on `producer`.
    pub fn with_producer(producer: ProducerMarks) -> Self {
        Self { bounces: Vec::new(), bounced_bytes: 0, producer }
    }
}

/// Device-side statistics for [`crate::ContextStats`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DeviceStats {
    pub open_mappings: usize,
    pub mapped_bytes: u64,
    pub mapping_opens: u64,
    pub handles_fetched: u64,
    pub lingering_copies: u64,
    pub lingering_launches: u64,
    pub signalled_pushes: u64,
}

impl DeviceState {
    pub fn new(config: &Config, make_room: Option<Arc<dyn MakeRoom>>) -> Self {
        config.cuda.apply();
        Self {
            state: OnceLock::new(),
            recv_device: config.recv_device,
            producer_ordering: config.producer_ordering,
            make_room,
            max_mapped_bytes: config.max_mapped_device_bytes,
            linger: config.linger_copies,
        }
    }

    fn cuda(&self) -> Result<&CudaState, DeviceFrameError> {
        let state = self.state.get_or_init(|| {
            cuda::probe().map_err(|e| e.to_string())?;
            Ok(CudaState {
                exporter: IpcExporter::default(),
                mappings: MappingCache::cuda(CacheConfig { max_mapped_bytes: self.max_mapped_bytes }),
                events: ImportedEventCache::default(),
                devices: Mutex::new(HashMap::new()),
            })
        });
        state.as_ref().map_err(|e| DeviceFrameError::NoCuda(e.clone()))
    }

    fn device(&self, ordinal: usize) -> Result<Arc<PerDevice>, DeviceFrameError> {
        let cuda = self.cuda()?;
        let mut devices = cuda.devices.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = devices.get(&ordinal) {
            d.gpu.bind_to_current_thread()?;
            return Ok(d.clone());
        }
        let gpu = Gpu::get(ordinal)?;
        gpu.bind_to_current_thread()?;
        let d = Arc::new(PerDevice {
            stream: Stream::new(&gpu)?,
            legacy: Stream::legacy_default(&gpu),
            pool: DevicePool::shared(ordinal)?,
            marks: EventPool::local(&gpu, 64),
            ready_marks: EventPool::new(&gpu, usize::MAX),
            linger: self.lingering_copier(&gpu).map(Mutex::new),
            signalled_pushes: std::sync::atomic::AtomicU64::new(0),
            gpu,
        });
        devices.insert(ordinal, d.clone());
        Ok(d)
    }

    /// The lingering copier of `gpu` when configured and its kernel loads.
    fn lingering_copier(&self, gpu: &Gpu) -> Option<LingeringCopier> {
        if self.linger.is_zero() {
            return None;
        }
        LingeringCopier::new(gpu, self.linger)
            .inspect_err(|e| tracing::warn!(device = gpu.ordinal(), error = %e, "no lingering copy kernel"))
            .ok()
    }

    /// Describes the device frames of one message for the peer; `hold` keeps what must
    /// live until the ack (bounces of memory nothing can export). The producer's work was
    /// ordered before (`ProducerOrders`): nothing is synchronised here.
    pub fn export(
        &self,
        frames: &[&DeviceBuffer],
        hold: &mut DeviceHold,
        announced: &mut DeviceAnnouncements,
    ) -> Result<export::ExportedFrames, DeviceFrameError> {
        let started = std::time::Instant::now();
        let out = self.export_for_peer(frames, announced, Some(hold));
        tracing::trace!(us = started.elapsed().as_micros() as u64, frames = frames.len(), "device export");
        out
    }

    /// Connector-copies mode, listener side: descriptors of buffers the connector is to
    /// copy into (no events: the connector orders its own copies).
    pub fn export_targets(
        &self,
        targets: &[&DeviceBuffer],
        announced: &mut DeviceAnnouncements,
    ) -> Result<export::ExportedFrames, DeviceFrameError> {
        self.export_for_peer(targets, announced, None)
    }

    /// Whether `buf` can be exported without a bounce (legacy IPC, VMM, exportable pool).
    pub fn is_exportable(&self, buf: &DeviceBuffer) -> bool {
        matches!(
            cuda::export_route(buf),
            Ok(cuda::ExportRoute::LegacyIpc | cuda::ExportRoute::Vmm | cuda::ExportRoute::Pool(_))
        )
    }

    /// Opens every device descriptor of a message (a legacy IPC one through the mapping
    /// cache, which validates it against the real allocation; a VMM or pool one through
    /// the regions the peer announced) before anything is allocated; `copiers[i]` is the
    /// device that will copy through opening `i` (see `mapping_device`).
    pub fn map_all(
        &self,
        peer_pid: u32,
        descs: &[&DeviceFrameDescriptor],
        copiers: &[usize],
        regions: &mut ImportedDeviceRegions,
    ) -> Result<Vec<PeerMemory>, DeviceFrameError> {
        let cuda = self.cuda()?;
        let started = std::time::Instant::now();
        let mut opened = Vec::with_capacity(descs.len());
        for (d, &copier) in descs.iter().zip(copiers) {
            let Some(ipc) = export::to_ipc(d) else {
                opened.push(regions.open(d)?);
                continue;
            };
            let on = self.mapping_device(copier, d);
            let lease = cuda.mappings.acquire_on(peer_pid, &ipc, Some(on)).map_err(|e| match e {
                CudaIpcError::Cuda(c) if c.code().is_some() => DeviceFrameError::BadDescriptor(c.to_string()),
                CudaIpcError::InvalidDescriptor(s) => DeviceFrameError::BadDescriptor(s),
                other => DeviceFrameError::Local(other.to_string()),
            })?;
            opened.push(PeerMemory::Ipc(lease));
        }
        tracing::trace!(us = started.elapsed().as_micros() as u64, "device mappings acquired");
        Ok(opened)
    }

    /// The device whose context maps a peer's allocation for a copy run on `copier`: the
    /// copier itself when it reaches the allocation's device directly (the same device,
    /// or peer access: the copy then runs over NVLink as a plain device copy), else the
    /// allocation's own device (the copy is then staged through pinned host memory).
    /// Measured on two H200s: mapping on the allocation's device and `cuMemcpyPeerAsync`
    /// from the copier ran at 37 GB/s against 380+ GB/s for the raw peer copy.
    fn mapping_device(&self, copier: usize, desc: &DeviceFrameDescriptor) -> usize {
        let Some(home) = Self::visible_device(&desc.device_uuid) else { return copier };
        if home == copier {
            return copier;
        }
        let reachable = match (Gpu::get(copier), Gpu::get(home)) {
            (Ok(c), Ok(h)) => cuda::can_access_peer(&c, &h).unwrap_or(false),
            _ => false,
        };
        if reachable {
            copier
        } else {
            home
        }
    }

    /// The device a received IPC frame lands on: the configured one, else the frame's own
    /// device when this process sees it, else device 0.
    pub fn landing_device(&self, desc: &DeviceFrameDescriptor) -> usize {
        self.recv_device.unwrap_or_else(|| Self::visible_device(&desc.device_uuid).unwrap_or(0))
    }

    /// The ordinal of the device with this UUID, when this process sees it.
    pub fn visible_device(uuid: &[u8; 16]) -> Option<usize> {
        Gpu::by_uuid(uuid).ok().map(|g| g.ordinal())
    }

    /// The device a received frame of unknown origin (pushed, or over UCX) lands on: the
    /// configured one, else device 0.
    pub fn default_landing_device(&self) -> usize {
        self.recv_device.unwrap_or(0)
    }

    /// A fresh buffer for a received frame, after asking the spill store for room.
    pub fn allocate(&self, ordinal: usize, len: usize) -> Result<DeviceBuffer, DeviceFrameError> {
        let started = std::time::Instant::now();
        if let Some(room) = &self.make_room {
            room.make_room(ordinal, len).map_err(|e| DeviceFrameError::Local(e.to_string()))?;
        }
        let dev = self.device(ordinal)?;
        let buf = dev.pool.alloc(len)?;
        tracing::trace!(us = started.elapsed().as_micros() as u64, "device landing: buffer allocated");
        Ok(buf)
    }

    /// Whether every one of a peer's ready events completed (`cuEventQuery` on the
    /// opened interprocess events; never blocks). Each is `(handle, device it belongs
    /// to, when this process sees that device)`. A handle that does not open is the
    /// peer's fault.
    pub fn events_ready(&self, peer_pid: u32, handles: &[([u8; 64], Option<usize>)]) -> Result<bool, DeviceFrameError> {
        if handles.is_empty() {
            return Ok(true);
        }
        let cuda = self.cuda()?;
        for (handle, ordinal) in handles {
            let dev = self.device(ordinal.unwrap_or_else(|| self.default_landing_device()))?;
            let ev = cuda
                .events
                .get(peer_pid, &IpcEventDescriptor { handle: *handle }, &dev.stream)
                .map_err(|e| DeviceFrameError::BadDescriptor(format!("opening the peer's ready event: {e}")))?;
            if !ev.query()? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Copies `src` into `dst` (same length), synchronously.
    pub fn copy_device_to_device(&self, src: &DeviceBuffer, dst: &DeviceBuffer) -> Result<(), DeviceFrameError> {
        let dev = self.device(dst.device_ordinal())?;
        self.order_after_target_producer(&dev, dst, &dev.stream)?;
        // SAFETY: both buffers are live for the call and the stream is synchronised
        // before returning.
        unsafe { cuda::copy_kernel::copy_dtod_async(dst.device_ptr(), src.device_ptr(), src.len(), &dev.stream)? };
        dev.stream.synchronize()?;
        Ok(())
    }

    /// Whether this process can use CUDA.
    pub fn has_cuda(&self) -> bool {
        self.cuda().is_ok()
    }

    /// Forgets a peer: closes its mappings and events.
    pub fn close_peer(&self, pid: u32) {
        if let Some(Ok(cuda)) = self.state.get() {
            let closed = cuda.mappings.close_peer(pid);
            cuda.events.close_peer(pid);
            tracing::debug!(pid, closed, "closed the mappings of a departed peer");
        }
    }

    pub fn stats(&self) -> DeviceStats {
        match self.state.get() {
            Some(Ok(cuda)) => {
                let m = cuda.mappings.stats();
                let mut stats = DeviceStats {
                    open_mappings: m.open_mappings,
                    mapped_bytes: m.mapped_bytes,
                    mapping_opens: m.opens_total,
                    handles_fetched: cuda.exporter.stats().handles_fetched,
                    ..DeviceStats::default()
                };
                let devices = cuda.devices.lock().unwrap_or_else(|e| e.into_inner());
                for d in devices.values() {
                    stats.signalled_pushes += d.signalled_pushes.load(std::sync::atomic::Ordering::Relaxed);
                    if let Some(linger) = &d.linger {
                        let copier = linger.lock().unwrap_or_else(|e| e.into_inner());
                        stats.lingering_copies += copier.copies();
                        stats.lingering_launches += copier.launches();
                    }
                }
                stats
            }
            _ => DeviceStats::default(),
        }
    }
}

/// Copies `len` bytes from `src` (memory in device `src_ordinal`'s context) to `dst` (in
/// device `dst_ordinal`'s) on `stream`: the copy kernel or a DtoD copy on one device, a
/// peer copy across devices.
///
/// # Safety
/// Both ranges must be valid device memory until `stream`'s work completed.
pub(crate) unsafe fn copy_between(
    dst: u64,
    dst_ordinal: usize,
    src: u64,
    src_ordinal: usize,
    len: usize,
    stream: &Stream,
) -> Result<(), DeviceFrameError> {
    if src_ordinal == dst_ordinal {
        // SAFETY: the caller's contract.
        unsafe { cuda::copy_kernel::copy_dtod_async(dst, src, len, stream)? };
    } else {
        let (dst_gpu, src_gpu) = (Gpu::get(dst_ordinal)?, Gpu::get(src_ordinal)?);
        // SAFETY: the caller's contract; each address belongs to its device's context.
        unsafe { cuda::copy::memcpy_peer_async(dst, &dst_gpu, src, &src_gpu, len, stream)? };
    }
    Ok(())
}

/// The text of a device failure, for a refusal or an error.
pub(crate) fn describe(e: DeviceFrameError) -> String {
    match e {
        DeviceFrameError::NoCuda(e) => format!("device frames need CUDA on the receiver: {e}"),
        DeviceFrameError::BadDescriptor(e) | DeviceFrameError::Local(e) => e,
    }
}

/// The error a send meets when its device frames cannot go.
pub(crate) fn send_error(e: DeviceFrameError) -> TransportError {
    match e {
        DeviceFrameError::NoCuda(e) => TransportError::Unsupported(format!("device frames need CUDA: {e}")),
        DeviceFrameError::BadDescriptor(e) | DeviceFrameError::Local(e) => {
            TransportError::InvalidMessage(format!("cannot export a device frame: {e}"))
        }
    }
}
