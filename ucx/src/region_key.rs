//! `RegionKey`: what a peer needs to reach a registration (its address range and UCX's
//! packed rkey), and the checks such bytes pass before UCX parses them.
//!
//! A `RegionKey` crosses process boundaries, so on the receiving side every field is
//! untrusted. `ucp_ep_rkey_unpack` takes no length: it walks the packed rkey by the sizes
//! written inside it, and each transport then reads its own key size from where its entry
//! starts, whatever size the entry declared. So before UCX sees the bytes:
//!
//! - the framing is checked against the UCX layout (1.13 through 1.22): a `u64` map of
//!   memory domains, a memory-type byte, then for every domain in the map a size byte and
//!   that many bytes, then at most [`MAX_RKEY_TRAILER`] bytes (UCX 1.20 and later append
//!   a system-device byte, the distances to up to 64 devices of 3 bytes each and a
//!   terminator);
//! - the memory type must be host or CUDA (UCX indexes tables with it);
//! - the bytes are copied into a buffer followed by [`RKEY_PADDING`] bytes of `0xff`
//!   (`UCS_SYS_DEVICE_ID_UNKNOWN`, UCX's terminator): a transport key declared shorter
//!   than its transport reads, or UCX 1.20's terminator-delimited distance list, then
//!   reads padding, never past the allocation.
//!
//! What is *not* checked: the contents of each transport's key (UCX alone knows them;
//! a shared-memory key names a segment UCX then attaches), and whether the range is
//! really what the peer registered. The range is what the peer declares, and puts and
//! gets are kept inside it ([`UcxEndpoint::put`](super::UcxEndpoint::put)).

use super::buffer::MemoryType;

/// Bytes before the first transport key: the memory-domain map (`u64`) and the memory
/// type (`u8`).
const RKEY_HEADER_LEN: usize = 9;
/// The most bytes UCX may write after the transport keys: the system device (1), the
/// distance to each of up to 64 devices (3 each) and a terminator (1).
pub const MAX_RKEY_TRAILER: usize = 1 + 64 * 3 + 1;
/// The longest packed rkey accepted: a header, 64 memory domains with keys of at most
/// 255 bytes (UCX asserts that bound when it packs), and the trailer.
pub const MAX_PACKED_RKEY_LEN: usize = RKEY_HEADER_LEN + 64 * (1 + 255) + MAX_RKEY_TRAILER;
/// `0xff` bytes after the copy handed to `ucp_ep_rkey_unpack` (see the module docs).
pub(crate) const RKEY_PADDING: usize = 256;

/// Everything a peer needs to put into and get from a registration: the registered range
/// and UCX's packed rkey for it. Plain data: ship it to the peer in any encoding
/// (made by [`Registration::region_key`](super::Registration::region_key), used by
/// [`UcxEndpoint::unpack_rkey`](super::UcxEndpoint::unpack_rkey)).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RegionKey {
    /// Address of the first registered byte, in the owner's address space (a device
    /// address for CUDA memory).
    pub address: u64,
    /// Registered bytes from `address` on.
    pub length: u64,
    /// UCX's packed rkey (`ucp_rkey_pack`), byte for byte.
    pub rkey: Vec<u8>,
}

impl std::fmt::Debug for RegionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionKey")
            .field("address", &format_args!("{:#x}", self.address))
            .field("length", &self.length)
            .field("rkey_bytes", &self.rkey.len())
            .finish()
    }
}

/// Why bytes given as a [`RegionKey`] were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyFault {
    /// The range holds no bytes.
    #[error("the region is empty")]
    EmptyRange,
    /// The range starts at address 0.
    #[error("the region starts at address 0")]
    NullAddress,
    /// `address + length` does not fit in 64 bits.
    #[error("the region {address:#x} + {length} bytes runs past the end of the address space")]
    RangeOverflow {
        /// The declared start.
        address: u64,
        /// The declared length.
        length: u64,
    },
    /// Fewer bytes than the packed rkey's header.
    #[error("{len} bytes are shorter than a packed rkey's header ({RKEY_HEADER_LEN} bytes)")]
    TooShort {
        /// Bytes given.
        len: usize,
    },
    /// More bytes than any packed rkey has.
    #[error("{len} bytes are longer than any packed rkey ({MAX_PACKED_RKEY_LEN} bytes)")]
    TooLong {
        /// Bytes given.
        len: usize,
    },
    /// A memory type other than host or CUDA.
    #[error("memory type {0} is neither host nor CUDA")]
    MemoryType(u8),
    /// The key of a memory domain named in the map runs past the end of the bytes.
    #[error("the key of memory domain {domain} runs past the end of the {len} bytes")]
    Truncated {
        /// Index of the memory domain.
        domain: u32,
        /// Bytes given.
        len: usize,
    },
    /// More bytes after the transport keys than UCX writes there.
    #[error("{extra} bytes follow the transport keys (UCX writes at most {MAX_RKEY_TRAILER})")]
    TrailingBytes {
        /// Bytes after the last transport key.
        extra: usize,
    },
}

/// A [`RegionKey`] that passed the checks: its range, its memory type, and the packed
/// rkey copied with its padding, ready for `ucp_ep_rkey_unpack`.
pub(crate) struct CheckedRegionKey {
    pub(crate) address: u64,
    pub(crate) length: u64,
    pub(crate) memory_type: MemoryType,
    /// The packed rkey followed by [`RKEY_PADDING`] bytes of `0xff`.
    pub(crate) padded_rkey: Vec<u8>,
}

impl RegionKey {
    /// Checks every field (see the module docs) and copies the rkey for UCX.
    pub(crate) fn check(&self) -> Result<CheckedRegionKey, KeyFault> {
        check_range(self.address, self.length)?;
        let memory_type = check_packed_rkey(&self.rkey)?;
        let mut padded_rkey = Vec::with_capacity(self.rkey.len() + RKEY_PADDING);
        padded_rkey.extend_from_slice(&self.rkey);
        padded_rkey.resize(self.rkey.len() + RKEY_PADDING, 0xff);
        Ok(CheckedRegionKey { address: self.address, length: self.length, memory_type, padded_rkey })
    }
}

/// A range can be reached when it is non-empty, does not start at 0 and does not wrap.
fn check_range(address: u64, length: u64) -> Result<(), KeyFault> {
    if length == 0 {
        return Err(KeyFault::EmptyRange);
    }
    if address == 0 {
        return Err(KeyFault::NullAddress);
    }
    if address.checked_add(length).is_none() {
        return Err(KeyFault::RangeOverflow { address, length });
    }
    Ok(())
}

/// Checks the framing of a packed rkey (module docs) and returns its memory type.
pub(crate) fn check_packed_rkey(bytes: &[u8]) -> Result<MemoryType, KeyFault> {
    let len = bytes.len();
    if len < RKEY_HEADER_LEN {
        return Err(KeyFault::TooShort { len });
    }
    if len > MAX_PACKED_RKEY_LEN {
        return Err(KeyFault::TooLong { len });
    }
    let mut map = [0u8; 8];
    map.copy_from_slice(&bytes[..8]);
    // UCX writes the map in the packing host's byte order; peers share an architecture.
    let domains = u64::from_ne_bytes(map);
    let memory_type = match u32::from(bytes[8]) {
        ucx_sys::UCS_MEMORY_TYPE_HOST => MemoryType::Host,
        ucx_sys::UCS_MEMORY_TYPE_CUDA => MemoryType::Cuda,
        _ => return Err(KeyFault::MemoryType(bytes[8])),
    };
    let mut at = RKEY_HEADER_LEN;
    for domain in (0..64u32).filter(|d| domains & (1 << d) != 0) {
        let size = match bytes.get(at) {
            Some(&size) => usize::from(size),
            None => return Err(KeyFault::Truncated { domain, len }),
        };
        at += 1 + size;
        if at > len {
            return Err(KeyFault::Truncated { domain, len });
        }
    }
    let extra = len - at;
    if extra > MAX_RKEY_TRAILER {
        return Err(KeyFault::TrailingBytes { extra });
    }
    Ok(memory_type)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A packed rkey of `domains` (index, key size) in the given memory type.
    fn packed(domains: &[(u32, u8)], memory_type: u8) -> Vec<u8> {
        let map = domains.iter().fold(0u64, |map, (d, _)| map | 1 << d);
        let mut bytes = map.to_ne_bytes().to_vec();
        bytes.push(memory_type);
        for &(d, size) in domains {
            bytes.push(size);
            bytes.extend((0..size).map(|i| i ^ d as u8));
        }
        bytes
    }

    #[test]
    fn well_framed_keys_pass_with_their_memory_type() {
        assert_eq!(check_packed_rkey(&packed(&[], 0)), Ok(MemoryType::Host));
        assert_eq!(check_packed_rkey(&packed(&[(0, 16), (3, 0), (63, 255)], 1)), Ok(MemoryType::Cuda));
        // UCX 1.20's trailer: system device, distances, terminator.
        let mut with_trailer = packed(&[(1, 40)], 0);
        with_trailer.extend_from_slice(&[2, 10, 20, 3, 11, 21, 0xff]);
        assert_eq!(check_packed_rkey(&with_trailer), Ok(MemoryType::Host));
        let mut longest = packed(&(0..64).map(|d| (d, 255)).collect::<Vec<_>>(), 0);
        longest.resize(MAX_PACKED_RKEY_LEN, 0xff);
        assert_eq!(check_packed_rkey(&longest), Ok(MemoryType::Host));
    }

    #[test]
    fn short_truncated_long_and_odd_keys_are_refused() {
        assert_eq!(check_packed_rkey(&[]), Err(KeyFault::TooShort { len: 0 }));
        assert_eq!(check_packed_rkey(&[0; 8]), Err(KeyFault::TooShort { len: 8 }));
        let key = packed(&[(2, 30), (5, 12)], 0);
        for cut in RKEY_HEADER_LEN..key.len() {
            let domain = if cut < RKEY_HEADER_LEN + 1 + 30 { 2 } else { 5 };
            assert_eq!(check_packed_rkey(&key[..cut]), Err(KeyFault::Truncated { domain, len: cut }), "{cut}");
        }
        assert_eq!(check_packed_rkey(&packed(&[], 2)), Err(KeyFault::MemoryType(2)));
        assert_eq!(check_packed_rkey(&packed(&[], 0xff)), Err(KeyFault::MemoryType(0xff)));
        let mut trailing = key.clone();
        trailing.resize(key.len() + MAX_RKEY_TRAILER + 1, 0);
        assert_eq!(check_packed_rkey(&trailing), Err(KeyFault::TrailingBytes { extra: MAX_RKEY_TRAILER + 1 }));
        let huge = vec![0u8; MAX_PACKED_RKEY_LEN + 1];
        assert_eq!(check_packed_rkey(&huge), Err(KeyFault::TooLong { len: MAX_PACKED_RKEY_LEN + 1 }));
        // Every domain named, no keys: the first one is already missing.
        let all = [u64::MAX.to_ne_bytes().as_slice(), &[0]].concat();
        assert_eq!(check_packed_rkey(&all), Err(KeyFault::Truncated { domain: 0, len: 9 }));
    }

    #[test]
    fn ranges_must_be_non_empty_non_null_and_not_wrap() {
        let rkey = packed(&[(0, 4)], 0);
        let key = |address, length| RegionKey { address, length, rkey: rkey.clone() };
        assert_eq!(key(0x1000, 0).check().err(), Some(KeyFault::EmptyRange));
        assert_eq!(key(0, 16).check().err(), Some(KeyFault::NullAddress));
        assert_eq!(key(u64::MAX, 1).check().err(), Some(KeyFault::RangeOverflow { address: u64::MAX, length: 1 }));
        let checked = key(u64::MAX - 16, 16).check().expect("ends at the last address");
        assert_eq!((checked.address, checked.length), (u64::MAX - 16, 16));
        assert_eq!(checked.memory_type, MemoryType::Host);
        // The copy for UCX is the key followed by the 0xff padding.
        assert_eq!(&checked.padded_rkey[..rkey.len()], rkey.as_slice());
        assert_eq!(checked.padded_rkey.len(), rkey.len() + RKEY_PADDING);
        assert!(checked.padded_rkey[rkey.len()..].iter().all(|&b| b == 0xff));
    }
}
