//! The peer vanishing (or the connection failing) at each step: every request ends with
//! an error, every buffer comes back, messages that landed whole stay receivable.

use super::pair::*;
use super::sim::{host, LandMode};
use crate::error::TransportError;
use crate::wire::WireMessage;

#[test]
fn the_peer_vanishing_fails_sends_queued_and_in_flight_and_posted_receives() {
    let mut p = Pair::established();
    p.c.lane.staging_capacity = 1000;
    p.send(Who::C, 1, msg(1, &[600]));
    p.send(Who::C, 2, msg(2, &[600]));
    p.recv(Who::C, 10, None);
    p.recv(Who::C, 11, Some(vec![host(vec![4; 8])]));
    p.act(Who::C, |core, lane, _| core.peer_closed(lane));
    assert!(p.death(Who::C).contains("closed the connection"));
    for (id, sizes) in [(1, [600]), (2, [600])] {
        let e = p.c.send_result(id).as_ref().expect_err("peer gone");
        assert!(matches!(e.error, TransportError::PeerClosed { .. }));
        assert_msg(&p.mem, e.message.as_ref().expect("back"), id, &sizes);
    }
    assert!(p.c.recv_result(10).as_ref().is_err_and(|e| e.buffers.is_none()));
    let e = p.c.recv_result(11).as_ref().expect_err("peer gone");
    assert_eq!(e.buffers.as_ref().expect("back")[0].as_host().expect("host").to_vec(), [4; 8]);
    assert_eq!(p.c.lane.closed, 1);
    assert!(p.c.handshake_failed.is_empty());
    let mut stats = crate::stats::ContextStats::default();
    p.c.core.add_stats(&mut stats);
    assert_eq!((stats.sends_in_flight, stats.recvs_posted, stats.unclaimed_bytes), (0, 0, 0));
}

#[test]
fn acknowledged_sends_the_lane_still_held_settle_as_delivered() {
    let mut p = Pair::established();
    p.c.lane.release_pending = true;
    p.send(Who::C, 1, msg(1, &[100]));
    p.send(Who::C, 2, msg(2, &[100]));
    p.recv(Who::A, 10, None);
    p.deliver(Who::A);
    p.deliver(Who::A);
    p.deliver(Who::A);
    p.deliver(Who::C); // the first Ack only
    assert_eq!(p.c.lane.unfinished(), [0]);
    p.act(Who::C, |core, lane, _| core.peer_closed(lane));
    assert_msg(&p.mem, p.c.send_result(1).as_ref().expect("delivered"), 1, &[100]);
    let e = p.c.send_result(2).as_ref().expect_err("never acknowledged");
    assert_msg(&p.mem, e.message.as_ref().expect("back"), 2, &[100]);
}

#[test]
fn landings_in_progress_end_and_landed_messages_stay_receivable() {
    let mut p = Pair::established();
    p.send(Who::C, 1, msg(1, &[100]));
    p.run();
    p.a.lane.land_mode = LandMode::InProgress;
    p.send(Who::C, 2, msg(2, &[100]));
    p.run();
    p.recv(Who::A, 10, None); // takes the landed first message
    p.recv(Who::A, 11, None); // claims nothing: the second lands unclaimed
    assert_eq!(tag_of(p.a.recv_result(10).as_ref().expect("landed")), 1);
    p.send(Who::C, 3, msg(3, &[100]));
    p.run();
    assert_eq!(p.a.lane.landings(), 2);
    p.act(Who::A, |core, lane, _| core.peer_closed(lane));
    assert!(p.a.recv_result(11).as_ref().is_err_and(|e| matches!(e.error, TransportError::PeerClosed { .. })));
    assert_eq!(p.a.core.recv.landed_bytes, 0, "unclaimed landings are forgotten");
    assert_eq!(p.a.lane.landings(), 0, "the lane let go of them");

    // A message that landed whole before the end is still there for a receive.
    let mut p = Pair::established();
    p.send(Who::C, 1, msg(1, &[100]));
    p.run();
    p.act(Who::A, |core, lane, _| core.peer_closed(lane));
    p.recv(Who::A, 10, None);
    assert_msg(&p.mem, p.a.recv_result(10).as_ref().expect("kept"), 1, &[100]);
    assert!(p.death(Who::A).contains("closed the connection"));
}

#[test]
fn the_peer_vanishing_mid_push_fails_both_halves() {
    let mut p = Pair::pushing();
    p.recv(Who::A, 10, None);
    let m = super::push::device_msg(&p.mem, 1, &[64]);
    p.send(Who::C, 1, m);
    p.deliver(Who::A); // Data: the listener answers with PushTargets
    assert_eq!(p.a.sent_kinds().last(), Some(&"PushTargets"));
    p.act(Who::A, |core, lane, _| core.peer_closed(lane));
    assert!(p.a.recv_result(10).is_err());
    p.act(Who::C, |core, lane, _| core.peer_closed(lane));
    let e = p.c.send_result(1).as_ref().expect_err("peer gone");
    assert_msg(&p.mem, e.message.as_ref().expect("back"), 1, &[64]);
    // What was in flight reaches nobody.
    p.run();
    assert_eq!(p.c.sends[&1].len(), 1);
    assert_eq!(p.c.lane.pushes, 0);
}

#[test]
fn the_peer_vanishing_during_the_handshake_fails_the_connect() {
    let mut p = Pair::native();
    p.act(Who::C, |core, lane, _| core.peer_closed(lane));
    assert!(
        matches!(p.c.handshake_failed.as_slice(), [crate::error::ConnectError::Handshake(r)] if r.contains("closed"))
    );
    assert!(p.c.core.is_finished(), "never established: nothing to keep");
    p.deliver(Who::A);
    p.act(Who::A, |core, lane, _| core.peer_closed(lane));
    assert!(p.a.established.is_some(), "the acceptor established on the Hello");
    assert!(!p.a.core.is_finished(), "its endpoint went to the listener's queue: the user closes it");
    assert_eq!(p.a.closed, 1);
}

#[test]
fn abandon_and_context_shutdown_end_quietly() {
    let mut p = Pair::established();
    p.send(Who::C, 1, msg(1, &[5]));
    p.act(Who::C, |core, lane, _| core.abandon(lane));
    assert!(!p.c.sent_kinds().contains(&"Goodbye"));
    // Its send was in flight: the peer (which reads EOF and ends) hung up before the
    // message came back.
    assert!(p.c.core.is_finished());
    assert_eq!(p.c.send_result(1).as_ref().expect_err("abandoned").error, TransportError::EndpointClosed);
    let mut p = Pair::established();
    p.recv(Who::A, 2, None);
    p.act(Who::A, |core, lane, _| core.fail(TransportError::ContextClosed, lane));
    assert_eq!(p.a.recv_result(2).as_ref().expect_err("shut down").error, TransportError::ContextClosed);
    assert!(!p.a.core.is_finished(), "the user still holds it");
}

/// A fixed exchange both ways, cut after `steps` deliveries by both sides failing.
fn cut_after(steps: usize, how: usize) -> Pair {
    let mut p = Pair::established();
    p.c.lane.staging_capacity = 700;
    for tag in 0..3u64 {
        p.send(Who::C, tag, msg(tag, &[600, 3]));
        p.send(Who::A, 100 + tag, msg(100 + tag, &[2]));
        p.recv(Who::A, 200 + tag, None);
        p.recv(Who::C, 300 + tag, Some(vec![host(vec![0; 2])]));
    }
    for i in 0..steps {
        let who = if i % 2 == 0 { Who::A } else { Who::C };
        if !p.deliver(who) {
            p.deliver(who.other());
        }
    }
    for who in [Who::C, Who::A] {
        match how {
            0 => p.act(who, |core, lane, _| core.peer_closed(lane)),
            1 => p.act(who, |core, lane, _| core.fail_peer("cut".into(), lane)),
            _ => p.close(who),
        }
    }
    p.run();
    p
}

#[test]
fn cutting_the_connection_at_each_step_completes_everything_once_with_buffers_back() {
    for steps in 0..20 {
        for how in 0..3 {
            let p = cut_after(steps, how);
            for (side, sends, recvs) in [(&p.c, 0..3, 300..303), (&p.a, 100..103, 200..203)] {
                for id in sends {
                    let sizes: &[usize] = if id < 100 { &[600, 3] } else { &[2] };
                    match side.send_result(id) {
                        Ok(m) => assert_msg(&p.mem, m, id, sizes),
                        Err(e) => assert_msg(&p.mem, e.message.as_ref().expect("handed back"), id, sizes),
                    }
                }
                for id in recvs {
                    match side.recv_result(id) {
                        Ok(m) => assert_eq!(tag_of(m), id - 200, "receives get messages in order"),
                        Err(e) => assert!(id < 300 || e.buffers.is_some(), "recv_into {id} lost its buffers"),
                    }
                }
            }
        }
    }
}

#[test]
fn a_dead_connection_ignores_messages_events_and_time() {
    let mut p = Pair::established();
    p.send(Who::C, 1, msg(1, &[5]));
    p.act(Who::A, |core, lane, _| core.peer_closed(lane));
    let outputs_before = p.a.sent.len();
    p.run(); // the Data reaches a dead side
    p.inject(Who::A, WireMessage::Ack { seq: 9, result: crate::wire::AckResult::Delivered }, vec![]);
    let event = crate::connection::lane::LaneEvent::Failed { reason: "late".into() };
    p.act(Who::A, |core, lane, now| core.handle_lane_event(event, now, lane));
    p.clock.advance(REQUEST_TIMEOUT * 2);
    p.tick(Who::A);
    assert_eq!(p.a.sent.len(), outputs_before, "a dead side says nothing");
    assert!(p.a.recvs.is_empty() && p.a.sends.is_empty());
    assert!(p.death(Who::A).contains("closed the connection"), "the first error stays");
    assert!(!p.a.core.has_output());
}

#[test]
fn closing_during_the_handshake_fails_the_connect_without_a_goodbye() {
    let mut p = Pair::native();
    p.close(Who::C);
    assert!(p.c.sent.is_empty());
    assert!(
        matches!(p.c.handshake_failed.as_slice(), [crate::error::ConnectError::Handshake(r)] if r.contains("closed"))
    );
    assert!(p.c.core.is_finished());
}
