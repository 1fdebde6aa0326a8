//! Listening sockets and accepted connections (only processes of this user may connect
//! to a Unix listener).

use super::conn::{ConnDriver, Waiter};
use super::hello::hello_for_conn;
use super::{Engine, ListenSocket, ListenerEntry};
use crate::accept_queue::AcceptQueue;
use crate::command::{RawListener, RawStream};
use ferrylink_ipc::{peer_credentials, PeerCredentials};
use ferrylink_proto::wire::{encode_frame, WireMessage};
use std::io::Write;
use std::sync::Arc;

impl Engine {
    /// Serves a listener: its socket joins the poll. When it cannot, the listener's
    /// waits end at once.
    pub(super) fn listen(&mut self, id: usize, listener: RawListener, accepted: Arc<AcceptQueue>) {
        let registry = self.poll.registry();
        let token = mio::Token(id);
        let readable = mio::Interest::READABLE;
        let registered = match listener {
            RawListener::Unix(l) => {
                let mut socket = mio::net::UnixListener::from_std(l);
                registry.register(&mut socket, token, readable).map(|_| ListenSocket::Unix(socket))
            }
            RawListener::Tcp(l) => {
                let mut socket = mio::net::TcpListener::from_std(l);
                registry.register(&mut socket, token, readable).map(|_| ListenSocket::Tcp(socket))
            }
        };
        match registered {
            Ok(socket) => {
                self.listeners.insert(id, ListenerEntry { socket, accepted });
            }
            Err(e) => {
                tracing::error!("registering a listener failed: {e}");
                accepted.close_by_context();
            }
        }
    }

    /// Stops serving a listener.
    pub(super) fn unlisten(&mut self, id: usize) {
        if let Some(mut l) = self.listeners.remove(&id) {
            let _ = match &mut l.socket {
                ListenSocket::Unix(s) => self.poll.registry().deregister(s),
                ListenSocket::Tcp(s) => self.poll.registry().deregister(s),
            };
        }
    }

    pub(super) fn accept_all(&mut self, listener_id: usize) {
        loop {
            let Some(entry) = self.listeners.get(&listener_id) else { return };
            let accepted = entry.accepted.clone();
            let result = match &entry.socket {
                ListenSocket::Unix(l) => l.accept().map(|(s, _)| {
                    let std_stream: std::os::unix::net::UnixStream = std::os::fd::OwnedFd::from(s).into();
                    RawStream::Unix(std_stream)
                }),
                ListenSocket::Tcp(l) => l.accept().map(|(s, addr)| {
                    tracing::debug!("TCP bootstrap connection from {addr}");
                    let std_stream: std::net::TcpStream = std::os::fd::OwnedFd::from(s).into();
                    RawStream::Tcp(std_stream)
                }),
            };
            let stream = match result {
                Ok(s) => s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    return;
                }
            };
            let peer = match &stream {
                RawStream::Unix(s) => match self.check_unix_peer(s) {
                    Some(peer) => peer,
                    None => continue,
                },
                RawStream::Tcp(s) => match s.peer_addr() {
                    Ok(addr) => format!("tcp peer {addr}"),
                    Err(_) => "tcp peer".into(),
                },
            };
            let id = self.next_conn_id;
            self.next_conn_id += 1;
            let local = hello_for_conn(&self.local_hello, matches!(stream, RawStream::Unix(_)), id);
            let waiter = Waiter::Acceptor(accepted);
            match ConnDriver::new(id, stream, waiter, peer, local, None, &self.config, self.poll.registry()) {
                Ok(conn) => {
                    self.conns.insert(id, conn);
                }
                Err(e) => tracing::warn!("registering an accepted socket failed: {e}"),
            }
        }
    }

    /// Who connected to a Unix listener; `None` (connection refused and dropped) when it
    /// runs as another user.
    fn check_unix_peer(&self, stream: &std::os::unix::net::UnixStream) -> Option<String> {
        let creds = match peer_credentials(stream) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("reading SO_PEERCRED failed, connection dropped: {e}");
                return None;
            }
        };
        match admit_unix_peer(creds, self.local_hello.uid) {
            Ok(peer) => Some(peer),
            Err(reason) => {
                tracing::warn!("{reason}");
                let mut s = stream;
                let _ = s.write_all(&encode_frame(&WireMessage::Reject { reason }));
                None
            }
        }
    }
}

/// Whether a Unix peer with credentials `creds` may connect to a listener serving
/// `own_uid`: its description, or the reason it is refused (it runs as another user).
fn admit_unix_peer(creds: PeerCredentials, own_uid: u32) -> Result<String, String> {
    if creds.uid != own_uid {
        return Err(format!(
            "connection from pid {} refused: it runs as uid {}, this listener serves uid {own_uid} only",
            creds.pid, creds.uid
        ));
    }
    Ok(format!("pid {} (uid {})", creds.pid, creds.uid))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::lane::conn_tag_prefix;
    use ferrylink_proto::wire::{Hello, HostIdentity, UcxInfo, WireCopies, WirePolicy, PROTOCOL_VERSION};

    fn creds(uid: u32) -> PeerCredentials {
        PeerCredentials { pid: 4242, uid, gid: uid }
    }

    #[test]
    fn a_unix_peer_of_another_uid_is_refused_with_both_uids() {
        for (peer, own) in [(65534, 0), (0, 1000), (1001, 1000), (1000, 1001)] {
            let reason = admit_unix_peer(creds(peer), own).expect_err("another user");
            let expected =
                format!("connection from pid 4242 refused: it runs as uid {peer}, this listener serves uid {own} only");
            assert_eq!(reason, expected);
        }
    }

    #[test]
    fn a_unix_peer_of_the_listeners_uid_is_admitted() {
        for uid in [0, 1000, 65534] {
            assert_eq!(admit_unix_peer(creds(uid), uid), Ok(format!("pid 4242 (uid {uid})")));
        }
    }

    /// The `Hello` of a process with UCX, saying whether the native lane is available on
    /// its machine.
    fn local_hello(native_available: bool) -> Hello {
        Hello {
            protocol_version: PROTOCOL_VERSION,
            host: HostIdentity { hostname: "sim".into(), boot_id: "boot".into() },
            uid: 1000,
            pid: 7,
            policy: WirePolicy::Auto,
            native_available,
            ucx: Some(UcxInfo { cuda_aware: true, worker_address: vec![1], tag_prefix: 2, tcp_segment: None }),
            gpus: vec![],
            peer_access: vec![],
            device_copies: WireCopies::Connector,
            control_ring: None,
        }
    }

    #[test]
    fn a_tcp_connection_never_offers_the_native_lane() {
        let tcp = hello_for_conn(&local_hello(true), false, 3);
        assert!(!tcp.native_available, "descriptors cannot travel over TCP");
        let unix = hello_for_conn(&local_hello(true), true, 3);
        assert!(unix.native_available);
        assert!(!hello_for_conn(&local_hello(false), true, 3).native_available);
        assert_eq!(tcp.ucx.unwrap().tag_prefix, conn_tag_prefix(3));
    }

    #[test]
    fn a_unix_peer_sharing_only_the_gid_is_refused() {
        let same_group = PeerCredentials { pid: 1, uid: 1001, gid: 1000 };
        assert!(admit_unix_peer(same_group, 1000).is_err());
    }
}
