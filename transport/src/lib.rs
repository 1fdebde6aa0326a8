//! `ferrylink-transport`: contexts, listeners, endpoints and the lanes they use.
//!
//! - [`Context`] owns one progress thread (mio `Poll` + `Waker`, commands over a crossbeam
//!   channel) serving any number of [`Endpoint`]s and [`Listener`]s.
//! - [`Listener`] accepts peers on a Unix socket in a private directory (or TCP, for the
//!   UCX lane across machines); [`Context::connect`] connects to one. Both sides introduce
//!   themselves and a pure negotiation picks the [`LaneKind`] both use.
//! - [`Endpoint::send`] / [`Endpoint::recv`] / [`Endpoint::recv_into`] return requests
//!   with `wait()`, `wait_timeout()` and `Future`.
//!
//! Inside: the protocol of one connection is a pure state machine in its own crate,
//! `ferrylink-proto` (with the wire codec and negotiation), which this crate drives:
//! `driver/` is the progress thread that feeds it (mio, sockets, control rings),
//! `lanes/` how bytes travel (native: memfds and CUDA IPC; UCX), `device/` the CUDA state
//! both lanes share, and the user's handles (`Context`, `Endpoint`, requests,
//! `onesided/`) sit on top (`docs/architecture.md` in the repository).
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
#![warn(missing_docs)]

mod accept_queue;
mod command;
pub mod config;
mod connect_future;
mod context;
mod device;
mod driver;
mod endpoint;
mod endpoint_shared;
pub mod error;
mod inner;
mod lanes;
mod listener;
pub mod onesided;
mod payload;
mod request;
mod slot;
mod task_timer;

/// The wire format (`ferrylink-proto`'s), public here only with the `testing` feature
/// (hostile-input tests craft and decode raw frames); not part of the API.
#[cfg(feature = "testing")]
#[doc(hidden)]
pub use ferrylink_proto::wire;

pub use config::{Config, ConfigError, DeviceCopies, LanePolicy, ProducerOrdering};
pub use connect_future::ConnectFuture;
pub use context::Context;
pub use endpoint::Endpoint;
pub use error::{
    AcceptError, ConnectError, ContextError, ListenError, RecvError, SendError, StatsError, TransportError,
};
pub use ferrylink_proto::lane_kind::LaneKind;
pub use ferrylink_proto::negotiate::NoCommonLane;
pub use ferrylink_proto::peer::PeerInfo;
pub use ferrylink_proto::stats::{ContextStats, EndpointStats};
/// What woke the progress threads while the UCX worker was armed, for tests that check
/// its event fd fires; public only with the `testing` feature, not part of the API.
#[cfg(feature = "testing")]
#[doc(hidden)]
pub use lanes::ucx::{ucx_wakeups, UcxWakeups};
pub use listener::{private_runtime_dir, AcceptFuture, Listener};
pub use onesided::{Access, Notification, PreparedTransfer, Registration, RemoteKey, RemoteRegion, Span};
pub use onesided::{ImportRequest, NotificationRequest, TransferRequest};
pub use request::{RecvRequest, SendRequest};
