//! One-sided transfers: this context's memory registered for peers
//! ([`crate::Context::register`] → [`Registration`], whose [`RemoteKey`] the user ships any
//! way), a peer's region imported on an endpoint ([`crate::Endpoint::import`] →
//! [`RemoteRegion`]), and `put` / `get`, single or batched ([`Span`]s), with an optional
//! [`Notification`] delivered to the region's owner after the data is visible.
//!
//! - `key.rs`: [`RemoteKey`] and [`Access`] (bytes checked field by field).
//! - `registry.rs`: a context's registrations, their grants and when memory may go.
//! - `spans.rs`: the checks of a transfer's spans (both sides run them).
//! - `handles.rs`: the user's handles.
//! - `prepared.rs`: [`PreparedTransfer`], spans checked once and run many times.
//!
//! The protocol is `proto/onesided.rs`; the lanes move the bytes (`lanes/native/onesided.rs`).

mod api;
mod handles;
mod key;
mod prepared;
mod registry;
mod spans;

pub use handles::{Notification, Registration, RemoteRegion, Span};
pub use key::{Access, KeyError, MemoryKind, RemoteKey, KEY_LEN};
pub use prepared::PreparedTransfer;

pub(crate) use handles::ImportedRegion;
pub(crate) use registry::{RegistrationInner, Registry};
pub(crate) use spans::{check_initiator_transfer, check_spans};
