//! Tagged send and receive requests (`ucp_tag_send_nbx` / `ucp_tag_recv_nbx`) as RAII
//! types that own their buffer until UCX is done with it.

use std::ffi::c_void;
use std::fmt;
use std::ptr;
use std::rc::Rc;

use ucx_sys::Status;

use super::buffer::{MemoryType, RecvBuf, SendBuf};
use super::endpoint::UcxEndpoint;
use super::error::{Rejected, UcxError};
use super::worker::{UcxWorker, WorkerInner};

/// What a completed receive got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvInfo {
    /// The tag the sender used.
    pub sender_tag: u64,
    /// Bytes received.
    pub length: usize,
}

/// A ucp request (or its immediate result) and the worker it belongs to: what every
/// pollable request of this crate holds (sends, receives, flushes, closes).
pub(crate) struct Core {
    pub(crate) worker: Rc<WorkerInner>,
    /// Live request pointer, or null once complete (or completed immediately).
    pub(crate) request: *mut c_void,
}

impl Core {
    /// Frees a request that has completed. Idempotent.
    fn free(&mut self) {
        if !self.request.is_null() {
            // SAFETY: a live request of this worker, complete, freed exactly once (the
            // pointer is nulled right after).
            unsafe { self.worker.ucx.ucp_request_free(self.request) };
            self.request = ptr::null_mut();
        }
    }

    /// `None` while the request is in progress; then the status it ended with, the
    /// request freed (`UCS_OK` for one already complete). Does not progress the worker.
    pub(crate) fn completion(&mut self) -> Option<Status> {
        if self.request.is_null() {
            return Some(Status::OK);
        }
        // SAFETY: a live request of this worker (non-null: not freed yet).
        let status = Status(unsafe { self.worker.ucx.ucp_request_check_status(self.request) });
        if status.is_in_progress() {
            return None;
        }
        self.free();
        Some(status)
    }

    /// Drop path of a request that is not cancelled (a flush, a close): an incomplete one
    /// goes to the worker with `keep_alive`, which UCX may still need until it completes.
    pub(crate) fn hand_to_worker(&mut self, keep_alive: Box<dyn std::any::Any>) {
        if !self.request.is_null() {
            self.worker.adopt(self.request, keep_alive);
            self.request = ptr::null_mut();
        }
    }

    /// Drop path of an incomplete request: cancel; free now if that completed it, else
    /// hand the request and `keep_alive` (the memory UCX may still use) to the worker.
    fn abandon(&mut self, keep_alive: Box<dyn std::any::Any>) {
        if self.request.is_null() {
            return;
        }
        let ucx = self.worker.ucx;
        // SAFETY: a live, incomplete request of this worker; cancel is a no-op for
        // requests UCX cannot cancel.
        unsafe { ucx.ucp_request_cancel(self.worker.handle, self.request) };
        // SAFETY: still a live request (not freed).
        let status = Status(unsafe { ucx.ucp_request_check_status(self.request) });
        if status.is_in_progress() {
            self.worker.adopt(self.request, keep_alive);
            self.request = ptr::null_mut();
        } else {
            self.free();
            drop(keep_alive);
        }
    }
}

/// The length UCX reports for a completed receive into a buffer of `capacity` bytes.
/// More than the buffer holds cannot have landed in it (UCX completes such a message with
/// `UCS_ERR_MESSAGE_TRUNCATED`), so a larger length is refused as that truncation
/// instead of reaching callers who slice the buffer with it.
pub(crate) fn received_length(length: usize, capacity: usize) -> Result<usize, Status> {
    if length > capacity {
        tracing::warn!(length, capacity, "UCX reported a receive longer than its buffer");
        return Err(Status::ERR_MESSAGE_TRUNCATED);
    }
    Ok(length)
}

/// Builds a zeroed `ucp_request_param_t` with the memory-type hint.
pub(crate) fn param_with_memory_type(memory_type: MemoryType) -> ucx_sys::ucp_request_param_t {
    // SAFETY: ucp_request_param_t is plain data (integers, nullable pointers, unions of
    // Option<fn> and pointers); all-zero is valid and only masked fields are read.
    let mut param: ucx_sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
    param.op_attr_mask = ucx_sys::UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    param.memory_type = memory_type.raw();
    param
}

/// A tagged send in flight. Owns the buffer until the send completes.
///
/// [`poll`](Self::poll) reports completion (progress the worker between polls); dropping
/// it before completion cancels it and, if UCX still uses the buffer, leaves the buffer
/// with the worker until UCX lets go of it.
pub struct TagSend<B: SendBuf> {
    core: Core,
    result: Option<Result<usize, Status>>,
    buf: Option<B>,
}

impl<B: SendBuf> TagSend<B> {
    pub(crate) fn submit(ep: &UcxEndpoint, tag: u64, buf: B) -> Result<Self, Rejected<B>> {
        if let Some(status) = ep.error() {
            return Err(Rejected { error: UcxError::EndpointFailed { status }, buf });
        }
        let worker = ep.worker.clone();
        let memory_type = buf.memory_type();
        if memory_type == MemoryType::Cuda && !worker.context.supports_cuda_memory() {
            return Err(Rejected { error: UcxError::CudaUnsupported, buf });
        }
        let len = buf.len();
        let param = param_with_memory_type(memory_type);
        // SAFETY: the endpoint is live (borrowed); the buffer is readable for len bytes of
        // the hinted memory type and stays alive and unmoved until UCX completes the
        // request: it is owned by the returned TagSend, and, if that is dropped early, by
        // the worker (Core::abandon) until completion. param lives across the call.
        let ret = unsafe { worker.ucx.ucp_tag_send_nbx(ep.handle, buf.as_ptr(), len, tag, &param) };
        if ucx_sys::ptr_is_err(ret) {
            let status = ucx_sys::ptr_status(ret);
            return Err(Rejected { error: UcxError::Call { call: "ucp_tag_send_nbx", status }, buf });
        }
        let (request, result) = if ret.is_null() { (ptr::null_mut(), Some(Ok(len))) } else { (ret, None) };
        Ok(Self { core: Core { worker, request }, result, buf: Some(buf) })
    }

    /// `None` while in flight; then the bytes sent, or the status it failed with.
    /// Does not progress the worker.
    pub fn poll(&mut self) -> Option<Result<usize, Status>> {
        if self.result.is_none() {
            let status = self.core.completion()?;
            let len = self.buf.as_ref().map_or(0, |b| b.len());
            self.result = Some(if status.is_ok() { Ok(len) } else { Err(status) });
        }
        self.result
    }

    /// Whether the send has completed (successfully or not).
    pub fn is_complete(&mut self) -> bool {
        self.poll().is_some()
    }

    /// The buffer back once the send has completed; the request itself while not.
    pub fn into_buf(mut self) -> Result<B, Self> {
        if self.poll().is_none() {
            return Err(self);
        }
        Ok(self.buf.take().expect("buffer present until into_buf"))
    }
}

impl<B: SendBuf> Drop for TagSend<B> {
    fn drop(&mut self) {
        let buf = self.buf.take();
        self.core.abandon(Box::new(buf));
    }
}

impl<B: SendBuf> fmt::Debug for TagSend<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TagSend").field("result", &self.result).finish_non_exhaustive()
    }
}

/// A tagged receive in flight. Owns the buffer until a message has landed in it.
///
/// Same completion and drop rules as [`TagSend`]. A message longer than the buffer
/// completes with `UCS_ERR_MESSAGE_TRUNCATED`.
pub struct TagRecv<B: RecvBuf> {
    core: Core,
    result: Option<Result<usize, Status>>,
    info: Option<RecvInfo>,
    buf: Option<B>,
}

impl<B: RecvBuf> TagRecv<B> {
    pub(crate) fn submit(worker: &UcxWorker, tag: u64, tag_mask: u64, mut buf: B) -> Result<Self, Rejected<B>> {
        let worker = worker.inner.clone();
        let memory_type = buf.memory_type();
        if memory_type == MemoryType::Cuda && !worker.context.supports_cuda_memory() {
            return Err(Rejected { error: UcxError::CudaUnsupported, buf });
        }
        let mut param = param_with_memory_type(memory_type);
        // Filled by UCX only when the receive completes inside the call.
        let mut info = ucx_sys::ucp_tag_recv_info_t { sender_tag: 0, length: 0 };
        param.op_attr_mask |= ucx_sys::UCP_OP_ATTR_FIELD_RECV_INFO;
        param.recv_info.tag_info = &mut info;
        let len = buf.len();
        let ptr = buf.as_mut_ptr();
        // SAFETY: the worker is live (we hold an Rc); the buffer is writable for len bytes
        // of the hinted type, exclusively ours, and stays alive and unmoved until UCX
        // completes the request (owned by the returned TagRecv, or by the worker after an
        // early drop). param and info live across the call; UCX writes info only during
        // the call.
        let ret = unsafe { worker.ucx.ucp_tag_recv_nbx(worker.handle, ptr, len, tag, tag_mask, &param) };
        let mut this =
            Self { core: Core { worker, request: ptr::null_mut() }, result: None, info: None, buf: Some(buf) };
        if ucx_sys::ptr_is_err(ret) {
            // The receive matched a message and failed on the spot (e.g. truncated): the
            // message is consumed, so this is a completed request, not a rejection.
            this.result = Some(Err(ucx_sys::ptr_status(ret)));
        } else if ret.is_null() {
            let result = received_length(info.length, len);
            if result.is_ok() {
                this.info = Some(RecvInfo { sender_tag: info.sender_tag, length: info.length });
            }
            this.result = Some(result);
        } else {
            this.core.request = ret;
        }
        Ok(this)
    }

    /// `None` while in flight; then the bytes received, or the status it failed with
    /// (`UCS_ERR_CANCELED` after [`cancel`](Self::cancel)). Does not progress the worker.
    pub fn poll(&mut self) -> Option<Result<usize, Status>> {
        if self.result.is_none() {
            let mut info = ucx_sys::ucp_tag_recv_info_t { sender_tag: 0, length: 0 };
            // SAFETY: request is live (non-null while result is None); info is writable.
            let status =
                Status(unsafe { self.core.worker.ucx.ucp_tag_recv_request_test(self.core.request, &mut info) });
            if status.is_in_progress() {
                return None;
            }
            self.core.free();
            let capacity = self.buf.as_ref().map_or(0, |b| b.len());
            let result = if status.is_ok() { received_length(info.length, capacity) } else { Err(status) };
            if result.is_ok() {
                self.info = Some(RecvInfo { sender_tag: info.sender_tag, length: info.length });
            }
            self.result = Some(result);
        }
        self.result
    }

    /// Sender tag and length, once completed successfully.
    pub fn info(&mut self) -> Option<RecvInfo> {
        self.poll();
        self.info
    }

    /// Asks UCX to cancel the receive; [`poll`](Self::poll) then reports
    /// `UCS_ERR_CANCELED` (or the result, if the message already matched).
    pub fn cancel(&mut self) {
        if self.result.is_none() {
            // SAFETY: a live request of this worker.
            unsafe { self.core.worker.ucx.ucp_request_cancel(self.core.worker.handle, self.core.request) };
        }
    }

    /// Whether the receive has completed (successfully or not).
    pub fn is_complete(&mut self) -> bool {
        self.poll().is_some()
    }

    /// The buffer (with the message in its first `length` bytes) once the receive has
    /// completed; the request itself while not.
    pub fn into_buf(mut self) -> Result<B, Self> {
        if self.poll().is_none() {
            return Err(self);
        }
        Ok(self.buf.take().expect("buffer present until into_buf"))
    }
}

impl<B: RecvBuf> Drop for TagRecv<B> {
    fn drop(&mut self) {
        let buf = self.buf.take();
        self.core.abandon(Box::new(buf));
    }
}

impl<B: RecvBuf> fmt::Debug for TagRecv<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TagRecv").field("result", &self.result).field("info", &self.info).finish_non_exhaustive()
    }
}

impl UcxWorker {
    /// Posts a receive for a message whose tag matches `tag` on the bits set in
    /// `tag_mask` (`u64::MAX`: exactly `tag`), into `buf`.
    ///
    /// Errors are [`Rejected`] (buffer given back) only for checks before UCX is called
    /// (CUDA memory on a UCX without CUDA); a message that matches and fails at once
    /// (truncated) gives a completed request whose [`poll`](TagRecv::poll) reports it.
    pub fn tag_recv<B: RecvBuf>(&self, tag: u64, tag_mask: u64, buf: B) -> Result<TagRecv<B>, Rejected<B>> {
        TagRecv::submit(self, tag, tag_mask, buf)
    }
}

impl UcxEndpoint {
    /// Sends `buf` with `tag`. The request owns `buf` until the send completes
    /// ([`TagSend::into_buf`] gives it back).
    ///
    /// [`Rejected`] (buffer given back, nothing sent): the endpoint has failed, the buffer
    /// is CUDA memory and this UCX is not CUDA-aware, or `ucp_tag_send_nbx` refused.
    pub fn tag_send<B: SendBuf>(&self, tag: u64, buf: B) -> Result<TagSend<B>, Rejected<B>> {
        TagSend::submit(self, tag, buf)
    }
}

#[cfg(test)]
mod length_tests {
    use super::*;

    /// A completed receive can report at most its buffer's capacity; more is refused as a
    /// truncation, never handed on to slice the buffer with.
    #[test]
    fn a_received_length_beyond_the_buffer_is_a_truncation() {
        assert_eq!(received_length(0, 0), Ok(0));
        assert_eq!(received_length(16, 16), Ok(16));
        assert_eq!(received_length(5, 16), Ok(5));
        assert_eq!(received_length(17, 16), Err(Status::ERR_MESSAGE_TRUNCATED));
        assert_eq!(received_length(usize::MAX, 0), Err(Status::ERR_MESSAGE_TRUNCATED));
    }
}
