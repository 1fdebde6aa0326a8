//! [`PyContext`] (a ferrylink context: its progress thread and settings) and
//! [`PyListener`].

use crate::config;
use crate::endpoint::PyEndpoint;
use crate::errors;
use crate::onesided::{self, PyRegistration};
use crate::ops::{wait_for, AcceptOp, Pending, PyOp};
use ferrylink::transport::{Context, Listener};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A ferrylink context (the Python package's `Context` wraps it).
#[pyclass(name = "_Context", module = "ferrylink", frozen)]
pub(crate) struct PyContext {
    context: Mutex<Option<Context>>,
}

impl PyContext {
    fn get(&self, py: Python<'_>) -> PyResult<Context> {
        let context = self.context.lock().unwrap_or_else(|e| e.into_inner()).clone();
        context.ok_or_else(|| errors::error(py, "ContextClosedError", "the context was closed"))
    }
}

#[pymethods]
impl PyContext {
    /// A context configured by `FERRYLINK_*` variables and the keywords on top of them.
    #[new]
    #[pyo3(signature = (**settings))]
    fn new(py: Python<'_>, settings: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let config = config::config_from(py, settings)?;
        let context = py.detach(|| Context::new(config)).map_err(|e| errors::context_error(py, &e))?;
        Ok(Self { context: Mutex::new(Some(context)) })
    }

    /// The settings in force, `{keyword: value}`.
    #[getter]
    fn settings<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let context = self.get(py)?;
        config::settings_of(py, context.config())
    }

    /// A listener at `path`, or at a fresh socket in this user's private directory.
    #[pyo3(signature = (path=None))]
    fn listen(&self, py: Python<'_>, path: Option<PathBuf>) -> PyResult<PyListener> {
        let context = self.get(py)?;
        let listener = py
            .detach(|| match path {
                Some(path) => Listener::bind(&context, path),
                None => Listener::bind_private(&context),
            })
            .map_err(|e| errors::listen_error(py, &e))?;
        let timeout = context.config().request_timeout;
        Ok(PyListener { listener: Mutex::new(Some(Arc::new(listener))), timeout })
    }

    /// A listener on a TCP address, for peers on other machines (the UCX lane; only
    /// control messages travel on the TCP connection). Port 0 picks a free port.
    fn listen_tcp(&self, py: Python<'_>, host: String, port: u16) -> PyResult<PyListener> {
        let context = self.get(py)?;
        let listener = py
            .detach(|| Listener::bind_tcp(&context, (host.as_str(), port)))
            .map_err(|e| errors::listen_error(py, &e))?;
        let timeout = context.config().request_timeout;
        Ok(PyListener { listener: Mutex::new(Some(Arc::new(listener))), timeout })
    }

    /// Connects to a TCP listener (blocking, bounded by the connect timeout; the GIL is
    /// released meanwhile).
    fn connect_tcp(&self, py: Python<'_>, host: String, port: u16) -> PyResult<PyEndpoint> {
        let context = self.get(py)?;
        let endpoint = py.detach(|| context.connect_tcp((host.as_str(), port)));
        endpoint.map(PyEndpoint::new).map_err(|e| errors::connect_error(py, &e))
    }

    /// Connects to the listener at `path` (blocking; Ctrl-C interrupts it).
    fn connect(&self, py: Python<'_>, path: PathBuf) -> PyResult<Py<PyAny>> {
        let context = self.get(py)?;
        wait_for(py, Pending::Connect(context.connect_async(path)))
    }

    /// A connect in flight.
    fn connect_op(&self, py: Python<'_>, path: PathBuf) -> PyResult<PyOp> {
        let context = self.get(py)?;
        Ok(PyOp::new(Pending::Connect(context.connect_async(path))))
    }

    /// Registers `frame` (device memory or a shared host buffer, as `send` takes it) for
    /// one-sided transfers with `access` (`"r"`, `"w"`, `"rw"`).
    fn register(&self, py: Python<'_>, frame: &Bound<'_, PyAny>, access: &str) -> PyResult<PyRegistration> {
        let context = self.get(py)?;
        onesided::register(py, &context, frame, access)
    }

    /// What the context holds now (endpoints, listeners, mappings...), as its progress
    /// thread counts it.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let context = self.get(py)?;
        let s = py.detach(|| context.stats()).map_err(|e| errors::stats_error(py, &e))?;
        let stats = PyDict::new(py);
        stats.set_item("endpoints", s.endpoints)?;
        stats.set_item("listeners", s.listeners)?;
        stats.set_item("imported_regions", s.imported_regions)?;
        stats.set_item("imported_bytes", s.imported_bytes)?;
        stats.set_item("imported_device_regions", s.imported_device_regions)?;
        stats.set_item("staging_mapped_bytes", s.staging_mapped_bytes)?;
        stats.set_item("staging_used_bytes", s.staging_used_bytes)?;
        stats.set_item("landing_mapped_bytes", s.landing_mapped_bytes)?;
        stats.set_item("sends_in_flight", s.sends_in_flight)?;
        stats.set_item("recvs_posted", s.recvs_posted)?;
        stats.set_item("unclaimed_bytes", s.unclaimed_bytes)?;
        stats.set_item("ipc_mappings", s.ipc_mappings)?;
        stats.set_item("ipc_mapped_bytes", s.ipc_mapped_bytes)?;
        stats.set_item("lingering_copies", s.lingering_copies)?;
        stats.set_item("lingering_kernel_launches", s.lingering_kernel_launches)?;
        stats.set_item("signalled_pushes", s.signalled_pushes)?;
        Ok(stats)
    }

    /// Lets go of the context. Its progress thread stops once its endpoints and
    /// listeners are gone too. Idempotent.
    fn close(&self, py: Python<'_>) {
        let context = self.context.lock().unwrap_or_else(|e| e.into_inner()).take();
        py.detach(move || drop(context));
    }
}

/// A listener (the Python package's `Listener` wraps it).
#[pyclass(name = "_Listener", module = "ferrylink", frozen)]
pub(crate) struct PyListener {
    listener: Mutex<Option<Arc<Listener>>>,
    timeout: Duration,
}

impl PyListener {
    fn get(&self, py: Python<'_>) -> PyResult<Arc<Listener>> {
        let listener = self.listener.lock().unwrap_or_else(|e| e.into_inner()).clone();
        listener.ok_or_else(|| errors::error(py, "ContextClosedError", "the listener was closed"))
    }
}

#[pymethods]
impl PyListener {
    /// The socket path peers connect to (`None` for a TCP listener).
    #[getter]
    fn path(&self, py: Python<'_>) -> PyResult<Option<PathBuf>> {
        let listener = self.get(py)?;
        Ok(listener.tcp_addr().is_none().then(|| listener.path().to_path_buf()))
    }

    /// `(host, port)` of a TCP listener, else `None`.
    #[getter]
    fn tcp_address(&self, py: Python<'_>) -> PyResult<Option<(String, u16)>> {
        Ok(self.get(py)?.tcp_addr().map(|a| (a.ip().to_string(), a.port())))
    }

    /// Waits for the next peer, at most `FERRYLINK_TIMEOUT_MS` (GIL released, Ctrl-C
    /// honoured).
    fn accept(&self, py: Python<'_>) -> PyResult<PyEndpoint> {
        let listener = self.get(py)?;
        let deadline = Instant::now() + self.timeout;
        loop {
            let slice = deadline.saturating_duration_since(Instant::now()).min(Duration::from_millis(50));
            match py.detach(|| listener.accept_timeout(slice)) {
                Ok(endpoint) => return Ok(PyEndpoint::new(endpoint)),
                Err(ferrylink::transport::AcceptError::TimedOut(_)) if Instant::now() < deadline => {}
                Err(ferrylink::transport::AcceptError::TimedOut(_)) => {
                    let e = ferrylink::transport::AcceptError::TimedOut(self.timeout);
                    return Err(errors::accept_error(py, &e));
                }
                Err(e) => return Err(errors::accept_error(py, &e)),
            }
            py.check_signals()?;
        }
    }

    /// An accept in flight.
    fn accept_op(&self, py: Python<'_>) -> PyResult<PyOp> {
        let listener = self.get(py)?;
        let future: AcceptOp = Box::pin(async move { listener.accept_async().await });
        Ok(PyOp::new(Pending::Accept(future)))
    }

    /// Stops listening and removes the socket file (once no accept is in flight).
    /// Idempotent.
    fn close(&self, py: Python<'_>) {
        let listener = self.listener.lock().unwrap_or_else(|e| e.into_inner()).take();
        py.detach(move || drop(listener));
    }
}
