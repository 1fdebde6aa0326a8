//! Host memory buffers: owned vectors or ranges of shared regions.

use std::fmt;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

/// A region of host memory that several [`HostBuffer`]s may be carved from.
///
/// Implemented by memfd-backed shared buffers (`ferrylink-ipc`) and by the pinned host
/// pool. A region hands out disjoint ranges: two live `HostBuffer`s never overlap, which
/// is what makes [`HostBuffer::as_mut_slice`] sound.
pub trait HostRegion: Send + Sync + 'static {
    /// Start of the mapping. Valid for `len()` bytes for as long as the region lives.
    fn base_ptr(&self) -> *mut u8;
    /// Bytes in the region.
    fn len(&self) -> usize;
    /// Whether the region is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// A process-unique id of this region (used to send its fd once and refer to it after).
    fn region_id(&self) -> u64;
    /// The memfd behind the region, when it can be shared with another process.
    fn shareable_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
    /// Whether the memory is page-locked and registered with CUDA (fast DMA).
    fn is_pinned(&self) -> bool {
        false
    }
    /// Called when a buffer carved from `offset..offset+len` is dropped (pools reuse it).
    fn release(&self, _offset: usize, _len: usize) {}
}

enum Storage {
    Owned(Vec<u8>),
    Region { region: Arc<dyn HostRegion>, offset: usize, len: usize },
}

/// Bytes in host memory.
pub struct HostBuffer {
    storage: Storage,
}

impl HostBuffer {
    /// A zero-filled owned buffer.
    pub fn zeroed(len: usize) -> Self {
        Self::from_vec(vec![0; len])
    }

    /// A zero-filled owned buffer, or `None` when the memory cannot be had: for lengths
    /// that come from elsewhere (a peer), where an abort on allocation failure is not
    /// acceptable. Large buffers are zeroed lazily by the kernel (calloc).
    pub fn try_zeroed(len: usize) -> Option<Self> {
        if len == 0 {
            return Some(Self::from_vec(Vec::new()));
        }
        let layout = std::alloc::Layout::array::<u8>(len).ok()?;
        // SAFETY: the layout has a non-zero size (len > 0).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return None;
        }
        // SAFETY: `ptr` was allocated by the global allocator with the layout of a
        // `[u8; len]` (so capacity == len), and all `len` bytes are initialised (zeroed).
        Some(Self::from_vec(unsafe { Vec::from_raw_parts(ptr, len, len) }))
    }

    /// Takes ownership of a vector.
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        Self { storage: Storage::Owned(bytes) }
    }

    /// A buffer over `offset..offset+len` of `region`.
    ///
    /// # Panics
    /// When the range is outside the region (a programming error of the region's owner).
    ///
    /// The caller (a region's allocator) guarantees no other live `HostBuffer` overlaps it.
    pub fn from_region(region: Arc<dyn HostRegion>, offset: usize, len: usize) -> Self {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= region.len()),
            "range {offset}+{len} outside a region of {} bytes",
            region.len()
        );
        Self { storage: Storage::Region { region, offset, len } }
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        match &self.storage {
            Storage::Owned(v) => v.len(),
            Storage::Region { len, .. } => *len,
        }
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        match &self.storage {
            Storage::Owned(v) => v,
            Storage::Region { region, offset, len } => {
                // SAFETY: from_region checked offset+len <= region.len(); the region keeps
                // the mapping alive while we hold the Arc; no live buffer overlaps ours.
                unsafe { std::slice::from_raw_parts(region.base_ptr().add(*offset), *len) }
            }
        }
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match &mut self.storage {
            Storage::Owned(v) => v,
            Storage::Region { region, offset, len } => {
                // SAFETY: as in as_slice; `&mut self` and the region's promise that ranges
                // are disjoint make this the only reference to these bytes in this process.
                unsafe { std::slice::from_raw_parts_mut(region.base_ptr().add(*offset), *len) }
            }
        }
    }

    /// The region and offset behind this buffer, when it is carved from one.
    pub fn region(&self) -> Option<(&Arc<dyn HostRegion>, usize)> {
        match &self.storage {
            Storage::Owned(_) => None,
            Storage::Region { region, offset, .. } => Some((region, *offset)),
        }
    }

    /// Whether the bytes are page-locked (registered with CUDA).
    pub fn is_pinned(&self) -> bool {
        self.region().is_some_and(|(r, _)| r.is_pinned())
    }

    /// Copies the bytes into a new owned vector.
    pub fn to_vec(&self) -> Vec<u8> {
        self.as_slice().to_vec()
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if let Storage::Region { region, offset, len } = &self.storage {
            region.release(*offset, *len);
        }
    }
}

impl From<Vec<u8>> for HostBuffer {
    fn from(bytes: Vec<u8>) -> Self {
        Self::from_vec(bytes)
    }
}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.storage {
            Storage::Owned(v) => f.debug_struct("HostBuffer").field("owned_len", &v.len()).finish(),
            Storage::Region { region, offset, len } => f
                .debug_struct("HostBuffer")
                .field("region", &region.region_id())
                .field("offset", offset)
                .field("len", len)
                .finish(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    struct VecRegion {
        bytes: Mutex<Vec<u8>>,
        ptr: *mut u8,
        len: usize,
        released: AtomicUsize,
    }
    // SAFETY: the pointer targets the Vec we own, which is never reallocated.
    unsafe impl Send for VecRegion {}
    // SAFETY: as above; disjoint ranges are handed out by the tests.
    unsafe impl Sync for VecRegion {}
    impl VecRegion {
        fn new(len: usize) -> Arc<Self> {
            let mut v = vec![0u8; len];
            let ptr = v.as_mut_ptr();
            Arc::new(Self { bytes: Mutex::new(v), ptr, len, released: AtomicUsize::new(0) })
        }
    }
    impl HostRegion for VecRegion {
        fn base_ptr(&self) -> *mut u8 {
            let _keep = &self.bytes;
            self.ptr
        }
        fn len(&self) -> usize {
            self.len
        }
        fn region_id(&self) -> u64 {
            7
        }
        fn release(&self, _offset: usize, len: usize) {
            self.released.fetch_add(len, Ordering::SeqCst);
        }
    }

    #[test]
    fn region_buffers_are_disjoint_views_and_released_on_drop() {
        let region = VecRegion::new(64);
        let mut a = HostBuffer::from_region(region.clone(), 0, 32);
        let mut b = HostBuffer::from_region(region.clone(), 32, 32);
        a.as_mut_slice().fill(1);
        b.as_mut_slice().fill(2);
        assert!(a.as_slice().iter().all(|&x| x == 1));
        assert!(b.as_slice().iter().all(|&x| x == 2));
        assert_eq!(a.region().unwrap().1, 0);
        drop(a);
        drop(b);
        assert_eq!(region.released.load(Ordering::SeqCst), 64);
    }

    #[test]
    #[should_panic(expected = "outside a region")]
    fn out_of_range_region_buffer_is_refused() {
        let region = VecRegion::new(16);
        let _ = HostBuffer::from_region(region, 8, 9);
    }

    #[test]
    fn try_zeroed_gives_zeroes_or_none() {
        let b = HostBuffer::try_zeroed(3 << 20).unwrap();
        assert!(b.as_slice().iter().all(|&x| x == 0));
        assert_eq!(HostBuffer::try_zeroed(0).unwrap().len(), 0);
        assert!(HostBuffer::try_zeroed(usize::MAX).is_none());
    }

    #[test]
    fn owned_buffer_round_trip() {
        let b = HostBuffer::from_vec(vec![1, 2, 3]);
        assert_eq!(b.len(), 3);
        assert_eq!(b.to_vec(), vec![1, 2, 3]);
        assert!(b.region().is_none());
        assert!(!b.is_pinned());
    }
}
