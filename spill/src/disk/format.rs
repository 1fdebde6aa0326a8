//! The spill file format (see the [module documentation](super)): encoding a file's
//! metadata, its length, and reading a file back with its checksum verified.

use std::io::{self, Read};
use std::path::Path;

use ferrylink_memory::serialize::FrameOrigin;
use ferrylink_memory::{HostBuffer, PinnedPool};

use super::file_io::DiskIo;
use crate::crc::{Crc32c, PARALLEL_MIN};
use crate::SpillError;

const MAGIC: &[u8; 8] = b"FLSPILL\0";
const VERSION: u32 = 1;
const FIXED: usize = 8 + 4 + 8 + 4;
const PER_FRAME: usize = 8 + 1 + 4;
const MAX_FRAMES: usize = 1 << 20;

/// The layout of a file's metadata block plus its trailer, returned with the block.
pub(crate) fn encode_meta(header: &[u8], frames: &[(usize, FrameOrigin)]) -> Vec<u8> {
    let mut m = Vec::with_capacity(FIXED + frames.len() * PER_FRAME);
    m.extend_from_slice(MAGIC);
    m.extend_from_slice(&VERSION.to_le_bytes());
    m.extend_from_slice(&(header.len() as u64).to_le_bytes());
    m.extend_from_slice(&(frames.len() as u32).to_le_bytes());
    for &(len, origin) in frames {
        m.extend_from_slice(&(len as u64).to_le_bytes());
        let (kind, ordinal) = match origin {
            FrameOrigin::Host => (0u8, 0u32),
            FrameOrigin::Device { ordinal } => (1u8, ordinal as u32),
        };
        m.push(kind);
        m.extend_from_slice(&ordinal.to_le_bytes());
    }
    m
}

/// Bytes a file with this layout has.
pub(crate) fn file_len(header_len: usize, frames: &[(usize, FrameOrigin)]) -> u64 {
    (FIXED + frames.len() * PER_FRAME + header_len + frames.iter().map(|f| f.0).sum::<usize>() + 4) as u64
}

/// What a file holds.
pub(crate) struct Decoded {
    pub header: Vec<u8>,
    pub frames: Vec<HostBuffer>,
    pub origins: Vec<FrameOrigin>,
}

fn corrupt(path: &Path, reason: impl Into<String>) -> SpillError {
    SpillError::Corrupt { path: path.to_path_buf(), reason: reason.into() }
}

fn read_exact(r: &mut dyn Read, buf: &mut [u8], path: &Path, crc: &mut Crc32c) -> Result<(), SpillError> {
    read_plain(r, buf, path)?;
    crc.update(buf);
    Ok(())
}

fn read_plain(r: &mut dyn Read, buf: &mut [u8], path: &Path) -> Result<(), SpillError> {
    r.read_exact(buf).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            corrupt(path, "file is truncated")
        } else {
            SpillError::Io { op: "read", path: path.to_path_buf(), source: e }
        }
    })
}

/// Pieces a large frame is read in, each handed to the checksum thread while the next is
/// read: small enough to still be in the CPU's cache when the checksum reaches it.
const READ_PIECE: usize = 2 << 20;

/// [`read_exact`] of a frame: from [`PARALLEL_MIN`] bytes on, read in pieces with the
/// checksum computed on a scoped thread, each piece as soon as it is in (decision 0041).
fn read_frame(r: &mut dyn Read, buf: &mut [u8], path: &Path, crc: &mut Crc32c) -> Result<(), SpillError> {
    if buf.len() < PARALLEL_MIN {
        return read_exact(r, buf, path, crc);
    }
    let (pieces, received) = std::sync::mpsc::sync_channel::<&[u8]>(4);
    let start = *crc;
    std::thread::scope(|s| {
        let worker = std::thread::Builder::new().name("spill-crc".into()).spawn_scoped(s, move || {
            let mut crc = start;
            received.into_iter().for_each(|piece| crc.update(piece));
            crc
        });
        let worker = match worker {
            Ok(w) => w,
            Err(e) => {
                tracing::debug!("no thread for the checksum, computed in line: {e}");
                return read_exact(r, buf, path, crc);
            }
        };
        let mut read = Ok(());
        for piece in buf.chunks_mut(READ_PIECE) {
            read = read_plain(r, piece, path);
            let piece: &[u8] = piece;
            if read.is_err() || pieces.send(piece).is_err() {
                break;
            }
        }
        drop(pieces);
        let sum = worker.join().map_err(|_| SpillError::Io {
            op: "checksum",
            path: path.to_path_buf(),
            source: io::Error::other("the checksum thread panicked"),
        });
        read?;
        *crc = sum?;
        Ok(())
    })
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Reads and verifies a spill file whose length should be `expected_len`. Frames land in
/// `pool` when it has room, in fresh memory otherwise.
pub(crate) fn read_entry(
    io: &dyn DiskIo,
    path: &Path,
    expected_len: u64,
    pool: Option<&PinnedPool>,
) -> Result<Decoded, SpillError> {
    let mut r = io.open(path).map_err(|source| SpillError::Io { op: "open", path: path.to_path_buf(), source })?;
    let r: &mut dyn Read = &mut *r;
    let mut crc = Crc32c::new();
    let mut fixed = [0u8; FIXED];
    read_exact(r, &mut fixed, path, &mut crc)?;
    if &fixed[..8] != MAGIC {
        return Err(corrupt(path, "bad magic"));
    }
    let version = u32_at(&fixed, 8);
    if version != VERSION {
        return Err(corrupt(path, format!("unknown version {version}")));
    }
    let header_len = u64_at(&fixed, 12);
    let count = u32_at(&fixed, 20) as usize;
    if count > MAX_FRAMES || header_len > expected_len {
        return Err(corrupt(path, "implausible layout"));
    }
    let mut table = vec![0u8; count * PER_FRAME];
    read_exact(r, &mut table, path, &mut crc)?;
    let mut layout = Vec::with_capacity(count);
    for i in 0..count {
        let at = i * PER_FRAME;
        let len = u64_at(&table, at);
        let origin = match table[at + 8] {
            0 => FrameOrigin::Host,
            1 => FrameOrigin::Device { ordinal: u32_at(&table, at + 9) as usize },
            k => return Err(corrupt(path, format!("unknown frame origin {k}"))),
        };
        if len > expected_len {
            return Err(corrupt(path, "implausible frame length"));
        }
        layout.push((len as usize, origin));
    }
    if file_len(header_len as usize, &layout) != expected_len {
        return Err(corrupt(path, "layout does not match the file's recorded length"));
    }
    let mut header = vec![0u8; header_len as usize];
    read_exact(r, &mut header, path, &mut crc)?;
    let mut frames = Vec::with_capacity(count);
    for &(len, _) in &layout {
        let mut buf = match pool.map(|p| p.alloc(len)) {
            Some(Ok(b)) => b,
            _ => HostBuffer::zeroed(len),
        };
        read_frame(r, buf.as_mut_slice(), path, &mut crc)?;
        frames.push(buf);
    }
    let want = crc.finish();
    let mut trailer = [0u8; 4];
    read_exact(r, &mut trailer, path, &mut Crc32c::new())?;
    if u32::from_le_bytes(trailer) != want {
        return Err(corrupt(path, "checksum mismatch"));
    }
    let mut extra = [0u8; 1];
    match r.read(&mut extra) {
        Ok(0) => {}
        Ok(_) => return Err(corrupt(path, "trailing bytes")),
        Err(source) => return Err(SpillError::Io { op: "read", path: path.to_path_buf(), source }),
    }
    Ok(Decoded { header, frames, origins: layout.into_iter().map(|l| l.1).collect() })
}
