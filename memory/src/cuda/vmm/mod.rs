//! Virtual-memory-management (VMM) device memory, shareable as file descriptors.
//!
//! Legacy CUDA IPC (`cuIpcGetMemHandle`) exports only `cuMemAlloc` memory. Memory made
//! through the VMM API — physical allocations from `cuMemCreate`, mapped into a virtual
//! address range reserved with `cuMemAddressReserve` — is exported per **physical
//! allocation** instead, as a POSIX file descriptor (`CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`)
//! that travels over a Unix socket (`SCM_RIGHTS`) and is mapped again by the receiver.
//!
//! - [`VmmAllocation`]: ferrylink's own VMM memory: one reserved range with one or more
//!   physical chunks mapped side by side, read-write for its device.
//! - [`vmm_chunks`]: the chunks covering a byte range of any VMM memory (ferrylink's or a
//!   framework's). The driver reports each mapping as its own range in
//!   `cuMemGetAddressRange` (not the whole reserved range), so a range made of several
//!   chunks is exported **chunk by chunk**: one fd per chunk, and the receiver maps each
//!   chunk on its own (they need not land side by side there).
//! - [`export_chunk`] and [`ImportedVmmChunk`]: one chunk out as an fd, and mapped in.
//!
//! Export and import are slow next to legacy IPC: on an H200 (driver 580) one
//! [`export_chunk`] took 0.66–1.0 ms and one [`ImportedVmmChunk::import`] (import, reserve,
//! map, set access) 0.13–0.22 ms, in the exporting process or another. A receiver caches
//! what it imported, keyed on the chunk's (base, len, `CU_POINTER_ATTRIBUTE_BUFFER_ID`):
//! a range freed and made again lands at the same address (8 times out of 8 there), but
//! gets a new buffer id each time.

mod export;

pub use export::{export_chunk, vmm_chunks, ImportedVmmChunk, VmmChunk};

use super::context::Gpu;
use super::error::{check, CudaError, CudaResult};
use super::pointer::pointer_info;
use crate::{DeviceBuffer, DeviceMemoryOwner, KnownAllocation};
use cudarc::driver::sys;
use std::fmt;
use std::sync::Arc;

/// One physical chunk of a [`VmmAllocation`].
struct Chunk {
    /// Offset of its mapping in the reserved range.
    offset: usize,
    len: usize,
    /// From `cuMemCreate`; released on drop.
    handle: sys::CUmemGenericAllocationHandle,
    /// Whether `cuMemMap` succeeded (so drop unmaps it).
    mapped: bool,
    /// What the driver said about the mapping once it was made, when it matched.
    known: Option<KnownAllocation>,
}

/// Device memory made with `cuMemCreate` (POSIX-fd shareable): one reserved virtual
/// address range with one or more physical chunks mapped side by side, read-write for
/// its device. Dropping it unmaps the chunks, releases them and frees the range; the
/// buffers of [`VmmAllocation::buffer`] keep it alive. Work still using it must have
/// completed by then, as for any device memory.
pub struct VmmAllocation {
    gpu: Gpu,
    base: u64,
    /// Size of the reserved range: the sum of the chunk lengths.
    len: usize,
    chunks: Vec<Chunk>,
    chunk_lens: Vec<usize>,
}

impl VmmAllocation {
    /// The allocation granularity of POSIX-fd shareable device memory on `gpu`
    /// (`CU_MEM_ALLOC_GRANULARITY_MINIMUM`): every chunk length is a multiple of it.
    pub fn granularity(gpu: &Gpu) -> CudaResult<usize> {
        gpu.bind_to_current_thread()?;
        let prop = allocation_prop(gpu);
        let mut granularity: usize = 0;
        // SAFETY: the context is bound; `prop` is a fully initialised property struct and
        // the call writes one size.
        check("cuMemGetAllocationGranularity", unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        })?;
        if granularity == 0 || !granularity.is_power_of_two() {
            return Err(CudaError::invalid(
                "cuMemGetAllocationGranularity",
                format!("the driver reported a granularity of {granularity}"),
            ));
        }
        Ok(granularity)
    }

    /// `len` bytes (at least one granule, rounded up to the granularity) in one chunk.
    pub fn new(gpu: &Gpu, len: usize) -> CudaResult<Arc<VmmAllocation>> {
        VmmAllocation::with_chunks(gpu, &[len])
    }

    /// One chunk per entry of `chunk_lens` (each rounded up to the granularity, zero to
    /// one granule), mapped side by side in one reserved range.
    pub fn with_chunks(gpu: &Gpu, chunk_lens: &[usize]) -> CudaResult<Arc<VmmAllocation>> {
        const CALL: &str = "VmmAllocation::with_chunks";
        if chunk_lens.is_empty() {
            return Err(CudaError::invalid(CALL, "no chunks asked for"));
        }
        let granule = VmmAllocation::granularity(gpu)?;
        let lens = chunk_lens
            .iter()
            .map(|&l| round_up(l.max(1), granule))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| CudaError::invalid(CALL, "a chunk length is too large"))?;
        let total = lens
            .iter()
            .try_fold(0usize, |sum, &l| sum.checked_add(l))
            .ok_or_else(|| CudaError::invalid(CALL, "the chunk lengths overflow"))?;
        let base = reserve(gpu, total, granule)?;
        // From here on, the allocation's Drop undoes whatever was done if a step fails.
        let mut alloc =
            VmmAllocation { gpu: gpu.clone(), base, len: total, chunks: Vec::new(), chunk_lens: lens.clone() };
        let prop = allocation_prop(gpu);
        let mut offset = 0usize;
        for len in lens {
            let handle = create(gpu, len, &prop)?;
            alloc.chunks.push(Chunk { offset, len, handle, mapped: false, known: None });
            let ptr = base + offset as u64;
            map(gpu, ptr, len, handle)?;
            if let Some(chunk) = alloc.chunks.last_mut() {
                chunk.mapped = true;
            }
            set_access(gpu, ptr, len)?;
            offset += len;
        }
        for chunk in &mut alloc.chunks {
            chunk.known = describe_mapping(gpu, base + chunk.offset as u64, chunk.len);
        }
        tracing::debug!(device = gpu.ordinal(), bytes = total, chunks = alloc.chunks.len(), "VMM allocation made");
        Ok(Arc::new(alloc))
    }

    /// The device address of the start of the range.
    pub fn device_ptr(&self) -> u64 {
        self.base
    }
    /// The size of the range (the sum of [`VmmAllocation::chunk_lens`]).
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the range is empty (never: every chunk is at least one granule).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The lengths of the chunks, in address order, as rounded up.
    pub fn chunk_lens(&self) -> &[usize] {
        &self.chunk_lens
    }
    /// The device.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// `len` bytes at `offset` as a [`DeviceBuffer`] whose owner keeps this allocation
    /// alive. A buffer inside one chunk carries the driver's description of that chunk
    /// ([`DeviceMemoryOwner::allocation`]); one straddling chunks carries none.
    pub fn buffer(self: &Arc<Self>, offset: usize, len: usize) -> CudaResult<DeviceBuffer> {
        let end = offset.checked_add(len).filter(|&end| end <= self.len).ok_or_else(|| {
            CudaError::invalid("VmmAllocation::buffer", format!("{offset}+{len} exceeds the range of {}", self.len))
        })?;
        let known = self.chunks.iter().find(|c| c.offset <= offset && end <= c.offset + c.len).and_then(|c| c.known);
        let owner = Arc::new(VmmRange { alloc: self.clone(), offset, known });
        // SAFETY: `base + offset .. + len` lies inside the mapped range (checked above),
        // which stays mapped while the owner holds the allocation.
        Ok(unsafe { DeviceBuffer::from_raw_parts(self.base + offset as u64, len, self.gpu.ordinal(), owner) })
    }
}

impl Drop for VmmAllocation {
    fn drop(&mut self) {
        if let Err(e) = self.gpu.bind_to_current_thread() {
            tracing::warn!(error = %e, ptr = self.base, "VMM allocation leaked: cannot bind its context");
            return;
        }
        for chunk in &self.chunks {
            if chunk.mapped {
                unmap(self.base + chunk.offset as u64, chunk.len);
            }
            release(chunk.handle);
        }
        address_free(self.base, self.len);
    }
}

impl fmt::Debug for VmmAllocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VmmAllocation")
            .field("ptr", &format_args!("{:#x}", self.base))
            .field("len", &self.len)
            .field("chunk_lens", &self.chunk_lens)
            .field("device", &self.gpu.ordinal())
            .finish()
    }
}

/// The owner of a buffer carved from a [`VmmAllocation`].
struct VmmRange {
    alloc: Arc<VmmAllocation>,
    offset: usize,
    known: Option<KnownAllocation>,
}

impl DeviceMemoryOwner for VmmRange {
    fn describe(&self) -> String {
        format!(
            "VMM allocation {:#x} +{:#x} ({} chunks, device {})",
            self.alloc.base,
            self.offset,
            self.alloc.chunks.len(),
            self.alloc.gpu.ordinal()
        )
    }
    fn allocation(&self) -> Option<KnownAllocation> {
        self.known
    }
}

/// `value` rounded up to a multiple of the power of two `to`; `None` on overflow.
fn round_up(value: usize, to: usize) -> Option<usize> {
    value.checked_add(to - 1).map(|v| v & !(to - 1))
}

/// The device as a memory location.
pub(super) fn device_location(gpu: &Gpu) -> sys::CUmemLocation {
    location(sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, gpu.raw_device())
}

/// A `CUmemLocation` in every CUDA version of the bindings: CUDA 13.2 moved `id` into a
/// union (13.4 added a member beside it), so the field is named differently there, but the
/// layout stayed `{ CUmemLocationType type; int id; }`.
pub(super) fn location(type_: sys::CUmemLocationType, id: std::ffi::c_int) -> sys::CUmemLocation {
    #[repr(C)]
    struct Location {
        type_: sys::CUmemLocationType,
        id: std::ffi::c_int,
    }
    // SAFETY: both types are `repr(C)`: the same enum, then a C int, or a union of 4 bytes
    // whose member `id` (a C int) starts it; so the same size (`transmute` checks it at
    // compile time), alignment and field offsets, and each field of `Location` holds a
    // valid value of the field at its offset.
    unsafe { std::mem::transmute::<Location, sys::CUmemLocation>(Location { type_, id }) }
}

/// Pinned device memory on `gpu`, exportable as a POSIX fd.
fn allocation_prop(gpu: &Gpu) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        location: device_location(gpu),
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// The driver's description of the mapping at `ptr` when it is the mapping itself
/// (`cuMemGetAddressRange` reports the mapping, not the reserved range); `None` (and a
/// debug line) otherwise, so the export path asks again.
fn describe_mapping(gpu: &Gpu, ptr: u64, len: usize) -> Option<KnownAllocation> {
    match pointer_info(gpu, ptr) {
        Ok(info) if info.base == ptr && info.alloc_len == len && info.buffer_id != 0 => Some(KnownAllocation {
            base: info.base,
            len: info.alloc_len,
            buffer_id: info.buffer_id,
            legacy_ipc_capable: info.legacy_ipc_capable,
        }),
        Ok(info) => {
            tracing::debug!(ptr, len, ?info, "VMM mapping described unexpectedly: not recorded");
            None
        }
        Err(e) => {
            tracing::debug!(ptr, len, error = %e, "VMM mapping not described: not recorded");
            None
        }
    }
}

/// `cuMemAddressReserve` of `len` bytes aligned to `align`, in `gpu`'s context.
pub(super) fn reserve(gpu: &Gpu, len: usize, align: usize) -> CudaResult<u64> {
    gpu.bind_to_current_thread()?;
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: the context is bound; the call writes one address.
    check("cuMemAddressReserve", unsafe { sys::cuMemAddressReserve(&mut ptr, len, align, 0, 0) })?;
    if ptr == 0 {
        return Err(CudaError::invalid("cuMemAddressReserve", "the driver returned a null range"));
    }
    Ok(ptr)
}

/// `cuMemCreate` of `len` bytes with `prop`, in `gpu`'s context.
fn create(gpu: &Gpu, len: usize, prop: &sys::CUmemAllocationProp) -> CudaResult<sys::CUmemGenericAllocationHandle> {
    gpu.bind_to_current_thread()?;
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: the context is bound; `prop` is initialised; the call writes one handle.
    check("cuMemCreate", unsafe { sys::cuMemCreate(&mut handle, len, prop, 0) })?;
    if handle == 0 {
        return Err(CudaError::invalid("cuMemCreate", "the driver returned a null handle"));
    }
    Ok(handle)
}

/// `cuMemMap` of all of `handle` (offset 0) at `ptr`, in `gpu`'s context.
pub(super) fn map(gpu: &Gpu, ptr: u64, len: usize, handle: sys::CUmemGenericAllocationHandle) -> CudaResult<()> {
    gpu.bind_to_current_thread()?;
    // SAFETY: the context is bound; `ptr..ptr+len` is an unmapped part of a range we
    // reserved and `handle` a live physical allocation; the driver checks both.
    check("cuMemMap", unsafe { sys::cuMemMap(ptr, len, 0, handle, 0) })
}

/// `cuMemSetAccess`: `ptr..ptr+len` read-write for `gpu`.
pub(super) fn set_access(gpu: &Gpu, ptr: u64, len: usize) -> CudaResult<()> {
    gpu.bind_to_current_thread()?;
    let desc = sys::CUmemAccessDesc {
        location: device_location(gpu),
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: the context is bound; `ptr..ptr+len` is mapped; one descriptor is passed.
    check("cuMemSetAccess", unsafe { sys::cuMemSetAccess(ptr, len, &desc, 1) })
}

/// `cuMemRetainAllocationHandle` of the mapping holding `ptr` (context bound by the
/// caller); the handle must be given back with [`release`].
pub(super) fn retain(ptr: u64) -> CudaResult<sys::CUmemGenericAllocationHandle> {
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: the call writes one handle; the driver validates the address (any address
    // inside a mapping) and fails for memory that is not VMM-mapped.
    check("cuMemRetainAllocationHandle", unsafe {
        sys::cuMemRetainAllocationHandle(&mut handle, ptr as usize as *mut std::ffi::c_void)
    })?;
    if handle == 0 {
        return Err(CudaError::invalid("cuMemRetainAllocationHandle", "the driver returned a null handle"));
    }
    Ok(handle)
}

/// `cuMemRelease` (context bound by the caller); failures are logged, for drops.
pub(super) fn release(handle: sys::CUmemGenericAllocationHandle) {
    // SAFETY: `handle` is a handle we hold one reference of, given back exactly once.
    if let Err(e) = check("cuMemRelease", unsafe { sys::cuMemRelease(handle) }) {
        tracing::warn!(error = %e, handle, "cuMemRelease failed");
    }
}

/// `cuMemUnmap` (context bound by the caller); failures are logged, for drops.
pub(super) fn unmap(ptr: u64, len: usize) {
    // SAFETY: `ptr..ptr+len` is a mapping we made and unmap exactly once.
    if let Err(e) = check("cuMemUnmap", unsafe { sys::cuMemUnmap(ptr, len) }) {
        tracing::warn!(error = %e, ptr, len, "cuMemUnmap failed");
    }
}

/// `cuMemAddressFree` (context bound by the caller); failures are logged, for drops.
pub(super) fn address_free(ptr: u64, len: usize) {
    // SAFETY: `ptr..ptr+len` is a range we reserved and free exactly once, its
    // mappings unmapped before.
    if let Err(e) = check("cuMemAddressFree", unsafe { sys::cuMemAddressFree(ptr, len) }) {
        tracing::warn!(error = %e, ptr, len, "cuMemAddressFree failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn location_is_the_type_then_the_id() {
        let loc = location(sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, 7);
        // SAFETY: a CUmemLocation is 8 bytes of plain data (an enum of C int size, then
        // a C int or a union that starts with one), readable as two C ints.
        let raw = unsafe { std::mem::transmute::<sys::CUmemLocation, [std::ffi::c_int; 2]>(loc) };
        assert_eq!(raw, [sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE as std::ffi::c_int, 7]);
    }

    #[test]
    fn rounding() {
        assert_eq!(round_up(1, 2 << 20), Some(2 << 20));
        assert_eq!(round_up(2 << 20, 2 << 20), Some(2 << 20));
        assert_eq!(round_up((2 << 20) + 1, 2 << 20), Some(4 << 20));
        assert_eq!(round_up(usize::MAX, 2 << 20), None);
    }

    #[test]
    fn no_panic_without_cuda() {
        // Without CUDA no Gpu exists; with it, a small allocation works.
        match Gpu::get(0) {
            Ok(gpu) => {
                let a = VmmAllocation::new(&gpu, 1).unwrap();
                assert_eq!(a.len() % VmmAllocation::granularity(&gpu).unwrap(), 0);
                assert!(VmmAllocation::with_chunks(&gpu, &[]).is_err());
            }
            Err(e) => assert!(matches!(e, CudaError::Unavailable(_))),
        }
    }
}
