//! The driver: the progress thread of a context. One thread, one mio `Poll`, commands
//! over a crossbeam channel.
//!
//! The thread owns every socket, control ring, lane and protocol core; user threads only
//! submit [`Command`]s and wait on request slots. Each loop turn handles socket
//! readiness, reads the control rings, drains commands, and gives every connection its
//! turn (deadlines, retries, lane completions), so no request outlives the configured
//! timeouts. After activity the thread spins (polling without sleeping) for a while.
//!
//! - `conn.rs`: one connection (channel, core, lane, request slots).
//! - `channel.rs`: the control channel (socket and rings).
//! - `listen.rs`: listeners, accepting, the `Hello` of a connection.
//! - `lane.rs`: opening the negotiated lane.
//! - `pacing.rs`: when a spinning thread reads the clock, polls the kernel and yields.
//! - `spans.rs`: the tracing spans of connections and transfers.
//! - `stream.rs`: Unix and TCP control streams.

mod channel;
mod conn;
mod hello;
mod lane;
mod listen;
mod onesided;
mod pacing;
mod requests;
mod spans;
mod stream;
mod timers;

use crate::accept_queue::AcceptQueue;
use crate::command::{Command, ConnectSlot, PostedRecvCommand, RawStream, WakerCell, WAKER_TOKEN};
use crate::config::Config;
use crate::device::{DeviceState, ProducerMarks};
use crate::error::{ConnectError, RecvError, SendError, TransportError};
use crate::lanes::ucx::{UcxEngine, WakeupWatch};
use crate::payload::Registry;
use conn::{ConnDriver, Waiter};
use crossbeam_channel::Receiver;
use ferrylink_memory::Message;
use ferrylink_proto::stats::ContextStats;
use ferrylink_proto::wire::Hello;
use hello::{control_rings_to_offer, hello_for_conn};
use lane::LaneContext;
use mio::net::UnixListener as MioListener;
use mio::{Events, Interest, Poll, Token};
use pacing::Pacing;
use requests::{RecvSlot, SendSlot};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How often deadlines are checked when nothing else happens.
const TICK: Duration = Duration::from_millis(50);
/// How soon a connection whose control ring is full tries again, once it stopped spinning.
const RING_FULL_RETRY: Duration = Duration::from_millis(1);
/// The mio token of the UCX worker's event fd.
const UCX_TOKEN: usize = usize::MAX;

enum ListenSocket {
    Unix(MioListener),
    Tcp(mio::net::TcpListener),
}

struct ListenerEntry {
    socket: ListenSocket,
    accepted: Arc<AcceptQueue>,
}

pub(crate) struct Engine {
    poll: Poll,
    commands: Receiver<Command>,
    config: Config,
    local_hello: Hello,
    listeners: HashMap<usize, ListenerEntry>,
    conns: HashMap<usize, ConnDriver>,
    next_conn_id: usize,
    device: Arc<DeviceState>,
    /// What connections' lanes are made from.
    lanes: LaneContext,
    /// The UCX worker (progress thread only), when UCX could be loaded.
    ucx: Option<Rc<UcxEngine>>,
    /// Whether a connection has used the UCX lane: until then the worker is neither
    /// progressed nor armed, so native-lane traffic never pays for it.
    ucx_in_use: bool,
    /// What woke the thread while the UCX worker was armed (the fd or the tick).
    ucx_wakeups: WakeupWatch,
    /// Tasks to wake at a time.
    wake_timers: timers::WakeTimers,
}

impl Engine {
    pub fn new(
        poll: Poll,
        commands: Receiver<Command>,
        config: Config,
        local_hello: Hello,
        (device, registry): (Arc<DeviceState>, Arc<Registry>),
        ucx: Option<UcxEngine>,
    ) -> Self {
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
            lanes: LaneContext::new(&config, device.clone(), registry, ucx.clone()),
            device,
            ucx,
            ucx_in_use: false,
            ucx_wakeups: WakeupWatch::default(),
            wake_timers: timers::WakeTimers::default(),
            poll,
            commands,
            config,
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
        let mut pacing = Pacing::new(last_activity);
        let mut spinning = false;
        loop {
            match self.wait_for_events(&mut events, timeout, &mut pacing, sleeping) {
                Ok(slept) => self.note_ucx_wakeup(slept, &events),
                Err(e) => {
                    tracing::error!("poll failed: {e}; the progress engine stops");
                    break;
                }
            }
            let mut active = self.dispatch(&events);
            match self.drain_commands() {
                Some(ran) => active |= ran,
                None => break,
            }
            // One time a turn: timers, deadlines and the spin window all use it (reading
            // the clock was a tenth of a host round trip's samples when every step read
            // its own), and idle spinning turns reuse it for a few turns.
            let now = pacing.turn_time(active, spinning, std::time::Instant::now);
            self.fire_wake_timers(now);
            self.progress_ucx_worker();
            let mut busy = false;
            let mut ring_blocked = false;
            for conn in self.conns.values_mut() {
                ring_blocked |= conn.ring_output_blocked();
                busy |= conn.in_span(|c| c.turn(&self.lanes, now));
            }
            self.conns.retain(|_, c| !c.is_finished());
            if active {
                last_activity = now;
            }
            // Spin (poll without sleeping) for a while after activity: the reply to what
            // just happened is then seen without a wake-up.
            spinning = now.saturating_duration_since(last_activity) < self.config.busy_poll;
            timeout = if spinning {
                Duration::ZERO
            } else if ring_blocked {
                // A full ring empties as the peer reads: look again soon.
                self.next_timeout(busy).min(RING_FULL_RETRY)
            } else {
                self.next_timeout(busy)
            };
            if let Some(until) = self.until_next_timer(now) {
                timeout = timeout.min(until);
            }
            if spinning || busy {
                // Give the core away now and then only: every yield is a system call on
                // the path of whatever this turn would have seen.
                if pacing.yield_due(now) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        self.shutdown();
    }

    /// Waits for socket events (at most `timeout`; not at all while spinning on rings).
    /// Whether it could sleep (`poll` with a timeout).
    fn wait_for_events(
        &mut self,
        events: &mut Events,
        mut timeout: Duration,
        pacing: &mut Pacing,
        sleeping: &AtomicBool,
    ) -> std::io::Result<bool> {
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
        // While spinning with every connection on control rings, the sockets carry only
        // wake-ups, descriptors (pulled when a ring message needs them) and the end of a
        // peer: ask the kernel about them every few turns only (each `epoll_wait` delays
        // the rings and the commands). A listener waits those few turns too (a server
        // keeps its listener while it serves: polling every turn for it cost each of its
        // turns a system call); a command that must see every connection made before it
        // (`Stats`) accepts them itself. With a handshake under way every turn polls.
        let rings_only = timeout == Duration::ZERO && self.conns.values().all(ConnDriver::ring_carries_messages);
        let polled = if pacing.polls_kernel(rings_only) {
            self.poll.poll(events, Some(timeout))
        } else {
            events.clear();
            Ok(())
        };
        sleeping.store(false, Ordering::SeqCst);
        if may_sleep {
            for conn in self.conns.values_mut() {
                conn.disarm_ring_sleep();
            }
        }
        match polled {
            Err(e) if e.kind() != std::io::ErrorKind::Interrupted => Err(e),
            _ => Ok(timeout > Duration::ZERO),
        }
    }

    /// Tells the UCX wake-up count what the last `poll` returned.
    fn note_ucx_wakeup(&mut self, slept: bool, events: &Events) {
        let event_fd_ready = events.iter().any(|e| e.token().0 == UCX_TOKEN);
        let other_events = events.iter().any(|e| e.token().0 != UCX_TOKEN);
        self.ucx_wakeups.woke(slept, event_fd_ready, other_events);
    }

    /// Handles socket readiness and reads the control rings; whether anything happened.
    fn dispatch(&mut self, events: &Events) -> bool {
        for event in events.iter() {
            let token = event.token().0;
            if token == WAKER_TOKEN || token == UCX_TOKEN {
                continue;
            }
            if self.listeners.contains_key(&token) {
                self.accept_all(token);
            } else if let Some(conn) = self.conns.get_mut(&token) {
                conn.in_span(|c| c.on_ready(&self.lanes));
            }
        }
        let mut active = !events.is_empty();
        for conn in self.conns.values_mut() {
            active |= conn.in_span(|c| c.poll_ring(&self.lanes));
        }
        active
    }

    /// Runs every queued command: `None` on shutdown, else whether any ran.
    fn drain_commands(&mut self) -> Option<bool> {
        let mut ran = false;
        while let Ok(cmd) = self.commands.try_recv() {
            ran = true;
            match cmd {
                Command::Shutdown => return None,
                Command::Adopt { stream, peer, reply } => self.adopt(stream, peer, reply),
                Command::Listen { id, listener, accepted } => self.listen(id, listener, accepted),
                Command::Unlisten { id } => self.unlisten(id),
                Command::Stats { reply } => {
                    // Connections queued on a listener count too, even when this turn's
                    // epoll ran before they arrived.
                    let ids: Vec<usize> = self.listeners.keys().copied().collect();
                    for id in ids {
                        self.accept_all(id);
                    }
                    let _ = reply.send(self.stats());
                }
                Command::WakeAt { at, waker } => self.wake_at(at, waker),
                Command::Send { ep, id, message, slot, producer } => self.send(ep, id, message, slot, producer),
                Command::Recv { ep, id, posted, slot } => self.recv(ep, id, posted, slot),
                Command::Cancel { ep, id } => self.with_conn(ep, |c, lanes| c.cancel(id, lanes)),
                Command::Withdraw { ep, id } => self.with_conn(ep, |c, lanes| c.withdraw(id, lanes)),
                // An endpoint that is gone takes no message back: it is dropped.
                Command::Undelivered { ep, id, message } => {
                    self.with_conn(ep, |c, lanes| c.undelivered(id, message, lanes))
                }
                Command::Expire { ep, id, at } => self.with_conn(ep, |c, _| c.expire_at(id, at)),
                Command::Close { ep } => self.with_conn(ep, |c, lanes| c.close_by_user(lanes)),
                Command::Import { ep, id, key, slot } => match self.conns.get_mut(&ep) {
                    Some(conn) => conn.in_span(|c| c.import(id, key, slot, &self.lanes)),
                    None => drop(slot.complete(Err(TransportError::EndpointClosed))),
                },
                Command::Transfer { ep, id, args, slot } => match self.conns.get_mut(&ep) {
                    Some(conn) => conn.in_span(|c| c.transfer(id, args, slot, &self.lanes)),
                    None => drop(slot.complete(Err(TransportError::EndpointClosed))),
                },
                Command::RecvNotification { ep, id, slot } => match self.conns.get_mut(&ep) {
                    Some(conn) => conn.in_span(|c| c.recv_notification(id, slot, &self.lanes)),
                    None => drop(slot.complete(Err(TransportError::EndpointClosed))),
                },
                Command::Unimport { ep, grant } => self.with_conn(ep, |c, lanes| c.unimport(grant, lanes)),
                Command::Unprepare { ep, prepared } => self.with_conn(ep, |c, lanes| c.unprepare(prepared, lanes)),
                Command::ReturnNotification { ep, data } => {
                    self.with_conn(ep, |c, lanes| c.return_notification(data, lanes))
                }
                Command::Revoke { registration } => {
                    for conn in self.conns.values_mut() {
                        conn.in_span(|c| c.revoke(registration, &self.lanes));
                    }
                }
            }
        }
        Some(ran)
    }

    /// Runs `f` on connection `ep`, if it is still there.
    fn with_conn(&mut self, ep: usize, f: impl FnOnce(&mut ConnDriver, &LaneContext)) {
        if let Some(conn) = self.conns.get_mut(&ep) {
            conn.in_span(|c| f(c, &self.lanes));
        }
    }

    fn send(&mut self, ep: usize, id: u64, message: Message, slot: SendSlot, producer: Option<ProducerMarks>) {
        tracing::trace!("send command taken");
        match self.conns.get_mut(&ep) {
            Some(conn) => conn.in_span(|c| c.send(id, message, slot, producer, &self.lanes)),
            None => {
                let closed = SendError::new(TransportError::EndpointClosed, Some(message));
                let _handle_gone = slot.complete(Err(closed));
            }
        }
    }

    fn recv(&mut self, ep: usize, id: u64, posted: PostedRecvCommand, slot: RecvSlot) {
        tracing::trace!("receive command taken");
        match self.conns.get_mut(&ep) {
            Some(conn) => conn.in_span(|c| c.recv(id, posted, slot, &self.lanes)),
            None => {
                let closed = RecvError::new(TransportError::EndpointClosed, posted.into);
                let _handle_gone = slot.complete(Err(closed));
            }
        }
    }

    fn adopt(&mut self, stream: RawStream, peer: String, reply: ConnectSlot) {
        let id = self.next_conn_id;
        self.next_conn_id += 1;
        let over_unix = matches!(stream, RawStream::Unix(_));
        let local = hello_for_conn(&self.local_hello, over_unix, id);
        let ring = if over_unix { control_rings_to_offer(&self.config) } else { None };
        let waiter = Waiter::Connector(Some(reply.clone()));
        match ConnDriver::new(id, stream, waiter, peer, local, ring, &self.config, self.poll.registry()) {
            Ok(conn) => {
                self.conns.insert(id, conn);
            }
            Err(e) => {
                let error = ConnectError::Handshake(format!("cannot register the socket: {e}"));
                let _connect_gave_up = reply.complete(Err(error));
            }
        }
    }

    /// Progresses the UCX worker, once a connection uses the UCX lane (until then it is
    /// neither progressed nor armed, so native-lane traffic never pays for it).
    fn progress_ucx_worker(&mut self) {
        let Some(ucx) = &self.ucx else { return };
        if !self.ucx_in_use {
            if !self.conns.values().any(ConnDriver::uses_ucx) {
                return;
            }
            self.ucx_in_use = true;
        }
        let mut events = 0u64;
        loop {
            match ucx.worker.progress() {
                0 => break,
                n => events += u64::from(n),
            }
        }
        self.ucx_wakeups.progressed(events);
    }

    /// Busy-poll while UCX transfers are pending (sleeping on the event fd costs
    /// bandwidth); otherwise arm the worker and sleep until something happens.
    fn next_timeout(&mut self, ucx_busy: bool) -> Duration {
        match &self.ucx {
            _ if ucx_busy => Duration::ZERO,
            Some(_) if !self.ucx_in_use => TICK,
            Some(ucx) => match ucx.worker.arm() {
                Ok(true) => {
                    self.ucx_wakeups.armed();
                    TICK
                }
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
        let mut s = ContextStats::default();
        s.listeners = self.listeners.len();
        for conn in self.conns.values() {
            conn.add_stats(&mut s);
        }
        let d = self.device.stats();
        s.ipc_mappings = d.open_mappings;
        s.ipc_mapped_bytes = d.mapped_bytes;
        s.ipc_mapping_opens = d.mapping_opens;
        s.ipc_handles_exported = d.handles_fetched;
        s.lingering_copies = d.lingering_copies;
        s.lingering_kernel_launches = d.lingering_launches;
        s.signalled_pushes = d.signalled_pushes;
        s.registrations = self.lanes.registry.held();
        s.registration_cache_hits = self.lanes.registry.cache_hits();
        s.transfer_staging_bytes = self.lanes.ucx.as_ref().map_or(0, |u| u.transfer_staging_bytes());
        s
    }

    fn shutdown(&mut self) {
        for conn in self.conns.values_mut() {
            conn.in_span(|c| c.shut_down(&self.lanes));
        }
        self.conns.clear();
        if let Some(ucx) = &self.ucx {
            if let Ok(fd) = ucx.worker.event_fd() {
                let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
                let _ = self.poll.registry().deregister(&mut mio::unix::SourceFd(&raw));
            }
        }
        for (_, listener) in self.listeners.drain() {
            listener.accepted.close_by_context();
        }
        // Requests submitted after the last drain end too.
        while let Ok(cmd) = self.commands.try_recv() {
            match cmd {
                Command::Send { message, slot, .. } => {
                    let closed = SendError::new(TransportError::ContextClosed, Some(message));
                    let _handle_gone = slot.complete(Err(closed));
                }
                Command::Recv { posted: PostedRecvCommand { into, .. }, slot, .. } => {
                    let closed = RecvError::new(TransportError::ContextClosed, into);
                    let _handle_gone = slot.complete(Err(closed));
                }
                Command::Adopt { reply, .. } => {
                    let _connect_gave_up = reply.complete(Err(ConnectError::ContextClosed));
                }
                Command::Listen { accepted, .. } => accepted.close_by_context(),
                _ => {}
            }
        }
        // Tasks waiting for a time see the context gone now.
        self.wake_timers.wake_all();
    }
}

/// Timers (`timers.rs`).
impl Engine {
    /// Wakes the task in `waker` at `at`.
    fn wake_at(&mut self, at: Instant, waker: Weak<WakerCell>) {
        self.wake_timers.add(at, waker);
    }

    /// Wakes the tasks whose time came by `now`.
    fn fire_wake_timers(&mut self, now: Instant) {
        self.wake_timers.fire(now);
    }

    /// How long after `now` the soonest timer (a wake-up or a future's deadline) is due.
    fn until_next_timer(&self, now: Instant) -> Option<Duration> {
        let deadlines = self.conns.values().filter_map(|c| c.next_deadline());
        let soonest = deadlines.chain(self.wake_timers.next()).min()?;
        Some(soonest.saturating_duration_since(now))
    }
}
