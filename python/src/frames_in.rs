//! Python objects as ferrylink frames, without a copy.
//!
//! Tried in this order:
//! 1. a `DeviceFrame` this module handed out: the same device memory again;
//! 2. a `torch.Tensor`: its storage (CUDA: a device frame ordered after the tensor's
//!    current stream; CPU: through DLPack);
//! 3. an object with `__dlpack_device__`/`__dlpack__` (CuPy, JAX, NumPy...): CUDA memory
//!    as a device frame, host memory through the buffer protocol or the capsule;
//! 4. an object with `__cuda_array_interface__` (Numba, older CuPy);
//! 5. the buffer protocol (bytes, bytearray, memoryview, array.array, NumPy).
//!
//! Device memory is exported as it lies: PyTorch's caching allocator hands out
//! `cudaMalloc` blocks, which legacy CUDA IPC exports (and expandable segments are VMM),
//! so they are sent without a bounce; what nothing can export is bounced by the transport
//! (`EndpointStats.bounced_bytes`). A frame must be one contiguous run of bytes: anything
//! else is a `FrameError` (make it contiguous first), never a silent copy.

use crate::dlpack::{self, DEVICE_CPU, DEVICE_CUDA, DEVICE_CUDA_HOST, DEVICE_CUDA_MANAGED};
use crate::errors;
use crate::frames_out::{PyDeviceFrame, PyHostFrame};
use crate::pybuffer::PyBufferRegion;
use ferrylink::cudarc::driver::sys::CUstream;
use ferrylink::memory::cuda::{self, foreign, DevicePool};
use ferrylink::memory::{DeviceMemoryOwner, HostRegion, KnownAllocation};
use ferrylink::{DeviceBuffer, Frame, HostBuffer};
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyMemoryView, PyTuple, PyType};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What the frames are for: a receive target must be writable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Use {
    Send,
    ReceiveInto,
}

/// `frames` (any iterable of frame objects) as ferrylink frames.
pub(crate) fn frames_from_python(frames: &Bound<'_, PyAny>, usage: Use) -> PyResult<Vec<Frame>> {
    if frames.is_instance_of::<PyBytes>() || frames.is_instance_of::<PyByteArray>() {
        return Err(PyTypeError::new_err("frames must be a list of frames (wrap a single buffer as [buffer])"));
    }
    let mut out = Vec::new();
    for (index, frame) in frames.try_iter()?.enumerate() {
        let frame = frame?;
        out.push(frame_from_python(&frame, usage).map_err(|e| with_index(frame.py(), e, index))?);
    }
    Ok(out)
}

/// Prefixes an error's message with the frame it concerns, keeping its class.
fn with_index(py: Python<'_>, error: PyErr, index: usize) -> PyErr {
    let class = error.get_type(py);
    let message = error.value(py).to_string();
    PyErr::from_type(class, format!("frame {index}: {message}"))
}

/// One object as a frame (see the module documentation for the order tried).
pub(crate) fn frame_from_python(obj: &Bound<'_, PyAny>, usage: Use) -> PyResult<Frame> {
    let py = obj.py();
    if let Ok(frame) = obj.cast::<PyDeviceFrame>() {
        return Ok(Frame::Device(alias_device_frame(frame)));
    }
    if obj.is_exact_instance_of::<PyMemoryView>()
        || obj.is_exact_instance_of::<PyBytes>()
        || obj.is_exact_instance_of::<PyByteArray>()
    {
        // The common host kinds, without looking for attributes they do not have.
        return buffer_frame(obj, usage);
    }
    if let Some(tensor_type) = torch_tensor_type(py) {
        if obj.is_instance(tensor_type.bind(py))? {
            return torch_frame(obj);
        }
    }
    if obj.hasattr("__dlpack_device__")? && obj.hasattr("__dlpack__")? {
        let (device_type, _): (i32, i64) = obj.call_method0("__dlpack_device__")?.extract()?;
        if device_type == DEVICE_CPU || device_type == DEVICE_CUDA_HOST {
            if let Ok(region) = PyBufferRegion::export(obj, usage == Use::ReceiveInto) {
                return Ok(shared_host_frame(obj, &region).unwrap_or_else(|| host_frame(region)));
            }
        }
        return dlpack_frame(obj, device_type);
    }
    if obj.hasattr("__cuda_array_interface__")? {
        return cuda_array_interface_frame(obj, usage);
    }
    buffer_frame(obj, usage)
}

/// An object's buffer (the buffer protocol) as a host frame.
fn buffer_frame(obj: &Bound<'_, PyAny>, usage: Use) -> PyResult<Frame> {
    let py = obj.py();
    match PyBufferRegion::export(obj, usage == Use::ReceiveInto) {
        Ok(region) => Ok(shared_host_frame(obj, &region).unwrap_or_else(|| host_frame(region))),
        Err(e) if e.is_instance_of::<PyBufferError>(py) => {
            Err(errors::error(py, "FrameError", e.value(py).to_string()))
        }
        Err(_) => {
            let type_name = obj.get_type().name()?;
            Err(PyTypeError::new_err(format!(
                "a frame must be device memory (__dlpack__ or __cuda_array_interface__: torch, CuPy, Numba) or \
                 host memory (bytes, bytearray, memoryview, NumPy), not {type_name}"
            )))
        }
    }
}

/// A `memoryview` of a received host frame or a `host_buffer` (the package's views keep
/// the frame as their exporter's `_ferrylink_frame`), or a NumPy array over one, when
/// its bytes lie in shared memory: the same bytes through the frame's shared region,
/// sent without a copy.
fn shared_host_frame(obj: &Bound<'_, PyAny>, export: &PyBufferRegion) -> Option<Frame> {
    // The view itself, or the view a NumPy array was made over (`np.frombuffer(view)`).
    let view = if obj.is_instance_of::<PyMemoryView>() {
        obj.clone()
    } else {
        obj.getattr("base").ok().filter(|base| base.is_instance_of::<PyMemoryView>())?
    };
    let frame = view.getattr("obj").ok()?.getattr("_ferrylink_frame").ok()?;
    let frame = frame.cast::<PyHostFrame>().ok()?;
    let buffer = frame.get().shared_slice(export.base_ptr() as usize, export.len())?;
    Some(Frame::Host(buffer))
}

/// A host frame over an exported buffer (an empty one needs no region).
fn host_frame(region: PyBufferRegion) -> Frame {
    let len = region.len();
    if len == 0 {
        return Frame::Host(HostBuffer::from_vec(Vec::new()));
    }
    Frame::Host(HostBuffer::from_region(Arc::new(region), 0, len))
}

/// Device memory a Python object keeps alive, with the allocation the memory's first
/// owner recorded (ferrylink's own pool memory skips the driver queries then).
struct PythonOwned {
    _owner: Py<PyAny>,
    allocation: Option<KnownAllocation>,
    len: usize,
}

impl DeviceMemoryOwner for PythonOwned {
    fn describe(&self) -> String {
        format!("Python-owned device memory ({} B)", self.len)
    }
    fn allocation(&self) -> Option<KnownAllocation> {
        self.allocation
    }
}

/// The device memory of a `DeviceFrame` once more, kept alive by the frame object.
fn alias_device_frame(frame: &Bound<'_, PyDeviceFrame>) -> DeviceBuffer {
    let buffer = &frame.get().buffer;
    let owner = PythonOwned {
        _owner: frame.clone().into_any().unbind(),
        allocation: buffer.owner().allocation(),
        len: buffer.len(),
    };
    // SAFETY: the range is the frame's live device memory on its device, kept valid by the
    // frame object the owner holds; its bytes were complete when it was received.
    unsafe { DeviceBuffer::from_raw_parts(buffer.device_ptr(), buffer.len(), buffer.device_ordinal(), Arc::new(owner)) }
}

/// Fails with `UnsupportedError` unless this process sees a CUDA device.
fn require_cuda(py: Python<'_>) -> PyResult<()> {
    if py.detach(cuda::device_count) == 0 {
        return Err(errors::error(
            py,
            "UnsupportedError",
            "device frames need a CUDA device, and this process sees none (no driver, no GPU, or FERRYLINK_DISABLE_CUDA=1)",
        ));
    }
    Ok(())
}

/// The stream an object's producer queued its work on, as the object says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Producer {
    /// None named (a CUDA Array Interface without a stream: nothing to wait for).
    Unnamed,
    /// The legacy default stream (PyTorch's default stream, CAI stream 1, a DLPack
    /// export made for stream 1).
    LegacyDefault,
    /// A stream of the device's primary context, as a raw `cudaStream_t`.
    Stream(u64),
}

impl Producer {
    /// A raw `cudaStream_t` as PyTorch or the CUDA Array Interface gives it: 0 and 1
    /// (`cudaStreamLegacy`) are the legacy default stream.
    fn of_raw(raw: u64) -> Self {
        match raw {
            0 | 1 => Producer::LegacyDefault,
            raw => Producer::Stream(raw),
        }
    }
}

/// Device memory at `ptr..ptr+len` on `device`, kept alive by `owner`, naming its
/// `producer` stream. Naming the legacy default stream changes nothing for sends (the
/// transport orders every send after it) but orders one-sided transfers from and into
/// the memory, and receives into it, after that stream's work too, as PyTorch's own
/// operations would be: memory naming no stream is not ordered there (NIXL's rule).
fn device_frame(
    py: Python<'_>,
    ptr: u64,
    len: usize,
    device: usize,
    owner: Py<PyAny>,
    producer: Producer,
) -> PyResult<Frame> {
    require_cuda(py)?;
    if len == 0 {
        // An empty tensor may have no memory at all (address 0), which nothing can export:
        // an empty range of ferrylink's pool on the same device stands in for it.
        let empty = py.detach(|| DevicePool::shared(device).and_then(|pool| pool.alloc(0)));
        let empty = empty.map_err(|e| errors::error(py, "UnsupportedError", format!("an empty device frame: {e}")))?;
        return Ok(Frame::Device(empty));
    }
    let owner = PythonOwned { _owner: owner, allocation: None, len };
    // SAFETY: the caller read `ptr`, `len` and `device` from the object's own description
    // of its memory, which `owner` keeps alive; its producer's work is ordered by the
    // stream named below.
    let buffer = unsafe { DeviceBuffer::from_raw_parts(ptr, len, device, Arc::new(owner)) };
    let stream = match producer {
        Producer::Unnamed => return Ok(Frame::Device(buffer)),
        Producer::LegacyDefault => std::ptr::null_mut(),
        Producer::Stream(raw) => raw as usize as CUstream,
    };
    // SAFETY: null is the legacy default stream; any other value is the producer's
    // stream (PyTorch's current stream, or the one the CUDA Array Interface names), a
    // stream of the device's primary context that the producer keeps (PyTorch never
    // destroys its pool streams; a user's own stream must outlive its sends, as the
    // package documents).
    Ok(Frame::Device(unsafe { buffer.produced_on_raw(stream) }))
}

/// `torch.Tensor`, once torch is imported (it is never imported here).
fn torch_tensor_type(py: Python<'_>) -> Option<&'static Py<PyType>> {
    static TENSOR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    if let Some(t) = TENSOR.get(py) {
        return Some(t);
    }
    static SYS_MODULES: PyOnceLock<Py<PyDict>> = PyOnceLock::new();
    let modules = SYS_MODULES
        .get_or_try_init(py, || {
            py.import("sys")?.getattr("modules")?.cast_into::<PyDict>().map(Bound::unbind).map_err(PyErr::from)
        })
        .ok()?;
    let torch = modules.bind(py).get_item("torch").ok()??;
    let tensor = torch.getattr("Tensor").ok()?.cast_into::<PyType>().ok()?;
    let _ = TENSOR.set(py, tensor.unbind());
    TENSOR.get(py)
}

/// A torch tensor: a CUDA one as a device frame over its memory, ordered after the
/// current stream of its device; a CPU one through DLPack.
fn torch_frame(tensor: &Bound<'_, PyAny>) -> PyResult<Frame> {
    let py = tensor.py();
    if !tensor.getattr("is_cuda")?.extract::<bool>()? {
        return dlpack_frame(tensor, DEVICE_CPU);
    }
    if !tensor.call_method0("is_contiguous")?.extract::<bool>()? {
        let shape = tensor.getattr("shape")?.str()?.to_string();
        let strides = tensor.call_method0("stride")?.str()?.to_string();
        return Err(errors::error(
            py,
            "FrameError",
            format!(
                "a non-contiguous tensor ({shape}, strides {strides}) cannot be sent or received into as it is: \
                 pass tensor.contiguous()"
            ),
        ));
    }
    let ptr: u64 = tensor.call_method0("data_ptr")?.extract()?;
    let len: usize = tensor.getattr("nbytes")?.extract()?;
    let device: usize = tensor.call_method0("get_device")?.extract()?;
    let producer = Producer::of_raw(torch_current_stream(py, device)?);
    device_frame(py, ptr, len, device, tensor.clone().unbind(), producer)
}

/// The raw `cudaStream_t` of torch's current stream on `device` (0: the legacy default).
/// (Looked up once: an import per send, even of a loaded module, costs about a µs.)
fn torch_current_stream(py: Python<'_>, device: usize) -> PyResult<u64> {
    static RAW_STREAM: PyOnceLock<Option<Py<PyAny>>> = PyOnceLock::new();
    let raw = RAW_STREAM.get_or_try_init(py, || -> PyResult<_> {
        let torch = py.import("torch")?;
        Ok(torch.getattr("_C").and_then(|c| c.getattr("_cuda_getCurrentRawStream")).ok().map(Bound::unbind))
    })?;
    match raw {
        Some(f) => f.bind(py).call1((device,))?.extract(),
        None => py
            .import("torch")?
            .getattr("cuda")?
            .call_method1("current_stream", (device,))?
            .getattr("cuda_stream")?
            .extract(),
    }
}

/// An object's DLPack export: CUDA memory as a device frame, host memory as a host
/// frame; the capsule, unconsumed, keeps the memory alive until the frame goes.
fn dlpack_frame(obj: &Bound<'_, PyAny>, device_type: i32) -> PyResult<Frame> {
    let py = obj.py();
    let on_cuda = device_type == DEVICE_CUDA || device_type == DEVICE_CUDA_MANAGED;
    let capsule = if on_cuda {
        // Stream 1, the legacy default stream: the producer orders it after its own work,
        // and the frame names that stream, so the transport's copies (one-sided ones
        // too) come after it.
        let kwargs = PyDict::new(py);
        kwargs.set_item("stream", 1)?;
        match obj.call_method("__dlpack__", (), Some(&kwargs)) {
            Ok(c) => c,
            Err(e) if e.is_instance_of::<PyTypeError>(py) => obj.call_method0("__dlpack__")?,
            Err(e) => return Err(e),
        }
    } else {
        obj.call_method0("__dlpack__")?
    };
    let described = dlpack::describe(&capsule).map_err(|m| errors::error(py, "FrameError", m))?;
    match described.device.device_type {
        t if t == DEVICE_CUDA || t == DEVICE_CUDA_MANAGED => {
            let device = usize::try_from(described.device.device_id)
                .map_err(|_| errors::error(py, "FrameError", "a negative CUDA device id"))?;
            device_frame(py, described.ptr, described.len, device, capsule.unbind(), Producer::LegacyDefault)
        }
        t if t == DEVICE_CPU || t == DEVICE_CUDA_HOST => {
            let region = GuardedHostRegion::new(described.ptr, described.len, capsule.unbind());
            let len = region.len;
            if len == 0 {
                return Ok(Frame::Host(HostBuffer::from_vec(Vec::new())));
            }
            Ok(Frame::Host(HostBuffer::from_region(Arc::new(region), 0, len)))
        }
        other => Err(errors::error(py, "FrameError", format!("DLPack device type {other} is not one ferrylink moves"))),
    }
}

/// Host memory that a Python object (a DLPack capsule) keeps alive.
struct GuardedHostRegion {
    ptr: u64,
    len: usize,
    id: u64,
    _guard: Py<PyAny>,
}

/// Region ids of DLPack host memory, apart from `pybuffer`'s and ferrylink's own.
static NEXT_GUARDED_ID: AtomicU64 = AtomicU64::new(3 << 61);

impl GuardedHostRegion {
    fn new(ptr: u64, len: usize, guard: Py<PyAny>) -> Self {
        Self { ptr, len, id: NEXT_GUARDED_ID.fetch_add(1, Ordering::Relaxed), _guard: guard }
    }
}

impl HostRegion for GuardedHostRegion {
    fn base_ptr(&self) -> *mut u8 {
        self.ptr as usize as *mut u8
    }
    fn len(&self) -> usize {
        self.len
    }
    fn region_id(&self) -> u64 {
        self.id
    }
}

/// An object with `__cuda_array_interface__` (version 2 or 3).
fn cuda_array_interface_frame(obj: &Bound<'_, PyAny>, usage: Use) -> PyResult<Frame> {
    let py = obj.py();
    let cai = obj.getattr("__cuda_array_interface__")?;
    let bad = |what: String| errors::error(py, "FrameError", format!("__cuda_array_interface__: {what}"));
    let (ptr, read_only): (u64, bool) = cai.get_item("data")?.extract()?;
    if read_only && usage == Use::ReceiveInto {
        return Err(bad("the array is read-only and cannot be received into".into()));
    }
    let shape: Vec<i64> = cai.get_item("shape")?.extract()?;
    let typestr: String = cai.get_item("typestr")?.extract()?;
    let itemsize: i64 =
        typestr.get(2..).and_then(|s| s.parse().ok()).ok_or_else(|| bad(format!("typestr {typestr:?}")))?;
    let strides = match cai.get_item("strides") {
        Ok(s) if !s.is_none() => Some(s.cast_into::<PyTuple>()?.extract::<Vec<i64>>()?),
        _ => None,
    };
    let in_elements = strides
        .as_ref()
        .map(|s| s.iter().map(|b| if b % itemsize == 0 { b / itemsize } else { -1 }).collect::<Vec<_>>());
    if !dlpack::is_row_major(&shape, in_elements.as_deref()) {
        return Err(bad(format!(
            "the array is not contiguous (shape {shape:?}, strides {strides:?}): make it contiguous first"
        )));
    }
    let elements: i64 = shape.iter().product();
    let len = usize::try_from(elements.saturating_mul(itemsize)).map_err(|_| bad("a negative size".into()))?;
    // CAI streams: none named means nothing to wait for; 1 is the legacy default stream
    // (0, which version 3 disallows, is taken for it too), 2 the per-thread default one.
    let producer = match cai.get_item("stream") {
        Ok(s) if !s.is_none() => Producer::of_raw(s.extract()?),
        _ => Producer::Unnamed,
    };
    require_cuda(py)?;
    let device = device_of_pointer(py, ptr)?;
    device_frame(py, ptr, len, device, obj.clone().unbind(), producer)
}

/// The device a pointer's memory is on (CUDA Array Interface does not say).
fn device_of_pointer(py: Python<'_>, ptr: u64) -> PyResult<usize> {
    let info = py.detach(|| cuda::Gpu::get(0).and_then(|gpu| foreign::pointer_info(&gpu, ptr)));
    info.map(|i| i.device_ordinal)
        .map_err(|e| errors::error(py, "FrameError", format!("{ptr:#x} is not CUDA device memory: {e}")))
}
