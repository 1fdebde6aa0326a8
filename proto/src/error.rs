//! The errors the protocol core reports: of a request or an endpoint
//! ([`TransportError`]), of a send and a receive with their buffers handed back
//! ([`SendError`], [`RecvError`]), and of a connection's handshake ([`ConnectError`]).

use crate::negotiate::NoCommonLane;
use crate::wire::WireError;
use std::path::PathBuf;
use std::time::Duration;
use thiserror::Error;

/// Why a request or an endpoint failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
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
/// `M` is the message type of the build ([`crate::payload::Payload::Message`]).
#[derive(Debug, Error)]
#[error("send failed: {error}")]
#[non_exhaustive]
pub struct SendError<M> {
    /// What went wrong.
    pub error: TransportError,
    /// The message, handed back when the transport no longer needs it.
    pub message: Option<M>,
}

impl<M> SendError<M> {
    /// A send that failed with `error`, handing `message` back if it is not in use.
    pub fn new(error: TransportError, message: Option<M>) -> Self {
        Self { error, message }
    }
}

/// A failed receive. `buffers` gives a `recv_into` target back. `F` is the frame type of
/// the build ([`crate::payload::Payload::Frame`]).
#[derive(Debug, Error)]
#[error("receive failed: {error}")]
#[non_exhaustive]
pub struct RecvError<F> {
    /// What went wrong.
    pub error: TransportError,
    /// The caller's buffers, handed back.
    pub buffers: Option<Vec<F>>,
}

impl<F> RecvError<F> {
    /// A receive that failed with `error`, handing the caller's `buffers` back.
    pub fn new(error: TransportError, buffers: Option<Vec<F>>) -> Self {
        Self { error, buffers }
    }
}

/// Why `Context::connect` failed.
#[derive(Debug, Error)]
#[non_exhaustive]
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

impl From<WireError> for TransportError {
    fn from(e: WireError) -> Self {
        TransportError::PeerFailed { peer: String::from("?"), reason: e.to_string() }
    }
}
