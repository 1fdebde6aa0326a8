//! One-sided transfers for Python: [`PyRegistration`] (this side's memory, granted to
//! peers by its key), [`PyRemoteRegion`] (a peer's region, imported on one endpoint),
//! [`PyPreparedTransfer`] (a transfer checked once, posted again and again) and the
//! import of a key. The transfers and notification waits are `_Endpoint` methods
//! ([`crate::endpoint`]); all are requests waited for and polled like sends and
//! receives ([`crate::ops`]).
//!
//! The memory is taken as `send` takes frames ([`crate::frames_in`]), without a copy, and
//! the Rust library decides what may be registered: device memory the native lane
//! exports (ferrylink's pool, PyTorch's caching allocator, VMM) and host memory in a
//! shared buffer (`ferrylink.host_buffer`); anything else is refused with the reason.

use crate::errors;
use crate::frames_in::{frame_from_python, Use};
use crate::ops::{Pending, PyOp};
use ferrylink::transport::onesided::KEY_LEN;
use ferrylink::transport::{Access, Context, Endpoint, PreparedTransfer, Registration, RemoteKey, RemoteRegion};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::Mutex;

/// Access as the Python API spells it: `"r"`/`"read"`, `"w"`/`"write"`, `"rw"`/`"read_write"`.
fn parse_access(py: Python<'_>, access: &str) -> PyResult<Access> {
    match access {
        "r" | "read" => Ok(Access::Read),
        "w" | "write" => Ok(Access::Write),
        "rw" | "read_write" => Ok(Access::ReadWrite),
        other => Err(errors::error(
            py,
            "ConfigError",
            format!("access is \"r\", \"w\" or \"rw\" (or read, write, read_write), not {other:?}"),
        )),
    }
}

fn access_name(access: Access) -> &'static str {
    match access {
        Access::Read => "r",
        Access::Write => "w",
        Access::ReadWrite => "rw",
    }
}

/// Registers `frame` (one frame object, as `send` takes them) with `access`.
pub(crate) fn register(
    py: Python<'_>,
    context: &Context,
    frame: &Bound<'_, PyAny>,
    access: &str,
) -> PyResult<PyRegistration> {
    let access = parse_access(py, access)?;
    // Memory a peer may write must be writable here too.
    let usage = if access.allows_write() { Use::ReceiveInto } else { Use::Send };
    let converted = frame_from_python(frame, usage)?;
    let is_host = matches!(converted, ferrylink::Frame::Host(_));
    let registration = py.detach(|| context.register(converted, access)).map_err(|e| {
        // The library names its Rust function; a Python user's is host_buffer.
        let hint = if is_host { " (from Python: ferrylink.host_buffer(nbytes))" } else { "" };
        errors::error(py, errors::transport_class(&e), format!("cannot register: {e}{hint}"))
    })?;
    Ok(PyRegistration { registration: Mutex::new(Some(registration)), frame: frame.clone().unbind() })
}

/// This side's memory, registered for one-sided transfers (the package's `Registration`
/// wraps it). Revoked by `revoke()` or when dropped.
#[pyclass(name = "_Registration", module = "ferrylink", frozen)]
pub(crate) struct PyRegistration {
    registration: Mutex<Option<Registration>>,
    /// The object registered, kept as the user gave it.
    frame: Py<PyAny>,
}

impl PyRegistration {
    /// `f` of the registration, or `RevokedError` once it was revoked.
    pub(crate) fn with<T>(&self, py: Python<'_>, f: impl FnOnce(&Registration) -> T) -> PyResult<T> {
        let held = self.registration.lock().unwrap_or_else(|e| e.into_inner());
        held.as_ref().map(f).ok_or_else(|| errors::error(py, "RevokedError", "the registration was revoked"))
    }
}

#[pymethods]
impl PyRegistration {
    /// The key a peer presents to import the registration: bytes to ship any way.
    #[getter]
    fn key<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let key = self.with(py, |r| r.key().to_bytes())?;
        Ok(PyBytes::new(py, &key))
    }

    /// Bytes registered.
    #[getter]
    fn nbytes(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, Registration::len)
    }

    /// `"r"`, `"w"` or `"rw"`.
    #[getter]
    fn access(&self, py: Python<'_>) -> PyResult<&'static str> {
        self.with(py, |r| access_name(r.access()))
    }

    /// The object registered.
    #[getter]
    fn frame(&self, py: Python<'_>) -> Py<PyAny> {
        self.frame.clone_ref(py)
    }

    /// Whether `revoke()` was called.
    #[getter]
    fn revoked(&self) -> bool {
        self.registration.lock().unwrap_or_else(|e| e.into_inner()).is_none()
    }

    /// Revokes the registration: peers are told, transfers not started fail; the memory
    /// is let go once every peer that imported it confirmed. Idempotent.
    fn revoke(&self, py: Python<'_>) {
        let registration = self.registration.lock().unwrap_or_else(|e| e.into_inner()).take();
        py.detach(move || drop(registration));
    }
}

/// A peer's registration imported on one endpoint (the package's `RemoteRegion` wraps it).
#[pyclass(name = "_RemoteRegion", module = "ferrylink", frozen)]
pub(crate) struct PyRemoteRegion {
    pub(crate) region: RemoteRegion,
}

#[pymethods]
impl PyRemoteRegion {
    /// Bytes in the region.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.region.len()
    }

    /// What the owner allows: `"r"`, `"w"` or `"rw"`.
    #[getter]
    fn access(&self) -> &'static str {
        access_name(self.region.access())
    }

    /// Whether the region is device memory.
    #[getter]
    fn is_device(&self) -> bool {
        self.region.is_device()
    }
}

/// A put or get checked once, kept for posting on the endpoint that prepared it (the
/// package's `PreparedTransfer` wraps it). Dropping it lets both sides forget it.
#[pyclass(name = "_PreparedTransfer", module = "ferrylink", frozen)]
pub(crate) struct PyPreparedTransfer {
    pub(crate) prepared: PreparedTransfer,
}

#[pymethods]
impl PyPreparedTransfer {
    /// Whether it is a put (else a get).
    #[getter]
    fn is_put(&self) -> bool {
        self.prepared.is_put()
    }

    /// How many spans it moves.
    #[getter]
    fn span_count(&self) -> usize {
        self.prepared.span_count()
    }

    /// Bytes it moves in all.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.prepared.bytes()
    }
}

/// An import of `key` (bytes a peer's `Registration.key` gave) in flight.
pub(crate) fn import_op(py: Python<'_>, endpoint: &Endpoint, key: &[u8]) -> PyResult<PyOp> {
    let key = RemoteKey::from_bytes(key).map_err(|e| {
        errors::error(
            py,
            "InvalidMessageError",
            format!("not a remote key ({KEY_LEN} bytes from Registration.key): {e}"),
        )
    })?;
    Ok(PyOp::new(Pending::Import(endpoint.import(&key))))
}
