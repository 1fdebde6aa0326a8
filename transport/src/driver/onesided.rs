//! One-sided requests of one connection, as the progress thread takes them from user
//! threads (the protocol is `connection/onesided.rs`).

use super::conn::ConnDriver;
use super::lane::LaneContext;
use super::spans;
use crate::command::{ImportSlot, NotificationSlot, TransferSlot};
use crate::payload::TransferArgs;
use ferrylink_proto::region::RemoteKey;
use std::time::Instant;

impl ConnDriver {
    /// The user imports `key` on this connection.
    pub fn import(&mut self, id: u64, key: RemoteKey, slot: ImportSlot, ctx: &LaneContext) {
        if slot.is_abandoned() {
            return;
        }
        self.requests_mut().add_import(id, slot);
        let now = Instant::now();
        self.drive(ctx, |core, _, _| core.import(id, key, now));
    }

    /// The user starts a transfer.
    pub fn transfer(&mut self, id: u64, args: TransferArgs, slot: TransferSlot, ctx: &LaneContext) {
        tracing::trace!("transfer command taken");
        let span = spans::onesided_span(id, &args);
        self.requests_mut().add_transfer(id, slot, span.clone());
        let _in_transfer = span.entered();
        let now = Instant::now();
        self.drive(ctx, |core, lane, _| core.transfer(id, args, now, lane));
    }

    /// The user waits for a notification.
    pub fn recv_notification(&mut self, id: u64, slot: NotificationSlot, ctx: &LaneContext) {
        if slot.is_abandoned() {
            return;
        }
        self.requests_mut().add_notification(id, slot);
        self.drive(ctx, |core, _, _| core.recv_notification(id));
    }

    /// A notification completed into a dropped handle.
    pub fn return_notification(&mut self, data: Vec<u8>, ctx: &LaneContext) {
        self.drive(ctx, |core, _, _| core.return_notification(data));
    }

    /// The user dropped its region of `grant`.
    pub fn unimport(&mut self, grant: u64, ctx: &LaneContext) {
        self.drive(ctx, |core, lane, _| core.unimport(grant, lane));
    }

    /// The user dropped prepared transfer `prepared`.
    pub fn unprepare(&mut self, prepared: u64, ctx: &LaneContext) {
        self.drive(ctx, |core, lane, _| core.unprepare(prepared, lane));
    }

    /// Registration `registration` was revoked.
    pub fn revoke(&mut self, registration: u64, ctx: &LaneContext) {
        self.drive(ctx, |core, _, _| core.revoke_registration(registration));
    }
}
