//! The sending side: staging, acknowledgements, lanes that keep frames, deadlines,
//! cancels.

use super::pair::*;
use crate::error::TransportError;
use crate::wire::{AckResult, WireMessage};
use std::time::Duration;

fn data_seqs(side: &Side) -> Vec<u64> {
    side.sent.iter().filter_map(|m| if let WireMessage::Data(d) = m { Some(d.seq) } else { None }).collect()
}

/// `who`'s timeout checks leave it alive at the request timeout and fail its connection
/// just after; the error it died of.
fn dies_just_after_the_request_timeout(p: &mut Pair, who: Who) -> String {
    p.clock.advance(REQUEST_TIMEOUT);
    p.tick(who);
    assert!(!p.side(who).dead(), "not before the request timeout passed");
    p.clock.advance(Duration::from_millis(1));
    p.tick(who);
    p.death(who)
}

#[test]
fn staging_full_waits_for_an_ack_to_free_it() {
    let mut p = Pair::established();
    p.c.lane.staging_capacity = 1000;
    p.send(Who::C, 1, msg(1, &[600]));
    p.send(Who::C, 2, msg(2, &[600]));
    assert_eq!(data_seqs(&p.c), [0], "the second waits for staging room");
    assert_eq!(p.c.core.send.in_flight_count(), 2);
    p.recv(Who::A, 10, None);
    p.recv(Who::A, 11, None);
    p.run();
    assert_eq!(data_seqs(&p.c), [0, 1]);
    assert_msg(&p.mem, p.a.recv_result(10).as_ref().expect("first"), 1, &[600]);
    assert_msg(&p.mem, p.a.recv_result(11).as_ref().expect("second"), 2, &[600]);
    assert!(p.c.send_result(1).is_ok() && p.c.send_result(2).is_ok());
    assert_eq!(p.c.lane.staged_bytes(), 0);
}

#[test]
fn staging_freed_by_an_ack_whose_frames_were_lost_still_lets_the_queue_go() {
    let mut p = Pair::established();
    p.c.lane.staging_capacity = 1000;
    p.send(Who::C, 1, msg(1, &[600]));
    p.send(Who::C, 2, msg(2, &[600]));
    p.c.lane.frames_lost = true;
    p.run();
    let e = p.c.send_result(1).as_ref().expect_err("frames lost");
    assert!(e.message.is_none() && matches!(e.error, TransportError::InvalidMessage(_)));
    assert_eq!(data_seqs(&p.c), [0, 1], "the queued send goes once staging is free");
}

#[test]
fn a_lane_that_keeps_frames_after_the_ack_completes_on_send_finished() {
    let mut p = Pair::established();
    p.c.lane.release_pending = true;
    p.send(Who::C, 1, msg(1, &[100, 3]));
    p.recv(Who::A, 10, None);
    p.run();
    assert!(p.a.recv_result(10).is_ok());
    assert!(!p.c.sends.contains_key(&1), "acknowledged, frames still with the lane");
    assert_eq!(p.c.lane.unfinished(), [0]);
    p.c.lane.finish_sends();
    p.run();
    assert_msg(&p.mem, p.c.send_result(1).as_ref().expect("delivered"), 1, &[100, 3]);
    assert_eq!(p.c.core.counters().messages_sent.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[test]
fn a_refused_message_hands_the_send_back_and_the_receive_waits_for_the_next() {
    let mut p = Pair::established();
    p.a.lane.land_mode = super::sim::LandMode::Refuse("no room".into());
    p.recv(Who::A, 10, None);
    p.send(Who::C, 1, msg(1, &[100]));
    p.run();
    assert!(matches!(&p.a.sent[1], WireMessage::Ack { seq: 0, result: AckResult::Refused(r) } if r == "no room"));
    let e = p.c.send_result(1).as_ref().expect_err("refused");
    assert!(matches!(&e.error, TransportError::Refused { reason, .. } if reason == "no room"));
    assert_msg(&p.mem, e.message.as_ref().expect("handed back"), 1, &[100]);
    assert!(!p.a.recvs.contains_key(&10));
    p.a.lane.land_mode = super::sim::LandMode::Done;
    p.send(Who::C, 2, msg(2, &[5]));
    p.run();
    assert_msg(&p.mem, p.a.recv_result(10).as_ref().expect("the next one"), 2, &[5]);
}

#[test]
fn an_unacknowledged_send_fails_the_connection_after_the_request_timeout() {
    let mut p = Pair::established();
    p.send(Who::C, 1, msg(1, &[100]));
    assert!(dies_just_after_the_request_timeout(&mut p, Who::C).contains("message 0 not acknowledged within 5s"));
    let e = p.c.send_result(1).as_ref().expect_err("timed out");
    assert_msg(&p.mem, e.message.as_ref().expect("handed back"), 1, &[100]);
}

#[test]
fn a_send_the_lane_cannot_describe_fails_alone() {
    let mut p = Pair::established();
    p.c.lane.describe_send_error = Some(TransportError::Unsupported("odd frame".into()));
    p.send(Who::C, 1, msg(1, &[3]));
    p.send(Who::C, 2, msg(2, &[3]));
    p.recv(Who::A, 10, None);
    p.run();
    let e = p.c.send_result(1).as_ref().expect_err("refused by the lane");
    assert_eq!(e.error, TransportError::Unsupported("odd frame".into()));
    assert_msg(&p.mem, e.message.as_ref().expect("handed back"), 1, &[3]);
    assert!(p.c.send_result(2).is_ok());
    assert_eq!(tag_of(p.a.recv_result(10).as_ref().expect("the second")), 2);
    assert_eq!(data_seqs(&p.c), [0], "no sequence number spent on the failed send");
}

#[test]
fn a_lane_failing_to_describe_fails_the_connection() {
    let mut p = Pair::established();
    p.c.lane.describe_connection_error = Some("staging mapping broke".into());
    p.send(Who::C, 1, msg(1, &[3]));
    assert!(p.death(Who::C).contains("staging mapping broke"));
    let e = p.c.send_result(1).as_ref().expect_err("failed");
    assert_msg(&p.mem, e.message.as_ref().expect("handed back"), 1, &[3]);
}

#[test]
fn messages_beyond_the_limits_fail_alone_and_come_back() {
    let mut p = Pair::established();
    let mut m = msg(1, &[3]);
    m.header.resize(limits().max_header_bytes + 1, 0);
    p.send(Who::C, 1, m);
    let e = p.c.send_result(1).as_ref().expect_err("too big");
    assert!(matches!(&e.error, TransportError::InvalidMessage(r) if r.contains("header of")));
    assert_eq!(e.message.as_ref().expect("back").frames.len(), 1);
    assert!(!p.c.dead() && p.c.sent.is_empty());
}

#[test]
fn a_send_on_a_dead_connection_fails_at_once_with_its_message() {
    let mut p = Pair::established();
    p.act(Who::C, |core, lane, _| core.peer_closed(lane));
    p.send(Who::C, 1, msg(1, &[3]));
    let e = p.c.send_result(1).as_ref().expect_err("dead");
    assert!(matches!(e.error, TransportError::PeerClosed { .. }));
    assert_msg(&p.mem, e.message.as_ref().expect("back"), 1, &[3]);
}

#[test]
fn cancel_of_a_queued_send_hands_it_back_and_the_rest_goes_on() {
    let mut p = Pair::established();
    p.c.lane.staging_capacity = 1000;
    p.send(Who::C, 1, msg(1, &[600]));
    p.send(Who::C, 2, msg(2, &[600]));
    p.send(Who::C, 3, msg(3, &[600]));
    p.cancel(Who::C, 2);
    let e = p.c.send_result(2).as_ref().expect_err("cancelled");
    assert_eq!(e.error, TransportError::TimedOut(REQUEST_TIMEOUT));
    assert_msg(&p.mem, e.message.as_ref().expect("back"), 2, &[600]);
    p.recv(Who::A, 10, None);
    p.recv(Who::A, 11, None);
    p.run();
    assert_eq!(tag_of(p.a.recv_result(11).as_ref().expect("third")), 3);
    assert!(p.c.send_result(3).is_ok() && !p.c.dead());
}

#[test]
fn cancel_of_a_posted_receive_hands_its_buffers_back() {
    let mut p = Pair::established();
    p.recv(Who::A, 10, Some(vec![super::sim::host(vec![9; 4])]));
    p.recv(Who::A, 11, None);
    p.cancel(Who::A, 10);
    let e = p.a.recv_result(10).as_ref().expect_err("cancelled");
    assert_eq!(e.error, TransportError::TimedOut(REQUEST_TIMEOUT));
    assert_eq!(e.buffers.as_ref().expect("back")[0].as_host().expect("host").to_vec(), [9; 4]);
    p.send(Who::C, 1, msg(1, &[2]));
    p.run();
    assert!(p.a.recv_result(11).is_ok(), "the next receive takes the message");
}

#[test]
fn cancel_of_an_unacknowledged_send_fails_the_connection() {
    let mut p = Pair::established();
    p.send(Who::C, 1, msg(1, &[100]));
    p.cancel(Who::C, 1);
    assert!(p.death(Who::C).contains("message 0 not acknowledged"));
    assert_msg(&p.mem, p.c.send_result(1).as_ref().expect_err("failed").message.as_ref().expect("back"), 1, &[100]);
    // Cancelling what already completed, or never existed, does nothing.
    p.cancel(Who::C, 1);
    p.cancel(Who::C, 99);
    assert_eq!(p.c.sends.len(), 1);
}

/// A pair whose A's receive 10 (into `into`, when given) took C's message 1 of 100
/// bytes, which is still landing.
fn landing_for_receive(into: Option<Vec<ferrylink_memory::Frame>>) -> Pair {
    let mut p = Pair::established();
    p.a.lane.land_mode = super::sim::LandMode::InProgress;
    p.recv(Who::A, 10, into);
    p.send(Who::C, 1, msg(1, &[100]));
    p.run();
    assert_eq!(p.a.lane.landings(), 1);
    p
}

#[test]
fn cancel_of_a_receive_whose_message_lands_ends_it_and_the_message_goes_to_the_next() {
    let mut p = landing_for_receive(None);
    p.cancel(Who::A, 10);
    let e = p.a.recv_result(10).as_ref().expect_err("the receive ends at once");
    assert_eq!(e.error, TransportError::TimedOut(REQUEST_TIMEOUT));
    assert!(!p.a.dead());
    p.a.lane.complete_landings(false);
    p.run();
    p.recv(Who::A, 11, None);
    assert_msg(&p.mem, p.a.recv_result(11).as_ref().expect("the next receive gets it"), 1, &[100]);
    assert!(p.c.send_result(1).is_ok());
}

#[test]
fn cancel_of_a_receive_whose_message_lands_in_its_own_buffers_lets_it_complete() {
    let mut p = landing_for_receive(Some(vec![super::sim::host(vec![0; 100])]));
    p.cancel(Who::A, 10);
    assert!(!p.a.recvs.contains_key(&10) && !p.a.dead(), "the lane still fills its buffers");
    p.a.lane.complete_landings(false);
    p.run();
    assert_msg(&p.mem, p.a.recv_result(10).as_ref().expect("landed"), 1, &[100]);
    assert!(p.c.send_result(1).is_ok());
}

#[test]
fn a_landing_the_peer_stalls_past_the_request_timeout_fails_the_connection() {
    let mut p = landing_for_receive(None);
    assert!(dies_just_after_the_request_timeout(&mut p, Who::A).contains("message 0 not landed within"));
    assert!(p.a.recv_result(10).is_err(), "the receive the message was for fails");
}

#[test]
fn a_device_send_waits_for_its_producer_and_the_queue_behind_it() {
    let mut p = Pair::established();
    p.c.lane.producer_running = true;
    let m = super::push::device_msg(&p.mem, 1, &[32]);
    p.send(Who::C, 1, m);
    p.send(Who::C, 2, msg(2, &[3]));
    assert!(data_seqs(&p.c).is_empty(), "sends keep their order behind a running producer");
    assert!(p.c.core.wants_spin(p.now()));
    p.tick(Who::C);
    assert!(data_seqs(&p.c).is_empty());
    p.c.lane.producer_running = false;
    p.tick(Who::C);
    assert_eq!(data_seqs(&p.c), [0, 1]);
    p.recv(Who::A, 10, None);
    p.recv(Who::A, 11, None);
    p.run();
    assert_msg(&p.mem, p.a.recv_result(10).as_ref().expect("device, pulled"), 1, &[32]);
    assert_eq!(tag_of(p.a.recv_result(11).as_ref().expect("host")), 2);
}

#[test]
fn a_producer_check_that_fails_fails_that_send_only_and_cancel_discards_marks() {
    let mut p = Pair::established();
    p.c.lane.producer_error = Some(TransportError::Unsupported("no event".into()));
    let m = super::push::device_msg(&p.mem, 1, &[32]);
    p.send(Who::C, 1, m);
    let e = p.c.send_result(1).as_ref().expect_err("producer failed");
    assert_eq!(e.error, TransportError::Unsupported("no event".into()));
    assert_msg(&p.mem, e.message.as_ref().expect("back"), 1, &[32]);
    p.c.lane.producer_running = true;
    let m = super::push::device_msg(&p.mem, 2, &[8]);
    p.send(Who::C, 2, m);
    p.cancel(Who::C, 2);
    assert_eq!(p.c.lane.discarded, [2]);
    assert!(p.c.send_result(2).as_ref().is_err_and(|e| e.message.is_some()));
    assert!(!p.c.dead());
}

#[test]
fn more_regions_than_one_call_carries_go_in_several_announcements() {
    let n = ferrylink_ipc::fd_passing::MAX_FDS_PER_CALL + 1;
    let mut p = Pair::established();
    let sizes = vec![100; n];
    p.send(Who::C, 1, msg(1, &sizes));
    let regions: Vec<usize> =
        p.c.sent.iter().filter_map(|m| if let WireMessage::Regions(l) = m { Some(l.len()) } else { None }).collect();
    assert_eq!(regions, [n - 1, 1]);
    p.recv(Who::A, 10, None);
    p.run();
    assert_msg(&p.mem, p.a.recv_result(10).as_ref().expect("delivered"), 1, &sizes);
    assert!(p.a.fds.is_empty(), "every descriptor claimed");
}
