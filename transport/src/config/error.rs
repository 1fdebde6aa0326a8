//! [`ConfigError`]: a configuration value that could not be used.

use thiserror::Error;

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
