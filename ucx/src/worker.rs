//! `UcxWorker`: one `ucp_worker` (progress, wakeup fd, address), owned by one thread.

use std::any::Any;
use std::cell::RefCell;
use std::ffi::c_void;
use std::fmt;
use std::os::fd::{BorrowedFd, RawFd};
use std::ptr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use ucx_sys::{Status, Ucx};

use super::context::UcxContext;
use super::error::{check, non_null, UcxError};

/// How long dropping a worker progresses it to let requests whose owners are gone end
/// (see [`UcxWorker::orphans`]) before giving up and leaking the worker.
pub const WORKER_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest worker address taken from `ucp_worker_get_address`. Real addresses are
/// hundreds of bytes to a few KiB (one entry per transport device); a length beyond this
/// is a corrupt answer, not an address to copy.
pub(crate) const MAX_WORKER_ADDRESS_LEN: usize = 16 << 20;

/// Whether `length` bytes at `address`, as `ucp_worker_get_address` reported them with
/// success, can be read as an address: a non-null pointer, at least one byte, at most
/// [`MAX_WORKER_ADDRESS_LEN`] (so never more than `isize::MAX`).
pub(crate) fn check_worker_address(address: *const c_void, length: usize) -> Result<(), UcxError> {
    let what = if address.is_null() {
        format!("a null address ({length} bytes)")
    } else if length == 0 {
        "an address of 0 bytes".to_string()
    } else if length > MAX_WORKER_ADDRESS_LEN {
        format!("an address of {length} bytes")
    } else {
        return Ok(());
    };
    Err(UcxError::NoResult { call: "ucp_worker_get_address", what })
}

/// A request UCX has not finished with, whose Rust owner is gone: the worker keeps the
/// memory (buffer, endpoint state) alive until UCX completes the request.
struct Orphan {
    /// A live ucp request (never freed yet).
    request: *mut c_void,
    /// What UCX may still access while `request` is in flight.
    _keep_alive: Box<dyn Any>,
}

pub(crate) struct WorkerInner {
    pub(crate) ucx: &'static Ucx,
    pub(crate) handle: ucx_sys::ucp_worker_h,
    pub(crate) context: UcxContext,
    orphans: RefCell<Vec<Orphan>>,
}

impl WorkerInner {
    /// Hands an incomplete request and what it uses to the worker (see [`Orphan`]).
    pub(crate) fn adopt(&self, request: *mut c_void, keep_alive: Box<dyn Any>) {
        self.orphans.borrow_mut().push(Orphan { request, _keep_alive: keep_alive });
    }

    /// Frees orphans UCX has completed, and drops what they kept alive.
    fn reap(&self) {
        let done: Vec<Orphan> = {
            let mut orphans = self.orphans.borrow_mut();
            if orphans.is_empty() {
                return;
            }
            let (done, pending) = orphans.drain(..).partition(|o| {
                // SAFETY: o.request is a live request of this worker, not yet freed.
                let status = Status(unsafe { self.ucx.ucp_request_check_status(o.request) });
                !status.is_in_progress()
            });
            *orphans = pending;
            done
        };
        for orphan in done {
            // SAFETY: the request is complete and freed exactly once; after this UCX no
            // longer touches what it kept alive, which drops right after.
            unsafe { self.ucx.ucp_request_free(orphan.request) };
        }
    }

    pub(crate) fn progress(&self) -> u32 {
        // SAFETY: the worker is live and, being !Send, only used on its own thread.
        let n = unsafe { self.ucx.ucp_worker_progress(self.handle) };
        self.reap();
        n
    }
}

impl Drop for WorkerInner {
    fn drop(&mut self) {
        // UCX (1.13, assertions on) aborts the process when a worker is destroyed while
        // its endpoints still carry requests (e.g. a matched rendezvous receive). So let
        // unfinished requests end first: cancelled receives and forced closes end with
        // local progress, transfers with the peer's (or its failure).
        let deadline = Instant::now() + WORKER_DRAIN_TIMEOUT;
        while !self.orphans.get_mut().is_empty() && Instant::now() < deadline {
            self.progress();
        }
        let orphans = std::mem::take(self.orphans.get_mut());
        if !orphans.is_empty() {
            // Destroying now could crash UCX, and freeing what the requests use could let
            // UCX write freed memory: leak both, loudly, instead.
            tracing::warn!(
                n = orphans.len(),
                "UCX requests still in flight {WORKER_DRAIN_TIMEOUT:?} after their worker was dropped; leaking the worker"
            );
            std::mem::forget(orphans);
            // The leaked worker still belongs to the context: keep that alive too.
            std::mem::forget(self.context.clone());
            return;
        }
        // SAFETY: no endpoint or request of ours refers to this worker any more (they
        // hold an Rc to it, and the orphans have all been freed by reap).
        unsafe { self.ucx.ucp_worker_destroy(self.handle) };
    }
}

/// The bytes of a worker's address, sent to a peer so it can connect
/// ([`UcxWorker::connect`]).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct WorkerAddress(Vec<u8>);

impl WorkerAddress {
    /// Wraps bytes a peer sent.
    ///
    /// # Safety
    /// `bytes` must be, byte for byte, what [`UcxWorker::address`] returned in the peer
    /// (with a compatible UCX): UCX parses addresses without validating them, so
    /// corrupted bytes make `ucp_ep_create` read out of bounds. Carry them over an
    /// integrity-checked channel (the bootstrap socket's framed messages).
    pub unsafe fn from_bytes_unchecked(bytes: Vec<u8>) -> Self {
        Self(bytes)
    }
    /// The bytes, to send to a peer.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
    /// The bytes, owned.
    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

impl fmt::Debug for WorkerAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WorkerAddress({} bytes)", self.0.len())
    }
}

/// A UCX worker in single-thread mode.
///
/// Not `Send`: create it on the thread that progresses it (the progress thread); its
/// endpoints and requests stay on that thread too. Dropping the handle destroys the
/// worker once its endpoints and requests are gone too; requests still in flight then
/// (dropped while incomplete) get up to [`WORKER_DRAIN_TIMEOUT`] of progress to end.
///
/// Driving it from a mio loop:
/// ```text
/// poll.registry().register(&mut SourceFd(&worker.event_fd()?.as_raw_fd()), UCX, Interest::READABLE)?;
/// loop {
///     while worker.progress() > 0 {}
///     /* poll requests, submit new work */
///     if !worker.arm()? { continue; } // UCS_ERR_BUSY: events pending, progress again
///     poll.poll(&mut events, timeout)?; // sleeps until UCX (or the Waker) has something
/// }
/// ```
pub struct UcxWorker {
    pub(crate) inner: Rc<WorkerInner>,
}

impl UcxWorker {
    /// Creates a worker of `context` (thread mode single, wakeup on tag and transport
    /// events).
    pub fn new(context: &UcxContext) -> Result<Self, UcxError> {
        let ucx = context.inner.ucx;
        // SAFETY: ucp_worker_params_t is plain data; all-zero is valid and only the fields
        // named in field_mask are read.
        let mut params: ucx_sys::ucp_worker_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = ucx_sys::UCP_WORKER_PARAM_FIELD_THREAD_MODE as u64;
        params.thread_mode = ucx_sys::UCS_THREAD_MODE_SINGLE;
        if context.inner.wakeup {
            params.field_mask |= ucx_sys::UCP_WORKER_PARAM_FIELD_EVENTS as u64;
            params.events = ucx_sys::UCP_WAKEUP_TAG_SEND
                | ucx_sys::UCP_WAKEUP_TAG_RECV
                | ucx_sys::UCP_WAKEUP_TX
                | ucx_sys::UCP_WAKEUP_RX;
        }
        let mut handle = ptr::null_mut();
        let setup = crate::setup::lock();
        // SAFETY: the context is live (we clone it into the worker, so it outlives it);
        // params is initialised for its mask; handle is a writable out-pointer.
        let status = Status(unsafe { ucx.ucp_worker_create(context.inner.handle, &params, &mut handle) });
        drop(setup);
        check("ucp_worker_create", status)?;
        // Refused before a WorkerInner exists: its Drop would destroy the null worker.
        let handle = non_null("ucp_worker_create", handle)?;
        Ok(Self {
            inner: Rc::new(WorkerInner { ucx, handle, context: context.clone(), orphans: RefCell::new(Vec::new()) }),
        })
    }

    /// The context this worker belongs to.
    pub fn context(&self) -> &UcxContext {
        &self.inner.context
    }

    /// Runs UCX's progress once (sends, receives, connection setup, error callbacks) and
    /// releases finished orphaned requests. Returns how many events UCX processed; call
    /// again while it is non-zero.
    pub fn progress(&self) -> u32 {
        self.inner.progress()
    }

    /// Progresses until `done()` returns true or `timeout` passes.
    pub fn progress_until(&self, timeout: Duration, mut done: impl FnMut() -> bool) -> Result<(), UcxError> {
        let deadline = Instant::now() + timeout;
        loop {
            if done() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(UcxError::TimedOut { what: "UCX progress", timeout });
            }
            self.progress();
        }
    }

    /// The worker's event fd: readable when UCX has work after [`arm`](Self::arm)
    /// returned `true`. Register it (level- or edge-triggered both work, UCX re-arms on
    /// every `arm`) for readability in the progress thread's poller. Owned by the worker:
    /// never close it.
    pub fn event_fd(&self) -> Result<BorrowedFd<'_>, UcxError> {
        let mut fd: RawFd = -1;
        // SAFETY: the worker is live and was created with the WAKEUP feature; fd is a
        // writable out-pointer.
        let status = Status(unsafe { self.inner.ucx.ucp_worker_get_efd(self.inner.handle, &mut fd) });
        check("ucp_worker_get_efd", status)?;
        if fd < 0 {
            // UCX 1.22 with CUDA answers so for a context without the WAKEUP feature.
            return Err(UcxError::NoResult { call: "ucp_worker_get_efd", what: format!("fd {fd}") });
        }
        // SAFETY: UCX returned a non-negative fd it owns for the worker's whole life, and
        // the borrow cannot outlive `self` (hence the worker).
        Ok(unsafe { BorrowedFd::borrow_raw(fd) })
    }

    /// Arms the event fd before sleeping. `Ok(true)`: armed, safe to wait on the fd;
    /// `Ok(false)`: events are pending (`UCS_ERR_BUSY`), progress again before waiting.
    pub fn arm(&self) -> Result<bool, UcxError> {
        // SAFETY: the worker is live and was created with the WAKEUP feature.
        let status = Status(unsafe { self.inner.ucx.ucp_worker_arm(self.inner.handle) });
        match status {
            Status::OK => Ok(true),
            Status::ERR_BUSY => Ok(false),
            status => Err(UcxError::Call { call: "ucp_worker_arm", status }),
        }
    }

    /// This worker's address, for a peer's [`connect`](Self::connect).
    pub fn address(&self) -> Result<WorkerAddress, UcxError> {
        let mut address = ptr::null_mut();
        let mut length = 0usize;
        // SAFETY: live worker; both out-pointers are writable.
        let status =
            Status(unsafe { self.inner.ucx.ucp_worker_get_address(self.inner.handle, &mut address, &mut length) });
        check("ucp_worker_get_address", status)?;
        let checked = check_worker_address(address.cast_const().cast(), length);
        let bytes = match checked {
            // SAFETY: UCX returned `length` readable bytes at `address` (non-null, checked
            // to be 1..=MAX_WORKER_ADDRESS_LEN bytes), valid until released below.
            Ok(()) => Ok(unsafe { std::slice::from_raw_parts(address.cast::<u8>(), length) }.to_vec()),
            Err(e) => Err(e),
        };
        if !address.is_null() {
            // SAFETY: a non-null address UCX allocated for this worker, released exactly
            // once, with that worker (also when its length was refused).
            unsafe { self.inner.ucx.ucp_worker_release_address(self.inner.handle, address) };
        }
        bytes.map(WorkerAddress)
    }

    /// How many dropped-but-incomplete requests the worker still holds (their memory
    /// stays alive until UCX finishes them; progress releases them).
    pub fn orphans(&self) -> usize {
        self.inner.orphans.borrow().len()
    }

    /// The raw worker, for calls this layer does not wrap. Valid while `self` lives.
    pub fn as_raw(&self) -> ucx_sys::ucp_worker_h {
        self.inner.handle
    }
}

impl fmt::Debug for UcxWorker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UcxWorker").field("orphans", &self.orphans()).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod address_tests {
    use super::*;

    /// What `ucp_worker_get_address` may answer with success: only a non-null, non-empty,
    /// plausibly sized address is ever read.
    #[test]
    fn only_a_readable_worker_address_is_copied() {
        let bytes = [7u8; 4];
        let ok = bytes.as_ptr().cast::<c_void>();
        assert!(check_worker_address(ok, bytes.len()).is_ok());
        assert!(check_worker_address(ok, MAX_WORKER_ADDRESS_LEN).is_ok());
        for (address, length) in
            [(ptr::null(), 64), (ptr::null(), 0), (ok, 0), (ok, MAX_WORKER_ADDRESS_LEN + 1), (ok, usize::MAX)]
        {
            let err = check_worker_address(address, length).unwrap_err();
            assert!(matches!(err, UcxError::NoResult { call: "ucp_worker_get_address", .. }), "{err:?}");
        }
    }
}
