//! What the store fails with: [`SpillError`], and [`Rejected`] for a failed insert.

use std::path::PathBuf;

use ferrylink_memory::serialize::SerializeError;
use ferrylink_memory::Message;
use thiserror::Error;

use crate::tier::Tier;

/// Spill failures.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SpillError {
    /// A tier cannot make room.
    #[error("no room for {requested} bytes in the {tier:?} tier (budget {budget}): {reason}")]
    NoRoom {
        /// The tier.
        tier: Tier,
        /// Bytes asked for.
        requested: usize,
        /// The tier's budget.
        budget: usize,
        /// Why.
        reason: String,
    },
    /// Copying between device and host failed (or CUDA is absent for device frames).
    #[error("serialization failed: {0}")]
    Serialize(#[from] SerializeError),
    /// A file operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A spill file is damaged.
    #[error("corrupt spill file {path}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// A failed insert: the error and the message, handed back.
#[derive(Debug, Error)]
#[error("insert rejected: {error}")]
pub struct Rejected {
    /// Why.
    #[source]
    pub error: SpillError,
    /// The message (device frames may have become host frames).
    pub message: Message,
}
