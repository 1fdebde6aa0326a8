//! A transfer whose local memory names a producer stream, where the peer or UCX touches
//! that memory (the listener's transfers, which the connector runs): it waits on this
//! side until the lane says the producer's work is done, later transfers wait behind it
//! (they start in their order), and what happens meanwhile (a revocation, the
//! connection's end, a failing check) ends it cleanly.

use super::owner_runs::pair;
use super::pair::*;
use crate::connection::{TransferArgs, TransferSpans};
use crate::error::TransportError;
use crate::region::RegistrationInner;
use crate::test_payload::TestPayload;
use crate::wire::{TransferOp, WireMessage, WireSpan};
use std::sync::Arc;

fn put(p: &mut Pair, id: u64, local: &Arc<RegistrationInner<TestPayload>>, grant: u64, (at, len): (u64, u64)) {
    let spans = TransferSpans::Given(vec![WireSpan { local_offset: at, remote_offset: at, len }]);
    let args = TransferArgs { op: TransferOp::Put, local: local.clone(), grant, spans, notify: None };
    p.act(Who::A, |core, lane, now| core.transfer(id, args, now, lane));
    p.run();
}

fn asked_of_owner(p: &Pair) -> Vec<u64> {
    p.a.sent.iter().filter_map(|m| if let WireMessage::Transfer(t) = m { Some(t.id) } else { None }).collect()
}

fn owners_bytes(p: &Pair, r: &RegistrationInner<TestPayload>) -> Vec<u8> {
    p.mem.borrow().device[&r.frame.as_device().unwrap().device_ptr()].clone()
}

#[test]
fn a_transfer_waits_for_its_producer_and_later_ones_wait_behind_it() {
    let (mut p, owners, mine, grant) = pair(64, 9);
    p.a.lane.transfer_producers_running.insert(2);
    put(&mut p, 2, &mine, grant, (0, 16));
    // Transfer 3's producer is done, but it starts after 2.
    put(&mut p, 3, &mine, grant, (16, 16));
    assert!(asked_of_owner(&p).is_empty(), "the owner may not read the memory yet");
    assert_eq!(p.a.lane.transfer_producers_asked, [2], "3 is not asked while 2 waits");
    // A producer running long is not the owner being late, nor anything's fault.
    p.clock.advance(REQUEST_TIMEOUT * 2);
    p.tick_both();
    assert!(!p.a.dead() && !p.c.dead() && p.a.transfers.is_empty());
    p.a.lane.transfer_producers_running.clear();
    p.tick_both();
    p.run();
    assert_eq!(asked_of_owner(&p), [2, 3], "asked in the order the user started them");
    assert_eq!(p.a.transfers.remove(&2).unwrap(), [Ok(())]);
    assert_eq!(p.a.transfers.remove(&3).unwrap(), [Ok(())]);
    assert!(owners_bytes(&p, &owners)[..32].iter().all(|&b| b == 9), "both moved their bytes");
    assert!(owners_bytes(&p, &owners)[32..].iter().all(|&b| b == 0));
}

#[test]
fn a_region_revoked_while_a_transfer_waits_fails_it_as_revoked() {
    let (mut p, owners, mine, grant) = pair(64, 9);
    p.a.lane.transfer_producers_running.insert(2);
    put(&mut p, 2, &mine, grant, (0, 8));
    assert!(p.c.lane.registry.release_handle(owners.id));
    p.act(Who::C, |core, _, _| core.revoke_registration(owners.id));
    p.run();
    assert!(p.a.sent_kinds().contains(&"RevokeDone"), "no copy of the waiting transfer uses the grant");
    p.a.lane.transfer_producers_running.clear();
    p.tick_both();
    p.run();
    let e = p.a.transfers.remove(&2).unwrap().remove(0).unwrap_err();
    assert!(matches!(e, TransportError::Revoked(_)), "{e}");
    assert!(asked_of_owner(&p).is_empty());
    assert!(!p.a.dead() && !p.c.dead());
}

#[test]
fn a_failing_producer_check_fails_its_transfer_and_the_next_one_runs() {
    let (mut p, owners, mine, grant) = pair(64, 5);
    p.a.lane.transfer_producer_error = Some("the producer stream failed".into());
    put(&mut p, 2, &mine, grant, (0, 8));
    let e = p.a.transfers.remove(&2).unwrap().remove(0).unwrap_err();
    assert!(matches!(&e, TransportError::Unsupported(r) if r.contains("producer stream failed")), "{e}");
    put(&mut p, 3, &mine, grant, (0, 8));
    assert_eq!(p.a.transfers.remove(&3).unwrap(), [Ok(())]);
    assert_eq!(asked_of_owner(&p), [3]);
    assert!(owners_bytes(&p, &owners)[..8].iter().all(|&b| b == 5));
}

#[test]
fn the_connections_end_fails_waiting_transfers_and_forgets_their_marks() {
    let (mut p, _owners, mine, grant) = pair(64, 1);
    p.a.lane.transfer_producers_running.insert(2);
    p.a.lane.transfer_producers_running.insert(3);
    put(&mut p, 2, &mine, grant, (0, 8));
    put(&mut p, 3, &mine, grant, (8, 8));
    p.hang_up_to(Who::A);
    p.run();
    assert!(p.a.dead());
    for id in [2, 3] {
        let e = p.a.transfers.remove(&id).unwrap().remove(0).unwrap_err();
        assert!(!matches!(e, TransportError::Revoked(_)), "transfer {id}: {e}");
    }
    assert!(p.a.lane.discarded.contains(&2) && p.a.lane.discarded.contains(&3));
    assert!(asked_of_owner(&p).is_empty());
}
