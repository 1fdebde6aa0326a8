//! File descriptors over a Unix stream socket (`SCM_RIGHTS`).
//!
//! On a stream socket the kernel delivers the descriptors attached to a `sendmsg` with the
//! first bytes of that call and never merges two calls' descriptors into one `recvmsg`, so
//! a reader that queues received fds in order and lets each protocol message claim the
//! number it declares sees them in the order they were sent.

use nix::errno::Errno;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use thiserror::Error;

/// The most descriptors one `recvmsg` accepts; more are a protocol violation (`MSG_CTRUNC`).
pub const MAX_FDS_PER_CALL: usize = 32;

/// Errors of fd passing.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum FdPassingError {
    /// The socket failed.
    #[error("socket I/O failed: {0}")]
    Io(#[from] std::io::Error),
    /// The peer attached more descriptors than fit: the kernel dropped some.
    #[error("control data truncated (MSG_CTRUNC): the peer sent more than {MAX_FDS_PER_CALL} descriptors at once")]
    ControlTruncated,
    /// Too many descriptors asked to be sent in one call.
    #[error("{0} descriptors in one call; at most {MAX_FDS_PER_CALL}")]
    TooManyFds(usize),
}

/// Writes `bytes` with `fds` attached. Returns the bytes written (possibly fewer than
/// given, on a non-blocking socket); the fds travel with the first byte, so a caller that
/// writes the rest later must not attach them again.
pub fn send_with_fds(socket: &impl AsFd, bytes: &[u8], fds: &[RawFd]) -> Result<usize, FdPassingError> {
    if fds.len() > MAX_FDS_PER_CALL {
        return Err(FdPassingError::TooManyFds(fds.len()));
    }
    let iov = [IoSlice::new(bytes)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    loop {
        match sendmsg::<()>(socket.as_fd().as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
            Ok(n) => return Ok(n),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(std::io::Error::from(e).into()),
        }
    }
}

/// Reads into `buf`, appending every received descriptor to `fds` (owned at once, with
/// close-on-exec set atomically). Returns the bytes read; 0 means the peer closed.
pub fn recv_with_fds(socket: &impl AsFd, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> Result<usize, FdPassingError> {
    let mut cmsg_space = nix::cmsg_space!([RawFd; MAX_FDS_PER_CALL]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = loop {
        match recvmsg::<()>(socket.as_fd().as_raw_fd(), &mut iov, Some(&mut cmsg_space), MsgFlags::MSG_CMSG_CLOEXEC) {
            Ok(m) => break m,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(std::io::Error::from(e).into()),
        }
    };
    let truncated = msg.flags.contains(MsgFlags::MSG_CTRUNC);
    for cmsg in msg.cmsgs().map_err(std::io::Error::from)? {
        if let ControlMessageOwned::ScmRights(raw) = cmsg {
            for fd in raw {
                // SAFETY: the kernel just installed this descriptor in our table for us;
                // nothing else owns it, so OwnedFd takes sole ownership (closes on drop).
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    if truncated {
        return Err(FdPassingError::ControlTruncated);
    }
    Ok(msg.bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::unix::net::UnixStream;

    /// A connected pair whose reads give up after a few seconds: a send that put nothing
    /// on the wire fails its test instead of hanging it.
    fn pair() -> (UnixStream, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        b.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        (a, b)
    }

    #[test]
    fn fds_arrive_with_their_bytes_and_are_usable() {
        let (a, b) = pair();
        let mut file = tempfile_with(b"hello fd");
        let n = send_with_fds(&a, b"x", &[file.as_raw_fd()]).unwrap();
        assert_eq!(n, 1);
        let mut buf = [0u8; 8];
        let mut fds = Vec::new();
        assert_eq!(recv_with_fds(&b, &mut buf, &mut fds).unwrap(), 1);
        assert_eq!(fds.len(), 1);
        let mut received = std::fs::File::from(fds.pop().unwrap());
        received.rewind().unwrap();
        let mut s = String::new();
        received.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello fd");
        file.flush().unwrap();
    }

    #[test]
    fn too_many_fds_are_refused_before_sending() {
        let (a, _b) = UnixStream::pair().unwrap();
        let fds = vec![0; MAX_FDS_PER_CALL + 1];
        assert!(matches!(send_with_fds(&a, b"x", &fds), Err(FdPassingError::TooManyFds(_))));
    }

    #[test]
    fn exactly_the_most_fds_per_call_travel_in_one_call() {
        let (a, b) = pair();
        let file = tempfile_with(b"many");
        let fds = vec![file.as_raw_fd(); MAX_FDS_PER_CALL];
        assert_eq!(send_with_fds(&a, b"x", &fds).unwrap(), 1);
        let mut received = Vec::new();
        assert_eq!(recv_with_fds(&b, &mut [0u8; 4], &mut received).unwrap(), 1);
        assert_eq!(received.len(), MAX_FDS_PER_CALL);
    }

    #[test]
    fn closed_peer_reads_zero() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(a);
        let mut buf = [0u8; 4];
        let mut fds = Vec::new();
        assert_eq!(recv_with_fds(&b, &mut buf, &mut fds).unwrap(), 0);
    }

    fn tempfile_with(bytes: &[u8]) -> std::fs::File {
        let path = std::env::temp_dir().join(format!("ferrylink-fd-test-{}", std::process::id()));
        let mut f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        f.write_all(bytes).unwrap();
        f
    }
}
