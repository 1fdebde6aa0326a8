//! Receives that name a stream: a message whose copies this side runs is delivered while
//! they run, and acknowledged (in order with the messages behind it) only once the lane
//! says they are done.

use super::pair::*;
use super::push::device_msg;
use crate::connection::lane::{CoreLane, LaneEvent};
use crate::wire::{AckResult, WireMessage};

/// The sequence numbers `side` acknowledged, in order.
fn acked(side: &Side) -> Vec<u64> {
    side.sent.iter().filter_map(|m| if let WireMessage::Ack { seq, .. } = m { Some(*seq) } else { None }).collect()
}

#[test]
fn the_receive_completes_at_once_and_the_ack_waits_for_the_copies() {
    let mut p = Pair::established();
    p.recv_on(Who::A, 10, None);
    let m = device_msg(&p.mem, 1, &[64, 32]);
    p.send(Who::C, 1, m);
    p.run();
    assert_msg(&p.mem, p.a.recv_result(10).as_ref().expect("delivered"), 1, &[64, 32]);
    assert_eq!(p.a.lane.copying, [0], "the copies still run");
    assert!(acked(&p.a).is_empty(), "no ack while the copies run");
    assert!(!p.c.sends.contains_key(&1), "the sender keeps its buffers");
    assert!(p.a.lane.poll(&mut Vec::new()), "the lane polls the copies");
    p.tick_both();
    assert!(acked(&p.a).is_empty(), "time alone acknowledges nothing");
    p.a.lane.complete_copies(&[0]);
    p.run();
    assert_eq!(acked(&p.a), [0]);
    assert!(matches!(p.a.sent.last(), Some(WireMessage::Ack { result: AckResult::Delivered, .. })));
    assert_msg(&p.mem, p.c.send_result(1).as_ref().expect("acknowledged"), 1, &[64, 32]);
}

#[test]
fn later_messages_are_delivered_in_order_and_acknowledged_behind_the_copying_one() {
    let mut p = Pair::established();
    p.recv_on(Who::A, 10, None);
    p.recv(Who::A, 11, None);
    p.recv_on(Who::A, 12, None);
    p.recv_on(Who::A, 13, None);
    let first = device_msg(&p.mem, 1, &[64]);
    p.send(Who::C, 1, first);
    p.send(Who::C, 2, msg(2, &[300]));
    let third = device_msg(&p.mem, 3, &[16]);
    p.send(Who::C, 3, third);
    p.send(Who::C, 4, msg(4, &[8]));
    p.run();
    assert_eq!(p.a.recv_log, [10, 11, 12, 13], "delivered in order, at once");
    assert_msg(&p.mem, p.a.recv_result(11).as_ref().expect("host"), 2, &[300]);
    assert_msg(&p.mem, p.a.recv_result(13).as_ref().expect("host, named stream"), 4, &[8]);
    assert_eq!(p.a.lane.copying, [0, 2], "a host message has no copies to wait for");
    assert!(acked(&p.a).is_empty(), "acks stay in order behind the copies");
    p.a.lane.complete_copies(&[2]);
    p.run();
    assert!(acked(&p.a).is_empty(), "the first copies still run");
    p.a.lane.complete_copies(&[0]);
    p.run();
    assert_eq!(acked(&p.a), [0, 1, 2, 3]);
    assert_eq!(p.c.sends.len(), 4);
    p.recv(Who::A, 14, None);
    p.send(Who::C, 5, msg(5, &[8]));
    p.run();
    assert_eq!(acked(&p.a), [0, 1, 2, 3, 4], "nothing held any more");
}

#[test]
fn the_connection_failing_while_copies_run_closes_the_lane_without_an_ack() {
    let mut p = Pair::established();
    p.recv_on(Who::A, 10, None);
    p.recv(Who::A, 11, None);
    let m = device_msg(&p.mem, 1, &[64]);
    p.send(Who::C, 1, m);
    p.run();
    assert!(p.a.recv_result(10).is_ok());
    p.act(Who::A, |core, lane, _| core.peer_closed(lane));
    assert!(p.death(Who::A).contains("closed the connection"));
    assert_eq!(p.a.lane.closed, 1, "close waits for the copies and lets go");
    assert!(p.a.lane.copying.is_empty());
    assert!(p.a.recv_result(11).is_err());
    let late = LaneEvent::CopiesDone { seq: 0 };
    p.act(Who::A, |core, lane, now| core.handle_lane_event(late, now, lane));
    assert!(acked(&p.a).is_empty(), "a dead connection acknowledges nothing");
    assert_msg(&p.mem, p.a.recv_result(10).as_ref().expect("delivered before"), 1, &[64]);
}

#[test]
fn copies_done_for_a_message_not_copying_fails_the_connection() {
    let mut p = Pair::established();
    let event = LaneEvent::CopiesDone { seq: 3 };
    p.act(Who::A, |core, lane, now| core.handle_lane_event(event, now, lane));
    assert!(p.death(Who::A).contains("none such ran"));
}

#[test]
fn a_message_landed_before_the_receive_is_complete_on_delivery() {
    let mut p = Pair::established();
    let m = device_msg(&p.mem, 1, &[64]);
    p.send(Who::C, 1, m);
    p.run();
    p.clock.advance(crate::connection::recv::DEVICE_RECV_GRACE);
    p.tick(Who::A);
    assert_eq!(acked(&p.a), [0], "landed unclaimed after its grace, its copies waited for");
    p.recv_on(Who::A, 10, None);
    p.run();
    assert_msg(&p.mem, p.a.recv_result(10).as_ref().expect("delivered"), 1, &[64]);
    assert!(p.a.lane.copying.is_empty());
}

#[test]
fn pushed_messages_are_complete_on_delivery() {
    let mut p = Pair::pushing();
    p.recv_on(Who::A, 10, None);
    let m = device_msg(&p.mem, 1, &[64]);
    p.send(Who::C, 1, m);
    p.run();
    assert_msg(&p.mem, p.a.recv_result(10).as_ref().expect("delivered"), 1, &[64]);
    assert!(p.a.lane.copying.is_empty() && acked(&p.a).is_empty(), "PushDone, no ack");
    assert!(p.c.send_result(1).is_ok());
}

#[test]
fn a_message_back_from_a_dropped_receive_waits_for_its_copies_first() {
    let mut p = Pair::established();
    p.recv_on(Who::A, 10, None);
    let m = device_msg(&p.mem, 1, &[64]);
    p.send(Who::C, 1, m);
    p.run();
    let mut delivered = p.a.recvs.remove(&10).expect("completed");
    let message = delivered.pop().expect("one").expect("a message");
    p.act(Who::A, |core, lane, now| core.return_undelivered(10, message, now, lane));
    assert_eq!(p.a.lane.copies_waited, [0], "waited for before the next receive may take it");
    assert_eq!(acked(&p.a), [0]);
    p.recv(Who::A, 11, None);
    p.run();
    assert_msg(&p.mem, p.a.recv_result(11).as_ref().expect("the next receive"), 1, &[64]);
    assert!(p.c.send_result(1).is_ok());
}

#[test]
fn recv_into_naming_a_stream_fills_the_callers_buffers_while_copies_run() {
    let mut p = Pair::established();
    let buffer = super::sim::device_frame(&p.mem, vec![0; 64]);
    let ptr = buffer.as_device().expect("device").device_ptr();
    p.recv_on(Who::A, 10, Some(vec![buffer]));
    let m = device_msg(&p.mem, 1, &[64]);
    p.send(Who::C, 1, m);
    p.run();
    let got = p.a.recv_result(10).as_ref().expect("delivered");
    assert_eq!(got.frames[0].as_device().expect("device").device_ptr(), ptr, "the caller's buffer");
    assert_msg(&p.mem, got, 1, &[64]);
    assert!(acked(&p.a).is_empty());
    p.a.lane.complete_copies(&[0]);
    p.run();
    assert_eq!(acked(&p.a), [0]);
}
