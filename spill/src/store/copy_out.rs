//! Reading an entry without moving it: [`SpillStore::read`] copies its frames out.

use std::hash::Hash;

use ferrylink_memory::serialize::{device_frames_to_host, FrameOrigin, HostMessage};
use ferrylink_memory::{Frame, HostBuffer, PinnedPool};

use super::state::{lock, Place};
use super::SpillStore;
use crate::SpillError;

impl<K: Eq + Hash + Clone + Send + 'static> SpillStore<K> {
    /// A copy of the entry in host memory, leaving the entry where it is: from disk, read
    /// and verified; from the host tier, copied; from the device, copied device → host.
    /// The copies land in `pool` when given and it has room, in fresh memory otherwise
    /// (so a caller decides which copies take pinned memory). Marks the entry most
    /// recently used. `None` without such an entry; on error the entry is untouched.
    ///
    /// A caller that rebuilds an object from the copy and stores it under a new key
    /// before removing this one moves an entry up without ever holding it only outside
    /// the store.
    pub fn read(&self, key: &K, pool: Option<&PinnedPool>) -> Result<Option<HostMessage>, SpillError> {
        let mut st = lock(&self.state);
        let Some(entry) = st.entries.get(key) else { return Ok(None) };
        let hm = match &entry.place {
            Place::Disk { path, file_len, .. } => {
                let (path, file_len) = (path.clone(), *file_len);
                self.shared.read_into(&mut st, &path, file_len, pool)?
            }
            Place::Host { msg, origins } => {
                let frames = msg.frames.iter().filter_map(Frame::as_host).map(|h| copy_of(h.as_slice(), pool));
                HostMessage { header: msg.header.clone(), frames: frames.collect(), origins: origins.clone() }
            }
            Place::Device { msg, .. } => {
                let copies = device_frames_to_host(msg, pool)?;
                let mut frames = Vec::with_capacity(msg.frames.len());
                let mut origins = Vec::with_capacity(msg.frames.len());
                for (f, c) in msg.frames.iter().zip(copies) {
                    match (f, c) {
                        (Frame::Device(d), Some(c)) => {
                            frames.push(c);
                            origins.push(FrameOrigin::Device { ordinal: d.device_ordinal() });
                        }
                        (Frame::Host(h), _) => {
                            frames.push(copy_of(h.as_slice(), pool));
                            origins.push(FrameOrigin::Host);
                        }
                        (Frame::Device(d), None) => {
                            let e = ferrylink_memory::serialize::SerializeError::Layout(format!(
                                "no host copy of a device frame of {} bytes",
                                d.len()
                            ));
                            return Err(e.into());
                        }
                    }
                }
                HostMessage { header: msg.header.clone(), frames, origins }
            }
        };
        st.touch(key);
        Ok(Some(hm))
    }
}

/// `bytes` in `pool` memory when it has room, fresh memory otherwise.
fn copy_of(bytes: &[u8], pool: Option<&PinnedPool>) -> HostBuffer {
    match pool.map(|p| p.alloc(bytes.len())) {
        Some(Ok(mut b)) => {
            b.as_mut_slice().copy_from_slice(bytes);
            b
        }
        _ => HostBuffer::from_vec(bytes.to_vec()),
    }
}
