//! A peer's device memory that is not legacy IPC, as one connection imports it: VMM
//! chunks and stream-ordered pools announced as regions (their fds passed with
//! `SCM_RIGHTS`), and the per-frame openings a copy reads or writes through.
//!
//! - A VMM chunk is imported once per announcement (`cuMemImportFromShareableHandle`,
//!   mapped with access for its device) and kept until the peer forgets the region or
//!   the connection ends. A frame inside one chunk copies through that chunk's mapping;
//!   a frame straddling chunks is copied piece by piece, one copy per chunk it covers.
//! - A pool is imported once per announcement; each frame's pointer is imported for the
//!   copy (`cuMemPoolImportPointer`) and freed right after it, before the message is
//!   acknowledged: the importer frees before the exporter may. Imports are not cached,
//!   so a pointer the exporter freed and allocated again is never stale.
//! - Bounds: a connection holds at most `MAX_DEVICE_REGIONS` regions and
//!   `max_mapped_bytes` of VMM chunks; a peer that announces more fails the connection.

use super::{DeviceFrameError, DeviceState};
use ferrylink_ipc::cuda_ipc::CudaIpcError;
use ferrylink_ipc::cuda_ipc::MappingLease;
use ferrylink_memory::cuda::{Gpu, ImportedPool, ImportedPoolPointer, ImportedVmmChunk};
use ferrylink_proto::wire::{DeviceFrameDescriptor, DeviceMemory, RegionAnnouncement, RegionKind};
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

/// At most this many device regions (VMM chunks and pools) per connection.
pub(crate) const MAX_DEVICE_REGIONS: usize = 4096;

/// A region a peer announced, imported.
enum ImportedRegion {
    Vmm(Arc<ImportedVmmChunk>),
    /// The pool and the device it was imported on.
    Pool(Arc<ImportedPool>, usize),
}

/// The device regions one connection's peer announced.
#[derive(Default)]
pub(crate) struct ImportedDeviceRegions {
    regions: HashMap<u64, ImportedRegion>,
    vmm_bytes: u64,
    /// Pool pointers imported so far (for the stats).
    pub pointers_imported: u64,
}

/// One piece of a frame in a peer's memory: where it lies in this process.
pub(crate) struct Piece {
    pub ptr: u64,
    pub len: u64,
    pub device_ordinal: usize,
}

/// A peer's device frame opened for one copy.
pub(crate) enum PeerMemory {
    /// Legacy IPC, through the mapping cache.
    Ipc(MappingLease),
    /// VMM chunks, each mapped on its own: `(chunk, bytes of the frame before it)`.
    Vmm { chunks: Vec<Arc<ImportedVmmChunk>>, offset: u64 },
    /// An imported pool pointer, freed when this goes.
    Pool { pointer: ImportedPoolPointer, device_ordinal: usize },
}

impl PeerMemory {
    /// The pieces of `offset..offset+len` (relative to the descriptor's offset base), in
    /// order; one piece unless a VMM frame straddles chunks.
    pub fn pieces(&self, offset: u64, len: u64) -> Result<Vec<Piece>, DeviceFrameError> {
        let mut pieces = Vec::with_capacity(1);
        self.pieces_into(offset, len, &mut pieces)?;
        Ok(pieces)
    }

    /// The one mapping every offset lies in: legacy IPC and pool pointers; `None` for
    /// VMM chunks (mapped each on its own). A batch lists its spans through it without a
    /// piece list.
    pub fn contiguous(&self) -> Option<Mapping> {
        match self {
            PeerMemory::Ipc(lease) => {
                Some(Mapping { base: lease.base_ptr(), len: lease.alloc_len(), device_ordinal: lease.device_ordinal() })
            }
            PeerMemory::Pool { pointer, device_ordinal } => {
                Some(Mapping { base: pointer.device_ptr(), len: pointer.len() as u64, device_ordinal: *device_ordinal })
            }
            PeerMemory::Vmm { .. } => None,
        }
    }

    /// Whether this is a mapping the mapping cache keeps beyond one copy (legacy IPC),
    /// so holding it longer changes nothing about when it is let go of.
    pub fn is_cached_mapping(&self) -> bool {
        matches!(self, PeerMemory::Ipc(_))
    }

    /// [`PeerMemory::pieces`], appended to `out`: a batch asks once per span, and an
    /// allocation per span was a good part of enqueuing 1000 spans.
    pub fn pieces_into(&self, offset: u64, len: u64, out: &mut Vec<Piece>) -> Result<(), DeviceFrameError> {
        match self {
            PeerMemory::Vmm { chunks, offset: base } => {
                let mapped = chunks.iter().map(|c| Piece {
                    ptr: c.device_ptr(),
                    len: c.len() as u64,
                    device_ordinal: c.gpu().ordinal(),
                });
                split_across_chunks_into(mapped, base + offset, len, out).map_err(DeviceFrameError::BadDescriptor)?;
            }
            PeerMemory::Ipc(_) | PeerMemory::Pool { .. } => {
                if let Some(mapping) = self.contiguous() {
                    out.push(Piece { ptr: mapping.at(offset, len)?, len, device_ordinal: mapping.device_ordinal });
                }
            }
        }
        Ok(())
    }
}

/// A peer's memory mapped in one piece in this process.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mapping {
    /// The address of its offset 0.
    pub base: u64,
    /// Its bytes.
    pub len: u64,
    pub device_ordinal: usize,
}

impl Mapping {
    /// The address of `offset..offset+len`, which must lie within it.
    pub fn at(&self, offset: u64, len: u64) -> Result<u64, DeviceFrameError> {
        offset.checked_add(len).filter(|&end| end <= self.len).and_then(|_| self.base.checked_add(offset)).ok_or_else(
            || {
                DeviceFrameError::BadDescriptor(format!(
                    "{offset}+{len} lies outside the peer's memory of {} bytes",
                    self.len
                ))
            },
        )
    }
}

impl DeviceState {
    /// Opens every device descriptor of a message (a legacy IPC one through the mapping
    /// cache, which validates it against the real allocation; a VMM or pool one through
    /// the regions the peer announced) before anything is allocated; `copiers[i]` is the
    /// device that will copy through opening `i` (see `mapping_device`).
    pub fn map_all(
        &self,
        peer_pid: u32,
        descs: &[&DeviceFrameDescriptor],
        copiers: &[usize],
        regions: &mut ImportedDeviceRegions,
    ) -> Result<Vec<PeerMemory>, DeviceFrameError> {
        let cuda = self.cuda()?;
        let started = std::time::Instant::now();
        let mut opened = Vec::with_capacity(descs.len());
        for (d, &copier) in descs.iter().zip(copiers) {
            let Some(ipc) = super::export::to_ipc(d) else {
                opened.push(regions.open(d)?);
                continue;
            };
            let on = self.mapping_device(copier, d);
            let lease = cuda.mappings.acquire_on(peer_pid, &ipc, Some(on)).map_err(|e| match e {
                CudaIpcError::Cuda(c) if c.code().is_some() => DeviceFrameError::BadDescriptor(c.to_string()),
                CudaIpcError::InvalidDescriptor(s) => DeviceFrameError::BadDescriptor(s),
                other => DeviceFrameError::Local(other.to_string()),
            })?;
            opened.push(PeerMemory::Ipc(lease));
        }
        tracing::trace!(us = started.elapsed().as_micros() as u64, "device mappings acquired");
        Ok(opened)
    }
}

/// The pieces of `start..start+len` of a range made of `chunks` (each mapped at its own
/// address) laid side by side: one per chunk the range touches, in order. An error when
/// the range does not lie within the chunks (the peer's descriptor lies).
#[cfg(test)]
fn split_across_chunks(chunks: &[Piece], start: u64, len: u64) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let copies = chunks.iter().map(|c| Piece { ptr: c.ptr, len: c.len, device_ordinal: c.device_ordinal });
    split_across_chunks_into(copies, start, len, &mut pieces)?;
    Ok(pieces)
}

/// `split_across_chunks`, appended to `out` (nothing appended on an error).
fn split_across_chunks_into(
    chunks: impl Iterator<Item = Piece>,
    start: u64,
    len: u64,
    out: &mut Vec<Piece>,
) -> Result<(), String> {
    let before = out.len();
    let (mut at, mut left, mut chunk_start, mut count) = (start, len, 0u64, 0usize);
    for chunk in chunks {
        count += 1;
        let chunk_end = chunk_start.saturating_add(chunk.len);
        if left > 0 && at < chunk_end {
            let n = left.min(chunk_end - at);
            out.push(Piece { ptr: chunk.ptr + (at - chunk_start), len: n, device_ordinal: chunk.device_ordinal });
            at += n;
            left -= n;
        }
        chunk_start = chunk_end;
    }
    if left > 0 || start > chunk_start {
        out.truncate(before);
        return Err(format!("{start}+{len} lies outside its {count} VMM chunks of {chunk_start} bytes"));
    }
    Ok(())
}

impl ImportedDeviceRegions {
    /// Imports one announced device region with its fd.
    pub fn import(
        &mut self,
        device: &DeviceState,
        announcement: &RegionAnnouncement,
        fd: OwnedFd,
        max_mapped_bytes: u64,
    ) -> Result<(), String> {
        let id = announcement.region_id;
        if self.regions.len() >= MAX_DEVICE_REGIONS {
            return Err(format!("more than {MAX_DEVICE_REGIONS} device regions announced"));
        }
        if self.regions.contains_key(&id) {
            return Err(format!("device region {id} announced twice"));
        }
        let region = match announcement.kind {
            RegionKind::HostMemfd | RegionKind::HostGrant => return Err(format!("region {id} is not a device region")),
            RegionKind::DeviceVmmChunk { device_uuid } => {
                let len = announcement.len;
                if len == 0 || self.vmm_bytes.saturating_add(len) > max_mapped_bytes {
                    return Err(format!(
                        "VMM chunk {id} of {len} bytes: the peer's chunks would exceed {max_mapped_bytes} mapped bytes"
                    ));
                }
                let gpu = device.gpu_for_uuid(&device_uuid).map_err(super::describe)?;
                let chunk = ImportedVmmChunk::import(&gpu, fd.as_fd(), len as usize)
                    .map_err(|e| format!("importing VMM chunk {id}: {e}"))?;
                self.vmm_bytes += len;
                ImportedRegion::Vmm(Arc::new(chunk))
            }
            RegionKind::DevicePool { device_uuid } => {
                if announcement.len != 0 {
                    return Err(format!("pool region {id} claims a length"));
                }
                let gpu = device.gpu_for_uuid(&device_uuid).map_err(super::describe)?;
                let pool = ImportedPool::import(&gpu, fd.as_fd()).map_err(|e| format!("importing pool {id}: {e}"))?;
                ImportedRegion::Pool(pool, gpu.ordinal())
            }
        };
        self.regions.insert(id, region);
        Ok(())
    }

    /// The peer forgot region `id` (a copy still running through it keeps it alive).
    pub fn forget(&mut self, id: u64) {
        if let Some(ImportedRegion::Vmm(chunk)) = self.regions.remove(&id) {
            self.vmm_bytes = self.vmm_bytes.saturating_sub(chunk.len() as u64);
        }
    }

    /// Opens a VMM or pool frame for one copy.
    pub fn open(&mut self, desc: &DeviceFrameDescriptor) -> Result<PeerMemory, DeviceFrameError> {
        let unknown = |id: u64| DeviceFrameError::BadDescriptor(format!("device region {id} was never announced"));
        match &desc.memory {
            DeviceMemory::LegacyIpc { .. } => Err(DeviceFrameError::Local("a legacy IPC frame is not a region".into())),
            DeviceMemory::Vmm { chunks } => {
                let mut mapped = Vec::with_capacity(chunks.len());
                for id in chunks {
                    match self.regions.get(id) {
                        Some(ImportedRegion::Vmm(c)) => mapped.push(c.clone()),
                        _ => return Err(unknown(*id)),
                    }
                }
                let memory = PeerMemory::Vmm { chunks: mapped, offset: 0 };
                memory.pieces(desc.offset, desc.len)?;
                Ok(memory)
            }
            DeviceMemory::PoolPointer { pool, export, alloc_len } => {
                let Some(ImportedRegion::Pool(p, ordinal)) = self.regions.get(pool) else { return Err(unknown(*pool)) };
                let pointer = p
                    .import_pointer(export, *alloc_len as usize)
                    .map_err(|e| DeviceFrameError::BadDescriptor(format!("importing a pointer of pool {pool}: {e}")))?;
                self.pointers_imported += 1;
                Ok(PeerMemory::Pool { device_ordinal: *ordinal, pointer })
            }
        }
    }

    /// Regions held, and bytes of VMM chunks mapped.
    pub fn usage(&self) -> (usize, u64) {
        (self.regions.len(), self.vmm_bytes)
    }

    /// Drops every region (the connection ended, its copies finished).
    pub fn clear(&mut self) {
        self.regions.clear();
        self.vmm_bytes = 0;
    }
}

impl DeviceState {
    /// The device with this UUID, opened (a region of a device this process does not see
    /// cannot be imported).
    pub(crate) fn gpu_for_uuid(&self, uuid: &[u8; 16]) -> Result<Gpu, DeviceFrameError> {
        self.cuda()?;
        let Some(ordinal) = Self::visible_device(uuid) else {
            return Err(DeviceFrameError::Local("a device region of a GPU this process does not see".into()));
        };
        Ok(self.device(ordinal)?.gpu.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::{split_across_chunks, Piece};

    /// Three chunks of 100, 50 and 100 bytes, mapped far apart.
    fn chunks() -> Vec<Piece> {
        [(0x1000, 100), (0x9000, 50), (0x5000, 100)]
            .into_iter()
            .map(|(ptr, len)| Piece { ptr, len, device_ordinal: 0 })
            .collect()
    }

    fn spans(start: u64, len: u64) -> Vec<(u64, u64)> {
        split_across_chunks(&chunks(), start, len).unwrap().iter().map(|p| (p.ptr, p.len)).collect()
    }

    #[test]
    fn a_frame_inside_one_chunk_is_one_piece() {
        assert_eq!(spans(10, 20), [(0x100a, 20)]);
        assert_eq!(spans(100, 50), [(0x9000, 50)]);
        assert_eq!(spans(249, 1), [(0x5000 + 99, 1)]);
    }

    #[test]
    fn a_frame_across_chunk_edges_is_split_at_each_edge() {
        assert_eq!(spans(99, 2), [(0x1000 + 99, 1), (0x9000, 1)]);
        assert_eq!(spans(90, 70), [(0x1000 + 90, 10), (0x9000, 50), (0x5000, 10)]);
        assert_eq!(spans(0, 250), [(0x1000, 100), (0x9000, 50), (0x5000, 100)]);
        let total: u64 = spans(1, 248).iter().map(|s| s.1).sum();
        assert_eq!(total, 248);
    }

    #[test]
    fn a_frame_past_the_chunks_is_refused() {
        for (start, len) in [(0, 251), (250, 1), (251, 0), (200, u64::MAX - 200), (u64::MAX, 1)] {
            assert!(split_across_chunks(&chunks(), start, len).is_err(), "{start}+{len}");
        }
        assert!(split_across_chunks(&[], 0, 1).is_err());
        assert_eq!(spans(250, 0), [], "an empty frame at the end is nothing to copy");
    }
}
