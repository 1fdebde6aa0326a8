//! Transfers the owner runs whose initiator's lane has work of its own around them (the
//! UCX lane's staging): the owner is asked only once this side's memory is described,
//! the request completes only once the lane finished after the owner's answer, and
//! neither wait counts as the owner being late.

use super::pair::*;
use super::sim::device_frame;
use crate::connection::{TransferArgs, TransferSpans};
use crate::error::TransportError;
use crate::region::{Access, RegistrationInner};
use crate::test_payload::TestPayload;
use crate::wire::{TransferOp, WireMessage, WireSpan};
use std::sync::Arc;

/// A pair where the listener (whose transfers the connector runs) imported a region of
/// `len` bytes of the connector's holding 0; the listener's registration holds `fill`.
pub(super) fn pair(
    len: usize,
    fill: u8,
) -> (Pair, Arc<RegistrationInner<TestPayload>>, Arc<RegistrationInner<TestPayload>>, u64) {
    let mut p = Pair::pushing();
    let owners = p.c.lane.registry.register(device_frame(&p.mem, vec![0; len]), Access::ReadWrite);
    let mine = p.a.lane.registry.register(device_frame(&p.mem, vec![fill; len]), Access::ReadWrite);
    p.act(Who::A, |core, _, now| core.import(1, owners.key, now));
    p.run();
    let region = p.a.imports.remove(&1).unwrap().remove(0).expect("granted");
    (p, owners, mine, region.grant)
}

fn start(
    p: &mut Pair,
    id: u64,
    op: TransferOp,
    local: &Arc<RegistrationInner<TestPayload>>,
    grant: u64,
    spans: &[(u64, u64, u64)],
) {
    let spans = spans.iter().map(|&(local_offset, remote_offset, len)| WireSpan { local_offset, remote_offset, len });
    let spans = TransferSpans::Given(spans.collect());
    let args = TransferArgs { op, local: local.clone(), grant, spans, notify: Some(b"n".to_vec()) };
    p.act(Who::A, |core, lane, now| core.transfer(id, args, now, lane));
    p.run();
}

fn bytes_of(p: &Pair, r: &RegistrationInner<TestPayload>) -> Vec<u8> {
    p.mem.borrow().device[&r.frame.as_device().unwrap().device_ptr()].clone()
}

fn transfers_sent(p: &Pair) -> usize {
    p.a.sent.iter().filter(|m| matches!(m, WireMessage::Transfer(_))).count()
}

#[test]
fn the_owner_is_asked_only_once_the_lane_described_this_sides_memory() {
    let (mut p, owners, mine, grant) = pair(256, 7);
    p.a.lane.describe_later = true;
    start(&mut p, 2, TransferOp::Put, &mine, grant, &[(0, 0, 100)]);
    assert_eq!(transfers_sent(&p), 0, "nothing asked while the lane prepares");
    assert!(p.a.transfers.is_empty() && bytes_of(&p, &owners).iter().all(|&b| b == 0));
    // Preparing takes long: that is not the owner being late.
    p.clock.advance(REQUEST_TIMEOUT * 2);
    p.tick_both();
    assert!(!p.a.dead() && !p.c.dead());
    // The lane's spans (a staging buffer's) are what the owner sees: here it moved the
    // user's bytes 100 further in.
    p.a.lane.described_later[0].1.spans = Some(vec![WireSpan { local_offset: 100, remote_offset: 0, len: 100 }]);
    p.a.lane.describe_now(None);
    p.run();
    assert_eq!(transfers_sent(&p), 1);
    assert_eq!(p.a.transfers.remove(&2).unwrap(), [Ok(())]);
    assert!(
        bytes_of(&p, &owners)[..100].iter().all(|&b| b == 7) && bytes_of(&p, &owners)[100..].iter().all(|&b| b == 0)
    );
    assert_eq!(p.a.lane.answered, [(2, true)], "the lane heard the answer");
    p.act(Who::C, |core, _, _| core.recv_notification(3));
    assert_eq!(p.c.notifications[&3], [Ok(b"n".to_vec())], "the owner notified itself");
}

#[test]
fn a_description_that_fails_fails_the_transfer_and_asks_nothing() {
    let (mut p, _owners, mine, grant) = pair(64, 1);
    p.a.lane.describe_transfer_error = Some("no pinned memory".into());
    start(&mut p, 2, TransferOp::Put, &mine, grant, &[(0, 0, 8)]);
    assert!(matches!(&p.a.transfers[&2][..], [Err(TransportError::Unsupported(r))] if r.contains("no pinned memory")));
    p.a.lane.describe_transfer_error = None;
    p.a.lane.describe_later = true;
    start(&mut p, 3, TransferOp::Get, &mine, grant, &[(0, 0, 8)]);
    p.a.lane.describe_now(Some("a staging copy failed"));
    p.run();
    assert!(matches!(&p.a.transfers[&3][..], [Err(TransportError::Unsupported(r))] if r.contains("staging copy")));
    assert_eq!(transfers_sent(&p), 0);
    assert!(!p.a.dead(), "the connection lives on");
    // The lane reporting a description nobody waits for changes nothing.
    p.a.lane.events.push(crate::connection::lane::LaneEvent::TransferFinished { id: 3, result: Ok(()) });
    p.run();
    assert_eq!(p.a.transfers[&3].len(), 1, "completed once");
}

#[test]
fn a_get_completes_once_the_lane_finished_after_the_owners_answer() {
    let (mut p, owners, mine, grant) = pair(128, 0);
    let ptr = owners.frame.as_device().unwrap().device_ptr();
    p.mem.borrow_mut().device.get_mut(&ptr).unwrap()[..16].copy_from_slice(&[9; 16]);
    p.a.lane.finish_later = true;
    start(&mut p, 2, TransferOp::Get, &mine, grant, &[(0, 0, 16)]);
    assert_eq!(p.a.lane.answered, [(2, true)]);
    assert!(p.a.transfers.is_empty(), "not before the lane's part");
    p.clock.advance(REQUEST_TIMEOUT * 2);
    p.tick_both();
    assert!(!p.a.dead(), "the owner answered: finishing is not its lateness");
    p.a.lane.finish_answered();
    p.run();
    assert_eq!(p.a.transfers.remove(&2).unwrap(), [Ok(())]);
    assert!(bytes_of(&p, &mine)[..16].iter().all(|&b| b == 9));
    // A refusal ends it at once, whatever the lane would finish.
    start(&mut p, 3, TransferOp::Get, &mine, grant, &[(0, 200, 16)]);
    assert!(p.a.transfers[&3][0].is_err(), "refused by the initiator's own check");
    let spans = [WireSpan { local_offset: 0, remote_offset: 0, len: 16 }];
    p.c.lane.registry.release_handle(owners.id);
    p.act(Who::C, |core, _, _| core.revoke_registration(owners.id));
    p.run();
    let spans = TransferSpans::Given(spans.to_vec());
    let args = TransferArgs { op: TransferOp::Get, local: mine.clone(), grant, spans, notify: None };
    p.act(Who::A, |core, lane, now| core.transfer(4, args, now, lane));
    p.run();
    assert!(p.a.transfers[&4][0].is_err(), "revoked");
}

#[test]
fn the_owners_death_fails_transfers_being_described_or_finished() {
    let (mut p, _owners, mine, grant) = pair(64, 1);
    p.a.lane.finish_later = true;
    start(&mut p, 2, TransferOp::Get, &mine, grant, &[(0, 0, 8)]);
    p.a.lane.describe_later = true;
    start(&mut p, 3, TransferOp::Put, &mine, grant, &[(0, 0, 8)]);
    p.inbox_clear(Who::C);
    p.act(Who::A, |core, lane, _| core.peer_closed(lane));
    for id in [2, 3] {
        assert!(matches!(p.a.transfers[&id][..], [Err(TransportError::PeerClosed { .. })]), "transfer {id}");
    }
    // What the lane reports afterwards is ignored.
    p.a.lane.describe_now(None);
    p.a.lane.finish_answered();
    p.run();
    assert_eq!((p.a.transfers[&2].len(), p.a.transfers[&3].len()), (1, 1));
}

#[test]
fn a_description_reported_twice_asks_the_owner_once() {
    let (mut p, owners, mine, grant) = pair(64, 5);
    p.a.lane.describe_later = true;
    p.c.lane.hold_transfers = true;
    start(&mut p, 2, TransferOp::Put, &mine, grant, &[(0, 0, 8)]);
    let again = p.a.lane.described_later[0].1.spans.clone();
    p.a.lane.describe_now(None);
    p.run();
    assert_eq!(transfers_sent(&p), 1);
    // The lane reports it again while the owner runs it: ignored.
    let memory = crate::wire::GrantedMemory::Staged { device: true };
    let described = crate::connection::lane::DescribedTransfer { memory, len: 64, spans: again, regions: Vec::new() };
    p.a.lane.events.push(crate::connection::lane::LaneEvent::TransferDescribed { id: 2, result: Ok(described) });
    p.run();
    assert_eq!(transfers_sent(&p), 1, "asked once");
    assert!(p.a.transfers.is_empty());
    p.c.lane.complete_transfers();
    p.run();
    assert_eq!(p.a.transfers.remove(&2).unwrap(), [Ok(())], "the owner's answer still ends it");
    assert!(bytes_of(&p, &owners)[..8].iter().all(|&b| b == 5));
    // Reported while this side finishes a get: still finished by the lane.
    p.a.lane.describe_later = false;
    p.a.lane.finish_later = true;
    p.c.lane.hold_transfers = false;
    start(&mut p, 3, TransferOp::Get, &mine, grant, &[(0, 0, 8)]);
    assert!(p.a.transfers.is_empty(), "finishing");
    let memory = crate::wire::GrantedMemory::Staged { device: true };
    let described = crate::connection::lane::DescribedTransfer { memory, len: 64, spans: None, regions: Vec::new() };
    p.a.lane.events.push(crate::connection::lane::LaneEvent::TransferDescribed { id: 3, result: Ok(described) });
    p.run();
    assert_eq!(transfers_sent(&p), 2, "nothing asked again");
    p.a.lane.finish_answered();
    p.run();
    assert_eq!(p.a.transfers.remove(&3).unwrap(), [Ok(())]);
}

#[test]
fn a_region_revoked_while_this_side_prepares_fails_the_transfer_without_asking() {
    let (mut p, owners, mine, grant) = pair(64, 5);
    p.a.lane.describe_later = true;
    start(&mut p, 2, TransferOp::Put, &mine, grant, &[(0, 0, 8)]);
    // The owner revokes; this side (no copy of its own uses the grant) lets go at once.
    assert!(p.c.lane.registry.release_handle(owners.id));
    p.act(Who::C, |core, _, _| core.revoke_registration(owners.id));
    p.run();
    assert!(p.a.sent_kinds().contains(&"RevokeDone"));
    p.a.lane.describe_now(None);
    p.run();
    assert!(matches!(&p.a.transfers[&2][..], [Err(TransportError::Revoked(_))]), "{:?}", p.a.transfers[&2]);
    assert_eq!(transfers_sent(&p), 0, "the owner, whose grant is gone, is not asked");
    assert!(p.a.lane.answered.contains(&(2, false)), "the lane let go of what it prepared");
    assert!(!p.a.dead() && !p.c.dead());
}

#[test]
fn this_sides_part_failing_to_start_after_the_answer_fails_the_transfer() {
    let (mut p, _owners, mine, grant) = pair(64, 5);
    p.a.lane.finish_error = Some("no staging copy".into());
    start(&mut p, 2, TransferOp::Get, &mine, grant, &[(0, 0, 8)]);
    assert!(matches!(&p.a.transfers[&2][..], [Err(TransportError::Unsupported(r))] if r.contains("no staging copy")));
    // Ended: the owner's next answer is not taken for it, the connection lives on.
    p.a.lane.finish_answered();
    p.run();
    assert_eq!(p.a.transfers[&2].len(), 1);
    assert!(!p.a.dead() && !p.c.dead());
}
