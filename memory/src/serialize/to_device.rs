//! Host → device: host frames that came from a device go back to it, with chunked copies
//! over two streams.

use super::error::{Failure, SerializeError};
use super::host_message::{FrameOrigin, HostMessage};
use super::to_host::DEFAULT_COPY_CHUNK;
use crate::pinned::{bind_primary_context, htod_async, Stream};
use crate::{DeviceBuffer, Frame, Message};

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
