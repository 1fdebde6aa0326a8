//! The policies two sides agree on in the handshake: which lane they may use
//! ([`LanePolicy`], `FERRYLINK_TRANSPORT`) and who runs a native connection's device
//! copies ([`DeviceCopies`], `FERRYLINK_DEVICE_COPIES`), with the error of a policy
//! that cannot be parsed ([`ConfigError`]). The transport's configuration holds them.

use thiserror::Error;

/// A configuration value that could not be used.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
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
