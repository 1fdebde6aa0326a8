//! ferrylink's test kit: what the tests of every crate of the workspace share. Dev-only
//! (`publish = false`, used only as a dev-dependency).
//!
//! - [`peer`]: the re-exec harness. A multi-process test runs this test binary again as
//!   its peer process, with a role. [`peer_test!`] declares such a test once: the parent
//!   body and the peer body. The peer's stdout and stderr are captured (shown when the
//!   test fails), every wait is bounded, a peer is killed when its handle drops, and the
//!   parent learns that the peer body ran to its end (a test cannot pass because its peer
//!   never ran).
//! - [`data`]: one test-data generator, [`pattern`] (random access: [`pattern_at`]), and
//!   one checksum, [`checksum`].
//! - [`skip`]: `require_gpu` (feature `cuda`): a GPU test, ignored unless its crate is
//!   built with `--features gpu-tests`, fails without a device (it never passes unrun);
//!   [`ucx_or_skip`]: without UCX a test prints `skipped: UCX not available` and passes,
//!   unless `FERRYLINK_REQUIRE_UCX=1`, when it fails.
//! - [`echo`]: the echo peer and the load check (N messages per endpoint, D in flight,
//!   every echo verified), generic over the transport through [`echo::Transport`].
//! - [`leaks`]: leak checks beyond a transport's own counters: this process's mappings
//!   (`/proc/self/maps`, memfds apart) and, with feature `cuda`, device memory in use.
//! - [`two_host`]: a second host on this machine (network, mount, UTS and PID
//!   namespaces, joined to the first by a veth pair) for the tests of the UCX lane
//!   between hosts.
//! - [`eventually`]: a bounded poll; [`output_within`]: a command's output, bounded;
//!   [`Gate`] and [`returns_within`]: whether a call waits for work a test holds back.
//!
//! The kit depends on no ferrylink crate (the unit tests of `ferrylink-memory`,
//! `ferrylink-ipc`, `ucx-sys` and `ferrylink-ucx` use it: a kit depending on one of them
//! would put a second copy of that crate into its own unit-test binary). What needs
//! ferrylink's types is a small adaptor in the test crate (an [`echo::Transport`] impl).

pub mod bounded;
pub mod data;
pub mod echo;
pub mod gate;
pub mod leaks;
pub mod peer;
pub mod skip;
pub mod two_host;

pub use bounded::output_within;
pub use data::{checksum, pattern, pattern_at, pattern_into};
pub use gate::{returns_within, Gate};
pub use peer::{Peer, PeerOutput, Peers};
#[cfg(feature = "cuda")]
pub use skip::require_gpu;
pub use skip::{ucx_or_skip, Need};

use std::time::{Duration, Instant};

/// Polls `cond` every 10 ms until it holds or `bound` passes; whether it held.
pub fn eventually(bound: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + bound;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
