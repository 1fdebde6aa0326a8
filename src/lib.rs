//! ferrylink moves GPU (device) and host buffers between processes as fast as the
//! hardware allows.
//!
//! This facade re-exports the public API of the workspace crates:
//! [`memory`] (buffers, frames, messages, the CUDA layer), [`ipc`] (shared host memory,
//! fd passing, CUDA IPC) and [`transport`] (contexts, listeners, endpoints, lanes).

pub use ferrylink_ipc as ipc;
pub use ferrylink_memory as memory;
pub use ferrylink_transport as transport;

pub use ferrylink_memory::{DeviceBuffer, Frame, FrameKind, HostBuffer, Message};
