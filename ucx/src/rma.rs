//! One-sided puts and gets (`ucp_put_nbx` / `ucp_get_nbx`) into and from a peer's
//! registration, as requests that own their local buffer until UCX is done with it.
//!
//! A request covers one or more [`RmaSpan`]s of one local buffer, each issued as its own
//! UCX operation; it completes when all of them have. Every span is checked before
//! anything is issued: inside the local buffer, and inside the range the
//! [`RemoteKey`] describes (the key's bytes came from a peer; a lying peer gets
//! [`UcxError::OutOfBounds`], never a write outside that range).
//!
//! Completion is local: a put's buffer may be reused, a get's bytes have landed. A put is
//! visible at the target only after a later [`flush`](UcxEndpoint::flush) of the endpoint
//! completes; send the target its notification after that.

use std::any::Any;
use std::ffi::c_void;
use std::fmt;
use std::rc::Rc;

use ucx_sys::Status;

use super::buffer::{MemoryType, RecvBuf, SendBuf};
use super::endpoint::UcxEndpoint;
use super::error::{Rejected, SpanSide, UcxError};
use super::request::param_with_memory_type;
use super::rkey::{KeyInUse, RemoteKey};
use super::worker::WorkerInner;

/// One contiguous piece of a put or get: `len` bytes between `local_offset` in the local
/// buffer and `remote_offset` in the remote region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RmaSpan {
    /// Offset in the request's local buffer.
    pub local_offset: usize,
    /// Offset from the start of the remote region (the key's
    /// [`address`](RemoteKey::address)).
    pub remote_offset: u64,
    /// Bytes to move (a span of 0 bytes moves nothing and is not sent to UCX).
    pub len: usize,
}

impl RmaSpan {
    /// `len` bytes between `local_offset` and `remote_offset`.
    pub fn new(local_offset: usize, remote_offset: u64, len: usize) -> Self {
        Self { local_offset, remote_offset, len }
    }
}

/// The bytes `spans` move, once each lies inside a local buffer of `local_len` bytes and
/// a remote region of `remote_len` bytes; else the first span that does not.
pub(crate) fn check_spans(spans: &[RmaSpan], local_len: usize, remote_len: u64) -> Result<usize, UcxError> {
    let mut total = 0usize;
    for span in spans {
        let len = span.len as u64;
        let local_end = span.local_offset.checked_add(span.len);
        if local_end.is_none_or(|end| end > local_len) {
            let (offset, bound) = (span.local_offset as u64, local_len as u64);
            return Err(UcxError::OutOfBounds { side: SpanSide::Local, offset, len, bound });
        }
        let remote_end = span.remote_offset.checked_add(len);
        if remote_end.is_none_or(|end| end > remote_len) {
            let offset = span.remote_offset;
            return Err(UcxError::OutOfBounds { side: SpanSide::Remote, offset, len, bound: remote_len });
        }
        total = total.saturating_add(span.len);
    }
    Ok(total)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Put,
    Get,
}

impl Direction {
    fn call(self) -> &'static str {
        match self {
            Direction::Put => "ucp_put_nbx",
            Direction::Get => "ucp_get_nbx",
        }
    }
}

/// The UCX operations of one put or get, and what became of them.
struct RmaOps {
    worker: Rc<WorkerInner>,
    /// Live requests UCX has not completed yet (none freed).
    pending: Vec<*mut c_void>,
    /// The first failure: of an operation UCX refused after others were issued, or of a
    /// request.
    failure: Option<Status>,
    /// Bytes of all spans.
    bytes: usize,
    result: Option<Result<usize, Status>>,
}

impl RmaOps {
    /// Frees the requests UCX completed; the result once none is left.
    fn poll(&mut self) -> Option<Result<usize, Status>> {
        if self.result.is_none() {
            let ucx = self.worker.ucx;
            let failure = &mut self.failure;
            self.pending.retain(|&request| {
                // SAFETY: a live request of this worker, not freed yet.
                let status = Status(unsafe { ucx.ucp_request_check_status(request) });
                if status.is_in_progress() {
                    return true;
                }
                // SAFETY: complete; freed exactly once (dropped from `pending` here).
                unsafe { ucx.ucp_request_free(request) };
                if !status.is_ok() && failure.is_none() {
                    *failure = Some(status);
                }
                false
            });
            if self.pending.is_empty() {
                self.result = Some(self.failure.map_or(Ok(self.bytes), Err));
            }
        }
        self.result
    }

    /// Drop path: frees the requests UCX completed and hands each other one to the worker
    /// with `keep_alive` (the local buffer and the key), which drops after the last.
    /// Nothing is cancelled: `ucp_request_cancel` only cancels tag receives (1.13 to 1.22).
    fn abandon(&mut self, keep_alive: Rc<dyn Any>) {
        let ucx = self.worker.ucx;
        for request in self.pending.drain(..) {
            // SAFETY: a live request of this worker, not freed yet.
            let status = Status(unsafe { ucx.ucp_request_check_status(request) });
            if status.is_in_progress() {
                self.worker.adopt(request, Box::new(keep_alive.clone()));
            } else {
                // SAFETY: complete; freed exactly once.
                unsafe { ucx.ucp_request_free(request) };
            }
        }
    }
}

/// Checks the request and issues each span; `Err` only when nothing was issued.
fn issue(
    ep: &UcxEndpoint,
    key: &RemoteKey,
    local: *mut c_void,
    local_len: usize,
    memory_type: MemoryType,
    spans: &[RmaSpan],
    direction: Direction,
) -> Result<RmaOps, UcxError> {
    if let Some(status) = ep.error() {
        return Err(UcxError::EndpointFailed { status });
    }
    let worker = ep.worker.clone();
    if !worker.context.supports_rma() {
        return Err(UcxError::RmaDisabled);
    }
    if memory_type == MemoryType::Cuda && !worker.context.supports_cuda_memory() {
        return Err(UcxError::CudaUnsupported);
    }
    let rkey = key.inner.handle_for(ep.id)?;
    let bytes = check_spans(spans, local_len, key.inner.length)?;
    let param = param_with_memory_type(memory_type);
    let mut ops = RmaOps { worker, pending: Vec::new(), failure: None, bytes, result: None };
    for (issued, span) in spans.iter().filter(|span| span.len > 0).enumerate() {
        let at = local.cast::<u8>().wrapping_add(span.local_offset).cast::<c_void>();
        // Inside the region (checked above), so no overflow: address + length fits.
        let remote = key.inner.address + span.remote_offset;
        let ucx = ops.worker.ucx;
        // SAFETY: the endpoint is live (borrowed) and `rkey` is the live key unpacked for
        // it; `at..at + len` lies inside the local buffer (checked above), which is valid
        // for reads (put) or exclusive writes (get) of the hinted memory type and stays
        // alive and unmoved until UCX completes the request: it is owned by the returned
        // Put / Get, and, after an early drop, by the worker (RmaOps::abandon). The remote
        // range lies inside the key's region (checked above). param lives across the call.
        let ret = unsafe {
            match direction {
                Direction::Put => ucx.ucp_put_nbx(ep.handle, at, span.len, remote, rkey, &param),
                Direction::Get => ucx.ucp_get_nbx(ep.handle, at, span.len, remote, rkey, &param),
            }
        };
        if ucx_sys::ptr_is_err(ret) {
            let status = ucx_sys::ptr_status(ret);
            if issued == 0 {
                return Err(UcxError::Call { call: direction.call(), status });
            }
            // Earlier spans are under way: the request completes with this failure.
            ops.failure = Some(status);
            break;
        }
        if !ret.is_null() {
            ops.pending.push(ret);
        }
    }
    Ok(ops)
}

/// What a put or get holds until UCX is done: the operations, the key, the local buffer.
struct Transfer<B: 'static> {
    ops: RmaOps,
    key: Option<KeyInUse>,
    buf: Option<B>,
}

impl<B: 'static> Transfer<B> {
    fn poll(&mut self) -> Option<Result<usize, Status>> {
        let result = self.ops.poll();
        if result.is_some() {
            // UCX is done with the key: release it (an endpoint closing may destroy it).
            self.key = None;
        }
        result
    }

    fn take_buf(&mut self) -> Option<B> {
        // The result stays readable through poll; only completion matters here.
        let _completed = self.poll()?;
        self.buf.take()
    }
}

impl<B: 'static> Drop for Transfer<B> {
    fn drop(&mut self) {
        if self.ops.pending.is_empty() {
            return;
        }
        let keep_alive: Rc<dyn Any> = Rc::new((self.buf.take(), self.key.take()));
        self.ops.abandon(keep_alive);
    }
}

/// A put in flight ([`UcxEndpoint::put`], [`UcxEndpoint::put_spans`]). Owns the local
/// buffer until every span's operation completed.
///
/// [`poll`](Self::poll) reports completion (progress the worker between polls; where UCX
/// emulates RMA, as on TCP, the target's worker must progress too). Completion is local:
/// the data is visible at the target after a later [`UcxEndpoint::flush`] completes.
/// Dropping it before completion leaves the buffer with the worker until UCX lets go of
/// it (RMA operations cannot be cancelled).
pub struct Put<B: SendBuf>(Transfer<B>);

impl<B: SendBuf> Put<B> {
    /// `None` while in flight; then the bytes of all spans, or the first status an
    /// operation failed with. Does not progress the worker.
    pub fn poll(&mut self) -> Option<Result<usize, Status>> {
        self.0.poll()
    }

    /// Whether every operation has completed (successfully or not).
    pub fn is_complete(&mut self) -> bool {
        self.poll().is_some()
    }

    /// The buffer back once the put has completed; the request itself while not.
    pub fn into_buf(mut self) -> Result<B, Self> {
        self.0.take_buf().ok_or(self)
    }
}

impl<B: SendBuf> fmt::Debug for Put<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ops = &self.0.ops;
        f.debug_struct("Put").field("pending", &ops.pending.len()).field("result", &ops.result).finish_non_exhaustive()
    }
}

/// A get in flight ([`UcxEndpoint::get`], [`UcxEndpoint::get_spans`]). Owns the local
/// buffer until every span's bytes have landed in it; same rules as [`Put`] otherwise
/// (completion means the bytes are here; no flush needed).
pub struct Get<B: RecvBuf>(Transfer<B>);

impl<B: RecvBuf> Get<B> {
    /// `None` while in flight; then the bytes of all spans, or the first status an
    /// operation failed with (the buffer's contents are then unspecified). Does not
    /// progress the worker.
    pub fn poll(&mut self) -> Option<Result<usize, Status>> {
        self.0.poll()
    }

    /// Whether every operation has completed (successfully or not).
    pub fn is_complete(&mut self) -> bool {
        self.poll().is_some()
    }

    /// The buffer, with the spans' bytes in it, once the get has completed; the request
    /// itself while not.
    pub fn into_buf(mut self) -> Result<B, Self> {
        self.0.take_buf().ok_or(self)
    }
}

impl<B: RecvBuf> fmt::Debug for Get<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ops = &self.0.ops;
        f.debug_struct("Get").field("pending", &ops.pending.len()).field("result", &ops.result).finish_non_exhaustive()
    }
}

impl UcxEndpoint {
    /// Writes all of `buf` into the peer's region at `remote_offset` (`ucp_put_nbx`):
    /// [`put_spans`](Self::put_spans) with one span.
    pub fn put<B: SendBuf>(&self, key: &RemoteKey, remote_offset: u64, buf: B) -> Result<Put<B>, Rejected<B>> {
        let span = RmaSpan::new(0, remote_offset, buf.len());
        self.put_spans(key, buf, &[span])
    }

    /// Writes each span of `buf` into the peer's region (`ucp_put_nbx` per span), in one
    /// request that owns `buf` until all completed. Visible at the target once a later
    /// [`flush`](Self::flush) completes.
    ///
    /// [`Rejected`] (buffer given back, nothing sent): the endpoint failed, the context
    /// has no RMA, the buffer is CUDA memory and this UCX is not CUDA-aware, the key was
    /// unpacked for another endpoint, a span lies outside the buffer or the key's region
    /// ([`UcxError::OutOfBounds`]), or UCX refused the first operation. If UCX refuses a
    /// later one, the spans before it are under way: the request completes with that
    /// error.
    pub fn put_spans<B: SendBuf>(&self, key: &RemoteKey, buf: B, spans: &[RmaSpan]) -> Result<Put<B>, Rejected<B>> {
        let local = buf.as_ptr().cast_mut();
        match issue(self, key, local, buf.len(), buf.memory_type(), spans, Direction::Put) {
            Ok(ops) => Ok(Put(Transfer { ops, key: Some(KeyInUse::new(&key.inner)), buf: Some(buf) })),
            Err(error) => Err(Rejected { error, buf }),
        }
    }

    /// Reads the peer's region from `remote_offset` into all of `buf` (`ucp_get_nbx`):
    /// [`get_spans`](Self::get_spans) with one span.
    pub fn get<B: RecvBuf>(&self, key: &RemoteKey, remote_offset: u64, buf: B) -> Result<Get<B>, Rejected<B>> {
        let span = RmaSpan::new(0, remote_offset, buf.len());
        self.get_spans(key, buf, &[span])
    }

    /// Reads each span of the peer's region into `buf` (`ucp_get_nbx` per span), in one
    /// request that owns `buf` until every span has landed. Overlapping local spans land
    /// in no particular order. Refused as [`put_spans`](Self::put_spans) is.
    pub fn get_spans<B: RecvBuf>(&self, key: &RemoteKey, mut buf: B, spans: &[RmaSpan]) -> Result<Get<B>, Rejected<B>> {
        let local = buf.as_mut_ptr();
        match issue(self, key, local, buf.len(), buf.memory_type(), spans, Direction::Get) {
            Ok(ops) => Ok(Get(Transfer { ops, key: Some(KeyInUse::new(&key.inner)), buf: Some(buf) })),
            Err(error) => Err(Rejected { error, buf }),
        }
    }
}

#[cfg(test)]
mod span_tests {
    use super::*;

    fn out(side: SpanSide, offset: u64, len: u64, bound: u64) -> String {
        UcxError::OutOfBounds { side, offset, len, bound }.to_string()
    }

    fn checked(spans: &[RmaSpan], local_len: usize, remote_len: u64) -> Result<usize, String> {
        check_spans(spans, local_len, remote_len).map_err(|e| e.to_string())
    }

    #[test]
    fn spans_inside_both_ranges_pass_up_to_their_last_byte() {
        assert_eq!(checked(&[], 0, 1), Ok(0));
        assert_eq!(checked(&[RmaSpan::new(0, 0, 16)], 16, 16), Ok(16));
        assert_eq!(checked(&[RmaSpan::new(15, 4095, 1), RmaSpan::new(0, 0, 1)], 16, 4096), Ok(2));
        // Zero bytes at the very end move nothing and are allowed.
        assert_eq!(checked(&[RmaSpan::new(16, 4096, 0)], 16, 4096), Ok(0));
    }

    #[test]
    fn a_span_past_either_end_or_wrapping_is_out_of_bounds() {
        use SpanSide::{Local, Remote};
        assert_eq!(checked(&[RmaSpan::new(0, 4095, 2)], 16, 4096), Err(out(Remote, 4095, 2, 4096)));
        assert_eq!(checked(&[RmaSpan::new(0, 4097, 0)], 16, 4096), Err(out(Remote, 4097, 0, 4096)));
        assert_eq!(checked(&[RmaSpan::new(15, 0, 2)], 16, 4096), Err(out(Local, 15, 2, 16)));
        assert_eq!(checked(&[RmaSpan::new(0, u64::MAX, 1)], 16, 4096), Err(out(Remote, u64::MAX, 1, 4096)));
        assert_eq!(checked(&[RmaSpan::new(usize::MAX, 0, 1)], 16, 4096), Err(out(Local, u64::MAX, 1, 16)));
        // One bad span refuses the whole request, wherever it is.
        let spans = [RmaSpan::new(0, 0, 1), RmaSpan::new(1, 1, 1), RmaSpan::new(2, 4096, 1)];
        assert_eq!(checked(&spans, 16, 4096), Err(out(Remote, 4096, 1, 4096)));
    }
}
