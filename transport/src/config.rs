//! Run-time configuration, read once from the environment into a [`Config`].

use std::time::Duration;
use thiserror::Error;

/// Which lane an endpoint may use (`FERRYLINK_TRANSPORT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, bincode::Encode, bincode::Decode)]
pub enum LanePolicy {
    /// Native when both ends share a host and user, UCX otherwise.
    Auto,
    /// Only the native lane; an error when it cannot work.
    Native,
    /// Only the UCX lane; an error when it cannot work.
    Ucx,
}

impl std::str::FromStr for LanePolicy {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(Self::Auto),
            "native" => Ok(Self::Native),
            "ucx" => Ok(Self::Ucx),
            other => Err(ConfigError::Invalid {
                variable: "FERRYLINK_TRANSPORT",
                value: other.to_owned(),
                expected: "auto, native or ucx",
            }),
        }
    }
}

impl std::fmt::Display for LanePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Native => "native",
            Self::Ucx => "ucx",
        })
    }
}

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

/// A configuration value that could not be used.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// An environment variable holds something unusable.
    #[error("{variable}={value:?} is not valid: expected {expected}")]
    Invalid {
        /// The variable.
        variable: &'static str,
        /// What it held.
        value: String,
        /// What it may hold.
        expected: &'static str,
    },
}

/// Limits and policies of a [`crate::Context`]. `Config::default()` holds the defaults;
/// [`Config::from_env`] applies the `FERRYLINK_*` variables on top.
#[derive(Debug, Clone)]
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
    pub device_copies: crate::wire::DeviceCopies,
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
}

impl Default for Config {
    fn default() -> Self {
        Self {
            lane_policy: LanePolicy::Auto,
            request_timeout: Duration::from_secs(60),
            busy_poll: Duration::from_millis(2),
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
            device_copies: crate::wire::DeviceCopies::Connector,
            producer_ordering: ProducerOrdering::LegacyStreamEvent,
            push_offer_max_bytes: 64 << 20,
            recv_device: None,
            max_mapped_device_bytes: 64 << 30,
            control_ring_bytes: 1 << 20,
        }
    }
}

impl Config {
    /// The defaults with `FERRYLINK_TRANSPORT` and `FERRYLINK_TIMEOUT_MS` applied.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// As [`Config::from_env`], reading variables through `lookup` (testable).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut config = Self::default();
        if let Some(v) = lookup("FERRYLINK_TRANSPORT") {
            config.lane_policy = v.parse()?;
        }
        let number = |v: &str| v.parse::<u64>().ok();
        if let Some(ms) = read_var(&lookup, "FERRYLINK_TIMEOUT_MS", "a positive number of milliseconds", |v| {
            number(v).filter(|&ms| ms > 0)
        })? {
            config.request_timeout = Duration::from_millis(ms);
        }
        if let Some(copies) = read_var(&lookup, "FERRYLINK_DEVICE_COPIES", "receiver or connector", |v| {
            match v.to_ascii_lowercase().as_str() {
                "receiver" => Some(crate::wire::DeviceCopies::Receiver),
                "connector" => Some(crate::wire::DeviceCopies::Connector),
                _ => None,
            }
        })? {
            config.device_copies = copies;
        }
        if let Some(ordering) = read_var(&lookup, "FERRYLINK_PRODUCER_ORDERING", "event or context", |v| {
            match v.to_ascii_lowercase().as_str() {
                "event" => Some(ProducerOrdering::LegacyStreamEvent),
                "context" => Some(ProducerOrdering::ContextSynchronize),
                _ => None,
            }
        })? {
            config.producer_ordering = ordering;
        }
        if let Some(ordinal) =
            read_var(&lookup, "FERRYLINK_RECV_DEVICE", "a CUDA device ordinal", |v| v.parse::<usize>().ok())?
        {
            config.recv_device = Some(ordinal);
        }
        if let Some(bytes) = read_var(&lookup, "FERRYLINK_PUSH_OFFER_MAX_BYTES", "a number of bytes", number)? {
            config.push_offer_max_bytes = bytes;
        }
        if let Some(us) = read_var(&lookup, "FERRYLINK_BUSY_POLL_US", "a number of microseconds", number)? {
            config.busy_poll = Duration::from_micros(us);
        }
        let ring_size = |b: usize| b == 0 || ferrylink_ipc::control_ring::is_valid_ring_size(b as u64);
        if let Some(bytes) =
            read_var(&lookup, "FERRYLINK_CONTROL_RING_BYTES", "0, or a power of two from 4096 to 67108864", |v| {
                v.parse::<usize>().ok().filter(|&b| ring_size(b))
            })?
        {
            config.control_ring_bytes = bytes;
        }
        Ok(config)
    }
}

/// Variable `variable` through `lookup`, parsed (trimmed) by `parse`: `None` when unset, an
/// error naming `expected` when it does not parse.
fn read_var<T>(
    lookup: &impl Fn(&str) -> Option<String>,
    variable: &'static str,
    expected: &'static str,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<Option<T>, ConfigError> {
    let Some(value) = lookup(variable) else { return Ok(None) };
    match parse(value.trim()) {
        Some(parsed) => Ok(Some(parsed)),
        None => Err(ConfigError::Invalid { variable, value, expected }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_parses_case_insensitively_and_rejects_others() {
        assert_eq!("AUTO".parse::<LanePolicy>().unwrap(), LanePolicy::Auto);
        assert_eq!("native".parse::<LanePolicy>().unwrap(), LanePolicy::Native);
        assert_eq!(" ucx ".parse::<LanePolicy>().unwrap(), LanePolicy::Ucx);
        let err = "tcp".parse::<LanePolicy>().unwrap_err();
        assert!(err.to_string().contains("FERRYLINK_TRANSPORT"), "{err}");
    }

    #[test]
    fn env_values_apply_and_bad_ones_are_errors() {
        let c = Config::from_lookup(|k| match k {
            "FERRYLINK_TRANSPORT" => Some("native".into()),
            "FERRYLINK_TIMEOUT_MS" => Some("1500".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.lane_policy, LanePolicy::Native);
        assert_eq!(c.request_timeout, Duration::from_millis(1500));
        assert!(Config::from_lookup(|k| (k == "FERRYLINK_TIMEOUT_MS").then(|| "0".into())).is_err());
        let c = Config::from_lookup(|k| (k == "FERRYLINK_BUSY_POLL_US").then(|| "0".into())).unwrap();
        assert_eq!(c.busy_poll, Duration::ZERO);
        assert!(Config::from_lookup(|k| (k == "FERRYLINK_BUSY_POLL_US").then(|| "x".into())).is_err());
        assert_eq!(Config::from_lookup(|_| None).unwrap().lane_policy, LanePolicy::Auto);
        let c = Config::from_lookup(|k| (k == "FERRYLINK_PUSH_OFFER_MAX_BYTES").then(|| "0".into())).unwrap();
        assert_eq!(c.push_offer_max_bytes, 0);
        let c = Config::from_lookup(|k| (k == "FERRYLINK_RECV_DEVICE").then(|| "1".into())).unwrap();
        assert_eq!(c.recv_device, Some(1));
        assert!(Config::from_lookup(|k| (k == "FERRYLINK_RECV_DEVICE").then(|| "gpu1".into())).is_err());
        assert!(Config::from_lookup(|k| (k == "FERRYLINK_PUSH_OFFER_MAX_BYTES").then(|| "1MB".into())).is_err());
        let c = Config::from_lookup(|k| (k == "FERRYLINK_PRODUCER_ORDERING").then(|| "context".into())).unwrap();
        assert_eq!(c.producer_ordering, ProducerOrdering::ContextSynchronize);
        assert_eq!(Config::default().producer_ordering, ProducerOrdering::LegacyStreamEvent);
        assert!(Config::from_lookup(|k| (k == "FERRYLINK_PRODUCER_ORDERING").then(|| "sync".into())).is_err());
        let ring = |v: &str| Config::from_lookup(|k| (k == "FERRYLINK_CONTROL_RING_BYTES").then(|| v.into()));
        assert_eq!(ring("0").unwrap().control_ring_bytes, 0);
        assert_eq!(ring("65536").unwrap().control_ring_bytes, 65536);
        assert!(ring("5000").is_err() && ring("2048").is_err() && ring("1MiB").is_err());
    }
}
