//! The control stream of a connection: a Unix socket (native lane, fds may travel) or a
//! TCP socket (bootstrap of the UCX lane across machines; fds never travel there).

use crate::command::RawStream;
use ferrylink_ipc::{recv_with_fds, send_with_fds, FdPassingError};
use mio::event::Source;
use mio::{Interest, Registry, Token};
use std::io::{Read, Write};
use std::os::fd::{OwnedFd, RawFd};

pub(crate) enum ControlStream {
    Unix(mio::net::UnixStream),
    Tcp(mio::net::TcpStream),
}

impl ControlStream {
    pub fn from_raw(raw: RawStream) -> std::io::Result<Self> {
        Ok(match raw {
            RawStream::Unix(s) => {
                s.set_nonblocking(true)?;
                Self::Unix(mio::net::UnixStream::from_std(s))
            }
            RawStream::Tcp(s) => {
                s.set_nonblocking(true)?;
                s.set_nodelay(true)?;
                Self::Tcp(mio::net::TcpStream::from_std(s))
            }
        })
    }

    /// Whether descriptors can travel on this stream.
    pub fn is_unix(&self) -> bool {
        matches!(self, Self::Unix(_))
    }

    pub fn register(&mut self, registry: &Registry, token: Token) -> std::io::Result<()> {
        let interest = Interest::READABLE | Interest::WRITABLE;
        match self {
            Self::Unix(s) => s.register(registry, token, interest),
            Self::Tcp(s) => s.register(registry, token, interest),
        }
    }

    pub fn deregister(&mut self, registry: &Registry) {
        let _ = match self {
            Self::Unix(s) => s.deregister(registry),
            Self::Tcp(s) => s.deregister(registry),
        };
    }

    pub fn shutdown(&self) {
        let _ = match self {
            Self::Unix(s) => s.shutdown(std::net::Shutdown::Both),
            Self::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }

    /// Closes the writing half only: the peer reads EOF, this side can still read.
    pub fn shutdown_write(&self) {
        let _ = match self {
            Self::Unix(s) => s.shutdown(std::net::Shutdown::Write),
            Self::Tcp(s) => s.shutdown(std::net::Shutdown::Write),
        };
    }

    /// The descriptor (to wait on it outside the poll loop).
    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        match self {
            Self::Unix(s) => s.as_fd(),
            Self::Tcp(s) => s.as_fd(),
        }
    }

    /// Writes bytes (and on a Unix socket, descriptors with the first byte).
    pub fn write_with_fds(&self, bytes: &[u8], fds: &[RawFd]) -> Result<usize, FdPassingError> {
        match self {
            Self::Unix(s) => send_with_fds(s, bytes, fds),
            Self::Tcp(_) if !fds.is_empty() => Err(FdPassingError::Io(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "file descriptors cannot travel over TCP",
            ))),
            Self::Tcp(s) => {
                let mut s: &mio::net::TcpStream = s;
                Ok(s.write(bytes)?)
            }
        }
    }

    /// Reads bytes (and on a Unix socket, descriptors).
    pub fn read_with_fds(&self, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> Result<usize, FdPassingError> {
        match self {
            Self::Unix(s) => recv_with_fds(s, buf, fds),
            Self::Tcp(s) => {
                let mut s: &mio::net::TcpStream = s;
                Ok(s.read(buf)?)
            }
        }
    }
}
