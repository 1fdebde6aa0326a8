//! [`PyEndpoint`]: one connection, its sends and receives.

use crate::errors;
use crate::frames_in::{frames_from_python, Use};
use crate::onesided::{self, PyPreparedTransfer, PyRegistration, PyRemoteRegion};
use crate::ops::{wait_for, Pending, PyOp};
use crate::pybuffer::{release_deferred, PyBufferRegion};
use ferrylink::memory::HostRegion;
use ferrylink::transport::{Endpoint, Span};
use ferrylink::Message;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::sync::{Arc, Mutex};

/// A connection to one peer (the Python package's `Endpoint` wraps it).
#[pyclass(name = "_Endpoint", module = "ferrylink", frozen)]
pub(crate) struct PyEndpoint {
    endpoint: Mutex<Option<Arc<Endpoint>>>,
}

impl PyEndpoint {
    pub(crate) fn new(endpoint: Endpoint) -> Self {
        Self { endpoint: Mutex::new(Some(Arc::new(endpoint))) }
    }

    fn get(&self, py: Python<'_>) -> PyResult<Arc<Endpoint>> {
        let endpoint = self.endpoint.lock().unwrap_or_else(|e| e.into_inner()).clone();
        endpoint.ok_or_else(|| errors::error(py, "EndpointClosedError", "the endpoint was closed"))
    }

    fn send_pending(&self, py: Python<'_>, header: &Bound<'_, PyAny>, frames: &Bound<'_, PyAny>) -> PyResult<Pending> {
        release_deferred(py);
        let endpoint = self.get(py)?;
        let header = header_bytes(header)?;
        let frames = frames_from_python(frames, Use::Send)?;
        let message = Message::new(header, frames);
        // `send` records producer events, or synchronises the context under
        // FERRYLINK_PRODUCER_ORDERING=context: not with the GIL held.
        Ok(Pending::Send(py.detach(|| endpoint.send(message))))
    }

    fn recv_pending(&self, py: Python<'_>, frames: Option<&Bound<'_, PyAny>>) -> PyResult<Pending> {
        release_deferred(py);
        let endpoint = self.get(py)?;
        match frames {
            None => Ok(Pending::Recv { request: endpoint.recv(), targets: None }),
            Some(frames) => {
                let buffers = frames_from_python(frames, Use::ReceiveInto)?;
                let targets: Vec<Py<PyAny>> =
                    frames.try_iter()?.map(|f| f.map(Bound::unbind)).collect::<PyResult<_>>()?;
                // Posting exports device targets ahead on this thread (the pool: 13-20 µs
                // at 1 MB): not with the GIL held.
                let request = py.detach(|| endpoint.recv_into(buffers));
                Ok(Pending::Recv { request, targets: Some(targets) })
            }
        }
    }
}

/// A header as bytes: `bytes` as they are, any other buffer copied.
fn header_bytes(header: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(bytes) = header.cast::<PyBytes>() {
        return Ok(bytes.as_bytes().to_vec());
    }
    let region = PyBufferRegion::export(header, false).map_err(|_| {
        pyo3::exceptions::PyTypeError::new_err(format!(
            "the header must be bytes-like, not {}",
            header.get_type().name().map(|n| n.to_string()).unwrap_or_default()
        ))
    })?;
    let len = region.len();
    if len == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: the export is live for `region`'s lifetime and holds `len` readable bytes.
    Ok(unsafe { std::slice::from_raw_parts(region.base_ptr(), len) }.to_vec())
}

#[pymethods]
impl PyEndpoint {
    /// Sends `header` and `frames` and waits until the peer has them.
    fn send(&self, py: Python<'_>, header: &Bound<'_, PyAny>, frames: &Bound<'_, PyAny>) -> PyResult<()> {
        let pending = self.send_pending(py, header, frames)?;
        wait_for(py, pending).map(drop)
    }

    /// Receives the next message: `(header, frames)`.
    fn recv(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let pending = self.recv_pending(py, None)?;
        wait_for(py, pending)
    }

    /// Receives the next message into `frames`: `(header, frames)`.
    fn recv_into(&self, py: Python<'_>, frames: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let pending = self.recv_pending(py, Some(frames))?;
        wait_for(py, pending)
    }

    /// A send in flight.
    fn send_op(&self, py: Python<'_>, header: &Bound<'_, PyAny>, frames: &Bound<'_, PyAny>) -> PyResult<PyOp> {
        Ok(PyOp::new(self.send_pending(py, header, frames)?))
    }

    /// A receive in flight (into `frames` when given).
    #[pyo3(signature = (frames=None))]
    fn recv_op(&self, py: Python<'_>, frames: Option<&Bound<'_, PyAny>>) -> PyResult<PyOp> {
        Ok(PyOp::new(self.recv_pending(py, frames)?))
    }

    /// An import of a peer's registration by its key (bytes), in flight.
    fn import_op(&self, py: Python<'_>, key: &[u8]) -> PyResult<PyOp> {
        release_deferred(py);
        onesided::import_op(py, &*self.get(py)?, key)
    }

    /// A put (`put=True`) or get of `spans`, `(local_offset, remote_offset, nbytes)`
    /// each, between `local` and `remote`, in flight; `notify` goes to the owner after.
    #[pyo3(signature = (put, local, remote, spans, notify=None))]
    fn transfer_op(
        &self,
        py: Python<'_>,
        put: bool,
        local: &PyRegistration,
        remote: &PyRemoteRegion,
        spans: Vec<(u64, u64, u64)>,
        notify: Option<Vec<u8>>,
    ) -> PyResult<PyOp> {
        release_deferred(py);
        let endpoint = self.get(py)?;
        let spans = spans_of(spans);
        let request = local.with(py, |registration| {
            if put {
                endpoint.put_batch(registration, &remote.region, &spans, notify)
            } else {
                endpoint.get_batch(registration, &remote.region, &spans, notify)
            }
        })?;
        Ok(PyOp::new(Pending::Transfer(request)))
    }

    /// A put (`put=True`) or get of `spans` checked once and kept, to be posted any
    /// number of times ([`PyEndpoint::post_op`]); refused here, with the transfer's
    /// errors, when a span or the access does not fit.
    fn prepare(
        &self,
        py: Python<'_>,
        put: bool,
        local: &PyRegistration,
        remote: &PyRemoteRegion,
        spans: Vec<(u64, u64, u64)>,
    ) -> PyResult<PyPreparedTransfer> {
        release_deferred(py);
        let endpoint = self.get(py)?;
        let spans = spans_of(spans);
        let prepared = local
            .with(py, |registration| {
                if put {
                    endpoint.prepare_put_batch(registration, &remote.region, &spans)
                } else {
                    endpoint.prepare_get_batch(registration, &remote.region, &spans)
                }
            })?
            .map_err(|e| errors::transport_error(py, &e))?;
        Ok(PyPreparedTransfer { prepared })
    }

    /// A run of `prepared` in flight; `notify` goes to the owner after.
    #[pyo3(signature = (prepared, notify=None))]
    fn post_op(&self, py: Python<'_>, prepared: &PyPreparedTransfer, notify: Option<Vec<u8>>) -> PyResult<PyOp> {
        release_deferred(py);
        Ok(PyOp::new(Pending::Transfer(self.get(py)?.post(&prepared.prepared, notify))))
    }

    /// A wait for the next notification a peer's put or get delivered, in flight.
    fn notification_op(&self, py: Python<'_>) -> PyResult<PyOp> {
        release_deferred(py);
        Ok(PyOp::new(Pending::Notification(self.get(py)?.recv_notification())))
    }

    /// `"native"` or `"ucx"`.
    #[getter]
    fn lane(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.get(py)?.lane().to_string())
    }

    /// Whether control messages travel through shared-memory rings.
    #[getter]
    fn uses_control_ring(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.get(py)?.uses_control_ring())
    }

    /// Who the peer is.
    #[getter]
    fn peer(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.get(py)?.peer().to_string())
    }

    /// The endpoint's counters.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.get(py)?.stats();
        let stats = PyDict::new(py);
        stats.set_item("socket_bytes_written", s.socket_bytes_written)?;
        stats.set_item("socket_bytes_read", s.socket_bytes_read)?;
        stats.set_item("messages_sent", s.messages_sent)?;
        stats.set_item("messages_received", s.messages_received)?;
        stats.set_item("payload_bytes_sent", s.payload_bytes_sent)?;
        stats.set_item("payload_bytes_received", s.payload_bytes_received)?;
        stats.set_item("staged_bytes", s.staged_bytes)?;
        stats.set_item("bounced_bytes", s.bounced_bytes)?;
        stats.set_item("fds_sent", s.fds_sent)?;
        stats.set_item("offered_sends", s.offered_sends)?;
        stats.set_item("offered_sends_gated", s.offered_sends_gated)?;
        stats.set_item("wakes_sent", s.wakes_sent)?;
        stats.set_item("offered_receives", s.offered_receives)?;
        stats.set_item("notifications_sent_ahead", s.notifications_sent_ahead)?;
        Ok(stats)
    }

    /// Closes the endpoint: requests still pending end with `EndpointClosedError`.
    /// Idempotent.
    fn close(&self, py: Python<'_>) {
        let endpoint = self.endpoint.lock().unwrap_or_else(|e| e.into_inner()).take();
        py.detach(move || drop(endpoint));
        release_deferred(py);
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.endpoint.lock().unwrap_or_else(|e| e.into_inner()).is_none()
    }
}

/// `(local_offset, remote_offset, nbytes)` triples as the library's spans.
fn spans_of(spans: Vec<(u64, u64, u64)>) -> Vec<Span> {
    spans.into_iter().map(|(local_offset, remote_offset, len)| Span { local_offset, remote_offset, len }).collect()
}
