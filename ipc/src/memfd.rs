//! Shared host memory: sealed memfd regions.
//!
//! The exporting side creates a [`MemfdRegion`] (memfd, sized once, then sealed against
//! shrinking and growing, mapped read-write) and carves [`HostBuffer`]s out of it. The
//! importing side receives the fd and maps it read-only with [`ImportedMemfd::import`],
//! which first checks that the fd *is* a memfd sealed against shrinking: a peer can then
//! never truncate the file under our mapping (which would turn our reads into SIGBUS).

use ferrylink_memory::{HostBuffer, HostRegion};
use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use thiserror::Error;

/// Allocation granularity inside a region (keeps frames cache-line aligned).
const ALIGN: usize = 64;

static NEXT_REGION_ID: AtomicU64 = AtomicU64::new(1);

/// A memfd mapped read-write in this process, sealed against size changes, with a simple
/// first-fit allocator of disjoint ranges.
pub struct MemfdRegion {
    fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
    id: u64,
    /// Free ranges: offset → length, coalesced.
    free: Mutex<BTreeMap<usize, usize>>,
    used: AtomicUsize,
}

// SAFETY: the mapping is plain shared memory owned by this struct; the allocator hands out
// disjoint ranges, and the free list is behind a Mutex.
unsafe impl Send for MemfdRegion {}
// SAFETY: as above.
unsafe impl Sync for MemfdRegion {}

impl MemfdRegion {
    /// Creates, sizes, seals and maps a memfd of `len` bytes.
    pub fn create(name: &str, len: usize) -> std::io::Result<Arc<Self>> {
        let fd = create_sealed(name, len)?;
        // The flags ORed in this file share no bit: `^` would give the same value (an
        // equivalent mutant, excluded in .cargo/mutants.toml).
        let ptr = map(&fd, len, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE)?;
        let mut free = BTreeMap::new();
        // `>=` would add a free range of zero bytes, which no allocation takes (an
        // equivalent mutant, as the one in `alloc`).
        if len > 0 {
            free.insert(0, len);
        }
        Ok(Arc::new(Self {
            fd,
            ptr,
            len,
            id: NEXT_REGION_ID.fetch_add(1, Ordering::Relaxed),
            free: Mutex::new(free),
            used: AtomicUsize::new(0),
        }))
    }

    /// Carves `len` bytes out of the region; `None` when no free range is large enough.
    pub fn alloc(self: &Arc<Self>, len: usize) -> Option<HostBuffer> {
        let rounded = len.max(1).checked_next_multiple_of(ALIGN)?;
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let (&offset, &size) = free.iter().find(|(_, &size)| size >= rounded)?;
        free.remove(&offset);
        // `>=` would leave a zero-byte free range where this buffer ends; the release of
        // either neighbour overwrites or absorbs it (an equivalent mutant).
        if size > rounded {
            free.insert(offset + rounded, size - rounded);
        }
        drop(free);
        self.used.fetch_add(rounded, Ordering::Relaxed);
        let region: Arc<dyn HostRegion> = self.clone();
        Some(HostBuffer::from_region(region, offset, len))
    }

    /// Bytes currently handed out.
    pub fn used_bytes(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The memfd.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl HostRegion for MemfdRegion {
    fn base_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
    fn region_id(&self) -> u64 {
        self.id
    }
    fn shareable_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.fd.as_fd())
    }
    fn release(&self, offset: usize, len: usize) {
        let Some(rounded) = len.max(1).checked_next_multiple_of(ALIGN) else { return };
        self.used.fetch_sub(rounded, Ordering::Relaxed);
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let mut start = offset;
        let mut size = rounded;
        if let Some((&prev, &prev_len)) = free.range(..offset).next_back() {
            if prev + prev_len == offset {
                free.remove(&prev);
                start = prev;
                size += prev_len;
            }
        }
        if let Some(&next_len) = free.get(&(offset + rounded)) {
            free.remove(&(offset + rounded));
            size += next_len;
        }
        free.insert(start, size);
    }
}

impl Drop for MemfdRegion {
    fn drop(&mut self) {
        unmap(self.ptr, self.len);
    }
}

/// A host buffer of `len` bytes in its own memfd: sending it on the native lane passes the
/// fd once and no bytes through the socket.
pub fn shared_host_buffer(len: usize) -> std::io::Result<HostBuffer> {
    let region = MemfdRegion::create("ferrylink-shared", len.max(1).next_multiple_of(ALIGN))?;
    Ok(region.alloc(len).expect("a fresh region holds its own length"))
}

/// Why an fd received from a peer was not mapped.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ImportError {
    /// Not a memfd (no seals can be read).
    #[error("the descriptor is not a memfd")]
    NotMemfd,
    /// A memfd that may still shrink: a mapping of it could fault.
    #[error("the memfd is not sealed against shrinking")]
    NotSealed,
    /// Larger than the receiver accepts.
    #[error("the memfd holds {len} bytes; at most {max} are accepted")]
    TooLarge {
        /// Its size.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// A system call failed.
    #[error("mapping the memfd failed: {0}")]
    Io(#[from] std::io::Error),
}

/// A peer's memfd mapped in this process: read-only ([`ImportedMemfd::import`]), or
/// read-write for one-sided transfers that write it ([`ImportedMemfd::import_writable`]).
pub struct ImportedMemfd {
    _fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
}

// SAFETY: a mapping owned by this struct; reads go through copy_out, writes through
// copy_in (a shared mapping: the peer may write it too, as one-sided transfers expect).
unsafe impl Send for ImportedMemfd {}
// SAFETY: as above.
unsafe impl Sync for ImportedMemfd {}

impl ImportedMemfd {
    /// Checks and maps a received fd: it must be a memfd sealed against shrinking and at
    /// most `max_len` bytes.
    pub fn import(fd: OwnedFd, max_len: u64) -> Result<Self, ImportError> {
        let size = sealed_size(&fd)?;
        if size > max_len {
            return Err(ImportError::TooLarge { len: size, max: max_len });
        }
        let len = size as usize;
        let ptr = map(&fd, len, ProtFlags::PROT_READ)?;
        Ok(Self { _fd: fd, ptr, len, writable: false })
    }

    /// [`ImportedMemfd::import`], mapped read-write: [`ImportedMemfd::copy_in`] writes it.
    pub fn import_writable(fd: OwnedFd, max_len: u64) -> Result<Self, ImportError> {
        let size = sealed_size(&fd)?;
        if size > max_len {
            return Err(ImportError::TooLarge { len: size, max: max_len });
        }
        let len = size as usize;
        let ptr = map(&fd, len, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE)?;
        Ok(Self { _fd: fd, ptr, len, writable: true })
    }

    /// Copies `src` to `offset..offset+src.len()`; `false` when the range is outside or
    /// the mapping is read-only.
    pub fn copy_in(&self, offset: usize, src: &[u8]) -> bool {
        let Some(end) = offset.checked_add(src.len()) else { return false };
        if end > self.len || !self.writable {
            return false;
        }
        if !src.is_empty() {
            // SAFETY: offset..end lies inside our live read-write mapping (checked above),
            // which cannot shrink (sealed); `src` is memory of this process that is not
            // this mapping's (a registration of its own).
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len()) };
        }
        true
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is mapped.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `offset..offset+dst.len()` into `dst`; `false` when the range is outside.
    pub fn copy_out(&self, offset: usize, dst: &mut [u8]) -> bool {
        let Some(end) = offset.checked_add(dst.len()) else { return false };
        if end > self.len {
            return false;
        }
        if !dst.is_empty() {
            // SAFETY: offset..end lies inside our live read-only mapping (checked above),
            // which cannot shrink (sealed); dst is a distinct exclusive slice.
            unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), dst.as_mut_ptr(), dst.len()) };
        }
        true
    }
}

impl Drop for ImportedMemfd {
    fn drop(&mut self) {
        unmap(self.ptr, self.len);
    }
}

/// A growing set of memfd regions serving staging allocations up to `max_bytes` in all.
pub struct MemfdPool {
    name: String,
    region_bytes: usize,
    max_bytes: usize,
    regions: Mutex<Vec<Arc<MemfdRegion>>>,
}

impl MemfdPool {
    /// A pool that creates regions of `region_bytes` (or larger, for a larger request),
    /// never more than `max_bytes` in all.
    pub fn new(name: &str, region_bytes: usize, max_bytes: usize) -> Self {
        Self { name: name.to_owned(), region_bytes, max_bytes, regions: Mutex::new(Vec::new()) }
    }

    /// A buffer of `len` bytes from the pool; `Ok(None)` when the pool is at its limit
    /// (wait for buffers to be released).
    pub fn alloc(&self, len: usize) -> std::io::Result<Option<HostBuffer>> {
        let mut regions = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        for region in regions.iter() {
            if let Some(buf) = region.alloc(len) {
                return Ok(Some(buf));
            }
        }
        let total: usize = regions.iter().map(|r| r.len).sum();
        let size = len.next_multiple_of(ALIGN).max(self.region_bytes);
        if total + size > self.max_bytes {
            // Give back idle regions so that a large request may fit later.
            regions.retain(|r| r.used_bytes() > 0);
            let total: usize = regions.iter().map(|r| r.len).sum();
            if total + size > self.max_bytes {
                return Ok(None);
            }
        }
        let region = MemfdRegion::create(&self.name, size)?;
        let buf = region.alloc(len);
        regions.push(region);
        Ok(buf)
    }

    /// Bytes of memfd memory the pool holds.
    pub fn mapped_bytes(&self) -> usize {
        self.regions.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|r| r.len).sum()
    }

    /// Bytes handed out and not yet released.
    pub fn used_bytes(&self) -> usize {
        self.regions.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|r| r.used_bytes()).sum()
    }
}

/// A memfd of `len` bytes (close-on-exec), sealed against shrinking, growing and further
/// seals: a peer it is passed to can map it without fearing a truncation.
pub(crate) fn create_sealed(name: &str, len: usize) -> std::io::Result<OwnedFd> {
    let cname = CString::new(name).unwrap_or_else(|_| CString::new("ferrylink").expect("static name"));
    let fd = memfd_create(cname.as_c_str(), MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)?;
    nix::unistd::ftruncate(&fd, len as i64)?;
    fcntl(&fd, FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL))?;
    Ok(fd)
}

/// The size of a received fd, after checking it is a memfd sealed against shrinking (a
/// mapping of it can then never fault).
pub(crate) fn sealed_size(fd: &OwnedFd) -> Result<u64, ImportError> {
    let seals = match fcntl(fd, FcntlArg::F_GET_SEALS) {
        Ok(bits) => SealFlag::from_bits_truncate(bits),
        Err(nix::errno::Errno::EINVAL) => return Err(ImportError::NotMemfd),
        Err(e) => return Err(ImportError::Io(e.into())),
    };
    if !seals.contains(SealFlag::F_SEAL_SHRINK) {
        return Err(ImportError::NotSealed);
    }
    Ok(nix::sys::stat::fstat(fd).map_err(std::io::Error::from)?.st_size as u64)
}

pub(crate) fn map(fd: &OwnedFd, len: usize, prot: ProtFlags) -> std::io::Result<NonNull<u8>> {
    let Some(nz) = NonZeroUsize::new(len) else {
        return Ok(NonNull::dangling());
    };
    // SAFETY: a fresh shared mapping of a file we hold; no existing memory is affected.
    let ptr = unsafe { mmap(None, nz, prot, MapFlags::MAP_SHARED, fd, 0) }?;
    Ok(ptr.cast())
}

pub(crate) fn unmap(ptr: NonNull<u8>, len: usize) {
    if len == 0 {
        return;
    }
    // SAFETY: ptr/len describe a mapping made by `map` and owned by the dropping struct;
    // every HostBuffer into it holds an Arc to that struct, so none outlives the unmap.
    if let Err(e) = unsafe { munmap(ptr.cast(), len) } {
        tracing::warn!("munmap of a memfd region failed: {e}");
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    fn dup(fd: BorrowedFd<'_>) -> OwnedFd {
        fd.try_clone_to_owned().unwrap()
    }

    #[test]
    fn a_writable_import_writes_the_exporters_memory_and_a_read_only_one_refuses() {
        let buf = shared_host_buffer(4096).unwrap();
        let (region, offset) = buf.region().unwrap();
        let writable = ImportedMemfd::import_writable(dup(region.shareable_fd().unwrap()), 1 << 20).unwrap();
        assert!(writable.copy_in(offset + 10, b"hello"));
        assert_eq!(&buf.as_slice()[10..15], b"hello");
        assert!(writable.copy_in(writable.len() - 1, b"x"));
        assert!(!writable.copy_in(writable.len(), b"x"), "one past the end");
        assert!(!writable.copy_in(usize::MAX, b"x"));
        let read_only = ImportedMemfd::import(dup(region.shareable_fd().unwrap()), 1 << 20).unwrap();
        assert!(!read_only.copy_in(offset, b"x"));
    }

    #[test]
    fn exported_region_reads_back_through_an_import() {
        let mut buf = shared_host_buffer(10_000).unwrap();
        buf.as_mut_slice().iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
        let (region, offset) = buf.region().unwrap();
        let imported = ImportedMemfd::import(dup(region.shareable_fd().unwrap()), 1 << 20).unwrap();
        let mut out = vec![0; 10_000];
        assert!(imported.copy_out(offset, &mut out));
        assert_eq!(out, buf.as_slice());
        assert!(!imported.copy_out(imported.len() - 1, &mut [0; 2]));
        assert!(!imported.copy_out(usize::MAX, &mut [0; 2]));
    }

    #[test]
    fn import_refuses_plain_files_unsealed_memfds_and_oversized_ones() {
        let file = tempfile_fd();
        assert!(matches!(ImportedMemfd::import(file, 1 << 20), Err(ImportError::NotMemfd)));
        let unsealed = memfd_create(c"unsealed", MFdFlags::MFD_CLOEXEC).unwrap();
        nix::unistd::ftruncate(&unsealed, 4096).unwrap();
        assert!(matches!(ImportedMemfd::import(unsealed, 1 << 20), Err(ImportError::NotSealed)));
        let big = MemfdRegion::create("big", 8192).unwrap();
        assert!(matches!(ImportedMemfd::import(dup(big.fd()), 4096), Err(ImportError::TooLarge { .. })));
    }

    /// A memfd of `len` bytes carrying exactly `seals` (and nothing else).
    pub(crate) fn memfd_sealed_with(len: usize, seals: SealFlag) -> OwnedFd {
        let fd = memfd_create(c"seals", MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING).unwrap();
        nix::unistd::ftruncate(&fd, len as i64).unwrap();
        fcntl(&fd, FcntlArg::F_ADD_SEALS(seals)).unwrap();
        fd
    }

    #[test]
    fn memfd_sealed_against_grow_only_is_refused() {
        let grow_only = memfd_sealed_with(4096, SealFlag::F_SEAL_GROW);
        assert!(matches!(ImportedMemfd::import(grow_only, 1 << 20), Err(ImportError::NotSealed)));
        let grow_only = memfd_sealed_with(4096, SealFlag::F_SEAL_GROW);
        assert!(matches!(ImportedMemfd::import_writable(grow_only, 1 << 20), Err(ImportError::NotSealed)));
    }

    #[test]
    fn memfd_sealed_against_everything_but_shrinking_is_refused() {
        let seals = SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_WRITE | SealFlag::F_SEAL_SEAL;
        let fd = memfd_sealed_with(4096, seals);
        assert!(matches!(ImportedMemfd::import(fd, 1 << 20), Err(ImportError::NotSealed)));
    }

    #[test]
    fn memfd_sealed_against_shrink_only_is_accepted_since_it_can_never_fault() {
        let shrink_only = memfd_sealed_with(4096, SealFlag::F_SEAL_SHRINK);
        let imported = ImportedMemfd::import(shrink_only, 1 << 20).expect("a shrink seal is all a mapping needs");
        assert_eq!(imported.len(), 4096);
    }

    #[test]
    fn a_created_region_is_sealed_against_shrinking_growing_and_further_seals() {
        let region = MemfdRegion::create("seals", 4096).unwrap();
        let seals = SealFlag::from_bits_truncate(fcntl(region.fd(), FcntlArg::F_GET_SEALS).unwrap());
        assert_eq!(seals, SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL);
    }

    #[test]
    fn imports_accept_a_memfd_of_exactly_their_limit_and_refuse_one_byte_more() {
        let region = MemfdRegion::create("limit", 8192).unwrap();
        assert_eq!(ImportedMemfd::import(dup(region.fd()), 8192).unwrap().len(), 8192);
        assert_eq!(ImportedMemfd::import_writable(dup(region.fd()), 8192).unwrap().len(), 8192);
        let too_large = |e| matches!(e, Err(ImportError::TooLarge { len: 8192, max: 8191 }));
        assert!(too_large(ImportedMemfd::import(dup(region.fd()), 8191).map(|_| ())));
        assert!(too_large(ImportedMemfd::import_writable(dup(region.fd()), 8191).map(|_| ())));
    }

    #[test]
    fn an_import_copies_out_up_to_its_last_byte_and_no_further() {
        let region = MemfdRegion::create("last", 4096).unwrap();
        let imported = ImportedMemfd::import(dup(region.fd()), 4096).unwrap();
        assert!(imported.copy_out(0, &mut [0; 4096]));
        assert!(imported.copy_out(4095, &mut [0; 1]));
        assert!(imported.copy_out(4096, &mut []));
        assert!(!imported.copy_out(0, &mut [0; 4097]));
    }

    #[test]
    fn an_empty_import_is_empty_and_a_sized_one_is_not() {
        let empty = ImportedMemfd::import(memfd_sealed_with(0, SealFlag::F_SEAL_SHRINK), 4096).unwrap();
        assert!(empty.is_empty());
        let sized = ImportedMemfd::import(memfd_sealed_with(1, SealFlag::F_SEAL_SHRINK), 4096).unwrap();
        assert!(!sized.is_empty());
    }

    /// A memfd named `name`, `len` bytes, sealed against shrinking (as a peer sends).
    pub(crate) fn named_memfd(name: &str, len: usize) -> OwnedFd {
        let cname = CString::new(name).unwrap();
        let fd = memfd_create(cname.as_c_str(), MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING).unwrap();
        nix::unistd::ftruncate(&fd, len as i64).unwrap();
        fcntl(&fd, FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK)).unwrap();
        fd
    }

    /// Whether this process maps a memfd named `name`.
    pub(crate) fn is_mapped(name: &str) -> bool {
        std::fs::read_to_string("/proc/self/maps").unwrap().contains(&format!("memfd:{name} "))
    }

    #[test]
    fn dropping_an_import_unmaps_it() {
        let name = format!("drop-probe-{}", std::process::id());
        let imported = ImportedMemfd::import(named_memfd(&name, 4096), 4096).unwrap();
        assert!(is_mapped(&name), "the import is mapped");
        drop(imported);
        assert!(!is_mapped(&name), "the mapping outlived the import");
    }

    #[test]
    fn dropping_a_region_and_its_buffers_unmaps_it() {
        let name = format!("region-drop-probe-{}", std::process::id());
        let region = MemfdRegion::create(&name, 4096).unwrap();
        let buffer = region.alloc(100).unwrap();
        drop(region);
        assert!(is_mapped(&name), "a buffer keeps its region mapped");
        drop(buffer);
        assert!(!is_mapped(&name), "the mapping outlived the region and its buffers");
    }

    #[test]
    fn every_region_has_its_own_id() {
        let (a, b) = (MemfdRegion::create("id-a", 64).unwrap(), MemfdRegion::create("id-b", 64).unwrap());
        assert_ne!(a.region_id(), b.region_id());
        assert_eq!(a.alloc(1).unwrap().region().unwrap().0.region_id(), a.region_id());
    }

    #[test]
    fn a_pool_grows_up_to_exactly_its_limit_and_gives_back_idle_regions() {
        let pool = MemfdPool::new("pool-limit", 4096, 8192);
        let first = pool.alloc(4096).unwrap().expect("one region");
        let second = pool.alloc(4096).unwrap().expect("a second region reaches the limit exactly");
        assert_eq!(pool.mapped_bytes(), 8192);
        assert!(pool.alloc(1).unwrap().is_none(), "past the limit");
        drop((first, second));
        let large = pool.alloc(8192).unwrap().expect("idle regions given back for a larger one");
        assert_eq!((pool.mapped_bytes(), pool.used_bytes()), (8192, 8192));
        drop(large);

        // Only the idle region goes where the new one would pass the limit; where it fits
        // beside every region held, even exactly at the limit, the idle one is kept.
        let given_back = idle_and_busy_then_8192(3 * 4096);
        assert_eq!(given_back, (3 * 4096, 3 * 4096), "the idle region given back, the busy one kept");
        assert_eq!(idle_and_busy_then_8192(4 * 4096), (4 * 4096, 3 * 4096), "the idle region kept");
    }

    /// A pool of 4096-byte regions under `max_bytes` holding one idle and one busy region
    /// asked for 8192 bytes: its mapped and used bytes then.
    fn idle_and_busy_then_8192(max_bytes: usize) -> (usize, usize) {
        let pool = MemfdPool::new("pool-idle-busy", 4096, max_bytes);
        let (idle, busy) = (pool.alloc(4096).unwrap().unwrap(), pool.alloc(4096).unwrap().unwrap());
        drop(idle);
        let large = pool.alloc(8192).unwrap().expect("room for 8192 bytes");
        let bytes = (pool.mapped_bytes(), pool.used_bytes());
        drop((busy, large));
        bytes
    }

    #[test]
    fn released_neighbours_merge_back_into_the_whole_region() {
        let region = MemfdRegion::create("coalesce", 4 * ALIGN).unwrap();
        let mut parts: Vec<_> = (0..4).map(|_| Some(region.alloc(ALIGN).unwrap())).collect();
        assert!(region.alloc(1).is_none(), "four exact fits fill the region");
        // Second, then third (merges with the range before it), then first (merges with
        // the range after it), then fourth (merges with the range before it).
        for i in [1, 2, 0, 3] {
            parts[i] = None;
        }
        assert_eq!(region.used_bytes(), 0);
        let whole = region.alloc(4 * ALIGN).expect("the released ranges merged into one");
        assert_eq!(whole.region().unwrap().1, 0);
        assert!(region.alloc(1).is_none(), "the merged range is exactly the region");
    }

    #[test]
    fn sealed_region_cannot_be_shrunk() {
        let region = MemfdRegion::create("sealed", 4096).unwrap();
        assert!(nix::unistd::ftruncate(region.fd(), 0).is_err());
        assert!(region.fd().as_raw_fd() >= 0);
    }

    #[test]
    fn region_allocator_reuses_and_coalesces() {
        let region = MemfdRegion::create("alloc", 4096).unwrap();
        let a = region.alloc(1000).unwrap();
        let b = region.alloc(1000).unwrap();
        let c = region.alloc(2000).unwrap();
        assert!(region.alloc(100).is_none(), "region is full");
        drop(b);
        drop(a);
        let big = region.alloc(2048).expect("a and b coalesced");
        drop(big);
        drop(c);
        assert_eq!(region.used_bytes(), 0);
        assert!(region.alloc(4096).is_some());
    }

    #[test]
    fn pool_grows_to_its_limit_then_says_wait() {
        let pool = MemfdPool::new("pool", 4096, 8192);
        let a = pool.alloc(4096).unwrap().unwrap();
        let b = pool.alloc(4096).unwrap().unwrap();
        assert!(pool.alloc(1).unwrap().is_none());
        assert_eq!(pool.used_bytes(), 8192);
        drop(a);
        assert!(pool.alloc(4096).unwrap().is_some());
        drop(b);
        let big = pool.alloc(8192).unwrap();
        assert!(big.is_some(), "idle regions are given back for a large request");
        assert_eq!(pool.mapped_bytes(), 8192);
    }

    fn tempfile_fd() -> OwnedFd {
        let path = std::env::temp_dir().join(format!("ferrylink-memfd-test-{}", std::process::id()));
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&[0; 4096]).unwrap();
        std::fs::remove_file(&path).unwrap();
        f.into()
    }
}
