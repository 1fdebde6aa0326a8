//! What the native lane keeps for a prepared one-sided transfer it runs on device memory:
//! the span table, listed by the first run and launched by each one after (1000 spans
//! listed in about 6 µs per run otherwise), and, for a peer's, the peer's memory it maps.
//! Host transfers keep nothing (their copies are `memcpy`s of the spans as given).

use crate::device::PeerMemory;
use ferrylink_memory::cuda::span_kernel::ListedSpans;
use std::sync::Arc;

/// This side's prepared transfer on an opened grant (which holds the peer's memory).
pub(crate) struct KeptOwn {
    /// The grant it runs on: its table goes when the grant closes.
    pub grant: u64,
    /// The kept table; `None`: the peer's memory is in pieces, listed by each run.
    pub listed: Option<Arc<ListedSpans>>,
}

/// The peer's prepared transfer: its memory, mapped, and the kept table. Kept only for
/// mappings the mapping cache keeps anyway (legacy IPC): a pool pointer is imported per
/// transfer so that it is freed before its exporter may free it.
pub(crate) struct KeptPeer {
    pub memory: Arc<PeerMemory>,
    pub listed: Arc<ListedSpans>,
}
