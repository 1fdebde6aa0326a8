//! The error type of the UCX layer.

use std::fmt;
use std::time::Duration;

use ucx_sys::{LoadError, Status};

use super::region_key::KeyFault;

/// What went wrong in a UCX call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UcxError {
    /// `libucp` could not be loaded (absent, unusable or too old).
    #[error("UCX unavailable: {0}")]
    Unavailable(#[from] LoadError),
    /// A ucp call returned an error status.
    #[error("{call} failed: {status}")]
    Call {
        /// The ucp function.
        call: &'static str,
        /// What it returned.
        status: Status,
    },
    /// `ucp_config_modify` rejected an option.
    #[error("UCX option {name}={value} rejected: {status}")]
    Config {
        /// Option name, without the `UCX_` prefix.
        name: String,
        /// The value given.
        value: String,
        /// What `ucp_config_modify` returned.
        status: Status,
    },
    /// The endpoint's peer failed (reported by the error callback); the endpoint can only
    /// be closed now.
    #[error("UCX endpoint failed: {status}")]
    EndpointFailed {
        /// The status the error callback reported.
        status: Status,
    },
    /// A buffer of CUDA memory was handed to a UCX that cannot access CUDA memory
    /// (stage it through host memory instead).
    #[error("this UCX cannot access CUDA memory (not built with CUDA support)")]
    CudaUnsupported,
    /// UCX answered a call with success but no usable result: a null handle from
    /// `ucp_init`, `ucp_config_read`, `ucp_worker_create` or `ucp_ep_create`, a null or
    /// empty worker address, a negative event fd (as some releases report for a
    /// busy-poll-only context).
    #[error("{call} succeeded but returned no usable value ({what})")]
    NoResult {
        /// The call.
        call: &'static str,
        /// What came back.
        what: String,
    },
    /// A bounded wait ran out of time.
    #[error("timed out after {timeout:?} waiting for {what}")]
    TimedOut {
        /// What was waited for.
        what: &'static str,
        /// The bound.
        timeout: Duration,
    },
    /// A string given to UCX contained a NUL byte.
    #[error("{what} contains a NUL byte")]
    InteriorNul {
        /// Which string.
        what: &'static str,
    },
    /// The context was created without UCX's RMA feature ([`UcxConfig::rma`](super::UcxConfig::rma)).
    #[error("this UCX context has no RMA (create it with UcxConfig::rma(true))")]
    RmaDisabled,
    /// A registration of no bytes (UCX registers none).
    #[error("an empty range cannot be registered")]
    EmptyRegistration,
    /// A [`RegionKey`](super::RegionKey) (bytes from a peer) that does not describe a
    /// region: refused before UCX parses it.
    #[error("invalid remote key: {0}")]
    InvalidRemoteKey(#[from] KeyFault),
    /// A [`RemoteKey`](super::RemoteKey) used with an endpoint other than the one it was
    /// unpacked for (UCX keys are per endpoint), or after that endpoint closed.
    #[error("the remote key belongs to another endpoint (or to one since closed)")]
    ForeignRemoteKey,
    /// A span of a put or get that does not lie inside the memory it names: the local
    /// buffer, or the remote region its key describes. Nothing was transferred.
    #[error("{side} span of {len} bytes at offset {offset} lies outside the {bound}-byte {side} range")]
    OutOfBounds {
        /// Which memory.
        side: SpanSide,
        /// Offset of the span in that memory.
        offset: u64,
        /// Length of the span.
        len: u64,
        /// Size of that memory.
        bound: u64,
    },
}

/// Which memory an [`UcxError::OutOfBounds`] span fell outside of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanSide {
    /// The request's local buffer.
    Local,
    /// The remote region (the range its key describes).
    Remote,
}

impl fmt::Display for SpanSide {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SpanSide::Local => "local",
            SpanSide::Remote => "remote",
        })
    }
}

impl UcxError {
    /// The UCX status behind the error, when there is one.
    pub fn status(&self) -> Option<Status> {
        match self {
            UcxError::Call { status, .. } | UcxError::Config { status, .. } | UcxError::EndpointFailed { status } => {
                Some(*status)
            }
            _ => None,
        }
    }
}

/// Turns a ucp status into `Ok(())` or [`UcxError::Call`] naming `call`.
pub(crate) fn check(call: &'static str, status: Status) -> Result<(), UcxError> {
    status.ok().map_err(|status| UcxError::Call { call, status })
}

/// `handle`, written by `call` which reported success; [`UcxError::NoResult`] when it is
/// null (UCX wrote nothing), so a null handle is never kept as if it were live.
pub(crate) fn non_null<T>(call: &'static str, handle: *mut T) -> Result<*mut T, UcxError> {
    if handle.is_null() {
        return Err(UcxError::NoResult { call, what: "a null handle".into() });
    }
    Ok(handle)
}

/// A submission that UCX (or a check before it) refused: the error, and the buffer that
/// was handed in, given back.
pub struct Rejected<B> {
    /// Why.
    pub error: UcxError,
    /// The buffer, untouched by UCX.
    pub buf: B,
}

impl<B> Rejected<B> {
    /// Drops the buffer, keeping the error.
    pub fn into_error(self) -> UcxError {
        self.error
    }
}

impl<B> fmt::Debug for Rejected<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rejected").field("error", &self.error).finish_non_exhaustive()
    }
}

impl<B> fmt::Display for Rejected<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl<B> std::error::Error for Rejected<B> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<B> From<Rejected<B>> for UcxError {
    fn from(rejected: Rejected<B>) -> Self {
        rejected.error
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_null_handle_after_success_is_no_result() {
        let err = non_null("ucp_worker_create", std::ptr::null_mut::<u8>()).unwrap_err();
        assert!(matches!(err, UcxError::NoResult { call: "ucp_worker_create", .. }), "{err:?}");
        assert!(err.to_string().contains("ucp_worker_create succeeded but returned no usable value"), "{err}");
        let mut x = 0u8;
        assert_eq!(non_null("ucp_ep_create", &mut x as *mut u8).unwrap(), &mut x as *mut u8);
    }
}
