//! Host memory of Python objects (the buffer protocol: bytes, bytearray, memoryview,
//! NumPy arrays) as ferrylink host regions, without a copy.
//!
//! pyo3 offers the buffer protocol under the stable ABI only from Python 3.11, but
//! `PyObject_GetBuffer`, `PyBuffer_Release` and the `Py_buffer` layout are the same in
//! every CPython 3 (3.11 merely added them to the limited API, unchanged): this module
//! declares them itself, so the one abi3 wheel takes buffers on 3.9 and 3.10 too.
//!
//! A buffer export must be released with the GIL held, and a ferrylink thread may drop
//! the last frame of a message (a send that completed into a dropped request): every
//! dropped region is queued and released by [`release_deferred`], which the module calls
//! on its Python-facing paths (right after each request it finished, so a `bytearray`
//! that was sent can be resized once `send` returns). A region is never released while
//! anything can read it.

use ferrylink::memory::HostRegion;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// CPython's `Py_buffer` (identical from 3.0 to today; part of the limited API since 3.11).
#[repr(C)]
struct RawBuffer {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: isize,
    itemsize: isize,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut isize,
    strides: *mut isize,
    suboffsets: *mut isize,
    internal: *mut c_void,
}

// The buffer protocol's two calls, exported by every CPython 3 interpreter.
unsafe extern "C" {
    fn PyObject_GetBuffer(obj: *mut ffi::PyObject, view: *mut RawBuffer, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut RawBuffer);
}

// SAFETY: an export pins the exporter's memory until it is released, whichever thread holds
// the record; its pointers are only read (`base_ptr`), and the release, which touches the
// Python object, runs on a thread holding the GIL (`Drop`, `release_deferred`).
unsafe impl Send for RawBuffer {}

/// `PyBUF_SIMPLE`: one contiguous run of bytes (an exporter that cannot give one fails).
const PYBUF_SIMPLE: c_int = 0;
/// `PyBUF_WRITABLE`.
const PYBUF_WRITABLE: c_int = 0x0001;

/// Region ids of our own, far from those `ferrylink-ipc` and the pinned pool count from 1
/// (only regions with a shareable fd are looked up by id, and these have none).
static NEXT_REGION_ID: AtomicU64 = AtomicU64::new(1 << 62);

/// A fresh region id of this module's range.
pub(crate) fn next_region_id() -> u64 {
    NEXT_REGION_ID.fetch_add(1, Ordering::Relaxed)
}

/// A buffer export of a Python object, released on drop (or later, see the module docs).
pub(crate) struct PyBufferRegion {
    view: Box<RawBuffer>,
    id: u64,
}

// SAFETY: as above; `&self` gives out only the address and length.
unsafe impl Sync for PyBufferRegion {}

impl PyBufferRegion {
    /// Exports `obj`'s buffer: contiguous bytes, writable when `writable` (a receive
    /// target). An object without the buffer protocol, a non-contiguous one or a
    /// read-only one asked to be writable fails with the exporter's `BufferError` (or
    /// `TypeError`).
    pub(crate) fn export(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Self> {
        let flags = if writable { PYBUF_SIMPLE | PYBUF_WRITABLE } else { PYBUF_SIMPLE };
        let mut view = Box::new(empty_view());
        // SAFETY: `obj` is a live object (we hold the GIL through `Bound`), `view` points
        // at a writable `Py_buffer`-sized struct of the interpreter's layout.
        let status = unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) };
        if status != 0 {
            return Err(PyErr::take(obj.py())
                .unwrap_or_else(|| PyBufferError::new_err("the object refused to export its buffer")));
        }
        if writable && view.readonly != 0 {
            // SAFETY: the export above succeeded and is released once, here, with the GIL.
            unsafe { PyBuffer_Release(&mut *view) };
            return Err(PyBufferError::new_err("the buffer is read-only"));
        }
        Ok(Self { view, id: next_region_id() })
    }

    /// The exported bytes' length.
    pub(crate) fn len(&self) -> usize {
        self.view.len.max(0) as usize
    }
}

impl HostRegion for PyBufferRegion {
    fn base_ptr(&self) -> *mut u8 {
        self.view.buf.cast()
    }
    fn len(&self) -> usize {
        PyBufferRegion::len(self)
    }
    fn region_id(&self) -> u64 {
        self.id
    }
}

/// Exports dropped where the GIL may not be held, waiting for [`release_deferred`]. Boxed:
/// a `Py_buffer` keeps one address from its export to its release, as exporters may
/// expect.
#[allow(clippy::vec_box)]
static DEFERRED: Mutex<Vec<Box<RawBuffer>>> = Mutex::new(Vec::new());
/// Whether [`DEFERRED`] may hold something (spares the lock on the common path).
static ANY_DEFERRED: AtomicBool = AtomicBool::new(false);

impl Drop for PyBufferRegion {
    /// Queues the export for [`release_deferred`]: this may run on a ferrylink thread, or
    /// while the interpreter shuts down, where touching Python is not allowed.
    fn drop(&mut self) {
        let view = std::mem::replace(&mut self.view, Box::new(empty_view()));
        DEFERRED.lock().unwrap_or_else(|e| e.into_inner()).push(view);
        ANY_DEFERRED.store(true, Ordering::Release);
    }
}

/// A `Py_buffer` that holds no export (filled by `PyObject_GetBuffer`, or left behind by
/// a drop that queued the real one).
fn empty_view() -> RawBuffer {
    RawBuffer {
        buf: std::ptr::null_mut(),
        obj: std::ptr::null_mut(),
        len: 0,
        itemsize: 0,
        readonly: 1,
        ndim: 0,
        format: std::ptr::null_mut(),
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        suboffsets: std::ptr::null_mut(),
        internal: std::ptr::null_mut(),
    }
}

/// Releases one export. Only called with the GIL held.
fn release(view: &mut RawBuffer) {
    if view.obj.is_null() {
        return;
    }
    // SAFETY: `view` holds a successful export not yet released (each export is moved
    // here once), and the caller holds the GIL.
    unsafe { PyBuffer_Release(view) };
}

/// Releases the exports that ferrylink threads let go of; called with the GIL held on
/// the module's Python-facing paths.
pub(crate) fn release_deferred(_py: Python<'_>) {
    if !ANY_DEFERRED.swap(false, Ordering::AcqRel) {
        return;
    }
    let views = std::mem::take(&mut *DEFERRED.lock().unwrap_or_else(|e| e.into_inner()));
    for mut view in views {
        release(&mut view);
    }
}
