//! [`Listener`]: accepts peers on a Unix socket in a directory only this user can enter;
//! [`AcceptFuture`]: the same wait for async code.

use crate::accept_queue::{AcceptQueue, NoEndpoint};
use crate::command::Command;
use crate::command::RawListener;
use crate::context::Context;
use crate::endpoint::Endpoint;
use crate::error::{AcceptError, ListenError};
use crate::inner::ContextInner;
use crate::task_timer::TaskTimer;
use std::future::Future;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

/// Accepts connections. Peers of another user are refused at accept (the kernel's
/// `SO_PEERCRED` says who connected); the socket file is removed on drop.
pub struct Listener {
    id: usize,
    path: PathBuf,
    tcp: Option<std::net::SocketAddr>,
    accepted: Arc<AcceptQueue>,
    ctx: Arc<ContextInner>,
}

impl Listener {
    /// Listens at `path`. Its directory is created with mode 0700 when missing; an existing
    /// directory must belong to this user and be closed to everyone else. A stale socket
    /// file (nobody listening) is replaced.
    pub fn bind(ctx: &Context, path: impl AsRef<Path>) -> Result<Self, ListenError> {
        let path = path.as_ref().to_path_buf();
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        ensure_private_dir(dir)?;
        remove_stale_socket(&path)?;
        let io_err = |source| ListenError::Io { path: path.clone(), source };
        let listener = UnixListener::bind(&path).map_err(io_err)?;
        listener.set_nonblocking(true).map_err(io_err)?;
        let accepted = AcceptQueue::new();
        let id = ctx.inner.next_object_id();
        let listen = Command::Listen { id, listener: RawListener::Unix(listener), accepted: accepted.clone() };
        if ctx.inner.submit(listen).is_err() {
            let _ = std::fs::remove_file(&path);
            return Err(ListenError::ContextClosed);
        }
        Ok(Self { id, path, tcp: None, accepted, ctx: ctx.inner.clone() })
    }

    /// Listens on a TCP address for peers on other machines (UCX lane). Only control
    /// messages travel on the TCP connection; data goes through UCX. Port 0 picks a free
    /// port: see [`Listener::tcp_addr`].
    pub fn bind_tcp(ctx: &Context, addr: impl std::net::ToSocketAddrs) -> Result<Self, ListenError> {
        let io_err = |source| ListenError::Io { path: PathBuf::from("tcp"), source };
        let listener = std::net::TcpListener::bind(addr).map_err(io_err)?;
        listener.set_nonblocking(true).map_err(io_err)?;
        let local = listener.local_addr().map_err(io_err)?;
        let accepted = AcceptQueue::new();
        let id = ctx.inner.next_object_id();
        let listen = Command::Listen { id, listener: RawListener::Tcp(listener), accepted: accepted.clone() };
        if ctx.inner.submit(listen).is_err() {
            return Err(ListenError::ContextClosed);
        }
        Ok(Self { id, path: PathBuf::new(), tcp: Some(local), accepted, ctx: ctx.inner.clone() })
    }

    /// The TCP address of a listener made with [`Listener::bind_tcp`].
    pub fn tcp_addr(&self) -> Option<std::net::SocketAddr> {
        self.tcp
    }

    /// Listens at a fresh socket in this user's private runtime directory
    /// (`$XDG_RUNTIME_DIR/ferrylink` or `/tmp/ferrylink-<uid>`).
    pub fn bind_private(ctx: &Context) -> Result<Self, ListenError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("listener-{}-{n}.sock", std::process::id());
        Self::bind(ctx, private_runtime_dir().join(name))
    }

    /// The socket path peers connect to (empty for a TCP listener).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits for the next peer, at most the context's `request_timeout`.
    pub fn accept(&self) -> Result<Endpoint, AcceptError> {
        self.accept_timeout(self.ctx.config.request_timeout)
    }

    /// Waits for the next peer, at most `timeout`.
    pub fn accept_timeout(&self, timeout: Duration) -> Result<Endpoint, AcceptError> {
        match self.accepted.pop_until(Instant::now() + timeout) {
            Ok(shared) => Ok(Endpoint { shared, ctx: self.ctx.clone() }),
            Err(NoEndpoint::TimedOut) => Err(AcceptError::TimedOut(timeout)),
            Err(NoEndpoint::ContextClosed) => Err(AcceptError::ContextClosed),
        }
    }

    /// The next peer, as a future: the same wait as [`Listener::accept`] (at most the
    /// context's `request_timeout` from its first poll), without blocking the thread
    /// that polls it; it needs no particular runtime. Dropping it accepts nothing: an
    /// endpoint that arrives later waits for the next accept.
    pub fn accept_async(&self) -> AcceptFuture<'_> {
        AcceptFuture { listener: self, deadline: None, timer: TaskTimer::new() }
    }
}

/// The future of [`Listener::accept_async`].
#[must_use = "a future does nothing unless polled"]
pub struct AcceptFuture<'l> {
    listener: &'l Listener,
    /// Set by the first poll that found no peer.
    deadline: Option<Instant>,
    timer: TaskTimer,
}

impl Future for AcceptFuture<'_> {
    type Output = Result<Endpoint, AcceptError>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let listener = this.listener;
        match listener.accepted.poll_pop(cx) {
            Poll::Ready(Ok(shared)) => return Poll::Ready(Ok(Endpoint { shared, ctx: listener.ctx.clone() })),
            Poll::Ready(Err(_)) => return Poll::Ready(Err(AcceptError::ContextClosed)),
            Poll::Pending => {}
        }
        let timeout = listener.ctx.config.request_timeout;
        let now = Instant::now();
        this.timer.register(cx);
        match this.deadline {
            Some(deadline) if now >= deadline => return Poll::Ready(Err(AcceptError::TimedOut(timeout))),
            Some(_) => {}
            None => {
                this.deadline = Some(now + timeout);
                if !this.timer.wake_at(&listener.ctx, now + timeout) {
                    return Poll::Ready(Err(AcceptError::ContextClosed));
                }
            }
        }
        Poll::Pending
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.accepted.close_by_listener();
        let _ = self.ctx.submit(Command::Unlisten { id: self.id });
        if self.tcp.is_some() {
            return;
        }
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!("removing listener socket {} failed: {e}", self.path.display());
        }
    }
}

/// This user's private directory for listener sockets.
pub fn private_runtime_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir).join("ferrylink"),
        _ => std::env::temp_dir().join(format!("ferrylink-{}", nix::unistd::geteuid())),
    }
}

fn ensure_private_dir(dir: &Path) -> Result<(), ListenError> {
    let io_err = |source| ListenError::Io { path: dir.to_path_buf(), source };
    if !dir.exists() {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io_err)?;
    }
    let meta = std::fs::metadata(dir).map_err(io_err)?;
    let uid = nix::unistd::geteuid().as_raw();
    let mode = meta.mode() & 0o777;
    if meta.uid() != uid || mode & 0o077 != 0 {
        return Err(ListenError::InsecureDirectory { path: dir.to_path_buf(), uid, owner: meta.uid(), mode });
    }
    Ok(())
}

fn remove_stale_socket(path: &Path) -> Result<(), ListenError> {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return Ok(()) };
    let in_use = || ListenError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::AddrInUse, "a listener is already serving this socket"),
    };
    if !meta.file_type().is_socket() {
        return Err(ListenError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::AlreadyExists, "a file that is not a socket is in the way"),
        });
    }
    if UnixStream::connect(path).is_ok() {
        return Err(in_use());
    }
    std::fs::remove_file(path).map_err(|source| ListenError::Io { path: path.to_path_buf(), source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn open_directories_are_refused_and_private_ones_created() {
        let base = tempfile::tempdir().unwrap();
        let open = base.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = ensure_private_dir(&open).unwrap_err();
        assert!(matches!(err, ListenError::InsecureDirectory { mode: 0o755, .. }), "{err}");
        let fresh = base.path().join("a/b");
        ensure_private_dir(&fresh).unwrap();
        assert_eq!(std::fs::metadata(&fresh).unwrap().mode() & 0o777, 0o700);
    }

    #[test]
    fn stale_sockets_are_replaced_live_ones_and_files_are_not() {
        let base = tempfile::tempdir().unwrap();
        let path = base.path().join("s.sock");
        let live = UnixListener::bind(&path).unwrap();
        assert!(remove_stale_socket(&path).is_err());
        drop(live);
        remove_stale_socket(&path).unwrap();
        assert!(!path.exists());
        std::fs::write(&path, b"x").unwrap();
        assert!(remove_stale_socket(&path).is_err());
    }
}
