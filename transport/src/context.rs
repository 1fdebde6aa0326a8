//! [`Context`]: one progress thread serving many endpoints and listeners.

use crate::command::{Command, RawStream, WAKER_TOKEN};
use crate::config::{Config, LanePolicy};
use crate::connect_future::{ConnectFuture, ANSWER_GRACE};
use crate::device::DeviceState;
use crate::driver::Engine;
use crate::endpoint::Endpoint;
use crate::error::{ConnectError, ContextError, StatsError};
use crate::inner::ContextInner;
use crate::lanes::ucx::UcxEngine;
use crate::payload::Registry;
use crate::slot::{Left, Slot};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use ferrylink_memory::MakeRoom;
use ferrylink_proto::stats::ContextStats;
use ferrylink_proto::wire::{GpuInfo, Hello, HostIdentity, UcxInfo, PROTOCOL_VERSION};
use mio::{Poll, Waker};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Numbers the contexts of this process, for their tracing spans.
static CONTEXTS_MADE: AtomicU64 = AtomicU64::new(0);

/// Owns the progress thread. Cheap to clone; endpoints and listeners keep it alive.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

impl Context {
    /// A context configured from the environment (`FERRYLINK_TRANSPORT`, …).
    pub fn from_env() -> Result<Self, ContextError> {
        Self::new(Config::from_env()?)
    }

    /// A context with `config`.
    pub fn new(config: Config) -> Result<Self, ContextError> {
        Self::build(config, None)
    }

    /// A context whose receive path asks `make_room` (a `ferrylink_spill::SpillStore`)
    /// for room before it lands an incoming device frame, so a transfer that would exceed
    /// the device budget evicts older entries instead of failing.
    pub fn with_make_room(config: Config, make_room: Arc<dyn MakeRoom>) -> Result<Self, ContextError> {
        Self::build(config, Some(make_room))
    }

    fn build(config: Config, make_room: Option<Arc<dyn MakeRoom>>) -> Result<Self, ContextError> {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), mio::Token(WAKER_TOKEN))?;
        let (tx, rx): (Sender<Command>, Receiver<Command>) = crossbeam_channel::unbounded();
        let (ready_tx, ready_rx) = crossbeam_channel::bounded(1);
        let next_id = Arc::new(AtomicUsize::new(WAKER_TOKEN + 1));
        let engine_sleeping = Arc::new(AtomicBool::new(true));
        let device = Arc::new(DeviceState::new(&config, make_room));
        let thread_device = device.clone();
        let registry = Registry::new(random_u64);
        let thread_registry = registry.clone();
        let thread_sleeping = engine_sleeping.clone();
        let thread_config = config.clone();
        // The progress thread stays in the context's span (a child of the caller's), so
        // every event of its connections carries it.
        let number = CONTEXTS_MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let span = tracing::info_span!("context", context = number, policy = %config.lane_policy);
        // The UCX worker belongs to the progress thread: it is made there, and the
        // handshake introduction (which carries its address) comes back from there.
        let thread = std::thread::Builder::new().name("ferrylink-progress".into()).spawn(move || {
            let _in_context = span.entered();
            let ucx = match start_ucx(&thread_config) {
                Ok(ucx) => ucx,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let hello = local_hello(&thread_config, ucx.as_ref());
            let _ = ready_tx.send(Ok(hello.clone()));
            Engine::new(poll, rx, thread_config, hello, (thread_device, thread_registry), ucx).run(&thread_sleeping);
        })?;
        let local_hello = match ready_rx.recv() {
            Ok(Ok(hello)) => hello,
            Ok(Err(reason)) => {
                let _ = thread.join();
                return Err(ContextError::UcxUnavailable(reason));
            }
            Err(_) => {
                let _ = thread.join();
                return Err(ContextError::Io(std::io::Error::other("the progress thread ended while starting")));
            }
        };
        Ok(Self {
            inner: Arc::new(ContextInner {
                config,
                local_hello,
                commands: tx,
                waker,
                device,
                registry,
                engine_sleeping,
                next_id,
                next_request: AtomicU64::new(1),
                thread: Mutex::new(Some(thread)),
            }),
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// What this side says about itself in handshakes.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn local_hello(&self) -> &Hello {
        &self.inner.local_hello
    }

    /// Connects to a listener's Unix socket and negotiates a lane (bounded by
    /// `connect_timeout`).
    pub fn connect(&self, path: impl AsRef<Path>) -> Result<Endpoint, ConnectError> {
        let path = path.as_ref().to_path_buf();
        let stream = UnixStream::connect(&path).map_err(|source| ConnectError::Io { path: path.clone(), source })?;
        self.adopt(RawStream::Unix(stream), format!("listener at {}", path.display()))
    }

    /// [`Context::connect`] as a future, for async code: it never blocks the thread that
    /// polls it and needs no particular runtime. Bounded by `connect_timeout` (plus a
    /// second for the progress thread's answer) from its first poll.
    pub fn connect_async(&self, path: impl AsRef<Path>) -> ConnectFuture {
        ConnectFuture::new(self.inner.clone(), path.as_ref().to_path_buf())
    }

    /// Connects to a listener's TCP address (another machine: the UCX lane) and
    /// negotiates a lane. Only control messages travel on this TCP connection.
    pub fn connect_tcp(&self, addr: impl ToSocketAddrs) -> Result<Endpoint, ConnectError> {
        let timeout = self.inner.config.connect_timeout;
        let mut last = None;
        let addrs = addr.to_socket_addrs().map_err(|source| ConnectError::Io { path: PathBuf::from("?"), source })?;
        for a in addrs {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(stream) => return self.adopt(RawStream::Tcp(stream), format!("listener at tcp {a}")),
                Err(e) => last = Some((a, e)),
            }
        }
        let (a, source) = last.unwrap_or_else(|| {
            (SocketAddr::from(([0, 0, 0, 0], 0)), std::io::Error::new(std::io::ErrorKind::NotFound, "no address"))
        });
        Err(ConnectError::Io { path: PathBuf::from(a.to_string()), source })
    }

    fn adopt(&self, stream: RawStream, peer: String) -> Result<Endpoint, ConnectError> {
        let reply = Slot::new();
        let adopt = Command::Adopt { stream, peer, reply: reply.clone() };
        self.inner.submit(adopt).map_err(|_| ConnectError::ContextClosed)?;
        let timeout = self.inner.config.connect_timeout;
        let answer = reply.take_until(Instant::now() + timeout + ANSWER_GRACE, Duration::ZERO);
        // Giving up tells the progress thread nobody waits (it closes the connection);
        // an answer that came just now is still taken.
        let answer = answer.or_else(|| match reply.abandon() {
            Left::Unclaimed(answer) => Some(answer),
            Left::Taken | Left::Pending => None,
        });
        match answer {
            Some(Ok(shared)) => Ok(Endpoint { shared, ctx: self.inner.clone() }),
            Some(Err(e)) => Err(e),
            None => Err(ConnectError::TimedOut(timeout)),
        }
    }

    /// What the context holds right now, as its progress thread counts it. Fails closed:
    /// a progress thread that has stopped ([`StatsError::ContextClosed`]) or does not
    /// answer within `request_timeout` ([`StatsError::NoAnswer`]) gives an error, never a
    /// snapshot of zeros.
    pub fn stats(&self) -> Result<ContextStats, StatsError> {
        let (reply, answer) = crossbeam_channel::bounded(1);
        self.inner.submit(Command::Stats { reply }).map_err(|_| StatsError::ContextClosed)?;
        let bound = self.inner.config.request_timeout;
        answer.recv_timeout(bound).map_err(|e| match e {
            // The progress thread dropped the request unanswered: it is shutting down.
            RecvTimeoutError::Disconnected => StatsError::ContextClosed,
            RecvTimeoutError::Timeout => StatsError::NoAnswer(bound),
        })
    }
}

/// UCX for the lane policy: not loaded for `native`, optional for `auto`, required for
/// `ucx` (a forced lane that cannot work is an error, never a silent fallback).
fn start_ucx(config: &Config) -> Result<Option<UcxEngine>, String> {
    match config.lane_policy {
        LanePolicy::Native => Ok(None),
        LanePolicy::Auto => match UcxEngine::start(&config.ucx_config()) {
            Ok(ucx) => Ok(Some(ucx)),
            Err(e) => {
                tracing::debug!("UCX lane unavailable: {e}");
                Ok(None)
            }
        },
        LanePolicy::Ucx => UcxEngine::start(&config.ucx_config())
            .map(Some)
            .map_err(|e| format!("FERRYLINK_TRANSPORT=ucx was forced, but UCX cannot be used: {e}")),
    }
}

fn local_hello(config: &Config, ucx: Option<&UcxEngine>) -> Hello {
    use ferrylink_memory::cuda::{can_access_peer, Gpu};
    let all = if ferrylink_memory::cuda::device_count() > 0 { Gpu::all().unwrap_or_default() } else { Vec::new() };
    let gpus = all.iter().map(|g| GpuInfo { ordinal: g.ordinal() as u32, uuid: *g.uuid() }).collect();
    let mut peer_access = Vec::new();
    for a in &all {
        for b in &all {
            if a == b || can_access_peer(a, b).unwrap_or(false) {
                peer_access.push((a.ordinal() as u32, b.ordinal() as u32));
            }
        }
    }
    Hello {
        protocol_version: PROTOCOL_VERSION,
        host: this_machine(),
        uid: nix::unistd::geteuid().as_raw(),
        pid: std::process::id(),
        policy: config.lane_policy.into(),
        native_available: true,
        ucx: ucx.map(|u| UcxInfo {
            cuda_aware: u.cuda_aware,
            worker_address: u.address.clone(),
            tag_prefix: 0,
            tcp_segment: u.tcp_segment.clone(),
        }),
        gpus,
        peer_access,
        device_copies: config.device_copies.into(),
        control_ring: None,
    }
}

/// This machine's identity. A missing boot id (not Linux /proc) reads as empty, which
/// still compares equal on one machine.
fn this_machine() -> HostIdentity {
    let hostname = nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_default();
    let boot_id =
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_owned()).unwrap_or_default();
    HostIdentity { hostname, boot_id }
}

/// 8 random bytes for registration keys: the kernel's, or (if it cannot be read) a
/// counter under the process's random SipHash keys.
fn random_u64() -> u64 {
    use std::io::Read;
    let mut b = [0u8; 8];
    let from_kernel = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    if from_kernel.is_ok() {
        return u64::from_le_bytes(b);
    }
    ferrylink_proto::region::counted_ids()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native_context(request_timeout: Duration) -> Context {
        Context::new(Config { lane_policy: LanePolicy::Native, request_timeout, ..Config::default() }).unwrap()
    }

    #[test]
    fn stats_of_a_hung_progress_thread_is_no_answer_not_zeros() {
        let ctx = native_context(Duration::from_millis(200));
        assert_eq!(ctx.stats(), Ok(ContextStats::default()), "an idle context holds nothing");
        // A reply channel without room: the progress thread blocks answering it until
        // `held` receives or goes, and answers nothing else meanwhile.
        let (reply, held) = crossbeam_channel::bounded(0);
        assert!(ctx.inner.submit(Command::Stats { reply }).is_ok());
        let started = Instant::now();
        assert_eq!(ctx.stats(), Err(StatsError::NoAnswer(Duration::from_millis(200))));
        assert!(started.elapsed() >= Duration::from_millis(200), "gave up after {:?}", started.elapsed());
        drop(held);
        assert_eq!(ctx.stats(), Ok(ContextStats::default()), "answers again once it runs");
    }

    #[test]
    fn stats_of_a_stopped_progress_thread_is_context_closed() {
        let ctx = native_context(Duration::from_secs(5));
        assert!(ctx.inner.submit(Command::Shutdown).is_ok());
        let thread = ctx.inner.thread.lock().unwrap().take().expect("the progress thread");
        thread.join().unwrap();
        assert_eq!(ctx.stats(), Err(StatsError::ContextClosed));
    }
}
