//! Host frames in shared memory (memfd regions) sent again without a copy.
//!
//! A received host frame lies in a memfd region of this process (the endpoint's landing
//! pool), as does a buffer from `ferrylink.host_buffer(n)` (`ipc::shared_host_buffer`).
//! The native lane sends such memory by passing the region's fd once and offsets after
//! it, with no copy, where any other host memory is copied into staging first. The
//! region belongs to the frame's `HostBuffer`, which the Python object keeps; a send
//! gets a second `HostBuffer` over the same bytes through an [`AliasRegion`]: the same
//! memory and fd under an id of its own, whose release does nothing (the range stays the
//! frame's). All frames over one region share one alias while any of them lives, so the
//! lane, which remembers announced regions by id and a weak reference, announces it once
//! and sees it go only when no frame over it is left; a later alias of the same region
//! gets a new id.

use crate::pybuffer::next_region_id;
use ferrylink::memory::HostRegion;
use ferrylink::HostBuffer;
use std::collections::HashMap;
use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex, Weak};

/// A shared region under an id of its own; releasing a range of it does nothing.
pub(crate) struct AliasRegion {
    inner: Arc<dyn HostRegion>,
    id: u64,
}

impl HostRegion for AliasRegion {
    fn base_ptr(&self) -> *mut u8 {
        self.inner.base_ptr()
    }
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn region_id(&self) -> u64 {
        self.id
    }
    fn shareable_fd(&self) -> Option<BorrowedFd<'_>> {
        self.inner.shareable_fd()
    }
    fn is_pinned(&self) -> bool {
        self.inner.is_pinned()
    }
}

/// The alias of each shared region, by the region's address and length.
type Aliases = HashMap<(usize, usize), Weak<AliasRegion>>;

/// The live aliases (made on first use).
static ALIASES: Mutex<Option<Aliases>> = Mutex::new(None);

/// The alias of the shared region `buffer` lies in (`None`: not in a shareable region).
pub(crate) fn alias_of(buffer: &HostBuffer) -> Option<(Arc<AliasRegion>, usize)> {
    let (region, offset) = buffer.region()?;
    region.shareable_fd()?;
    let key = (region.base_ptr() as usize, region.len());
    let mut aliases = ALIASES.lock().unwrap_or_else(|e| e.into_inner());
    let aliases = aliases.get_or_insert_with(HashMap::new);
    if let Some(alias) = aliases.get(&key).and_then(Weak::upgrade) {
        return Some((alias, offset));
    }
    aliases.retain(|_, weak| weak.strong_count() > 0);
    let alias = Arc::new(AliasRegion { inner: region.clone(), id: next_region_id() });
    aliases.insert(key, Arc::downgrade(&alias));
    Some((alias, offset))
}

/// A frame's shared memory seen through an alias: where the frame starts in the region.
pub(crate) struct SharedFrame {
    pub(crate) alias: Arc<AliasRegion>,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

impl SharedFrame {
    /// `len` bytes at `start` bytes into the frame, as a buffer over the alias
    /// (`None` when they are not all inside the frame).
    pub(crate) fn slice(&self, start: usize, len: usize) -> Option<HostBuffer> {
        let end = start.checked_add(len)?;
        if end > self.len {
            return None;
        }
        let alias: Arc<dyn HostRegion> = self.alias.clone();
        Some(HostBuffer::from_region(alias, self.offset + start, len))
    }
}
