//! The protocol of one connection as a state machine, with no I/O (model: quinn-proto).
//!
//! A [`Connection`] is fed decoded wire messages ([`Connection::handle_message`]), user
//! commands ([`Connection::send`], [`Connection::recv`], [`Connection::cancel`],
//! [`Connection::close_by_user`]), lane completions ([`Connection::handle_lane_event`])
//! and the current time, and hands back [`Output`]s: wire messages to transmit, request
//! completions, and what the driver must do with the channel (take the control rings
//! into use, open the lane, close). The bytes of a message are a lane's business: the
//! core calls the lane through [`lane::CoreLane`]. Nothing here touches a socket, a ring,
//! mio, CUDA, UCX, a thread or the clock.
//!
//! - `machine.rs`: [`Connection`] and what every part shares; `state/`: what it
//!   holds; `output.rs`: [`Output`]; `roles.rs`: [`Role`], [`PushRole`].
//! - `handshake.rs`: `Hello` / `Welcome` / `Reject` and lane negotiation.
//! - `send.rs`: queued sends, descriptions, acknowledgements, pushes.
//! - `recv.rs`: arriving messages, landing, matching with receives.
//! - `offers.rs`: the bookkeeping of push offers (connector copies ahead of time).
//! - `lane.rs`: the seam to the lanes.

mod gated;
mod handshake;
mod initiate;
pub mod lane;
mod machine;
mod offers;
mod onesided;
mod output;
mod peer_runs;
mod recv;
mod roles;
mod send;
mod state;
#[cfg(test)]
pub mod tests;
mod transfer;

pub use machine::kind;
pub use machine::{Connection, Phase, Settings};
pub use output::Output;
pub use roles::{PushRole, Role};
pub use transfer::{PreparedSpans, TransferArgs, TransferSpans};
