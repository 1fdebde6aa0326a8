//! [`ConnectFuture`]: `Context::connect` for async code. Nothing in it blocks the thread
//! that polls it: the socket connects without blocking (a listener whose backlog is full
//! is tried again a millisecond later, woken by the progress thread), and the handshake
//! is answered through a slot that wakes the task.

use crate::command::{Command, ConnectSlot, RawStream};
use crate::endpoint::Endpoint;
use crate::error::ConnectError;
use crate::inner::ContextInner;
use crate::slot::{Left, Slot};
use crate::task_timer::TaskTimer;
use nix::errno::Errno;
use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType, UnixAddr};
use std::future::Future;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

/// How long a connect waits for the progress thread's answer beyond `connect_timeout`
/// (the handshake itself fails at `connect_timeout`).
pub(crate) const ANSWER_GRACE: Duration = Duration::from_secs(1);
/// How soon a connect to a listener whose backlog is full tries again.
const BACKLOG_RETRY: Duration = Duration::from_millis(1);

enum Stage {
    /// The socket is not connected yet.
    Socket,
    /// The progress thread shakes hands; the answer comes to the slot.
    Handshake(ConnectSlot),
    /// The future gave its answer.
    Done,
}

/// The future of [`Context::connect_async`](crate::Context::connect_async): an endpoint
/// once the handshake is done, within `connect_timeout` from its first poll. Dropping it
/// gives up the connection (the progress thread closes it).
#[must_use = "a future does nothing unless polled"]
pub struct ConnectFuture {
    ctx: Arc<ContextInner>,
    path: PathBuf,
    stage: Stage,
    /// When it gives up; set by the first poll.
    deadline: Option<Instant>,
    /// A wake-up at the deadline was asked for.
    deadline_armed: bool,
    timer: TaskTimer,
}

impl ConnectFuture {
    pub(crate) fn new(ctx: Arc<ContextInner>, path: PathBuf) -> Self {
        Self { ctx, path, stage: Stage::Socket, deadline: None, deadline_armed: false, timer: TaskTimer::new() }
    }

    fn io_error(&self, source: std::io::Error) -> ConnectError {
        ConnectError::Io { path: self.path.clone(), source }
    }

    /// Tries to connect the socket; `Pending` (woken soon) when the listener's backlog is
    /// full.
    fn poll_socket(&mut self, cx: &TaskContext<'_>, now: Instant) -> Poll<Result<(), ConnectError>> {
        let stream = match connect_without_blocking(&self.path) {
            Ok(Some(stream)) => stream,
            Ok(None) => {
                if self.deadline.is_some_and(|d| now >= d) {
                    return Poll::Ready(Err(ConnectError::TimedOut(self.ctx.config.connect_timeout)));
                }
                self.timer.register(cx);
                if !self.timer.wake_at(&self.ctx, now + BACKLOG_RETRY) {
                    return Poll::Ready(Err(ConnectError::ContextClosed));
                }
                return Poll::Pending;
            }
            Err(source) => return Poll::Ready(Err(self.io_error(source))),
        };
        let reply = Slot::new();
        let peer = format!("listener at {}", self.path.display());
        let adopt = Command::Adopt { stream: RawStream::Unix(stream), peer, reply: reply.clone() };
        if self.ctx.submit(adopt).is_err() {
            return Poll::Ready(Err(ConnectError::ContextClosed));
        }
        self.stage = Stage::Handshake(reply);
        Poll::Ready(Ok(()))
    }

    /// Waits for the handshake's answer, woken by it or at the deadline.
    fn poll_handshake(&mut self, cx: &TaskContext<'_>, now: Instant) -> Poll<Result<Endpoint, ConnectError>> {
        let Stage::Handshake(reply) = &self.stage else { return Poll::Pending };
        let answer = match reply.poll_take(cx) {
            Poll::Ready(answer) => answer,
            Poll::Pending if self.deadline.is_some_and(|d| now >= d) => match reply.abandon() {
                // It came just now.
                Left::Unclaimed(answer) => answer,
                Left::Taken | Left::Pending => Err(ConnectError::TimedOut(self.ctx.config.connect_timeout)),
            },
            Poll::Pending => {
                if !self.deadline_armed {
                    self.deadline_armed = true;
                    self.timer.register(cx);
                    let at = self.deadline.unwrap_or(now);
                    if !self.timer.wake_at(&self.ctx, at) {
                        return Poll::Ready(Err(ConnectError::ContextClosed));
                    }
                }
                return Poll::Pending;
            }
        };
        Poll::Ready(answer.map(|shared| Endpoint { shared, ctx: self.ctx.clone() }))
    }
}

impl Future for ConnectFuture {
    type Output = Result<Endpoint, ConnectError>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let now = Instant::now();
        let bound = this.ctx.config.connect_timeout + ANSWER_GRACE;
        this.deadline.get_or_insert(now + bound);
        if let Stage::Socket = this.stage {
            match this.poll_socket(cx, now) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => {
                    this.stage = Stage::Done;
                    return Poll::Ready(Err(e));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        let answer = this.poll_handshake(cx, now);
        if answer.is_ready() {
            this.stage = Stage::Done;
        }
        answer
    }
}

impl Drop for ConnectFuture {
    fn drop(&mut self) {
        if let Stage::Handshake(reply) = &self.stage {
            // The progress thread sees nobody waits and closes the connection; an
            // endpoint that already arrived closes as it is dropped here.
            drop(reply.abandon());
        }
    }
}

/// Connects a Unix stream socket without blocking; `None` when the listener's backlog is
/// full (a blocking connect would wait there).
fn connect_without_blocking(path: &Path) -> std::io::Result<Option<UnixStream>> {
    let address = UnixAddr::new(path).map_err(std::io::Error::from)?;
    let fd = socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC, None)
        .map_err(std::io::Error::from)?;
    match nix::sys::socket::connect(fd.as_raw_fd(), &address) {
        Ok(()) => Ok(Some(UnixStream::from(fd))),
        Err(Errno::EAGAIN) => Ok(None),
        Err(e) => Err(std::io::Error::from(e)),
    }
}
