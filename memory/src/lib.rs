//! `ferrylink-memory`: where ferrylink's bytes live.
//!
//! - [`HostBuffer`]: host bytes, either owned (`Vec<u8>`) or a range of a shared
//!   [`HostRegion`] (a memfd mapping from `ferrylink-ipc`, a chunk of the pinned pool).
//! - [`DeviceBuffer`]: device bytes with the guard that keeps them alive.
//! - [`Frame`] and [`Message`]: what endpoints send — a small user header plus frames.
//! - [`cuda`]: the non-panicking CUDA probe every other crate asks before touching CUDA.
//! - [`MakeRoom`]: the one trait the transport's receive path and the spill store meet
//!   through ("make room for N device bytes"), so neither depends on the other.
//!
//! Nothing here knows about sockets, lanes or peers.
#![warn(missing_docs)]

pub mod cuda;
mod device;

/// The cudarc this crate is built with (`CudaSlice`, `CudaStream`, the driver API): use
/// it instead of naming a cudarc version of your own.
pub use cudarc;
mod frame;
mod host;
mod pinned;
mod room;
pub mod serialize;
mod with_methods;

pub use device::{DeviceBuffer, DeviceMemoryOwner, KnownAllocation, ProducerStream, RawStreamHandle};
pub use frame::{Frame, FrameKind, Message};
pub use host::{HostBuffer, HostRegion};
pub use pinned::{PinnedPool, PinnedPoolConfig, PinnedPoolStats, PoolError, Registration};
pub use room::{MakeRoom, NoRoom};
