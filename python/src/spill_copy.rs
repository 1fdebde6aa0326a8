//! The pinned host pool and the device ↔ host copies of `ferrylink.dask`'s serializers:
//! [`PyPinnedPool`] (`ferrylink._ferrylink.PinnedPool`), [`device_to_host`] (device
//! frames of Python objects into pool memory, in pipelined chunks on two streams) and
//! [`host_to_device`] (host bytes into device memory a Python library allocated).
//!
//! Both copies first wait for the stream each object names as its producer (PyTorch's
//! current stream, a CUDA Array Interface stream): ferrylink's copy streams are
//! non-blocking, so without the wait a copy could read bytes a kernel is still writing,
//! or write memory a kernel queued before the allocation still reads.

use crate::errors;
use crate::frames_in::{frames_from_python, Use};
use crate::frames_out::frame_to_python;
use crate::pybuffer::release_deferred;
use ferrylink::cudarc::driver::sys;
use ferrylink::memory::cuda::Gpu;
use ferrylink::memory::serialize::{self, FrameOrigin, HostMessage, SerializeError};
use ferrylink::memory::{PinnedPool, PinnedPoolConfig, Registration};
use ferrylink::{DeviceBuffer, Frame, HostBuffer, Message};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Page-locked host memory, allocated once and carved into chunks: where device frames
/// are copied to. `max_bytes` is the most the pool reserves (it grows region by region
/// up to it); without CUDA it is plain host memory.
#[pyclass(name = "PinnedPool", module = "ferrylink", frozen)]
pub(crate) struct PyPinnedPool {
    pub(crate) pool: PinnedPool,
}

#[pymethods]
impl PyPinnedPool {
    #[new]
    #[pyo3(signature = (max_bytes, region_bytes = 256 << 20, chunk_bytes = 4 << 20))]
    fn new(py: Python<'_>, max_bytes: usize, region_bytes: usize, chunk_bytes: usize) -> PyResult<Self> {
        // The pool rounds a region up to whole chunks (of whole pages): the first region
        // may then exceed `max_bytes`, which becomes that region's size.
        let region_size = region_bytes.min(max_bytes).max(1);
        let rounded = chunk_bytes
            .max(1)
            .checked_next_multiple_of(4096)
            .and_then(|chunk| region_size.checked_next_multiple_of(chunk))
            .ok_or_else(|| errors::error(py, "FerrylinkError", "pinned pool sizes too large"))?;
        let max_bytes = max_bytes.max(rounded);
        let config = PinnedPoolConfig::default()
            .with_chunk_size(chunk_bytes)
            .with_region_size(region_size)
            .with_initial_regions(1)
            .with_max_bytes(max_bytes)
            .with_registration(Registration::Auto);
        let pool = py
            .detach(|| PinnedPool::new(config))
            .map_err(|e| errors::error(py, "FerrylinkError", format!("cannot make the pinned pool: {e}")))?;
        Ok(Self { pool })
    }

    /// Whether the memory is page-locked and registered with CUDA.
    #[getter]
    fn is_pinned(&self) -> bool {
        self.pool.is_pinned()
    }

    /// The allocation granularity.
    #[getter]
    fn chunk_bytes(&self) -> usize {
        self.pool.chunk_size()
    }

    /// `regions`, `bytes_reserved`, `bytes_in_use`, `high_water`, `allocations`, `failures`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.pool.stats();
        let d = PyDict::new(py);
        d.set_item("regions", s.regions)?;
        d.set_item("bytes_reserved", s.bytes_reserved)?;
        d.set_item("bytes_in_use", s.bytes_in_use)?;
        d.set_item("high_water", s.high_water)?;
        d.set_item("allocations", s.allocations)?;
        d.set_item("failures", s.failures)?;
        Ok(d)
    }
}

/// Blocks until the producer stream each device frame names has finished its work.
pub(crate) fn wait_for_producers(frames: &[Frame]) -> Result<(), String> {
    for d in frames.iter().filter_map(Frame::as_device) {
        let Some(producer) = d.producer_stream() else { continue };
        let gpu = Gpu::get(d.device_ordinal()).map_err(|e| e.to_string())?;
        gpu.bind_to_current_thread().map_err(|e| e.to_string())?;
        // SAFETY: the producer stream is a live stream of this device's primary context
        // (or the legacy default stream), as the frame's maker promised; it is only waited on.
        let status = unsafe { sys::cuStreamSynchronize(producer.raw()) };
        if status != sys::CUresult::CUDA_SUCCESS {
            return Err(format!("cuStreamSynchronize of a producer stream: {status:?}"));
        }
    }
    Ok(())
}

/// A device-copy failure as the package's exception.
fn copy_error(py: Python<'_>, e: &SerializeError) -> PyErr {
    let class = match e {
        SerializeError::Unsupported(_) => "UnsupportedError",
        _ => "FerrylinkError",
    };
    errors::error(py, class, e.to_string())
}

/// The bytes of each device object in `objects` (torch CUDA tensors, CuPy, Numba, RMM,
/// `DeviceFrame`s: contiguous memory), copied into `pool` memory (fresh pinned-staged
/// memory where the pool is full), as `HostFrame`s in the same order.
#[pyfunction]
#[pyo3(signature = (objects, pool))]
pub(crate) fn device_to_host(
    py: Python<'_>,
    objects: &Bound<'_, PyAny>,
    pool: &Bound<'_, PyPinnedPool>,
) -> PyResult<Vec<Py<PyAny>>> {
    let frames = frames_from_python(objects, Use::Send)?;
    if let Some(i) = frames.iter().position(|f| f.as_device().is_none()) {
        return Err(errors::error(py, "FrameError", format!("object {i} is host memory, not device memory")));
    }
    let pool = pool.get().pool.clone();
    let msg = Message::new(Vec::new(), frames);
    let copied = py.detach(|| {
        wait_for_producers(&msg.frames).map_err(SerializeError::Cuda)?;
        serialize::device_frames_to_host(&msg, Some(&pool))
    });
    drop(msg);
    release_deferred(py);
    let copies = copied.map_err(|e| copy_error(py, &e))?;
    copies
        .into_iter()
        .map(|c| frame_to_python(py, Frame::Host(c.unwrap_or_else(|| HostBuffer::from_vec(Vec::new())))))
        .collect()
}

/// Copies each host buffer of `sources` (bytes-like, contiguous) into the device memory
/// of the object at the same place in `targets` (as `device_to_host` takes them); the
/// lengths must match. Returns when the bytes are on the device.
#[pyfunction]
pub(crate) fn host_to_device(py: Python<'_>, sources: &Bound<'_, PyAny>, targets: &Bound<'_, PyAny>) -> PyResult<()> {
    let sources = frames_from_python(sources, Use::Send)?;
    let targets = frames_from_python(targets, Use::ReceiveInto)?;
    if sources.len() != targets.len() {
        let m = format!("{} sources but {} targets", sources.len(), targets.len());
        return Err(errors::error(py, "BufferMismatchError", m));
    }
    let mut host = Vec::with_capacity(sources.len());
    let mut device: Vec<DeviceBuffer> = Vec::with_capacity(targets.len());
    let mut origins = Vec::with_capacity(sources.len());
    for (i, (s, t)) in sources.into_iter().zip(targets).enumerate() {
        let (Frame::Host(s), Frame::Device(t)) = (s, t) else {
            let m = format!("pair {i}: a source must be host memory and a target device memory");
            return Err(errors::error(py, "FrameError", m));
        };
        if s.len() != t.len() {
            let m = format!("pair {i}: {} source bytes for a target of {} bytes", s.len(), t.len());
            return Err(errors::error(py, "BufferMismatchError", m));
        }
        origins.push(FrameOrigin::Device { ordinal: t.device_ordinal() });
        host.push(s);
        device.push(t);
    }
    let target_frames: Vec<Frame> = device.into_iter().map(Frame::Device).collect();
    let copied = py.detach(|| {
        wait_for_producers(&target_frames).map_err(SerializeError::Cuda)?;
        let mut targets = target_frames.into_iter();
        let msg = HostMessage { header: Vec::new(), frames: host, origins };
        serialize::host_to_device(msg, |_, len| match targets.next() {
            Some(Frame::Device(d)) => Ok(d),
            _ => Err(SerializeError::Layout(format!("no target left for {len} bytes"))),
        })
        .map_err(|f| f.error)
    });
    let result = copied.map(drop).map_err(|e| copy_error(py, &e));
    release_deferred(py);
    result
}
