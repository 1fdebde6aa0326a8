//! The plain-data descriptors a sender puts on the wire (the transport's wire module
//! encodes them) and their validation on the receiver: descriptors come from a peer and
//! are untrusted.

use super::error::CudaIpcError;

/// One device frame exported with legacy CUDA IPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpcMemDescriptor {
    /// `cuIpcGetMemHandle` of the allocation base.
    pub handle: [u8; 64],
    /// `CU_POINTER_ATTRIBUTE_BUFFER_ID` of the allocation in the exporter: a freed and
    /// reallocated range at the same address gets a new id, so a stale mapping is never
    /// reused.
    pub buffer_id: u64,
    /// Size of the whole allocation.
    pub alloc_len: u64,
    /// Offset of the frame in the allocation.
    pub offset: u64,
    /// Length of the frame.
    pub len: u64,
    /// UUID of the device holding the allocation.
    pub device_uuid: [u8; 16],
}

/// An interprocess event the receiver waits on before its copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpcEventDescriptor {
    /// `cuIpcGetEventHandle` of the event.
    pub handle: [u8; 64],
}

impl IpcMemDescriptor {
    /// Size of [`IpcMemDescriptor::to_bytes`].
    pub const ENCODED_LEN: usize = 64 + 8 * 4 + 16;

    /// Checks that the frame lies inside the allocation (no overflow).
    pub fn validate(&self) -> Result<(), CudaIpcError> {
        if self.alloc_len == 0 {
            return Err(CudaIpcError::InvalidDescriptor("allocation length 0".into()));
        }
        check_range(self.offset, self.len, self.alloc_len)
    }

    /// A fixed little-endian encoding (tests, logs; the wire module may use its own).
    pub fn to_bytes(&self) -> [u8; Self::ENCODED_LEN] {
        let mut out = [0u8; Self::ENCODED_LEN];
        out[..64].copy_from_slice(&self.handle);
        out[64..72].copy_from_slice(&self.buffer_id.to_le_bytes());
        out[72..80].copy_from_slice(&self.alloc_len.to_le_bytes());
        out[80..88].copy_from_slice(&self.offset.to_le_bytes());
        out[88..96].copy_from_slice(&self.len.to_le_bytes());
        out[96..112].copy_from_slice(&self.device_uuid);
        out
    }

    /// Decodes [`IpcMemDescriptor::to_bytes`] and validates the result.
    pub fn from_bytes(b: &[u8]) -> Result<Self, CudaIpcError> {
        if b.len() != Self::ENCODED_LEN {
            return Err(CudaIpcError::InvalidDescriptor(format!("{} bytes, expected {}", b.len(), Self::ENCODED_LEN)));
        }
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let mut handle = [0u8; 64];
        handle.copy_from_slice(&b[..64]);
        let mut device_uuid = [0u8; 16];
        device_uuid.copy_from_slice(&b[96..112]);
        let d = IpcMemDescriptor {
            handle,
            buffer_id: u64_at(64),
            alloc_len: u64_at(72),
            offset: u64_at(80),
            len: u64_at(88),
            device_uuid,
        };
        d.validate()?;
        Ok(d)
    }
}

/// `offset..offset+len` inside `0..limit`, without overflow.
pub(crate) fn check_range(offset: u64, len: u64, limit: u64) -> Result<(), CudaIpcError> {
    match offset.checked_add(len) {
        Some(end) if end <= limit => Ok(()),
        _ => Err(CudaIpcError::InvalidDescriptor(format!(
            "range {offset}+{len} exceeds the allocation of {limit} bytes"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn desc(alloc_len: u64, offset: u64, len: u64) -> IpcMemDescriptor {
        IpcMemDescriptor { handle: [7; 64], buffer_id: 42, alloc_len, offset, len, device_uuid: [1; 16] }
    }

    #[test]
    fn validation() {
        assert!(desc(100, 0, 100).validate().is_ok());
        assert!(desc(100, 100, 0).validate().is_ok());
        assert!(desc(100, 50, 51).validate().is_err());
        assert!(desc(100, 101, 0).validate().is_err());
        assert!(desc(0, 0, 0).validate().is_err());
        assert!(desc(u64::MAX, u64::MAX, 2).validate().is_err());
    }

    #[test]
    fn bytes_round_trip_and_reject() {
        let d = desc(4096, 512, 1024);
        assert_eq!(IpcMemDescriptor::from_bytes(&d.to_bytes()), Ok(d));
        assert!(IpcMemDescriptor::from_bytes(&d.to_bytes()[..100]).is_err());
        let bad = desc(10, 5, 6).to_bytes();
        assert!(IpcMemDescriptor::from_bytes(&bad).is_err());
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(d) = IpcMemDescriptor::from_bytes(&b) {
                prop_assert!(d.offset.checked_add(d.len).is_some_and(|e| e <= d.alloc_len));
            }
        }
    }
}
