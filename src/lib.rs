//! ferrylink moves GPU (device) and host buffers between processes as fast as the
//! hardware allows.
//!
//! This facade re-exports the public API of the workspace crates:
//! [`memory`] (buffers, frames, messages, the CUDA layer, the pinned host pool,
//! serialization), [`ipc`] (shared host memory, fd passing, CUDA IPC), [`transport`]
//! (contexts, listeners, endpoints, lanes) and [`spill`] (the device → host → disk store).
//!
//! Transport and spill meet through [`memory::MakeRoom`]: build a context with
//! [`transport::Context::with_make_room`] and a `SpillStore`, and an incoming device frame
//! that would exceed the device budget evicts older entries instead of failing.
#![warn(missing_docs)]

pub use ferrylink_ipc as ipc;
pub use ferrylink_memory as memory;
/// The cudarc ferrylink is built with: name its types through this and they always match
/// (`ferrylink::cudarc::driver::CudaSlice`).
pub use ferrylink_memory::cudarc;
pub use ferrylink_spill as spill;
pub use ferrylink_transport as transport;

pub use ferrylink_memory::{DeviceBuffer, Frame, FrameKind, HostBuffer, Message};

/// The examples of `README.md`, compiled as doctests so they keep to the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
