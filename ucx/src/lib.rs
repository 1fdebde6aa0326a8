//! `ferrylink-ucx`: the safe UCX layer, RAII types over `ucx-sys` for the UCX lane.
//!
//! - [`UcxContext`] (`context.rs`): loads `libucp` (the one
//!   [`UcxConfig::library_path`] names, else `libucp.so.0`), creates a context (tag
//!   matching + wakeup) from a [`UcxConfig`] (ferrylink's defaults, such as
//!   [`TCP_RX_SEG_SIZE`], under the `UCX_*` environment and per-context options), says
//!   whether it can touch CUDA memory. `Send + Sync`.
//! - [`UcxWorker`] (`worker.rs`): one worker, owned by the progress thread (`!Send`):
//!   `progress`, `event_fd` + `arm` for a mio loop, its [`WorkerAddress`].
//! - [`UcxEndpoint`] (`endpoint.rs`): connection to a remote worker in error mode PEER;
//!   failures are recorded by the error callback; closed with `ucp_ep_close_nbx`
//!   ([`EndpointClose`], pollable; dropping forces).
//! - [`TagSend`] / [`TagRecv`] (`request.rs`): nbx tag requests that own their buffer
//!   ([`SendBuf`] / [`RecvBuf`], `buffer.rs`) until UCX is done with it, polled for
//!   completion, cancelled on drop without leaking the request or freeing memory UCX
//!   still uses.
//! - One-sided (RMA), for contexts made with [`UcxConfig::rma`]:
//!   - [`Registration`] (`registration.rs`): [`UcxContext::register`] maps a buffer it owns
//!     (host, or CUDA memory on a CUDA-aware UCX) with `ucp_mem_map`, unmapped on drop;
//!     [`Registration::region_key`] packs its rkey.
//!   - [`RegionKey`] (`region_key.rs`): the range and packed rkey a peer ships, and the
//!     checks such bytes pass before UCX parses them ([`KeyFault`]).
//!   - [`RemoteKey`] (`rkey.rs`): [`UcxEndpoint::unpack_rkey`] of a peer's key, owned by
//!     that endpoint (destroyed when it closes, or after the last request using it).
//!   - [`Put`] / [`Get`] (`rma.rs`): [`UcxEndpoint::put`] / [`UcxEndpoint::get`] and
//!     their [`RmaSpan`] batches, each span checked to lie inside the local buffer and
//!     the key's range; requests own their buffer like the tag requests.
//!   - [`EndpointFlush`] (`flush.rs`): [`UcxEndpoint::flush`]; once it completes, the
//!     puts before it are visible at the target (send the notification then).
//! - [`UcxError`] (`error.rs`).
//! - `setup.rs`: one UCX set-up call at a time in the process (loading the library,
//!   creating a context or a worker): concurrent set-ups can deadlock inside UCX's
//!   module loading.
//!
//! UCX being absent is an error ([`UcxError::Unavailable`]) from [`UcxContext::new`],
//! never a panic.
#![warn(missing_docs)]

mod buffer;
mod context;
mod endpoint;
mod error;
mod flush;
mod region_key;
mod registration;
mod request;
mod rkey;
mod rma;
mod setup;
mod worker;

#[cfg(test)]
mod tests;

pub use buffer::{MemoryType, RawBuf, RecvBuf, SendBuf};
pub use context::{UcxConfig, UcxContext, TCP_RX_SEG_SIZE};
pub use endpoint::{CloseMode, EndpointClose, UcxEndpoint};
pub use error::{Rejected, SpanSide, UcxError};
pub use flush::EndpointFlush;
pub use region_key::{KeyFault, RegionKey, MAX_PACKED_RKEY_LEN, MAX_RKEY_TRAILER};
pub use registration::Registration;
pub use request::{RecvInfo, TagRecv, TagSend};
pub use rkey::RemoteKey;
pub use rma::{Get, Put, RmaSpan};
pub use ucx_sys::Status;
pub use worker::{UcxWorker, WorkerAddress, WORKER_DRAIN_TIMEOUT};
