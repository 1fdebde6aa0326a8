//! Two cores wired to each other through the codec, a virtual clock, and collectors of
//! what each side's requests completed with.

use super::sim::{Mem, SimLane};
use crate::connection::lane::CoreLane;
use crate::connection::{Connection, Output, Phase, PushRole, Role, Settings};
use crate::error::{ConnectError, RecvError, SendError, TransportError};
use crate::lane_kind::LaneKind;
use crate::policy::LanePolicy;
use crate::test_payload::TestPayload;
use crate::wire::{
    decode_frame, encode_frame, Hello, HostIdentity, Limits, UcxInfo, WireCopies as DeviceCopies, WireMessage,
};
use ferrylink_memory::{Frame, Message};
use std::collections::{BTreeMap, VecDeque};
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

/// Time that only moves when a test says so.
#[derive(Clone, Copy)]
pub struct Clock {
    base: Instant,
    offset: Duration,
}

impl Clock {
    pub fn new() -> Self {
        Self { base: Instant::now(), offset: Duration::ZERO }
    }

    pub fn now(&self) -> Instant {
        self.base + self.offset
    }

    pub fn advance(&mut self, by: Duration) {
        self.offset += by;
    }
}

pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

pub fn settings() -> Settings {
    Settings {
        request_timeout: REQUEST_TIMEOUT,
        connect_timeout: CONNECT_TIMEOUT,
        unexpected_max_bytes: 1 << 20,
        push_offer_max_bytes: 1 << 20,
        limits: limits(),
    }
}

pub fn limits() -> Limits {
    Limits::default()
}

/// A `Hello` of a process on one simulated machine: the native lane unless `ucx`.
pub fn hello(pid: u32, ucx: bool, copies: DeviceCopies) -> Hello {
    Hello {
        protocol_version: crate::wire::PROTOCOL_VERSION,
        host: HostIdentity { hostname: "sim".into(), boot_id: "boot".into() },
        uid: 1000,
        pid,
        policy: LanePolicy::Auto.into(),
        native_available: !ucx,
        ucx: ucx.then(|| UcxInfo { cuda_aware: true, worker_address: vec![1], tag_prefix: 2, tcp_segment: None }),
        gpus: vec![],
        peer_access: vec![],
        device_copies: copies,
        control_ring: None,
    }
}

/// One side: its core, its lane, what reached it, what came out.
pub struct Side {
    pub core: Connection<TestPayload>,
    pub lane: SimLane,
    /// Encoded frames from the peer with their descriptors, oldest first.
    pub inbox: VecDeque<(Vec<u8>, Vec<OwnedFd>)>,
    pub fds: VecDeque<OwnedFd>,
    pub sends: BTreeMap<u64, Vec<Result<Message, SendError<Message>>>>,
    pub recvs: BTreeMap<u64, Vec<Result<Message, RecvError<Frame>>>>,
    /// Receive ids in the order they completed.
    pub recv_log: Vec<u64>,
    pub imports: BTreeMap<u64, Vec<Result<crate::region::ImportedRegion, TransportError>>>,
    pub transfers: BTreeMap<u64, Vec<Result<(), TransportError>>>,
    pub notifications: BTreeMap<u64, Vec<Result<Vec<u8>, TransportError>>>,
    pub established: Option<(LaneKind, PushRole)>,
    pub handshake_failed: Vec<ConnectError>,
    pub closed: usize,
    /// `ClosedAwaitingHangup` outputs: ended, waiting for the peer to hang up.
    pub half_closed: usize,
    /// The peer does not hang up by itself after `ClosedAwaitingHangup` (tests of the
    /// wait call [`Pair::hang_up_to`] or let the timeout pass).
    pub manual_hangup: bool,
    pub use_ring: usize,
    /// Every message this side transmitted, decoded back.
    pub sent: Vec<WireMessage>,
    /// Every message this side handled.
    pub handled: Vec<WireMessage>,
    /// Acceptor: whether the driver maps offered control rings.
    pub take_rings: bool,
    /// `OpenLane` is answered with this error instead of opening.
    pub open_error: Option<String>,
    /// `OpenLane` is left unanswered (see [`Pair::open_deferred`]).
    pub defer_open: bool,
    pub deferred_open: Option<(LaneKind, Hello)>,
}

impl Side {
    fn new(core: Connection<TestPayload>, mem: Mem) -> Self {
        Self {
            core,
            lane: SimLane::new(mem),
            inbox: VecDeque::new(),
            fds: VecDeque::new(),
            sends: BTreeMap::new(),
            recvs: BTreeMap::new(),
            recv_log: Vec::new(),
            imports: BTreeMap::new(),
            transfers: BTreeMap::new(),
            notifications: BTreeMap::new(),
            established: None,
            handshake_failed: Vec::new(),
            closed: 0,
            half_closed: 0,
            manual_hangup: false,
            use_ring: 0,
            sent: Vec::new(),
            handled: Vec::new(),
            take_rings: true,
            open_error: None,
            defer_open: false,
            deferred_open: None,
        }
    }

    /// The only completion of send `id`.
    pub fn send_result(&self, id: u64) -> &Result<Message, SendError<Message>> {
        let all = self.sends.get(&id).unwrap_or_else(|| panic!("send {id} did not complete"));
        assert_eq!(all.len(), 1, "send {id} completed {} times", all.len());
        &all[0]
    }

    /// The only completion of receive `id`.
    pub fn recv_result(&self, id: u64) -> &Result<Message, RecvError<Frame>> {
        let all = self.recvs.get(&id).unwrap_or_else(|| panic!("receive {id} did not complete"));
        assert_eq!(all.len(), 1, "receive {id} completed {} times", all.len());
        &all[0]
    }

    /// Kinds of the messages this side transmitted.
    pub fn sent_kinds(&self) -> Vec<&'static str> {
        self.sent.iter().map(crate::connection::kind).collect()
    }

    pub fn dead(&self) -> bool {
        self.core.phase() == Phase::Dead
    }
}

/// Which side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    /// The connecting side.
    C,
    /// The accepting side.
    A,
}

impl Who {
    pub fn other(self) -> Who {
        match self {
            Who::C => Who::A,
            Who::A => Who::C,
        }
    }
}

/// A connector and an acceptor wired to each other.
pub struct Pair {
    pub c: Side,
    pub a: Side,
    pub clock: Clock,
    pub mem: Mem,
}

impl Pair {
    /// A pair whose connector introduced itself with `hc` (the `Hello` is in the
    /// acceptor's inbox); nothing delivered yet.
    pub fn with_hellos(hc: Hello, ha: Hello) -> Self {
        let clock = Clock::new();
        let mem = Mem::default();
        let ring_offered = hc.control_ring.is_some();
        let c =
            Connection::new(settings(), Role::Connector { ring_offered }, hc.clone(), "listener".into(), clock.now());
        let a = Connection::new(settings(), Role::Acceptor, ha, "connector".into(), clock.now());
        let mut pair = Self { c: Side::new(c, mem.clone()), a: Side::new(a, mem.clone()), clock, mem };
        pair.a.inbox.push_back((encode_frame(&WireMessage::Hello(hc)), Vec::new()));
        pair
    }

    /// A pair on the native lane, pull mode, not yet shaken hands.
    pub fn native() -> Self {
        Self::with_hellos(hello(1, false, DeviceCopies::Receiver), hello(2, false, DeviceCopies::Receiver))
    }

    /// An established native pair (pull mode).
    pub fn established() -> Self {
        let mut p = Self::native();
        p.run();
        assert_eq!(p.c.established.map(|e| e.0), Some(LaneKind::Native));
        assert_eq!(p.a.established.map(|e| e.0), Some(LaneKind::Native));
        p
    }

    /// An established native pair in connector-copies mode (the connector pushes).
    pub fn pushing() -> Self {
        let mut p =
            Self::with_hellos(hello(1, false, DeviceCopies::Connector), hello(2, false, DeviceCopies::Receiver));
        p.run();
        assert_eq!(p.c.established, Some((LaneKind::Native, PushRole::Pusher)));
        assert_eq!(p.a.established, Some((LaneKind::Native, PushRole::Target)));
        p.c.lane.push_device = true;
        // As on the native lane: the connector runs every one-sided transfer.
        p.a.lane.runs_own = false;
        p
    }

    pub fn side(&mut self, who: Who) -> &mut Side {
        match who {
            Who::C => &mut self.c,
            Who::A => &mut self.a,
        }
    }

    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    /// Runs `f` on `who`'s core and lane, then carries out what it asked for.
    pub fn act(
        &mut self,
        who: Who,
        f: impl FnOnce(&mut Connection<TestPayload>, &mut dyn CoreLane<TestPayload>, Instant),
    ) {
        let now = self.now();
        let side = self.side(who);
        f(&mut side.core, &mut side.lane, now);
        self.carry_out(who);
    }

    /// Carries out `who`'s outputs as the driver does: transmits go (encoded) to the
    /// peer's inbox, `OpenLane` is answered, completions are collected; after the
    /// outputs, `after_flush`.
    pub fn carry_out(&mut self, who: Who) {
        loop {
            while let Some(output) = self.side(who).core.poll_output() {
                self.carry_out_one(who, output);
            }
            let now = self.now();
            let side = self.side(who);
            side.core.after_flush(|| now, &mut side.lane);
            if !side.core.has_output() {
                return;
            }
        }
    }

    fn carry_out_one(&mut self, who: Who, output: Output<TestPayload>) {
        let side = self.side(who);
        match output {
            Output::Transmit { message, fds } => {
                let bytes = encode_frame(&message);
                side.sent.push(message);
                self.side(who.other()).inbox.push_back((bytes, fds));
            }
            Output::Flush => {}
            Output::UseRing => side.use_ring += 1,
            Output::OpenLane { lane, remote, .. } => {
                if side.defer_open {
                    side.deferred_open = Some((lane, *remote));
                    return;
                }
                let answer = match side.open_error.take() {
                    Some(reason) => Err(reason),
                    None => Ok((lane, *remote)),
                };
                side.core.lane_opened(answer);
            }
            Output::Established { lane, push, .. } => {
                assert!(side.established.is_none(), "established twice");
                side.established = Some((lane, push));
            }
            Output::HandshakeFailed(e) => side.handshake_failed.push(e),
            Output::Closed => side.closed += 1,
            Output::ClosedAwaitingHangup => {
                side.half_closed += 1;
                if !side.manual_hangup {
                    self.hang_up_to(who);
                }
            }
            Output::SendDone { id, result } => side.sends.entry(id).or_default().push(result),
            Output::RecvDone { id, result } => {
                side.recv_log.push(id);
                side.recvs.entry(id).or_default().push(result)
            }
            Output::ImportDone { id, result } => side.imports.entry(id).or_default().push(result),
            Output::TransferDone { id, result } => side.transfers.entry(id).or_default().push(result),
            Output::NotificationDone { id, result } => side.notifications.entry(id).or_default().push(result),
        }
    }

    /// What the drivers do after `who` closed its socket's writing half: the peer reads
    /// EOF and ends its side (unless it ended already), its socket closes, and `who`
    /// reads that EOF.
    pub fn hang_up_to(&mut self, who: Who) {
        if self.side(who.other()).core.phase() != Phase::Dead {
            self.act(who.other(), |core, lane, _| core.peer_closed(lane));
        }
        self.act(who, |core, lane, _| core.peer_closed(lane));
    }

    /// Answers a deferred `OpenLane`.
    pub fn open_deferred(&mut self, who: Who) {
        let side = self.side(who);
        let (lane, remote) = side.deferred_open.take().expect("an OpenLane waits");
        side.core.lane_opened(Ok((lane, remote)));
        self.carry_out(who);
    }

    /// Delivers the oldest message in `to`'s inbox; whether there was one.
    pub fn deliver(&mut self, to: Who) -> bool {
        let side = self.side(to);
        let Some((bytes, fds)) = side.inbox.pop_front() else { return false };
        let (message, used) = decode_frame(&bytes, &limits()).expect("a valid frame").expect("a whole frame");
        assert_eq!(used, bytes.len());
        side.fds.extend(fds);
        if let WireMessage::Hello(h) = &message {
            if side.core.phase() == Phase::Handshaking {
                let taken = h.control_ring.is_some() && side.take_rings;
                side.core.set_ring_taken(taken);
            }
        }
        side.handled.push(message.clone());
        let now = self.now();
        let side = self.side(to);
        side.core.handle_message(message, &mut side.fds, now, &mut side.lane);
        self.carry_out(to);
        true
    }

    /// Feeds `who` a message as if the peer had sent it (bypassing the peer's core, but
    /// through the codec).
    pub fn inject(&mut self, to: Who, message: WireMessage, fds: Vec<OwnedFd>) {
        self.side(to).inbox.push_front((encode_frame(&message), fds));
        self.deliver(to);
    }

    /// Drops what waits in `who`'s inbox.
    pub fn inbox_clear(&mut self, who: Who) {
        self.side(who).inbox.clear();
    }

    /// Hands `who` what its lane finished; whether there was anything.
    pub fn poll_lane(&mut self, who: Who) -> bool {
        let mut events = Vec::new();
        self.side(who).lane.poll(&mut events);
        let any = !events.is_empty();
        for event in events {
            self.act(who, |core, lane, now| core.handle_lane_event(event, now, lane));
        }
        any
    }

    /// One driver turn of `who`'s deadlines.
    pub fn tick(&mut self, who: Who) {
        self.act(who, |core, lane, now| core.handle_timeout(now, lane));
    }

    /// Delivers everything and polls both lanes until nothing moves (no clock).
    pub fn run(&mut self) {
        loop {
            let mut moved = false;
            for who in [Who::A, Who::C] {
                while self.deliver(who) {
                    moved = true;
                }
                moved |= self.poll_lane(who);
            }
            if !moved {
                return;
            }
        }
    }

    /// Both sides' timeouts, then `run`.
    pub fn tick_both(&mut self) {
        self.tick(Who::C);
        self.tick(Who::A);
        self.run();
    }

    /// `who` sends request `id`.
    pub fn send(&mut self, who: Who, id: u64, message: Message) {
        self.act(who, |core, lane, now| core.send(id, message, now, lane));
    }

    /// `who` posts receive `id`.
    pub fn recv(&mut self, who: Who, id: u64, into: Option<Vec<Frame>>) {
        self.act(who, |core, lane, now| core.recv(id, into, None, now, lane));
    }

    /// `who` posts receive `id` naming a stream (a placeholder the simulated lane only
    /// looks at to leave its copies running).
    pub fn recv_on(&mut self, who: Who, id: u64, into: Option<Vec<Frame>>) {
        // SAFETY: the null stream is the legacy default stream, which always exists; the
        // simulated lane never hands it to CUDA.
        let on = unsafe { ferrylink_memory::ProducerStream::from_raw(std::ptr::null_mut()) };
        self.act(who, |core, lane, now| core.recv(id, into, Some(on), now, lane));
    }

    pub fn cancel(&mut self, who: Who, id: u64) {
        self.act(who, |core, lane, now| core.cancel(id, now, lane));
    }

    /// `who` is dead and closed once; the error its requests meet now.
    pub fn death(&mut self, who: Who) -> String {
        let side = self.side(who);
        assert!(side.dead(), "{who:?} is not dead");
        assert_eq!(side.closed, 1, "{who:?} closed {} times", side.closed);
        assert!(side.lane.closed <= 1, "lane closed twice");
        const PROBE: u64 = u64::MAX;
        self.recv(who, PROBE, None);
        let mut all = self.side(who).recvs.remove(&PROBE).expect("a receive on a dead connection completes");
        assert_eq!(all.len(), 1);
        match all.pop().expect("one") {
            Err(e) => e.error.to_string(),
            Ok(_) => panic!("a receive on a dead connection succeeded"),
        }
    }

    pub fn close(&mut self, who: Who) {
        self.act(who, |core, lane, _| core.close_by_user(lane));
    }
}

/// A message whose header and frames carry `tag`, one frame per size.
pub fn msg(tag: u64, sizes: &[usize]) -> Message {
    Message::new(
        tag.to_le_bytes().to_vec(),
        sizes.iter().enumerate().map(|(i, &n)| super::sim::host(pattern(tag, i, n))).collect(),
    )
}

/// The bytes frame `i` of message `tag` carries.
pub fn pattern(tag: u64, i: usize, n: usize) -> Vec<u8> {
    ferrylink_testkit::pattern(n, (tag << 16) ^ i as u64)
}

/// The tag a message carries in its header.
pub fn tag_of(m: &Message) -> u64 {
    u64::from_le_bytes(m.header[..8].try_into().expect("an 8-byte header"))
}

/// Asserts `m` is message `tag` with frames of `sizes`, bytes intact.
pub fn assert_msg(mem: &Mem, m: &Message, tag: u64, sizes: &[usize]) {
    assert_eq!(tag_of(m), tag, "header");
    assert_eq!(m.frames.len(), sizes.len(), "frame count of message {tag}");
    for (i, (f, &n)) in m.frames.iter().zip(sizes).enumerate() {
        assert_eq!(super::sim::frame_bytes(mem, f), pattern(tag, i, n), "frame {i} of message {tag}");
    }
}
