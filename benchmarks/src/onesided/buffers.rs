//! The registered memory of a one-sided round trip ([`RegisteredBuffer`]) and the bytes
//! it holds: the client's source pattern
//! ([`crate::digest::source_pattern`]), stamped with the round trip before a checked
//! one ([`stamped`]), its complement for what must be overwritten ([`complement`]), and
//! the byte of the server's gaps ([`GAP_BYTE`]).

use crate::memory_kind::{one_buffer, MemoryKind};
use crate::{BenchError, ObjectType};
use ferrylink::transport::{Access, Context, Registration, TransportError};
use ferrylink::Frame;
use std::borrow::Cow;

/// What the gaps of the server's region hold from the start to the end of a run: a
/// value the source pattern (`i % 251`) never takes.
pub const GAP_BYTE: u8 = 0xff;

/// The client's source of round trip `round_trip` in `blocks` equal blocks: the pattern
/// `i % 251` of `n` bytes with `round_trip` (little-endian, up to 8 bytes) at the start
/// of every block, so that a block left over from an earlier round trip differs.
pub fn stamped(base: &[u8], blocks: usize, round_trip: usize) -> Vec<u8> {
    let mut out = base.to_vec();
    let stamp = (round_trip as u64).to_le_bytes();
    let block = base.len() / blocks.max(1);
    for start in (0..blocks).map(|i| i * block) {
        let len = block.min(stamp.len());
        out[start..start + len].copy_from_slice(&stamp[..len]);
    }
    out
}

/// Every byte inverted: differs from `bytes` at every offset.
pub fn complement(bytes: &[u8]) -> Vec<u8> {
    bytes.iter().map(|b| !b).collect()
}

/// Where a registered buffer lives: host (a shared memfd buffer) or device memory of a
/// kind on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Host or device.
    pub object_type: ObjectType,
    /// The device memory kind (host runs: ignored).
    pub memory: MemoryKind,
    /// The device (host runs: ignored).
    pub dev: usize,
}

/// One buffer registered with the transport for one-sided transfers, holding bytes this
/// side writes and reads between round trips.
pub struct RegisteredBuffer {
    registration: Registration,
    what: &'static str,
}

impl RegisteredBuffer {
    /// A buffer of `contents.len()` bytes at `placement`, filled with `contents`, then
    /// registered with `access` for peers. Memory the transport will not register (device
    /// memory it would have to bounce: `--memory cudarc-default`) is
    /// [`BenchError::Unsupported`], naming `what` and the transport's reason.
    pub fn new(
        ctx: &Context,
        placement: Placement,
        contents: &[u8],
        access: Access,
        what: &'static str,
    ) -> Result<RegisteredBuffer, BenchError> {
        let len = contents.len();
        let frame = match placement.object_type {
            ObjectType::Host => {
                let mut h = ferrylink::ipc::shared_host_buffer(len).map_err(|e| {
                    BenchError::Other(format!("{what}: allocating {len} bytes of shared host memory: {e}"))
                })?;
                h.as_mut_slice().copy_from_slice(contents);
                Frame::Host(h)
            }
            ObjectType::Device => {
                let d = one_buffer(placement.memory, placement.dev, len)?;
                d.copy_from_host(contents)?;
                Frame::Device(d)
            }
        };
        let memory = match placement.object_type {
            ObjectType::Host => "shared host memory".to_owned(),
            ObjectType::Device => format!("device memory of --memory {} on device {}", placement.memory, placement.dev),
        };
        let registration = ctx.register(frame, access).map_err(|e| {
            let why = format!("{what}: {len} bytes of {memory} cannot be registered for one-sided transfers: {e}");
            match e {
                TransportError::Unsupported(_) => BenchError::Unsupported(why),
                _ => BenchError::Transport(why),
            }
        })?;
        Ok(RegisteredBuffer { registration, what })
    }

    /// The registration (its key for the peer, the local side of transfers).
    pub fn registration(&self) -> &Registration {
        &self.registration
    }

    /// Bytes registered.
    fn len(&self) -> usize {
        self.registration.frame().len()
    }

    /// Overwrites the whole buffer with `bytes` (between round trips, outside the timing:
    /// no transfer that touches this memory is in flight then). `&mut self`: no slice
    /// [`RegisteredBuffer::read`] gave is alive meanwhile.
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), BenchError> {
        if bytes.len() != self.len() {
            return Err(BenchError::Other(format!(
                "{}: writing {} bytes into a buffer of {}",
                self.what,
                bytes.len(),
                self.len()
            )));
        }
        match self.registration.frame() {
            Frame::Host(h) => {
                let (region, offset) = h.region().ok_or_else(|| {
                    BenchError::Other(format!("{}: registered host memory without a region", self.what))
                })?;
                // SAFETY: `offset .. offset + len` is this buffer's range of the region
                // (`HostBuffer::from_region` checked it lies inside), mapped while the
                // region lives, which the registration's frame keeps alive. `bytes` is
                // memory of this process's heap, not this mapping, so the ranges do not
                // overlap. No reference to these bytes is alive: `&mut self` excludes the
                // slices `read` hands out, and the transport touches registered memory
                // only during a transfer, none of which is in flight between round trips
                // (each ended with the notification or the request the caller waited for).
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), region.base_ptr().add(offset), bytes.len()) };
            }
            Frame::Device(d) => d.copy_from_host(bytes)?,
        }
        Ok(())
    }

    /// The buffer's bytes (host memory as it is, device memory copied to the host).
    pub fn read(&self) -> Result<Cow<'_, [u8]>, BenchError> {
        Ok(match self.registration.frame() {
            Frame::Host(h) => Cow::Borrowed(h.as_slice()),
            Frame::Device(d) => Cow::Owned(d.to_vec()?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::source_pattern;
    use ferrylink::transport::Config;

    #[test]
    fn stamps_mark_every_block_and_complements_differ_everywhere() {
        let base = source_pattern(40);
        let s = stamped(&base, 4, 0x0102);
        for start in [0, 10, 20, 30] {
            assert_eq!(s[start..start + 8], [2, 1, 0, 0, 0, 0, 0, 0], "block at {start}");
            assert_eq!(s[start + 8..start + 10], base[start + 8..start + 10]);
        }
        assert_ne!(stamped(&base, 4, 1), stamped(&base, 4, 2));
        // Blocks shorter than a stamp take its low bytes.
        assert_eq!(stamped(&[9; 6], 3, 0x0304), [4, 3, 4, 3, 4, 3]);
        let c = complement(&s);
        assert!(c.iter().zip(&s).all(|(a, b)| a != b));
        assert!(!base.contains(&GAP_BYTE));
    }

    #[test]
    fn host_buffers_are_written_and_read_whole() {
        let ctx = Context::new(Config::default()).unwrap();
        let placement = Placement { object_type: ObjectType::Host, memory: MemoryKind::Pool, dev: 0 };
        let mut b = RegisteredBuffer::new(&ctx, placement, &[1, 2, 3, 4], Access::ReadWrite, "test buffer").unwrap();
        assert_eq!(b.read().unwrap().as_ref(), [1, 2, 3, 4]);
        b.write(&[5, 6, 7, 8]).unwrap();
        assert_eq!(b.read().unwrap().as_ref(), [5, 6, 7, 8]);
        assert_eq!(b.registration().frame().as_host().unwrap().as_slice(), [5, 6, 7, 8]);
        let e = b.write(&[1]).unwrap_err().to_string();
        assert!(e.contains("writing 1 bytes into a buffer of 4"), "{e}");
    }
}
