//! What serialization fails with: [`SerializeError`], and [`Failure`], which hands the
//! input back untouched.

use std::fmt;

use thiserror::Error;

/// Serialization failures.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SerializeError {
    /// A device frame needs CUDA and CUDA is not usable in this process.
    #[error("device frames need CUDA: {0}")]
    Unsupported(String),
    /// A CUDA driver call failed.
    #[error("CUDA error: {0}")]
    Cuda(String),
    /// The device allocator refused.
    #[error("device allocation of {len} bytes on device {device_ordinal} failed: {reason}")]
    DeviceAlloc {
        /// Device asked for.
        device_ordinal: usize,
        /// Bytes asked for.
        len: usize,
        /// Why.
        reason: String,
    },
    /// The message's header or frames do not match the type asked for.
    #[error("message is not a {expected}: {found}")]
    WrongType {
        /// The type asked for.
        expected: &'static str,
        /// What the message looks like.
        found: String,
    },
    /// Frames and their recorded origins disagree, or an allocator returned the wrong size.
    #[error("inconsistent layout: {0}")]
    Layout(String),
}

/// An error plus the value that was handed in, returned untouched.
pub struct Failure<T> {
    /// What went wrong.
    pub error: SerializeError,
    /// The input, intact.
    pub value: T,
}

impl<T> Failure<T> {
    pub(super) fn new(error: SerializeError, value: T) -> Self {
        Self { error, value }
    }
}

impl<T> fmt::Debug for Failure<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Failure").field("error", &self.error).finish_non_exhaustive()
    }
}
impl<T> fmt::Display for Failure<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}
impl<T> std::error::Error for Failure<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}
