//! Errors of CUDA IPC export/import.

use ferrylink_memory::cuda::CudaError;
use thiserror::Error;

/// Why an export, import or copy failed.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum CudaIpcError {
    /// The CUDA layer failed (or CUDA is unavailable).
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// A descriptor from a peer does not hold together (untrusted input).
    #[error("invalid IPC descriptor: {0}")]
    InvalidDescriptor(String),
    /// The buffer's allocation cannot be exported with legacy CUDA IPC (bounce it first:
    /// `ferrylink_memory::cuda::ensure_exportable`).
    #[error("device buffer is not IPC-exportable: {0}")]
    NotExportable(String),
    /// The peer's mappings were closed (`close_peer`) and leases are still outstanding.
    #[error("mappings of peer {pid} are being closed")]
    PeerClosed {
        /// The exporter's pid.
        pid: u32,
    },
    /// A copy request does not fit its source or destination.
    #[error("invalid copy: {0}")]
    InvalidCopy(String),
}
