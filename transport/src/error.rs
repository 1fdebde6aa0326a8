//! Errors of the transport, one enum per area, with ownership handed back where a buffer
//! was handed in.

use crate::config::ConfigError;
use crate::negotiate::NoCommonLane;
use crate::wire::WireError;
use ferrylink_memory::{Frame, Message};
use std::path::PathBuf;
use std::time::Duration;
use thiserror::Error;

/// Why a request or an endpoint failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum TransportError {
    /// The peer closed the connection (or its process ended).
    #[error("peer {peer} closed the connection")]
    PeerClosed {
        /// Who.
        peer: String,
    },
    /// The connection to the peer broke, or the peer broke the protocol.
    #[error("connection to peer {peer} failed: {reason}")]
    PeerFailed {
        /// Who.
        peer: String,
        /// What happened.
        reason: String,
    },
    /// The peer did not take the message.
    #[error("peer {peer} refused the message: {reason}")]
    Refused {
        /// Who.
        peer: String,
        /// Why.
        reason: String,
    },
    /// The request did not complete in time.
    #[error("timed out after {0:?}")]
    TimedOut(Duration),
    /// The message cannot be sent as it is.
    #[error("invalid message: {0}")]
    InvalidMessage(String),
    /// A `recv_into` target does not fit the message that arrived.
    #[error("the receive buffers do not fit the message: {0}")]
    BufferMismatch(String),
    /// This side closed the endpoint.
    #[error("the endpoint was closed")]
    EndpointClosed,
    /// The context's progress thread has stopped.
    #[error("the context has shut down")]
    ContextClosed,
    /// Something this build or machine cannot do (no GPU, no UCX…).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The registration a one-sided transfer used was revoked by its owner.
    #[error("revoked: {0}")]
    Revoked(String),
}

/// A failed send. `message` gives the message back when it was not (or no longer) in use.
#[derive(Debug, Error)]
#[error("send failed: {error}")]
pub struct SendError {
    /// What went wrong.
    pub error: TransportError,
    /// The message, handed back when the transport no longer needs it.
    pub message: Option<Message>,
}

/// A failed receive. `buffers` gives a `recv_into` target back.
#[derive(Debug, Error)]
#[error("receive failed: {error}")]
pub struct RecvError {
    /// What went wrong.
    pub error: TransportError,
    /// The caller's buffers, handed back.
    pub buffers: Option<Vec<Frame>>,
}

/// Why `Context::connect` failed.
#[derive(Debug, Error)]
pub enum ConnectError {
    /// The socket could not be reached.
    #[error("cannot connect to {path}: {source}")]
    Io {
        /// Where.
        path: PathBuf,
        /// The system's word.
        source: std::io::Error,
    },
    /// The listener refused us.
    #[error("the listener refused the connection: {reason}")]
    Rejected {
        /// Its reason.
        reason: String,
    },
    /// The sides share no lane.
    #[error(transparent)]
    NoCommonLane(#[from] NoCommonLane),
    /// The handshake broke.
    #[error("handshake failed: {0}")]
    Handshake(String),
    /// The handshake did not finish in time.
    #[error("connect timed out after {0:?}")]
    TimedOut(Duration),
    /// The context has shut down.
    #[error("the context has shut down")]
    ContextClosed,
}

/// Why a listener could not be set up.
#[derive(Debug, Error)]
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

impl From<WireError> for TransportError {
    fn from(e: WireError) -> Self {
        TransportError::PeerFailed { peer: String::from("?"), reason: e.to_string() }
    }
}
