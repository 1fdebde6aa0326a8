//! One-sided transfers on the UCX lane: UCX's RMA (`ucp_mem_map`, packed rkeys,
//! `ucp_put_nbx` / `ucp_get_nbx`, an endpoint flush before a put counts as done).
//!
//! The owner maps a registration when the peer imports it (once per connection, kept
//! while any grant of it lives) and describes it as `GrantedMemory::Rma`: address, packed
//! rkey, device or not. The importer unpacks the rkey for its endpoint and runs every
//! transfer it initiates itself (the owner's worker only answers UCX, which the progress
//! thread does anyway). A put is done once a flush issued behind it completed, so the
//! data is visible at the owner before the core sends the notification.
//!
//! Device memory goes to UCX as such only when both sides' UCX is CUDA-aware: the owner
//! grants device memory as `Rma` only then, and the core refuses a transfer between host
//! and device memory, so a device span of this side always meets a CUDA-aware UCX.
//! Otherwise (and for every registration with `FERRYLINK_UCX_STAGED=1`) the owner grants
//! it as `Staged` and runs each transfer on it through pinned host memory on both sides
//! (`staged.rs`). RMA is opt-in
//! (`FERRYLINK_UCX_RMA=1`, see `Config::ucx_rma`): without it an import is refused
//! with that explanation.

use super::engine::UcxEngine;
use super::onesided_state::{Mapped, RegisteredMemory, RmaOp, RmaTransfer};
use super::UcxLane;
use crate::payload::{LaneEvent, LaneGrant, LocalTransfer, PeerTransfer, RegistrationInner};
use ferrylink_proto::connection::lane::{DescribedTransfer, LaneFailure};
use ferrylink_proto::wire::{GrantedMemory, GrantedRegion, TransferOp, WireSpan};
use ferrylink_ucx::{RegionKey, RmaSpan};
use std::sync::Arc;

/// Why one-sided transfers are off on a context without RMA.
const RMA_OFF: &str = "one-sided transfers over UCX need FERRYLINK_UCX_RMA=1 on both sides";

fn rma_spans(spans: &[WireSpan]) -> Vec<RmaSpan> {
    spans.iter().map(|s| RmaSpan::new(s.local_offset as usize, s.remote_offset, s.len as usize)).collect()
}

impl UcxLane {
    fn rma_engine(&self) -> Result<&UcxEngine, String> {
        if self.engine.rma {
            Ok(&self.engine)
        } else {
            Err(format!("{RMA_OFF} (this side has it off)"))
        }
    }

    /// Owner side: grants the registration `key` names, mapped for the peer.
    pub(super) fn rma_grant(&mut self, key: &ferrylink_proto::region::RemoteKey) -> Result<LaneGrant, String> {
        self.rma_engine()?;
        let registry = self.registry.clone().ok_or("this lane has no registrations")?;
        let registration = registry.grant(key)?;
        match self.map_for_peer(&registration) {
            Ok(memory) => Ok(LaneGrant { registration, memory, regions: Vec::new() }),
            Err(reason) => {
                registry.release_grant(registration.id);
                Err(reason)
            }
        }
    }

    /// Maps `registration` (once per connection) and describes it for the peer; or, where
    /// UCX is not to move it (device memory unless both sides' UCX is CUDA-aware, any
    /// memory with `FERRYLINK_UCX_STAGED=1`), grants it staged.
    fn map_for_peer(&mut self, registration: &Arc<RegistrationInner>) -> Result<GrantedMemory, String> {
        let device = registration.is_device();
        let direct = self.conn.as_ref().is_some_and(|c| c.direct_device);
        if self.settings.staged_onesided || (device && !direct) {
            return Ok(GrantedMemory::Staged { device });
        }
        if !self.onesided.mapped.contains_key(&registration.id) {
            let mapping = self.engine.register(RegisteredMemory(registration.clone()));
            let registration_map = mapping.map_err(|e| format!("mapping the registration for UCX: {e}"))?;
            self.onesided.mapped.insert(registration.id, Mapped { registration: registration_map, grants: 0 });
        }
        let mapped = self.onesided.mapped.get_mut(&registration.id).ok_or("the mapping is gone")?;
        let key = match mapped.registration.region_key() {
            Ok(key) => key,
            Err(e) => {
                let reason = format!("packing the registration's UCX key: {e}");
                if mapped.grants == 0 {
                    self.onesided.mapped.remove(&registration.id);
                }
                return Err(reason);
            }
        };
        mapped.grants += 1;
        Ok(GrantedMemory::Rma { address: key.address, rkey: key.rkey, device })
    }

    /// Owner side: a grant of `registration` ended; the mapping goes with its last grant.
    pub(super) fn rma_release(&mut self, registration: u64) {
        if let Some(mapped) = self.onesided.mapped.get_mut(&registration) {
            mapped.grants = mapped.grants.saturating_sub(1);
            if mapped.grants == 0 {
                self.onesided.mapped.remove(&registration);
            }
        }
        if let Some(r) = &self.registry {
            r.release_grant(registration);
        }
    }

    /// Importer side: unpacks the owner's key for this connection's endpoint.
    pub(super) fn rma_open(&mut self, granted: &GrantedRegion) -> Result<(), String> {
        self.rma_engine()?;
        if let GrantedMemory::Staged { .. } = granted.memory {
            // The owner runs every transfer on it: nothing to open.
            self.onesided.staged.grants.insert(granted.grant);
            return Ok(());
        }
        let GrantedMemory::Rma { address, rkey, device } = &granted.memory else {
            return Err("memory of another lane on the UCX lane".into());
        };
        let conn = self.conn.as_ref().ok_or("the UCX endpoint is closed")?;
        if *device && !conn.direct_device {
            return Err("the peer's device memory is reached over UCX only when both sides' UCX is CUDA-aware".into());
        }
        let region = RegionKey { address: *address, length: granted.len, rkey: rkey.clone() };
        let key = conn.endpoint.unpack_rkey(&region).map_err(|e| format!("the owner's UCX key: {e}"))?;
        self.onesided.opened.insert(granted.grant, key);
        Ok(())
    }

    /// Importer side: the grant is no longer used.
    pub(super) fn rma_close(&mut self, grant: u64) {
        self.onesided.opened.remove(&grant);
        self.onesided.staged.grants.remove(&grant);
    }

    /// Whether this side runs transfer `t` (not on a staged grant, whose owner runs it).
    pub(super) fn rma_runs(&self, t: &LocalTransfer<'_>) -> bool {
        !self.onesided.staged.grants.contains(&t.grant)
    }

    /// Initiator side, staged grant: prepares this side's memory for the owner.
    pub(super) fn staged_describe(
        &mut self,
        id: u64,
        t: &LocalTransfer<'_>,
    ) -> Result<Option<DescribedTransfer>, String> {
        self.rma_engine()?;
        self.onesided.staged.describe((&self.engine, &self.device), id, t)
    }

    /// Initiator side, staged grant: the owner answered; whether the transfer is over.
    pub(super) fn staged_answered(&mut self, id: u64, done: bool) -> Result<bool, String> {
        self.onesided.staged.answered(&self.device, id, done)
    }

    /// Owner side: runs a transfer the peer asked for on a staged grant.
    pub(super) fn staged_run(&mut self, id: u64, t: &PeerTransfer<'_>) -> Result<(), LaneFailure> {
        self.rma_engine().map_err(LaneFailure::local)?;
        let conn = self.conn.as_ref().ok_or_else(|| LaneFailure::local("the UCX endpoint is closed"))?;
        self.onesided.staged.run((&self.engine, &self.device, &conn.endpoint), id, t)
    }

    /// Starts transfer `id` (puts are followed by a flush).
    pub(super) fn rma_start(&mut self, id: u64, t: &LocalTransfer<'_>) -> Result<(), String> {
        self.rma_engine()?;
        let conn = self.conn.as_ref().ok_or("the UCX endpoint is closed")?;
        let key = self.onesided.opened.get(&t.grant).ok_or("the region is not open on this side")?;
        if t.local.is_device() && !self.engine.cuda_aware {
            // Unreachable through the core: device memory meets device memory, which is
            // granted `Rma` only when both sides' UCX is CUDA-aware (else `Staged`, whose
            // owner runs it). Kept so a UCX without CUDA is never handed a device pointer.
            return Err(
                "device memory over UCX needs a CUDA-aware UCX here (the owner grants it staged otherwise)".into()
            );
        }
        let ep = &conn.endpoint;
        let op = match t.op {
            TransferOp::Put => {
                let put = ep.put_spans(key, RegisteredMemory(t.local.clone()), &rma_spans(t.spans));
                RmaOp::Put(put.map_err(|r| r.error.to_string())?)
            }
            TransferOp::Get => {
                let get = ep.get_spans(key, RegisteredMemory(t.local.clone()), &rma_spans(t.spans));
                RmaOp::Get(get.map_err(|r| r.error.to_string())?)
            }
        };
        let flush = match t.op {
            TransferOp::Put => Some(ep.flush().map_err(|e| format!("flushing the put: {e}"))?),
            TransferOp::Get => None,
        };
        self.onesided.transfers.push(RmaTransfer { id, op, flush });
        Ok(())
    }

    /// Reports the transfers that finished; whether any still runs.
    pub(super) fn rma_poll(&mut self, events: &mut Vec<LaneEvent>) -> bool {
        let endpoint = self.conn.as_ref().map(|c| &c.endpoint);
        self.onesided.staged.poll((&self.device, endpoint), events);
        let mut i = 0;
        while i < self.onesided.transfers.len() {
            match poll_transfer(&mut self.onesided.transfers[i]) {
                None => i += 1,
                Some(result) => {
                    let t = self.onesided.transfers.swap_remove(i);
                    events.push(LaneEvent::TransferFinished { id: t.id, result });
                }
            }
        }
        self.onesided.busy()
    }
}

/// `None` while the transfer runs; then its result.
fn poll_transfer(t: &mut RmaTransfer) -> Option<Result<(), String>> {
    let polled = match &mut t.op {
        RmaOp::Put(p) => p.poll(),
        RmaOp::Get(g) => g.poll(),
    };
    if let Err(status) = polled? {
        return Some(Err(format!("the UCX transfer failed: {status}")));
    }
    if let Some(flush) = &mut t.flush {
        match flush.poll()? {
            Ok(()) => t.flush = None,
            Err(status) => return Some(Err(format!("flushing the put failed: {status}"))),
        }
    }
    Some(Ok(()))
}
