//! [`DeviceState`] and what every part of `device/` shares: the per-device streams,
//! pools and event pools ([`PerDevice`]), the CUDA state created on first use, the errors
//! of a device frame, and the raw copy between two devices' memory. The parts add their
//! methods in their own files.

use crate::config::{Config, ProducerOrdering};
use crate::error::TransportError;
use ferrylink_ipc::cuda_ipc::{CacheConfig, ImportedEventCache, IpcEventDescriptor, IpcExporter, MappingCache};
use ferrylink_memory::cuda::{self, CudaError, DevicePool, EventPool, Gpu, LingeringCopier, Stream};
use ferrylink_memory::{DeviceBuffer, MakeRoom};
use ferrylink_proto::wire::DeviceFrameDescriptor;
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

pub(in crate::device) struct PerDevice {
    pub(in crate::device) gpu: Gpu,
    pub(in crate::device) stream: Stream,
    /// The legacy default stream: where a connector's own copies run when their order
    /// after the producer comes from stream order (`ProducerMarks::on_legacy_stream`).
    pub(in crate::device) legacy: Stream,
    pub(in crate::device) pool: DevicePool,
    /// Events marking producers' work for copies this process runs
    /// (`ProducerOrdering::LegacyStreamEvent`, connector side), and for polls.
    pub(in crate::device) marks: EventPool,
    /// Interprocess events recorded after pushes into offers, which the listener polls
    /// ("ready events" above).
    /// Never destroyed while the lane lives: a peer may hold one open, and a new event
    /// could get a destroyed one's handle.
    pub(in crate::device) ready_marks: EventPool,
    /// The lingering copy kernel's host side (`Config::linger_copies`), when on.
    pub(in crate::device) linger: Option<Mutex<LingeringCopier>>,
    /// Pushes into offers made by one copy kernel that wrote the gate word itself.
    pub(in crate::device) signalled_pushes: std::sync::atomic::AtomicU64,
}

impl PerDevice {
    /// The legacy default stream when `on_legacy`, else the lane's own stream.
    pub(in crate::device) fn stream_for(&self, on_legacy: bool) -> &Stream {
        if on_legacy {
            &self.legacy
        } else {
            &self.stream
        }
    }
}

/// Waits for the work enqueued on `stream` after a failure, so that what the copies use
/// may go; an error of its own is logged (the caller returns the first one).
pub(in crate::device) fn synchronize_after_failure(stream: &Stream) {
    if let Err(e) = stream.synchronize() {
        tracing::warn!(error = %e, device = stream.gpu().ordinal(), "synchronising a copy stream after a failure failed");
    }
}

/// The CUDA state both lanes share, for every connection of one context (progress thread
/// only).
pub(crate) struct DeviceState {
    pub(in crate::device) state: OnceLock<Result<CudaState, String>>,
    pub(in crate::device) recv_device: Option<usize>,
    pub(in crate::device) producer_ordering: ProducerOrdering,
    pub(in crate::device) make_room: Option<Arc<dyn MakeRoom>>,
    pub(in crate::device) max_mapped_bytes: u64,
    pub(in crate::device) linger: std::time::Duration,
}

pub(in crate::device) struct CudaState {
    pub(in crate::device) exporter: IpcExporter,
    pub(in crate::device) mappings: MappingCache,
    pub(in crate::device) events: ImportedEventCache,
    pub(in crate::device) devices: Mutex<HashMap<usize, Arc<PerDevice>>>,
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

    pub(in crate::device) fn cuda(&self) -> Result<&CudaState, DeviceFrameError> {
        let state = self.state.get_or_init(|| {
            cuda::probe().map_err(|e| e.to_string())?;
            Ok(CudaState {
                exporter: IpcExporter::default(),
                mappings: MappingCache::cuda(CacheConfig::default().with_max_mapped_bytes(self.max_mapped_bytes)),
                events: ImportedEventCache::default(),
                devices: Mutex::new(HashMap::new()),
            })
        });
        state.as_ref().map_err(|e| DeviceFrameError::NoCuda(e.clone()))
    }

    pub(in crate::device) fn device(&self, ordinal: usize) -> Result<Arc<PerDevice>, DeviceFrameError> {
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
    pub(in crate::device) fn lingering_copier(&self, gpu: &Gpu) -> Option<LingeringCopier> {
        if self.linger.is_zero() {
            return None;
        }
        LingeringCopier::new(gpu, self.linger)
            .inspect_err(|e| tracing::warn!(device = gpu.ordinal(), error = %e, "no lingering copy kernel"))
            .ok()
    }

    /// The device whose context maps a peer's allocation for a copy run on `copier`: the
    /// copier itself when it reaches the allocation's device directly (the same device,
    /// or peer access: the copy then runs over NVLink as a plain device copy), else the
    /// allocation's own device (the copy is then staged through pinned host memory).
    /// Measured on two H200s: mapping on the allocation's device and `cuMemcpyPeerAsync`
    /// from the copier ran at 37 GB/s against 380+ GB/s for the raw peer copy.
    pub(in crate::device) fn mapping_device(&self, copier: usize, desc: &DeviceFrameDescriptor) -> usize {
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
