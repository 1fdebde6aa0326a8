//! What contexts and endpoints count: the counters the progress thread updates and the
//! snapshots users read.

use std::sync::atomic::{AtomicU64, Ordering};

/// Byte and message counters of one endpoint, updated by the progress thread.
#[derive(Debug, Default)]
pub struct Counters {
    /// [`EndpointStats::socket_bytes_written`].
    pub socket_bytes_written: AtomicU64,
    /// [`EndpointStats::socket_bytes_read`].
    pub socket_bytes_read: AtomicU64,
    /// [`EndpointStats::messages_sent`].
    pub messages_sent: AtomicU64,
    /// [`EndpointStats::messages_received`].
    pub messages_received: AtomicU64,
    /// [`EndpointStats::payload_bytes_sent`].
    pub payload_bytes_sent: AtomicU64,
    /// [`EndpointStats::payload_bytes_received`].
    pub payload_bytes_received: AtomicU64,
    /// [`EndpointStats::staged_bytes`].
    pub staged_bytes: AtomicU64,
    /// [`EndpointStats::bounced_bytes`].
    pub bounced_bytes: AtomicU64,
    /// [`EndpointStats::fds_sent`].
    pub fds_sent: AtomicU64,
    /// [`EndpointStats::offered_sends`].
    pub offered_sends: AtomicU64,
    /// [`EndpointStats::offered_sends_gated`].
    pub offered_sends_gated: AtomicU64,
    /// [`EndpointStats::offered_receives`].
    pub offered_receives: AtomicU64,
    /// [`EndpointStats::wakes_sent`].
    pub wakes_sent: AtomicU64,
    /// [`EndpointStats::notifications_sent_ahead`].
    pub notifications_sent_ahead: AtomicU64,
}

impl Counters {
    /// Adds `n` to `counter`.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// A snapshot of an endpoint's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct EndpointStats {
    /// Bytes this side wrote to its control channel (the socket, or the control ring).
    pub socket_bytes_written: u64,
    /// Bytes this side read from its control channel (the socket, or the control ring).
    pub socket_bytes_read: u64,
    /// Messages acknowledged by the peer.
    pub messages_sent: u64,
    /// Messages landed on this side.
    pub messages_received: u64,
    /// Payload bytes of acknowledged messages.
    pub payload_bytes_sent: u64,
    /// Payload bytes landed on this side.
    pub payload_bytes_received: u64,
    /// Bytes this side copied into shared staging memory to send them.
    pub staged_bytes: u64,
    /// Device bytes this side copied into its exportable pool to send them, because
    /// nothing could export their memory (a stock stream-ordered pool, foreign pointers).
    pub bounced_bytes: u64,
    /// File descriptors this side passed to the peer.
    pub fds_sent: u64,
    /// Device messages this side copied into buffers the listener offered ahead of time
    /// (connector-copies mode, `connection/offers.rs`).
    pub offered_sends: u64,
    /// Of those, the ones whose copies' end the listener read from a gate word of the
    /// control rings instead of querying an interprocess event
    /// (docs/decisions/0029-copies-signal-their-own-end.md).
    pub offered_sends_gated: u64,
    /// Messages the connector copied straight into this side's `recv_into` buffers,
    /// offered to it while the receive was posted (connector-copies mode, listener side,
    /// `connection/recv/offered.rs`).
    pub offered_receives: u64,
    /// Wake-ups this side sent over the socket to a peer that was going to sleep on its
    /// control ring.
    pub wakes_sent: u64,
    /// One-sided notifications this side sent while the transfer's copies still ran,
    /// gated on a word the copies' end writes (native lane, device memory,
    /// docs/decisions/0029-copies-signal-their-own-end.md); the others followed their copies.
    pub notifications_sent_ahead: u64,
}

impl Counters {
    /// A snapshot of the counters.
    pub fn snapshot(&self) -> EndpointStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        EndpointStats {
            socket_bytes_written: get(&self.socket_bytes_written),
            socket_bytes_read: get(&self.socket_bytes_read),
            messages_sent: get(&self.messages_sent),
            messages_received: get(&self.messages_received),
            payload_bytes_sent: get(&self.payload_bytes_sent),
            payload_bytes_received: get(&self.payload_bytes_received),
            staged_bytes: get(&self.staged_bytes),
            bounced_bytes: get(&self.bounced_bytes),
            fds_sent: get(&self.fds_sent),
            offered_sends: get(&self.offered_sends),
            offered_sends_gated: get(&self.offered_sends_gated),
            offered_receives: get(&self.offered_receives),
            wakes_sent: get(&self.wakes_sent),
            notifications_sent_ahead: get(&self.notifications_sent_ahead),
        }
    }
}

/// What a context holds right now (the leak tests compare these with a baseline).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ContextStats {
    /// Endpoints open or being set up.
    pub endpoints: usize,
    /// Listeners.
    pub listeners: usize,
    /// Peer regions mapped into this process.
    pub imported_regions: usize,
    /// Bytes of peer regions mapped.
    pub imported_bytes: u64,
    /// Device regions (VMM chunks, stream-ordered pools) peers announced and this
    /// process imported.
    pub imported_device_regions: usize,
    /// Bytes of VMM chunks imported from peers.
    pub imported_vmm_bytes: u64,
    /// Bytes of shared staging memory held.
    pub staging_mapped_bytes: u64,
    /// Bytes of shared staging memory in use by sends in flight.
    pub staging_used_bytes: u64,
    /// Bytes of shared memory held for landing received host frames.
    pub landing_mapped_bytes: u64,
    /// Sends waiting for staging room or an acknowledgement.
    pub sends_in_flight: usize,
    /// Receives posted and not yet matched.
    pub recvs_posted: usize,
    /// Bytes landed ahead of the user's receives.
    pub unclaimed_bytes: u64,
    /// Peers' device allocations mapped now (CUDA IPC).
    pub ipc_mappings: usize,
    /// Bytes of those mappings.
    pub ipc_mapped_bytes: u64,
    /// `cuIpcOpenMemHandle` calls since the context started.
    pub ipc_mapping_opens: u64,
    /// `cuIpcGetMemHandle` calls since the context started.
    pub ipc_handles_exported: u64,
    /// One-sided registrations held (live, or revoked and still mapped by a peer).
    pub registrations: usize,
    /// Registrations served by an existing one (the same memory registered again).
    pub registration_cache_hits: u64,
    /// Peers' one-sided regions this context imported and holds open.
    pub remote_regions: usize,
    /// Pinned host memory mapped for one-sided transfers staged over UCX (kept for the
    /// next ones once mapped; 0 until a transfer was staged).
    pub transfer_staging_bytes: u64,
    /// One-sided copies done by the lingering copy kernel (`Config::linger_copies`),
    /// since the context started.
    pub lingering_copies: u64,
    /// Launches of the lingering copy kernel (one per stretch of copies with no idle
    /// time between them longer than `Config::linger_copies`), since the context started.
    pub lingering_kernel_launches: u64,
    /// Sends into a listener's offer whose one small copy (a frame of at most 4 KiB) was
    /// made by the copy kernel that writes the connection's gate word itself, since the
    /// context started (each saves the `cuStreamWriteValue32` after the copy).
    pub signalled_pushes: u64,
}
