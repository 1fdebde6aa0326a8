//! Exporting a device frame to one peer, by the kind of memory it lies in: legacy CUDA
//! IPC (`cuMemAlloc` memory, the exportable pool), VMM chunks and stream-ordered pool
//! pointers announced as regions (their fds passed once per connection), or a bounce
//! through the exportable pool for memory nothing can export (a stock default pool,
//! foreign pointers).
//!
//! The connection remembers what it announced ([`DeviceAnnouncements`]): a VMM chunk by
//! (base, length, buffer id), so a chunk freed and made again at the same address is a
//! new region; a pool by its handle. At most `MAX_ANNOUNCED` are kept; the oldest is
//! forgotten (the peer is told with `ForgetRegion`) when more are needed.

use super::{DeviceFrameError, DeviceHold, DeviceState, PerDevice};
use ferrylink_ipc::cuda_ipc::IpcMemDescriptor;
use ferrylink_memory::cuda::{self, ExportRoute};
use ferrylink_memory::DeviceBuffer;
use ferrylink_proto::wire::{DeviceFrameDescriptor, DeviceMemory, RegionAnnouncement, RegionKind};
use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};

/// Device regions announced to one peer that are remembered at most.
const MAX_ANNOUNCED: usize = 1024;

/// Device region ids have the top bit set: host region ids never do.
const DEVICE_REGION_BIT: u64 = 1 << 63;

fn next_region_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    DEVICE_REGION_BIT | NEXT.fetch_add(1, Ordering::Relaxed)
}

/// What identifies an announced region on the exporting side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum RegionKey {
    VmmChunk { base: u64, len: usize, buffer_id: u64 },
    Pool(usize),
}

/// The device regions this side announced to one peer.
#[derive(Default)]
pub(crate) struct DeviceAnnouncements {
    ids: HashMap<RegionKey, u64>,
    order: VecDeque<RegionKey>,
    /// Forgotten here, to be forgotten by the peer.
    forgotten: Vec<u64>,
}

impl DeviceAnnouncements {
    /// The region id of `key`, announcing it (with `make_fd`'s fd) when it is new.
    fn region(
        &mut self,
        key: RegionKey,
        announce: impl FnOnce(u64) -> Result<(RegionAnnouncement, OwnedFd), DeviceFrameError>,
        out: &mut Vec<(RegionAnnouncement, OwnedFd)>,
    ) -> Result<u64, DeviceFrameError> {
        if let Some(&id) = self.ids.get(&key) {
            return Ok(id);
        }
        let id = next_region_id();
        out.push(announce(id)?);
        if self.order.len() >= MAX_ANNOUNCED {
            if let Some(old) = self.order.pop_front() {
                self.forgotten.extend(self.ids.remove(&old));
            }
        }
        self.ids.insert(key, id);
        self.order.push_back(key);
        Ok(id)
    }

    /// Regions the peer should forget now.
    pub fn take_forgotten(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.forgotten)
    }

    /// The connection ended.
    pub fn clear(&mut self) {
        self.ids.clear();
        self.order.clear();
        self.forgotten.clear();
    }
}

/// A frame's description plus the regions to announce first.
#[derive(Default)]
pub(crate) struct ExportedFrames {
    pub descriptors: Vec<DeviceFrameDescriptor>,
    pub regions: Vec<(RegionAnnouncement, OwnedFd)>,
}

impl DeviceState {
    /// Describes device frames for one peer (`bounce`: memory nothing can export is
    /// copied into the exportable pool, held by `hold`; otherwise it is an error).
    pub(crate) fn export_for_peer(
        &self,
        frames: &[&DeviceBuffer],
        announced: &mut DeviceAnnouncements,
        mut hold: Option<&mut DeviceHold>,
    ) -> Result<ExportedFrames, DeviceFrameError> {
        let cuda = self.cuda()?;
        let mut out = ExportedFrames { descriptors: Vec::with_capacity(frames.len()), regions: Vec::new() };
        for buf in frames {
            // One pointer query decides (none for the pool's own memory, whose owner
            // recorded its allocation); the legacy exporter would ask four to refuse a
            // cudarc slice.
            let route = cuda::export_route(buf)?;
            let desc = match route {
                ExportRoute::LegacyIpc => match cuda.exporter.export(buf) {
                    Ok(ipc) => from_ipc(&ipc),
                    Err(e) => return Err(DeviceFrameError::Local(e.to_string())),
                },
                ExportRoute::Vmm => {
                    let dev = self.device(buf.device_ordinal())?;
                    self.export_vmm(&dev, buf, announced, &mut out.regions)?
                }
                ExportRoute::Pool(pool) => {
                    let dev = self.device(buf.device_ordinal())?;
                    self.export_pool_pointer(&dev, buf, pool, announced, &mut out.regions)?
                }
                ExportRoute::NotExportable => match hold.as_deref_mut() {
                    Some(hold) => {
                        let dev = self.device(buf.device_ordinal())?;
                        let bounced = cuda::bounce_to_exportable(buf, &dev.pool, &dev.stream)?;
                        let ipc = cuda.exporter.export(&bounced).map_err(|e| DeviceFrameError::Local(e.to_string()))?;
                        hold.bounced_bytes += buf.len() as u64;
                        hold.bounces.push(bounced);
                        from_ipc(&ipc)
                    }
                    None => {
                        return Err(DeviceFrameError::Local(format!("{} cannot be exported", buf.owner().describe())))
                    }
                },
            };
            out.descriptors.push(desc);
        }
        Ok(out)
    }

    fn export_vmm(
        &self,
        dev: &PerDevice,
        buf: &DeviceBuffer,
        announced: &mut DeviceAnnouncements,
        regions: &mut Vec<(RegionAnnouncement, OwnedFd)>,
    ) -> Result<DeviceFrameDescriptor, DeviceFrameError> {
        let chunks = cuda::vmm_chunks(&dev.gpu, buf.device_ptr(), buf.len())?;
        let Some(first) = chunks.first() else {
            return Err(DeviceFrameError::Local("VMM memory with no chunk under it".into()));
        };
        let offset = buf.device_ptr() - first.base;
        let device_uuid = *dev.gpu.uuid();
        let mut ids = Vec::with_capacity(chunks.len());
        for chunk in &chunks {
            let key = RegionKey::VmmChunk { base: chunk.base, len: chunk.len, buffer_id: chunk.buffer_id };
            let id = announced.region(
                key,
                |region_id| {
                    let fd = cuda::export_chunk(&dev.gpu, chunk.base)?;
                    let kind = RegionKind::DeviceVmmChunk { device_uuid };
                    Ok((RegionAnnouncement { region_id, len: chunk.len as u64, kind }, fd))
                },
                regions,
            )?;
            ids.push(id);
        }
        Ok(DeviceFrameDescriptor {
            memory: DeviceMemory::Vmm { chunks: ids },
            offset,
            len: buf.len() as u64,
            device_uuid,
            event: None,
        })
    }

    fn export_pool_pointer(
        &self,
        dev: &PerDevice,
        buf: &DeviceBuffer,
        pool: ferrylink_memory::cudarc::driver::sys::CUmemoryPool,
        announced: &mut DeviceAnnouncements,
        regions: &mut Vec<(RegionAnnouncement, OwnedFd)>,
    ) -> Result<DeviceFrameDescriptor, DeviceFrameError> {
        let device_uuid = *dev.gpu.uuid();
        let pool_id = announced.region(
            RegionKey::Pool(pool as usize),
            |region_id| {
                // SAFETY: the driver reported `pool` for `buf`'s memory, which the send
                // keeps allocated: the pool is live.
                let fd = unsafe { cuda::export_pool(&dev.gpu, pool)? };
                Ok((RegionAnnouncement { region_id, len: 0, kind: RegionKind::DevicePool { device_uuid } }, fd))
            },
            regions,
        )?;
        // Remembered per allocation: a buffer received into and then sent on (or sent
        // again) is not exported twice (`cuMemPoolExportPointer` costs 19 µs at 1 MB and
        // 0.4–0.5 ms at 1 GB, each time); and per buffer, so a receive buffer prepared
        // when it was posted makes no driver call here.
        let exported = cuda::export_buffer_allocation(&dev.gpu, buf)?;
        let export = exported.data;
        let (base, alloc_len) = (exported.base, exported.alloc_len);
        Ok(DeviceFrameDescriptor {
            memory: DeviceMemory::PoolPointer { pool: pool_id, export, alloc_len: alloc_len as u64 },
            offset: buf.device_ptr() - base,
            len: buf.len() as u64,
            device_uuid,
            event: None,
        })
    }
}

/// The wire form of a legacy IPC export, without an event to wait for.
pub(super) fn from_ipc(ipc: &IpcMemDescriptor) -> DeviceFrameDescriptor {
    DeviceFrameDescriptor {
        memory: DeviceMemory::LegacyIpc { handle: ipc.handle, buffer_id: ipc.buffer_id, alloc_len: ipc.alloc_len },
        offset: ipc.offset,
        len: ipc.len,
        device_uuid: ipc.device_uuid,
        event: None,
    }
}

/// The legacy IPC descriptor of a wire descriptor, when it is one.
pub(super) fn to_ipc(d: &DeviceFrameDescriptor) -> Option<IpcMemDescriptor> {
    match &d.memory {
        DeviceMemory::LegacyIpc { handle, buffer_id, alloc_len } => Some(IpcMemDescriptor {
            handle: *handle,
            buffer_id: *buffer_id,
            alloc_len: *alloc_len,
            offset: d.offset,
            len: d.len,
            device_uuid: d.device_uuid,
        }),
        _ => None,
    }
}

impl DeviceState {
    /// Describes the device frames of one message for the peer; `hold` keeps what must
    /// live until the ack (bounces of memory nothing can export). The producer's work was
    /// ordered before (`ProducerOrders`): nothing is synchronised here.
    pub fn export(
        &self,
        frames: &[&DeviceBuffer],
        hold: &mut DeviceHold,
        announced: &mut DeviceAnnouncements,
    ) -> Result<ExportedFrames, DeviceFrameError> {
        let started = std::time::Instant::now();
        let out = self.export_for_peer(frames, announced, Some(hold));
        tracing::trace!(us = started.elapsed().as_micros() as u64, frames = frames.len(), "device export");
        out
    }

    /// Connector-copies mode, listener side: descriptors of buffers the connector is to
    /// copy into (no events: the connector orders its own copies).
    pub fn export_targets(
        &self,
        targets: &[&DeviceBuffer],
        announced: &mut DeviceAnnouncements,
    ) -> Result<ExportedFrames, DeviceFrameError> {
        self.export_for_peer(targets, announced, None)
    }

    /// Whether `buf` can be exported without a bounce (legacy IPC, VMM, exportable pool).
    pub fn is_exportable(&self, buf: &DeviceBuffer) -> bool {
        matches!(
            cuda::export_route(buf),
            Ok(cuda::ExportRoute::LegacyIpc | cuda::ExportRoute::Vmm | cuda::ExportRoute::Pool(_))
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn announce(id: u64) -> Result<(RegionAnnouncement, OwnedFd), DeviceFrameError> {
        let fd = std::fs::File::open("/dev/null").expect("/dev/null").into();
        Ok((
            RegionAnnouncement { region_id: id, len: 4096, kind: RegionKind::DeviceVmmChunk { device_uuid: [0; 16] } },
            fd,
        ))
    }

    fn chunk(base: u64, buffer_id: u64) -> RegionKey {
        RegionKey::VmmChunk { base, len: 4096, buffer_id }
    }

    #[test]
    fn a_region_is_announced_once_and_a_remade_chunk_is_a_new_one() {
        let mut a = DeviceAnnouncements::default();
        let mut out = Vec::new();
        let first = a.region(chunk(0x1000, 7), announce, &mut out).unwrap();
        assert_eq!(a.region(chunk(0x1000, 7), announce, &mut out).unwrap(), first);
        assert_eq!(out.len(), 1, "announced once");
        assert!(first & DEVICE_REGION_BIT != 0, "device region ids never collide with host ones");
        // Freed and made again at the same address: a new buffer id, a new region.
        let again = a.region(chunk(0x1000, 8), announce, &mut out).unwrap();
        assert_ne!(again, first);
        assert_eq!(out.len(), 2);
        assert_eq!(out[1].0.region_id, again);
    }

    #[test]
    fn past_the_bound_the_oldest_is_forgotten_and_announced_again_when_used() {
        let mut a = DeviceAnnouncements::default();
        let mut out = Vec::new();
        let ids: Vec<u64> =
            (0..=MAX_ANNOUNCED as u64).map(|i| a.region(chunk(i << 20, i + 1), announce, &mut out).unwrap()).collect();
        assert_eq!(a.take_forgotten(), vec![ids[0]], "the oldest is forgotten, for the peer to unmap");
        assert!(a.take_forgotten().is_empty());
        let back = a.region(chunk(0, 1), announce, &mut out).unwrap();
        assert_ne!(back, ids[0], "announced anew under a new id");
        assert_eq!(a.take_forgotten(), vec![ids[1]]);
    }

    #[test]
    fn a_failed_export_announces_nothing() {
        let mut a = DeviceAnnouncements::default();
        let mut out = Vec::new();
        let failed = a.region(chunk(1, 1), |_| Err(DeviceFrameError::Local("no".into())), &mut out);
        assert!(failed.is_err() && out.is_empty());
        assert!(a.region(chunk(1, 1), announce, &mut out).is_ok(), "and is tried again next time");
        assert_eq!(out.len(), 1);
    }
}
