//! Prepared transfers in the core: described to the owner once (`Prepare`) and named by
//! each run (`RunPrepared`) where the owner's lane keeps them, sent whole where it does
//! not, refused by the owner as a whole transfer would be, forgotten on both sides when
//! the user drops one or the grant ends, and a peer that names what it never prepared
//! (or prepares too much) ends the connection.

use super::pair::*;
use super::sim::device_frame;
use crate::connection::{PreparedSpans, TransferArgs, TransferSpans};
use crate::error::TransportError;
use crate::region::{Access, RegistrationInner};
use crate::test_payload::TestPayload;
use crate::wire::{
    GrantedMemory, TransferMessage, TransferOp, WireMessage, WireSpan, MAX_PREPARED, MAX_PREPARED_SPANS, MAX_SPANS,
};
use std::sync::Arc;

/// A pair where `who` imported a 256-byte region of the other side's holding 0; `who`'s
/// registration holds `fill`. The listener (`A`) asks the connector to run its
/// transfers; the connector (`C`) runs its own.
fn pair(who: Who, fill: u8) -> (Pair, Arc<RegistrationInner<TestPayload>>, Arc<RegistrationInner<TestPayload>>, u64) {
    let mut p = Pair::pushing();
    let (theirs, ours) = (device_frame(&p.mem, vec![0; 256]), device_frame(&p.mem, vec![fill; 256]));
    let owners = p.side(who.other()).lane.registry.register(theirs, Access::ReadWrite);
    let mine = p.side(who).lane.registry.register(ours, Access::ReadWrite);
    p.act(who, |core, _, now| core.import(1, owners.key, now));
    p.run();
    let region = p.side(who).imports.remove(&1).unwrap().remove(0).expect("granted");
    (p, owners, mine, region.grant)
}

fn prepared(id: u64, spans: &[(u64, u64, u64)]) -> TransferSpans {
    let spans = spans.iter().map(|&(local_offset, remote_offset, len)| WireSpan { local_offset, remote_offset, len });
    TransferSpans::Prepared(Arc::new(PreparedSpans { id, spans: spans.collect() }))
}

fn post(
    p: &mut Pair,
    who: Who,
    id: u64,
    (local, grant): (&Arc<RegistrationInner<TestPayload>>, u64),
    spans: &TransferSpans,
) {
    let args = TransferArgs {
        op: TransferOp::Put,
        local: local.clone(),
        grant,
        spans: spans.clone(),
        notify: Some(vec![id as u8]),
    };
    p.act(who, |core, lane, now| core.transfer(id, args, now, lane));
    p.run();
}

fn bytes_of(p: &Pair, r: &RegistrationInner<TestPayload>) -> Vec<u8> {
    p.mem.borrow().device[&r.frame.as_device().unwrap().device_ptr()].clone()
}

fn set_bytes(p: &Pair, r: &RegistrationInner<TestPayload>, value: u8) {
    p.mem.borrow_mut().device.get_mut(&r.frame.as_device().unwrap().device_ptr()).unwrap().fill(value);
}

fn kinds_sent(p: &Pair, who: Who) -> Vec<&'static str> {
    let s = match who {
        Who::A => &p.a,
        Who::C => &p.c,
    };
    s.sent
        .iter()
        .filter_map(|m| Some(crate::connection::kind(m)).filter(|k| k.contains("repar") || *k == "Transfer"))
        .collect()
}

#[test]
fn a_prepared_transfer_is_described_once_and_named_by_each_run() {
    let (mut p, owners, mine, grant) = pair(Who::A, 5);
    let spans = prepared(70, &[(0, 0, 16), (32, 100, 16)]);
    for (run, fill) in [(2u64, 5u8), (3, 6), (4, 7)] {
        set_bytes(&p, &mine, fill);
        post(&mut p, Who::A, run, (&mine, grant), &spans);
        assert_eq!(p.a.transfers.remove(&run).unwrap(), [Ok(())], "run {run}");
        let theirs = bytes_of(&p, &owners);
        assert!(theirs[..16].iter().chain(&theirs[100..116]).all(|&b| b == fill), "run {run} moved its bytes");
        assert!(theirs[16..100].iter().all(|&b| b == 0), "nothing between the spans");
        p.act(Who::C, |core, _, _| core.recv_notification(run));
        assert_eq!(p.c.notifications[&run], [Ok(vec![run as u8])], "each run notifies");
    }
    assert_eq!(kinds_sent(&p, Who::A), ["Prepare", "RunPrepared", "RunPrepared", "RunPrepared"]);
    assert_eq!(p.c.lane.prepared_runs, [(false, 70); 3], "the owner's lane knew the prepared transfer each time");
    // Dropped: the owner forgets it too.
    p.act(Who::A, |core, lane, _| core.unprepare(70, lane));
    p.run();
    assert_eq!(kinds_sent(&p, Who::A).last(), Some(&"Unprepare"));
    assert_eq!(p.a.lane.prepared_released, [(70, true)]);
    assert_eq!(p.c.lane.prepared_released, [(70, false)]);
    // Posting again (another handle with the same spans) describes it again.
    post(&mut p, Who::A, 5, (&mine, grant), &spans);
    assert_eq!(p.a.transfers.remove(&5).unwrap(), [Ok(())]);
    assert_eq!(&kinds_sent(&p, Who::A)[5..], ["Prepare", "RunPrepared"]);
    assert!(!p.a.dead() && !p.c.dead());
}

#[test]
fn an_owner_that_keeps_nothing_gets_whole_transfers_and_a_runner_runs_its_own() {
    let (mut p, _owners, mine, grant) = pair(Who::A, 1);
    // Both sides run one lane: the initiator's answers for the owner's.
    p.a.lane.keeps_prepared = false;
    let spans = prepared(9, &[(0, 0, 8)]);
    post(&mut p, Who::A, 2, (&mine, grant), &spans);
    post(&mut p, Who::A, 3, (&mine, grant), &spans);
    assert_eq!(kinds_sent(&p, Who::A), ["Transfer", "Transfer"]);
    assert_eq!(p.a.transfers.len(), 2);
    p.act(Who::A, |core, lane, _| core.unprepare(9, lane));
    p.run();
    assert_eq!(kinds_sent(&p, Who::A), ["Transfer", "Transfer"], "nothing to forget at the owner");

    // The connector runs its own: its lane gets the prepared id, nothing is described.
    let (mut p, owners, mine, grant) = pair(Who::C, 4);
    let spans = prepared(11, &[(0, 8, 8)]);
    post(&mut p, Who::C, 2, (&mine, grant), &spans);
    assert_eq!(p.c.transfers.remove(&2).unwrap(), [Ok(())]);
    assert_eq!(p.c.lane.prepared_runs, [(true, 11)]);
    assert!(kinds_sent(&p, Who::C).is_empty());
    assert!(bytes_of(&p, &owners)[8..16].iter().all(|&b| b == 4));
}

#[test]
fn runs_after_a_revocation_fail_and_the_grants_end_forgets_the_prepared() {
    let (mut p, owners, mine, grant) = pair(Who::A, 3);
    let spans = prepared(40, &[(0, 0, 8)]);
    post(&mut p, Who::A, 2, (&mine, grant), &spans);
    assert_eq!(p.a.transfers.remove(&2).unwrap(), [Ok(())]);
    // A run that crosses the owner's revocation is refused by the owner.
    p.c.lane.registry.release_handle(owners.id);
    p.act(Who::C, |core, _, _| core.revoke_registration(owners.id));
    let args = TransferArgs { op: TransferOp::Put, local: mine.clone(), grant, spans: spans.clone(), notify: None };
    p.act(Who::A, |core, lane, now| core.transfer(3, args, now, lane));
    p.run();
    assert!(
        matches!(&p.a.transfers[&3][..], [Err(TransportError::Refused { reason, .. })] if reason.contains("revoked"))
    );
    assert_eq!(p.c.lane.prepared_released, [(40, false)], "the grant's end forgot it");
    // After it, the initiator refuses at once.
    post(&mut p, Who::A, 4, (&mine, grant), &spans);
    assert!(matches!(&p.a.transfers[&4][..], [Err(TransportError::Revoked(_))]));
    // Dropping it now has nothing to tell the owner.
    p.act(Who::A, |core, lane, _| core.unprepare(40, lane));
    p.run();
    assert!(!kinds_sent(&p, Who::A).contains(&"Unprepare"));
    assert!(!p.a.dead() && !p.c.dead());
}

#[test]
fn a_run_on_a_dropped_region_says_so() {
    let (mut p, _owners, mine, grant) = pair(Who::A, 3);
    let spans = prepared(41, &[(0, 0, 8)]);
    p.act(Who::A, |core, lane, _| core.unimport(grant, lane));
    p.run();
    post(&mut p, Who::A, 2, (&mine, grant), &spans);
    assert!(matches!(&p.a.transfers[&2][..], [Err(TransportError::Revoked(r))] if r.contains("dropped")));
}

/// A prepared transfer as a hostile initiator would describe it.
fn prepare_message(id: u64, grant: u64, spans: Vec<WireSpan>) -> WireMessage {
    let memory = GrantedMemory::Device(super::sim::device_desc(1 << 40, 256));
    let t = TransferMessage { id, op: TransferOp::Put, grant, local: memory, local_len: 256, spans, notify: None };
    WireMessage::Prepare(Box::new(t))
}

#[test]
fn the_owner_checks_a_prepared_transfer_and_refuses_each_run_of_a_bad_one() {
    let (mut p, _owners, _mine, grant) = pair(Who::A, 3);
    // Outside the owner's region: kept as refused, each run answered so.
    p.inject(Who::C, prepare_message(1, grant, vec![WireSpan { local_offset: 0, remote_offset: 250, len: 8 }]), vec![]);
    for run in [7, 8] {
        p.inject(Who::C, WireMessage::RunPrepared { id: run, prepared: 1, notify: None }, vec![]);
        let done = p.c.sent.iter().rev().find_map(|m| match m {
            WireMessage::TransferDone { id, outcome } if *id == run => Some(outcome.clone()),
            _ => None,
        });
        assert!(matches!(&done, Some(crate::wire::TransferOutcome::Failed(r)) if r.contains("outside")), "{done:?}");
    }
    assert!(p.c.lane.prepared_runs.is_empty(), "nothing ran");
    assert!(!p.c.dead());
}

#[test]
fn a_peer_naming_what_it_never_prepared_or_preparing_too_much_ends_the_connection() {
    type Hostile = fn(u64) -> Vec<WireMessage>;
    let cases: [(&str, Hostile); 5] = [
        ("unknown prepared", |_| vec![WireMessage::RunPrepared { id: 3, prepared: 99, notify: None }]),
        ("end of unknown prepared", |_| vec![WireMessage::Unprepare { prepared: 99 }]),
        ("given twice", |g| vec![prepare_message(5, g, span()), prepare_message(5, g, span())]),
        ("unknown grant", |g| vec![prepare_message(5, g + 100, span())]),
        ("more than", |g| (0..=MAX_PREPARED as u64).map(|i| prepare_message(i, g, span())).collect()),
    ];
    for (what, messages) in cases {
        let (mut p, _owners, _mine, grant) = pair(Who::A, 3);
        for m in messages(grant) {
            p.inject(Who::C, m, vec![]);
        }
        assert!(p.c.dead(), "{what}: the connection ends");
    }
}

#[test]
fn prepared_spans_up_to_their_limit_are_kept_and_one_more_ends_the_connection() {
    let (mut p, _owners, _mine, grant) = pair(Who::A, 3);
    let transfers = (MAX_PREPARED_SPANS / MAX_SPANS) as u64;
    for id in 0..transfers {
        p.inject(Who::C, prepare_message(id, grant, vec![span()[0]; MAX_SPANS]), vec![]);
    }
    assert!(!p.c.dead(), "exactly {MAX_PREPARED_SPANS} prepared spans are kept");
    p.inject(Who::C, prepare_message(transfers, grant, span()), vec![]);
    assert!(p.death(Who::C).contains(&format!("{MAX_PREPARED_SPANS} spans of them")));
}

fn span() -> Vec<WireSpan> {
    vec![WireSpan { local_offset: 0, remote_offset: 0, len: 8 }]
}
