//! The progress engine: one thread, one mio `Poll`, commands over a crossbeam channel.
//!
//! The thread owns every socket and all per-connection state; user threads only submit
//! [`Command`]s and wait on request slots. Each loop turn handles socket readiness, drains
//! commands, and checks deadlines (handshakes, unacknowledged transfers), so no request
//! outlives the configured timeouts.

mod channel;
mod conn;
mod device;
mod native;
mod offers;
mod stream;
mod ucx_conn;
mod ucx_lane;

use crate::config::Config;
use crate::context::{Command, ContextStats, WAKER_TOKEN};
use crate::endpoint::EndpointShared;
use crate::error::{ConnectError, RecvError, SendError, TransportError};
use crate::wire::{encode_frame, Hello, Limits, WireMessage};
use conn::{Conn, LaneResources, Role};
use crossbeam_channel::{Receiver, Sender};
pub(crate) use device::{DeviceLane, ProducerMarks};
use ferrylink_ipc::control_ring::ControlRingMemory;
use ferrylink_ipc::peer_credentials;
use mio::net::UnixListener as MioListener;
use mio::{Events, Interest, Poll, Token};
use std::collections::HashMap;
use std::io::Write;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
pub(crate) use stream::RawStream;
pub(crate) use ucx_lane::UcxEngine;

/// How often deadlines are checked when nothing else happens.
const TICK: Duration = Duration::from_millis(50);
/// While spinning, the progress thread yields its core once per this many turns.
const YIELD_EVERY_TURNS: u32 = 8;
/// While spinning, with every connection on control rings and no listener, the progress
/// thread asks the kernel about its sockets once per this many turns.
const POLL_EVERY_TURNS_ON_RINGS: u32 = 4;
/// How soon a connection whose control ring is full tries again, once it stopped spinning.
const RING_FULL_RETRY: Duration = Duration::from_millis(1);
/// The mio token of the UCX worker's event fd.
const UCX_TOKEN: usize = usize::MAX;

/// A listening socket as user threads hand it to the progress thread.
pub(crate) enum RawListener {
    Unix(std::os::unix::net::UnixListener),
    Tcp(std::net::TcpListener),
}

enum ListenSocket {
    Unix(MioListener),
    Tcp(mio::net::TcpListener),
}

struct ListenerEntry {
    socket: ListenSocket,
    accepted: Sender<Arc<EndpointShared>>,
}

pub(crate) struct Engine {
    poll: Poll,
    commands: Receiver<Command>,
    config: Config,
    limits: Limits,
    local_hello: Hello,
    listeners: HashMap<usize, ListenerEntry>,
    conns: HashMap<usize, Conn>,
    next_conn_id: usize,
    device: Arc<DeviceLane>,
    /// The UCX worker (progress thread only), when UCX could be loaded.
    ucx: Option<Rc<UcxEngine>>,
    /// Whether a connection has used the UCX lane: until then the worker is neither
    /// progressed nor armed, so native-lane traffic never pays for it.
    ucx_in_use: bool,
}

impl Engine {
    pub fn new(
        poll: Poll,
        commands: Receiver<Command>,
        config: Config,
        local_hello: Hello,
        device: Arc<DeviceLane>,
        ucx: Option<UcxEngine>,
    ) -> Self {
        let limits = Limits::from_config(&config);
        let ucx = ucx.and_then(|u| {
            let registered = u.worker.event_fd().map_err(|e| e.to_string()).and_then(|fd| {
                let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
                poll.registry()
                    .register(&mut mio::unix::SourceFd(&raw), Token(UCX_TOKEN), Interest::READABLE)
                    .map_err(|e| format!("registering the UCX event fd: {e}"))
            });
            match registered {
                Ok(()) => Some(Rc::new(u)),
                Err(e) => {
                    tracing::warn!("the UCX lane is off: {e}");
                    None
                }
            }
        });
        Self {
            device,
            ucx,
            ucx_in_use: false,
            poll,
            commands,
            config,
            limits,
            local_hello,
            listeners: HashMap::new(),
            conns: HashMap::new(),
            // Accepted connections get ids from the top half so they never meet the ids
            // user threads hand out for connects and listeners.
            next_conn_id: usize::MAX / 2,
        }
    }

    /// The loop. `sleeping` is set while the thread may block in `poll`, so user threads
    /// wake it only then (see `ContextInner::submit`).
    pub fn run(mut self, sleeping: &AtomicBool) {
        let mut events = Events::with_capacity(256);
        let mut timeout = TICK;
        let mut last_activity = std::time::Instant::now();
        let mut turns_since_yield = 0u32;
        let mut turns_since_poll = 0u32;
        loop {
            let may_sleep = timeout > Duration::ZERO;
            if may_sleep {
                sleeping.store(true, Ordering::SeqCst);
                // Pairs with the fence in `ContextInner::submit`.
                std::sync::atomic::fence(Ordering::SeqCst);
                if !self.commands.is_empty() {
                    timeout = Duration::ZERO;
                }
                // Peers writing into control rings wake us over the socket from now on.
                for conn in self.conns.values_mut() {
                    if conn.arm_ring_sleep() {
                        timeout = Duration::ZERO;
                    }
                }
            }
            // While spinning with every connection on control rings and no listener, the
            // sockets carry only wake-ups, descriptors (pulled when a ring message needs
            // them) and the end of a peer: ask the kernel about them every few turns only
            // (each `epoll_wait` delays the rings and the commands). With a listener or a
            // handshake under way, every turn polls, so a command (`stats`, say) sees every
            // connection made before it.
            let rings_only = timeout == Duration::ZERO
                && self.listeners.is_empty()
                && self.conns.values().all(Conn::ring_carries_messages);
            turns_since_poll += 1;
            let polled = if rings_only && turns_since_poll < POLL_EVERY_TURNS_ON_RINGS {
                events.clear();
                Ok(())
            } else {
                turns_since_poll = 0;
                self.poll.poll(&mut events, Some(timeout))
            };
            sleeping.store(false, Ordering::SeqCst);
            if may_sleep {
                for conn in self.conns.values_mut() {
                    conn.disarm_ring_sleep();
                }
            }
            if let Err(e) = polled {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    tracing::error!("poll failed: {e}; the progress engine stops");
                    break;
                }
            }
            for event in events.iter() {
                let token = event.token().0;
                if token == WAKER_TOKEN || token == UCX_TOKEN {
                    continue;
                }
                if self.listeners.contains_key(&token) {
                    self.accept_all(token);
                } else if let Some(conn) = self.conns.get_mut(&token) {
                    conn.on_ready(&self.config, &self.limits, &self.local_hello);
                }
            }
            let mut active = !events.is_empty();
            for conn in self.conns.values_mut() {
                active |= conn.poll_ring(&self.config, &self.limits, &self.local_hello);
            }
            match self.drain_commands() {
                Some(ran) => active |= ran,
                None => break,
            }
            let mut gpu_wait = false;
            let mut ring_blocked = false;
            for conn in self.conns.values_mut() {
                ring_blocked |= conn.ring_output_blocked();
                conn.check_deadlines(&self.config);
                conn.retry_sends(&self.config);
                gpu_wait |= conn.awaiting_producer
                    || conn.awaiting_peer_gpu
                    || conn.offered_sends_pending()
                    || conn.push_waits_for_recv();
            }
            let ucx_busy = self.progress_ucx() || gpu_wait;
            self.conns.retain(|_, c| !c.is_finished());
            if active {
                last_activity = std::time::Instant::now();
            }
            // Spin (poll without sleeping) for a while after activity: the reply to what
            // just happened is then seen without a wake-up.
            let spinning = last_activity.elapsed() < self.config.busy_poll;
            timeout = if spinning {
                Duration::ZERO
            } else if ring_blocked {
                // A full ring empties as the peer reads: look again soon.
                self.next_timeout(ucx_busy).min(RING_FULL_RETRY)
            } else {
                self.next_timeout(ucx_busy)
            };
            if spinning || ucx_busy {
                // Give the core away now and then only: every yield is a system call on
                // the path of whatever this turn would have seen.
                turns_since_yield += 1;
                if turns_since_yield >= YIELD_EVERY_TURNS {
                    turns_since_yield = 0;
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        self.shutdown();
    }

    /// Runs every queued command: `None` on shutdown, else whether any ran.
    fn drain_commands(&mut self) -> Option<bool> {
        let mut ran = false;
        while let Ok(cmd) = self.commands.try_recv() {
            ran = true;
            match &cmd {
                Command::Send { .. } => tracing::trace!("send command taken"),
                Command::Recv { .. } => tracing::trace!("receive command taken"),
                _ => {}
            }
            match cmd {
                Command::Shutdown => return None,
                Command::Adopt { stream, peer, reply } => self.adopt(stream, peer, reply),
                Command::Listen { id, listener, accepted } => {
                    let registry = self.poll.registry();
                    let registered = match listener {
                        RawListener::Unix(l) => {
                            let mut socket = MioListener::from_std(l);
                            registry
                                .register(&mut socket, Token(id), Interest::READABLE)
                                .map(|_| ListenSocket::Unix(socket))
                        }
                        RawListener::Tcp(l) => {
                            let mut socket = mio::net::TcpListener::from_std(l);
                            registry
                                .register(&mut socket, Token(id), Interest::READABLE)
                                .map(|_| ListenSocket::Tcp(socket))
                        }
                    };
                    match registered {
                        Ok(socket) => {
                            self.listeners.insert(id, ListenerEntry { socket, accepted });
                        }
                        Err(e) => tracing::error!("registering a listener failed: {e}"),
                    }
                }
                Command::Unlisten { id } => {
                    if let Some(mut l) = self.listeners.remove(&id) {
                        let _ = match &mut l.socket {
                            ListenSocket::Unix(s) => self.poll.registry().deregister(s),
                            ListenSocket::Tcp(s) => self.poll.registry().deregister(s),
                        };
                    }
                }
                Command::Send { ep, id, message, slot, producer } => match self.conns.get_mut(&ep) {
                    Some(conn) => conn.submit_send(id, message, slot, producer, &self.config, &self.limits),
                    None => {
                        slot.complete(Err(SendError { error: TransportError::EndpointClosed, message: Some(message) }))
                    }
                },
                Command::Recv { ep, id, into, slot } => match self.conns.get_mut(&ep) {
                    Some(conn) => conn.submit_recv(id, into, slot, &self.config),
                    None => slot.complete(Err(RecvError { error: TransportError::EndpointClosed, buffers: into })),
                },
                Command::Cancel { ep, id } => {
                    if let Some(conn) = self.conns.get_mut(&ep) {
                        conn.cancel(id, &self.config);
                    }
                }
                Command::Close { ep } => {
                    if let Some(conn) = self.conns.get_mut(&ep) {
                        conn.close_by_user();
                    }
                }
                Command::Stats { reply } => {
                    let _ = reply.send(self.stats());
                }
            }
        }
        Some(ran)
    }

    fn adopt(&mut self, stream: RawStream, peer: String, reply: Sender<Result<Arc<EndpointShared>, ConnectError>>) {
        let id = self.next_conn_id;
        self.next_conn_id += 1;
        let over_unix = matches!(stream, RawStream::Unix(_));
        match Conn::new(
            id,
            stream,
            Role::Connector { reply: Some(reply.clone()) },
            peer,
            &self.config,
            self.poll.registry(),
            self.lanes(),
        ) {
            Ok(mut conn) => {
                let mut hello = hello_for_conn(&self.local_hello, over_unix, id);
                let mut fds = Vec::new();
                if let Some((memory, fd)) = over_unix.then(|| control_rings_to_offer(&self.config)).flatten() {
                    hello.control_ring = Some(memory.ring_bytes() as u64);
                    fds.push(fd);
                    conn.offer_ring(memory);
                }
                conn.queue(encode_frame(&WireMessage::Hello(hello)), fds);
                conn.flush();
                self.conns.insert(id, conn);
            }
            Err(e) => {
                let _ = reply.send(Err(ConnectError::Handshake(format!("cannot register the socket: {e}"))));
            }
        }
    }

    fn accept_all(&mut self, listener_id: usize) {
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
            let role = Role::Acceptor { accepted };
            match Conn::new(id, stream, role, peer, &self.config, self.poll.registry(), self.lanes()) {
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
        let own_uid = self.local_hello.uid;
        if creds.uid != own_uid {
            let reason = format!(
                "connection from pid {} refused: it runs as uid {}, this listener serves uid {own_uid} only",
                creds.pid, creds.uid
            );
            tracing::warn!("{reason}");
            let mut s = stream;
            let _ = s.write_all(&encode_frame(&WireMessage::Reject { reason }));
            return None;
        }
        Some(format!("pid {} (uid {})", creds.pid, creds.uid))
    }

    fn lanes(&self) -> LaneResources {
        LaneResources { device: self.device.clone(), ucx: self.ucx.clone() }
    }

    /// Progresses the UCX worker and every UCX connection; whether transfers are pending.
    fn progress_ucx(&mut self) -> bool {
        let Some(ucx) = &self.ucx else { return false };
        if !self.ucx_in_use {
            if !self.conns.values().any(|c| c.ucx.is_some()) {
                return false;
            }
            self.ucx_in_use = true;
        }
        while ucx.worker.progress() > 0 {}
        let mut busy = false;
        for conn in self.conns.values_mut() {
            busy |= conn.poll_ucx(&self.config);
        }
        busy
    }

    /// Busy-poll while UCX transfers are pending (sleeping on the event fd costs
    /// bandwidth); otherwise arm the worker and sleep until something happens.
    fn next_timeout(&self, ucx_busy: bool) -> Duration {
        match &self.ucx {
            _ if ucx_busy => Duration::ZERO,
            Some(_) if !self.ucx_in_use => TICK,
            Some(ucx) => match ucx.worker.arm() {
                Ok(true) => TICK,
                Ok(false) => Duration::ZERO,
                Err(e) => {
                    tracing::warn!("arming the UCX worker failed: {e}");
                    Duration::from_millis(1)
                }
            },
            None => TICK,
        }
    }

    fn stats(&self) -> ContextStats {
        let mut s = ContextStats { listeners: self.listeners.len(), ..Default::default() };
        for conn in self.conns.values() {
            conn.add_stats(&mut s);
        }
        let d = self.device.stats();
        s.ipc_mappings = d.open_mappings;
        s.ipc_mapped_bytes = d.mapped_bytes;
        s.ipc_mapping_opens = d.mapping_opens;
        s.ipc_handles_exported = d.handles_fetched;
        s
    }

    fn shutdown(&mut self) {
        for conn in self.conns.values_mut() {
            conn.fail(TransportError::ContextClosed);
        }
        self.conns.clear();
        if let Some(ucx) = &self.ucx {
            if let Ok(fd) = ucx.worker.event_fd() {
                let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
                let _ = self.poll.registry().deregister(&mut mio::unix::SourceFd(&raw));
            }
        }
        self.listeners.clear();
        // Requests submitted after the last drain end too.
        while let Ok(cmd) = self.commands.try_recv() {
            match cmd {
                Command::Send { message, slot, .. } => {
                    slot.complete(Err(SendError { error: TransportError::ContextClosed, message: Some(message) }))
                }
                Command::Recv { into, slot, .. } => {
                    slot.complete(Err(RecvError { error: TransportError::ContextClosed, buffers: into }))
                }
                Command::Adopt { reply, .. } => {
                    let _ = reply.send(Err(ConnectError::ContextClosed));
                }
                _ => {}
            }
        }
    }
}

/// Control rings a connecting side offers with its `Hello`, and the descriptor to pass;
/// `None` when they are turned off or cannot be made (the socket then carries everything).
fn control_rings_to_offer(config: &Config) -> Option<(Arc<ControlRingMemory>, std::os::fd::OwnedFd)> {
    if config.control_ring_bytes == 0 {
        return None;
    }
    let made = ControlRingMemory::create(config.control_ring_bytes)
        .map_err(|e| e.to_string())
        .and_then(|memory| Ok((memory.fd().try_clone_to_owned().map_err(|e| e.to_string())?, memory)));
    match made {
        Ok((fd, memory)) => Some((memory, fd)),
        Err(e) => {
            tracing::warn!("no control rings for this connection ({e}); the socket carries everything");
            None
        }
    }
}

/// What this side says about itself on connection `conn_id`: over TCP the native lane is
/// impossible (descriptors cannot travel), whatever the machine; the UCX tag prefix is
/// the connection's own.
pub(crate) fn hello_for_conn(local: &Hello, over_unix: bool, conn_id: usize) -> Hello {
    let mut hello = Hello { native_available: local.native_available && over_unix, ..local.clone() };
    if let Some(ucx) = &mut hello.ucx {
        ucx.tag_prefix = conn_tag_prefix(conn_id);
    }
    hello
}

/// The UCX tag prefix of a connection: unique among the connections alive at once.
pub(crate) fn conn_tag_prefix(conn_id: usize) -> u16 {
    conn_id as u16
}
