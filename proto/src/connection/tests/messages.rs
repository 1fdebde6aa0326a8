//! Each message type, well-formed and not, on an established connection.

use super::pair::*;
use crate::connection::machine::REGION_SWEEP_EVERY;
use crate::wire::{
    AckResult, DataMessage, DeviceFrameDescriptor, DeviceMemory, FrameDescriptor, RegionAnnouncement, WireMessage,
};
use std::os::fd::OwnedFd;

fn fd() -> OwnedFd {
    std::fs::File::open("/dev/null").expect("/dev/null").into()
}

fn target(len: u64) -> DeviceFrameDescriptor {
    DeviceFrameDescriptor {
        memory: DeviceMemory::LegacyIpc { handle: [0; 64], buffer_id: 9, alloc_len: len },
        offset: 0,
        len,
        device_uuid: [0; 16],
        event: None,
    }
}

fn data(seq: u64, frames: Vec<FrameDescriptor>) -> WireMessage {
    WireMessage::Data(DataMessage { seq, header: seq.to_le_bytes().to_vec(), frames })
}

#[test]
fn a_message_round_trips_inline_and_through_a_region() {
    let mut p = Pair::established();
    p.recv(Who::A, 10, None);
    p.send(Who::C, 1, msg(1, &[3, 1000, 0]));
    p.run();
    assert_eq!(p.c.sent_kinds(), ["Regions", "Data"]);
    assert_eq!(p.a.sent_kinds(), ["Welcome", "Ack"]);
    assert_msg(&p.mem, p.a.recv_result(10).as_ref().expect("delivered"), 1, &[3, 1000, 0]);
    assert_msg(&p.mem, p.c.send_result(1).as_ref().expect("acknowledged"), 1, &[3, 1000, 0]);
    assert_eq!(p.c.lane.staged_bytes(), 0, "the ack frees staging");
}

#[test]
fn regions_with_too_few_descriptors_are_a_protocol_error() {
    let mut p = Pair::established();
    let list = vec![RegionAnnouncement::host(1, 8), RegionAnnouncement::host(2, 8)];
    p.inject(Who::A, WireMessage::Regions(list), vec![fd()]);
    assert!(p.death(Who::A).contains("2 regions announced but 1 descriptors arrived"));
    assert_eq!(p.a.lane.closed, 1);
}

#[test]
fn regions_with_their_descriptors_are_imported() {
    let mut p = Pair::established();
    let list = vec![RegionAnnouncement::host(1, 8)];
    p.inject(Who::A, WireMessage::Regions(list), vec![fd(), fd()]);
    assert!(!p.a.dead());
    assert_eq!(p.a.fds.len(), 1, "one descriptor taken, one left for a later message");
}

#[test]
fn data_out_of_sequence_is_a_protocol_error() {
    let mut p = Pair::established();
    p.recv(Who::A, 1, None);
    p.inject(Who::A, data(0, vec![FrameDescriptor::Inline(vec![1])]), vec![]);
    assert!(!p.a.dead() && p.a.recv_result(1).is_ok());
    p.inject(Who::A, data(2, vec![]), vec![]);
    assert!(p.death(Who::A).contains("message 2 arrived where 1 was due"));
}

#[test]
fn data_with_a_duplicated_sequence_number_is_a_protocol_error_not_a_second_delivery() {
    let mut p = Pair::established();
    p.recv(Who::A, 1, None);
    p.recv(Who::A, 2, None);
    p.inject(Who::A, data(0, vec![FrameDescriptor::Inline(vec![1])]), vec![]);
    assert!(p.a.recv_result(1).is_ok());
    p.inject(Who::A, data(0, vec![FrameDescriptor::Inline(vec![1])]), vec![]);
    assert!(p.death(Who::A).contains("message 0 arrived where 1 was due"));
    assert!(p.a.recv_result(2).is_err(), "the duplicate is not delivered");
}

#[test]
fn data_replaying_an_earlier_sequence_number_is_a_protocol_error_not_a_second_delivery() {
    let mut p = Pair::established();
    for id in 1..=3 {
        p.recv(Who::A, id, None);
    }
    p.inject(Who::A, data(0, vec![FrameDescriptor::Inline(vec![1])]), vec![]);
    p.inject(Who::A, data(1, vec![FrameDescriptor::Inline(vec![2])]), vec![]);
    assert!(p.a.recv_result(1).is_ok() && p.a.recv_result(2).is_ok());
    p.inject(Who::A, data(0, vec![FrameDescriptor::Inline(vec![1])]), vec![]);
    assert!(p.death(Who::A).contains("message 0 arrived where 2 was due"));
    assert!(p.a.recv_result(3).is_err(), "the replay is not delivered");
}

#[test]
fn data_pointing_at_memory_never_announced_is_the_peers_lie() {
    let mut p = Pair::established();
    p.recv(Who::A, 5, None);
    p.inject(Who::A, data(0, vec![FrameDescriptor::HostRegion { region_id: 77, offset: 0, len: 4 }]), vec![]);
    assert!(p.death(Who::A).contains("protocol violation: unknown region 77"));
    let e = p.a.recv_result(5).as_ref().expect_err("failed");
    assert!(e.error.to_string().contains("unknown region 77"));
    assert!(!p.a.sent_kinds().contains(&"Ack"));
}

#[test]
fn data_outside_its_region_is_the_peers_lie() {
    let mut p = Pair::established();
    p.send(Who::C, 1, msg(1, &[500]));
    let Some(WireMessage::Regions(list)) = p.c.sent.first().cloned() else { panic!("no Regions") };
    p.deliver(Who::A); // the Regions, with their descriptor
    p.inbox_clear(Who::A);
    let region_id = list[0].region_id;
    p.inject(Who::A, data(0, vec![FrameDescriptor::HostRegion { region_id, offset: 400, len: 200 }]), vec![]);
    assert!(p.death(Who::A).contains("frame outside region"));
}

#[test]
fn an_ack_of_an_unknown_message_is_a_protocol_error() {
    let mut p = Pair::established();
    p.inject(Who::C, WireMessage::Ack { seq: 0, result: AckResult::Delivered }, vec![]);
    assert!(p.death(Who::C).contains("acknowledgement of unknown message 0"));
}

#[test]
fn a_duplicate_ack_is_a_protocol_error_and_the_first_one_counted() {
    let mut p = Pair::established();
    p.recv(Who::A, 10, None);
    p.send(Who::C, 1, msg(1, &[8]));
    p.run();
    assert!(p.c.send_result(1).is_ok());
    p.inject(Who::C, WireMessage::Ack { seq: 0, result: AckResult::Delivered }, vec![]);
    assert!(p.death(Who::C).contains("acknowledgement of unknown message 0"));
    assert_eq!(p.c.sends[&1].len(), 1, "the send completed once");
}

#[test]
fn a_second_ack_while_the_lane_still_holds_the_frames_is_out_of_turn() {
    let mut p = Pair::established();
    p.c.lane.release_pending = true;
    p.send(Who::C, 1, msg(1, &[8]));
    p.run();
    assert!(p.c.sends.is_empty(), "acknowledged, but the lane still uses the frames");
    p.inject(Who::C, WireMessage::Ack { seq: 0, result: AckResult::Delivered }, vec![]);
    assert!(p.death(Who::C).contains("message 0 acknowledged out of turn"));
    // Acknowledged before: it settles as delivered, whole.
    assert_msg(&p.mem, p.c.send_result(1).as_ref().expect("delivered before the failure"), 1, &[8]);
}

#[test]
fn an_ack_of_a_message_awaiting_push_targets_is_out_of_turn() {
    let mut p = Pair::pushing();
    let m = super::push::device_msg(&p.mem, 1, &[64]);
    p.send(Who::C, 1, m);
    assert_eq!(p.c.sent_kinds(), ["Data"]);
    p.inject(Who::C, WireMessage::Ack { seq: 0, result: AckResult::Delivered }, vec![]);
    assert!(p.death(Who::C).contains("message 0 acknowledged out of turn"));
    assert!(p.c.send_result(1).as_ref().is_err_and(|e| e.message.as_ref().is_some_and(|m| m.frames.len() == 1)));
}

#[test]
fn forget_region_reaches_the_lane_and_dropped_regions_are_announced() {
    let mut p = Pair::established();
    p.inject(Who::A, WireMessage::ForgetRegion { region_id: 42 }, vec![]);
    assert_eq!(p.a.lane.forgotten, [42]);
    p.c.lane.dropped = vec![5, 6];
    p.tick(Who::C);
    assert!(p.c.sent_kinds().is_empty(), "an idle turn asks the lane at most every {REGION_SWEEP_EVERY:?}");
    p.clock.advance(REGION_SWEEP_EVERY);
    p.tick(Who::C);
    assert_eq!(p.c.sent_kinds(), ["ForgetRegion", "ForgetRegion"]);
    p.run();
    assert_eq!(p.a.lane.forgotten, [42, 5, 6]);
    assert!(!p.a.dead() && !p.c.dead());
}

#[test]
fn goodbye_ends_the_peer_with_peer_closed() {
    let mut p = Pair::established();
    p.recv(Who::A, 10, None);
    p.recv(Who::C, 11, None);
    p.close(Who::C);
    assert_eq!(p.c.sent_kinds(), ["Goodbye"]);
    assert!(p.c.recv_result(11).as_ref().is_err_and(|e| e.error == crate::error::TransportError::EndpointClosed));
    assert!(p.c.core.is_finished());
    p.run();
    assert!(p.death(Who::A).contains("closed the connection"));
    let e = p.a.recv_result(10).as_ref().expect_err("closed");
    assert!(matches!(e.error, crate::error::TransportError::PeerClosed { .. }));
    assert!(!p.a.core.is_finished(), "the user still holds the endpoint");
    p.close(Who::A);
    assert!(p.a.core.is_finished());
    assert_eq!(p.a.closed, 1, "closing a dead connection closes nothing again");
}

#[test]
fn reject_on_an_established_connection_ends_it() {
    let mut p = Pair::established();
    p.inject(Who::C, WireMessage::Reject { reason: "bored".into() }, vec![]);
    assert!(p.death(Who::C).contains("the peer gave up: bored"));
}

#[test]
fn push_messages_on_a_pull_connection_are_unexpected() {
    let cases = [
        WireMessage::PushTargets { seq: 0, targets: vec![target(8)] },
        WireMessage::PushDone { seq: 0 },
        WireMessage::PushOffer { offer: 0, targets: vec![target(8)], for_seq: None },
        WireMessage::DeclineOffer { offer: 0 },
    ];
    let expected = ["unexpected message PushTargets", "unexpected message PushDone", "push offer to a side", "decline"];
    for (message, text) in cases.into_iter().zip(expected) {
        for who in [Who::C, Who::A] {
            let mut p = Pair::established();
            p.inject(who, message.clone(), vec![]);
            let death = p.death(who);
            assert!(death.contains(text), "{who:?}: {death}");
        }
    }
}

#[test]
fn push_targets_for_unknown_or_unpushed_messages_are_protocol_errors() {
    let mut p = Pair::pushing();
    p.inject(Who::C, WireMessage::PushTargets { seq: 3, targets: vec![target(8)] }, vec![]);
    assert!(p.death(Who::C).contains("push targets for unknown message 3"));

    let mut p = Pair::pushing();
    p.send(Who::C, 1, msg(1, &[8]));
    p.inbox_clear(Who::A);
    p.inject(Who::C, WireMessage::PushTargets { seq: 0, targets: vec![target(8)] }, vec![]);
    assert!(p.death(Who::C).contains("push targets for message 0, which has none to fill"));
    let e = p.c.send_result(1).as_ref().expect_err("failed");
    assert_msg(&p.mem, e.message.as_ref().expect("handed back"), 1, &[8]);
}

#[test]
fn push_done_out_of_turn_is_a_protocol_error() {
    let mut p = Pair::pushing();
    p.inject(Who::A, WireMessage::PushDone { seq: 0 }, vec![]);
    assert!(p.death(Who::A).contains("push of message 0 done out of turn"));
    // The connector never receives PushDone.
    let mut p = Pair::pushing();
    p.inject(Who::C, WireMessage::PushDone { seq: 0 }, vec![]);
    assert!(p.death(Who::C).contains("unexpected message PushDone"));
}

#[test]
fn push_offers_out_of_order_empty_or_too_many_are_protocol_errors() {
    let mut p = Pair::pushing();
    p.inject(Who::C, WireMessage::PushOffer { offer: 4, targets: vec![target(8)], for_seq: None }, vec![]);
    assert!(!p.c.dead(), "a first offer is fine");
    p.inject(Who::C, WireMessage::PushOffer { offer: 4, targets: vec![target(8)], for_seq: None }, vec![]);
    assert!(p.death(Who::C).contains("push offer 4 out of turn"));

    let mut p = Pair::pushing();
    p.inject(Who::C, WireMessage::PushOffer { offer: 0, targets: vec![], for_seq: None }, vec![]);
    assert!(p.death(Who::C).contains("push offer 0 has no buffers"));

    let mut p = Pair::pushing();
    for offer in 0..2 {
        p.inject(Who::C, WireMessage::PushOffer { offer, targets: vec![target(8)], for_seq: None }, vec![]);
    }
    assert!(!p.c.dead());
    p.inject(Who::C, WireMessage::PushOffer { offer: 2, targets: vec![target(8)], for_seq: None }, vec![]);
    assert!(p.death(Who::C).contains("push offer 2 out of turn"));
    // The listener never receives offers.
    let mut p = Pair::pushing();
    p.inject(Who::A, WireMessage::PushOffer { offer: 0, targets: vec![target(8)], for_seq: None }, vec![]);
    assert!(p.death(Who::A).contains("push offer to a side that does not push"));
}

#[test]
fn a_decline_of_an_unknown_offer_is_a_protocol_error() {
    let mut p = Pair::pushing();
    p.inject(Who::A, WireMessage::DeclineOffer { offer: 0 }, vec![]);
    assert!(p.death(Who::A).contains("decline of unknown push offer 0"));
    assert!(p.a.lane.offers_dropped.is_empty());
}

#[test]
fn data_filling_an_offer_never_made_is_a_protocol_error() {
    let offered = FrameDescriptor::DeviceOffered { offer: 0, index: 0, len: 8, ready: None, gate: None };
    let mut p = Pair::pushing();
    p.recv(Who::A, 1, None);
    p.inject(Who::A, data(0, vec![offered.clone()]), vec![]);
    assert!(p.death(Who::A).contains("fills unknown push offer 0"));
    let mut p = Pair::established();
    p.inject(Who::A, data(0, vec![offered]), vec![]);
    assert!(p.death(Who::A).contains("fills a push offer, but this side makes none"));
}
