//! [`Config`] and [`CudaConfig`]: the settings of a context and their defaults.

use super::policies::ProducerOrdering;
use ferrylink_memory::cuda;
use ferrylink_proto::policy::{DeviceCopies, LanePolicy};
use std::path::PathBuf;
use std::time::Duration;

/// Limits and policies of a [`crate::Context`]. `Config::default()` holds the defaults;
/// [`Config::from_env`] applies the `FERRYLINK_*` variables on top, and the `with_*`
/// methods change one setting each (`Config::default().with_request_timeout(…)`).
/// Fields may be added: outside this crate a config is not written as a struct literal.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// Lane policy (`FERRYLINK_TRANSPORT`).
    pub lane_policy: LanePolicy,
    /// The longest any blocking call waits (`FERRYLINK_TIMEOUT_MS`): a request that has not
    /// completed by then ends with a timeout error, and a peer that has not acknowledged a
    /// transfer by then is treated as dead.
    pub request_timeout: Duration,
    /// After any activity, the progress thread and waiting callers spin this long
    /// before they sleep (`FERRYLINK_BUSY_POLL_US`; 0 turns it off): a reply that comes
    /// within it is seen without a thread wake-up, which is most of a small message's
    /// latency. Spinning never lasts longer than this after the last activity. The
    /// default (2 ms) covers a 1 GB device copy on the H200 (0.5 ms): with 200 µs, both
    /// sides slept through each copy and woke 20–40 µs late (a 1 GB round trip lost
    /// ~150 µs that way).
    pub busy_poll: Duration,
    /// Opt-in (`FERRYLINK_LINGER_US`; 0, the default, turns it off): one-sided copies of
    /// up to 4 KiB go to a copy kernel that stays on the GPU this long after its last
    /// copy, polling pinned host memory for the next, instead of a launch each (about
    /// 4 µs of host time per copy on the H200). While it stays it holds a
    /// multiprocessor, and anything that synchronises the whole context
    /// (`cuCtxSynchronize`, `cudaFree`) waits until it left: at most this long after the
    /// last copy (docs/decisions/0030-lingering-kernel-opt-in.md).
    pub linger_copies: Duration,
    /// The longest a connect (including the handshake) takes.
    pub connect_timeout: Duration,
    /// Largest user header accepted in a message.
    pub max_header_bytes: usize,
    /// Most frames accepted in one message.
    pub max_frames: usize,
    /// Largest frame accepted.
    pub max_frame_len: u64,
    /// Most payload bytes of one message a receiver lands; a larger message is refused
    /// (the sender's request fails, the connection stays).
    pub max_message_bytes: u64,
    /// Host frames up to this size travel inside the control message.
    pub inline_threshold: usize,
    /// Size of each shared staging region a sender creates.
    pub staging_region_bytes: usize,
    /// Most staging memory one endpoint may hold; sends wait for acks beyond it.
    pub staging_max_bytes: usize,
    /// Most shared memory one endpoint keeps for landing received host frames (reused
    /// once the user drops what it received); beyond it frames land in plain vectors.
    pub landing_max_bytes: usize,
    /// Most bytes a receiver lands ahead of the user's `recv` calls; beyond it, transfers
    /// wait (unacknowledged) until the user receives.
    pub unexpected_max_bytes: usize,
    /// Largest shared region a receiver maps for one peer.
    pub max_region_bytes: u64,
    /// Who runs the copies of device frames on the native lane
    /// (`FERRYLINK_DEVICE_COPIES=receiver|connector`); the connecting side's setting
    /// holds for a connection.
    pub device_copies: DeviceCopies,
    /// How a device send waits for its producer's GPU work
    /// (`FERRYLINK_PRODUCER_ORDERING=event|context`).
    pub producer_ordering: ProducerOrdering,
    /// Connector-copies mode: the listener offers buffers ahead of time for a next
    /// device message of at most this many bytes, shaped like the last one
    /// (`FERRYLINK_PUSH_OFFER_MAX_BYTES`, 0 turns offers off; see `engine/offers.rs`).
    /// It holds that much device memory per connection.
    pub push_offer_max_bytes: u64,
    /// The device received device frames land on (`FERRYLINK_RECV_DEVICE`); `None`: the
    /// device they came from when this process sees it, else device 0.
    pub recv_device: Option<usize>,
    /// Peers' device memory kept mapped (CUDA IPC) at most; unused mappings beyond it are
    /// closed, least recently used first.
    pub max_mapped_device_bytes: u64,
    /// Control messages of a Unix-socket connection travel through shared-memory rings of
    /// this many bytes per direction (`FERRYLINK_CONTROL_RING_BYTES`: 0 turns them off,
    /// else a power of two from 4 KiB to 64 MiB); the connecting side offers them, the
    /// accepting side maps them unless its own setting is 0. See `engine/channel.rs`.
    pub control_ring_bytes: usize,
    /// Process-wide CUDA settings (`FERRYLINK_COPY_KERNEL_MAX_BYTES`,
    /// `FERRYLINK_DISABLE_CUDA`), applied when a context is built.
    pub cuda: CudaConfig,
    /// The `libucp` the UCX lane loads (`FERRYLINK_UCX_LIB`); `None`:
    /// [`ucx_sys::DEFAULT_LIBRARY`].
    pub ucx_library: Option<PathBuf>,
    /// The UCX lane carries one-sided transfers (`FERRYLINK_UCX_RMA=1`): its context is
    /// made with UCX's RMA feature, and registrations are mapped for peers on import.
    /// Off by default: where UCX emulates RMA (TCP), the target's UCX writes and reads
    /// wherever a peer's message says, whatever was registered, so turning it on trusts
    /// every UCX peer with this process's memory (docs/decisions/0023-ucx-one-sided-keys-and-rma-opt-in.md).
    pub ucx_rma: bool,
    /// One-sided transfers over UCX go through pinned host memory on both sides whatever
    /// the memory (`FERRYLINK_UCX_STAGED=1`), as device memory does anyway unless both
    /// sides' UCX is CUDA-aware: the owner grants its registrations staged and runs every
    /// transfer on them (docs/decisions/0024-one-sided-connector-copies-and-refusals.md).
    /// For testing the staged path, or a CUDA-aware UCX whose CUDA transports misbehave.
    pub ucx_staged: bool,
}

/// The settings of the CUDA layer (`ferrylink-memory`), which are process-wide: building
/// a [`crate::Context`] applies its config's ([`CudaConfig::apply`]), so the last context
/// built decides the copy-kernel limit, and one with `disable` turns CUDA off for good.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CudaConfig {
    /// Same-device copies up to this many bytes run as the copy kernel, larger ones on the
    /// copy engine; 0: always the copy engine (`FERRYLINK_COPY_KERNEL_MAX_BYTES`, see
    /// [`cuda::copy_kernel`]).
    pub copy_kernel_max_bytes: usize,
    /// The process never loads the CUDA driver and behaves as on a machine without CUDA
    /// (`FERRYLINK_DISABLE_CUDA=1`). Takes effect only if nothing in the process used CUDA
    /// before the context was built (else it is logged and ignored); `false` never turns
    /// CUDA back on.
    pub disable: bool,
}

impl Default for CudaConfig {
    fn default() -> Self {
        Self { copy_kernel_max_bytes: cuda::copy_kernel::DEFAULT_KERNEL_COPY_LIMIT, disable: false }
    }
}

impl CudaConfig {
    /// Sets the CUDA layer's process-wide switches from this config: the copy-kernel
    /// limit ([`cuda::copy_kernel::set_max_bytes`]) and, when `disable`, [`cuda::disable`].
    pub fn apply(&self) {
        cuda::copy_kernel::set_max_bytes(self.copy_kernel_max_bytes);
        if self.disable && !cuda::disable() {
            tracing::warn!("FERRYLINK_DISABLE_CUDA=1 is ignored: this process already uses CUDA");
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            lane_policy: LanePolicy::Auto,
            request_timeout: Duration::from_secs(60),
            busy_poll: Duration::from_millis(2),
            linger_copies: Duration::ZERO,
            connect_timeout: Duration::from_secs(10),
            max_header_bytes: 1 << 20,
            max_frames: 4096,
            max_frame_len: 1 << 40,
            max_message_bytes: 32 << 30,
            inline_threshold: 8 << 10,
            staging_region_bytes: 64 << 20,
            staging_max_bytes: 2 << 30,
            unexpected_max_bytes: 1 << 30,
            landing_max_bytes: 4 << 30,
            max_region_bytes: 1 << 40,
            device_copies: DeviceCopies::Connector,
            producer_ordering: ProducerOrdering::LegacyStreamEvent,
            push_offer_max_bytes: 64 << 20,
            recv_device: None,
            max_mapped_device_bytes: 64 << 30,
            control_ring_bytes: 1 << 20,
            cuda: CudaConfig::default(),
            ucx_library: None,
            ucx_rma: false,
            ucx_staged: false,
        }
    }
}
