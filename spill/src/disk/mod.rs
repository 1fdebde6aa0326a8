//! The disk tier: the file format, the injectable file I/O and the per-store directory.
//!
//! # File format (version 1, little endian)
//! ```text
//! magic  "FLSPILL\0"          8 bytes
//! version u32 = 1
//! header_len u64
//! frame_count u32
//! per frame: len u64, origin u8 (0 host, 1 device), device ordinal u32
//! header bytes
//! frame bytes, in order
//! crc32c u32 of everything above
//! ```
//! One file per entry, written to `<n>.tmp` then renamed to `<n>.spill`: a file with the
//! final name is always complete.
//!
//! Files: `format` (encoding, reading and verifying a file), `file_io` (the injectable
//! [`DiskIo`] and its implementations), `dir` (the per-store directory and the removal of
//! dead processes' directories).

mod dir;
mod file_io;
mod format;

pub use dir::DIR_PREFIX;
pub use file_io::{DiskIo, FaultyDiskIo, RealDiskIo, Trailer};

pub(crate) use dir::SpillDir;
pub(crate) use format::{encode_meta, file_len, read_entry};
