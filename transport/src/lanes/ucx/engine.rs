//! The context-wide UCX state (context, worker, staging pool) and one connection's
//! endpoint, with the tag layout of payload messages.
//!
//! Each side tells the other, in its `Hello`, the 16-bit tag prefix to use for messages
//! to it; a payload's tag is `prefix | seq (24 bits) | frame index (12) | chunk (12)`.

use ferrylink_memory::PinnedPool;
use ferrylink_ucx::{
    RecvBuf, Registration, Rejected, UcxConfig, UcxContext, UcxEndpoint, UcxError, UcxWorker, WorkerAddress,
};

/// Bytes per staged chunk, at least.
const STAGE_CHUNK: usize = 8 << 20;
/// Staged chunks in flight per frame.
pub(crate) const STAGE_DEPTH: usize = 8;
/// Chunks a staged frame may have (12 tag bits).
pub(crate) const MAX_CHUNKS: u64 = 1 << 12;
/// Frames a message may have on this lane (12 tag bits).
pub(crate) const MAX_FRAMES: usize = 1 << 12;

/// The tag of one payload message.
pub(crate) fn tag(prefix: u16, seq: u64, frame: usize, chunk: usize) -> u64 {
    ((prefix as u64) << 48) | ((seq & 0xFF_FFFF) << 24) | (((frame as u64) & 0xFFF) << 12) | ((chunk as u64) & 0xFFF)
}

/// The chunk size a sender uses to stage a device frame of `len` bytes.
pub(crate) fn stage_chunk(len: u64) -> u64 {
    (STAGE_CHUNK as u64).max(len.div_ceil(MAX_CHUNKS))
}

/// The context-wide UCX state, created and owned by the progress thread.
pub(crate) struct UcxEngine {
    /// Pinned host memory staged device frames go through (made on first use).
    pinned: std::sync::OnceLock<Result<PinnedPool, String>>,
    /// Pinned host memory staged one-sided transfers go through (made on first use).
    transfer_pinned: std::sync::OnceLock<Result<PinnedPool, String>>,
    pub worker: UcxWorker,
    pub address: Vec<u8>,
    pub cuda_aware: bool,
    /// Whether the context was made with UCX's RMA feature (`FERRYLINK_UCX_RMA=1`): the
    /// lane carries one-sided transfers.
    pub rma: bool,
    /// The TCP receive segment of this side's UCX (`UcxContext::tcp_segment`).
    pub tcp_segment: Option<String>,
    context: UcxContext,
}

impl UcxEngine {
    /// The pinned host pool staged transfers use.
    pub fn pinned(&self) -> Result<&PinnedPool, String> {
        self.pinned.get_or_init(new_staging_pool).as_ref().map_err(Clone::clone)
    }

    /// The pinned host pool staged one-sided transfers use (`staged.rs`): a buffer per
    /// transfer and side, up to [`TRANSFER_STAGING_MAX_BYTES`] in all.
    pub fn transfer_staging(&self) -> Result<&PinnedPool, String> {
        self.transfer_pinned.get_or_init(new_transfer_staging_pool).as_ref().map_err(Clone::clone)
    }

    /// Bytes the transfer staging pool mapped (0 before the first staged transfer).
    pub fn transfer_staging_bytes(&self) -> u64 {
        match self.transfer_pinned.get() {
            Some(Ok(pool)) => pool.stats().bytes_reserved as u64,
            _ => 0,
        }
    }

    /// Loads UCX (the library `config` names, else `libucp.so.0`), creates a context and a
    /// worker. UCX reads its own `UCX_*` variables (`UCX_TLS`, `UCX_NET_DEVICES`, …).
    pub fn start(config: &UcxConfig) -> Result<Self, UcxError> {
        let context = UcxContext::new(config)?;
        let worker = UcxWorker::new(&context)?;
        let address = worker.address()?.into_bytes();
        let cuda_aware = context.supports_cuda_memory();
        let tcp_segment = context.tcp_segment().map(str::to_owned);
        let rma = context.supports_rma();
        tracing::debug!(cuda_aware, rma, version = ?context.version(), ?tcp_segment, "UCX lane available");
        let (pinned, transfer_pinned) = (std::sync::OnceLock::new(), std::sync::OnceLock::new());
        Ok(Self { worker, address, cuda_aware, rma, tcp_segment, pinned, transfer_pinned, context })
    }

    /// Maps `buf` for peers' puts and gets (`ucp_mem_map`).
    pub fn register<B: RecvBuf>(&self, buf: B) -> Result<Registration<B>, UcxError> {
        self.context.register(buf).map_err(Rejected::into_error)
    }
}

/// One UCX connection's state.
pub(crate) struct UcxConn {
    pub endpoint: UcxEndpoint,
    /// The prefix the peer asked for: tags of what we send.
    pub send_prefix: u16,
    /// Our prefix: tags of what we receive.
    pub recv_prefix: u16,
    /// Whether device frames travel without staging (both sides CUDA-aware).
    pub direct_device: bool,
}

impl UcxConn {
    /// Connects to the peer's worker.
    pub fn connect(
        worker: &UcxWorker,
        peer_address: &[u8],
        send_prefix: u16,
        recv_prefix: u16,
        direct_device: bool,
    ) -> Result<Self, UcxError> {
        // SAFETY: the bytes come from the peer's Hello, which an authenticated handshake
        // delivered; UCX parses them. A peer that lies can only hurt its own connection.
        let address = unsafe { WorkerAddress::from_bytes_unchecked(peer_address.to_vec()) };
        let endpoint = worker.connect(&address)?;
        Ok(Self { endpoint, send_prefix, recv_prefix, direct_device })
    }
}

/// The pinned pool staged frames use (created on first use).
fn new_staging_pool() -> Result<PinnedPool, String> {
    PinnedPool::new(
        ferrylink_memory::PinnedPoolConfig::default()
            .with_chunk_size(STAGE_CHUNK)
            .with_region_size(4 * STAGE_DEPTH * STAGE_CHUNK),
    )
    .map_err(|e| e.to_string())
}

/// Pinned bytes the staged one-sided transfers of one context may hold at once.
pub(crate) const TRANSFER_STAGING_MAX_BYTES: usize = 4 << 30;

/// The pinned pool staged one-sided transfers use (created on first use; its regions are
/// mapped as transfers need them, at least 64 MiB each, and kept).
fn new_transfer_staging_pool() -> Result<PinnedPool, String> {
    PinnedPool::new(
        ferrylink_memory::PinnedPoolConfig::default()
            .with_chunk_size(64 << 10)
            .with_region_size(64 << 20)
            .with_initial_regions(0)
            .with_max_bytes(TRANSFER_STAGING_MAX_BYTES),
    )
    .map_err(|e| e.to_string())
}

/// Whether device frames can travel without staging: both sides' UCX handle CUDA memory.
pub(crate) fn direct_device(local_cuda_aware: bool, remote_cuda_aware: bool) -> bool {
    local_cuda_aware && remote_cuda_aware
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_keep_their_fields_apart() {
        let t = tag(0xBEEF, 0x12_3456, 0xABC, 0xDEF);
        assert_eq!(t >> 48, 0xBEEF);
        assert_eq!((t >> 24) & 0xFF_FFFF, 0x12_3456);
        assert_eq!((t >> 12) & 0xFFF, 0xABC);
        assert_eq!(t & 0xFFF, 0xDEF);
        assert_ne!(tag(1, 0, 0, 0), tag(2, 0, 0, 0));
        assert_ne!(tag(1, 1, 0, 0), tag(1, 2, 0, 0));
        assert_eq!(tag(1, 1 << 24, 0, 0), tag(1, 0, 0, 0), "sequence numbers wrap");
    }

    #[test]
    fn staging_chunks_never_exceed_the_tag_space() {
        for len in [1u64, 8 << 20, 1 << 30, 1 << 40] {
            let chunk = stage_chunk(len);
            assert!(chunk >= STAGE_CHUNK as u64);
            assert!(len.div_ceil(chunk) <= MAX_CHUNKS, "{len}");
        }
    }
}
