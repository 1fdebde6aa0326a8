//! Rust errors as the Python exception classes of `ferrylink._errors`: one class per
//! error kind, the message the Rust error's own `Display`.

use ferrylink::transport::{
    AcceptError, ConnectError, ContextError, ListenError, RecvError, SendError, StatsError, TransportError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// The module that defines the exception classes.
static ERRORS_MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// An exception of class `name` of `ferrylink._errors` with `message`. Should the module
/// not import (a broken install), the import's error is raised instead.
pub(crate) fn error(py: Python<'_>, name: &str, message: impl Into<String>) -> PyErr {
    let module = match ERRORS_MODULE.get_or_try_init(py, || py.import("ferrylink._errors").map(Bound::unbind)) {
        Ok(module) => module.bind(py),
        Err(e) => return e,
    };
    match module.getattr(name).and_then(|class| class.cast_into::<PyType>().map_err(PyErr::from)) {
        Ok(class) => PyErr::from_type(class, message.into()),
        Err(e) => e,
    }
}

/// The class of a transport error.
pub(crate) fn transport_class(error: &TransportError) -> &'static str {
    match error {
        TransportError::PeerClosed { .. } => "PeerClosedError",
        TransportError::PeerFailed { .. } => "PeerFailedError",
        TransportError::Refused { .. } => "RefusedError",
        TransportError::TimedOut(_) => "TimedOutError",
        TransportError::InvalidMessage(_) => "InvalidMessageError",
        TransportError::BufferMismatch(_) => "BufferMismatchError",
        TransportError::EndpointClosed => "EndpointClosedError",
        TransportError::ContextClosed => "ContextClosedError",
        TransportError::Unsupported(_) => "UnsupportedError",
        TransportError::Revoked(_) => "RevokedError",
        // A kind of error added later: the base class until it gets its own.
        _ => "FerrylinkError",
    }
}

/// A failed send (its message, handed back, is dropped here).
pub(crate) fn send_error(py: Python<'_>, e: &SendError) -> PyErr {
    error(py, transport_class(&e.error), e.to_string())
}

/// A failed import, transfer or notification receive.
pub(crate) fn transport_error(py: Python<'_>, e: &TransportError) -> PyErr {
    error(py, transport_class(e), e.to_string())
}

/// A failed receive.
pub(crate) fn recv_error(py: Python<'_>, e: &RecvError) -> PyErr {
    error(py, transport_class(&e.error), e.to_string())
}

pub(crate) fn connect_error(py: Python<'_>, e: &ConnectError) -> PyErr {
    let class = match e {
        ConnectError::TimedOut(_) => "TimedOutError",
        ConnectError::ContextClosed => "ContextClosedError",
        _ => "ConnectError",
    };
    error(py, class, e.to_string())
}

pub(crate) fn listen_error(py: Python<'_>, e: &ListenError) -> PyErr {
    let class = match e {
        ListenError::ContextClosed => "ContextClosedError",
        _ => "ListenError",
    };
    error(py, class, e.to_string())
}

pub(crate) fn accept_error(py: Python<'_>, e: &AcceptError) -> PyErr {
    let class = match e {
        AcceptError::TimedOut(_) => "TimedOutError",
        AcceptError::ContextClosed => "ContextClosedError",
        _ => "FerrylinkError",
    };
    error(py, class, e.to_string())
}

pub(crate) fn context_error(py: Python<'_>, e: &ContextError) -> PyErr {
    let class = match e {
        ContextError::Config(_) => "ConfigError",
        _ => "ContextError",
    };
    error(py, class, e.to_string())
}

pub(crate) fn stats_error(py: Python<'_>, e: &StatsError) -> PyErr {
    let class = match e {
        StatsError::ContextClosed => "ContextClosedError",
        StatsError::NoAnswer(_) => "TimedOutError",
        _ => "FerrylinkError",
    };
    error(py, class, e.to_string())
}
