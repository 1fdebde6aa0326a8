//! What user threads ask of the progress thread.

use crate::driver::{RawListener, RawStream};
use crate::endpoint::EndpointShared;
use crate::error::{ConnectError, RecvError, SendError};
use crate::lanes::device::ProducerMarks;
use crate::request::Slot;
use crate::stats::ContextStats;
use crossbeam_channel::Sender;
use ferrylink_memory::{Frame, Message};
use std::sync::Arc;

/// The mio token of the waker; endpoints and listeners get ids from 1 on.
pub(crate) const WAKER_TOKEN: usize = 0;

/// What user threads ask of the progress thread.
pub(crate) enum Command {
    Adopt {
        stream: RawStream,
        peer: String,
        reply: Sender<Result<Arc<EndpointShared>, ConnectError>>,
    },
    Listen {
        id: usize,
        listener: RawListener,
        accepted: Sender<Arc<EndpointShared>>,
    },
    Unlisten {
        id: usize,
    },
    Send {
        ep: usize,
        id: u64,
        message: Message,
        slot: Arc<Slot<Result<Message, SendError>>>,
        /// Device messages: the producer's events, recorded on the sending thread.
        producer: Option<ProducerMarks>,
    },
    Recv {
        ep: usize,
        id: u64,
        into: Option<Vec<Frame>>,
        slot: Arc<Slot<Result<Message, RecvError>>>,
    },
    Cancel {
        ep: usize,
        id: u64,
    },
    Close {
        ep: usize,
    },
    Stats {
        reply: Sender<ContextStats>,
    },
    Shutdown,
}
