//! Errors of the transport, one enum per area, with ownership handed back where a buffer
//! was handed in. The errors of requests, endpoints and handshakes are the protocol
//! core's (`ferrylink-proto`), re-exported here; those of listeners, contexts and
//! statistics are the transport's own.

pub use ferrylink_proto::error::{ConnectError, TransportError};

/// A failed send. `message` gives the message back when it was not (or no longer) in use.
pub type SendError = ferrylink_proto::error::SendError<ferrylink_memory::Message>;
/// A failed receive. `buffers` gives a `recv_into` target back.
pub type RecvError = ferrylink_proto::error::RecvError<ferrylink_memory::Frame>;

use crate::config::ConfigError;
use std::path::PathBuf;
use std::time::Duration;
use thiserror::Error;

/// Why a listener could not be set up.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ListenError {
    /// A file system or socket call failed.
    #[error("cannot listen at {path}: {source}")]
    Io {
        /// Where.
        path: PathBuf,
        /// The system's word.
        source: std::io::Error,
    },
    /// The socket's directory can be entered by other users.
    #[error("refusing to listen in {path}: the directory must belong to uid {uid} with mode 0700 (it has owner {owner}, mode {mode:o})")]
    InsecureDirectory {
        /// The directory.
        path: PathBuf,
        /// Our uid.
        uid: u32,
        /// Its owner.
        owner: u32,
        /// Its permission bits.
        mode: u32,
    },
    /// The context has shut down.
    #[error("the context has shut down")]
    ContextClosed,
}

/// Why `Listener::accept` returned without an endpoint.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AcceptError {
    /// No peer connected in time.
    #[error("no peer connected within {0:?}")]
    TimedOut(Duration),
    /// The context has shut down.
    #[error("the context has shut down")]
    ContextClosed,
}

/// Why [`Context::stats`](crate::Context::stats) has no answer. A snapshot is never
/// made up: a context that cannot say what it holds says so.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StatsError {
    /// The context's progress thread has stopped.
    #[error("the context has shut down")]
    ContextClosed,
    /// The progress thread did not answer within the bound (`request_timeout`): it is
    /// stuck or overloaded.
    #[error("the progress thread did not answer within {0:?}")]
    NoAnswer(Duration),
}

/// Why a context could not start.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ContextError {
    /// Bad configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The progress thread or its poller could not start.
    #[error("cannot start the progress engine: {0}")]
    Io(#[from] std::io::Error),
    /// `FERRYLINK_TRANSPORT=ucx` is forced and UCX cannot be used.
    #[error("{0}")]
    UcxUnavailable(String),
}
