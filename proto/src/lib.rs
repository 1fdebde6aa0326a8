//! `ferrylink-proto`: ferrylink's protocol core, without I/O (model: quinn-proto).
//!
//! The boundary: everything here is a pure function of its inputs. A [`Connection`] is
//! fed decoded wire messages, the user's commands, its lane's events and the current
//! time (always as an argument: nothing here reads the clock), and hands back
//! [`Output`]s for its driver to carry out. Nothing here opens a socket or a file, polls,
//! spawns or blocks a thread, calls CUDA or UCX: the crate depends directly on no I/O
//! crate (no mio, nix, crossbeam, UCX or CUDA bindings), so the compiler keeps its code
//! so. It does not name the buffer types either (a message and its frames, which it
//! passes between the user and the lane without touching their memory): the driver
//! names them through [`Payload`], and every connection is built for those types.
//!
//! `ferrylink-transport` is the driver on top: the progress thread (sockets, control
//! rings, timers), the lanes that move the bytes (which the core calls through
//! [`connection::lane::CoreLane`]) and the user's handles. It depends on this crate,
//! never the reverse.
//!
//! - [`connection`]: the state machine of one connection, its seam to the lanes
//!   ([`connection::lane`]) and the in-memory tests of both sides wired together.
//! - [`wire`]: the control messages and their bounded codec.
//! - [`negotiate`] and [`lane_kind`]: which lane two `Hello`s agree on.
//! - [`region`] and [`remote_key`]: one-sided registrations, imported regions, the key a
//!   registration ships and the checks of a transfer's spans.
//! - [`payload`]: the buffer types the driver names, and the facts of them the core reads.
//! - [`error`], [`stats`], [`peer`], [`policy`]: the errors, counters, peer description
//!   and handshake policies the core reports and takes.
#![warn(missing_docs)]

pub mod connection;
pub mod error;
pub mod lane_kind;
pub mod negotiate;
pub mod payload;
pub mod peer;
pub mod policy;
pub mod region;
pub mod remote_key;
pub mod stats;
#[cfg(test)]
mod test_payload;
pub mod wire;

pub use connection::{Connection, Output};
pub use lane_kind::LaneKind;
pub use payload::Payload;
