//! CRC-32C (Castagnoli), the checksum of spill files, computed by the [`mod@crc32c`] crate
//! (SSE 4.2 or ARMv8 CRC instructions when the CPU has them, a table otherwise; the
//! standard CRC-32C: the check value of "123456789" is `0xE3069283`).

/// A running CRC-32C.
#[derive(Debug, Clone, Copy, Default)]
pub struct Crc32c {
    crc: u32,
}

impl Crc32c {
    /// An empty checksum.
    pub fn new() -> Self {
        Self { crc: 0 }
    }

    /// Adds `bytes`.
    pub fn update(&mut self, bytes: &[u8]) {
        self.crc = crc32c::crc32c_append(self.crc, bytes);
    }

    /// The checksum of everything added.
    pub fn finish(&self) -> u32 {
        self.crc
    }
}

/// Bytes from which a checksum runs on a thread of its own, beside the write or read of
/// the same bytes: a thread costs tens of µs, the CRC-32C of 4 MiB a few hundred.
pub(crate) const PARALLEL_MIN: usize = 4 << 20;

/// The CRC-32C of `parts`, in order, as the last bytes of a spill file, through
/// `write`: with `PARALLEL_MIN` bytes or more it is computed on a scoped thread while
/// `write` writes the parts (the [`Trailer`](crate::Trailer) it is given waits for it),
/// below that (or where no thread can be had) on the caller's thread, when the trailer is
/// asked for.
pub(crate) fn with_trailer<T>(parts: &[&[u8]], write: impl FnOnce(crate::Trailer<'_>) -> T) -> T {
    let serial = || {
        let mut crc = Crc32c::new();
        parts.iter().for_each(|p| crc.update(p));
        crc.finish()
    };
    let len: usize = parts.iter().map(|p| p.len()).sum();
    if len < PARALLEL_MIN {
        return write(Box::new(move || Ok(serial().to_le_bytes())));
    }
    std::thread::scope(|s| match std::thread::Builder::new().name("spill-crc".into()).spawn_scoped(s, serial) {
        Ok(job) => write(Box::new(move || {
            job.join().map(u32::to_le_bytes).map_err(|_| std::io::Error::other("the checksum thread panicked"))
        })),
        Err(e) => {
            tracing::debug!("no thread for the checksum, computed in line: {e}");
            write(Box::new(move || Ok(serial().to_le_bytes())))
        }
    })
}

/// The CRC-32C of `bytes`.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CRC-32C of `bytes`, bit by bit: the definition, to check the fast paths against.
    fn bitwise(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
            }
        }
        !crc
    }

    #[test]
    fn standard_check_values() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
        // RFC 3720 (iSCSI), B.4: 32 bytes of zeros, of ones, ascending, descending.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xFFu8; 32]), 0x62A8_AB43);
        let up: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&up), 0x46DD_794E);
        let down: Vec<u8> = (0..32).rev().collect();
        assert_eq!(crc32c(&down), 0x113F_DB5C);
    }

    #[test]
    fn trailers_are_the_checksum_of_the_parts_small_or_large() {
        let large: Vec<u8> = (0..PARALLEL_MIN + 12_345).map(|i| (i * 31 + i / 7) as u8).collect();
        for parts in [vec![&b"meta"[..], &b"header"[..], &large[..100]], vec![&b"meta"[..], &large[..]]] {
            let mut whole = Vec::new();
            parts.iter().for_each(|p| whole.extend_from_slice(p));
            let trailer = with_trailer(&parts, |t| t().unwrap());
            assert_eq!(trailer, crc32c(&whole).to_le_bytes(), "{} bytes", whole.len());
        }
    }

    #[test]
    fn incremental_matches_whole_and_the_definition() {
        let data: Vec<u8> = (0..10_007u32).map(|i| (i * 7 + i / 13) as u8).collect();
        let whole = crc32c(&data);
        assert_eq!(whole, bitwise(&data));
        let mut inc = Crc32c::new();
        for part in data.chunks(333) {
            inc.update(part);
        }
        assert_eq!(inc.finish(), whole);
        assert_eq!(Crc32c::default().finish(), 0);
    }
}
