//! One-sided transfers: this context's memory registered for peers
//! ([`crate::Context::register`] → [`Registration`], whose [`RemoteKey`] the user ships any
//! way), a peer's region imported on an endpoint ([`crate::Endpoint::import`] →
//! [`RemoteRegion`]), and `put` / `get`, single or batched ([`Span`]s), with an optional
//! [`Notification`] delivered to the region's owner after the data is visible.
//!
//! - `handles.rs`: the user's handles.
//! - `prepared.rs`: [`PreparedTransfer`], spans checked once and run many times.
//! - `requests.rs`: [`ImportRequest`], [`TransferRequest`], [`NotificationRequest`].
//!
//! The keys, registrations, imported regions and span checks these handles rest on are
//! the core's (`region/`: [`RemoteKey`] and [`Access`] are re-exported here); the
//! protocol is `connection/onesided.rs`; the lanes move the bytes (`lanes/native/onesided.rs`).

mod api;
mod handles;
mod prepared;
mod requests;

pub use ferrylink_proto::region::{Access, KeyError, MemoryKind, RemoteKey, KEY_LEN};
pub use handles::{Notification, Registration, RemoteRegion, Span};
pub use prepared::PreparedTransfer;
pub use requests::{ImportRequest, NotificationRequest, TransferRequest};
