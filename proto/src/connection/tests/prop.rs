//! Random interleavings of user commands, deliveries, time and lane completions on a
//! pair of cores; what must hold whatever the order.

use super::pair::*;
use super::push::device_msg;
use super::sim::{device_frame, frame_bytes, host, LandMode};
use crate::connection::Phase;
use ferrylink_memory::Message;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Debug, Clone)]
enum Op {
    Send {
        who: Who,
        sizes: Vec<usize>,
        device: bool,
    },
    /// A send shaped like this side's last one (so push offers fit).
    SendAgain {
        who: Who,
    },
    /// A device send shaped like the peer's last `recv_into` of device buffers (so
    /// receive offers fit).
    SendFitting {
        who: Who,
    },
    Recv {
        who: Who,
    },
    RecvInto {
        who: Who,
        sizes: Vec<usize>,
    },
    /// A `recv_into` of device buffers (a listener offers them to the pushing connector).
    RecvIntoDevice {
        who: Who,
        sizes: Vec<usize>,
    },
    /// The lane answers "not yet" to the next two receive offers.
    DelayReceiveOffers {
        who: Who,
    },
    /// A receive naming a stream: device frames the lane copies are delivered at once,
    /// their ack held until the lane's copies finish.
    RecvOn {
        who: Who,
    },
    /// The lane's running copies (of receives naming a stream) finish.
    CompleteCopies {
        who: Who,
    },
    Cancel {
        who: Who,
        pick: usize,
    },
    /// A request's handle is dropped: withdrawn when it has not started (then it never
    /// completes), else left to complete.
    Withdraw {
        who: Who,
        pick: usize,
    },
    Close {
        who: Who,
    },
    Deliver {
        who: Who,
    },
    Advance {
        ms: u64,
    },
    FinishSends {
        who: Who,
    },
    CompleteLandings {
        who: Who,
        reverse: bool,
    },
    /// The lane refuses what lands from now on (or stops refusing).
    ToggleRefuse {
        who: Who,
    },
    /// The peer's GPU work is pending from now on (or done).
    ToggleReady {
        who: Who,
    },
    /// The lane loses frames from now on (or stops).
    ToggleLost {
        who: Who,
    },
}

/// How the lanes behave in one case.
#[derive(Debug, Clone)]
struct Knobs {
    push: bool,
    release_pending: bool,
    land_in_progress: bool,
    staging: Option<usize>,
    budget: usize,
    offers: bool,
}

fn who() -> impl Strategy<Value = Who> {
    prop_oneof![Just(Who::C), Just(Who::A)]
}

fn sizes() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(prop_oneof![Just(0usize), Just(5), Just(64), Just(700)], 0..3)
}

/// Weighted so that most cases run a while before something ends the connection.
fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (who(), sizes(), prop::bool::weighted(0.7)).prop_map(|(who, sizes, device)| Op::Send { who, sizes, device }),
        6 => who().prop_map(|who| Op::SendAgain { who }),
        4 => who().prop_map(|who| Op::SendFitting { who }),
        12 => who().prop_map(|who| Op::Recv { who }),
        3 => (who(), sizes()).prop_map(|(who, sizes)| Op::RecvInto { who, sizes }),
        4 => (who(), sizes()).prop_map(|(who, sizes)| Op::RecvIntoDevice { who, sizes }),
        1 => who().prop_map(|who| Op::DelayReceiveOffers { who }),
        2 => (who(), any::<usize>()).prop_map(|(who, pick)| Op::Cancel { who, pick }),
        4 => who().prop_map(|who| Op::RecvOn { who }),
        3 => who().prop_map(|who| Op::CompleteCopies { who }),
        2 => (who(), any::<usize>()).prop_map(|(who, pick)| Op::Withdraw { who, pick }),
        30 => who().prop_map(|who| Op::Deliver { who }),
        6 => prop_oneof![40 => 0..3u64, 1 => Just(6_000u64)].prop_map(|ms| Op::Advance { ms }),
        3 => who().prop_map(|who| Op::FinishSends { who }),
        3 => (who(), any::<bool>()).prop_map(|(who, reverse)| Op::CompleteLandings { who, reverse }),
        1 => who().prop_map(|who| Op::Close { who }),
        2 => who().prop_map(|who| Op::ToggleRefuse { who }),
        2 => who().prop_map(|who| Op::ToggleReady { who }),
        1 => who().prop_map(|who| Op::ToggleLost { who }),
    ]
}

/// Weighted towards receive offers: the listener's `recv_into` of device buffers and
/// the connector's sends that fit them, with deadlines and dropped handles among them.
fn offer_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => Just(Op::RecvIntoDevice { who: Who::A, sizes: vec![64, 5] }),
        2 => sizes().prop_map(|sizes| Op::RecvIntoDevice { who: Who::A, sizes }),
        8 => Just(Op::SendFitting { who: Who::C }),
        3 => (sizes(), any::<bool>()).prop_map(|(sizes, device)| Op::Send { who: Who::C, sizes, device }),
        3 => Just(Op::Recv { who: Who::A }),
        2 => any::<usize>().prop_map(|pick| Op::Cancel { who: Who::A, pick }),
        2 => any::<usize>().prop_map(|pick| Op::Withdraw { who: Who::A, pick }),
        1 => Just(Op::DelayReceiveOffers { who: Who::A }),
        1 => Just(Op::ToggleReady { who: Who::A }),
        1 => Just(Op::ToggleRefuse { who: Who::A }),
        20 => who().prop_map(|who| Op::Deliver { who }),
        4 => prop_oneof![20 => 0..3u64, 1 => Just(6_000u64)].prop_map(|ms| Op::Advance { ms }),
        1 => who().prop_map(|who| Op::Close { who }),
    ]
}

fn knobs() -> impl Strategy<Value = Knobs> {
    let budget = prop_oneof![Just(1usize), Just(1 << 20)];
    (any::<bool>(), any::<bool>(), any::<bool>(), prop::option::of(700..2000usize), budget, any::<bool>()).prop_map(
        |(push, release_pending, land_in_progress, staging, budget, offers)| Knobs {
            push,
            // The native lane (the only one that pushes) hands frames back at once and
            // lands every message at once (only UCX transfers are in progress).
            release_pending: release_pending && !push,
            land_in_progress: land_in_progress && !push,
            staging,
            budget,
            offers: offers && push,
        },
    )
}

/// A sent message: its request id (also its tag), frame sizes, device or host.
#[derive(Debug, Clone)]
struct Sent {
    id: u64,
    sizes: Vec<usize>,
    device: bool,
}

/// The pair and what the test knows it asked for.
struct World {
    p: Pair,
    next_id: u64,
    sends: BTreeMap<Who2, Vec<Sent>>,
    recv_into: BTreeMap<u64, Vec<usize>>,
    /// Per side, the sizes of its last `recv_into` of device buffers.
    device_recv_into: BTreeMap<Who2, Vec<usize>>,
    issued: BTreeMap<Who2, Vec<u64>>,
    /// Requests withdrawn (their handles dropped before they started): never complete.
    withdrawn: std::collections::BTreeSet<u64>,
    /// Per side, receives withdrawn while their message landed after later receives had
    /// completed: each lets one message arrive after later ones (`withdraw_recv`).
    late_allowed: BTreeMap<Who2, usize>,
    /// Sides whose lane lost frames at some point.
    lost: Vec<Who2>,
    land_mode: LandMode,
    push: bool,
}

/// `Who` as a map key.
type Who2 = u8;

fn key(who: Who) -> Who2 {
    match who {
        Who::C => 0,
        Who::A => 1,
    }
}

impl World {
    fn new(k: &Knobs) -> Self {
        let mut p = if k.push { Pair::pushing() } else { Pair::established() };
        for side in [&mut p.c, &mut p.a] {
            side.lane.release_pending = k.release_pending;
            side.lane.land_mode = if k.land_in_progress { LandMode::InProgress } else { LandMode::Done };
            side.lane.staging_capacity = k.staging.unwrap_or(usize::MAX);
            side.core.settings.unexpected_max_bytes = k.budget;
        }
        p.a.lane.offers_enabled = k.offers;
        let land_mode = if k.land_in_progress { LandMode::InProgress } else { LandMode::Done };
        let (sends, recv_into, issued) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
        let (withdrawn, late_allowed) = Default::default();
        Self {
            p,
            next_id: 1,
            sends,
            recv_into,
            device_recv_into: BTreeMap::new(),
            issued,
            withdrawn,
            late_allowed,
            lost: Vec::new(),
            land_mode,
            push: k.push,
        }
    }

    fn id(&mut self, who: Who) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.issued.entry(key(who)).or_default().push(id);
        id
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::Send { who, sizes, device } => {
                let id = self.id(who);
                let m = if device { device_msg(&self.p.mem, id, &sizes) } else { msg(id, &sizes) };
                self.sends.entry(key(who)).or_default().push(Sent { id, sizes, device });
                self.p.send(who, id, m);
            }
            Op::SendAgain { who } => {
                if let Some(last) = self.sends.get(&key(who)).and_then(|v| v.last()).cloned() {
                    self.apply(Op::Send { who, sizes: last.sizes, device: last.device });
                }
            }
            Op::Recv { who } => {
                let id = self.id(who);
                self.p.recv(who, id, None);
            }
            Op::RecvInto { who, sizes } => {
                let id = self.id(who);
                let buffers = sizes.iter().map(|&n| host(vec![0xEE; n])).collect();
                self.recv_into.insert(id, sizes);
                self.p.recv(who, id, Some(buffers));
            }
            Op::SendFitting { who } => {
                if let Some(sizes) = self.device_recv_into.get(&key(who.other())).cloned() {
                    self.apply(Op::Send { who, sizes, device: true });
                }
            }
            Op::RecvIntoDevice { who, sizes } => {
                self.device_recv_into.insert(key(who), sizes.clone());
                let id = self.id(who);
                let buffers = sizes.iter().map(|&n| device_frame(&self.p.mem, vec![0xEE; n])).collect();
                self.recv_into.insert(id, sizes);
                self.p.recv(who, id, Some(buffers));
            }
            Op::DelayReceiveOffers { who } => self.p.side(who).lane.receive_offer_delays = 2,
            Op::RecvOn { who } => {
                let id = self.id(who);
                self.p.recv_on(who, id, None);
            }
            Op::CompleteCopies { who } => {
                let running = self.p.side(who).lane.copying.clone();
                self.p.side(who).lane.complete_copies(&running);
                self.p.poll_lane(who);
            }
            Op::Withdraw { who, pick } => self.withdraw(who, pick),
            Op::Cancel { who, pick } => {
                if let Some(ids) = self.issued.get(&key(who)).filter(|v| !v.is_empty()) {
                    let id = ids[pick % ids.len()];
                    self.p.cancel(who, id);
                }
            }
            Op::Close { who } => self.p.close(who),
            Op::Deliver { who } => {
                self.p.deliver(who);
            }
            Op::Advance { ms } => {
                self.p.clock.advance(Duration::from_millis(ms));
                self.p.tick(Who::C);
                self.p.tick(Who::A);
            }
            Op::FinishSends { who } => {
                self.p.side(who).lane.finish_sends();
                self.p.poll_lane(who);
            }
            Op::CompleteLandings { who, reverse } => {
                self.p.side(who).lane.complete_landings(reverse);
                self.p.poll_lane(who);
            }
            Op::ToggleRefuse { who } => {
                let lane = &mut self.p.side(who).lane;
                lane.land_mode = match lane.land_mode {
                    LandMode::Refuse(_) => self.land_mode.clone(),
                    _ => LandMode::Refuse("not now".into()),
                };
            }
            Op::ToggleReady { who } => {
                let lane = &mut self.p.side(who).lane;
                lane.readiness_pending = !lane.readiness_pending;
            }
            // The native lane (the only one that pushes) never keeps frames; the core
            // ignores what `release` says after a push (`on_push_targets`).
            Op::ToggleLost { .. } if self.push => {}
            Op::ToggleLost { who } => {
                let lane = &mut self.p.side(who).lane;
                lane.frames_lost = !lane.frames_lost;
                self.lost.push(key(who));
            }
        }
        self.check_once();
    }

    /// Drops the handle of one of `who`'s requests that has not completed.
    fn withdraw(&mut self, who: Who, pick: usize) {
        let Some(ids) = self.issued.get(&key(who)).filter(|v| !v.is_empty()) else { return };
        let id = ids[pick % ids.len()];
        let side = self.p.side(who);
        if side.sends.contains_key(&id) || side.recvs.contains_key(&id) || self.withdrawn.contains(&id) {
            return;
        }
        let posted = side.core.is_posted(id);
        let later_completed = side.recvs.keys().any(|&r| r > id);
        let mut withdrawn = false;
        self.p.act(who, |core, lane, _| withdrawn = core.withdraw(id, lane));
        if withdrawn && !posted && later_completed {
            *self.late_allowed.entry(key(who)).or_default() += 1;
        }
        if withdrawn {
            self.withdrawn.insert(id);
            // A withdrawn send was never described: the peer never gets it.
            if let Some(v) = self.sends.get_mut(&key(who)) {
                v.retain(|s| s.id != id);
            }
        }
    }

    /// No request completed twice, at any time.
    fn check_once(&self) {
        for side in [&self.p.c, &self.p.a] {
            assert!(side.sends.values().all(|v| v.len() == 1), "a send completed twice");
            assert!(side.recvs.values().all(|v| v.len() == 1), "a receive completed twice");
        }
    }

    /// Closes both sides, lets everything settle, and takes what landed unclaimed.
    fn finish(&mut self) {
        for who in [Who::C, Who::A] {
            self.p.side(who).lane.finish_sends();
            self.p.side(who).lane.complete_landings(false);
            let running = self.p.side(who).lane.copying.clone();
            self.p.side(who).lane.complete_copies(&running);
            self.p.poll_lane(who);
            self.p.close(who);
        }
        self.p.run();
        for who in [Who::C, Who::A] {
            loop {
                let id = self.id(who);
                self.p.recv(who, id, None);
                if self.p.side(who).recv_result(id).is_err() {
                    break;
                }
            }
        }
    }
}

/// The message `m` is sent message `s`, bytes intact.
fn is_intact(mem: &super::sim::Mem, m: &Message, s: &Sent) -> bool {
    tag_of(m) == s.id
        && m.frames.len() == s.sizes.len()
        && m.frames.iter().zip(&s.sizes).enumerate().all(|(i, (f, &n))| frame_bytes(mem, f) == pattern(s.id, i, n))
}

fn check_end(w: &World, push: bool) {
    let p = &w.p;
    for (who, side) in [(Who::C, &p.c), (Who::A, &p.a)] {
        assert_eq!(side.core.phase(), Phase::Dead);
        assert!(side.core.is_finished(), "{who:?} not finished");
        // Two honest cores never see the other break the protocol, whatever the order.
        for error in side
            .sends
            .values()
            .flatten()
            .filter_map(|r| r.as_ref().err().map(|e| &e.error))
            .chain(side.recvs.values().flatten().filter_map(|r| r.as_ref().err().map(|e| &e.error)))
        {
            assert!(!error.to_string().contains("protocol violation"), "{who:?}: {error}");
        }
        let mut stats = crate::stats::ContextStats::default();
        side.core.add_stats(&mut stats);
        assert_eq!((stats.sends_in_flight, stats.recvs_posted, stats.unclaimed_bytes), (0, 0, 0), "{who:?}");
        assert_eq!(side.lane.landings(), 0, "{who:?}: landings left");
        for id in w.issued.get(&key(who)).into_iter().flatten() {
            let done = side.sends.get(id).map_or(0, Vec::len) + side.recvs.get(id).map_or(0, Vec::len);
            let expected = if w.withdrawn.contains(id) { 0 } else { 1 };
            assert_eq!(done, expected, "{who:?}: request {id} completed {done} times");
        }
        // Every buffer handed to a send comes back, intact.
        let sent = w.sends.get(&key(who)).cloned().unwrap_or_default();
        for s in &sent {
            let back = match side.send_result(s.id) {
                Ok(m) => m,
                Err(e) if e.message.is_none() && w.lost.contains(&key(who)) => continue,
                Err(e) => e.message.as_ref().unwrap_or_else(|| panic!("send {} lost its message: {}", s.id, e.error)),
            };
            assert!(is_intact(&p.mem, back, s), "send {} came back altered", s.id);
        }
        // A failed `recv_into` hands its buffers back (unless a landing had them).
        for (id, sizes) in &w.recv_into {
            if let Some(Err(e)) = side.recvs.get(id).map(|v| &v[0]) {
                if let Some(buffers) = &e.buffers {
                    assert_eq!(&buffers.iter().map(|f| f.len()).collect::<Vec<_>>(), sizes, "receive {id}");
                }
            }
        }
        check_received(w, who, push);
    }
}

/// What `who`'s receives got is, in their order, messages the peer sent, each once and intact; in
/// pull mode every send that succeeded was received.
fn check_received(w: &World, who: Who, push: bool) {
    let p = &w.p;
    let side = match who {
        Who::C => &p.c,
        Who::A => &p.a,
    };
    let sent = w.sends.get(&key(who.other())).cloned().unwrap_or_default();
    let by_id: BTreeMap<u64, &Sent> = sent.iter().map(|s| (s.id, s)).collect();
    let mut last = 0;
    let mut late = 0;
    let mut received = Vec::new();
    // Receives get messages in the order they were posted (ids increase), though one
    // whose message lands later may complete after a later one.
    for id in side.recvs.keys() {
        let Ok(m) = side.recv_result(*id) else { continue };
        let tag = tag_of(m);
        let s = by_id.get(&tag).unwrap_or_else(|| panic!("{who:?} received {tag}, never sent"));
        assert!(!received.contains(&tag), "{who:?} received {tag} twice");
        if tag < last {
            late += 1;
        }
        let allowed = w.late_allowed.get(&key(who)).copied().unwrap_or(0);
        assert!(late <= allowed, "{who:?} received {tag} after {last}: reordered ({late} late, {allowed} allowed)");
        last = last.max(tag);
        assert!(is_intact(&p.mem, m, s), "message {tag} arrived altered");
        if let Some(sizes) = w.recv_into.get(id) {
            assert_eq!(&m.frames.iter().map(|f| f.len()).collect::<Vec<_>>(), sizes);
        }
        received.push(tag);
    }
    if push {
        return; // a pushed send succeeds once copied, whether or not its receiver lived to deliver it
    }
    let peer = match who {
        Who::C => &p.a,
        Who::A => &p.c,
    };
    for s in &sent {
        if peer.send_result(s.id).is_ok() {
            assert!(received.contains(&s.id), "send {} succeeded but {who:?} never received it", s.id);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_interleavings_keep_every_promise(k in knobs(), ops in prop::collection::vec(op(), 0..150)) {
        let mut w = World::new(&k);
        for op in ops {
            w.apply(op);
        }
        w.finish();
        check_end(&w, k.push);
    }

    #[test]
    fn receive_offers_keep_every_promise(budget in prop_oneof![Just(1usize), Just(1 << 20)], ops in prop::collection::vec(offer_op(), 0..100)) {
        let k = Knobs { push: true, release_pending: false, land_in_progress: false, staging: None, budget, offers: true };
        let mut w = World::new(&k);
        for op in ops {
            w.apply(op);
        }
        w.finish();
        check_end(&w, k.push);
    }
}
