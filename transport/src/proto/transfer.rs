//! A one-sided transfer as the user asks for it ([`TransferArgs`]): the local
//! registration, the grant, the op, its spans (or a prepared transfer's) and the
//! notification. The core checks and runs it (`initiate.rs`).

use super::lane::LocalTransfer;
use crate::region::RegistrationInner;
use crate::wire::{TransferOp, WireSpan};
use std::sync::Arc;

/// A transfer as the user asked for it.
pub(crate) struct TransferArgs {
    pub op: TransferOp,
    pub local: Arc<RegistrationInner>,
    pub grant: u64,
    pub spans: TransferSpans,
    pub notify: Option<Vec<u8>>,
}

/// A transfer's spans: given with the call (checked here), or prepared (checked once by
/// the user's call that prepared them).
#[derive(Clone)]
pub(crate) enum TransferSpans {
    Given(Vec<WireSpan>),
    Prepared(Arc<PreparedSpans>),
}

/// The spans of a prepared transfer and its id (unique in its context).
pub(crate) struct PreparedSpans {
    pub id: u64,
    pub spans: Vec<WireSpan>,
}

impl TransferSpans {
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
    pub(in crate::proto) fn local<'a>(
        &'a self,
        op: TransferOp,
        local: &'a Arc<RegistrationInner>,
        grant: u64,
    ) -> LocalTransfer<'a> {
        LocalTransfer { op, local, grant, spans: self.as_slice(), prepared: self.prepared() }
    }

    pub(in crate::proto) fn into_vec(self) -> Vec<WireSpan> {
        match self {
            TransferSpans::Given(spans) => spans,
            TransferSpans::Prepared(p) => p.spans.clone(),
        }
    }
}
