//! [`RegistrationInner`]: one registration's memory and what it grants, as the core and
//! the lanes see it. The context's table of registrations is the transport's.

use crate::payload::Payload;
use crate::remote_key::{Access, MemoryKind, RemoteKey};

/// One registration's memory and what it grants.
#[derive(Debug)]
pub struct RegistrationInner<P: Payload> {
    /// The registration's id in its context.
    pub id: u64,
    /// What peers may do with it.
    pub access: Access,
    /// The memory registered.
    pub frame: P::Frame,
    /// The key peers present to import it.
    pub key: RemoteKey,
}

impl<P: Payload> RegistrationInner<P> {
    /// Bytes registered.
    pub fn len(&self) -> u64 {
        P::frame_len(&self.frame) as u64
    }

    /// Whether no bytes are registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the memory is device memory.
    pub fn is_device(&self) -> bool {
        self.key.memory == MemoryKind::Device
    }
}
