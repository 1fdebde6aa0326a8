//! `EndpointFlush`: `ucp_ep_flush_nbx` as a pollable request. When it completes, every
//! put and get issued on the endpoint before it has completed at the target too: the
//! moment to send the target its notification.

use std::fmt;
use std::ptr;

use ucx_sys::Status;

use super::endpoint::UcxEndpoint;
use super::error::UcxError;
use super::request::Core;

/// A flush of one endpoint in progress ([`UcxEndpoint::flush`]).
///
/// [`poll`](Self::poll) reports completion (progress the worker between polls; where UCX
/// emulates RMA, as on TCP, the target's worker must progress too: the flush waits for its
/// acknowledgements). Dropping it before completion leaves the request to the worker
/// (a flush cannot be cancelled; it holds no memory of ours).
pub struct EndpointFlush {
    core: Core,
    result: Option<Result<(), Status>>,
}

impl UcxEndpoint {
    /// Starts a flush of this endpoint (`ucp_ep_flush_nbx`): it completes once every
    /// operation issued here before it (puts and gets included) has completed, at the
    /// target too. A put's data is visible at the target once a flush issued after the
    /// put completed (the put's own completion is only local).
    ///
    /// Errors: the endpoint failed ([`UcxError::EndpointFailed`]), or UCX refused.
    pub fn flush(&self) -> Result<EndpointFlush, UcxError> {
        if let Some(status) = self.error() {
            return Err(UcxError::EndpointFailed { status });
        }
        // SAFETY: ucp_request_param_t is plain data; all-zero (no attributes) is valid.
        let param: ucx_sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        // SAFETY: the endpoint is live (borrowed, not closed); param lives across the call.
        let ret = unsafe { self.worker.ucx.ucp_ep_flush_nbx(self.handle, &param) };
        let worker = self.worker.clone();
        if ucx_sys::ptr_is_ptr(ret) {
            return Ok(EndpointFlush { core: Core { worker, request: ret }, result: None });
        }
        let status = ucx_sys::ptr_status(ret);
        if status.is_err() {
            return Err(UcxError::Call { call: "ucp_ep_flush_nbx", status });
        }
        Ok(EndpointFlush { core: Core { worker, request: ptr::null_mut() }, result: Some(Ok(())) })
    }
}

impl EndpointFlush {
    /// `None` while flushing; then `Ok(())`, or the status the flush ended with (an
    /// endpoint that failed meanwhile). Does not progress the worker.
    pub fn poll(&mut self) -> Option<Result<(), Status>> {
        if self.result.is_none() {
            self.result = Some(self.core.completion()?.ok());
        }
        self.result
    }

    /// Whether the flush has completed (successfully or not).
    pub fn is_complete(&mut self) -> bool {
        self.poll().is_some()
    }
}

impl Drop for EndpointFlush {
    fn drop(&mut self) {
        if self.result.is_none() {
            self.core.hand_to_worker(Box::new(()));
        }
    }
}

impl fmt::Debug for EndpointFlush {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndpointFlush").field("result", &self.result).finish_non_exhaustive()
    }
}
