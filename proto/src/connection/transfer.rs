//! A one-sided transfer as the user asks for it ([`TransferArgs`]): the local
//! registration, the grant, the op, its spans (or a prepared transfer's) and the
//! notification. The core checks and runs it (`initiate.rs`).

use super::lane::LocalTransfer;
use crate::payload::Payload;
use crate::region::RegistrationInner;
use crate::wire::{TransferOp, WireSpan};
use std::sync::Arc;

/// A transfer as the user asked for it.
pub struct TransferArgs<P: Payload> {
    /// Put or get.
    pub op: TransferOp,
    /// This side's registration the transfer reads or writes.
    pub local: Arc<RegistrationInner<P>>,
    /// The peer's grant (the imported region).
    pub grant: u64,
    /// The spans.
    pub spans: TransferSpans,
    /// Bytes delivered to the owner once the data is visible there.
    pub notify: Option<Vec<u8>>,
}

/// A transfer's spans: given with the call (checked here), or prepared (checked once by
/// the user's call that prepared them).
#[derive(Clone)]
pub enum TransferSpans {
    /// Given with the call.
    Given(Vec<WireSpan>),
    /// A prepared transfer's.
    Prepared(Arc<PreparedSpans>),
}

/// The spans of a prepared transfer and its id (unique in its context).
pub struct PreparedSpans {
    /// The prepared transfer's id.
    pub id: u64,
    /// Its spans, checked once.
    pub spans: Vec<WireSpan>,
}

impl TransferSpans {
    /// The spans.
    pub fn as_slice(&self) -> &[WireSpan] {
        match self {
            TransferSpans::Given(spans) => spans,
            TransferSpans::Prepared(p) => &p.spans,
        }
    }

    /// The prepared transfer's id, if prepared.
    pub fn prepared(&self) -> Option<u64> {
        match self {
            TransferSpans::Given(_) => None,
            TransferSpans::Prepared(p) => Some(p.id),
        }
    }

    /// The transfer these spans are, as the lane sees it.
    pub(in crate::connection) fn local<'a, P: Payload>(
        &'a self,
        op: TransferOp,
        local: &'a Arc<RegistrationInner<P>>,
        grant: u64,
    ) -> LocalTransfer<'a, P> {
        LocalTransfer { op, local, grant, spans: self.as_slice(), prepared: self.prepared() }
    }

    pub(in crate::connection) fn into_vec(self) -> Vec<WireSpan> {
        match self {
            TransferSpans::Given(spans) => spans,
            TransferSpans::Prepared(p) => p.spans.clone(),
        }
    }
}
