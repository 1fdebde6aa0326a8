//! Device ↔ host serialization of [`Message`](crate::Message)s, and the traits user types implement to
//! become a message and back.
//!
//! # Device → host
//! [`device_to_host`] turns every device frame into a host frame taken from a
//! [`PinnedPool`](crate::PinnedPool), copying in **chunks** (the pool's chunk size) queued alternately on two
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
//!
//! # Layout
//! - `error`: [`SerializeError`] and [`Failure`];
//! - `host_message`: [`HostMessage`] and [`FrameOrigin`];
//! - `to_host`: device → host (pooled chunks, staging ring, pageable fallback);
//! - `to_device`: host → device;
//! - `frames`: the user-type traits ([`IntoFrames`], [`FromFrames`]) and their impls.

mod error;
mod frames;
mod host_message;
mod to_device;
mod to_host;

pub use error::{Failure, SerializeError};
pub use frames::{FromFrames, IntoFrames, Serializable, TAG_BYTES, TAG_DEVICE, TAG_FRAMES};
pub use host_message::{FrameOrigin, HostMessage};
pub use to_device::host_to_device;
pub use to_host::{assemble_host, device_frames_to_host, device_to_host, device_to_host_with, DEFAULT_COPY_CHUNK};

#[cfg(test)]
mod tests;
