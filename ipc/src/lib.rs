//! `ferrylink-ipc`: the plumbing between processes of one machine.
//!
//! - [`memfd`]: shared host memory — sealed memfd regions the sender creates and the
//!   receiver maps read-only after checking they really are sealed memfds of the advertised
//!   size ([`MemfdRegion`]), and a sub-allocating pool of them ([`MemfdPool`]).
//! - [`fd_passing`]: sending and receiving file descriptors over a Unix stream socket with
//!   `SCM_RIGHTS` (`MSG_CMSG_CLOEXEC`, `MSG_CTRUNC` detected, received fds owned at once).
//! - [`peer_credentials`](mod@peer_credentials): who is on the other end of a Unix socket (`SO_PEERCRED`).
//! - [`control_ring`]: two single-producer single-consumer byte rings in one sealed memfd,
//!   which carry a native connection's control messages instead of its socket.
//! - [`cuda_ipc`]: CUDA IPC export/import of device buffers, the mapping cache, IPC events.
//!
//! Nothing here knows about lanes or the wire format.
#![warn(missing_docs)]

pub mod control_ring;
pub mod cuda_ipc;
pub mod fd_passing;
pub mod memfd;
pub mod peer_credentials;

pub use fd_passing::{recv_with_fds, send_with_fds, FdPassingError};
pub use memfd::{shared_host_buffer, ImportError, MemfdPool, MemfdRegion};
pub use peer_credentials::{peer_credentials, PeerCredentials};
