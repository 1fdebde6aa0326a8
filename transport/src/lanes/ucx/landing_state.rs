//! [`UcxLanding`]: a message whose payload is arriving over the UCX lane.

use super::ops::RecvOp;
use ferrylink_memory::Frame;

/// A message whose payload is arriving.
pub(super) struct UcxLanding {
    pub(super) seq: u64,
    pub(super) header: Vec<u8>,
    pub(super) frames: Vec<Option<Frame>>,
    pub(super) ops: Vec<RecvOp>,
    pub(super) done: Vec<bool>,
}
