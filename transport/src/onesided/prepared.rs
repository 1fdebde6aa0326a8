//! Prepared transfers: a batch of spans between one registration and one remote region,
//! checked once and kept by the lane that runs it (its copy table listed once; on the
//! native lane, described to the side that copies once), then run any number of times
//! by [`Endpoint::post`]. NIXL's prepared descriptor lists serve the same need: a
//! KV-cache layout whose blocks move again and again.

use super::api::{check_notify, spans_to_wire};
use super::handles::{Registration, RemoteRegion, Span};
use super::requests::TransferRequest;
use crate::command::Command;
use crate::endpoint::Endpoint;
use crate::error::TransportError;
use crate::inner::ContextInner;
use crate::payload::{RegistrationInner, TransferArgs};
use ferrylink_proto::connection::{PreparedSpans, TransferSpans};
use ferrylink_proto::region::check_initiator_transfer;
use ferrylink_proto::wire::TransferOp;
use std::fmt;
use std::sync::Arc;

/// A `put` or `get` of a list of spans, checked once, run by [`Endpoint::post`] as many
/// times as needed ([`Endpoint::prepare_put_batch`], [`Endpoint::prepare_get_batch`]).
/// It keeps the local registration's memory alive; the remote region must stay imported
/// (a post after the region was dropped or revoked fails with
/// [`TransportError::Revoked`]). Dropping it lets both sides forget it.
pub struct PreparedTransfer {
    ep: usize,
    op: TransferOp,
    local: Arc<RegistrationInner>,
    grant: u64,
    spans: Arc<PreparedSpans>,
    ctx: Arc<ContextInner>,
}

impl PreparedTransfer {
    /// Whether it writes into the remote region (`put`), else reads it (`get`).
    pub fn is_put(&self) -> bool {
        self.op == TransferOp::Put
    }

    /// Spans it moves.
    pub fn span_count(&self) -> usize {
        self.spans.spans.len()
    }

    /// Bytes it moves.
    pub fn bytes(&self) -> u64 {
        self.spans.spans.iter().map(|s| s.len).sum()
    }
}

impl Drop for PreparedTransfer {
    fn drop(&mut self) {
        // Nothing to forget if the context is gone.
        let _ = self.ctx.submit(Command::Unprepare { ep: self.ep, prepared: self.spans.id });
    }
}

impl fmt::Debug for PreparedTransfer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreparedTransfer")
            .field("endpoint", &self.ep)
            .field("op", &self.op)
            .field("spans", &self.span_count())
            .finish()
    }
}

impl Endpoint {
    /// Prepares [`Endpoint::put_batch`] of `spans` from `local` into `remote`: checked
    /// now (the same checks, the same errors), run by [`Endpoint::post`].
    pub fn prepare_put_batch(
        &self,
        local: &Registration,
        remote: &RemoteRegion,
        spans: &[Span],
    ) -> Result<PreparedTransfer, TransportError> {
        self.prepare(TransferOp::Put, local, remote, spans)
    }

    /// Prepares [`Endpoint::get_batch`] of `spans` from `remote` into `local`: checked
    /// now, run by [`Endpoint::post`].
    pub fn prepare_get_batch(
        &self,
        local: &Registration,
        remote: &RemoteRegion,
        spans: &[Span],
    ) -> Result<PreparedTransfer, TransportError> {
        self.prepare(TransferOp::Get, local, remote, spans)
    }

    fn prepare(
        &self,
        op: TransferOp,
        local: &Registration,
        remote: &RemoteRegion,
        spans: &[Span],
    ) -> Result<PreparedTransfer, TransportError> {
        self.check_handles(local, remote)?;
        let wire = spans_to_wire(spans);
        let info = &remote.info;
        check_initiator_transfer(op, &wire, &local.inner, (info.len, info.access, info.device))?;
        Ok(PreparedTransfer {
            ep: self.shared.id,
            op,
            local: local.inner.clone(),
            grant: remote.info.grant,
            spans: Arc::new(PreparedSpans { id: self.ctx.next_request_id(), spans: wire }),
            ctx: self.ctx.clone(),
        })
    }

    /// Runs `prepared` once, as its `put_batch` or `get_batch` would, with `notify`
    /// delivered to the region's owner after it. The request completes when the data is
    /// in place.
    pub fn post(&self, prepared: &PreparedTransfer, notify: Option<Vec<u8>>) -> TransferRequest {
        tracing::trace!("transfer called");
        let refused = if prepared.ep != self.shared.id || !Arc::ptr_eq(&prepared.ctx, &self.ctx) {
            Some(TransportError::InvalidMessage("the transfer was prepared on another endpoint".into()))
        } else {
            check_notify(notify.as_deref()).err()
        };
        let args = TransferArgs {
            op: prepared.op,
            local: prepared.local.clone(),
            grant: prepared.grant,
            spans: TransferSpans::Prepared(prepared.spans.clone()),
            notify,
        };
        self.submit_transfer(args, refused)
    }
}
