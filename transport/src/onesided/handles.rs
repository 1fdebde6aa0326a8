//! What users hold: [`Registration`] (this side's memory, granted to peers by its key),
//! [`RemoteRegion`] (a peer's region, imported on one endpoint), [`Span`] and
//! [`Notification`].

use crate::command::Command;
use crate::inner::ContextInner;
use crate::payload::RegistrationInner;
use ferrylink_memory::Frame;
use ferrylink_proto::region::{Access, ImportedRegion, RemoteKey};
use std::fmt;
use std::sync::Arc;

/// Memory of this context that peers may read or write with one-sided transfers, made by
/// [`crate::Context::register`]. Its [`key`](Registration::key) is what a peer presents
/// to import it ([`crate::Endpoint::import`]). Dropping the registration (or
/// [`revoke`](Registration::revoke)) revokes it once no other handle of the same
/// registration is left: peers are told, transfers that have not started fail, and the
/// memory is let go only after every peer that imported it confirmed (or its connection
/// ended). Registering the same memory with the same access again gives another handle
/// of the same registration (a cache hit: the same key, no new export).
pub struct Registration {
    pub(crate) inner: Arc<RegistrationInner>,
    pub(crate) ctx: Arc<ContextInner>,
}

impl Registration {
    /// The key a peer presents to import this registration: plain bytes
    /// ([`RemoteKey::to_bytes`]) to ship any way.
    pub fn key(&self) -> RemoteKey {
        self.inner.key
    }

    /// Bytes registered.
    pub fn len(&self) -> u64 {
        self.inner.len()
    }

    /// Whether no bytes are registered.
    pub fn is_empty(&self) -> bool {
        self.inner.len() == 0
    }

    /// What peers may do.
    pub fn access(&self) -> Access {
        self.inner.access
    }

    /// The registered memory (to fill it before a peer reads it, or read what a peer
    /// wrote after its notification came).
    pub fn frame(&self) -> &Frame {
        &self.inner.frame
    }

    /// Revokes this handle now (as dropping it does).
    pub fn revoke(self) {}
}

impl Drop for Registration {
    fn drop(&mut self) {
        if self.ctx.registry.release_handle(self.inner.id) {
            // The peers that imported it are told; nothing to do if the context is gone.
            let _ = self.ctx.submit(Command::Revoke { registration: self.inner.id });
        }
    }
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("id", &self.inner.id)
            .field("len", &self.inner.len())
            .field("access", &self.inner.access)
            .field("device", &self.inner.is_device())
            .finish()
    }
}

/// A peer's registration, imported on one endpoint ([`crate::Endpoint::import`]): the
/// target of `put` and the source of `get` on that endpoint. Dropping it tells the owner.
pub struct RemoteRegion {
    pub(crate) ep: usize,
    pub(crate) info: ImportedRegion,
    pub(crate) ctx: Arc<ContextInner>,
}

impl RemoteRegion {
    /// Bytes of the region.
    pub fn len(&self) -> u64 {
        self.info.len
    }

    /// Whether the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.info.len == 0
    }

    /// What its key grants.
    pub fn access(&self) -> Access {
        self.info.access
    }

    /// Whether it is device memory.
    pub fn is_device(&self) -> bool {
        self.info.device
    }
}

impl Drop for RemoteRegion {
    fn drop(&mut self) {
        let _ = self.ctx.submit(Command::Unimport { ep: self.ep, grant: self.info.grant });
    }
}

impl fmt::Debug for RemoteRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteRegion").field("endpoint", &self.ep).field("region", &self.info).finish()
    }
}

/// One piece of a transfer: `len` bytes at `local_offset` of this side's registration
/// and at `remote_offset` of the remote region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Span {
    /// Offset in the local registration.
    pub local_offset: u64,
    /// Offset in the remote region.
    pub remote_offset: u64,
    /// Bytes.
    pub len: u64,
}

impl Span {
    /// `len` bytes at the same offset on both sides.
    pub fn at(offset: u64, len: u64) -> Span {
        Span { local_offset: offset, remote_offset: offset, len }
    }
}

/// What a `put` delivered to this side, the owner of the region it wrote, once its data
/// was visible ([`crate::Endpoint::recv_notification`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The bytes the initiator attached.
    pub data: Vec<u8>,
}
