//! VMM memory between processes: the chunks of a range ([`vmm_chunks`]), one chunk out as
//! a POSIX fd ([`export_chunk`]) and mapped in by the receiver ([`ImportedVmmChunk`]).

use super::{address_free, map, release, reserve, retain, round_up, set_access, unmap, VmmAllocation};
use crate::cuda::context::Gpu;
use crate::cuda::error::{check, CudaError, CudaResult};
use crate::cuda::pointer::{address_range, attribute};
use crate::{DeviceBuffer, DeviceMemoryOwner};
use cudarc::driver::sys;
use std::fmt;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;

/// One physical chunk mapping, as the driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VmmChunk {
    /// Base address of the mapping (`cuMemGetAddressRange`).
    pub base: u64,
    /// Its size.
    pub len: usize,
    /// `CU_POINTER_ATTRIBUTE_BUFFER_ID` of the mapping: a new id when a range is freed
    /// and made again at the same address, so (base, len, buffer_id) keys a cache.
    pub buffer_id: u64,
}

/// The chunks covering `ptr..ptr+len` (at least the one holding `ptr`), in address
/// order: one `cuMemGetAddressRange` per mapping, each checked to be VMM memory with
/// `cuMemRetainAllocationHandle` (released again at once). Fails for memory that is not
/// VMM-mapped (`cuMemAlloc`) or a range running past its mappings. Pool memory is
/// exported through its pool instead ([`crate::cuda::export_route`] says which).
pub fn vmm_chunks(gpu: &Gpu, ptr: u64, len: usize) -> CudaResult<Vec<VmmChunk>> {
    const CALL: &str = "vmm_chunks";
    let end = ptr.checked_add(len.max(1) as u64).ok_or_else(|| CudaError::invalid(CALL, "the range overflows"))?;
    let mut chunks = Vec::new();
    let mut at = ptr;
    while at < end {
        let (base, size) = address_range(gpu, at)?;
        let mapping_end = base.checked_add(size as u64).unwrap_or(0);
        if size == 0 || base > at || mapping_end <= at {
            return Err(CudaError::invalid(
                CALL,
                format!("cuMemGetAddressRange reported {base:#x}+{size:#x} for address {at:#x}"),
            ));
        }
        // The context is bound (address_range bound it).
        release(retain(at)?);
        let buffer_id = attribute(sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID, base)?;
        if buffer_id == 0 {
            return Err(CudaError::invalid(CALL, format!("the driver gave the mapping at {base:#x} buffer id 0")));
        }
        chunks.push(VmmChunk { base, len: size, buffer_id });
        at = mapping_end;
    }
    Ok(chunks)
}

/// The physical allocation mapped at `chunk_base` (the base of a mapping, as
/// [`vmm_chunks`] reports it) as a POSIX fd: `cuMemRetainAllocationHandle`,
/// `cuMemExportToShareableHandle`, `cuMemRelease`. The memory must have been made
/// shareable as POSIX fds. The receiver maps it with [`ImportedVmmChunk::import`]; the
/// memory lives while the receiver keeps it mapped, even when the sender frees it.
pub fn export_chunk(gpu: &Gpu, chunk_base: u64) -> CudaResult<OwnedFd> {
    let (base, _) = address_range(gpu, chunk_base)?;
    if base != chunk_base {
        return Err(CudaError::invalid(
            "export_chunk",
            format!("{chunk_base:#x} is not the base of its mapping (which starts at {base:#x})"),
        ));
    }
    let handle = retain(chunk_base)?;
    let mut fd: std::ffi::c_int = -1;
    // SAFETY: the context is bound (address_range bound it); `handle` is live (retained
    // above); for POSIX fds the driver writes one int.
    let res = unsafe {
        sys::cuMemExportToShareableHandle(
            (&mut fd as *mut std::ffi::c_int).cast(),
            handle,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    };
    release(handle);
    check("cuMemExportToShareableHandle", res)?;
    if fd < 0 {
        return Err(CudaError::invalid("cuMemExportToShareableHandle", format!("the driver returned fd {fd}")));
    }
    // SAFETY: the driver just opened `fd` for us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A chunk another process exported ([`export_chunk`]), mapped here read-write for one
/// device: `cuMemImportFromShareableHandle`, a reserved range of its own, `cuMemMap`,
/// `cuMemSetAccess`. Dropping it unmaps the chunk, releases the handle and frees the
/// range. The fd may be closed once it is imported.
pub struct ImportedVmmChunk {
    gpu: Gpu,
    /// 0 until the range is reserved.
    ptr: u64,
    len: usize,
    handle: sys::CUmemGenericAllocationHandle,
    mapped: bool,
}

impl ImportedVmmChunk {
    /// Imports the chunk behind `fd` (an fd of [`export_chunk`]), `len` bytes long (the
    /// chunk's length; rounded up to the granularity), and maps it for `gpu`.
    pub fn import(gpu: &Gpu, fd: BorrowedFd<'_>, len: usize) -> CudaResult<ImportedVmmChunk> {
        if len == 0 {
            return Err(CudaError::invalid("ImportedVmmChunk::import", "an empty chunk"));
        }
        let granule = VmmAllocation::granularity(gpu)?;
        let len = round_up(len, granule)
            .ok_or_else(|| CudaError::invalid("ImportedVmmChunk::import", format!("length {len} too large")))?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: the context is bound (granularity bound it); for POSIX fds the handle
        // argument is the fd's value itself; the driver validates it and writes one
        // handle. The fd stays ours.
        check("cuMemImportFromShareableHandle", unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                fd.as_raw_fd() as isize as *mut std::ffi::c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        })?;
        if handle == 0 {
            return Err(CudaError::invalid("cuMemImportFromShareableHandle", "the driver returned a null handle"));
        }
        // From here on, Drop undoes whatever was done if a step fails.
        let mut chunk = ImportedVmmChunk { gpu: gpu.clone(), ptr: 0, len, handle, mapped: false };
        chunk.ptr = reserve(gpu, len, granule)?;
        map(gpu, chunk.ptr, len, handle)?;
        chunk.mapped = true;
        set_access(gpu, chunk.ptr, len)?;
        Ok(chunk)
    }

    /// The device address of the mapping here.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }
    /// Its length (rounded up to the granularity).
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it is empty (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The device it is mapped for.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The whole mapping as a [`DeviceBuffer`] that unmaps it when its owner drops.
    pub fn into_buffer(self) -> DeviceBuffer {
        let (ptr, len, ordinal) = (self.ptr, self.len, self.gpu.ordinal());
        // SAFETY: `ptr..ptr+len` is mapped read-write for this device while the owner
        // (the chunk itself) lives.
        unsafe { DeviceBuffer::from_raw_parts(ptr, len, ordinal, Arc::new(self)) }
    }
}

impl DeviceMemoryOwner for ImportedVmmChunk {
    fn describe(&self) -> String {
        format!("imported VMM chunk {:#x} ({} B, device {})", self.ptr, self.len, self.gpu.ordinal())
    }
}

impl Drop for ImportedVmmChunk {
    fn drop(&mut self) {
        if let Err(e) = self.gpu.bind_to_current_thread() {
            tracing::warn!(error = %e, ptr = self.ptr, "imported VMM chunk leaked: cannot bind its context");
            return;
        }
        if self.mapped {
            unmap(self.ptr, self.len);
        }
        release(self.handle);
        if self.ptr != 0 {
            address_free(self.ptr, self.len);
        }
    }
}

impl fmt::Debug for ImportedVmmChunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImportedVmmChunk")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("device", &self.gpu.ordinal())
            .finish()
    }
}
