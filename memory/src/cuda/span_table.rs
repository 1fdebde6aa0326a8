//! Where a span kernel's table is written on the host: pinned memory kept per device and
//! reused (a fresh `cuMemHostAlloc` costs far more than a batch, and fresh pageable
//! memory costs its page faults), readable by the kernel through its device address
//! where the driver gives one; pageable memory only when pinned memory is refused.

use super::context::Gpu;
use super::error::{check, CudaResult};
use super::pinned::PinnedStaging;
use cudarc::driver::sys;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Bytes of one table entry: (dst, src, len) as three u64.
pub(super) const ENTRY_BYTES: usize = 24;
/// Pinned table buffers kept per device for the next batches, at most.
const SPARE_TABLES_PER_DEVICE: usize = 8;
/// The smallest pinned table buffer made (2730 entries).
const MIN_TABLE_BYTES: usize = 64 << 10;

/// A pinned buffer and its device address (`None`: the kernel cannot read it directly).
pub(super) struct Spare {
    staging: PinnedStaging,
    device_ptr: Option<u64>,
}

fn spares() -> MutexGuard<'static, HashMap<usize, Vec<Spare>>> {
    static SPARES: OnceLock<Mutex<HashMap<usize, Vec<Spare>>>> = OnceLock::new();
    SPARES.get_or_init(|| Mutex::new(HashMap::new())).lock().unwrap_or_else(|p| p.into_inner())
}

/// The device address of pinned host memory (`cuMemHostGetDevicePointer`).
pub(super) fn mapped_address(gpu: &Gpu, staging: &PinnedStaging) -> CudaResult<u64> {
    gpu.bind_to_current_thread()?;
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: the context is bound; `staging` is a live cuMemHostAlloc allocation of
    // this context; the driver writes one address.
    check("cuMemHostGetDevicePointer", unsafe {
        sys::cuMemHostGetDevicePointer_v2(&mut ptr, staging.as_ptr().cast_mut().cast(), 0)
    })?;
    Ok(ptr)
}

/// A table's bytes on the host, `capacity` bytes or more; goes back to the device's
/// spares when dropped (pinned).
pub(super) enum HostTable {
    Pinned { device: usize, spare: Option<Spare> },
    Pageable(Vec<u8>),
}

impl HostTable {
    /// A spare pinned buffer of `gpu` holding `capacity` bytes, else a new one, else
    /// (pinned memory refused) pageable memory.
    pub(super) fn with_capacity(gpu: &Gpu, capacity: usize) -> HostTable {
        let device = gpu.ordinal();
        let spare = {
            let mut spares = spares();
            let list = spares.entry(device).or_default();
            list.iter().position(|s| s.staging.len() >= capacity).map(|i| list.swap_remove(i))
        };
        if let Some(spare) = spare {
            return HostTable::Pinned { device, spare: Some(spare) };
        }
        match PinnedStaging::new(gpu, capacity.max(MIN_TABLE_BYTES).next_power_of_two()) {
            Ok(staging) => {
                let device_ptr = mapped_address(gpu, &staging)
                    .inspect_err(|e| tracing::debug!(error = %e, "a span table the kernel cannot read in place"))
                    .ok();
                HostTable::Pinned { device, spare: Some(Spare { staging, device_ptr }) }
            }
            Err(e) => {
                tracing::debug!(error = %e, "no pinned memory for a span table; copying it from pageable memory");
                HostTable::Pageable(vec![0u8; capacity])
            }
        }
    }

    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            HostTable::Pinned { spare: Some(s), .. } => s.staging.as_slice(),
            HostTable::Pinned { spare: None, .. } => &[],
            HostTable::Pageable(v) => v,
        }
    }

    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            HostTable::Pinned { spare: Some(s), .. } => s.staging.as_mut_slice(),
            HostTable::Pinned { spare: None, .. } => &mut [],
            HostTable::Pageable(v) => v,
        }
    }

    /// The address the kernel reads the table at in place, when it can.
    pub(super) fn device_ptr(&self) -> Option<u64> {
        match self {
            HostTable::Pinned { spare: Some(s), .. } => s.device_ptr,
            _ => None,
        }
    }
}

impl Drop for HostTable {
    fn drop(&mut self) {
        if let HostTable::Pinned { device, spare } = self {
            if let Some(spare) = spare.take() {
                let mut spares = spares();
                let list = spares.entry(*device).or_default();
                if list.len() < SPARE_TABLES_PER_DEVICE {
                    list.push(spare);
                }
            }
        }
    }
}
