//! Device ↔ host serialization of [`Message`]s, and the traits user types implement to
//! become a message and back.
//!
//! # Device → host
//! [`device_to_host`] turns every device frame into a host frame taken from a
//! [`PinnedPool`], copying in **chunks** (the pool's chunk size) queued alternately on two
//! streams, so several chunks are in flight and the copy engine never idles between them.
//! When the pool cannot hold a frame, the frame goes to fresh (pageable) memory through a
//! ring of up to four pinned staging chunks: the device → host copy of chunk *k+1* overlaps
//! the CPU copy of chunk *k* out of staging. Without a pool (or staging) the copy goes
//! straight to pageable memory (the driver stages it, slowly).
//!
//! The result is a [`HostMessage`]: the header, host frames, and per frame its
//! [`FrameOrigin`] (host, or the device ordinal it came from), which [`host_to_device`]
//! uses to put device frames back where they were, with device memory from a caller-given
//! allocator (so this module needs no device pool).
//!
//! # Failure
//! Nothing is lost on failure: both directions return the input untouched inside a
//! [`Failure`] (the new buffers are dropped only after every queued copy finished).
//! Without CUDA, messages without device frames convert for free; device frames give
//! [`SerializeError::Unsupported`].

use std::collections::VecDeque;
use std::fmt;

use thiserror::Error;

use crate::pinned::{bind_primary_context, dtoh_async, htod_async, Event, Stream};
use crate::{DeviceBuffer, Frame, HostBuffer, Message, PinnedPool};

/// Chunk size of pipelined copies when no pool says otherwise.
pub const DEFAULT_COPY_CHUNK: usize = 4 << 20;
/// Most pinned staging chunks used for a copy into pageable memory.
const MAX_STAGING: usize = 4;

/// Serialization failures.
#[derive(Debug, Error)]
pub enum SerializeError {
    /// A device frame needs CUDA and CUDA is not usable in this process.
    #[error("device frames need CUDA: {0}")]
    Unsupported(String),
    /// A CUDA driver call failed.
    #[error("CUDA error: {0}")]
    Cuda(String),
    /// The device allocator refused.
    #[error("device allocation of {len} bytes on device {device_ordinal} failed: {reason}")]
    DeviceAlloc {
        /// Device asked for.
        device_ordinal: usize,
        /// Bytes asked for.
        len: usize,
        /// Why.
        reason: String,
    },
    /// The message's header or frames do not match the type asked for.
    #[error("message is not a {expected}: {found}")]
    WrongType {
        /// The type asked for.
        expected: &'static str,
        /// What the message looks like.
        found: String,
    },
    /// Frames and their recorded origins disagree, or an allocator returned the wrong size.
    #[error("inconsistent layout: {0}")]
    Layout(String),
}

/// An error plus the value that was handed in, returned untouched.
pub struct Failure<T> {
    /// What went wrong.
    pub error: SerializeError,
    /// The input, intact.
    pub value: T,
}

impl<T> Failure<T> {
    fn new(error: SerializeError, value: T) -> Self {
        Self { error, value }
    }
}

impl<T> fmt::Debug for Failure<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Failure").field("error", &self.error).finish_non_exhaustive()
    }
}
impl<T> fmt::Display for Failure<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}
impl<T> std::error::Error for Failure<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// Where a frame of a [`HostMessage`] lived before serialization.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameOrigin {
    /// It was a host frame.
    Host,
    /// It was a device frame on this device.
    Device {
        /// The CUDA device ordinal.
        ordinal: usize,
    },
}

/// A message whose frames are all in host memory, remembering where each came from.
#[derive(Debug, Default)]
pub struct HostMessage {
    /// The user header.
    pub header: Vec<u8>,
    /// The frames, in order.
    pub frames: Vec<HostBuffer>,
    /// Per frame, where it lived before (same length as `frames`).
    pub origins: Vec<FrameOrigin>,
}

impl HostMessage {
    /// Wraps a message that has host frames only; gives it back if it has device frames.
    pub fn from_host_message(msg: Message) -> Result<Self, Failure<Message>> {
        if msg.frames.iter().any(|f| f.as_device().is_some()) {
            return Err(Failure::new(
                SerializeError::Layout("message has device frames; use device_to_host".into()),
                msg,
            ));
        }
        let Message { header, frames } = msg;
        let frames: Vec<HostBuffer> = frames
            .into_iter()
            .filter_map(|f| match f {
                Frame::Host(h) => Some(h),
                Frame::Device(_) => None,
            })
            .collect();
        let origins = vec![FrameOrigin::Host; frames.len()];
        Ok(Self { header, frames, origins })
    }

    /// Total payload bytes.
    pub fn payload_len(&self) -> usize {
        self.frames.iter().map(HostBuffer::len).sum()
    }

    /// Whether any frame came from a device.
    pub fn has_device_origin(&self) -> bool {
        self.origins.iter().any(|o| matches!(o, FrameOrigin::Device { .. }))
    }

    /// A message with these host frames (origins forgotten).
    pub fn into_message(self) -> Message {
        Message::new(self.header, self.frames.into_iter().map(Frame::Host).collect())
    }
}

/// Device frames → host frames from `pool`, with pipelined chunk copies.
///
/// See the [module documentation](self) for the copy strategy. On failure the message
/// comes back intact.
pub fn device_to_host(msg: Message, pool: &PinnedPool) -> Result<HostMessage, Failure<Message>> {
    device_to_host_with(msg, Some(pool))
}

/// Like [`device_to_host`], into pooled memory when `pool` is given, fresh memory
/// otherwise.
pub fn device_to_host_with(msg: Message, pool: Option<&PinnedPool>) -> Result<HostMessage, Failure<Message>> {
    if msg.device_bytes() == 0 && msg.frames.iter().all(|f| f.as_host().is_some()) {
        return HostMessage::from_host_message(msg);
    }
    if let Err(e) = crate::cuda::probe() {
        return Err(Failure::new(SerializeError::Unsupported(e.to_string()), msg));
    }
    match device_frames_to_host(&msg, pool) {
        Ok(copies) => assemble_host(msg, copies),
        Err(e) => Err(Failure::new(e, msg)),
    }
}

/// Replaces the device frames of `msg` by their host `copies` (index-aligned with the
/// frames, as [`device_frames_to_host`] returns them), dropping the device buffers.
pub fn assemble_host(msg: Message, mut copies: Vec<Option<HostBuffer>>) -> Result<HostMessage, Failure<Message>> {
    let aligned = copies.len() == msg.frames.len()
        && copies
            .iter()
            .zip(&msg.frames)
            .all(|(c, f)| c.as_ref().map(HostBuffer::len) == f.as_device().map(DeviceBuffer::len));
    if !aligned {
        let e = SerializeError::Layout("host copies do not match the device frames".into());
        return Err(Failure::new(e, msg));
    }
    let Message { header, frames } = msg;
    let mut out = Vec::with_capacity(frames.len());
    let mut origins = Vec::with_capacity(frames.len());
    for (f, copy) in frames.into_iter().zip(copies.iter_mut()) {
        match (f, copy.take()) {
            (Frame::Device(d), Some(h)) => {
                origins.push(FrameOrigin::Device { ordinal: d.device_ordinal() });
                out.push(h);
            }
            (Frame::Host(h), _) => {
                origins.push(FrameOrigin::Host);
                out.push(h);
            }
            (Frame::Device(_), None) => {} // excluded by the check above
        }
    }
    Ok(HostMessage { header, frames: out, origins })
}

/// Copies every device frame of `msg` to new host memory (pooled when possible), leaving
/// `msg` untouched: the result is index-aligned with `msg.frames` (`None` for host
/// frames). Use it to keep the device copy until the host copy is safe somewhere (spill
/// writes it to disk first); [`assemble_host`] then swaps them in.
///
/// Host-only messages need no CUDA; device frames without CUDA give
/// [`SerializeError::Unsupported`].
pub fn device_frames_to_host(
    msg: &Message,
    pool: Option<&PinnedPool>,
) -> Result<Vec<Option<HostBuffer>>, SerializeError> {
    if msg.frames.iter().all(|f| f.as_host().is_some()) {
        return Ok(msg.frames.iter().map(|_| None).collect());
    }
    crate::cuda::probe().map_err(|e| SerializeError::Unsupported(e.to_string()))?;
    let chunk = pool.map_or(DEFAULT_COPY_CHUNK, PinnedPool::chunk_size);
    let mut copies: Vec<Option<HostBuffer>> = Vec::with_capacity(msg.frames.len());
    let mut ordinals: Vec<usize> = Vec::new();
    for f in &msg.frames {
        copies.push(match f {
            Frame::Host(_) => None,
            Frame::Device(d) => {
                if !ordinals.contains(&d.device_ordinal()) {
                    ordinals.push(d.device_ordinal());
                }
                Some(match pool.map(|p| p.alloc(d.len())) {
                    Some(Ok(b)) => b,
                    Some(Err(e)) => {
                        tracing::debug!("device_to_host: pool cannot hold a frame ({e}); staging");
                        HostBuffer::zeroed(d.len())
                    }
                    None => HostBuffer::zeroed(d.len()),
                })
            }
        });
    }
    for ordinal in ordinals {
        bind_primary_context(ordinal).map_err(SerializeError::Cuda)?;
        // Declared after `copies`' buffers exist; dropped (synchronized) before we return
        // them or drop them on error.
        let streams = [Stream::new().map_err(SerializeError::Cuda)?, Stream::new().map_err(SerializeError::Cuda)?];
        let result = (|| {
            let mut next = 0usize;
            for (f, dst) in msg.frames.iter().zip(copies.iter_mut()) {
                let (Frame::Device(src), Some(dst)) = (f, dst) else {
                    continue;
                };
                if src.device_ordinal() != ordinal {
                    continue;
                }
                if dst.is_pinned() || pool.is_none() {
                    chunked_dtoh(src, dst, chunk, &streams, &mut next)?;
                } else {
                    staged_dtoh(src, dst, pool, chunk, &streams)?;
                }
            }
            for s in &streams {
                s.synchronize()?;
            }
            Ok::<(), String>(())
        })();
        drop(streams);
        result.map_err(SerializeError::Cuda)?;
    }
    Ok(copies)
}

/// Queues `src` → `dst` chunk by chunk, alternating streams. The caller synchronizes.
fn chunked_dtoh(
    src: &DeviceBuffer,
    dst: &mut HostBuffer,
    chunk: usize,
    streams: &[Stream; 2],
    next: &mut usize,
) -> Result<(), String> {
    let dst = dst.as_mut_slice();
    for (i, part) in dst.chunks_mut(chunk.max(1)).enumerate() {
        let off = (i * chunk) as u64;
        let stream = &streams[*next % 2];
        *next += 1;
        // SAFETY: `src` is live device memory of at least `dst.len()` bytes (same length by
        // construction); `dst` is not touched until the streams are synchronized by the
        // caller, which also happens (Stream::drop) before `dst` can be dropped.
        unsafe { dtoh_async(part, src.device_ptr() + off, stream) }?;
    }
    Ok(())
}

/// `src` → pageable `dst` through a ring of pinned staging chunks: the copy of chunk k+1
/// runs while the CPU empties chunk k. Falls back to direct copies when the pool has no
/// pinned chunk to spare.
fn staged_dtoh(
    src: &DeviceBuffer,
    dst: &mut HostBuffer,
    pool: Option<&PinnedPool>,
    chunk: usize,
    streams: &[Stream; 2],
) -> Result<(), String> {
    let mut slots: Vec<HostBuffer> = Vec::new();
    if let Some(pool) = pool.filter(|p| p.is_pinned()) {
        let want = dst.len().div_ceil(chunk).clamp(1, MAX_STAGING);
        while slots.len() < want {
            match pool.alloc(chunk) {
                Ok(b) => slots.push(b),
                Err(_) => break,
            }
        }
    }
    if slots.is_empty() {
        let mut next = 0;
        chunked_dtoh(src, dst, chunk, streams, &mut next)?;
        return streams.iter().try_for_each(Stream::synchronize);
    }
    let events = (0..slots.len()).map(|_| Event::new()).collect::<Result<Vec<_>, _>>()?;
    let dst = dst.as_mut_slice();
    let k = slots.len();
    let mut pending: VecDeque<(usize, usize, usize)> = VecDeque::with_capacity(k);
    let drain_one =
        |pending: &mut VecDeque<(usize, usize, usize)>, slots: &[HostBuffer], dst: &mut [u8]| -> Result<(), String> {
            if let Some((s, off, n)) = pending.pop_front() {
                events[s].synchronize()?;
                dst[off..off + n].copy_from_slice(&slots[s].as_slice()[..n]);
            }
            Ok(())
        };
    let total = dst.len();
    let mut off = 0;
    let mut i = 0;
    while off < total {
        let n = chunk.min(total - off);
        let s = i % k;
        if pending.len() == k {
            drain_one(&mut pending, &slots, dst)?;
        }
        let stream = &streams[i % 2];
        // SAFETY: `src` holds `total` bytes; slot `s` is not read by the CPU until its
        // event has completed, and the slots outlive the streams' work (we drain every
        // pending slot below, and on error the caller drops the streams — synchronizing
        // them — before these slots are dropped at the end of this function... which is
        // why errors synchronize first).
        let queued = unsafe { dtoh_async(&mut slots[s].as_mut_slice()[..n], src.device_ptr() + off as u64, stream) }
            .and_then(|()| events[s].record(stream));
        if let Err(e) = queued {
            for st in streams {
                let _ = st.synchronize();
            }
            return Err(e);
        }
        pending.push_back((s, off, n));
        off += n;
        i += 1;
    }
    while !pending.is_empty() {
        if let Err(e) = drain_one(&mut pending, &slots, dst) {
            for st in streams {
                let _ = st.synchronize();
            }
            return Err(e);
        }
    }
    Ok(())
}

/// Host frames that came from a device go back to that device, into memory from
/// `alloc(device_ordinal, len)`; host-origin frames stay host frames.
///
/// Copies are chunked over two streams (asynchronous when the source is pinned). On
/// failure the host message comes back intact.
pub fn host_to_device<F>(msg: HostMessage, mut alloc: F) -> Result<Message, Failure<HostMessage>>
where
    F: FnMut(usize, usize) -> Result<DeviceBuffer, SerializeError>,
{
    if msg.origins.len() != msg.frames.len() {
        let e = SerializeError::Layout(format!("{} frames but {} origins", msg.frames.len(), msg.origins.len()));
        return Err(Failure::new(e, msg));
    }
    if !msg.has_device_origin() {
        return Ok(msg.into_message());
    }
    if let Err(e) = crate::cuda::probe() {
        return Err(Failure::new(SerializeError::Unsupported(e.to_string()), msg));
    }
    let mut device: Vec<Option<DeviceBuffer>> = Vec::with_capacity(msg.frames.len());
    for (h, o) in msg.frames.iter().zip(&msg.origins) {
        device.push(match *o {
            FrameOrigin::Host => None,
            FrameOrigin::Device { ordinal } => match alloc(ordinal, h.len()) {
                Ok(d) if d.len() >= h.len() && d.device_ordinal() == ordinal => Some(d),
                Ok(d) => {
                    let e = SerializeError::Layout(format!(
                        "allocator returned {} bytes on device {} for {} bytes on device {ordinal}",
                        d.len(),
                        d.device_ordinal(),
                        h.len()
                    ));
                    return Err(Failure::new(e, msg));
                }
                Err(e) => return Err(Failure::new(e, msg)),
            },
        });
    }
    if let Err(e) = copy_frames_in(&msg, &device) {
        return Err(Failure::new(SerializeError::Cuda(e), msg));
    }
    let HostMessage { header, frames, .. } = msg;
    let frames = frames
        .into_iter()
        .zip(device)
        .map(|(h, d)| match d {
            Some(d) => Frame::Device(d),
            None => Frame::Host(h),
        })
        .collect();
    Ok(Message::new(header, frames))
}

fn copy_frames_in(msg: &HostMessage, device: &[Option<DeviceBuffer>]) -> Result<(), String> {
    let mut ordinals: Vec<usize> = device.iter().flatten().map(DeviceBuffer::device_ordinal).collect();
    ordinals.sort_unstable();
    ordinals.dedup();
    for ordinal in ordinals {
        bind_primary_context(ordinal)?;
        let streams = [Stream::new()?, Stream::new()?];
        let mut next = 0usize;
        for (h, d) in msg.frames.iter().zip(device) {
            let Some(d) = d.as_ref().filter(|d| d.device_ordinal() == ordinal) else {
                continue;
            };
            for (i, part) in h.as_slice().chunks(DEFAULT_COPY_CHUNK).enumerate() {
                let stream = &streams[next % 2];
                next += 1;
                // SAFETY: `d` holds at least `h.len()` bytes (checked by the caller); `h`
                // lives until after the streams are synchronized (below, or Stream::drop
                // on the error path, which runs before `msg` can be dropped).
                unsafe { htod_async(d.device_ptr() + (i * DEFAULT_COPY_CHUNK) as u64, part, stream) }?;
            }
        }
        for s in &streams {
            s.synchronize()?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// User types ↔ messages
// ---------------------------------------------------------------------------------------

/// A value that can become a [`Message`] (header + frames).
pub trait IntoFrames {
    /// The message.
    fn into_frames(self) -> Message;
}

/// A value that can be rebuilt from a [`Message`]; the message comes back on mismatch.
pub trait FromFrames: Sized {
    /// The value.
    fn from_frames(msg: Message) -> Result<Self, Failure<Message>>;
}

/// Both directions.
pub trait Serializable: IntoFrames + FromFrames {}
impl<T: IntoFrames + FromFrames> Serializable for T {}

/// Header tag of a byte buffer (one host frame).
pub const TAG_BYTES: &[u8] = b"ferrylink:bytes";
/// Header tag of a [`DeviceBuffer`] (one device frame).
pub const TAG_DEVICE: &[u8] = b"ferrylink:device";
/// Header tag of a `Vec<Frame>`.
pub const TAG_FRAMES: &[u8] = b"ferrylink:frames";

fn describe(msg: &Message) -> String {
    let kinds: Vec<_> = msg.frames.iter().map(|f| format!("{:?}", f.kind())).collect();
    format!("header {:?}, frames [{}]", String::from_utf8_lossy(&msg.header), kinds.join(", "))
}

fn one_frame(msg: Message, tag: &[u8], expected: &'static str, device: bool) -> Result<Frame, Failure<Message>> {
    let Message { header, mut frames } = msg;
    if header == tag && frames.len() == 1 {
        if let Some(f) = frames.pop() {
            if f.as_device().is_some() == device {
                return Ok(f);
            }
            frames.push(f);
        }
    }
    let msg = Message { header, frames };
    let found = describe(&msg);
    Err(Failure::new(SerializeError::WrongType { expected, found }, msg))
}

fn wrong_kind(f: Frame, expected: &'static str) -> Failure<Message> {
    let msg = Message::new(Vec::new(), vec![f]);
    let found = describe(&msg);
    Failure::new(SerializeError::WrongType { expected, found }, msg)
}

impl IntoFrames for Vec<u8> {
    fn into_frames(self) -> Message {
        Message::new(TAG_BYTES, vec![Frame::Host(HostBuffer::from_vec(self))])
    }
}
impl IntoFrames for &[u8] {
    fn into_frames(self) -> Message {
        self.to_vec().into_frames()
    }
}
impl IntoFrames for HostBuffer {
    fn into_frames(self) -> Message {
        Message::new(TAG_BYTES, vec![Frame::Host(self)])
    }
}
impl IntoFrames for DeviceBuffer {
    fn into_frames(self) -> Message {
        Message::new(TAG_DEVICE, vec![Frame::Device(self)])
    }
}
impl IntoFrames for Vec<Frame> {
    fn into_frames(self) -> Message {
        Message::new(TAG_FRAMES, self)
    }
}
impl IntoFrames for Message {
    fn into_frames(self) -> Message {
        self
    }
}

impl FromFrames for Vec<u8> {
    /// Copies the bytes out (a pooled buffer's chunks go back to the pool).
    fn from_frames(msg: Message) -> Result<Self, Failure<Message>> {
        match one_frame(msg, TAG_BYTES, "byte buffer", false)? {
            Frame::Host(h) => Ok(h.to_vec()),
            f @ Frame::Device(_) => Err(wrong_kind(f, "host frame")),
        }
    }
}
impl FromFrames for HostBuffer {
    fn from_frames(msg: Message) -> Result<Self, Failure<Message>> {
        match one_frame(msg, TAG_BYTES, "host buffer", false)? {
            Frame::Host(h) => Ok(h),
            f @ Frame::Device(_) => Err(wrong_kind(f, "host frame")),
        }
    }
}
impl FromFrames for DeviceBuffer {
    fn from_frames(msg: Message) -> Result<Self, Failure<Message>> {
        match one_frame(msg, TAG_DEVICE, "device buffer", true)? {
            Frame::Device(d) => Ok(d),
            f @ Frame::Host(_) => Err(wrong_kind(f, "device frame")),
        }
    }
}
impl FromFrames for Vec<Frame> {
    /// Any message's frames (the untyped view: the header is not checked).
    fn from_frames(msg: Message) -> Result<Self, Failure<Message>> {
        Ok(msg.frames)
    }
}
impl FromFrames for Message {
    fn from_frames(msg: Message) -> Result<Self, Failure<Message>> {
        Ok(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DeviceMemoryOwner, PinnedPoolConfig, Registration};
    use ferrylink_testkit::{gpu_or_skip, pattern};
    use std::sync::Arc;

    #[test]
    fn host_only_messages_convert_without_cuda() {
        let msg = Message::new(b"h".to_vec(), vec![pattern(10, 1).into(), pattern(0, 0).into()]);
        let hm = device_to_host_with(msg, None).unwrap();
        assert_eq!(hm.origins, vec![FrameOrigin::Host; 2]);
        assert_eq!(hm.payload_len(), 10);
        let back = host_to_device(hm, |_, _| panic!("no device frame")).unwrap();
        assert_eq!(back.header, b"h");
        assert_eq!(back.frames[0].as_host().unwrap().to_vec(), pattern(10, 1));
    }

    #[test]
    fn mismatched_origins_are_a_layout_error() {
        let hm = HostMessage { header: vec![], frames: vec![HostBuffer::zeroed(1)], origins: vec![] };
        let f = host_to_device(hm, |_, _| panic!()).unwrap_err();
        assert!(matches!(f.error, SerializeError::Layout(_)));
        assert_eq!(f.value.frames.len(), 1);
    }

    struct Fake;
    impl DeviceMemoryOwner for Fake {
        fn describe(&self) -> String {
            "fake".into()
        }
    }

    #[test]
    fn device_frames_without_cuda_are_unsupported_and_returned() {
        if crate::cuda::probe().is_ok() {
            eprintln!("skipped: CUDA present (this test covers its absence)");
            return;
        }
        // SAFETY: never dereferenced: without CUDA the conversion refuses before copying.
        let d = unsafe { DeviceBuffer::from_raw_parts(0x1000, 64, 0, Arc::new(Fake)) };
        let msg = Message::new(vec![], vec![Frame::Host(HostBuffer::zeroed(3)), Frame::Device(d)]);
        let f = device_to_host_with(msg, None).unwrap_err();
        assert!(matches!(f.error, SerializeError::Unsupported(_)), "{}", f.error);
        assert_eq!(f.value.frames.len(), 2);
        assert_eq!(f.value.device_bytes(), 64);

        let hm = HostMessage {
            header: vec![],
            frames: vec![HostBuffer::zeroed(4)],
            origins: vec![FrameOrigin::Device { ordinal: 0 }],
        };
        let f = host_to_device(hm, |_, _| panic!("must not allocate")).unwrap_err();
        assert!(matches!(f.error, SerializeError::Unsupported(_)));
        assert_eq!(f.value.frames.len(), 1);
    }

    #[test]
    fn user_types_round_trip_and_mismatches_return_the_message() {
        let v = pattern(100, 3);
        assert_eq!(Vec::<u8>::from_frames(v.clone().into_frames()).unwrap(), v);
        assert_eq!(Vec::<u8>::from_frames(v.as_slice().into_frames()).unwrap(), v);
        let h = HostBuffer::from_region_free(&v);
        assert_eq!(HostBuffer::from_frames(h.into_frames()).unwrap().to_vec(), v);
        let frames = vec![Frame::from(v.clone()), Frame::from(vec![1u8])];
        let back = Vec::<Frame>::from_frames(frames.into_frames()).unwrap();
        assert_eq!(back.len(), 2);

        let f = Vec::<u8>::from_frames(Message::new(b"other".to_vec(), vec![v.clone().into()])).unwrap_err();
        assert!(matches!(f.error, SerializeError::WrongType { .. }));
        assert_eq!(f.value.header, b"other");
        assert_eq!(f.value.frames[0].as_host().unwrap().to_vec(), v);
        let f = DeviceBuffer::from_frames(v.clone().into_frames()).unwrap_err();
        assert!(f.to_string().contains("device buffer"), "{f}");
        assert_eq!(f.value.frames.len(), 1);
    }

    trait FromRegionFree {
        fn from_region_free(v: &[u8]) -> HostBuffer;
    }
    impl FromRegionFree for HostBuffer {
        fn from_region_free(v: &[u8]) -> HostBuffer {
            HostBuffer::from_vec(v.to_vec())
        }
    }

    // ---- GPU tests: skipped (and passing) without a CUDA device ----

    struct Malloc(u64);
    impl DeviceMemoryOwner for Malloc {
        fn describe(&self) -> String {
            "test cuMemAlloc".into()
        }
    }
    impl Drop for Malloc {
        fn drop(&mut self) {
            if bind_primary_context(0).is_ok() {
                // SAFETY: allocated by `device_alloc`, freed once here.
                let _ = unsafe { cudarc::driver::result::free_sync(self.0) };
            }
        }
    }

    fn device_alloc(ordinal: usize, len: usize) -> Result<DeviceBuffer, SerializeError> {
        bind_primary_context(ordinal).map_err(SerializeError::Cuda)?;
        // SAFETY: plain allocation in the current (primary) context.
        let ptr = unsafe { cudarc::driver::result::malloc_sync(len.max(1)) }
            .map_err(|e| SerializeError::DeviceAlloc { device_ordinal: ordinal, len, reason: e.to_string() })?;
        // SAFETY: `ptr` is `len` fresh bytes on `ordinal`, kept alive by its owner.
        Ok(unsafe { DeviceBuffer::from_raw_parts(ptr, len, ordinal, Arc::new(Malloc(ptr))) })
    }

    fn device_with(bytes: &[u8]) -> DeviceBuffer {
        let d = device_alloc(0, bytes.len()).unwrap();
        // SAFETY: `d` holds `bytes.len()` bytes; synchronous copy.
        unsafe { cudarc::driver::result::memcpy_htod_sync(d.device_ptr(), bytes) }.unwrap();
        d
    }

    fn round_trip(pool: Option<&PinnedPool>, sizes: &[usize]) {
        let data: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| pattern(n, i as u64)).collect();
        let mut frames: Vec<Frame> = data.iter().map(|d| Frame::Device(device_with(d))).collect();
        frames.push(Frame::from(b"host".to_vec()));
        let hm = device_to_host_with(Message::new(b"m".to_vec(), frames), pool).unwrap();
        for (h, d) in hm.frames.iter().zip(&data) {
            assert_eq!(h.as_slice(), d.as_slice());
        }
        assert_eq!(*hm.origins.last().unwrap(), FrameOrigin::Host);
        let msg = host_to_device(hm, device_alloc).unwrap();
        assert_eq!(msg.frames.len(), data.len() + 1);
        let back = device_to_host_with(msg, None).unwrap();
        for (h, d) in back.frames.iter().zip(&data) {
            assert_eq!(h.as_slice(), d.as_slice());
        }
    }

    #[test]
    fn gpu_round_trip_through_the_pool() {
        if !gpu_or_skip() {
            return;
        }
        let pool =
            PinnedPool::new(PinnedPoolConfig { chunk_size: 1 << 20, region_size: 32 << 20, ..Default::default() })
                .unwrap();
        assert!(pool.is_pinned());
        round_trip(Some(&pool), &[1, 1 << 20, (5 << 20) + 7, 0]);
        assert_eq!(pool.stats().bytes_in_use, 0);
    }

    #[test]
    fn gpu_round_trip_staged_and_unpooled() {
        if !gpu_or_skip() {
            return;
        }
        // Frames larger than the pool: pageable destination through pinned staging.
        let pool =
            PinnedPool::new(PinnedPoolConfig { chunk_size: 1 << 20, region_size: 4 << 20, ..Default::default() })
                .unwrap();
        round_trip(Some(&pool), &[(9 << 20) + 3]);
        let unpinned = PinnedPool::new(PinnedPoolConfig {
            chunk_size: 1 << 20,
            region_size: 2 << 20,
            registration: Registration::Never,
            ..Default::default()
        })
        .unwrap();
        round_trip(Some(&unpinned), &[3 << 20, 100]);
        round_trip(None, &[(6 << 20) + 1, 10]);
    }
}
