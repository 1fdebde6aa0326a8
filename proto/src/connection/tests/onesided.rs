//! One-sided transfers between two cores: imports, `put` and `get` run by either side,
//! batches, notifications, refusals on both sides, revocation, a dying peer.

use super::pair::*;
use super::sim::device_frame;
use crate::connection::{TransferArgs, TransferSpans};
use crate::error::TransportError;
use crate::region::{Access, ImportedRegion, RegistrationInner, RemoteKey};
use crate::test_payload::TestPayload;
use crate::wire::{GrantedMemory, TransferMessage, TransferOp, WireMessage, WireSpan};
use std::sync::Arc;

/// A registration of `len` bytes (holding `fill`) on `who`'s side.
pub(super) fn register(
    p: &mut Pair,
    who: Who,
    len: usize,
    fill: u8,
    access: Access,
) -> Arc<RegistrationInner<TestPayload>> {
    let frame = device_frame(&p.mem, vec![fill; len]);
    p.side(who).lane.registry.register(frame, access)
}

pub(super) fn bytes_of(p: &Pair, r: &RegistrationInner<TestPayload>) -> Vec<u8> {
    p.mem.borrow().device[&r.frame.as_device().unwrap().device_ptr()].clone()
}

pub(super) fn write(p: &Pair, r: &RegistrationInner<TestPayload>, at: usize, data: &[u8]) {
    let ptr = r.frame.as_device().unwrap().device_ptr();
    p.mem.borrow_mut().device.get_mut(&ptr).unwrap()[at..at + data.len()].copy_from_slice(data);
}

/// `who` imports `key` as request `id`; the region.
pub(super) fn import(p: &mut Pair, who: Who, id: u64, key: RemoteKey) -> ImportedRegion {
    p.act(who, |core, _, now| core.import(id, key, now));
    p.run();
    let all = p.side(who).imports.remove(&id).expect("the import completed");
    assert_eq!(all.len(), 1);
    all.into_iter().next().unwrap().expect("granted")
}

pub(super) fn transfer(p: &mut Pair, who: Who, id: u64, args: TransferArgs<TestPayload>) -> Result<(), TransportError> {
    p.act(who, |core, lane, now| core.transfer(id, args, now, lane));
    p.run();
    let all = p.side(who).transfers.remove(&id).expect("the transfer completed");
    assert_eq!(all.len(), 1, "completed once");
    all.into_iter().next().unwrap()
}

pub(super) fn args(
    op: TransferOp,
    local: &Arc<RegistrationInner<TestPayload>>,
    grant: u64,
    spans: &[(u64, u64, u64)],
) -> TransferArgs<TestPayload> {
    let spans = spans.iter().map(|&(local_offset, remote_offset, len)| WireSpan { local_offset, remote_offset, len });
    TransferArgs { op, local: local.clone(), grant, spans: TransferSpans::Given(spans.collect()), notify: None }
}

pub(super) fn notification(p: &mut Pair, who: Who, id: u64) -> Option<Result<Vec<u8>, TransportError>> {
    p.act(who, |core, _, _| core.recv_notification(id));
    p.side(who).notifications.remove(&id).map(|mut v| v.remove(0))
}

#[test]
fn a_put_by_the_copying_side_lands_and_notifies_the_owner_after_the_data() {
    let mut p = Pair::pushing();
    let target = register(&mut p, Who::A, 4096, 0, Access::Write);
    let source = register(&mut p, Who::C, 4096, 7, Access::Read);
    let region = import(&mut p, Who::C, 1, target.key);
    assert_eq!((region.len, region.access, region.device), (4096, Access::Write, true));
    let mut a = args(TransferOp::Put, &source, region.grant, &[(0, 100, 1000), (2000, 3000, 96)]);
    a.notify = Some(b"done".to_vec());
    assert_eq!(transfer(&mut p, Who::C, 2, a), Ok(()));
    let got = bytes_of(&p, &target);
    assert!(got[100..1100].iter().all(|&b| b == 7) && got[3000..3096].iter().all(|&b| b == 7));
    assert!(got[..100].iter().all(|&b| b == 0) && got[1100..3000].iter().all(|&b| b == 0), "the gap is untouched");
    assert_eq!(notification(&mut p, Who::A, 3), Some(Ok(b"done".to_vec())));
    assert!(p.c.sent_kinds().contains(&"Notify") && !p.c.sent_kinds().contains(&"Transfer"));
}

#[test]
fn a_get_by_the_copying_side_reads_the_owners_bytes() {
    let mut p = Pair::pushing();
    let source = register(&mut p, Who::A, 512, 9, Access::Read);
    let into = register(&mut p, Who::C, 512, 0, Access::ReadWrite);
    let region = import(&mut p, Who::C, 1, source.key);
    assert_eq!(transfer(&mut p, Who::C, 2, args(TransferOp::Get, &into, region.grant, &[(10, 0, 502)])), Ok(()));
    let got = bytes_of(&p, &into);
    assert!(got[..10].iter().all(|&b| b == 0) && got[10..].iter().all(|&b| b == 9));
}

#[test]
fn the_listeners_put_and_get_are_run_by_the_connector_which_owns_the_region() {
    let mut p = Pair::pushing();
    let target = register(&mut p, Who::C, 1024, 0, Access::ReadWrite);
    let mine = register(&mut p, Who::A, 1024, 5, Access::ReadWrite);
    let region = import(&mut p, Who::A, 1, target.key);
    let mut a = args(TransferOp::Put, &mine, region.grant, &[(0, 0, 1024)]);
    a.notify = Some(vec![1, 2]);
    assert_eq!(transfer(&mut p, Who::A, 2, a), Ok(()));
    assert!(p.a.sent_kinds().contains(&"Transfer"), "the listener asks; the connector copies");
    assert!(bytes_of(&p, &target).iter().all(|&b| b == 5));
    assert_eq!(notification(&mut p, Who::C, 3), Some(Ok(vec![1, 2])), "the owner got the notification itself");
    write(&p, &target, 0, &[42; 24]);
    assert_eq!(transfer(&mut p, Who::A, 4, args(TransferOp::Get, &mine, region.grant, &[(1000, 0, 24)])), Ok(()));
    assert!(bytes_of(&p, &mine)[1000..].iter().all(|&b| b == 42));
}

#[test]
fn a_batch_of_a_thousand_spans_with_gaps_runs_and_overlaps_are_refused() {
    let block = 64u64;
    let mut p = Pair::pushing();
    let target = register(&mut p, Who::A, (2000 * block) as usize, 0, Access::Write);
    let source = register(&mut p, Who::C, (1000 * block) as usize, 3, Access::Read);
    let region = import(&mut p, Who::C, 1, target.key);
    let spans: Vec<(u64, u64, u64)> = (0..1000).map(|i| (i * block, (999 - i) * 2 * block, block)).collect();
    assert_eq!(transfer(&mut p, Who::C, 2, args(TransferOp::Put, &source, region.grant, &spans)), Ok(()));
    let got = bytes_of(&p, &target);
    for i in 0..1000usize {
        let at = i * 2 * block as usize;
        assert!(got[at..at + block as usize].iter().all(|&b| b == 3), "block {i}");
        assert!(got[at + block as usize..at + 2 * block as usize].iter().all(|&b| b == 0), "gap after {i}");
    }
    let mut overlapping = spans.clone();
    overlapping[500].1 = overlapping[501].1 + 1;
    let e = transfer(&mut p, Who::C, 3, args(TransferOp::Put, &source, region.grant, &overlapping)).unwrap_err();
    assert!(matches!(e, TransportError::InvalidMessage(ref m) if m.contains("overlap")), "{e}");
}

#[test]
fn spans_outside_either_side_and_access_the_key_does_not_grant_are_refused_before_anything_moves() {
    let mut p = Pair::pushing();
    let target = register(&mut p, Who::A, 100, 0, Access::Read);
    let source = register(&mut p, Who::C, 100, 1, Access::Read);
    let region = import(&mut p, Who::C, 1, target.key);
    let refused = |p: &mut Pair, id, op, spans: &[(u64, u64, u64)]| {
        transfer(p, Who::C, id, args(op, &source, region.grant, spans)).unwrap_err().to_string()
    };
    assert!(refused(&mut p, 2, TransferOp::Put, &[(0, 0, 10)]).contains("not writable"));
    assert!(refused(&mut p, 3, TransferOp::Get, &[(0, 1, 100)]).contains("outside the remote region"));
    assert!(refused(&mut p, 4, TransferOp::Get, &[(1, 0, 100)]).contains("outside the local memory"));
    assert!(refused(&mut p, 5, TransferOp::Get, &[(0, 100, 1)]).contains("outside the remote region"));
    assert_eq!(transfer(&mut p, Who::C, 6, args(TransferOp::Get, &source, region.grant, &[(99, 99, 1)])), Ok(()));
    assert!(bytes_of(&p, &target).iter().all(|&b| b == 0), "nothing was written");
}

#[test]
fn a_lying_initiator_is_refused_by_the_owner() {
    let mut p = Pair::pushing();
    let target = register(&mut p, Who::C, 100, 0, Access::Write);
    let mine = register(&mut p, Who::A, 100, 1, Access::Read);
    let region = import(&mut p, Who::A, 1, target.key);
    let local = GrantedMemory::Device(crate::wire::DeviceFrameDescriptor {
        memory: crate::wire::DeviceMemory::LegacyIpc {
            handle: [7; 64],
            buffer_id: mine.frame.as_device().unwrap().device_ptr(),
            alloc_len: 100,
        },
        offset: 0,
        len: 100,
        device_uuid: [1; 16],
        event: None,
    });
    for (id, op, spans) in [
        (9, TransferOp::Put, vec![WireSpan { local_offset: 0, remote_offset: 50, len: 51 }]),
        (10, TransferOp::Get, vec![WireSpan { local_offset: 0, remote_offset: 0, len: 1 }]),
        (
            11,
            TransferOp::Put,
            vec![
                WireSpan { local_offset: 0, remote_offset: 0, len: 10 },
                WireSpan { local_offset: 20, remote_offset: 5, len: 10 },
            ],
        ),
    ] {
        let t =
            TransferMessage { id, op, grant: region.grant, local: local.clone(), local_len: 100, spans, notify: None };
        p.inject(Who::C, WireMessage::Transfer(Box::new(t)), vec![]);
        let last = p.c.sent.last().cloned();
        assert!(
            matches!(last, Some(WireMessage::TransferDone { id: d, outcome: crate::wire::TransferOutcome::Failed(_) }) if d == id),
            "{last:?}"
        );
    }
    assert!(bytes_of(&p, &target).iter().all(|&b| b == 0), "a lying peer wrote nothing");
    assert!(!p.c.dead(), "a refusal, not the end of the connection");
    // A transfer on a grant never given is a protocol violation.
    let spans = vec![WireSpan { local_offset: 0, remote_offset: 0, len: 1 }];
    let t = TransferMessage { id: 12, op: TransferOp::Put, grant: 99, local, local_len: 100, spans, notify: None };
    p.inject(Who::C, WireMessage::Transfer(Box::new(t)), vec![]);
    assert!(p.death(Who::C).contains("unknown grant 99"));
}

/// What the owner (the connector) last answered transfer `id`.
fn answer_to(p: &Pair, id: u64) -> Option<crate::wire::TransferOutcome> {
    p.c.sent.iter().rev().find_map(|m| match m {
        WireMessage::TransferDone { id: done, outcome } if *done == id => Some(outcome.clone()),
        _ => None,
    })
}

#[test]
fn an_initiator_claiming_more_local_memory_than_the_owners_region_cannot_reach_past_that_region() {
    let mut p = Pair::pushing();
    let target = register(&mut p, Who::C, 100, 0, Access::ReadWrite);
    let mine = register(&mut p, Who::A, 100, 1, Access::Read);
    let region = import(&mut p, Who::A, 1, target.key);
    let ptr = mine.frame.as_device().unwrap().device_ptr();
    let local = GrantedMemory::Device(super::sim::device_desc(ptr, 1 << 40));
    // Within the claimed local memory, 24 bytes past the owner's 100.
    let past = WireSpan { local_offset: 0, remote_offset: 60, len: 64 };
    let fits = |i: u64| WireSpan { local_offset: i * 8, remote_offset: i * 8, len: 8 };
    let lie = |id, op, spans: Vec<WireSpan>| {
        let t = TransferMessage {
            id,
            op,
            grant: region.grant,
            local: local.clone(),
            local_len: 1 << 40,
            spans,
            notify: None,
        };
        Box::new(t)
    };
    let asks = [
        lie(2, TransferOp::Put, vec![past]),
        lie(3, TransferOp::Get, vec![past]),
        lie(4, TransferOp::Put, vec![fits(0), fits(1), WireSpan { local_offset: 16, ..past }]),
    ];
    for t in asks {
        let id = t.id;
        p.inject(Who::C, WireMessage::Transfer(t), vec![]);
        let answer = answer_to(&p, id);
        let refused = matches!(&answer, Some(crate::wire::TransferOutcome::Failed(r)) if r.contains("outside the remote region of 100 bytes"));
        assert!(refused, "transfer {id}: {answer:?}");
    }
    p.inject(Who::C, WireMessage::Prepare(lie(5, TransferOp::Put, vec![fits(0), past])), vec![]);
    p.inject(Who::C, WireMessage::RunPrepared { id: 6, prepared: 5, notify: None }, vec![]);
    let answer = answer_to(&p, 6);
    let refused = matches!(&answer, Some(crate::wire::TransferOutcome::Failed(r)) if r.contains("outside the remote region of 100 bytes"));
    assert!(refused, "the prepared run: {answer:?}");
    assert!(bytes_of(&p, &target).iter().all(|&b| b == 0), "nothing was written");
    assert!(!p.c.dead(), "refusals, not the end of the connection");
}

#[test]
fn keys_that_are_not_the_owners_or_are_stale_are_refused() {
    let mut p = Pair::pushing();
    let reg = register(&mut p, Who::A, 64, 0, Access::Write);
    let key = reg.key;
    let refused = |p: &mut Pair, id, key: RemoteKey| {
        p.act(Who::C, |core, _, now| core.import(id, key, now));
        p.run();
        p.c.imports.remove(&id).unwrap().remove(0).unwrap_err().to_string()
    };
    assert!(refused(&mut p, 1, RemoteKey { secret: key.secret ^ 1, ..key }).contains("does not match"));
    let other = crate::region::Registry::<TestPayload>::new(crate::region::counted_ids)
        .register(device_frame(&p.mem, vec![0; 64]), Access::Write);
    assert!(refused(&mut p, 2, other.key).contains("another context"));
    // Revoked while a grant holds it: refused as revoked; once gone: as unknown.
    let _held = import(&mut p, Who::C, 5, key);
    assert!(p.a.lane.registry.release_handle(reg.id), "revoked");
    assert!(refused(&mut p, 3, key).contains("revoked"));
    let other = register(&mut p, Who::A, 64, 0, Access::Write);
    assert!(p.a.lane.registry.release_handle(other.id));
    assert!(refused(&mut p, 6, other.key).contains("does not exist"));
    // Garbage key bytes from a peer are refused with the parse error.
    p.inject(Who::A, WireMessage::ImportKey { request: 4, key: vec![0; 10] }, vec![]);
    let answer = p.a.sent.last().cloned();
    assert!(
        matches!(answer, Some(WireMessage::ImportAnswer { answer: crate::wire::ImportAnswer::Refused(ref r), .. }) if r.contains("48 bytes")),
        "{answer:?}"
    );
}

#[test]
fn a_revocation_during_a_put_fails_it_at_the_initiator_and_frees_the_memory_after() {
    let mut p = Pair::pushing();
    let target = register(&mut p, Who::A, 256, 0, Access::Write);
    let source = register(&mut p, Who::C, 256, 4, Access::Read);
    let region = import(&mut p, Who::C, 1, target.key);
    p.c.lane.hold_transfers = true;
    p.act(Who::C, |core, lane, now| {
        core.transfer(2, args(TransferOp::Put, &source, region.grant, &[(0, 0, 256)]), now, lane)
    });
    assert!(p.c.transfers.is_empty(), "its copies run");
    // The owner revokes while they run.
    assert!(p.a.lane.registry.release_handle(target.id));
    p.act(Who::A, |core, _, _| core.revoke_registration(target.id));
    p.run();
    assert!(!p.c.sent_kinds().contains(&"RevokeDone"), "not while a copy uses the region");
    assert_eq!(p.a.lane.registry.held(), 1, "the owner keeps the memory meanwhile");
    p.c.lane.complete_transfers();
    p.run();
    let e = p.c.transfers.remove(&2).unwrap().remove(0).unwrap_err();
    assert!(matches!(e, TransportError::Revoked(_)), "{e}");
    assert!(p.c.sent_kinds().contains(&"RevokeDone"));
    assert_eq!(p.a.lane.registry.held(), 0, "the memory goes once the importer let go");
    assert_eq!(p.c.lane.closed_grants, [region.grant]);
    // A transfer after the revocation fails at once.
    let e = transfer(&mut p, Who::C, 3, args(TransferOp::Put, &source, region.grant, &[(0, 0, 1)])).unwrap_err();
    assert!(matches!(e, TransportError::Revoked(_) | TransportError::Unsupported(_)), "{e}");
}

#[test]
fn the_owners_death_fails_every_pending_transfer_and_import() {
    let mut p = Pair::pushing();
    let target = register(&mut p, Who::C, 256, 0, Access::Write);
    let mine = register(&mut p, Who::A, 256, 4, Access::Read);
    let region = import(&mut p, Who::A, 1, target.key);
    // The listener's transfers are run by the connector, which dies before it answers.
    for id in 2..12 {
        p.act(Who::A, |core, lane, now| {
            core.transfer(id, args(TransferOp::Put, &mine, region.grant, &[(0, 0, 8)]), now, lane)
        });
    }
    p.act(Who::A, |core, _, now| core.import(20, target.key, now));
    p.act(Who::A, |core, _, _| core.recv_notification(21));
    p.inbox_clear(Who::C);
    p.act(Who::A, |core, lane, _| core.peer_closed(lane));
    for id in 2..12 {
        assert!(matches!(p.a.transfers[&id][0], Err(TransportError::PeerClosed { .. })), "transfer {id}");
    }
    assert!(p.a.imports[&20][0].is_err() && p.a.notifications[&21][0].is_err());
    assert_eq!(p.a.lane.closed_grants, [region.grant], "the import is let go");
}

#[test]
fn a_dropped_region_is_given_back_and_a_dying_importer_releases_its_grants() {
    let mut p = Pair::pushing();
    let target = register(&mut p, Who::A, 64, 0, Access::Write);
    let region = import(&mut p, Who::C, 1, target.key);
    let _second = import(&mut p, Who::C, 2, target.key);
    p.act(Who::C, |core, lane, _| core.unimport(region.grant, lane));
    p.run();
    assert_eq!(p.a.lane.released, [target.id]);
    assert!(p.a.lane.registry.release_handle(target.id));
    assert_eq!(p.a.lane.registry.held(), 1, "the second import still maps it");
    p.close(Who::C);
    p.run();
    assert_eq!(p.a.lane.registry.held(), 0, "the importer's end releases its grant");
}

#[test]
fn notifications_wait_in_order_and_a_deadline_ends_a_wait() {
    let mut p = Pair::pushing();
    let target = register(&mut p, Who::A, 64, 0, Access::Write);
    let source = register(&mut p, Who::C, 64, 1, Access::Read);
    let region = import(&mut p, Who::C, 1, target.key);
    for (id, note) in [(2u64, b"one".to_vec()), (3, b"two".to_vec())] {
        let mut a = args(TransferOp::Put, &source, region.grant, &[(0, 0, 8)]);
        a.notify = Some(note);
        assert_eq!(transfer(&mut p, Who::C, id, a), Ok(()));
    }
    assert_eq!(notification(&mut p, Who::A, 4), Some(Ok(b"one".to_vec())));
    assert_eq!(notification(&mut p, Who::A, 5), Some(Ok(b"two".to_vec())));
    assert_eq!(notification(&mut p, Who::A, 6), None, "waits");
    p.cancel(Who::A, 6);
    assert!(matches!(p.a.notifications[&6][0], Err(TransportError::TimedOut(_))));
}

#[test]
fn an_import_the_owner_never_answers_fails_the_connection_after_the_request_timeout() {
    let mut p = Pair::pushing();
    let target = register(&mut p, Who::A, 64, 0, Access::Write);
    p.act(Who::C, |core, _, now| core.import(1, target.key, now));
    p.inbox_clear(Who::A);
    p.clock.advance(settings().request_timeout * 2);
    p.tick(Who::C);
    assert!(p.death(Who::C).contains("import 1 not answered"));
    assert!(p.c.imports[&1][0].is_err());
}
