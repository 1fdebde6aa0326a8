//! Byte sizes: parsing what users type (`1GB`, `10MiB`, `1000000`) and formatting the way
//! ucx-py's table does (`1000.00 MB`, decimal units, two decimals).

use thiserror::Error;

/// A size string that could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SizeError {
    /// Nothing was given.
    #[error("empty size: give a number of bytes such as 1000000, 10MiB or 1GB")]
    Empty,
    /// The number part is not a non-negative number.
    #[error("{input:?} is not a size: the number part {number:?} is not a non-negative number")]
    BadNumber {
        /// What was typed.
        input: String,
        /// The number part.
        number: String,
    },
    /// The unit is unknown.
    #[error("{input:?} is not a size: unknown unit {unit:?} (use B, kB, MB, GB, TB, KiB, MiB, GiB or TiB)")]
    BadUnit {
        /// What was typed.
        input: String,
        /// The unit part.
        unit: String,
    },
    /// The size is zero.
    #[error("{input:?} is zero bytes: a size must be at least 1 byte")]
    Zero {
        /// What was typed.
        input: String,
    },
    /// The size is not a whole number of bytes or does not fit 64 bits.
    #[error("{input:?} is not a whole number of bytes that fits 64 bits")]
    OutOfRange {
        /// What was typed.
        input: String,
    },
    /// A sweep range is malformed.
    #[error("{input:?} is not a sweep range: {reason}")]
    BadRange {
        /// What was typed.
        input: String,
        /// Why.
        reason: String,
    },
}

/// The multiplier of a unit (case-insensitive): `B` or nothing = 1, `k`/`kB` = 10^3,
/// `M`/`MB` = 10^6, `G`/`GB` = 10^9, `T`/`TB` = 10^12, `KiB` = 2^10, `MiB` = 2^20,
/// `GiB` = 2^30, `TiB` = 2^40.
fn unit_multiplier(unit: &str) -> Option<u64> {
    Some(match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "t" | "tb" => 1_000_000_000_000,
        "ki" | "kib" => 1 << 10,
        "mi" | "mib" => 1 << 20,
        "gi" | "gib" => 1 << 30,
        "ti" | "tib" => 1 << 40,
        _ => return None,
    })
}

/// Parses a byte count: a number (decimals allowed when the result is whole, `1.5GB`)
/// optionally followed by a unit (see the crate documentation); spaces between are fine.
/// Zero is refused.
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(SizeError::Empty);
    }
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_')).unwrap_or(s.len());
    let (number, unit) = (s[..split].replace('_', ""), s[split..].trim());
    let bad_number = || SizeError::BadNumber { input: input.to_owned(), number: number.clone() };
    if number.is_empty() || number.matches('.').count() > 1 {
        return Err(bad_number());
    }
    let mult =
        unit_multiplier(unit).ok_or_else(|| SizeError::BadUnit { input: input.to_owned(), unit: unit.into() })?;
    let out_of_range = || SizeError::OutOfRange { input: input.to_owned() };
    let bytes = match number.split_once('.') {
        None => number.parse::<u64>().map_err(|_| out_of_range())?.checked_mul(mult).ok_or_else(out_of_range)?,
        Some((whole, frac)) => {
            // Exact decimal arithmetic: whole*mult + frac*mult/10^len(frac), which must be whole.
            let whole: u64 = if whole.is_empty() { 0 } else { whole.parse().map_err(|_| bad_number())? };
            let frac_digits = frac.trim_end_matches('0');
            let scale = 10u128.checked_pow(frac_digits.len() as u32).ok_or_else(out_of_range)?;
            let frac_val: u128 =
                if frac_digits.is_empty() { 0 } else { frac_digits.parse().map_err(|_| bad_number())? };
            let frac_bytes = frac_val * mult as u128;
            if !frac_bytes.is_multiple_of(scale) {
                return Err(out_of_range());
            }
            let total = whole as u128 * mult as u128 + frac_bytes / scale;
            u64::try_from(total).map_err(|_| out_of_range())?
        }
    };
    if bytes == 0 {
        return Err(SizeError::Zero { input: input.to_owned() });
    }
    Ok(bytes)
}

/// Parses `MIN:MAX` into the sizes MIN, 2·MIN, 4·MIN, … up to MAX (MAX itself is the last
/// size when it is not MIN·2^k: the sweep always ends at the size asked for).
pub fn parse_sweep(input: &str) -> Result<Vec<u64>, SizeError> {
    let bad = |reason: &str| SizeError::BadRange { input: input.to_owned(), reason: reason.to_owned() };
    let (lo, hi) = input.split_once(':').ok_or_else(|| bad("expected MIN:MAX, such as 1MB:1GB"))?;
    let (lo, hi) = (parse_size(lo)?, parse_size(hi)?);
    if lo > hi {
        return Err(bad("MIN is larger than MAX"));
    }
    let mut sizes = Vec::new();
    let mut s = lo;
    while s < hi {
        sizes.push(s);
        s = match s.checked_mul(2) {
            Some(next) => next,
            None => break,
        };
    }
    sizes.push(hi);
    Ok(sizes)
}

/// Formats a byte count like dask's (old) `format_bytes`, as ucx-py's table shows it:
/// decimal units, two decimals, the unit switching only *above* 1000 of the smaller one
/// (10^9 bytes is `1000.00 MB`).
pub fn format_bytes(n: f64) -> String {
    const UNITS: [(f64, &str); 5] = [(1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")];
    for (scale, unit) in UNITS {
        if n > scale {
            return format!("{:.2} {unit}", n / scale);
        }
    }
    format!("{} B", n.round() as u64)
}

/// A rate in bytes per second, formatted like [`format_bytes`] with `/s`.
pub fn format_rate(bytes_per_sec: f64) -> String {
    format!("{}/s", format_bytes(bytes_per_sec))
}

/// A duration in seconds as `12.34 us`, `5.67 ms` or `1.23 s`.
pub fn format_seconds(secs: f64) -> String {
    if secs < 1e-3 {
        format!("{:.2} us", secs * 1e6)
    } else if secs < 1.0 {
        format!("{:.2} ms", secs * 1e3)
    } else {
        format!("{secs:.2} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_numbers_and_decimal_units() {
        assert_eq!(parse_size("1000000").unwrap(), 1_000_000);
        assert_eq!(parse_size("1GB").unwrap(), 1_000_000_000);
        assert_eq!(parse_size("1 gb").unwrap(), 1_000_000_000);
        assert_eq!(parse_size("100MB").unwrap(), 100_000_000);
        assert_eq!(parse_size("10 Mb").unwrap(), 10_000_000);
        assert_eq!(parse_size("4kB").unwrap(), 4000);
        assert_eq!(parse_size("4KB").unwrap(), 4000);
        assert_eq!(parse_size("2TB").unwrap(), 2_000_000_000_000);
        assert_eq!(parse_size("17B").unwrap(), 17);
        assert_eq!(parse_size("1_000").unwrap(), 1000);
    }

    #[test]
    fn binary_units() {
        assert_eq!(parse_size("10MiB").unwrap(), 10 << 20);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("4KiB").unwrap(), 4096);
        assert_eq!(parse_size("1TiB").unwrap(), 1 << 40);
    }

    #[test]
    fn decimals_must_give_whole_bytes() {
        assert_eq!(parse_size("1.5GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_size("0.5KiB").unwrap(), 512);
        assert_eq!(parse_size(".25MB").unwrap(), 250_000);
        assert!(matches!(parse_size("1.5B"), Err(SizeError::OutOfRange { .. })));
    }

    #[test]
    fn errors_say_what_is_wrong() {
        assert_eq!(parse_size("  "), Err(SizeError::Empty));
        assert!(matches!(parse_size("GB"), Err(SizeError::BadNumber { .. })));
        assert!(matches!(parse_size("-1GB"), Err(SizeError::BadNumber { .. })));
        assert!(matches!(parse_size("1.2.3MB"), Err(SizeError::BadNumber { .. })));
        assert!(matches!(parse_size("10 parsecs"), Err(SizeError::BadUnit { .. })));
        assert!(matches!(parse_size("0"), Err(SizeError::Zero { .. })));
        assert!(matches!(parse_size("0MB"), Err(SizeError::Zero { .. })));
        assert!(matches!(parse_size("99999999999999999999"), Err(SizeError::OutOfRange { .. })));
        assert!(matches!(parse_size("20000000TB"), Err(SizeError::OutOfRange { .. })));
        let msg = parse_size("10 parsecs").unwrap_err().to_string();
        assert!(msg.contains("parsecs") && msg.contains("GiB"), "{msg}");
    }

    #[test]
    fn sweeps_double_and_end_at_max() {
        assert_eq!(parse_sweep("1MB:8MB").unwrap(), vec![1_000_000, 2_000_000, 4_000_000, 8_000_000]);
        assert_eq!(parse_sweep("1KiB:3KiB").unwrap(), vec![1024, 2048, 3072]);
        assert_eq!(parse_sweep("1MB:1MB").unwrap(), vec![1_000_000]);
        assert!(matches!(parse_sweep("8MB:1MB"), Err(SizeError::BadRange { .. })));
        assert!(matches!(parse_sweep("1MB"), Err(SizeError::BadRange { .. })));
        assert!(matches!(parse_sweep("1MB:5 lots"), Err(SizeError::BadUnit { .. })));
    }

    #[test]
    fn formatting_matches_ucx_py() {
        assert_eq!(format_bytes(1e9), "1000.00 MB");
        assert_eq!(format_bytes(1e6), "1000.00 kB");
        assert_eq!(format_bytes(37.40e9), "37.40 GB");
        assert_eq!(format_bytes(389.9e6), "389.90 MB");
        assert_eq!(format_bytes(512.0), "512 B");
        assert_eq!(format_rate(47.59e9), "47.59 GB/s");
        assert_eq!(format_seconds(11.5e-6), "11.50 us");
        assert_eq!(format_seconds(0.0425), "42.50 ms");
        assert_eq!(format_seconds(2.0), "2.00 s");
    }
}
