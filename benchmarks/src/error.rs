//! What a benchmark binary can fail with, and the exit code each failure gives.

use thiserror::Error;

/// A benchmark failure. Binaries print it (`error: …`) and exit with [`BenchError::exit_code`].
#[derive(Debug, Error)]
pub enum BenchError {
    /// The options make no sense (bad size, device out of range, conflicting flags).
    #[error("{0}")]
    Usage(String),
    /// This machine or build cannot run what was asked (no GPU, no TCP lane yet).
    #[error("{0}")]
    Unsupported(String),
    /// The transport failed.
    #[error("transport: {0}")]
    Transport(String),
    /// CUDA failed.
    #[error("CUDA: {0}")]
    Cuda(String),
    /// The server process failed (its stderr is in the message).
    #[error("server process: {0}")]
    Server(String),
    /// Something else failed (I/O, spill store, serialization).
    #[error("{0}")]
    Other(String),
}

impl BenchError {
    /// 2 for usage errors and unsupported requests (nothing was measured), 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            BenchError::Usage(_) | BenchError::Unsupported(_) => 2,
            _ => 1,
        }
    }
}

impl From<ferrylink::memory::cuda::CudaError> for BenchError {
    fn from(e: ferrylink::memory::cuda::CudaError) -> Self {
        BenchError::Cuda(e.to_string())
    }
}

impl From<crate::size::SizeError> for BenchError {
    fn from(e: crate::size::SizeError) -> Self {
        BenchError::Usage(e.to_string())
    }
}

impl From<std::io::Error> for BenchError {
    fn from(e: std::io::Error) -> Self {
        BenchError::Other(e.to_string())
    }
}
