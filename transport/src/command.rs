//! What user threads hand the progress thread: commands, sockets, and the state an
//! endpoint shares with it.

use crate::accept_queue::AcceptQueue;
use crate::device::{ProducerMarks, TargetMarks};
use crate::endpoint_shared::EndpointShared;
use crate::error::{ConnectError, RecvError, SendError, TransportError};
use crate::payload::TransferArgs;
use crate::slot::Slot;
use ferrylink_memory::{Frame, Message, ProducerStream};
use ferrylink_proto::region::{ImportedRegion, RemoteKey};
use ferrylink_proto::stats::ContextStats;
use std::sync::{Arc, Mutex, Weak};
use std::task::Waker;
use std::time::Instant;

/// Where the progress thread answers a `connect`: the endpoint, or why not.
pub(crate) type ConnectSlot = Arc<Slot<Result<Arc<EndpointShared>, ConnectError>>>;

/// The waker of a task that waits for a time (an accept's bound, a connect's retry); the
/// task puts its latest waker in.
pub(crate) type WakerCell = Mutex<Option<Waker>>;

/// Where the progress thread answers an import.
pub(crate) type ImportSlot = Arc<Slot<Result<ImportedRegion, TransportError>>>;
/// Where the progress thread answers a one-sided transfer.
pub(crate) type TransferSlot = Arc<Slot<Result<(), TransportError>>>;
/// Where the progress thread answers a notification receive.
pub(crate) type NotificationSlot = Arc<Slot<Result<Vec<u8>, TransportError>>>;

/// The mio token of the waker; endpoints and listeners get ids from 1 on.
pub(crate) const WAKER_TOKEN: usize = 0;

/// A posted receive as the progress thread takes it (`Command::Recv`).
pub(crate) struct PostedRecvCommand {
    /// The receive's own buffers (`Endpoint::recv_into`).
    pub into: Option<Vec<Frame>>,
    /// The stream its device copies end with waiting (`Endpoint::recv_on`).
    pub on: Option<ProducerStream>,
    /// Events recorded on its buffers' producer streams when it was posted.
    pub target_marks: Option<TargetMarks>,
}

/// What user threads ask of the progress thread.
pub(crate) enum Command {
    Adopt {
        stream: RawStream,
        peer: String,
        reply: ConnectSlot,
    },
    Listen {
        id: usize,
        listener: RawListener,
        accepted: Arc<AcceptQueue>,
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
        posted: PostedRecvCommand,
        slot: Arc<Slot<Result<Message, RecvError>>>,
    },
    Cancel {
        ep: usize,
        id: u64,
    },
    /// Request `id`'s handle went before it completed: withdraw it if it has not started.
    Withdraw {
        ep: usize,
        id: u64,
    },
    /// `message` completed into receive `id`, whose handle went without taking it: it
    /// goes back to the front of the endpoint's undelivered messages.
    Undelivered {
        ep: usize,
        id: u64,
        message: Message,
    },
    /// Request `id` is awaited as a future: end it at `at` (as `wait()` would) unless it
    /// completed by then.
    Expire {
        ep: usize,
        id: u64,
        at: Instant,
    },
    /// Wake the task in `waker` at `at` (unless it is gone by then).
    WakeAt {
        at: Instant,
        waker: Weak<WakerCell>,
    },
    Close {
        ep: usize,
    },
    Stats {
        reply: crossbeam_channel::Sender<ContextStats>,
    },
    /// One-sided: import `key` on endpoint `ep`.
    Import {
        ep: usize,
        id: u64,
        key: RemoteKey,
        slot: ImportSlot,
    },
    /// One-sided: start a transfer on endpoint `ep`.
    Transfer {
        ep: usize,
        id: u64,
        args: TransferArgs,
        slot: TransferSlot,
    },
    /// One-sided: the user dropped prepared transfer `prepared` of endpoint `ep`.
    Unprepare {
        ep: usize,
        prepared: u64,
    },
    /// One-sided: wait for a notification on endpoint `ep`.
    RecvNotification {
        ep: usize,
        id: u64,
        slot: NotificationSlot,
    },
    /// One-sided: a notification completed into a dropped handle: it goes to the next
    /// notification receive.
    ReturnNotification {
        ep: usize,
        data: Vec<u8>,
    },
    /// One-sided: the user dropped its region of `grant` on endpoint `ep`.
    Unimport {
        ep: usize,
        grant: u64,
    },
    /// One-sided: registration `registration` was revoked; every peer that imported it
    /// is told.
    Revoke {
        registration: u64,
    },
    Shutdown,
}

/// A connected stream as user threads hand it to the progress thread.
pub(crate) enum RawStream {
    /// A Unix socket (the native lane is possible).
    Unix(std::os::unix::net::UnixStream),
    Tcp(std::net::TcpStream),
}

/// A listening socket as user threads hand it to the progress thread.
pub(crate) enum RawListener {
    /// A listening Unix socket.
    Unix(std::os::unix::net::UnixListener),
    Tcp(std::net::TcpListener),
}
