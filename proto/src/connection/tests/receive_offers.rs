//! Receive offers: a listener's posted `recv_into` of device buffers is offered to the
//! connector for the very next message (`recv/offered.rs`).

use super::pair::*;
use super::push::device_msg;
use super::sim::{device_frame, host};
use crate::error::TransportError;
use crate::wire::{FrameDescriptor, WireMessage};
use ferrylink_memory::Frame;

/// A pushing pair whose lanes make offers.
fn offering() -> Pair {
    let mut p = Pair::pushing();
    p.a.lane.offers_enabled = true;
    p
}

/// Device buffers of `sizes` (zeros) and their device pointers.
fn buffers(p: &Pair, sizes: &[usize]) -> (Vec<Frame>, Vec<u64>) {
    let frames: Vec<Frame> = sizes.iter().map(|&n| device_frame(&p.mem, vec![0; n])).collect();
    let ptrs = frames.iter().map(|f| f.as_device().expect("device").device_ptr()).collect();
    (frames, ptrs)
}

fn ptrs_of(frames: &[Frame]) -> Vec<u64> {
    frames.iter().map(|f| f.as_device().expect("device").device_ptr()).collect()
}

fn offers_sent(side: &Side) -> Vec<(u64, Option<u64>)> {
    side.sent
        .iter()
        .filter_map(|m| match m {
            WireMessage::PushOffer { offer, for_seq, .. } => Some((*offer, *for_seq)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_fitting_send_lands_in_the_receives_own_buffers_with_one_control_message() {
    let mut p = offering();
    let (into, ptrs) = buffers(&p, &[64, 32]);
    p.recv(Who::A, 10, Some(into));
    assert_eq!(offers_sent(&p.a), [(0, Some(0))], "offered for message 0 at once");
    p.run();
    p.send(Who::C, 1, device_msg(&p.mem, 1, &[64, 32]));
    p.run();
    assert_eq!(p.c.sent_kinds(), ["Data"], "no PushDone: the offer saved the round trip");
    assert!(!p.a.sent_kinds().contains(&"PushTargets"));
    let got = p.a.recv_result(10).as_ref().expect("delivered");
    assert_msg(&p.mem, got, 1, &[64, 32]);
    assert_eq!(ptrs_of(&got.frames), ptrs, "the caller's own buffers");
    assert_msg(&p.mem, p.c.send_result(1).as_ref().expect("copied"), 1, &[64, 32]);
    assert!(p.a.lane.receive_offers.is_empty());
    assert_eq!(p.a.core.counters().offered_receives.load(std::sync::atomic::Ordering::Relaxed), 1);
    // The next receive is offered for message 1.
    let (into, _) = buffers(&p, &[8]);
    p.recv(Who::A, 11, Some(into));
    assert_eq!(offers_sent(&p.a), [(0, Some(0)), (1, Some(1))]);
}

#[test]
fn a_send_that_does_not_fit_declines_first_and_is_pushed_into_the_same_buffers() {
    let mut p = offering();
    let (into, ptrs) = buffers(&p, &[64]);
    p.recv(Who::A, 10, Some(into));
    p.run();
    p.send(Who::C, 1, device_msg(&p.mem, 1, &[64, 8]));
    p.run();
    assert_eq!(p.c.sent_kinds(), ["DeclineOffer", "Data", "PushDone"], "declined before the message");
    // Two frames for one buffer: the receive fails with its buffers back; the message
    // lands for the next receive.
    let e = p.a.recv_result(10).as_ref().expect_err("mismatch");
    assert!(matches!(e.error, TransportError::BufferMismatch(_)), "{}", e.error);
    assert_eq!(ptrs_of(e.buffers.as_ref().expect("handed back")), ptrs);

    let mut p = offering();
    let (into, ptrs) = buffers(&p, &[48]);
    p.recv(Who::A, 10, Some(into));
    p.run();
    // A host frame of the same length.
    p.send(Who::C, 1, msg(1, &[48]));
    p.run();
    assert_eq!(p.c.sent_kinds(), ["DeclineOffer", "Data"]);
    let e = p.a.recv_result(10).as_ref().expect_err("a host frame for a device buffer");
    assert_eq!(ptrs_of(e.buffers.as_ref().expect("handed back")), ptrs);
}

#[test]
fn a_device_send_of_another_length_is_pushed_into_the_buffers_after_the_decline() {
    let mut p = offering();
    let (into, ptrs) = buffers(&p, &[40]);
    p.recv(Who::A, 10, Some(into));
    // The offer is lost in flight to the connector until after its send: the connector
    // sends message 0 first, then declines the stale offer at once.
    let offer = p.c.inbox.pop_back().expect("the offer is in flight");
    p.send(Who::C, 1, device_msg(&p.mem, 1, &[40]));
    p.c.inbox.push_back(offer);
    // The listener gets message 0 before the decline: it waits for the buffers.
    p.deliver(Who::A);
    assert!(p.a.recvs.is_empty(), "message 0 waits for the decline");
    assert!(!p.a.sent_kinds().contains(&"PushTargets"));
    p.run();
    assert_eq!(p.c.sent_kinds(), ["Data", "DeclineOffer", "PushDone"]);
    let got = p.a.recv_result(10).as_ref().expect("pushed after the decline");
    assert_msg(&p.mem, got, 1, &[40]);
    assert_eq!(ptrs_of(&got.frames), ptrs, "into the caller's own buffers all the same");
    assert!(!p.a.dead() && !p.c.dead());
}

#[test]
fn a_receive_that_times_out_gets_its_buffers_back_through_a_withdrawal() {
    let mut p = offering();
    let (into, ptrs) = buffers(&p, &[16]);
    p.recv(Who::A, 10, Some(into));
    p.run();
    p.cancel(Who::A, 10);
    assert_eq!(p.a.sent_kinds().last(), Some(&"WithdrawOffer"));
    assert!(p.a.recvs.is_empty(), "not before the connector answers");
    p.run();
    assert_eq!(p.c.sent_kinds(), ["DeclineOffer"]);
    let e = p.a.recv_result(10).as_ref().expect_err("timed out");
    assert!(matches!(e.error, TransportError::TimedOut(_)), "{}", e.error);
    assert_eq!(ptrs_of(e.buffers.as_ref().expect("handed back")), ptrs);
    // The next message lands the usual way.
    p.recv(Who::A, 11, None);
    p.send(Who::C, 1, device_msg(&p.mem, 1, &[16]));
    p.run();
    assert_msg(&p.mem, p.a.recv_result(11).as_ref().expect("delivered"), 1, &[16]);
}

#[test]
fn a_receive_timing_out_while_its_offer_is_filled_gets_the_message() {
    let mut p = offering();
    let (into, ptrs) = buffers(&p, &[16]);
    p.recv(Who::A, 10, Some(into));
    p.run();
    p.send(Who::C, 1, device_msg(&p.mem, 1, &[16]));
    // The message is on its way when the receive's deadline passes.
    p.cancel(Who::A, 10);
    p.run();
    let got = p.a.recv_result(10).as_ref().expect("the message won the race");
    assert_msg(&p.mem, got, 1, &[16]);
    assert_eq!(ptrs_of(&got.frames), ptrs);
    assert!(!p.c.sent_kinds().contains(&"DeclineOffer"), "a filled offer is answered by its message");
    assert!(!p.a.dead() && !p.c.dead());
}

#[test]
fn an_unanswered_withdrawal_fails_the_connection_after_the_request_timeout() {
    let mut p = offering();
    let (into, ptrs) = buffers(&p, &[16]);
    p.recv(Who::A, 10, Some(into));
    p.run();
    p.cancel(Who::A, 10);
    p.inbox_clear(Who::C); // the connector never answers
    p.clock.advance(settings().request_timeout / 2);
    p.tick(Who::A);
    assert!(!p.a.dead());
    p.clock.advance(settings().request_timeout);
    p.tick(Who::A);
    assert!(p.death(Who::A).contains("receive offer 0 not given back"));
    let e = p.a.recv_result(10).as_ref().expect_err("ended with the connection");
    assert_eq!(ptrs_of(e.buffers.as_ref().expect("handed back")), ptrs);
}

#[test]
fn a_dropped_receive_lets_its_filled_offer_land_for_the_next_receive() {
    let mut p = offering();
    let (into, _) = buffers(&p, &[16]);
    p.recv(Who::A, 10, Some(into));
    p.run();
    let mut withdrawn = false;
    p.act(Who::A, |core, lane, _| withdrawn = core.withdraw(10, lane));
    assert!(withdrawn);
    p.send(Who::C, 1, device_msg(&p.mem, 1, &[16]));
    p.run();
    assert!(p.a.recvs.is_empty(), "the dropped receive completes nowhere");
    p.recv(Who::A, 11, None);
    assert_msg(&p.mem, p.a.recv_result(11).as_ref().expect("landed unclaimed"), 1, &[16]);
    let mut stats = crate::stats::ContextStats::default();
    p.a.core.add_stats(&mut stats);
    assert_eq!(stats.unclaimed_bytes, 0);
}

#[test]
fn a_dropped_receive_whose_offer_is_declined_leaves_nothing_behind() {
    let mut p = offering();
    let (into, _) = buffers(&p, &[16]);
    p.recv(Who::A, 10, Some(into));
    p.run();
    p.act(Who::A, |core, lane, _| assert!(core.withdraw(10, lane)));
    p.send(Who::C, 1, msg(1, &[3]));
    p.run();
    assert_eq!(p.c.sent_kinds(), ["DeclineOffer", "Data"]);
    p.recv(Who::A, 11, None);
    assert_msg(&p.mem, p.a.recv_result(11).as_ref().expect("delivered"), 1, &[3]);
    let mut stats = crate::stats::ContextStats::default();
    p.a.core.add_stats(&mut stats);
    assert_eq!(stats.unclaimed_bytes, 0);
    assert!(p.a.lane.receive_offers.is_empty());
}

#[test]
fn the_connection_ending_hands_lent_buffers_back() {
    let mut p = offering();
    let (into, ptrs) = buffers(&p, &[16, 4]);
    p.recv(Who::A, 10, Some(into));
    p.run();
    p.close(Who::C);
    p.run();
    let e = p.a.recv_result(10).as_ref().expect_err("the peer went");
    assert_eq!(ptrs_of(e.buffers.as_ref().expect("handed back")), ptrs);
}

#[test]
fn a_lane_not_ready_to_offer_is_asked_again_on_later_turns() {
    let mut p = offering();
    p.a.lane.receive_offer_delays = 2;
    let (into, _) = buffers(&p, &[16]);
    p.recv(Who::A, 10, Some(into));
    assert!(offers_sent(&p.a).is_empty());
    assert!(p.a.core.wants_spin(p.now()), "the core keeps turning to ask again");
    p.tick(Who::A);
    assert!(offers_sent(&p.a).is_empty());
    p.tick(Who::A);
    assert_eq!(offers_sent(&p.a), [(0, Some(0))]);
    p.run();
    p.send(Who::C, 1, device_msg(&p.mem, 1, &[16]));
    p.run();
    assert_msg(&p.mem, p.a.recv_result(10).as_ref().expect("delivered"), 1, &[16]);
}

#[test]
fn receives_behind_other_messages_or_of_host_buffers_are_not_offered() {
    let mut p = offering();
    let (into, _) = buffers(&p, &[16]);
    p.recv(Who::A, 10, Some(vec![into.into_iter().next().expect("one"), host(vec![0; 3])]));
    assert!(offers_sent(&p.a).is_empty(), "a host buffer among them");

    let mut p = offering();
    p.send(Who::C, 1, msg(1, &[3]));
    p.run(); // message 0 landed, unclaimed
    let (into, _) = buffers(&p, &[16]);
    p.recv(Who::A, 10, Some(into));
    assert!(offers_sent(&p.a).is_empty(), "message 0 goes to it first");

    let mut p = offering();
    p.a.core.settings.push_offer_max_bytes = 0;
    let (into, _) = buffers(&p, &[16]);
    p.recv(Who::A, 10, Some(into));
    assert!(offers_sent(&p.a).is_empty(), "offers are off");
}

#[test]
fn receive_offers_that_lie_are_protocol_errors() {
    let target = |n| crate::wire::DeviceFrameDescriptor {
        memory: crate::wire::DeviceMemory::LegacyIpc { handle: [7; 64], buffer_id: 1, alloc_len: n },
        offset: 0,
        len: n,
        device_uuid: [1; 16],
        event: None,
    };
    // For a message the connector has not reached.
    let mut p = Pair::pushing();
    p.inject(Who::C, WireMessage::PushOffer { offer: 0, targets: vec![target(8)], for_seq: Some(1) }, vec![]);
    assert!(p.death(Who::C).contains("for message 1, not yet sent 0"));
    // Two at once.
    let mut p = Pair::pushing();
    p.inject(Who::C, WireMessage::PushOffer { offer: 0, targets: vec![target(8)], for_seq: Some(0) }, vec![]);
    p.inject(Who::C, WireMessage::PushOffer { offer: 1, targets: vec![target(8)], for_seq: Some(0) }, vec![]);
    assert!(p.death(Who::C).contains("push offer 1 out of turn"));
    // A withdrawal sent to the listener.
    let mut p = Pair::pushing();
    p.inject(Who::A, WireMessage::WithdrawOffer { offer: 0 }, vec![]);
    assert!(p.death(Who::A).contains("withdrawal of an offer"));
    // A withdrawal of an offer the connector does not hold is answered by nothing.
    let mut p = Pair::pushing();
    p.inject(Who::C, WireMessage::WithdrawOffer { offer: 5 }, vec![]);
    assert!(!p.c.dead() && p.c.sent_kinds().is_empty());
    // A message that fills the receive offer with another shape.
    let mut p = offering();
    let (into, _) = buffers(&p, &[16]);
    p.recv(Who::A, 10, Some(into));
    let frames = vec![FrameDescriptor::DeviceOffered { offer: 0, index: 0, len: 8, ready: None, gate: None }];
    let data = crate::wire::DataMessage { seq: 0, header: vec![], frames };
    p.inject(Who::A, WireMessage::Data(data), vec![]);
    assert!(p.death(Who::A).contains("does not match receive offer 0"));
    let e = p.a.recv_result(10).as_ref().expect_err("ended");
    assert!(e.buffers.is_some(), "the lent buffers come back");
}

#[test]
fn the_connector_lane_hears_of_each_receive_offer_and_lets_go_of_it_before_declining() {
    // Used: told of, never given up.
    let mut p = offering();
    let (into, _) = buffers(&p, &[64]);
    p.recv(Who::A, 10, Some(into));
    p.run();
    assert_eq!(p.c.lane.offers_received, [0], "told when the offer arrived");
    p.send(Who::C, 1, device_msg(&p.mem, 1, &[64]));
    p.run();
    assert!(p.c.lane.offers_given_up.is_empty(), "filled, not given up");

    // Not fitting: given up, then declined.
    let mut p = offering();
    let (into, _) = buffers(&p, &[64]);
    p.recv(Who::A, 10, Some(into));
    p.run();
    p.send(Who::C, 1, device_msg(&p.mem, 1, &[32]));
    assert_eq!(p.c.lane.offers_given_up, [0]);
    assert_eq!(p.c.sent_kinds().first(), Some(&"DeclineOffer"));

    // A host message next: given up, then declined.
    let mut p = offering();
    let (into, _) = buffers(&p, &[16]);
    p.recv(Who::A, 10, Some(into));
    p.run();
    p.send(Who::C, 1, msg(1, &[16]));
    assert_eq!(p.c.lane.offers_given_up, [0]);

    // Withdrawn by the listener: given up, then declined.
    let mut p = offering();
    let (into, _) = buffers(&p, &[16]);
    p.recv(Who::A, 10, Some(into));
    p.run();
    p.cancel(Who::A, 10);
    p.run();
    assert_eq!(p.c.lane.offers_given_up, [0]);
    assert_eq!(p.c.sent_kinds(), ["DeclineOffer"]);
}
