//! `RemoteKey`: a peer's [`RegionKey`] unpacked for one endpoint (`ucp_ep_rkey_unpack`),
//! destroyed with `ucp_rkey_destroy`, owned by that endpoint.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::ptr;
use std::rc::{Rc, Weak};

use ucx_sys::Status;

use super::buffer::MemoryType;
use super::endpoint::UcxEndpoint;
use super::error::{check, non_null, UcxError};
use super::region_key::RegionKey;
use super::worker::WorkerInner;

/// The unpacked key, shared by the [`RemoteKey`] handle and the requests that use it.
pub(crate) struct RkeyInner {
    /// Keeps the worker alive: `ucp_rkey_destroy` returns the key to the worker's pool.
    worker: Rc<WorkerInner>,
    /// Live key, or null once destroyed (at the latest when the last user drops; earlier
    /// when its endpoint closes with no request using it).
    handle: Cell<ucx_sys::ucp_rkey_h>,
    /// The id of the endpoint it was unpacked for.
    endpoint_id: u64,
    /// Requests using the key now ([`KeyInUse`]).
    in_use: Cell<usize>,
    pub(crate) address: u64,
    pub(crate) length: u64,
    memory_type: MemoryType,
}

impl RkeyInner {
    /// The live key for an operation on endpoint `endpoint_id`: refused for another
    /// endpoint, and once destroyed (its endpoint closed).
    pub(crate) fn handle_for(&self, endpoint_id: u64) -> Result<ucx_sys::ucp_rkey_h, UcxError> {
        let handle = self.handle.get();
        if self.endpoint_id != endpoint_id || handle.is_null() {
            return Err(UcxError::ForeignRemoteKey);
        }
        Ok(handle)
    }

    /// `ucp_rkey_destroy`, once.
    fn destroy(&self) {
        let handle = self.handle.replace(ptr::null_mut());
        if !handle.is_null() {
            // SAFETY: a key from ucp_ep_rkey_unpack, destroyed exactly once (nulled
            // above); no request uses it any more (requests hold this RkeyInner through a
            // KeyInUse, so the callers are Drop, after the last of them, or
            // `release_idle_keys`, which checks that none is in use); its worker is alive
            // (we hold it).
            unsafe { self.worker.ucx.ucp_rkey_destroy(handle) };
        }
    }
}

impl Drop for RkeyInner {
    fn drop(&mut self) {
        self.destroy();
    }
}

/// A request's use of a key: keeps it alive and counted as in use until the request is
/// released (completed, or finished by the worker after an early drop).
pub(crate) struct KeyInUse(Rc<RkeyInner>);

impl KeyInUse {
    pub(crate) fn new(key: &Rc<RkeyInner>) -> Self {
        key.in_use.set(key.in_use.get() + 1);
        Self(key.clone())
    }
}

impl Drop for KeyInUse {
    fn drop(&mut self) {
        // The Rc drops right after: the last user of a key whose handle is gone destroys it.
        self.0.in_use.set(self.0.in_use.get().saturating_sub(1));
    }
}

/// A peer's registration, reachable through one endpoint: [`UcxEndpoint::unpack_rkey`]
/// of the [`RegionKey`] the peer sent.
///
/// Pass it to that endpoint's [`put`](UcxEndpoint::put) / [`get`](UcxEndpoint::get) (and
/// their `_spans` forms); any other endpoint refuses it ([`UcxError::ForeignRemoteKey`]).
/// Every operation is kept inside the range the key describes.
///
/// **Owned by its endpoint** (UCX requires a key to be destroyed before the endpoint it
/// was unpacked for): when the endpoint closes (or drops), it destroys each of its keys
/// that no request is using, and the handles left with the caller are dead (refused
/// everywhere, dropped harmlessly). A key that requests are still using then (they were
/// cancelled or flushed by the close) is destroyed when the last of them is released,
/// after the endpoint: UCX's `ucp_rkey_destroy` (1.13 to 1.22) touches only the worker,
/// which the key keeps alive. Dropping the handle earlier destroys the key once no request
/// uses it. Not `Send`: it belongs to the worker's thread, like the endpoint.
pub struct RemoteKey {
    pub(crate) inner: Rc<RkeyInner>,
}

impl RemoteKey {
    /// Address of the first byte of the peer's region (in the peer's address space).
    pub fn address(&self) -> u64 {
        self.inner.address
    }

    /// Bytes in the peer's region.
    pub fn len(&self) -> u64 {
        self.inner.length
    }

    /// Whether the region is empty (never: such keys are refused).
    pub fn is_empty(&self) -> bool {
        self.inner.length == 0
    }

    /// Where the peer's bytes live, as its packed rkey says.
    pub fn memory_type(&self) -> MemoryType {
        self.inner.memory_type
    }

    /// Whether the key can still be used: false once its endpoint has closed.
    pub fn is_live(&self) -> bool {
        !self.inner.handle.get().is_null()
    }
}

impl fmt::Debug for RemoteKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteKey")
            .field("address", &format_args!("{:#x}", self.inner.address))
            .field("length", &self.inner.length)
            .field("memory_type", &self.inner.memory_type)
            .field("live", &self.is_live())
            .finish()
    }
}

/// The keys an endpoint unpacked, weakly: the endpoint destroys them when it closes.
#[derive(Default)]
pub(crate) struct EndpointKeys(RefCell<Vec<Weak<RkeyInner>>>);

impl EndpointKeys {
    fn add(&self, key: &Rc<RkeyInner>) {
        let mut keys = self.0.borrow_mut();
        keys.retain(|k| k.strong_count() > 0);
        keys.push(Rc::downgrade(key));
    }

    /// Destroys every key no request is using; keys that requests still use are
    /// destroyed when the last of them is released. Called before the endpoint closes.
    pub(crate) fn release_idle_keys(&self) {
        for key in self.0.borrow_mut().drain(..) {
            if let Some(key) = key.upgrade() {
                if key.in_use.get() == 0 {
                    key.destroy();
                }
            }
        }
    }
}

impl UcxEndpoint {
    /// Unpacks a peer's [`RegionKey`] for this endpoint (`ucp_ep_rkey_unpack`).
    ///
    /// The key's bytes come from a peer and are checked before UCX parses them (see
    /// [`RegionKey`]'s module): a short, long or ill-framed rkey, a memory type other than
    /// host or CUDA, an empty, null or wrapping range are
    /// [`UcxError::InvalidRemoteKey`]. Also refused: a context without RMA, a failed
    /// endpoint, and whatever `ucp_ep_rkey_unpack` refuses.
    pub fn unpack_rkey(&self, key: &RegionKey) -> Result<RemoteKey, UcxError> {
        if !self.worker.context.supports_rma() {
            return Err(UcxError::RmaDisabled);
        }
        if let Some(status) = self.error() {
            return Err(UcxError::EndpointFailed { status });
        }
        let checked = key.check()?;
        let mut handle = ptr::null_mut();
        // SAFETY: live endpoint (borrowed, not closed: closing takes it by value); the
        // packed rkey's framing was checked and it is followed by RKEY_PADDING bytes of
        // 0xff, so UCX's walk of it stays inside the copy (region_key.rs); the copy lives
        // across the call (UCX keeps no pointer into it); handle is writable.
        let status = Status(unsafe {
            self.worker.ucx.ucp_ep_rkey_unpack(self.handle, checked.padded_rkey.as_ptr().cast(), &mut handle)
        });
        check("ucp_ep_rkey_unpack", status)?;
        let handle = non_null("ucp_ep_rkey_unpack", handle)?;
        let inner = Rc::new(RkeyInner {
            worker: self.worker.clone(),
            handle: Cell::new(handle),
            endpoint_id: self.id,
            in_use: Cell::new(0),
            address: checked.address,
            length: checked.length,
            memory_type: checked.memory_type,
        });
        self.keys.add(&inner);
        Ok(RemoteKey { inner })
    }
}
