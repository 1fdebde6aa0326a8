//! The disk tier's file paths of the store: writing an entry's file (temporary name, then
//! rename), reading one back, removing one.
//!
//! These run with the store's mutex held, like every operation of the store (see the
//! crate documentation, "Concurrency"): file I/O under the lock.

use std::path::{Path, PathBuf};

use ferrylink_memory::serialize::{device_frames_to_host, FrameOrigin, HostMessage, SerializeError};
use ferrylink_memory::{Frame, Message, PinnedPool};

use super::state::{Place, Shared, State};
use crate::crc;
use crate::disk::{encode_meta, file_len, read_entry};
use crate::SpillError;

impl Shared {
    /// Writes one entry file (temp + rename). Nothing is left behind on failure.
    pub(super) fn write_file<K>(
        &self,
        st: &mut State<K>,
        header: &[u8],
        frames: &[&[u8]],
        origins: &[FrameOrigin],
    ) -> Result<(PathBuf, u64), SpillError> {
        st.next_file += 1;
        let n = st.next_file;
        let path = self.dir.path().join(format!("{n}.spill"));
        let tmp = self.dir.path().join(format!("{n}.tmp"));
        let layout: Vec<(usize, FrameOrigin)> = frames.iter().map(|f| f.len()).zip(origins.iter().copied()).collect();
        let meta = encode_meta(header, &layout);
        let mut parts: Vec<&[u8]> = Vec::with_capacity(frames.len() + 2);
        parts.push(&meta);
        parts.push(header);
        parts.extend_from_slice(frames);
        let len = file_len(header.len(), &layout);
        // The checksum trailer is computed while the parts are written (decision 0041).
        let result = crc::with_trailer(&parts, |trailer| self.io.write_file(&tmp, &parts, trailer))
            .map_err(|source| SpillError::Io { op: "write", path: tmp.clone(), source })
            .and_then(|()| {
                self.io.rename(&tmp, &path).map_err(|source| SpillError::Io {
                    op: "rename",
                    path: path.clone(),
                    source,
                })
            });
        match result {
            Ok(()) => {
                st.stats.disk_bytes_written += len;
                Ok((path, len))
            }
            Err(e) => {
                st.stats.disk_write_errors += 1;
                if let Err(r) = self.io.remove_file(&tmp) {
                    if r.kind() != std::io::ErrorKind::NotFound {
                        tracing::warn!(path = %tmp.display(), "could not remove partial spill file: {r}");
                    }
                }
                tracing::warn!("spill to disk failed, entry kept in memory: {e}");
                Err(e)
            }
        }
    }

    /// Removes an entry's file of `file_len` bytes (large ones off the caller's thread).
    pub(super) fn remove_file(&self, path: PathBuf, file_len: u64) {
        self.remover.remove(path, file_len);
    }

    pub(super) fn drop_place(&self, place: Place) {
        if let Place::Disk { path, file_len, .. } = place {
            self.remove_file(path, file_len);
        }
    }

    /// Writes a message with device frames to disk through host copies; `msg` stays intact.
    pub(super) fn write_device_message<K>(
        &self,
        st: &mut State<K>,
        msg: &Message,
    ) -> Result<(PathBuf, u64), SpillError> {
        let copies = device_frames_to_host(msg, self.pool.as_ref())?;
        let mut slices: Vec<&[u8]> = Vec::with_capacity(msg.frames.len());
        let mut origins = Vec::with_capacity(msg.frames.len());
        for (f, c) in msg.frames.iter().zip(&copies) {
            match (f, c) {
                (Frame::Host(h), _) => {
                    slices.push(h.as_slice());
                    origins.push(FrameOrigin::Host);
                }
                (Frame::Device(d), Some(c)) => {
                    slices.push(c.as_slice());
                    origins.push(FrameOrigin::Device { ordinal: d.device_ordinal() });
                }
                (Frame::Device(_), None) => {
                    return Err(SerializeError::Layout("device frame without host copy".into()).into())
                }
            }
        }
        self.write_file(st, &msg.header, &slices, &origins)
    }

    pub(super) fn read<K>(&self, st: &mut State<K>, path: &Path, file_len: u64) -> Result<HostMessage, SpillError> {
        self.read_into(st, path, file_len, self.pool.as_ref())
    }

    /// Reads an entry file with its frames in `pool` (fresh memory without one).
    pub(super) fn read_into<K>(
        &self,
        st: &mut State<K>,
        path: &Path,
        file_len: u64,
        pool: Option<&PinnedPool>,
    ) -> Result<HostMessage, SpillError> {
        let d = read_entry(&*self.io, path, file_len, pool)?;
        st.stats.disk_bytes_read += file_len;
        st.stats.unspilled_from_disk += 1;
        Ok(HostMessage { header: d.header, frames: d.frames, origins: d.origins })
    }
}
