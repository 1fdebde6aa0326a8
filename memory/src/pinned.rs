//! The pinned host pool: a few large page-locked regions, allocated once, carved into
//! chunks.
//!
//! Transfers, spill and staging take their host memory from here: device → host copies
//! into fresh pageable memory are much slower than into page-locked memory.
//!
//! [`PinnedPool`]'s documentation describes the layout and the exhaustion policy.

mod driver;

pub(crate) use driver::{bind_primary_context, dtoh_async, htod_async, Event, Stream};

use std::fmt;
use std::num::NonZeroUsize;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use nix::sys::mman::{self, MapFlags, MmapAdvise, ProtFlags};
use thiserror::Error;

use crate::{HostBuffer, HostRegion};

/// Pool region ids carry this bit so they never collide with memfd region ids.
const REGION_ID_TAG: u64 = 1 << 62;
static NEXT_REGION_ID: AtomicU64 = AtomicU64::new(1);

/// Whether regions are registered with CUDA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Registration {
    /// Register when CUDA is present; plain memory (with a log line) otherwise or when
    /// registration fails.
    #[default]
    Auto,
    /// Never register (plain host memory).
    Never,
    /// Register or fail [`PinnedPool::new`] / growth.
    Require,
}

/// How a [`PinnedPool`] is laid out.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PinnedPoolConfig {
    /// Bytes per chunk (allocation granularity). Default 4 MiB. Rounded up to a page.
    pub chunk_size: usize,
    /// Bytes per region. Default 256 MiB. Rounded up to whole chunks.
    pub region_size: usize,
    /// Regions mapped by [`PinnedPool::new`]. Default 1.
    pub initial_regions: usize,
    /// Most bytes the pool may reserve, growth included. Default 0, meaning
    /// "`region_size * initial_regions`" (no growth).
    pub max_bytes: usize,
    /// CUDA registration policy.
    pub registration: Registration,
    /// Ask for transparent huge pages (`MADV_HUGEPAGE`). Default true.
    pub hugepages: bool,
    /// Threads that first-touch a new region. Default: available parallelism, at most 8.
    pub touch_threads: usize,
}

impl Default for PinnedPoolConfig {
    fn default() -> Self {
        Self {
            chunk_size: 4 << 20,
            region_size: 256 << 20,
            initial_regions: 1,
            max_bytes: 0,
            registration: Registration::Auto,
            hugepages: true,
            touch_threads: std::thread::available_parallelism().map_or(1, |n| n.get().min(8)),
        }
    }
}

crate::with_methods::with_methods!(PinnedPoolConfig {
    chunk_size: usize => with_chunk_size;
    region_size: usize => with_region_size;
    initial_regions: usize => with_initial_regions;
    max_bytes: usize => with_max_bytes;
    registration: Registration => with_registration;
    hugepages: bool => with_hugepages;
    touch_threads: usize => with_touch_threads;
});

/// Pool failures.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum PoolError {
    /// The configuration makes no sense.
    #[error("invalid pinned pool configuration: {0}")]
    InvalidConfig(String),
    /// No free run of chunks is long enough and growth is not allowed.
    #[error(
        "pinned pool exhausted: {requested} bytes requested, {in_use} of {reserved} bytes in \
         use, growth limit {max_bytes} bytes"
    )]
    Exhausted {
        /// Bytes asked for.
        requested: usize,
        /// Bytes in use (whole chunks).
        in_use: usize,
        /// Bytes reserved.
        reserved: usize,
        /// The growth limit.
        max_bytes: usize,
    },
    /// `mmap` failed.
    #[error("mmap of {len} bytes failed: {source}")]
    Map {
        /// Bytes asked for.
        len: usize,
        /// The errno.
        source: nix::Error,
    },
    /// Registration with CUDA failed under [`Registration::Require`].
    #[error("cuMemHostRegister failed: {0}")]
    Register(String),
}

/// A snapshot of the pool's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PinnedPoolStats {
    /// Regions mapped.
    pub regions: usize,
    /// Bytes mapped in all regions.
    pub bytes_reserved: usize,
    /// Bytes handed out (whole chunks).
    pub bytes_in_use: usize,
    /// Largest `bytes_in_use` seen.
    pub high_water: usize,
    /// Successful allocations (ever).
    pub allocations: u64,
    /// Allocations refused with [`PoolError::Exhausted`] (ever).
    pub failures: u64,
    /// Bytes per chunk.
    pub chunk_size: usize,
    /// Whether the regions are registered with CUDA.
    pub pinned: bool,
}

#[derive(Default)]
struct Counters {
    in_use: AtomicUsize,
    high_water: AtomicUsize,
    allocations: AtomicU64,
    failures: AtomicU64,
}

/// One mapping, carved into chunks.
struct Region {
    ptr: NonNull<u8>,
    len: usize,
    id: u64,
    chunk_size: usize,
    registered: bool,
    /// `true` = chunk in use.
    used: Mutex<Vec<bool>>,
    counters: Arc<Counters>,
}

// SAFETY: the region owns its mapping; the pointer is only dereferenced through
// `HostBuffer`s over disjoint chunk runs handed out under the `used` lock.
unsafe impl Send for Region {}
// SAFETY: as above; shared state (`used`) is behind a Mutex, counters are atomics.
unsafe impl Sync for Region {}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Region {
    fn map(len: usize, config: &PinnedPoolConfig, counters: Arc<Counters>) -> Result<Self, PoolError> {
        let nz = NonZeroUsize::new(len).ok_or_else(|| PoolError::InvalidConfig("empty region".into()))?;
        // SAFETY: a fresh private anonymous mapping aliases nothing.
        let base = unsafe {
            mman::mmap_anonymous(None, nz, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, MapFlags::MAP_PRIVATE)
        }
        .map_err(|source| PoolError::Map { len, source })?;
        let ptr = base.cast::<u8>();
        if config.hugepages {
            // SAFETY: the range is the mapping just created.
            if let Err(e) = unsafe { mman::madvise(base, len, MmapAdvise::MADV_HUGEPAGE) } {
                tracing::debug!("MADV_HUGEPAGE refused ({e}); using normal pages");
            }
        }
        first_touch(ptr, len, config.touch_threads.max(1));
        let mut registered = false;
        let want = match config.registration {
            Registration::Never => false,
            Registration::Auto => crate::cuda::probe().is_ok(),
            Registration::Require => true,
        };
        if want {
            // SAFETY: the range is our live mapping; unregistered in Drop before munmap.
            match unsafe { driver::host_register(ptr.as_ptr(), len) } {
                Ok(()) => registered = true,
                Err(e) if config.registration == Registration::Require => {
                    // SAFETY: our mapping, not registered, no buffer carved from it yet.
                    if let Err(u) = unsafe { mman::munmap(base, len) } {
                        tracing::warn!("munmap after failed registration: {u}");
                    }
                    return Err(PoolError::Register(e));
                }
                Err(e) => tracing::warn!("pinned pool region left unpinned: {e}"),
            }
        }
        let chunks = len / config.chunk_size;
        tracing::debug!(len, chunks, registered, "pinned pool region mapped");
        Ok(Self {
            ptr,
            len,
            id: REGION_ID_TAG | NEXT_REGION_ID.fetch_add(1, Ordering::Relaxed),
            chunk_size: config.chunk_size,
            registered,
            used: Mutex::new(vec![false; chunks]),
            counters,
        })
    }

    /// First-fit search for `n` free contiguous chunks; marks them used.
    fn try_take(&self, n: usize) -> Option<usize> {
        let mut used = lock(&self.used);
        let mut run = 0;
        for i in 0..used.len() {
            if used[i] {
                run = 0;
                continue;
            }
            run += 1;
            if run == n {
                let start = i + 1 - n;
                used[start..=i].iter_mut().for_each(|u| *u = true);
                return Some(start);
            }
        }
        None
    }

    fn chunks_for(&self, len: usize) -> usize {
        len.div_ceil(self.chunk_size)
    }
}

/// Touches one byte per page of `ptr..ptr+len` from `threads` threads, so the pages are
/// faulted in (in parallel) before registration and first use.
fn first_touch(ptr: NonNull<u8>, len: usize, threads: usize) {
    const PAGE: usize = 4096;
    let pages = len.div_ceil(PAGE);
    let per = pages.div_ceil(threads).max(1);
    let base = ptr.as_ptr() as usize;
    std::thread::scope(|s| {
        for t in 0..threads {
            let first = t * per;
            let last = ((t + 1) * per).min(pages);
            if first >= last {
                break;
            }
            s.spawn(move || {
                for p in first..last {
                    // SAFETY: `p * PAGE < len`, inside our fresh mapping that nothing else
                    // reads yet; threads touch disjoint pages.
                    unsafe { std::ptr::write_volatile((base + p * PAGE) as *mut u8, 0) };
                }
            });
        }
    });
}

impl HostRegion for Region {
    fn base_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
    fn region_id(&self) -> u64 {
        self.id
    }
    fn is_pinned(&self) -> bool {
        self.registered
    }
    fn release(&self, offset: usize, len: usize) {
        let first = offset / self.chunk_size;
        let n = self.chunks_for(len);
        let mut used = lock(&self.used);
        for u in used.iter_mut().skip(first).take(n) {
            if !*u {
                // Not reachable through HostBuffer (each range is released once); never
                // panic here: this runs inside HostBuffer::drop.
                tracing::error!(region = self.id, offset, len, "pinned pool chunk released twice");
            }
            *u = false;
        }
        drop(used);
        self.counters.in_use.fetch_sub(n * self.chunk_size, Ordering::Relaxed);
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.registered {
            // SAFETY: registered in `map` at this base; no buffer is alive (we are the
            // last Arc).
            if let Err(e) = unsafe { driver::host_unregister(self.ptr.as_ptr()) } {
                tracing::warn!("pinned pool region {:#x}: {e}", self.id);
            }
        }
        // SAFETY: our mapping; no buffer refers to it any more.
        if let Err(e) = unsafe { mman::munmap(self.ptr.cast(), self.len) } {
            tracing::warn!("munmap of pinned pool region failed: {e}");
        }
    }
}

struct Inner {
    config: PinnedPoolConfig,
    regions: Mutex<Vec<Arc<Region>>>,
    counters: Arc<Counters>,
}

/// A pool of page-locked host memory. Cheap to clone (shared).
///
/// # Layout
/// - A **region** is one anonymous `mmap` (with `MADV_HUGEPAGE` when asked), first-touched
///   in parallel by several threads, then registered with CUDA
///   (`cuMemHostRegister(PORTABLE)`) when CUDA is present. Without CUDA it is plain host
///   memory, so the pool logic runs (and is tested) everywhere. Not cudarc's
///   `alloc_pinned`: that memory is write-combined and slow for CPU reads.
/// - A region is cut into fixed-size **chunks** (4 MiB by default).
/// - An allocation is one **contiguous run of chunks inside one region**, returned as a
///   single [`HostBuffer`] whose region is the pool region ([`HostBuffer::is_pinned`] is
///   true when the region is registered). Contiguous runs keep one frame = one buffer for
///   the transport and for `cuMemcpy`; the cost is some fragmentation, which first-fit over
///   fixed-size chunks keeps low for the frame sizes ferrylink sees.
/// - Dropping the buffer returns its chunks ([`HostRegion::release`]). A region is
///   unregistered and unmapped when the pool *and* every buffer carved from it are gone.
/// - Buffer contents are **not zeroed** between uses: an allocation holds whatever the
///   previous user wrote.
///
/// # Exhaustion and growth
/// When no region has a free run long enough, the pool maps a new region of
/// `max(region_size, request rounded up to chunks)` bytes if that keeps the reserved total
/// under [`PinnedPoolConfig::max_bytes`]; otherwise [`PinnedPool::alloc`] returns
/// [`PoolError::Exhausted`] (and counts a failure). With the default config `max_bytes`
/// equals the initial reservation: no growth. Regions are never shrunk.
#[derive(Clone)]
pub struct PinnedPool {
    inner: Arc<Inner>,
}

impl fmt::Debug for PinnedPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedPool").field("stats", &self.stats()).finish()
    }
}

impl PinnedPool {
    /// Maps `config.initial_regions` regions.
    pub fn new(config: PinnedPoolConfig) -> Result<Self, PoolError> {
        let mut config = config;
        if config.chunk_size == 0 || config.region_size == 0 {
            return Err(PoolError::InvalidConfig("chunk_size and region_size must be > 0".into()));
        }
        let too_large = || PoolError::InvalidConfig("chunk_size or region_size too large to round up".into());
        config.chunk_size = config.chunk_size.checked_next_multiple_of(4096).ok_or_else(too_large)?;
        config.region_size = config.region_size.checked_next_multiple_of(config.chunk_size).ok_or_else(too_large)?;
        let initial = config
            .region_size
            .checked_mul(config.initial_regions)
            .ok_or_else(|| PoolError::InvalidConfig("initial reservation overflows".into()))?;
        if config.max_bytes == 0 {
            config.max_bytes = initial;
        }
        if config.max_bytes < initial {
            return Err(PoolError::InvalidConfig(format!(
                "max_bytes {} below the initial reservation {initial}",
                config.max_bytes
            )));
        }
        let counters = Arc::new(Counters::default());
        let mut regions = Vec::with_capacity(config.initial_regions);
        for _ in 0..config.initial_regions {
            regions.push(Arc::new(Region::map(config.region_size, &config, counters.clone())?));
        }
        Ok(Self { inner: Arc::new(Inner { config, regions: Mutex::new(regions), counters }) })
    }

    /// A pool with `bytes` (rounded up to whole chunks) in one region and the default
    /// chunk size; no growth.
    pub fn with_capacity(bytes: usize) -> Result<Self, PoolError> {
        Self::new(PinnedPoolConfig::default().with_region_size(bytes.max(1)))
    }

    /// Bytes per chunk.
    pub fn chunk_size(&self) -> usize {
        self.inner.config.chunk_size
    }

    /// Whether the pool's memory is registered with CUDA.
    pub fn is_pinned(&self) -> bool {
        lock(&self.inner.regions).first().is_some_and(|r| r.registered)
    }

    /// A buffer of exactly `len` bytes (backed by whole chunks), contents unspecified.
    ///
    /// `len == 0` returns an empty owned buffer without touching the pool.
    pub fn alloc(&self, len: usize) -> Result<HostBuffer, PoolError> {
        if len == 0 {
            return Ok(HostBuffer::from_vec(Vec::new()));
        }
        let inner = &*self.inner;
        let chunk = inner.config.chunk_size;
        let n = len.div_ceil(chunk);
        // Whole chunks for `len`; a length whose chunks exceed the address space can never
        // be served (and must not overflow the sums below).
        let Some(whole) = n.checked_mul(chunk) else {
            return Err(self.exhausted(len, lock(&inner.regions).iter().map(|r| r.len).sum()));
        };
        let mut regions = lock(&inner.regions);
        let mut found = None;
        for r in regions.iter() {
            if let Some(start) = r.try_take(n) {
                found = Some((r.clone(), start));
                break;
            }
        }
        if found.is_none() {
            let reserved: usize = regions.iter().map(|r| r.len).sum();
            let size = inner.config.region_size.max(whole);
            if reserved.checked_add(size).is_some_and(|total| total <= inner.config.max_bytes) {
                let region = Arc::new(Region::map(size, &inner.config, inner.counters.clone())?);
                tracing::debug!(size, "pinned pool grew");
                let start = region.try_take(n);
                regions.push(region.clone());
                found = start.map(|s| (region, s));
            }
        }
        let reserved: usize = regions.iter().map(|r| r.len).sum();
        drop(regions);
        let c = &inner.counters;
        match found {
            Some((region, start)) => {
                let now = c.in_use.fetch_add(whole, Ordering::Relaxed) + whole;
                c.high_water.fetch_max(now, Ordering::Relaxed);
                c.allocations.fetch_add(1, Ordering::Relaxed);
                Ok(HostBuffer::from_region(region, start * chunk, len))
            }
            None => Err(self.exhausted(len, reserved)),
        }
    }

    /// Counts a refused allocation of `len` bytes; the error saying so.
    fn exhausted(&self, len: usize, reserved: usize) -> PoolError {
        let c = &self.inner.counters;
        c.failures.fetch_add(1, Ordering::Relaxed);
        PoolError::Exhausted {
            requested: len,
            in_use: c.in_use.load(Ordering::Relaxed),
            reserved,
            max_bytes: self.inner.config.max_bytes,
        }
    }

    /// The counters.
    pub fn stats(&self) -> PinnedPoolStats {
        let regions = lock(&self.inner.regions);
        let c = &self.inner.counters;
        PinnedPoolStats {
            regions: regions.len(),
            bytes_reserved: regions.iter().map(|r| r.len).sum(),
            bytes_in_use: c.in_use.load(Ordering::Relaxed),
            high_water: c.high_water.load(Ordering::Relaxed),
            allocations: c.allocations.load(Ordering::Relaxed),
            failures: c.failures.load(Ordering::Relaxed),
            chunk_size: self.inner.config.chunk_size,
            pinned: regions.first().is_some_and(|r| r.registered),
        }
    }
}

#[cfg(test)]
mod tests;
