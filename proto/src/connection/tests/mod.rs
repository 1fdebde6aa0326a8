//! In-memory tests of the protocol core (quinn style): two cores wired to each other
//! through the codec, a simulated lane, a virtual clock.
//!
//! - `sim/`: the simulated lane (`mod.rs`: its store, state and knobs; `lane_ops.rs`: its `CoreLane`).
//! - `pair.rs`: the pair of cores, the clock, the collectors.
//! - the other files: tests by area; `prop.rs`: random interleavings.

pub(crate) mod pair;
mod sim;

mod failures;
mod gated;
mod handshake;
mod hangup;
mod messages;
mod onesided;
mod owner_runs;
mod prepared;
mod prop;
mod push;
mod receive_offers;
mod recv_on;
mod recvs;
mod sends;
mod transfer_producer;
mod withdraw;
