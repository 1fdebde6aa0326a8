//! Frames handed to Python: [`PyDeviceFrame`] (device memory with `__dlpack__` and
//! `__cuda_array_interface__`, so `torch.from_dlpack(frame)` takes it without a copy) and
//! [`PyHostFrame`] (host memory, which the Python package shows as a writable
//! `memoryview`).

use crate::dlpack;
use crate::errors;
use crate::shared_host::{alias_of, SharedFrame};
use ferrylink::memory::cuda::DevicePool;
use ferrylink::{DeviceBuffer, Frame, HostBuffer};
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A received device frame: `nbytes` bytes of device memory on CUDA device `device`,
/// ferrylink's own (freed, back to its pool, once nothing refers to the frame: neither
/// Python nor a tensor made from it).
///
/// It is a 1-D uint8 array to DLPack and `__cuda_array_interface__`:
/// `torch.from_dlpack(frame).view(torch.float32).reshape(shape)` gives a tensor over the
/// same memory. The bytes were complete when the receive returned; no stream
/// synchronisation is needed. It can be sent on as it is, without a copy.
#[pyclass(name = "DeviceFrame", module = "ferrylink", frozen)]
pub(crate) struct PyDeviceFrame {
    pub(crate) buffer: DeviceBuffer,
}

#[pymethods]
impl PyDeviceFrame {
    /// Bytes in the frame.
    #[getter]
    fn nbytes(&self) -> usize {
        self.buffer.len()
    }

    /// The CUDA device ordinal.
    #[getter]
    fn device(&self) -> usize {
        self.buffer.device_ordinal()
    }

    /// The device address.
    #[getter]
    fn ptr(&self) -> u64 {
        self.buffer.device_ptr()
    }

    fn __len__(&self) -> usize {
        self.buffer.len()
    }

    fn __repr__(&self) -> String {
        format!("DeviceFrame(nbytes={}, device={}, ptr={:#x})", self.buffer.len(), self.device(), self.ptr())
    }

    /// `(kDLCUDA, device)`.
    fn __dlpack_device__(&self) -> (i32, usize) {
        (dlpack::DEVICE_CUDA, self.buffer.device_ordinal())
    }

    /// A DLPack capsule over the frame (1-D uint8). `stream` needs no wait: the bytes
    /// were complete when the receive returned. `copy=True` and another `dl_device` are
    /// refused with `BufferError`.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        slf: &Bound<'py, Self>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<&Bound<'py, PyAny>>,
        dl_device: Option<(i32, usize)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = (stream, max_version);
        let this = slf.get();
        if let Some(wanted) = dl_device {
            if wanted != this.__dlpack_device__() {
                return Err(PyBufferError::new_err(format!(
                    "a DeviceFrame lives on {:?}, not {wanted:?}, and is not copied",
                    this.__dlpack_device__()
                )));
            }
        }
        if copy == Some(true) {
            return Err(PyBufferError::new_err("a DeviceFrame is lent, not copied (copy=True)"));
        }
        let buf = &this.buffer;
        dlpack::lend(slf.py(), buf.device_ptr(), buf.len(), buf.device_ordinal(), slf.clone().into_any().unbind())
    }

    /// Version 3 of the CUDA Array Interface: 1-D uint8, no stream to wait for.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let cai = PyDict::new(py);
        cai.set_item("shape", (self.buffer.len(),))?;
        cai.set_item("typestr", "|u1")?;
        cai.set_item("data", (self.buffer.device_ptr(), false))?;
        cai.set_item("version", 3)?;
        cai.set_item("strides", py.None())?;
        cai.set_item("stream", py.None())?;
        Ok(cai)
    }
}

/// A received host frame. The Python package hands it out as a writable `memoryview`
/// (which keeps it alive); `_address()` gives the view its memory.
#[pyclass(name = "HostFrame", module = "ferrylink", frozen)]
pub(crate) struct PyHostFrame {
    buffer: HostBuffer,
    /// Taken from `&mut` when the frame was made: the memory is written only through
    /// the views Python makes of it.
    address: usize,
    /// The frame's shared memory, when it lies in a memfd region: sent without a copy.
    shared: Option<SharedFrame>,
}

impl PyHostFrame {
    fn new(mut buffer: HostBuffer) -> Self {
        let address = buffer.as_mut_slice().as_mut_ptr() as usize;
        let len = buffer.len();
        let shared = alias_of(&buffer).map(|(alias, offset)| SharedFrame { alias, offset, len });
        Self { buffer, address, shared }
    }

    /// The bytes `address..address+len` (inside this frame) as a buffer over its shared
    /// region, for a send without a copy; `None` when the frame is not shared memory or
    /// the range is not inside it.
    pub(crate) fn shared_slice(&self, address: usize, len: usize) -> Option<HostBuffer> {
        let start = address.checked_sub(self.address)?;
        self.shared.as_ref()?.slice(start, len)
    }
}

#[pymethods]
impl PyHostFrame {
    /// `(address, length)` of the bytes.
    fn _address(&self) -> (usize, usize) {
        (self.address, self.buffer.len())
    }

    fn __len__(&self) -> usize {
        self.buffer.len()
    }
}

/// A received frame as a Python object.
pub(crate) fn frame_to_python(py: Python<'_>, frame: Frame) -> PyResult<Py<PyAny>> {
    match frame {
        Frame::Device(buffer) => Ok(Py::new(py, PyDeviceFrame { buffer })?.into_any()),
        Frame::Host(buffer) => Ok(Py::new(py, PyHostFrame::new(buffer))?.into_any()),
    }
}

/// CUDA devices this process sees (0 without a driver or a GPU, or with
/// `FERRYLINK_DISABLE_CUDA=1` applied by a context).
#[pyfunction]
pub(crate) fn device_count(py: Python<'_>) -> usize {
    py.detach(ferrylink::memory::cuda::device_count)
}

/// `nbytes` of ferrylink's exportable device memory on `device` (contents undefined), as
/// a `DeviceFrame`: for programs without another GPU library. Raises `UnsupportedError`
/// without a GPU.
#[pyfunction]
#[pyo3(signature = (nbytes, device=0))]
pub(crate) fn alloc_device(py: Python<'_>, nbytes: usize, device: usize) -> PyResult<PyDeviceFrame> {
    let buffer = py
        .detach(|| DevicePool::shared(device).and_then(|pool| pool.alloc(nbytes)))
        .map_err(|e| errors::error(py, "UnsupportedError", format!("cannot allocate device memory: {e}")))?;
    Ok(PyDeviceFrame { buffer })
}

/// `nbytes` of zeroed host memory in a memfd region of its own, as a `HostFrame`: the
/// native lane sends it by passing the fd once, without copying the bytes.
#[pyfunction]
pub(crate) fn shared_host_buffer(py: Python<'_>, nbytes: usize) -> PyResult<PyHostFrame> {
    let buffer = py
        .detach(|| ferrylink::ipc::shared_host_buffer(nbytes))
        .map_err(|e| errors::error(py, "FerrylinkError", format!("cannot make a shared host buffer: {e}")))?;
    Ok(PyHostFrame::new(buffer))
}
