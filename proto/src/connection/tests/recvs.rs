//! The receiving side: the unclaimed budget, `recv_into`, the peer's GPU work, landings
//! that finish later.

use super::pair::*;
use super::sim::{host, LandMode};
use crate::connection::lane::LaneEvent;
use crate::error::TransportError;
use ferrylink_memory::Message;

fn acks(side: &Side) -> usize {
    side.sent_kinds().iter().filter(|k| **k == "Ack").count()
}

#[test]
fn the_unclaimed_budget_holds_messages_back_until_receives_come() {
    let mut p = Pair::established();
    p.a.core.settings.unexpected_max_bytes = 1000;
    for tag in 0..3 {
        p.send(Who::C, tag, msg(tag, &[600]));
    }
    p.run();
    assert_eq!(acks(&p.a), 1, "the first lands (nothing unclaimed yet), the rest wait");
    assert_eq!(p.a.core.recv.landed_bytes, 600);
    assert!(p.c.send_result(0).is_ok() && !p.c.sends.contains_key(&1));
    p.recv(Who::A, 10, None);
    p.run();
    assert_eq!(tag_of(p.a.recv_result(10).as_ref().expect("first")), 0);
    assert_eq!(acks(&p.a), 2, "the second lands unclaimed as room frees");
    p.recv(Who::A, 11, None);
    p.recv(Who::A, 12, None);
    p.run();
    assert_eq!(tag_of(p.a.recv_result(11).as_ref().expect("second")), 1);
    assert_msg(&p.mem, p.a.recv_result(12).as_ref().expect("third"), 2, &[600]);
    assert_eq!(p.a.core.recv.landed_bytes, 0);
    assert_eq!(p.c.sends.len(), 3);
}

#[test]
fn recv_into_fitting_buffers_fills_the_callers_buffers() {
    let mut p = Pair::established();
    let buf = host(vec![0; 300]);
    let addr = buf.as_host().expect("host").as_slice().as_ptr();
    p.recv(Who::A, 10, Some(vec![buf, host(vec![0; 2])]));
    p.send(Who::C, 1, msg(1, &[300, 2]));
    p.run();
    let got = p.a.recv_result(10).as_ref().expect("delivered");
    assert_msg(&p.mem, got, 1, &[300, 2]);
    assert_eq!(got.frames[0].as_host().expect("host").as_slice().as_ptr(), addr, "the caller's own buffer");
}

#[test]
fn recv_into_mismatched_buffers_posted_first_hands_them_back_and_the_message_stays() {
    let mut p = Pair::established();
    p.recv(Who::A, 10, Some(vec![host(vec![7; 5])]));
    p.send(Who::C, 1, msg(1, &[300, 2]));
    p.run();
    let e = p.a.recv_result(10).as_ref().expect_err("mismatch");
    assert!(matches!(&e.error, TransportError::BufferMismatch(r) if r.contains("2 frames arrived for 1 buffers")));
    assert_eq!(e.buffers.as_ref().expect("back")[0].as_host().expect("host").to_vec(), [7; 5]);
    assert!(p.c.send_result(1).is_ok(), "the message itself landed");
    p.recv(Who::A, 11, None);
    assert_msg(&p.mem, p.a.recv_result(11).as_ref().expect("kept"), 1, &[300, 2]);
}

#[test]
fn recv_into_mismatched_buffers_after_landing_hands_them_back_and_the_message_stays() {
    let mut p = Pair::established();
    p.send(Who::C, 1, msg(1, &[300]));
    p.run();
    p.recv(Who::A, 10, Some(vec![host(vec![7; 299])]));
    let e = p.a.recv_result(10).as_ref().expect_err("mismatch");
    assert!(matches!(e.error, TransportError::BufferMismatch(_)));
    assert_eq!(e.buffers.as_ref().expect("back")[0].len(), 299);
    assert_eq!(p.a.core.recv.landed_bytes, 300, "still unclaimed");
    p.recv(Who::A, 11, Some(vec![host(vec![0; 300])]));
    assert_msg(&p.mem, p.a.recv_result(11).as_ref().expect("fits now"), 1, &[300]);
    assert_eq!(p.a.core.recv.landed_bytes, 0);
}

#[test]
fn a_message_waits_for_the_peers_gpu_work() {
    let mut p = Pair::established();
    p.a.lane.readiness_pending = true;
    p.recv(Who::A, 10, None);
    p.send(Who::C, 1, msg(1, &[10]));
    p.run();
    assert!(!p.a.recvs.contains_key(&10) && p.a.core.wants_spin(p.now()));
    p.tick_both();
    assert!(!p.a.recvs.contains_key(&10));
    p.a.lane.readiness_pending = false;
    p.tick_both();
    assert!(p.a.recv_result(10).is_ok() && p.c.send_result(1).is_ok());
}

#[test]
fn landings_that_finish_out_of_order_are_delivered_and_acknowledged_in_order() {
    let mut p = Pair::established();
    p.a.lane.land_mode = LandMode::InProgress;
    p.recv(Who::A, 10, None);
    for tag in 0..3 {
        p.send(Who::C, tag, msg(tag, &[50 + tag as usize]));
    }
    p.run();
    assert_eq!(p.a.lane.landings(), 3);
    assert_eq!(acks(&p.a), 0);
    p.a.lane.complete_landings(true);
    p.run();
    let seqs: Vec<u64> =
        p.a.sent
            .iter()
            .filter_map(|m| if let crate::wire::WireMessage::Ack { seq, .. } = m { Some(*seq) } else { None })
            .collect();
    assert_eq!(seqs, [0, 1, 2]);
    assert_eq!(tag_of(p.a.recv_result(10).as_ref().expect("first")), 0);
    p.recv(Who::A, 11, None);
    p.recv(Who::A, 12, None);
    assert_msg(&p.mem, p.a.recv_result(12).as_ref().expect("third"), 2, &[52]);
    assert_eq!(p.c.sends.len(), 3);
}

#[test]
fn a_landed_event_for_nothing_landing_fails_the_connection() {
    let mut p = Pair::established();
    let event = LaneEvent::Landed { seq: 4, message: Message::default() };
    p.act(Who::A, |core, lane, now| core.handle_lane_event(event, now, lane));
    assert!(p.death(Who::A).contains("message 4 landed, but none such was landing"));
}

#[test]
fn a_landing_that_fails_locally_fails_the_claiming_receive_and_the_connection() {
    let mut p = Pair::established();
    p.a.lane.land_mode = LandMode::FailLocal("out of pool memory".into());
    p.recv(Who::A, 10, None);
    p.send(Who::C, 1, msg(1, &[10]));
    p.run();
    assert!(p.a.recv_result(10).as_ref().is_err_and(|e| e.error.to_string().contains("out of pool memory")));
    let death = p.death(Who::A);
    assert!(death.contains("out of pool memory") && !death.contains("protocol violation"), "{death}");
}

#[test]
fn a_lane_failure_event_fails_the_connection() {
    let mut p = Pair::established();
    p.recv(Who::C, 1, None);
    let event = LaneEvent::Failed { reason: "endpoint error".into() };
    p.act(Who::C, |core, lane, now| core.handle_lane_event(event, now, lane));
    assert!(p.death(Who::C).contains("endpoint error"));
    assert!(p.c.recv_result(1).is_err());
}

#[test]
fn a_message_landing_whole_behind_an_unclaimed_landing_keeps_its_place() {
    // Found by the property test: the second message (pushed, unclaimed) waits for
    // PushDone while the third lands whole; a receive must still get the second first.
    let mut p = Pair::pushing();
    let m = super::push::device_msg(&p.mem, 1, &[8]);
    p.send(Who::C, 1, m);
    p.send(Who::C, 2, msg(2, &[3]));
    p.deliver(Who::A); // Data 0 (pushed): within its grace, no receive
    p.clock.advance(crate::connection::recv::DEVICE_RECV_GRACE);
    p.tick(Who::A); // lands unclaimed: PushTargets
    p.deliver(Who::A); // Data 1 lands whole, behind it
    p.recv(Who::A, 10, None);
    assert!(!p.a.recvs.contains_key(&10), "the first message is not there yet");
    p.run();
    assert_msg(&p.mem, p.a.recv_result(10).as_ref().expect("first"), 1, &[8]);
    p.recv(Who::A, 11, None);
    assert_msg(&p.mem, p.a.recv_result(11).as_ref().expect("second"), 2, &[3]);
    // Whole messages behind a landing cut short stay receivable.
    let mut p = Pair::pushing();
    let m = super::push::device_msg(&p.mem, 1, &[8]);
    p.send(Who::C, 1, m);
    p.send(Who::C, 2, msg(2, &[3]));
    p.deliver(Who::A);
    p.clock.advance(crate::connection::recv::DEVICE_RECV_GRACE);
    p.tick(Who::A);
    p.deliver(Who::A);
    p.act(Who::A, |core, lane, _| core.peer_closed(lane));
    p.recv(Who::A, 10, None);
    assert_msg(&p.mem, p.a.recv_result(10).as_ref().expect("kept"), 2, &[3]);
    assert_eq!(p.a.core.recv.landed_bytes, 0);
}

#[test]
fn a_receive_after_a_mismatched_recv_into_gets_that_message_not_the_next() {
    // Found by the property test: the message a `recv_into` could not take landed
    // unclaimed, and the next receive claimed the message after it.
    let mut p = Pair::established();
    p.a.lane.readiness_pending = true;
    p.send(Who::C, 1, msg(1, &[4]));
    p.send(Who::C, 2, msg(2, &[5]));
    p.run();
    p.recv(Who::A, 10, Some(vec![host(vec![0; 3])]));
    p.recv(Who::A, 11, None);
    p.a.lane.readiness_pending = false;
    p.tick_both();
    assert!(p.a.recv_result(10).as_ref().is_err_and(|e| e.buffers.is_some()));
    assert_msg(&p.mem, p.a.recv_result(11).as_ref().expect("the first message"), 1, &[4]);
    p.recv(Who::A, 12, None);
    assert_msg(&p.mem, p.a.recv_result(12).as_ref().expect("the second"), 2, &[5]);
}

#[test]
fn a_device_message_before_its_receive_waits_its_grace_for_the_callers_buffers() {
    // Exported device frames (this side copies them) wait for a `recv_into` as pushed
    // ones do: posted within the grace, it gets the one copy into its own buffers.
    let mut p = Pair::established();
    p.send(Who::C, 1, super::push::device_msg(&p.mem, 1, &[48]));
    p.run();
    assert_eq!(acks(&p.a), 0, "waits for a receive");
    assert!(p.a.core.wants_spin(p.now()), "spins through the grace");
    p.clock.advance(crate::connection::recv::DEVICE_RECV_GRACE / 2);
    p.tick(Who::A);
    assert_eq!(acks(&p.a), 0, "still within the grace");
    let target = super::sim::device_frame(&p.mem, vec![0; 48]);
    let ptr = target.as_device().expect("device").device_ptr();
    p.recv(Who::A, 10, Some(vec![target]));
    p.run();
    let got = p.a.recv_result(10).as_ref().expect("delivered");
    assert_msg(&p.mem, got, 1, &[48]);
    assert_eq!(got.frames[0].as_device().expect("device").device_ptr(), ptr, "the caller's own buffer");
    assert_eq!(p.a.lane.landed_into_callers, [0], "landed straight into it");
}

#[test]
fn a_device_message_without_a_receive_lands_unclaimed_once_its_grace_is_over() {
    let mut p = Pair::established();
    p.send(Who::C, 1, super::push::device_msg(&p.mem, 1, &[48]));
    p.run();
    p.clock.advance(crate::connection::recv::DEVICE_RECV_GRACE);
    p.tick(Who::A);
    assert_eq!(acks(&p.a), 1, "landed unclaimed");
    assert!(!p.a.core.wants_spin(p.now()));
    p.recv(Who::A, 10, Some(vec![super::sim::device_frame(&p.mem, vec![0; 48])]));
    p.run();
    assert_msg(&p.mem, p.a.recv_result(10).as_ref().expect("delivered"), 1, &[48]);
    assert!(p.a.lane.landed_into_callers.is_empty(), "copied out of the landed message");
    // Host messages never wait.
    p.send(Who::C, 2, msg(2, &[16]));
    p.run();
    assert_eq!(acks(&p.a), 2, "a host message lands at once");
}
