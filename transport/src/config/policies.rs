//! The policies a configuration chooses between: which lane ([`LanePolicy`]), who runs
//! device copies ([`DeviceCopies`]), how a send is ordered after its producer
//! ([`ProducerOrdering`]).

use super::error::ConfigError;

/// Which lane an endpoint may use (`FERRYLINK_TRANSPORT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

/// Who runs the device copies of a native connection (the connecting side's setting holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceCopies {
    /// Each receiver copies what it receives (pull).
    Receiver,
    /// The connecting side runs every copy: it pulls what it receives and pushes what it
    /// sends into buffers the listener provides.
    Connector,
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
