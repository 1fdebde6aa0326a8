//! The sender's side: descriptors for device buffers and events.

use super::descriptor::{check_range, IpcEventDescriptor, IpcMemDescriptor};
use super::error::CudaIpcError;
use ferrylink_memory::cuda::{self, Event, Gpu};
use ferrylink_memory::DeviceBuffer;
use std::collections::HashMap;
use std::sync::Mutex;

/// What an exporter did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExporterStats {
    /// Descriptors made.
    pub exports: u64,
    /// `cuIpcGetMemHandle` calls (cache misses).
    pub handles_fetched: u64,
    /// Handles cached now.
    pub handles_cached: usize,
}

#[derive(Default)]
struct State {
    /// (device ordinal, allocation base, buffer id) → (handle, last use).
    handles: HashMap<(usize, u64, u64), ([u8; 64], u64)>,
    tick: u64,
    stats: ExporterStats,
}

/// Exports device buffers with legacy CUDA IPC, fetching each allocation's handle once.
///
/// The handle cache is keyed by allocation base **and** `CU_POINTER_ATTRIBUTE_BUFFER_ID`:
/// an allocation freed and reallocated at the same address gets a new id, so a stale
/// handle is never sent. The id travels in the descriptor, and the receiver keys its
/// mappings by it.
pub struct IpcExporter {
    state: Mutex<State>,
    max_cached: usize,
}

impl Default for IpcExporter {
    fn default() -> Self {
        IpcExporter::new(4096)
    }
}

impl IpcExporter {
    /// An exporter caching at most `max_cached` handles (least recently used go first).
    pub fn new(max_cached: usize) -> Self {
        IpcExporter { state: Mutex::new(State::default()), max_cached: max_cached.max(1) }
    }

    /// The descriptor of `buf`: its allocation's handle, buffer id, size, the buffer's
    /// offset and length, the device UUID. Fails with [`CudaIpcError::NotExportable`] for
    /// memory legacy IPC cannot export (bounce it with
    /// [`ferrylink_memory::cuda::ensure_exportable`] first).
    pub fn export(&self, buf: &DeviceBuffer) -> Result<IpcMemDescriptor, CudaIpcError> {
        let gpu = Gpu::get(buf.device_ordinal())?;
        let info = cuda::known_buffer_info(buf)?;
        if !info.legacy_ipc_capable {
            return Err(CudaIpcError::NotExportable(buf.owner().describe()));
        }
        let offset = frame_offset(buf.device_ptr(), buf.len(), info.base, info.alloc_len)?;
        let key = (gpu.ordinal(), info.base, info.buffer_id);
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.tick += 1;
        let tick = st.tick;
        let handle = match st.handles.get_mut(&key) {
            Some((h, t)) => {
                *t = tick;
                *h
            }
            None => {
                let h = cuda::ipc::get_mem_handle(&gpu, info.base)?;
                if st.handles.len() >= self.max_cached {
                    if let Some(oldest) = st.handles.iter().min_by_key(|(_, (_, t))| *t).map(|(k, _)| *k) {
                        st.handles.remove(&oldest);
                    }
                }
                st.handles.insert(key, (h, tick));
                st.stats.handles_fetched += 1;
                h
            }
        };
        st.stats.exports += 1;
        Ok(IpcMemDescriptor {
            handle,
            buffer_id: info.buffer_id,
            alloc_len: info.alloc_len as u64,
            offset,
            len: buf.len() as u64,
            device_uuid: *gpu.uuid(),
        })
    }

    /// What the exporter did.
    pub fn stats(&self) -> ExporterStats {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        ExporterStats { handles_cached: st.handles.len(), ..st.stats }
    }
}

/// The offset of the buffer `ptr..ptr+len` in the allocation `base..base+alloc_len` the
/// driver (or the buffer's owner) described, checked to hold the whole buffer: an
/// allocation starting past the buffer is refused, never subtracted.
fn frame_offset(ptr: u64, len: usize, base: u64, alloc_len: usize) -> Result<u64, CudaIpcError> {
    let offset = ptr.checked_sub(base).ok_or_else(|| {
        CudaIpcError::NotExportable(format!("the buffer at {ptr:#x} lies before its allocation at {base:#x}"))
    })?;
    check_range(offset, len as u64, alloc_len as u64)
        .map_err(|_| CudaIpcError::NotExportable("buffer extends past its allocation".into()))?;
    Ok(offset)
}

impl std::fmt::Debug for IpcExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcExporter").field("stats", &self.stats()).finish()
    }
}

/// The descriptor of an interprocess event (from an `EventPool`); `None` for an event
/// that is not interprocess.
pub fn export_event(event: &Event) -> Option<IpcEventDescriptor> {
    event.ipc_handle().map(|h| IpcEventDescriptor { handle: *h })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_must_lie_inside_its_allocation() {
        assert_eq!(frame_offset(0x1000, 16, 0x1000, 16), Ok(0));
        assert_eq!(frame_offset(0x1100, 16, 0x1000, 0x200), Ok(0x100));
        assert_eq!(frame_offset(0x1200, 0, 0x1000, 0x200), Ok(0x200));
        for (ptr, len, base, alloc_len) in
            [(0x0fff, 1, 0x1000, 0x200), (0x1100, 0x101, 0x1000, 0x200), (u64::MAX, 2, 0, 4)]
        {
            assert!(matches!(frame_offset(ptr, len, base, alloc_len), Err(CudaIpcError::NotExportable(_))));
        }
    }
}
