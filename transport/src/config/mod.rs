//! Run-time configuration: [`Config`], its defaults, and reading it once from the
//! environment. Every `FERRYLINK_*` variable the library reads is a row of
//! [`vars::VARIABLES`] (name, accepted values, default, meaning); [`Config::from_lookup`]
//! is the one place that reads them, through that table, and a value it cannot use is a
//! [`ConfigError::Invalid`] naming the variable. No other crate of ferrylink reads the
//! environment: the settings that belong to them ([`CudaConfig`], the UCX library) are
//! passed on when a [`crate::Context`] is built. A config is built from the defaults (or
//! the environment) with its `with_*` methods (`builder.rs`).

mod builder;
mod policies;
mod values;
mod vars;

#[cfg(test)]
mod tests;

pub use ferrylink_proto::policy::{ConfigError, DeviceCopies, LanePolicy};
pub use policies::ProducerOrdering;
pub use values::{Config, CudaConfig};
pub use vars::{variable, Variable, UNSET, VARIABLES};

use ferrylink_proto::connection::Settings;
use ferrylink_proto::wire::Limits;

impl Config {
    /// The defaults with the environment's `FERRYLINK_*` variables applied: every one of
    /// [`VARIABLES`] (the table says what each accepts and defaults to, as does README's
    /// "Environment variables"): `FERRYLINK_TRANSPORT`, `FERRYLINK_TIMEOUT_MS`,
    /// `FERRYLINK_BUSY_POLL_US`, `FERRYLINK_LINGER_US`, `FERRYLINK_DEVICE_COPIES`,
    /// `FERRYLINK_PRODUCER_ORDERING`,
    /// `FERRYLINK_PUSH_OFFER_MAX_BYTES`, `FERRYLINK_RECV_DEVICE`,
    /// `FERRYLINK_CONTROL_RING_BYTES`, `FERRYLINK_COPY_KERNEL_MAX_BYTES`,
    /// `FERRYLINK_DISABLE_CUDA`, `FERRYLINK_UCX_LIB`, `FERRYLINK_UCX_RMA` and `FERRYLINK_UCX_STAGED`. A set variable whose value is not
    /// usable (including one that is not UTF-8) is a [`ConfigError::Invalid`] naming it.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| match std::env::var(name) {
            Ok(value) => Some(value),
            Err(std::env::VarError::NotPresent) => None,
            // Lossy: no variable accepts the replacement character, so this is an error.
            Err(std::env::VarError::NotUnicode(value)) => Some(value.to_string_lossy().into_owned()),
        })
    }

    /// As [`Config::from_env`], reading variables through `lookup` (testable): each of
    /// [`VARIABLES`] that `lookup` answers is applied to the defaults, its value trimmed.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut config = Self::default();
        for variable in VARIABLES {
            let Some(value) = lookup(variable.name) else { continue };
            if (variable.apply)(&mut config, value.trim()).is_none() {
                return Err(ConfigError::Invalid { variable: variable.name, value, expected: variable.expected });
            }
        }
        Ok(config)
    }

    /// What the protocol core needs of this config.
    pub(crate) fn core_settings(&self) -> Settings {
        Settings {
            request_timeout: self.request_timeout,
            connect_timeout: self.connect_timeout,
            unexpected_max_bytes: self.unexpected_max_bytes,
            push_offer_max_bytes: self.push_offer_max_bytes,
            limits: self.wire_limits(),
        }
    }

    /// What a decoder accepts under this config (the peer enforces the same on what this
    /// side sends).
    pub(crate) fn wire_limits(&self) -> Limits {
        Limits {
            max_header_bytes: self.max_header_bytes,
            max_frames: self.max_frames,
            max_frame_len: self.max_frame_len,
            inline_threshold: self.inline_threshold,
        }
    }

    /// The UCX context settings of this config (the library to load, RMA or not).
    pub(crate) fn ucx_config(&self) -> ferrylink_ucx::UcxConfig {
        let config = ferrylink_ucx::UcxConfig::new().rma(self.ucx_rma);
        match &self.ucx_library {
            Some(path) => config.library_path(path),
            None => config,
        }
    }
}
