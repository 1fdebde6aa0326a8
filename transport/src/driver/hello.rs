//! What this side says about itself on one connection: its `Hello` (the native lane only
//! over a Unix socket, the connection's own UCX tag prefix) and the control rings a
//! connecting side offers with it.

use super::lane::conn_tag_prefix;
use crate::config::Config;
use ferrylink_ipc::control_ring::ControlRingMemory;
use ferrylink_proto::wire::Hello;
use std::sync::Arc;

/// Control rings a connecting side offers with its `Hello`, and the descriptor to pass;
/// `None` when they are turned off or cannot be made (the socket then carries everything).
pub(super) fn control_rings_to_offer(config: &Config) -> Option<(Arc<ControlRingMemory>, std::os::fd::OwnedFd)> {
    if config.control_ring_bytes == 0 {
        return None;
    }
    let made = ControlRingMemory::create(config.control_ring_bytes)
        .map_err(|e| e.to_string())
        .and_then(|memory| Ok((memory.fd().try_clone_to_owned().map_err(|e| e.to_string())?, memory)));
    match made {
        Ok((fd, memory)) => Some((memory, fd)),
        Err(e) => {
            tracing::warn!("no control rings for this connection ({e}); the socket carries everything");
            None
        }
    }
}

/// What this side says about itself on connection `conn_id`: over TCP the native lane is
/// impossible (descriptors cannot travel), whatever the machine; the UCX tag prefix is
/// the connection's own.
pub(super) fn hello_for_conn(local: &Hello, over_unix: bool, conn_id: usize) -> Hello {
    let mut hello = Hello { native_available: local.native_available && over_unix, ..local.clone() };
    if let Some(ucx) = &mut hello.ucx {
        ucx.tag_prefix = conn_tag_prefix(conn_id);
    }
    hello
}
