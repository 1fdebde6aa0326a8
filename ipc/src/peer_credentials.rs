//! The credentials of the process on the other end of a Unix socket.

use nix::sys::socket::{getsockopt, sockopt::PeerCredentials as PeerCredOpt};
use std::io;
use std::os::fd::AsFd;

/// Who connected: from `SO_PEERCRED`, filled in by the kernel at `connect` time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCredentials {
    /// Process id of the peer when it connected.
    pub pid: i32,
    /// Effective user id.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
}

/// Reads `SO_PEERCRED` of a connected Unix socket.
pub fn peer_credentials(socket: &impl AsFd) -> io::Result<PeerCredentials> {
    let cred = getsockopt(socket, PeerCredOpt).map_err(io::Error::from)?;
    Ok(PeerCredentials { pid: cred.pid(), uid: cred.uid(), gid: cred.gid() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn socketpair_peer_is_this_process() {
        let (a, _b) = UnixStream::pair().unwrap();
        let cred = peer_credentials(&a).unwrap();
        assert_eq!(cred.pid, std::process::id() as i32);
        assert_eq!(cred.uid, nix::unistd::geteuid().as_raw());
    }
}
