//! Test data: one deterministic generator and one checksum.

/// The SplitMix64 finaliser.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Word `index` of the stream of `seed` (a counter-based generator: any word is computed
/// directly, so any range of the stream is).
fn word(key: u64, index: u64) -> u64 {
    mix(key ^ index)
}

/// Deterministic pseudo-random bytes: the first `len` bytes of the stream of `seed`.
/// Different seeds give unrelated streams; `pattern(n, s)` is a prefix of `pattern(m, s)`
/// for `n <= m`.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    pattern_at(seed, 0, len)
}

/// Bytes `offset..offset + len` of the stream of `seed`: `pattern(offset + len, seed)[offset..]`
/// without making the prefix (for buffers filled or checked in chunks).
pub fn pattern_at(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    pattern_into(&mut out, seed, offset);
    out
}

/// Fills `buf` with bytes `offset..offset + buf.len()` of the stream of `seed`.
pub fn pattern_into(buf: &mut [u8], seed: u64, offset: u64) {
    let key = mix(seed);
    let mut pos = offset;
    let mut rest = buf;
    // The unaligned head, then whole words, then the tail.
    while !pos.is_multiple_of(8) && !rest.is_empty() {
        rest[0] = word(key, pos / 8).to_le_bytes()[(pos % 8) as usize];
        rest = &mut rest[1..];
        pos += 1;
    }
    let mut chunks = rest.chunks_exact_mut(8);
    for chunk in &mut chunks {
        chunk.copy_from_slice(&word(key, pos / 8).to_le_bytes());
        pos += 8;
    }
    let tail = chunks.into_remainder();
    if !tail.is_empty() {
        let n = tail.len();
        tail.copy_from_slice(&word(key, pos / 8).to_le_bytes()[..n]);
    }
}

/// A 64-bit checksum of bytes (FNV-1a over 8-byte words, then the tail; the length is in
/// the seed, so that zero bytes of different lengths differ).
pub fn checksum(bytes: &[u8]) -> u64 {
    const PRIME: u64 = 0x100_0000_01b3;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ bytes.len() as u64;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        h = (h ^ u64::from_le_bytes(c.try_into().expect("8 bytes"))).wrapping_mul(PRIME);
    }
    for &b in chunks.remainder() {
        h = (h ^ b as u64).wrapping_mul(PRIME);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_range_of_a_stream_is_the_same_as_in_the_whole() {
        let whole = pattern(1000, 7);
        for (offset, len) in [(0, 1000), (1, 0), (3, 5), (5, 11), (8, 16), (13, 987), (999, 1)] {
            assert_eq!(pattern_at(7, offset as u64, len), &whole[offset..offset + len], "{offset}+{len}");
        }
        assert_eq!(pattern(10, 7), &whole[..10]);
    }

    #[test]
    fn seeds_give_different_streams() {
        let a = pattern(4096, 1);
        let b = pattern(4096, 2);
        assert_ne!(a, b);
        // Not trivially related either: most bytes differ.
        assert!(a.iter().zip(&b).filter(|(x, y)| x != y).count() > 4000);
        assert!(pattern(64, 0).iter().any(|&x| x != 0));
    }

    #[test]
    fn checksum_sees_contents_and_length() {
        assert_ne!(checksum(&[0; 8]), checksum(&[0; 9]));
        assert_ne!(checksum(b"abcdefgh"), checksum(b"abcdefgi"));
        assert_eq!(checksum(&pattern(100, 3)), checksum(&pattern(100, 3)));
    }
}
