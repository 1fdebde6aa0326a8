//! CUDA state shared by every connection of one context: the IPC exporter, the mapping
//! and event caches, per-device streams, pools and event pools.
//!
//! Sender: a device frame's allocation is exported once (`cuIpcGetMemHandle`, cached);
//! memory legacy IPC cannot export (cudarc's stream-ordered pool) is bounced into the
//! exportable pool first. Receiver: a descriptor's ready events are polled, every device
//! descriptor is mapped (the mapping cache validates it against the real allocation),
//! room is asked of the spill store, targets are allocated from the exportable pool (or
//! taken from `recv_into`), the copies run on a per-device stream (same-device copies by
//! the copy kernel up to its limit) and the stream is synchronised before the message is
//! acknowledged: the sender never frees memory a copy still reads.
//!
//! - `ordering.rs`: ordering a send after the GPU work that produced it.
//! - `push.rs`: connector copies into the listener's buffers.
//!
//! Why connector copies, polled events and the legacy default stream:
//! `docs/architecture.md`, "Design decisions".

mod ordering;
mod push;

pub(crate) use ordering::{Copier, ProducerMarks, ProducerOrders};
pub(crate) use push::PushInFlight;

use crate::config::{Config, ProducerOrdering};
use crate::error::TransportError;
use crate::wire::DeviceFrameDescriptor;
use ferrylink_ipc::cuda_ipc::{
    copy_from_mapping, CacheConfig, CudaIpcError, ImportedEventCache, IpcEventDescriptor, IpcExporter,
    IpcMemDescriptor, MappingCache, MappingLease,
};
use ferrylink_memory::cuda::{self, CudaError, DevicePool, EventPool, Gpu, Stream};
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
}

/// CUDA state shared by every connection of one context (progress thread only).
pub(crate) struct DeviceLane {
    state: OnceLock<Result<CudaState, String>>,
    recv_device: Option<usize>,
    producer_ordering: ProducerOrdering,
    make_room: Option<Arc<dyn MakeRoom>>,
    max_mapped_bytes: u64,
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
    _bounces: Vec<DeviceBuffer>,
    /// The producer marks the copies wait on (returned to the pool only after the ack,
    /// when the peer's wait on them was long enqueued).
    pub producer: ProducerMarks,
}

impl DeviceHold {
    /// A hold for a send whose copies wait on `producer`.
    pub fn with_producer(producer: ProducerMarks) -> Self {
        Self { _bounces: Vec::new(), producer }
    }
}

/// Device-side statistics for [`crate::ContextStats`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DeviceStats {
    pub open_mappings: usize,
    pub mapped_bytes: u64,
    pub mapping_opens: u64,
    pub handles_fetched: u64,
}

impl DeviceLane {
    pub fn new(config: &Config, make_room: Option<Arc<dyn MakeRoom>>) -> Self {
        config.cuda.apply();
        Self {
            state: OnceLock::new(),
            recv_device: config.recv_device,
            producer_ordering: config.producer_ordering,
            make_room,
            max_mapped_bytes: config.max_mapped_device_bytes,
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
            gpu,
        });
        devices.insert(ordinal, d.clone());
        Ok(d)
    }

    /// Describes the device frames of one message; `hold` keeps what must live until
    /// the ack. Frames are `(index, buffer)`; the result is in the same order.
    pub fn export(
        &self,
        frames: &[&DeviceBuffer],
        hold: &mut DeviceHold,
    ) -> Result<Vec<DeviceFrameDescriptor>, DeviceFrameError> {
        let cuda = self.cuda()?;
        let mut out = Vec::with_capacity(frames.len());
        let started = std::time::Instant::now();
        for buf in frames {
            let dev = self.device(buf.device_ordinal())?;
            // One pointer query per frame: the export itself says when memory is not
            // exportable, and only then is it bounced.
            let direct = cuda.exporter.export(buf);
            let bounce = if !matches!(direct, Err(CudaIpcError::NotExportable(_))) {
                None
            } else {
                tracing::info!(
                    len = buf.len(),
                    owner = %buf.owner().describe(),
                    "device frame is not IPC-exportable (stream-ordered pool memory?); bouncing it through the exportable pool"
                );
                // The bounce copy must see the producer's work: wait for the device first.
                dev.gpu.synchronize()?;
                let b = cuda::bounce_to_exportable(buf, &dev.pool, &dev.stream)?;
                dev.stream.synchronize()?;
                Some(b)
            };
            let ipc = match &bounce {
                None => direct,
                Some(b) => cuda.exporter.export(b),
            }
            .map_err(|e| DeviceFrameError::Local(e.to_string()))?;
            hold._bounces.extend(bounce);
            // Ordered by the sender (see the module docs): nothing to wait for.
            out.push(from_ipc(&ipc));
        }
        tracing::trace!(us = started.elapsed().as_micros() as u64, frames = frames.len(), "device export");
        Ok(out)
    }

    /// Connector-copies mode, listener side: descriptors of buffers the connector is to
    /// copy into (no events: the connector orders its own copies).
    pub fn export_targets(&self, targets: &[&DeviceBuffer]) -> Result<Vec<DeviceFrameDescriptor>, DeviceFrameError> {
        let cuda = self.cuda()?;
        targets
            .iter()
            .map(|buf| {
                let ipc = cuda.exporter.export(buf).map_err(|e| DeviceFrameError::Local(e.to_string()))?;
                Ok(from_ipc(&ipc))
            })
            .collect()
    }

    /// Whether `buf` can be exported with legacy CUDA IPC.
    pub fn is_exportable(&self, buf: &DeviceBuffer) -> bool {
        cuda::is_ipc_exportable(buf).unwrap_or(false)
    }

    /// Maps every device descriptor of a message (validating it against the real
    /// allocation) before anything is allocated; `copiers[i]` is the device that will copy
    /// through mapping `i` (see `mapping_device`).
    pub fn map_all(
        &self,
        peer_pid: u32,
        descs: &[&DeviceFrameDescriptor],
        copiers: &[usize],
    ) -> Result<Vec<MappingLease>, DeviceFrameError> {
        let cuda = self.cuda()?;
        let started = std::time::Instant::now();
        let leases = descs
            .iter()
            .zip(copiers)
            .map(|(d, &copier)| {
                let ipc = to_ipc(d);
                let on = self.mapping_device(copier, d);
                cuda.mappings.acquire_on(peer_pid, &ipc, Some(on)).map_err(|e| match e {
                    CudaIpcError::Cuda(c) if c.code().is_some() => DeviceFrameError::BadDescriptor(c.to_string()),
                    CudaIpcError::InvalidDescriptor(s) => DeviceFrameError::BadDescriptor(s),
                    other => DeviceFrameError::Local(other.to_string()),
                })
            })
            .collect();
        tracing::trace!(us = started.elapsed().as_micros() as u64, "device mappings acquired");
        leases
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

    /// Copies each mapped frame into its target and waits for the copies. The frames'
    /// ready events were polled before (`events_ready`): nothing waits on the GPU for
    /// another process.
    pub fn copy_in(
        &self,
        frames: &[(&DeviceFrameDescriptor, &MappingLease, &DeviceBuffer)],
    ) -> Result<(), DeviceFrameError> {
        let mut used: Vec<Arc<PerDevice>> = Vec::new();
        let started = std::time::Instant::now();
        for (desc, lease, target) in frames {
            let dev = self.device(target.device_ordinal())?;
            // SAFETY: the lease and target outlive the copy: the stream is synchronised
            // below before either is dropped or handed to the user.
            unsafe { copy_from_mapping(lease, desc.offset, desc.len, target, &dev.stream) }
                .map_err(|e| DeviceFrameError::Local(e.to_string()))?;
            if !used.iter().any(|u| Arc::ptr_eq(u, &dev)) {
                used.push(dev);
            }
        }
        let enqueued = started.elapsed();
        tracing::trace!("device landing: copies enqueued");
        for dev in used {
            dev.stream.synchronize()?;
        }
        tracing::trace!(
            enqueue_us = enqueued.as_micros() as u64,
            total_us = started.elapsed().as_micros() as u64,
            "device landing: copies enqueued and synchronised"
        );
        Ok(())
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
                DeviceStats {
                    open_mappings: m.open_mappings,
                    mapped_bytes: m.mapped_bytes,
                    mapping_opens: m.opens_total,
                    handles_fetched: cuda.exporter.stats().handles_fetched,
                }
            }
            _ => DeviceStats::default(),
        }
    }
}

/// The wire form of an export, without an event to wait for.
fn from_ipc(ipc: &IpcMemDescriptor) -> DeviceFrameDescriptor {
    DeviceFrameDescriptor {
        handle: ipc.handle,
        buffer_id: ipc.buffer_id,
        alloc_len: ipc.alloc_len,
        offset: ipc.offset,
        len: ipc.len,
        device_uuid: ipc.device_uuid,
        event: None,
    }
}

fn to_ipc(d: &DeviceFrameDescriptor) -> IpcMemDescriptor {
    IpcMemDescriptor {
        handle: d.handle,
        buffer_id: d.buffer_id,
        alloc_len: d.alloc_len,
        offset: d.offset,
        len: d.len,
        device_uuid: d.device_uuid,
    }
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
