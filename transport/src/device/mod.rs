//! [`DeviceState`]: the CUDA state both lanes (and every connection of one context)
//! share: the IPC exporter, the mapping and event caches, per-device streams, pools and
//! event pools. It is not a lane; the lanes (`lanes/`) and the user's threads use it.
//!
//! Sender: a device frame's allocation is exported once (`cuIpcGetMemHandle`, cached);
//! memory legacy IPC cannot export (cudarc's stream-ordered pool) is bounced into the
//! exportable pool first. Receiver: a descriptor's ready events are polled, every device
//! descriptor is mapped (the mapping cache validates it against the real allocation),
//! room is asked of the spill store, targets are allocated from the exportable pool (or
//! taken from `recv_into`), the copies run on a per-device stream (same-device copies by
//! the copy kernel up to its limit) and the stream is synchronised before the message is
//! acknowledged: the sender never frees memory a copy still reads. A receive that named a
//! stream instead gets its message at once, the stream waiting for the copies, and the
//! acknowledgement waits for their polled events (`copies.rs`).
//!
//! - `ordering.rs`: ordering a send after the GPU work that produced it.
//! - `landing.rs`: copies of a received message into its targets, on the stream that
//!   orders them after the targets' producers.
//! - `copies.rs`: copies in that a receive's stream, not the host, waits for.
//! - `push.rs`: connector copies into the listener's buffers.
//! - `export.rs`: describing a frame by its kind of memory (legacy IPC, VMM, pool
//!   pointer, bounce), with the regions one peer must import first.
//! - `targets.rs`: receive targets still in use on their producer stream: copies into
//!   them wait for it on the GPU, another process's writes on the host.
//! - `peer_memory.rs`: the VMM chunks and pools a peer announced, and opening a frame
//!   of them for one copy.
//! - `onesided.rs`: one-sided transfers' copies between a registration and a peer's
//!   memory, span by span.
//!
//! Why connector copies, polled events and the legacy default stream:
//! `docs/architecture.md`, "Design decisions".

mod completion;
mod copies;
mod export;
mod gate;
mod hold;
mod landing;
mod onesided;
mod ordering;
mod peer_memory;
mod push;
mod staging;
mod state;
mod targets;

pub(crate) use copies::CopiesInFlight;
pub(crate) use export::{DeviceAnnouncements, ExportedFrames};
pub(crate) use gate::{read_gate, GateSignal, GateWords};
pub(crate) use onesided::{copy_spans, Direction, SpanCopies};
pub(crate) use ordering::{Copier, ProducerMarks, ProducerOrders};
pub(crate) use peer_memory::{ImportedDeviceRegions, PeerMemory};
pub(crate) use push::PushInFlight;
pub(crate) use staging::{check_staging_pieces, StagingPiece};
pub(crate) use targets::{ReceiveMarks, TargetMarks};

pub(crate) use hold::DeviceHold;
pub(crate) use state::{copy_between, describe, send_error, DeviceFrameError, DeviceState};
use state::{synchronize_after_failure, PerDevice};
