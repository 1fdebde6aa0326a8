//! The one error type of the CUDA layer, and the `CUresult` → `Result` conversion.

use super::probe::{probe, CudaUnavailable};
use cudarc::driver::{result::DriverError, sys};
use thiserror::Error;

/// Raw `CUresult` codes the layer reacts to (plain integers, never enums built from them).
pub mod codes {
    /// `CUDA_SUCCESS`.
    pub const SUCCESS: i32 = 0;
    /// `CUDA_ERROR_INVALID_VALUE`.
    pub const INVALID_VALUE: i32 = 1;
    /// `CUDA_ERROR_NOT_READY` (an event or stream query that has not completed).
    pub const NOT_READY: i32 = 600;
    /// `CUDA_ERROR_ALREADY_MAPPED`.
    pub const ALREADY_MAPPED: i32 = 208;
    /// `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`.
    pub const PEER_ACCESS_ALREADY_ENABLED: i32 = 704;
    /// `CUDA_ERROR_INVALID_HANDLE`.
    pub const INVALID_HANDLE: i32 = 400;
}

/// An error of the CUDA layer. Never a panic: without a driver every entry point answers
/// [`CudaError::Unavailable`].
#[derive(Debug, Clone, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum CudaError {
    /// CUDA cannot be used in this process (no driver library, `cuInit` failed, no device).
    #[error("CUDA is unavailable: {0}")]
    Unavailable(#[from] CudaUnavailable),
    /// A driver call returned an error.
    #[error("{call} failed: {message} (CUresult {code})")]
    Driver {
        /// The driver function (`"cuIpcOpenMemHandle"`).
        call: &'static str,
        /// The raw `CUresult`.
        code: i32,
        /// The driver's description of the code.
        message: String,
    },
    /// A caller passed something the layer refuses before asking the driver.
    #[error("{call}: invalid argument: {reason}")]
    InvalidArgument {
        /// The operation refused.
        call: &'static str,
        /// Why.
        reason: String,
    },
}

impl CudaError {
    /// The raw `CUresult` of a driver error.
    pub fn code(&self) -> Option<i32> {
        match self {
            CudaError::Driver { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether this is a driver error with the given raw code.
    pub fn is_code(&self, code: i32) -> bool {
        self.code() == Some(code)
    }

    pub(crate) fn invalid(call: &'static str, reason: impl Into<String>) -> Self {
        CudaError::InvalidArgument { call, reason: reason.into() }
    }
}

/// Converts a `CUresult` from `call` into a `Result`.
///
/// Only called after a driver function returned, so the library is loaded and
/// `cuGetErrorString` is safe to call.
pub(crate) fn check(call: &'static str, res: sys::CUresult) -> Result<(), CudaError> {
    if res == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(from_result(call, res))
}

/// What a query call (`cuStreamQuery`, `cuEventQuery`) answered: `true` when the work
/// completed, `false` while it runs (`CUDA_ERROR_NOT_READY`), else the error.
pub(crate) fn check_query(call: &'static str, res: sys::CUresult) -> Result<bool, CudaError> {
    match res as i32 {
        codes::SUCCESS => Ok(true),
        codes::NOT_READY => Ok(false),
        _ => Err(from_result(call, res)),
    }
}

pub(crate) fn from_result(call: &'static str, res: sys::CUresult) -> CudaError {
    let err = DriverError(res);
    let message = match err.error_string() {
        Ok(s) => s.to_string_lossy().into_owned(),
        Err(_) => format!("{res:?}"),
    };
    CudaError::Driver { call, code: res as i32, message }
}

pub(crate) fn from_driver(call: &'static str, err: DriverError) -> CudaError {
    from_result(call, err.0)
}

/// Fails with [`CudaError::Unavailable`] unless the driver is loaded and initialised.
/// Every entry point calls this before its first driver call.
pub(crate) fn available() -> Result<(), CudaError> {
    probe().map(|_| ()).map_err(CudaError::Unavailable)
}

/// Shorthand result type of the CUDA layer.
pub type CudaResult<T> = Result<T, CudaError>;
