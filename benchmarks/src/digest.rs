//! Whole-frame checks of copies (`serialize`): the length and CRC-32C of a source frame,
//! taken once, and the comparison of a copy with them, outside the timed part; and the
//! pattern the benchmarks' source frames hold (`serialize`, `local-send-recv`'s sends).

use crate::error::BenchError;
use ferrylink_spill::crc::crc32c;

/// The length and CRC-32C (ferrylink-spill's implementation) of a frame's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameDigest {
    /// Bytes.
    pub len: usize,
    /// CRC-32C of all of them.
    pub crc32c: u32,
}

impl FrameDigest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        FrameDigest { len: bytes.len(), crc32c: crc32c(bytes) }
    }

    /// Whether `copy` has the bytes this digest was taken of; the error names `what`.
    pub fn check(&self, what: &str, copy: &[u8]) -> Result<(), BenchError> {
        let got = FrameDigest::of(copy);
        if got == *self {
            return Ok(());
        }
        Err(BenchError::Other(format!(
            "{what} differs from the source frame: {} bytes with CRC-32C {:#010x}, expected {} bytes with \
             CRC-32C {:#010x}",
            got.len, got.crc32c, self.len, self.crc32c
        )))
    }
}

/// The bytes a benchmark's source frame of `n` bytes holds: `i % 251` at offset `i` (no
/// period of a power of two, so a copy landing at a shifted offset differs).
pub fn source_pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_passes_and_any_changed_byte_fails() {
        let source = source_pattern(100_000);
        let digest = FrameDigest::of(&source);
        digest.check("the copy", &source.clone()).unwrap();
        // Not only the first and last bytes: one in the middle, one next to each end.
        for at in [50_000, 1, 99_998] {
            let mut copy = source.clone();
            copy[at] ^= 0x01;
            let e = digest.check("the host copy", &copy).unwrap_err().to_string();
            assert!(e.starts_with("the host copy differs from the source frame"), "{e}");
        }
        assert!(digest.check("a short copy", &source[..99_999]).is_err());
        // The pattern does not repeat at a power of two: a copy shifted by 256 bytes differs.
        let mut shifted = source[256..].to_vec();
        shifted.extend_from_slice(&source[..256]);
        assert!(digest.check("a shifted copy", &shifted).is_err());
    }
}
