//! The exportable device pool: large `cuMemAlloc` slabs, sub-allocated first-fit, so one
//! IPC open on the receiver serves many messages.

use super::alloc::DeviceAllocation;
use super::context::Gpu;
use super::error::{CudaError, CudaResult};
use super::suballoc::{round_up, SubAllocator};
use crate::{DeviceBuffer, DeviceMemoryOwner, KnownAllocation};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

/// Sizes of a [`DevicePool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolConfig {
    /// Size of a slab (default 256 MiB). A request larger than this gets a slab of its
    /// own, rounded up to 2 MiB.
    pub slab_size: usize,
    /// Alignment of every sub-allocation, a power of two (default 512 B).
    pub alignment: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig { slab_size: 256 << 20, alignment: 512 }
    }
}

crate::with_methods::with_methods!(PoolConfig {
    slab_size: usize => with_slab_size;
    alignment: usize => with_alignment;
});

/// What a pool holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// Slabs allocated from the driver and held.
    pub slabs: usize,
    /// Bytes of those slabs.
    pub bytes_reserved: u64,
    /// Bytes handed out (rounded to the alignment).
    pub bytes_in_use: u64,
    /// Live allocations.
    pub allocations: usize,
    /// Allocations served since the pool was made.
    pub allocations_total: u64,
    /// Slabs allocated from the driver since the pool was made.
    pub slab_allocs_total: u64,
}

struct Slab {
    alloc: DeviceAllocation,
    sub: SubAllocator,
}

struct PoolState {
    slabs: HashMap<u64, Slab>,
    next_id: u64,
    allocations_total: u64,
    slab_allocs_total: u64,
}

struct PoolShared {
    gpu: Gpu,
    config: PoolConfig,
    state: Mutex<PoolState>,
}

/// A pool of exportable device memory on one device. Cheap to clone (shared).
#[derive(Clone)]
pub struct DevicePool(Arc<PoolShared>);

const BIG_ROUND: u64 = 2 << 20;

impl DevicePool {
    /// A pool on `gpu`. Allocates nothing until the first [`DevicePool::alloc`].
    pub fn new(gpu: &Gpu, config: PoolConfig) -> CudaResult<DevicePool> {
        if !config.alignment.is_power_of_two() || config.slab_size == 0 {
            return Err(CudaError::invalid("DevicePool::new", format!("bad config {config:?}")));
        }
        Ok(DevicePool(Arc::new(PoolShared {
            gpu: gpu.clone(),
            config,
            state: Mutex::new(PoolState {
                slabs: HashMap::new(),
                next_id: 0,
                allocations_total: 0,
                slab_allocs_total: 0,
            }),
        })))
    }

    /// The process-wide pool of device `ordinal` with the default configuration.
    pub fn shared(ordinal: usize) -> CudaResult<DevicePool> {
        static POOLS: OnceLock<Mutex<HashMap<usize, DevicePool>>> = OnceLock::new();
        let gpu = Gpu::get(ordinal)?;
        let mut pools = POOLS.get_or_init(|| Mutex::new(HashMap::new())).lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = pools.get(&ordinal) {
            return Ok(p.clone());
        }
        let pool = DevicePool::new(&gpu, PoolConfig::default())?;
        pools.insert(ordinal, pool.clone());
        Ok(pool)
    }

    /// The device.
    pub fn gpu(&self) -> &Gpu {
        &self.0.gpu
    }

    /// The configuration.
    pub fn config(&self) -> PoolConfig {
        self.0.config
    }

    /// `len` bytes of exportable device memory (contents undefined). The range returns to
    /// the pool when the buffer's owner drops.
    pub fn alloc(&self, len: usize) -> CudaResult<DeviceBuffer> {
        let align = self.0.config.alignment as u64;
        let need = round_up(len as u64, align)
            .ok_or_else(|| CudaError::invalid("DevicePool::alloc", format!("length {len} too large")))?;
        let mut st = self.0.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut found = None;
        let mut ids: Vec<u64> = st.slabs.keys().copied().collect();
        ids.sort_unstable(); // oldest slabs first: keeps the working set in few slabs
        for id in ids {
            if let Some(slab) = st.slabs.get_mut(&id) {
                if let Some(off) = slab.sub.alloc(need) {
                    found = Some((id, off));
                    break;
                }
            }
        }
        let (slab_id, offset) = match found {
            Some(f) => f,
            None => {
                let slab_len = if need <= self.0.config.slab_size as u64 {
                    self.0.config.slab_size as u64
                } else {
                    round_up(need, BIG_ROUND)
                        .ok_or_else(|| CudaError::invalid("DevicePool::alloc", "length too large"))?
                };
                let alloc = DeviceAllocation::new(&self.0.gpu, slab_len as usize)?;
                tracing::debug!(device = self.0.gpu.ordinal(), bytes = slab_len, "device pool: new slab");
                let mut sub = SubAllocator::new(slab_len, align);
                let off = sub.alloc(need).ok_or_else(|| CudaError::invalid("DevicePool::alloc", "slab too small"))?;
                let id = st.next_id;
                st.next_id += 1;
                st.slab_allocs_total += 1;
                st.slabs.insert(id, Slab { alloc, sub });
                (id, off)
            }
        };
        st.allocations_total += 1;
        let slab = st.slabs.get(&slab_id).expect("the slab just found or made");
        let (base, known) = (slab.alloc.ptr(), slab.alloc.known());
        drop(st);
        // Created before the check so that a refusal gives the range back.
        let owner = Arc::new(PoolRange { pool: self.0.clone(), slab_id, offset, known });
        // The slab was checked not to wrap (DeviceAllocation::new); checked again here.
        let ptr = base
            .checked_add(offset)
            .ok_or_else(|| CudaError::invalid("DevicePool::alloc", format!("slab {base:#x} + {offset:#x} wraps")))?;
        // SAFETY: `ptr .. + len` lies inside a live slab of this device (the
        // sub-allocator handed the range out and keeps it until the owner drops; the slab
        // lives while the owner holds the pool).
        Ok(unsafe { DeviceBuffer::from_raw_parts(ptr, len, self.0.gpu.ordinal(), owner) })
    }

    /// What the pool holds.
    pub fn stats(&self) -> PoolStats {
        let st = self.0.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut s = PoolStats {
            allocations_total: st.allocations_total,
            slab_allocs_total: st.slab_allocs_total,
            ..PoolStats::default()
        };
        for slab in st.slabs.values() {
            s.slabs += 1;
            s.bytes_reserved += slab.sub.size();
            s.bytes_in_use += slab.sub.in_use();
            s.allocations += slab.sub.live();
        }
        s
    }

    /// Returns empty slabs to the driver; the number of bytes released.
    pub fn trim(&self) -> u64 {
        let mut st = self.0.state.lock().unwrap_or_else(|p| p.into_inner());
        let empty: Vec<u64> = st.slabs.iter().filter(|(_, s)| s.sub.is_empty()).map(|(id, _)| *id).collect();
        let mut released = 0;
        for id in empty {
            if let Some(slab) = st.slabs.remove(&id) {
                released += slab.sub.size();
            }
        }
        released
    }
}

impl fmt::Debug for DevicePool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DevicePool").field("device", &self.0.gpu.ordinal()).field("stats", &self.stats()).finish()
    }
}

/// The owner of one sub-allocation: gives the range back when the last reference drops.
struct PoolRange {
    pool: Arc<PoolShared>,
    slab_id: u64,
    offset: u64,
    /// The slab's allocation (it outlives the range).
    known: KnownAllocation,
}

impl DeviceMemoryOwner for PoolRange {
    fn describe(&self) -> String {
        format!("device pool slab {} +{:#x} (device {})", self.slab_id, self.offset, self.pool.gpu.ordinal())
    }
    fn allocation(&self) -> Option<KnownAllocation> {
        Some(self.known)
    }
}

impl Drop for PoolRange {
    fn drop(&mut self) {
        let mut st = self.pool.state.lock().unwrap_or_else(|p| p.into_inner());
        match st.slabs.get_mut(&self.slab_id).and_then(|s| s.sub.free(self.offset)) {
            Some(_) => {}
            None => tracing::warn!(slab = self.slab_id, offset = self.offset, "device pool: release of unknown range"),
        }
    }
}
