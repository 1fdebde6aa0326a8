//! `ferrylink-transport`: contexts, listeners, endpoints and the lanes they use.
//!
//! - [`Context`] owns one progress thread (mio `Poll` + `Waker`, commands over a crossbeam
//!   channel) serving any number of [`Endpoint`]s and [`Listener`]s.
//! - [`Listener`] accepts peers on a Unix socket in a private directory;
//!   [`Context::connect`] connects to one. Both sides exchange a [`wire::Hello`] and
//!   [`negotiate`] (a pure function) picks the [`Lane`].
//! - [`Endpoint::send`] / [`Endpoint::recv`] / [`Endpoint::recv_into`] return requests
//!   with `wait()`, `wait_timeout()` and `Future`.
//! - [`wire`]: the bincode wire format with bounded decoding.
//!
//! # Promises
//! - Every request completes, with success or an error, also when the peer dies; no call
//!   blocks longer than the [`Config`] timeouts.
//! - A receive never delivers a partial message: a message is handed over only once all
//!   its frames are in the receiver's memory.
//! - A message handed to `send` is handed back by `wait()` (on success and on every error
//!   where the transport no longer needs it); `recv_into` buffers come back on failure.
//! - Only processes of the same user can connect to a native listener (checked with
//!   `SO_PEERCRED`), and its socket lives in a directory only that user can enter.

mod command;
pub mod config;
mod context;
mod driver;
mod endpoint;
pub mod error;
mod lanes;
mod listener;
pub mod negotiate;
mod peer;
mod proto;
mod request;
mod stats;

pub mod wire;

pub use config::{Config, ConfigError, LanePolicy, ProducerOrdering};
pub use context::Context;
pub use endpoint::Endpoint;
pub use error::{AcceptError, ConnectError, ContextError, ListenError, RecvError, SendError, TransportError};
pub use listener::{private_runtime_dir, Listener};
pub use negotiate::{negotiate, Lane, NoCommonLane};
pub use peer::PeerInfo;
pub use request::{RecvRequest, SendRequest};
pub use stats::{ContextStats, EndpointStats};
