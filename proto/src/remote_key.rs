//! [`RemoteKey`]: what a registration grants, as bytes the user ships any way (a message
//! header, a file, a key-value store), and [`Access`].
//!
//! The key names the owning context (a random 128-bit id), the registration and a random
//! 64-bit secret, the length and the access granted. It carries no address and no handle:
//! a peer that presents it asks the owner over an endpoint (the transport's `Endpoint::import`),
//! and the owner checks that the key is its own, that the registration is still live and
//! that the secret matches before it exports anything. Bytes from elsewhere are parsed
//! with every field checked ([`RemoteKey::from_bytes`]).

use thiserror::Error;

/// Bytes of an encoded key.
pub const KEY_LEN: usize = 48;
const MAGIC: [u8; 4] = *b"FLRK";
const KEY_VERSION: u8 = 1;

/// What a registration lets a peer do with its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// The peer may read it (`get`).
    Read,
    /// The peer may write it (`put`).
    Write,
    /// Both.
    ReadWrite,
}

impl Access {
    /// Whether a peer may read.
    pub fn allows_read(self) -> bool {
        matches!(self, Access::Read | Access::ReadWrite)
    }

    /// Whether a peer may write.
    pub fn allows_write(self) -> bool {
        matches!(self, Access::Write | Access::ReadWrite)
    }

    pub(crate) fn to_byte(self) -> u8 {
        match self {
            Access::Read => 1,
            Access::Write => 2,
            Access::ReadWrite => 3,
        }
    }

    pub(crate) fn from_byte(b: u8) -> Option<Access> {
        match b {
            1 => Some(Access::Read),
            2 => Some(Access::Write),
            3 => Some(Access::ReadWrite),
            _ => None,
        }
    }
}

/// Where a registration's memory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// Host memory (a shared memfd buffer).
    Host,
    /// Device memory.
    Device,
}

/// Why bytes are not a key.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum KeyError {
    /// Too short or too long.
    #[error("a remote key has {KEY_LEN} bytes, not {0}")]
    Length(usize),
    /// Not a ferrylink key.
    #[error("not a ferrylink remote key (wrong magic)")]
    Magic,
    /// A key of another version.
    #[error("remote key version {0} (this build reads {KEY_VERSION})")]
    Version(u8),
    /// An access byte that means nothing.
    #[error("remote key with an unknown access {0}")]
    Access(u8),
    /// A memory byte that means nothing.
    #[error("remote key with an unknown memory kind {0}")]
    Memory(u8),
    /// Bytes that must be zero are not.
    #[error("remote key with reserved bytes set")]
    Reserved,
}

/// A registration as a peer can present it to import it (the transport's `Endpoint::import`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteKey {
    pub(crate) context: [u8; 16],
    pub(crate) registration: u64,
    pub(crate) secret: u64,
    pub(crate) len: u64,
    pub(crate) access: Access,
    pub(crate) memory: MemoryKind,
}

impl RemoteKey {
    /// The key as bytes: magic, version, access, memory, a reserved byte, the owning
    /// context's id, the registration, the secret, the length (little-endian).
    pub fn to_bytes(&self) -> [u8; KEY_LEN] {
        let mut out = [0u8; KEY_LEN];
        out[..4].copy_from_slice(&MAGIC);
        out[4] = KEY_VERSION;
        out[5] = self.access.to_byte();
        out[6] = match self.memory {
            MemoryKind::Host => 1,
            MemoryKind::Device => 2,
        };
        out[8..24].copy_from_slice(&self.context);
        out[24..32].copy_from_slice(&self.registration.to_le_bytes());
        out[32..40].copy_from_slice(&self.secret.to_le_bytes());
        out[40..48].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    /// Parses bytes made by [`RemoteKey::to_bytes`]; anything else is an error.
    pub fn from_bytes(bytes: &[u8]) -> Result<RemoteKey, KeyError> {
        let bytes: &[u8; KEY_LEN] = bytes.try_into().map_err(|_| KeyError::Length(bytes.len()))?;
        if bytes[..4] != MAGIC {
            return Err(KeyError::Magic);
        }
        if bytes[4] != KEY_VERSION {
            return Err(KeyError::Version(bytes[4]));
        }
        let access = Access::from_byte(bytes[5]).ok_or(KeyError::Access(bytes[5]))?;
        let memory = match bytes[6] {
            1 => MemoryKind::Host,
            2 => MemoryKind::Device,
            other => return Err(KeyError::Memory(other)),
        };
        if bytes[7] != 0 {
            return Err(KeyError::Reserved);
        }
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let mut context = [0u8; 16];
        context.copy_from_slice(&bytes[8..24]);
        Ok(RemoteKey { context, registration: word(24), secret: word(32), len: word(40), access, memory })
    }

    /// Bytes of memory the key grants.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it grants no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What it lets the peer do.
    pub fn access(&self) -> Access {
        self.access
    }

    /// Where the memory is.
    pub fn memory(&self) -> MemoryKind {
        self.memory
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> RemoteKey {
        RemoteKey {
            context: [9; 16],
            registration: 7,
            secret: 0xDEAD_BEEF_0123_4567,
            len: 1 << 30,
            access: Access::Write,
            memory: MemoryKind::Device,
        }
    }

    #[test]
    fn a_key_round_trips_through_its_bytes() {
        let k = sample();
        assert_eq!(RemoteKey::from_bytes(&k.to_bytes()), Ok(k));
        for access in [Access::Read, Access::Write, Access::ReadWrite] {
            let k = RemoteKey { access, memory: MemoryKind::Host, ..sample() };
            assert_eq!(RemoteKey::from_bytes(&k.to_bytes()), Ok(k));
        }
    }

    #[test]
    fn every_field_of_foreign_bytes_is_checked() {
        let good = sample().to_bytes();
        assert_eq!(RemoteKey::from_bytes(&good[..47]), Err(KeyError::Length(47)));
        assert_eq!(RemoteKey::from_bytes(&[good.as_slice(), &[0]].concat()), Err(KeyError::Length(49)));
        assert_eq!(RemoteKey::from_bytes(&[]), Err(KeyError::Length(0)));
        let with = |i: usize, v: u8| {
            let mut b = good;
            b[i] = v;
            RemoteKey::from_bytes(&b)
        };
        assert_eq!(with(0, b'X'), Err(KeyError::Magic));
        assert_eq!(with(4, 2), Err(KeyError::Version(2)));
        assert_eq!(with(5, 0), Err(KeyError::Access(0)));
        assert_eq!(with(5, 4), Err(KeyError::Access(4)));
        assert_eq!(with(6, 3), Err(KeyError::Memory(3)));
        assert_eq!(with(7, 1), Err(KeyError::Reserved));
        assert!(!Access::Read.allows_write() && Access::Read.allows_read());
        assert!(Access::Write.allows_write() && !Access::Write.allows_read());
        assert!(Access::ReadWrite.allows_write() && Access::ReadWrite.allows_read());
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic_and_accepted_ones_round_trip(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(k) = RemoteKey::from_bytes(&bytes) {
                let again = k.to_bytes();
                prop_assert_eq!(again.as_slice(), bytes.as_slice());
            }
        }
    }
}
