//! The one-sided calls of [`Context`] and [`Endpoint`], and how their requests reach the
//! progress thread.

use super::handles::{Registration, RemoteRegion, Span};
use super::requests::{ImportRequest, NotificationRequest, TransferRequest};
use crate::command::Command;
use crate::context::Context;
use crate::endpoint::{Endpoint, RequestLink};
use crate::error::TransportError;
use crate::payload::TransferArgs;
use crate::request::Link;
use crate::slot::Slot;
use ferrylink_memory::cuda::CurrentContextGuard;
use ferrylink_memory::Frame;
use ferrylink_proto::connection::TransferSpans;
use ferrylink_proto::region::{Access, ImportedRegion, RemoteKey};
use ferrylink_proto::wire::{TransferOp, WireSpan, MAX_NOTIFY_BYTES};
use std::sync::Arc;
use std::time::Instant;

impl Context {
    /// Registers `frame` for one-sided transfers: peers that import its key
    /// ([`Registration::key`], [`Endpoint::import`]) may read it (`get`), write it
    /// (`put`) or both, as `access` says.
    ///
    /// Device memory must be memory the native lane exports without a copy: the
    /// exportable [`DevicePool`](ferrylink_memory::cuda::DevicePool), VMM memory with
    /// POSIX-fd handles, an exportable stream-ordered pool (cudarc after
    /// `install_exportable_pool`). Host memory must be a shared buffer
    /// (`ferrylink::ipc::shared_host_buffer`), which the peer maps; other memory is
    /// refused with the reason (a copy behind the user's back would make "the data is
    /// there" a lie). Registering the same memory with the same access again returns a
    /// handle of the same registration.
    pub fn register(&self, frame: impl Into<Frame>, access: Access) -> Result<Registration, TransportError> {
        let frame = frame.into();
        if frame.is_empty() {
            return Err(TransportError::InvalidMessage("an empty registration".into()));
        }
        match &frame {
            Frame::Host(h) if h.region().is_none_or(|(r, _)| r.shareable_fd().is_none()) => {
                return Err(TransportError::Unsupported(
                    "host memory a peer cannot map: register a shared buffer (ferrylink::ipc::shared_host_buffer)"
                        .into(),
                ))
            }
            Frame::Device(d) => {
                let _restore = CurrentContextGuard::save().map_err(|e| TransportError::Unsupported(e.to_string()))?;
                if !self.inner.device.is_exportable(d) {
                    return Err(TransportError::Unsupported(
                        "device memory nothing exports without a copy (a stock stream-ordered pool, a foreign \
                         pointer): use DevicePool, VMM memory or cuda::install_exportable_pool"
                            .into(),
                    ));
                }
            }
            Frame::Host(_) => {}
        }
        let inner = self.inner.registry.register(frame, access);
        Ok(Registration { inner, ctx: self.inner.clone() })
    }

    /// Registrations this context holds (live, or revoked and still mapped by a peer).
    pub fn registrations_held(&self) -> usize {
        self.inner.registry.held()
    }
}

/// Why notification `notify` cannot be sent.
pub(super) fn check_notify(notify: Option<&[u8]>) -> Result<(), TransportError> {
    match notify {
        Some(n) if n.len() > MAX_NOTIFY_BYTES => {
            Err(TransportError::InvalidMessage(format!("a notification over {MAX_NOTIFY_BYTES} bytes")))
        }
        _ => Ok(()),
    }
}

pub(super) fn spans_to_wire(spans: &[Span]) -> Vec<WireSpan> {
    spans
        .iter()
        .map(|s| WireSpan { local_offset: s.local_offset, remote_offset: s.remote_offset, len: s.len })
        .collect()
}

impl Endpoint {
    fn bounds(&self) -> (std::time::Duration, std::time::Duration) {
        (self.ctx.config.request_timeout, self.ctx.config.busy_poll)
    }

    /// Imports a peer's registration by its key: the peer (the owner) checks the key is
    /// its own and still live and grants the region. Completes with a [`RemoteRegion`]
    /// usable on this endpoint.
    pub fn import(&self, key: &RemoteKey) -> ImportRequest {
        let slot = Slot::new();
        let id = self.ctx.next_request_id();
        let cmd = Command::Import { ep: self.shared.id, id, key: *key, slot: slot.clone() };
        if self.ctx.submit(cmd).is_err() {
            let _fresh = slot.complete(Err(TransportError::ContextClosed));
        }
        ImportRequest::new(slot, self.bounds(), self.link(id), self.shared.id, self.ctx.clone())
    }

    /// Writes `span.len` bytes of `local` at `span.local_offset` into `remote` at
    /// `span.remote_offset`. `notify`, when given, is delivered to the region's owner
    /// ([`Endpoint::recv_notification`]) after the data is visible there. The request
    /// completes when the data is in place.
    pub fn put(
        &self,
        local: &Registration,
        remote: &RemoteRegion,
        span: Span,
        notify: Option<Vec<u8>>,
    ) -> TransferRequest {
        self.transfer(TransferOp::Put, local, remote, &[span], notify)
    }

    /// [`Endpoint::put`] of many spans in one request (destinations must not overlap),
    /// with one notification after all of them.
    pub fn put_batch(
        &self,
        local: &Registration,
        remote: &RemoteRegion,
        spans: &[Span],
        notify: Option<Vec<u8>>,
    ) -> TransferRequest {
        self.transfer(TransferOp::Put, local, remote, spans, notify)
    }

    /// Reads `span.len` bytes of `remote` at `span.remote_offset` into `local` at
    /// `span.local_offset`; completes when they are there. `notify`, when given, is
    /// delivered to the region's owner ([`Endpoint::recv_notification`]) after the read,
    /// telling it the bytes were taken (it may reuse the memory).
    pub fn get(
        &self,
        local: &Registration,
        remote: &RemoteRegion,
        span: Span,
        notify: Option<Vec<u8>>,
    ) -> TransferRequest {
        self.transfer(TransferOp::Get, local, remote, &[span], notify)
    }

    /// [`Endpoint::get`] of many spans in one request (local destinations must not
    /// overlap), with one notification after all of them.
    pub fn get_batch(
        &self,
        local: &Registration,
        remote: &RemoteRegion,
        spans: &[Span],
        notify: Option<Vec<u8>>,
    ) -> TransferRequest {
        self.transfer(TransferOp::Get, local, remote, spans, notify)
    }

    fn transfer(
        &self,
        op: TransferOp,
        local: &Registration,
        remote: &RemoteRegion,
        spans: &[Span],
        notify: Option<Vec<u8>>,
    ) -> TransferRequest {
        tracing::trace!("transfer called");
        let refused = self.check_handles(local, remote).err().or_else(|| check_notify(notify.as_deref()).err());
        let (local, grant) = (local.inner.clone(), remote.info.grant);
        let args = TransferArgs { op, local, grant, spans: TransferSpans::Given(spans_to_wire(spans)), notify };
        self.submit_transfer(args, refused)
    }

    /// Why `local` and `remote` cannot be used together on this endpoint.
    pub(super) fn check_handles(&self, local: &Registration, remote: &RemoteRegion) -> Result<(), TransportError> {
        if remote.ep != self.shared.id || !Arc::ptr_eq(&remote.ctx, &self.ctx) {
            return Err(TransportError::InvalidMessage("the remote region was imported on another endpoint".into()));
        }
        if !Arc::ptr_eq(&local.ctx, &self.ctx) {
            return Err(TransportError::InvalidMessage("the local registration belongs to another context".into()));
        }
        Ok(())
    }

    /// Starts the transfer `args` describe, or fails its request at once with `refused`.
    pub(super) fn submit_transfer(&self, args: TransferArgs, refused: Option<TransportError>) -> TransferRequest {
        let slot = Slot::new();
        let id = self.ctx.next_request_id();
        if let Some(error) = refused {
            let _fresh = slot.complete(Err(error));
        } else {
            let cmd = Command::Transfer { ep: self.shared.id, id, args, slot: slot.clone() };
            if self.ctx.submit(cmd).is_err() {
                let _fresh = slot.complete(Err(TransportError::ContextClosed));
            }
            tracing::trace!("transfer submitted");
        }
        TransferRequest::new(slot, self.bounds(), self.link(id))
    }

    /// Waits for the next notification a peer's `put` into (or `get` from) one of this
    /// side's registrations delivered (after its data was visible, or read), in the order
    /// they came.
    pub fn recv_notification(&self) -> NotificationRequest {
        let slot = Slot::new();
        let id = self.ctx.next_request_id();
        let cmd = Command::RecvNotification { ep: self.shared.id, id, slot: slot.clone() };
        if self.ctx.submit(cmd).is_err() {
            let _fresh = slot.complete(Err(TransportError::ContextClosed));
        }
        NotificationRequest::new(slot, self.bounds(), self.link(id))
    }
}

impl Link<Result<ImportedRegion, TransportError>> for RequestLink {
    fn cancel(&self) {
        self.submit(Command::Cancel { ep: self.ep, id: self.id });
    }
    fn withdraw(&self) {
        self.submit(Command::Withdraw { ep: self.ep, id: self.id });
    }
    /// A region granted into a dropped handle goes back to its owner.
    fn unclaimed(&self, result: Result<ImportedRegion, TransportError>) {
        if let Ok(region) = result {
            self.submit(Command::Unimport { ep: self.ep, grant: region.grant });
        }
    }
    fn expire_at(&self, at: Instant) {
        self.submit(Command::Expire { ep: self.ep, id: self.id, at });
    }
}

impl Link<Result<(), TransportError>> for RequestLink {
    fn cancel(&self) {
        self.submit(Command::Cancel { ep: self.ep, id: self.id });
    }
    fn withdraw(&self) {}
    fn unclaimed(&self, _result: Result<(), TransportError>) {}
    fn expire_at(&self, at: Instant) {
        self.submit(Command::Expire { ep: self.ep, id: self.id, at });
    }
}

/// A notification that completed into a dropped handle goes to the next receive.
impl Link<Result<Vec<u8>, TransportError>> for RequestLink {
    fn cancel(&self) {
        self.submit(Command::Cancel { ep: self.ep, id: self.id });
    }
    fn withdraw(&self) {
        self.submit(Command::Withdraw { ep: self.ep, id: self.id });
    }
    fn unclaimed(&self, result: Result<Vec<u8>, TransportError>) {
        if let Ok(data) = result {
            self.submit(Command::ReturnNotification { ep: self.ep, data });
        }
    }
    fn expire_at(&self, at: Instant) {
        self.submit(Command::Expire { ep: self.ep, id: self.id, at });
    }
}
