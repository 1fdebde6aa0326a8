//! Notifications sent ahead of their copies (`connection/gated.rs`): delivered once the gate
//! opens, in order with the others, dropped when the copies fail or never end, and a
//! gate that cannot exist is the peer's protocol error.

use super::onesided::{args, bytes_of, import, notification, register};
use super::pair::*;
use crate::region::{Access, ImportedRegion, RegistrationInner};
use crate::test_payload::TestPayload;
use crate::wire::{NotifyGate, TransferOp, WireMessage};
use std::sync::Arc;

/// A pair whose connector puts into the acceptor's region with gated notifications and
/// copies that run until the test ends them: the pair, the target, the source, the
/// connector's import.
fn gated_pair() -> (Pair, Arc<RegistrationInner<TestPayload>>, Arc<RegistrationInner<TestPayload>>, ImportedRegion) {
    let mut p = Pair::pushing();
    let target = register(&mut p, Who::A, 256, 0, Access::Write);
    let source = register(&mut p, Who::C, 256, 3, Access::Read);
    let region = import(&mut p, Who::C, 1, target.key);
    p.c.lane.early_gates = true;
    p.c.lane.hold_transfers = true;
    (p, target, source, region)
}

/// The connector starts put `id` of 8 bytes with notification `note`.
fn start_put(
    p: &mut Pair,
    id: u64,
    source: &Arc<RegistrationInner<TestPayload>>,
    region: &ImportedRegion,
    note: &[u8],
) {
    let mut a = args(TransferOp::Put, source, region.grant, &[(0, 0, 8)]);
    a.notify = Some(note.to_vec());
    p.act(Who::C, |core, lane, now| core.transfer(id, a, now, lane));
    p.run();
}

fn notifies_sent(p: &Pair) -> usize {
    p.c.sent_kinds().iter().filter(|&&k| k == "Notify").count()
}

#[test]
fn a_notification_sent_while_the_copies_run_is_delivered_once_its_gate_opens() {
    let (mut p, target, source, region) = gated_pair();
    start_put(&mut p, 2, &source, &region, b"early");
    assert!(p.c.transfers.is_empty(), "the copies still run");
    assert_eq!(notifies_sent(&p), 1, "the notification went ahead of them");
    assert_eq!(p.c.core.counters().notifications_sent_ahead.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(notification(&mut p, Who::A, 3), None, "its gate is shut");
    let now = p.now();
    assert!(p.a.core.wants_spin(now), "the owner polls the gate");
    p.tick_both();
    assert!(!p.a.notifications.contains_key(&3), "still shut");
    p.c.lane.complete_transfers();
    p.run();
    assert_eq!(p.c.transfers.remove(&2).unwrap(), [Ok(())]);
    assert_eq!(notifies_sent(&p), 1, "nothing sent after the copies");
    p.tick(Who::A);
    assert_eq!(p.a.notifications.remove(&3).unwrap(), [Ok(b"early".to_vec())]);
    assert!(bytes_of(&p, &target)[..8].iter().all(|&b| b == 3));
    let now = p.now();
    assert!(!p.a.core.wants_spin(now), "nothing left to poll");
}

#[test]
fn failed_copies_cancel_their_notification_and_later_ones_still_arrive() {
    let (mut p, _target, source, region) = gated_pair();
    start_put(&mut p, 2, &source, &region, b"lost");
    p.c.lane.fail_transfers("the copy kernel faulted");
    p.run();
    assert!(p.c.transfers.remove(&2).unwrap()[0].is_err());
    assert!(p.c.sent_kinds().contains(&"NotifyCancelled"));
    p.tick(Who::A);
    assert_eq!(notification(&mut p, Who::A, 3), None, "the cancelled one is never delivered");
    let now = p.now();
    assert!(!p.a.core.wants_spin(now), "and no longer polled");
    p.c.lane.hold_transfers = false;
    start_put(&mut p, 4, &source, &region, b"next");
    assert_eq!(p.c.transfers.remove(&4).unwrap(), [Ok(())]);
    assert_eq!(p.a.notifications.remove(&3).unwrap(), [Ok(b"next".to_vec())]);
    assert!(!p.a.dead() && !p.c.dead());
}

#[test]
fn a_plain_notification_waits_behind_a_gated_one_before_it() {
    let (mut p, _target, source, region) = gated_pair();
    start_put(&mut p, 2, &source, &region, b"first");
    // A plain notification (of a transfer whose copies ended first) comes next.
    let plain = WireMessage::Notify { grant: region.grant, data: b"second".to_vec(), gate: None };
    p.inject(Who::A, plain, Vec::new());
    p.run();
    p.tick(Who::A);
    assert_eq!(notification(&mut p, Who::A, 10), None, "the second waits for the first");
    p.c.lane.complete_transfers();
    p.run();
    p.tick(Who::A);
    assert_eq!(p.a.notifications.remove(&10).unwrap(), [Ok(b"first".to_vec())]);
    assert_eq!(notification(&mut p, Who::A, 11), Some(Ok(b"second".to_vec())));
}

#[test]
fn a_gate_word_that_cannot_exist_is_the_peers_protocol_error() {
    let (mut p, _target, _source, region) = gated_pair();
    let gate = Some(NotifyGate { index: 4000, value: 1 });
    p.inject(Who::A, WireMessage::Notify { grant: region.grant, data: b"x".to_vec(), gate }, Vec::new());
    p.run();
    assert!(p.a.dead(), "the owner ends the connection");
    assert!(p.a.notifications.is_empty() && notification(&mut p, Who::A, 3).is_some_and(|r| r.is_err()));
}

#[test]
fn a_cancellation_for_a_grant_never_given_is_the_peers_protocol_error() {
    let (mut p, _target, _source, region) = gated_pair();
    let gate = NotifyGate { index: 1, value: 1 };
    p.inject(Who::A, WireMessage::NotifyCancelled { grant: region.grant + 7, gate }, Vec::new());
    p.run();
    assert!(p.a.dead());
}

#[test]
fn at_the_peers_death_notifications_whose_data_came_are_delivered_and_the_rest_dropped() {
    let (mut p, _target, source, region) = gated_pair();
    start_put(&mut p, 2, &source, &region, b"landed");
    start_put(&mut p, 3, &source, &region, b"in flight");
    assert_eq!(notifies_sent(&p), 2);
    // The first transfer's copies end (its gate opens); the connector dies before the
    // owner's next turn, the second's copies unfinished.
    let first = p.c.lane.gate_of[&2];
    p.mem.borrow_mut().gates.insert(first.index, first.value);
    p.inbox_clear(Who::A);
    p.act(Who::A, |core, lane, _| core.peer_closed(lane));
    assert_eq!(notification(&mut p, Who::A, 10), Some(Ok(b"landed".to_vec())));
    assert!(notification(&mut p, Who::A, 11).is_some_and(|r| r.is_err()), "the other is not delivered");
}
