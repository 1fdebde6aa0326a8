//! Leak checks that do not take the code under test at its word: what the kernel lists
//! as mapped into this process (`/proc/self/maps`) and, with feature `cuda` where a GPU
//! is present, the device memory in use (`cuMemGetInfo`).
//!
//! A test takes a [`Footprint`] as its baseline, runs its load, and waits (bounded) with
//! [`assert_footprint_returns`] for the footprint to come back: memfd mappings (shared
//! memory regions) exactly, every other mapping and device memory within a
//! [`Tolerance`] the test states and justifies (the allocator and the thread library map
//! and keep memory of their own).

use std::time::{Duration, Instant};

/// The mappings of this process, counted by kind from one read of `/proc/self/maps`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MappingCount {
    /// Every mapping (line of `/proc/self/maps`).
    pub total: usize,
    /// Mappings of memfds (`/memfd:NAME (deleted)`): shared-memory regions, made and
    /// imported.
    pub memfd: usize,
    /// Bytes of those mappings.
    pub memfd_bytes: u64,
}

impl MappingCount {
    /// The mappings of this process now.
    pub fn now() -> std::io::Result<Self> {
        std::fs::read_to_string("/proc/self/maps").map(|maps| Self::of_maps(&maps))
    }

    /// Counts the mappings of a `/proc/PID/maps` text (`start-end perms offset dev inode
    /// [path]` per line).
    pub fn of_maps(maps: &str) -> Self {
        let mut count = Self::default();
        for line in maps.lines().filter(|l| !l.trim().is_empty()) {
            count.total += 1;
            let range = line.split_whitespace().next().unwrap_or("");
            // The path is the sixth field; it may contain spaces (" (deleted)").
            let path = line.splitn(6, char::is_whitespace).nth(5).unwrap_or("").trim_start();
            if path.starts_with("/memfd:") {
                count.memfd += 1;
                count.memfd_bytes += range_len(range);
            }
        }
        count
    }
}

/// The length of a `start-end` (hex) range; 0 when it does not parse.
fn range_len(range: &str) -> u64 {
    let Some((start, end)) = range.split_once('-') else { return 0 };
    match (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16)) {
        (Ok(start), Ok(end)) => end.saturating_sub(start),
        _ => 0,
    }
}

/// What this process holds that a leak would grow: its mappings and, where a GPU is
/// present, the device memory in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footprint {
    pub mappings: MappingCount,
    /// Bytes in use on all devices (total minus free), `None` without CUDA or without
    /// the feature `cuda`. Device-wide: peer processes count too.
    pub device_used_bytes: Option<u64>,
}

/// How far a [`Footprint`] may stay above its baseline and still count as returned.
/// memfd mappings get none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tolerance {
    /// Mappings beyond the baseline's total.
    pub mappings: usize,
    /// Device bytes in use beyond the baseline's.
    pub device_bytes: u64,
}

impl Footprint {
    /// The footprint now; panics when `/proc/self/maps` cannot be read (a leak check
    /// that cannot look must not pass).
    pub fn now() -> Self {
        let mappings = MappingCount::now().expect("reading /proc/self/maps");
        Self { mappings, device_used_bytes: device_used_bytes() }
    }

    /// What stays above `baseline` beyond `tolerance`, in words; `None`: it returned.
    pub fn excess_over(&self, baseline: &Footprint, tolerance: Tolerance) -> Option<String> {
        let mut excess = Vec::new();
        let (now, then) = (&self.mappings, &baseline.mappings);
        if now.memfd != then.memfd || now.memfd_bytes != then.memfd_bytes {
            excess.push(format!(
                "memfd mappings: {} ({} bytes), baseline {} ({} bytes)",
                now.memfd, now.memfd_bytes, then.memfd, then.memfd_bytes
            ));
        }
        if now.total > then.total + tolerance.mappings {
            excess.push(format!("mappings: {}, baseline {} (tolerance {})", now.total, then.total, tolerance.mappings));
        }
        match (self.device_used_bytes, baseline.device_used_bytes) {
            (Some(now), Some(then)) if now > then + tolerance.device_bytes => excess.push(format!(
                "device memory in use: {} MiB, baseline {} MiB (tolerance {} MiB)",
                now >> 20,
                then >> 20,
                tolerance.device_bytes >> 20
            )),
            (None, Some(_)) => excess.push("device memory in use can no longer be read".into()),
            _ => {}
        }
        (!excess.is_empty()).then(|| excess.join("; "))
    }
}

/// Waits at most `bound` for this process's footprint to return to `baseline` within
/// `tolerance`; panics with what stayed (`what`: the moment, for the message). Returns
/// the footprint it settled at.
#[track_caller]
pub fn assert_footprint_returns(what: &str, baseline: &Footprint, tolerance: Tolerance, bound: Duration) -> Footprint {
    let deadline = Instant::now() + bound;
    loop {
        let now = Footprint::now();
        match now.excess_over(baseline, tolerance) {
            None => return now,
            Some(excess) if Instant::now() > deadline => {
                panic!("{what}: this process's footprint did not return within {bound:?}: {excess}")
            }
            Some(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Device memory in use on all devices, in bytes (`cuMemGetInfo` in each primary
/// context, retained once for the process); `None` without a usable device.
#[cfg(feature = "cuda")]
pub fn device_used_bytes() -> Option<u64> {
    use cudarc::driver::{result, sys};
    static CONTEXTS: std::sync::OnceLock<Option<Vec<usize>>> = std::sync::OnceLock::new();
    let contexts = CONTEXTS.get_or_init(|| {
        if std::env::var_os("FERRYLINK_DISABLE_CUDA").is_some() {
            return None;
        }
        // SAFETY: only tries to dlopen the driver library.
        if !unsafe { sys::is_culib_present() } {
            return None;
        }
        result::init().ok()?;
        let count = result::device::get_count().ok()?;
        (0..count)
            .map(|ordinal| {
                let device = result::device::get(ordinal).ok()?;
                // SAFETY: a device handle the driver just gave; the retained context is
                // never released (it lives as long as the process).
                unsafe { result::primary_ctx::retain(device) }.ok().map(|ctx| ctx as usize)
            })
            .collect()
    });
    let mut used = 0u64;
    for &ctx in contexts.as_ref()? {
        // SAFETY: a primary context retained above and never released.
        unsafe { result::ctx::set_current(ctx as sys::CUcontext) }.ok()?;
        let (free, total) = result::mem_get_info().ok()?;
        used += total.saturating_sub(free) as u64;
    }
    Some(used)
}

/// Without the feature `cuda`, device memory is not looked at.
#[cfg(not(feature = "cuda"))]
pub fn device_used_bytes() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0a00000-55d0c0a02000 r--p 00000000 08:01 1234    /usr/bin/cat
7f0000000000-7f0000100000 rw-s 00000000 00:01 99      /memfd:ferrylink-shared (deleted)
7f0000200000-7f0000201000 r--s 00000000 00:01 100     /memfd:peer region (deleted)
7f0000300000-7f0000400000 rw-p 00000000 00:00 0
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0       [stack]
";

    #[test]
    fn counts_every_mapping_and_the_memfds_with_their_bytes() {
        let count = MappingCount::of_maps(MAPS);
        assert_eq!(count, MappingCount { total: 5, memfd: 2, memfd_bytes: 0x100000 + 0x1000 });
    }

    fn footprint(total: usize, memfd: usize, device: Option<u64>) -> Footprint {
        Footprint {
            mappings: MappingCount { total, memfd, memfd_bytes: memfd as u64 * 4096 },
            device_used_bytes: device,
        }
    }

    #[test]
    fn memfd_mappings_must_return_exactly_the_rest_within_the_tolerance() {
        let baseline = footprint(100, 2, Some(1 << 30));
        let tolerance = Tolerance { mappings: 4, device_bytes: 8 << 20 };
        assert_eq!(footprint(104, 2, Some((1 << 30) + (8 << 20))).excess_over(&baseline, tolerance), None);
        assert_eq!(footprint(90, 2, Some(1 << 29)).excess_over(&baseline, tolerance), None, "fewer is fine");
        let memfd = footprint(100, 3, Some(1 << 30)).excess_over(&baseline, tolerance).unwrap();
        assert!(memfd.contains("memfd mappings: 3 (12288 bytes), baseline 2 (8192 bytes)"), "{memfd}");
        let total = footprint(105, 2, Some(1 << 30)).excess_over(&baseline, tolerance).unwrap();
        assert!(total.contains("mappings: 105, baseline 100 (tolerance 4)"), "{total}");
        let device = footprint(100, 2, Some((1 << 30) + (9 << 20))).excess_over(&baseline, tolerance).unwrap();
        assert!(device.contains("device memory in use: 1033 MiB, baseline 1024 MiB"), "{device}");
        assert!(footprint(100, 2, None).excess_over(&baseline, tolerance).is_some(), "a device lost from sight");
    }
}
