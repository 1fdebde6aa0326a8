//! Synced spill files written with `O_DIRECT` (decision 0045): the bytes are copied into
//! aligned blocks on a scoped thread while the caller's thread writes the full blocks
//! straight to the disk, bypassing the page cache. The last block carries the trailer and
//! is padded to the alignment; the file is then cut back to its exact length and synced
//! (`fdatasync`), so the file is byte for byte what a buffered write makes.
//!
//! [`write_synced`] says [`Direct::Refused`] before it has called the trailer, so the
//! caller can write the file the buffered way instead, where the file system takes no
//! `O_DIRECT` (tmpfs) or no thread can be had.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

use super::file_io::Trailer;

/// Offsets, lengths and addresses of `O_DIRECT` writes are multiples of this: the largest
/// logical block size of common disks.
const ALIGN: usize = 4096;

/// Bytes of one block: each `write` hands the disk this much at once.
pub(crate) const BLOCK: usize = 16 << 20;

/// Blocks in rotation: one being written, the others being filled.
const BLOCKS: usize = 3;

/// How a synced write went.
pub(crate) enum Direct<'a> {
    /// The file is written and synced.
    Written,
    /// `O_DIRECT` or the copying thread could not be had: the trailer, not yet called,
    /// for the buffered write that replaces this one.
    Refused(Trailer<'a>),
}

/// A buffer whose [`Self::bytes`] start on an [`ALIGN`] boundary and hold [`BLOCK`] plus
/// one [`ALIGN`] of room: the last block takes the trailer and its padding.
struct AlignedBlock {
    raw: Vec<u8>,
}

impl AlignedBlock {
    fn new() -> Self {
        Self { raw: vec![0; BLOCK + 2 * ALIGN] }
    }
    fn bytes(&mut self) -> &mut [u8] {
        let start = self.raw.as_ptr().align_offset(ALIGN);
        &mut self.raw[start..start + BLOCK + ALIGN]
    }
}

/// Writes `parts`, then the trailer's bytes, to a new `path` with `O_DIRECT`, and syncs it.
pub(crate) fn write_synced<'a>(path: &Path, parts: &[&[u8]], trailer: Trailer<'a>) -> io::Result<Direct<'a>> {
    let mut file =
        match OpenOptions::new().write(true).create(true).truncate(true).custom_flags(nix::libc::O_DIRECT).open(path) {
            Ok(file) => file,
            Err(e) if e.raw_os_error() == Some(nix::libc::EINVAL) => return Ok(Direct::Refused(trailer)),
            Err(e) => return Err(e),
        };
    let body: usize = parts.iter().map(|p| p.len()).sum();
    let (full_tx, full_rx) = sync_channel::<AlignedBlock>(BLOCKS);
    let (free_tx, free_rx) = sync_channel::<AlignedBlock>(BLOCKS);
    std::thread::scope(|s| {
        let copier = std::thread::Builder::new()
            .name("spill-direct".into())
            .spawn_scoped(s, move || fill_blocks(parts, &full_tx, &free_rx));
        let copier = match copier {
            Ok(copier) => copier,
            Err(e) => {
                tracing::debug!("no thread to copy a synced spill file, written buffered: {e}");
                return Ok(Direct::Refused(trailer));
            }
        };
        let written = write_full_blocks(&mut file, &full_rx, &free_tx);
        // Ends the copier's wait for a free block if writing stopped early.
        drop((full_rx, free_tx));
        let last = copier.join().map_err(|_| io::Error::other("the spill copy thread panicked"))?;
        match written {
            Err(e) if e.raw_os_error() == Some(nix::libc::EINVAL) => {
                tracing::debug!("O_DIRECT write refused, written buffered: {e}");
                return Ok(Direct::Refused(trailer));
            }
            Err(e) => return Err(e),
            Ok(()) => {}
        }
        let (mut block, fill) = last.ok_or_else(|| io::Error::other("the spill copy thread stopped early"))?;
        let tail = block.bytes();
        tail[fill..fill + 4].copy_from_slice(&trailer()?);
        let padded = (fill + 4).next_multiple_of(ALIGN);
        tail[fill + 4..padded].fill(0);
        file.write_all(&tail[..padded]).map_err(|e| refused_as_error(e, body))?;
        file.set_len((body + 4) as u64)?;
        file.sync_data()?;
        Ok(Direct::Written)
    })
}

/// A refused `O_DIRECT` write seen only at the tail (a file smaller than a block) cannot
/// be retried buffered: the trailer was taken. It is reported as what it is.
fn refused_as_error(e: io::Error, body: usize) -> io::Error {
    if e.raw_os_error() == Some(nix::libc::EINVAL) {
        io::Error::new(e.kind(), format!("O_DIRECT write of a {body}-byte spill file refused: {e}"))
    } else {
        e
    }
}

/// The copier: `parts` into blocks, each full one sent to the writer; returns the last,
/// partly filled block and its fill, or `None` when the writer stopped taking blocks.
fn fill_blocks(
    parts: &[&[u8]],
    full: &SyncSender<AlignedBlock>,
    free: &Receiver<AlignedBlock>,
) -> Option<(AlignedBlock, usize)> {
    let mut spare = (0..BLOCKS).map(|_| AlignedBlock::new()).collect::<Vec<_>>();
    let next_block = |spare: &mut Vec<AlignedBlock>| spare.pop().or_else(|| free.recv().ok());
    let mut block = next_block(&mut spare)?;
    let mut fill = 0;
    for part in parts {
        let mut rest = *part;
        while !rest.is_empty() {
            let n = rest.len().min(BLOCK - fill);
            block.bytes()[fill..fill + n].copy_from_slice(&rest[..n]);
            fill += n;
            rest = &rest[n..];
            if fill == BLOCK {
                full.send(block).ok()?;
                block = next_block(&mut spare)?;
                fill = 0;
            }
        }
    }
    Some((block, fill))
}

/// The writer: each full block to the file, then back to the copier.
fn write_full_blocks(
    file: &mut File,
    full: &Receiver<AlignedBlock>,
    free: &SyncSender<AlignedBlock>,
) -> io::Result<()> {
    for mut block in full {
        file.write_all(&block.bytes()[..BLOCK])?;
        // The copier may have finished and need no more blocks.
        let _ = free.send(block);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts_of(sizes: &[usize]) -> Vec<Vec<u8>> {
        sizes.iter().enumerate().map(|(i, &n)| (0..n).map(|b| (b * 31 + i * 7) as u8).collect()).collect()
    }

    /// Whether `dir` takes `O_DIRECT` at all (tmpfs does not).
    fn takes_o_direct(dir: &Path) -> bool {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(nix::libc::O_DIRECT)
            .open(dir.join("probe"))
            .is_ok()
    }

    #[test]
    fn files_hold_the_parts_then_the_trailer_whatever_the_block_boundaries() {
        let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
        let direct = takes_o_direct(dir.path());
        for sizes in [
            vec![24, 0, BLOCK - 28],
            vec![24, 3, BLOCK - 27],
            vec![24, 3, BLOCK - 24],
            vec![13, 2 * BLOCK + 5],
            vec![BLOCK, BLOCK],
            vec![ALIGN - 4],
            vec![5],
        ] {
            let parts = parts_of(&sizes);
            let slices: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
            let path = dir.path().join("f");
            let how = write_synced(&path, &slices, Box::new(|| Ok([0xde, 0xad, 0xbe, 0xef]))).unwrap();
            if !direct {
                assert!(matches!(how, Direct::Refused(_)), "{sizes:?}");
                continue;
            }
            assert!(matches!(how, Direct::Written), "a directory that takes O_DIRECT gets it: {sizes:?}");
            let mut want = parts.concat();
            want.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
            let got = std::fs::read(&path).unwrap();
            assert_eq!(got.len(), want.len(), "{sizes:?}");
            assert!(got == want, "the bytes differ for {sizes:?}");
        }
    }

    #[test]
    fn a_failing_trailer_fails_the_write() {
        let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
        if !takes_o_direct(dir.path()) {
            return;
        }
        let parts = parts_of(&[BLOCK + 10]);
        let slices: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
        let written = write_synced(&dir.path().join("f"), &slices, Box::new(|| Err(io::Error::other("no checksum"))));
        let Err(e) = written else { panic!("the write succeeded without its trailer") };
        assert_eq!(e.to_string(), "no checksum");
    }

    #[test]
    fn a_missing_directory_is_an_error() {
        let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
        let path = dir.path().join("gone").join("f");
        let Err(e) = write_synced(&path, &[b"x"], Box::new(|| Ok([0; 4]))) else { panic!("written into nowhere") };
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }
}
