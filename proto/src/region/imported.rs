//! [`ImportedRegion`]: what the owner answered to an import, the data both the core and
//! the user's handle keep of a peer's region.

use crate::remote_key::Access;

/// What an import answered (the core's completion).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImportedRegion {
    /// The grant the owner made for this import.
    pub grant: u64,
    /// Bytes of the region.
    pub len: u64,
    /// What the owner allows.
    pub access: Access,
    /// Whether the region is device memory.
    pub device: bool,
}
