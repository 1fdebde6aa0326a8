//! `UcxEndpoint`: a connection to a remote worker, with peer error handling.

use std::cell::Cell;
use std::ffi::c_void;
use std::fmt;
use std::ptr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ucx_sys::Status;

use super::error::UcxError;
use super::request::Core;
use super::rkey::EndpointKeys;
use super::worker::{UcxWorker, WorkerAddress, WorkerInner};

/// Source of [`UcxEndpoint`] ids (never reused in a process, unlike handle addresses).
static NEXT_ENDPOINT_ID: AtomicU64 = AtomicU64::new(1);

/// How an endpoint is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseMode {
    /// Complete outstanding operations and say goodbye to the peer (needs the peer to
    /// progress). A failed endpoint is always forced.
    Flush,
    /// Cancel outstanding operations and drop the connection locally at once.
    Force,
}

/// What the error callback writes. Boxed so its address (the callback's `arg`) is stable;
/// kept alive until UCX can no longer call back (the endpoint is closed, or the worker
/// destroyed).
struct EpState {
    failed: Cell<Option<Status>>,
}

/// `ucp_err_handler_cb_t`: records the first failure.
unsafe extern "C" fn on_endpoint_error(arg: *mut c_void, _ep: ucx_sys::ucp_ep_h, status: ucx_sys::ucs_status_t) {
    if arg.is_null() {
        // Never what we registered: nothing to record it in.
        tracing::warn!(status = %Status(status), "UCX endpoint error callback without its argument");
        return;
    }
    // SAFETY: arg (non-null) is the EpState registered with this endpoint, alive until
    // the endpoint is closed or the worker destroyed (see EpState); UCX calls back from
    // progress on the worker's own thread, so the Cell is not shared across threads.
    let state = unsafe { &*(arg as *const EpState) };
    let status = Status(status);
    tracing::debug!(%status, "UCX endpoint failed");
    if state.failed.get().is_none() {
        state.failed.set(Some(status));
    }
}

/// An endpoint to a remote worker, in error-handling mode PEER: when the peer fails,
/// UCX calls back (recorded, see [`error`](Self::error)), completes the endpoint's
/// outstanding requests with an error, and the endpoint can only be closed.
///
/// [`close`](Self::close) returns a pollable [`EndpointClose`]; dropping the endpoint
/// closes it in [`CloseMode::Force`] without blocking (the worker finishes the close
/// during later progress). Closing destroys the [`RemoteKey`](super::RemoteKey)s unpacked
/// for it that no request uses (the rest when their last request is released).
pub struct UcxEndpoint {
    pub(crate) worker: Rc<WorkerInner>,
    /// Null once closed.
    pub(crate) handle: ucx_sys::ucp_ep_h,
    state: Option<Box<EpState>>,
    /// Unique in the process; remote keys name the endpoint they were unpacked for.
    pub(crate) id: u64,
    /// The remote keys unpacked for this endpoint.
    pub(crate) keys: EndpointKeys,
}

impl UcxWorker {
    /// Creates an endpoint to the worker at `address` (connection setup continues during
    /// progress; sends may be posted at once).
    pub fn connect(&self, address: &WorkerAddress) -> Result<UcxEndpoint, UcxError> {
        let worker = self.inner.clone();
        let state = Box::new(EpState { failed: Cell::new(None) });
        // SAFETY: ucp_ep_params_t is plain data; all-zero is valid and only the fields in
        // field_mask are read.
        let mut params: ucx_sys::ucp_ep_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = (ucx_sys::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS
            | ucx_sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
            | ucx_sys::UCP_EP_PARAM_FIELD_ERR_HANDLER) as u64;
        params.address = address.as_bytes().as_ptr().cast();
        params.err_mode = ucx_sys::UCP_ERR_HANDLING_MODE_PEER;
        params.err_handler.cb = Some(on_endpoint_error);
        params.err_handler.arg = (&*state as *const EpState).cast_mut().cast();
        let mut handle = ptr::null_mut();
        // SAFETY: live worker; the address bytes are a worker address (WorkerAddress's
        // contract) readable during the call; the callback arg stays valid while UCX may
        // call it (the box moves into the endpoint, its heap address unchanged).
        let status = Status(unsafe { worker.ucx.ucp_ep_create(worker.handle, &params, &mut handle) });
        super::error::check("ucp_ep_create", status)?;
        // A null endpoint would pass for a closed one (and reach UCX in sends): refused.
        // Nothing was created, so the callback state may drop with the error.
        let handle = super::error::non_null("ucp_ep_create", handle)?;
        let id = NEXT_ENDPOINT_ID.fetch_add(1, Ordering::Relaxed);
        Ok(UcxEndpoint { worker, handle, state: Some(state), id, keys: EndpointKeys::default() })
    }
}

impl UcxEndpoint {
    /// The failure the error callback reported, if any (progress the worker to learn of
    /// new ones). A failed endpoint accepts no new sends.
    pub fn error(&self) -> Option<Status> {
        self.state.as_ref().and_then(|s| s.failed.get())
    }

    /// Starts closing the endpoint with `ucp_ep_close_nbx` (forced anyway if the
    /// endpoint has failed). Never blocks: poll the result while progressing the worker.
    pub fn close(mut self, mode: CloseMode) -> EndpointClose {
        self.start_close(mode)
    }

    fn start_close(&mut self, mode: CloseMode) -> EndpointClose {
        // UCX wants keys destroyed before their endpoint: those no request uses go now.
        self.keys.release_idle_keys();
        let worker = self.worker.clone();
        let state = self.state.take();
        if self.handle.is_null() {
            return EndpointClose { core: Core { worker, request: ptr::null_mut() }, result: Some(Ok(())), state };
        }
        let failed = state.as_ref().is_some_and(|s| s.failed.get().is_some());
        let force = mode == CloseMode::Force || failed;
        // SAFETY: ucp_request_param_t is plain data; all-zero is valid, only masked
        // fields are read.
        let mut param: ucx_sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        param.op_attr_mask = ucx_sys::UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = if force { ucx_sys::UCP_EP_CLOSE_FLAG_FORCE } else { 0 };
        // SAFETY: live endpoint, closed exactly once (handle nulled right after).
        let ret = unsafe { worker.ucx.ucp_ep_close_nbx(self.handle, &param) };
        self.handle = ptr::null_mut();
        if ucx_sys::ptr_is_ptr(ret) {
            EndpointClose { core: Core { worker, request: ret }, result: None, state }
        } else {
            let status = ucx_sys::ptr_status(ret);
            // Done: UCX will not call back any more, the state may go.
            EndpointClose { core: Core { worker, request: ptr::null_mut() }, result: Some(status.ok()), state: None }
        }
    }

    /// The raw endpoint, for calls this layer does not wrap. Null once closed.
    pub fn as_raw(&self) -> ucx_sys::ucp_ep_h {
        self.handle
    }
}

impl Drop for UcxEndpoint {
    fn drop(&mut self) {
        if !self.handle.is_null() {
            // Dropping the EndpointClose hands an unfinished close to the worker.
            drop(self.start_close(CloseMode::Force));
        }
    }
}

/// A close in progress ([`UcxEndpoint::close`]). Dropping it before completion leaves the
/// close to the worker (finished during its progress, or with the worker).
pub struct EndpointClose {
    core: Core,
    result: Option<Result<(), Status>>,
    /// The error callback's state, alive until the close completes.
    state: Option<Box<EpState>>,
}

impl EndpointClose {
    /// `None` while closing; then `Ok(())`, or the status the close ended with (a flush
    /// to a dead peer fails; the endpoint is released either way). Does not progress.
    pub fn poll(&mut self) -> Option<Result<(), Status>> {
        if self.result.is_none() {
            let status = self.core.completion()?;
            self.state = None;
            self.result = Some(status.ok());
        }
        self.result
    }

    /// Progresses the worker until the close completes or `timeout` passes (for callers
    /// with nothing else to do; the peer must be progressing for a flush).
    pub fn wait(mut self, timeout: Duration) -> Result<(), UcxError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(result) = self.poll() {
                return result.map_err(|status| UcxError::Call { call: "ucp_ep_close_nbx", status });
            }
            if Instant::now() >= deadline {
                return Err(UcxError::TimedOut { what: "ucp_ep_close_nbx", timeout });
            }
            self.core.worker.progress();
        }
    }
}

impl Drop for EndpointClose {
    fn drop(&mut self) {
        if self.result.is_none() {
            let state = self.state.take();
            self.core.hand_to_worker(Box::new(state));
        }
    }
}

impl fmt::Debug for EndpointClose {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndpointClose").field("result", &self.result).finish_non_exhaustive()
    }
}

impl fmt::Debug for UcxEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UcxEndpoint").field("error", &self.error()).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod callback_tests {
    use super::*;

    #[test]
    fn the_error_callback_ignores_a_null_argument_and_records_the_first_failure() {
        // SAFETY: a null argument is handled before anything is dereferenced.
        unsafe { on_endpoint_error(ptr::null_mut(), ptr::null_mut(), Status::ERR_IO_ERROR.raw()) };
        let state = EpState { failed: Cell::new(None) };
        let arg = (&state as *const EpState).cast_mut().cast();
        // SAFETY: `arg` is a live EpState used on this thread only.
        unsafe { on_endpoint_error(arg, ptr::null_mut(), Status::ERR_CONNECTION_RESET.raw()) };
        // SAFETY: as above.
        unsafe { on_endpoint_error(arg, ptr::null_mut(), Status::ERR_IO_ERROR.raw()) };
        assert_eq!(state.failed.get(), Some(Status::ERR_CONNECTION_RESET));
    }
}
