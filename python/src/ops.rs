//! [`PyOp`]: one request in flight (a send, a receive, an accept or a connect), waited
//! for in blocking code or polled by the asyncio layer.
//!
//! Waiting releases the GIL and wakes every [`SLICE`] to run Python's signal handlers,
//! so Ctrl-C interrupts a blocked receive: the `KeyboardInterrupt` drops the request,
//! which withdraws it without losing a message (a message that arrives later goes to
//! the next receive). The bound is the library's: after the first slice a send or
//! receive hands the progress thread its deadline (`FERRYLINK_TIMEOUT_MS` from then),
//! accepts and connects carry their own.

use crate::endpoint::PyEndpoint;
use crate::errors;
use crate::frames_out::frame_to_python;
use crate::onesided::PyRemoteRegion;
use crate::pybuffer::release_deferred;
use crate::wakeup::PyWakeup;
use ferrylink::transport::{
    AcceptError, ConnectFuture, Endpoint, ImportRequest, Notification, NotificationRequest, RecvRequest, RemoteRegion,
    SendRequest, TransferRequest, TransportError,
};
use ferrylink::{Frame, Message};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyByteArray, PyBytes, PyList, PyMemoryView};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll, Wake, Waker};
use std::time::Duration;

/// How long a blocking wait sleeps between checks for signals.
const SLICE: Duration = Duration::from_millis(50);

/// An accept as a `'static` future (it owns its listener).
pub(crate) type AcceptOp = Pin<Box<dyn Future<Output = Result<Endpoint, AcceptError>> + Send>>;

/// What an op waits for.
pub(crate) enum Pending {
    Send(SendRequest),
    /// A receive; `targets` are a `recv_into`'s frame objects, handed back on success.
    Recv {
        request: RecvRequest,
        targets: Option<Vec<Py<PyAny>>>,
    },
    Accept(AcceptOp),
    Connect(ConnectFuture),
    /// An import of a peer's registration.
    Import(ImportRequest),
    /// A put or a get.
    Transfer(TransferRequest),
    /// A wait for the next notification.
    Notification(NotificationRequest),
}

/// A request in flight (the asyncio layer's handle; blocking calls wait for theirs
/// inside Rust).
#[pyclass(name = "Op", module = "ferrylink", frozen)]
pub(crate) struct PyOp {
    pending: Mutex<Option<Pending>>,
}

impl PyOp {
    pub(crate) fn new(pending: Pending) -> Self {
        Self { pending: Mutex::new(Some(pending)) }
    }
}

#[pymethods]
impl PyOp {
    /// Waits for the request (GIL released, Ctrl-C honoured) and returns its result:
    /// `None` for a send, `(header, frames)` for a receive, an `Endpoint` for an accept
    /// or a connect. Raises the request's error.
    fn wait(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let pending = self.take(py)?;
        wait_for(py, pending)
    }

    /// Polls once: `(True, result)` when done (raising its error instead, if it failed),
    /// `(False, None)` when not, after which `wakeup` reports `token` when it may be.
    fn poll(&self, py: Python<'_>, wakeup: &PyWakeup, token: u64) -> PyResult<(bool, Py<PyAny>)> {
        let waker = wakeup.waker(token);
        let mut slot = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let Some(pending) = slot.as_mut() else {
            return Err(errors::error(py, "FerrylinkError", "the request was already waited for or cancelled"));
        };
        let mut cx = TaskContext::from_waker(&waker);
        let ready = poll_pending(pending, &mut cx);
        match ready {
            Poll::Pending => Ok((false, py.None())),
            Poll::Ready(outcome) => {
                *slot = None;
                drop(slot);
                Ok((true, outcome.into_python(py)?))
            }
        }
    }

    /// Drops the request: a receive is withdrawn (a message already landed for it goes
    /// to the next receive), a send not yet started is not sent. Idempotent.
    fn cancel(&self, py: Python<'_>) {
        let pending = self.pending.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(pending);
        release_deferred(py);
    }

    /// Whether the op has been waited for, completed through `poll`, or cancelled.
    #[getter]
    fn finished(&self) -> bool {
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).is_none()
    }

    /// Whether a send's or receive's result is there, so `wait()` returns at once (an
    /// accept or a connect says `False` until it is polled to its end).
    #[getter]
    fn ready(&self) -> bool {
        match self.pending.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            Some(Pending::Send(request)) => request.is_complete(),
            Some(Pending::Recv { request, .. }) => request.is_complete(),
            Some(Pending::Transfer(request)) => request.is_complete(),
            Some(Pending::Import(request)) => request.is_complete(),
            Some(Pending::Notification(request)) => request.is_complete(),
            Some(Pending::Accept(_) | Pending::Connect(_)) | None => false,
        }
    }
}

impl PyOp {
    fn take(&self, py: Python<'_>) -> PyResult<Pending> {
        let taken = self.pending.lock().unwrap_or_else(|e| e.into_inner()).take();
        taken.ok_or_else(|| errors::error(py, "FerrylinkError", "the request was already waited for or cancelled"))
    }
}

/// A finished request, before it becomes a Python value.
pub(crate) enum Outcome {
    Sent(Result<Message, ferrylink::transport::SendError>),
    Received(Result<Message, ferrylink::transport::RecvError>, Option<Vec<Py<PyAny>>>),
    Accepted(Result<Endpoint, AcceptError>),
    Connected(Result<Endpoint, ferrylink::transport::ConnectError>),
    Imported(Result<RemoteRegion, TransportError>),
    Transferred(Result<(), TransportError>),
    Notified(Result<Notification, TransportError>),
}

impl Outcome {
    pub(crate) fn into_python(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let value = match self {
            Outcome::Sent(Ok(message)) => {
                drop(message);
                Ok(py.None())
            }
            Outcome::Sent(Err(e)) => Err(errors::send_error(py, &e)),
            Outcome::Received(Ok(message), targets) => received(py, message, targets),
            Outcome::Received(Err(e), _) => Err(errors::recv_error(py, &e)),
            Outcome::Accepted(Ok(ep)) | Outcome::Connected(Ok(ep)) => Ok(Py::new(py, PyEndpoint::new(ep))?.into_any()),
            Outcome::Accepted(Err(e)) => Err(errors::accept_error(py, &e)),
            Outcome::Connected(Err(e)) => Err(errors::connect_error(py, &e)),
            Outcome::Imported(Ok(region)) => Ok(Py::new(py, PyRemoteRegion { region })?.into_any()),
            Outcome::Transferred(Ok(())) => Ok(py.None()),
            Outcome::Notified(Ok(notification)) => Ok(PyBytes::new(py, &notification.data).into_any().unbind()),
            Outcome::Imported(Err(e)) | Outcome::Transferred(Err(e)) | Outcome::Notified(Err(e)) => {
                Err(errors::transport_error(py, &e))
            }
        };
        release_deferred(py);
        value
    }
}

/// Host frames up to this many bytes are handed to Python as a `memoryview` of a
/// `bytearray` copy: copying a few kilobytes costs less than the view over the frame's
/// own memory that `_core._host_view` makes (1.5–2.9 µs against 7 µs on the 2-core
/// development VM), and a small message's frames are copied into the control message
/// when sent on anyway.
const COPIED_HOST_FRAME_MAX: usize = 4096;

/// A received message as the package's `Message(header, frames)`: the `recv_into`
/// targets themselves, or the frames that landed (host frames as writable
/// `memoryview`s: small ones over a copy, the others through `_core._host_view`). Built
/// here rather than in Python: it is on every receive's path.
fn received(py: Python<'_>, message: Message, targets: Option<Vec<Py<PyAny>>>) -> PyResult<Py<PyAny>> {
    let core = core_module(py)?;
    let header = PyBytes::new(py, &message.header);
    let frames = match targets {
        Some(targets) => {
            drop(message);
            PyList::new(py, targets)?
        }
        None => {
            let frames: PyResult<Vec<Py<PyAny>>> = message
                .frames
                .into_iter()
                .map(|frame| match frame {
                    Frame::Host(buffer) if buffer.len() <= COPIED_HOST_FRAME_MAX => {
                        let copy = PyByteArray::new(py, buffer.as_slice());
                        Ok(PyMemoryView::from(&copy)?.into_any().unbind())
                    }
                    Frame::Host(_) => Ok(core.host_view.bind(py).call1((frame_to_python(py, frame)?,))?.unbind()),
                    Frame::Device(_) => frame_to_python(py, frame),
                })
                .collect();
            PyList::new(py, frames?)?
        }
    };
    Ok(core.message.bind(py).call1((header, frames))?.unbind())
}

/// What `received` needs of `ferrylink._core` (the `Message` class, `_host_view`),
/// looked up once.
struct CoreModule {
    message: Py<PyAny>,
    host_view: Py<PyAny>,
}

fn core_module(py: Python<'_>) -> PyResult<&'static CoreModule> {
    static CORE: PyOnceLock<CoreModule> = PyOnceLock::new();
    CORE.get_or_try_init(py, || {
        let core = py.import("ferrylink._core")?;
        Ok(CoreModule { message: core.getattr("Message")?.unbind(), host_view: core.getattr("_host_view")?.unbind() })
    })
}

fn poll_pending(pending: &mut Pending, cx: &mut TaskContext<'_>) -> Poll<Outcome> {
    match pending {
        Pending::Send(request) => Pin::new(request).poll(cx).map(Outcome::Sent),
        Pending::Recv { request, targets } => Pin::new(request).poll(cx).map(|r| Outcome::Received(r, targets.take())),
        Pending::Accept(future) => future.as_mut().poll(cx).map(Outcome::Accepted),
        Pending::Connect(future) => Pin::new(future).poll(cx).map(Outcome::Connected),
        Pending::Import(request) => Pin::new(request).poll(cx).map(Outcome::Imported),
        Pending::Transfer(request) => Pin::new(request).poll(cx).map(Outcome::Transferred),
        Pending::Notification(request) => Pin::new(request).poll(cx).map(Outcome::Notified),
    }
}

/// Wakes a thread parked in [`block_on`].
struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Waits for `pending` with the GIL released, running signal handlers every [`SLICE`]; an
/// exception from them (Ctrl-C) drops the request and propagates.
pub(crate) fn wait_for(py: Python<'_>, pending: Pending) -> PyResult<Py<PyAny>> {
    let outcome = match pending {
        Pending::Send(mut request) => Outcome::Sent(wait_request(py, &mut request, SendRequest::wait_timeout)?),
        Pending::Recv { mut request, targets } => {
            Outcome::Received(wait_request(py, &mut request, RecvRequest::wait_timeout)?, targets)
        }
        Pending::Accept(mut future) => Outcome::Accepted(block_on(py, &mut future)?),
        Pending::Connect(mut future) => Outcome::Connected(block_on(py, &mut future)?),
        Pending::Import(mut request) => Outcome::Imported(wait_request(py, &mut request, ImportRequest::wait_timeout)?),
        Pending::Transfer(mut request) => {
            Outcome::Transferred(wait_request(py, &mut request, TransferRequest::wait_timeout)?)
        }
        Pending::Notification(mut request) => {
            Outcome::Notified(wait_request(py, &mut request, NotificationRequest::wait_timeout)?)
        }
    };
    outcome.into_python(py)
}

/// A send or receive: waits in slices (each spins for the busy-poll time first, as
/// `wait()` does); after the first, the request goes to the progress thread's deadline.
fn wait_request<R, T>(py: Python<'_>, request: &mut R, wait_timeout: fn(&mut R, Duration) -> Option<T>) -> PyResult<T>
where
    R: Future<Output = T> + Unpin + Send,
    T: Send,
{
    let mut deadline_given = false;
    loop {
        if let Some(result) = py.detach(|| wait_timeout(request, SLICE)) {
            return Ok(result);
        }
        py.check_signals()?;
        if !deadline_given {
            deadline_given = true;
            // Polling once as a future hands the progress thread the request's deadline.
            let mut cx = TaskContext::from_waker(Waker::noop());
            if let Poll::Ready(result) = Pin::new(&mut *request).poll(&mut cx) {
                return Ok(result);
            }
        }
    }
}

/// Polls `future` to completion with the GIL released between polls.
fn block_on<F>(py: Python<'_>, future: &mut F) -> PyResult<F::Output>
where
    F: Future + Unpin + Send,
{
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    loop {
        let mut cx = TaskContext::from_waker(&waker);
        if let Poll::Ready(value) = Pin::new(&mut *future).poll(&mut cx) {
            return Ok(value);
        }
        py.detach(|| std::thread::park_timeout(SLICE));
        py.check_signals()?;
    }
}
