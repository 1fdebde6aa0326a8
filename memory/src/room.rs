//! The meeting point of the transport's receive path and the spill store.

use thiserror::Error;

/// "Make room for N device bytes": the receive path calls this before it lands an incoming
/// device frame; `ferrylink-spill`'s `SpillStore` implements it by evicting least-recently
/// used entries to host memory and disk.
pub trait MakeRoom: Send + Sync {
    /// Ensure `bytes` more device bytes fit under the budget of `device_ordinal`.
    fn make_room(&self, device_ordinal: usize, bytes: usize) -> Result<(), NoRoom>;
}

/// Room could not be made.
#[derive(Debug, Error)]
#[error("no room for {requested} device bytes on device {device_ordinal}: {reason}")]
pub struct NoRoom {
    /// The device asked for.
    pub device_ordinal: usize,
    /// Bytes asked for.
    pub requested: usize,
    /// Why not.
    pub reason: String,
}
