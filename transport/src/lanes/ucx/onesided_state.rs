//! [`UcxOneSided`]: the one-sided state of a UCX connection: this side's registrations
//! mapped for the peer ([`RegisteredMemory`]), the peer's keys, the RMA transfers running
//! and those staged through pinned memory.

use super::staged::StagedTransfers;
use crate::payload::RegistrationInner;
use ferrylink_memory::Frame;
use ferrylink_ucx::{EndpointFlush, Get, MemoryType, Put, RecvBuf, Registration, RemoteKey, SendBuf};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

/// A registration's memory handed to UCX: the registration stays alive (and its memory
/// with it) as long as UCX holds this.
pub(super) struct RegisteredMemory(pub(super) Arc<RegistrationInner>);

impl RegisteredMemory {
    pub(super) fn address(&self) -> *mut c_void {
        match &self.0.frame {
            Frame::Host(h) => h.as_slice().as_ptr().cast_mut().cast(),
            Frame::Device(d) => d.device_ptr() as usize as *mut c_void,
        }
    }

    pub(super) fn kind(&self) -> MemoryType {
        match self.0.frame {
            Frame::Host(_) => MemoryType::Host,
            Frame::Device(_) => MemoryType::Cuda,
        }
    }
}

// SAFETY: the pointer and length describe the registration's whole frame, which the Arc
// keeps alive (host memory mapped, device memory allocated) for as long as UCX holds this;
// the memory type is the frame's own.
unsafe impl SendBuf for RegisteredMemory {
    fn as_ptr(&self) -> *const c_void {
        self.address()
    }
    fn len(&self) -> usize {
        self.0.frame.len()
    }
    fn memory_type(&self) -> MemoryType {
        self.kind()
    }
}

// SAFETY: as for `SendBuf`. Registered memory is shared by design: peers write it while
// the user holds the registration, as the native lane's mapped grants do.
unsafe impl RecvBuf for RegisteredMemory {
    fn as_mut_ptr(&mut self) -> *mut c_void {
        self.address()
    }
    fn len(&self) -> usize {
        self.0.frame.len()
    }
    fn memory_type(&self) -> MemoryType {
        self.kind()
    }
}

/// A registration of this side mapped for the peer, with the grants that use it.
pub(super) struct Mapped {
    pub(super) registration: Registration<RegisteredMemory>,
    pub(super) grants: usize,
}

/// What a transfer of this side waits for.
pub(super) enum RmaOp {
    Put(Put<RegisteredMemory>),
    Get(Get<RegisteredMemory>),
}

/// A transfer this side runs.
pub(super) struct RmaTransfer {
    pub(super) id: u64,
    pub(super) op: RmaOp,
    /// A put's flush: the data is at the owner once it completed.
    pub(super) flush: Option<EndpointFlush>,
}

/// The one-sided state of a UCX connection.
#[derive(Default)]
pub(super) struct UcxOneSided {
    /// This side's registrations mapped for the peer, by registration id.
    pub(super) mapped: HashMap<u64, Mapped>,
    /// The peer's regions this side imported, by grant.
    pub(super) opened: HashMap<u64, RemoteKey>,
    pub(super) transfers: Vec<RmaTransfer>,
    /// Transfers through pinned host memory, this side's and the peer's.
    pub(super) staged: StagedTransfers,
}

impl UcxOneSided {
    /// Whether a transfer is still running.
    pub fn busy(&self) -> bool {
        !self.transfers.is_empty() || self.staged.busy()
    }

    /// The connection ended: drops the transfers (UCX keeps their buffers until it is
    /// done with them), the peer's keys and this side's mappings.
    pub fn clear(&mut self) {
        self.staged.clear();
        self.transfers.clear();
        self.opened.clear();
        self.mapped.clear();
    }
}
