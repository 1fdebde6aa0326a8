//! [`ProducerOrdering`]: how a send is ordered after its producer. The policies the
//! handshake carries (which lane, who copies) are the core's (`policy.rs`).

/// How a device send is ordered after the producer's work on its buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProducerOrdering {
    /// Record an event on the legacy default stream. Copies this process runs (the
    /// connector's pushes) wait for it on the GPU and the descriptor goes out at once;
    /// when the peer or UCX copies, the progress thread polls it (`cuEventQuery`, never
    /// blocking other endpoints) and the descriptor goes out once it completed. Covers
    /// work on the default stream and blocking streams. Recording is a GPU command in
    /// this process's context. (Letting the peer's copy wait on an interprocess event
    /// instead was measured on the H200: the cross-process wait costs a GPU context
    /// switch, a 1 MB round trip took 329 µs instead of 54 µs.)
    LegacyStreamEvent,
    /// `cuCtxSynchronize` in `send`, on the sending thread: covers every stream and sends
    /// no GPU command, but `send` blocks its caller until all work the process submitted
    /// before it finished, related to the message or not (the progress thread never
    /// waits).
    ContextSynchronize,
}
