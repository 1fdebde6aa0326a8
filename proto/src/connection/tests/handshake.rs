//! The handshake: both sides established, lane choice, refusals, rings, deadlines.

use super::pair::*;
use crate::connection::{Phase, PushRole};
use crate::error::ConnectError;
use crate::lane_kind::LaneKind;
use crate::wire::{WireCopies as DeviceCopies, WireMessage};

#[test]
fn both_sides_establish_on_the_native_lane() {
    let p = Pair::established();
    assert_eq!(p.c.established, Some((LaneKind::Native, PushRole::Off)));
    assert_eq!(p.a.established, Some((LaneKind::Native, PushRole::Off)));
    assert_eq!(p.a.sent_kinds(), ["Welcome"]);
    assert_eq!(p.c.core.peer(), "pid 2 on sim");
    assert_eq!(p.a.core.peer(), "pid 1 on sim");
    assert!(p.c.handshake_failed.is_empty() && p.c.closed == 0 && p.a.closed == 0);
    assert_eq!((p.c.use_ring, p.a.use_ring), (0, 0));
}

#[test]
fn ucx_lane_when_native_is_off_and_no_push_roles_there() {
    let mut p = Pair::with_hellos(hello(1, true, DeviceCopies::Connector), hello(2, true, DeviceCopies::Receiver));
    p.run();
    assert_eq!(p.c.established, Some((LaneKind::Ucx, PushRole::Off)));
    assert_eq!(p.a.established, Some((LaneKind::Ucx, PushRole::Off)));
    let Some(WireMessage::Welcome { lane, control_ring, .. }) = p.a.sent.first() else { panic!("no Welcome") };
    assert_eq!((LaneKind::from(*lane), *control_ring), (LaneKind::Ucx, false));
}

#[test]
fn connector_copies_make_pusher_and_target() {
    let p = Pair::pushing();
    assert_eq!(p.c.core.phase(), Phase::Established);
    assert_eq!(p.a.core.phase(), Phase::Established);
}

#[test]
fn conflicting_policies_are_rejected_and_both_sides_end() {
    let mut hc = hello(1, true, DeviceCopies::Receiver);
    hc.policy = crate::policy::LanePolicy::Native.into();
    let mut ha = hello(2, true, DeviceCopies::Receiver);
    ha.policy = crate::policy::LanePolicy::Ucx.into();
    let mut p = Pair::with_hellos(hc, ha);
    p.run();
    assert_eq!(p.a.sent_kinds(), ["Reject"]);
    assert!(p.c.established.is_none() && p.a.established.is_none());
    match p.c.handshake_failed.as_slice() {
        [ConnectError::Rejected { reason }] => assert!(reason.contains("force different lanes"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(p.death(Who::A).contains("force different lanes"));
    assert!(p.death(Who::C).contains("force different lanes"));
    assert!(p.a.core.is_finished() && p.c.core.is_finished());
}

#[test]
fn version_mismatch_is_rejected() {
    let mut ha = hello(2, false, DeviceCopies::Receiver);
    ha.protocol_version += 1;
    let mut p = Pair::with_hellos(hello(1, false, DeviceCopies::Receiver), ha);
    p.run();
    assert_eq!(p.a.sent_kinds(), ["Reject"]);
    match p.c.handshake_failed.as_slice() {
        [ConnectError::Rejected { reason }] => assert!(reason.contains("protocol versions differ"), "{reason}"),
        other => panic!("{other:?}"),
    }
    p.death(Who::C);
}

#[test]
fn a_lane_the_sides_disagree_on_is_refused_by_the_connector() {
    let mut p = Pair::native();
    p.deliver(Who::A);
    p.inbox_clear(Who::C);
    let forged = hello(2, false, DeviceCopies::Receiver);
    p.inject(Who::C, WireMessage::Welcome { hello: forged, lane: LaneKind::Ucx.into(), control_ring: false }, vec![]);
    assert_eq!(p.c.sent_kinds(), ["Reject"]);
    match p.c.handshake_failed.as_slice() {
        [ConnectError::Handshake(reason)] => assert!(reason.contains("chose the ucx lane"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(p.c.established.is_none());
    // The listener, established already, hears why.
    p.run();
    assert!(p.death(Who::A).contains("the peer gave up: the listener chose the ucx lane"));
}

#[test]
fn rings_are_used_when_offered_and_taken() {
    let mut hc = hello(1, false, DeviceCopies::Receiver);
    hc.control_ring = Some(4096);
    let mut p = Pair::with_hellos(hc, hello(2, false, DeviceCopies::Receiver));
    p.run();
    assert_eq!((p.c.use_ring, p.a.use_ring), (1, 1));
    assert!(matches!(p.a.sent[0], WireMessage::Welcome { control_ring: true, .. }));
}

#[test]
fn rings_offered_but_not_mapped_stay_unused() {
    let mut hc = hello(1, false, DeviceCopies::Receiver);
    hc.control_ring = Some(4096);
    let mut p = Pair::with_hellos(hc, hello(2, false, DeviceCopies::Receiver));
    p.a.take_rings = false;
    p.run();
    assert_eq!((p.c.use_ring, p.a.use_ring), (0, 0));
    assert!(matches!(p.a.sent[0], WireMessage::Welcome { control_ring: false, .. }));
    assert!(p.c.established.is_some());
}

#[test]
fn a_welcome_taking_rings_never_offered_fails_the_connect() {
    let mut p = Pair::native();
    p.inbox_clear(Who::A);
    let welcome = WireMessage::Welcome {
        hello: hello(2, false, DeviceCopies::Receiver),
        lane: LaneKind::Native.into(),
        control_ring: true,
    };
    p.inject(Who::C, welcome, vec![]);
    assert_eq!(p.c.use_ring, 0);
    assert!(p.c.established.is_none());
    match p.c.handshake_failed.as_slice() {
        [ConnectError::Handshake(reason)] => assert!(reason.contains("never offered"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(p.death(Who::C).contains("protocol violation"));
}

#[test]
fn messages_before_the_handshake_are_protocol_errors() {
    let mut p = Pair::native();
    p.inbox_clear(Who::A);
    p.inject(Who::A, WireMessage::Ack { seq: 0, result: crate::wire::AckResult::Delivered }, vec![]);
    assert!(p.death(Who::A).contains("unexpected Ack during the handshake"));
    assert!(p.a.sent.is_empty(), "an acceptor says nothing to a peer that broke the protocol");

    let mut p = Pair::native();
    p.inject(Who::C, WireMessage::Hello(hello(2, false, DeviceCopies::Receiver)), vec![]);
    assert!(p.death(Who::C).contains("unexpected Hello during the handshake"));
    assert_eq!(p.c.handshake_failed.len(), 1);
}

#[test]
fn the_handshake_times_out_on_the_virtual_clock() {
    let mut p = Pair::native();
    p.clock.advance(CONNECT_TIMEOUT);
    p.tick(Who::C);
    p.tick(Who::A);
    assert!(!p.c.dead() && !p.a.dead(), "not before the deadline");
    p.clock.advance(std::time::Duration::from_millis(1));
    p.tick(Who::C);
    match p.c.handshake_failed.as_slice() {
        [ConnectError::Handshake(reason)] => assert!(reason.contains("handshake not finished"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // The acceptor, still opening its lane, times out too.
    p.a.defer_open = true;
    p.run();
    assert!(p.a.deferred_open.is_some());
    p.tick(Who::A);
    assert!(p.death(Who::A).contains("handshake not finished"));
}

#[test]
fn a_message_while_the_lane_opens_is_a_protocol_error() {
    let mut p = Pair::native();
    p.a.defer_open = true;
    p.run();
    assert_eq!(p.a.core.phase(), Phase::OpeningLane);
    p.inject(Who::A, WireMessage::Goodbye, vec![]);
    assert!(p.death(Who::A).contains("before the lane was open"));
    // A late answer to OpenLane changes nothing.
    p.open_deferred(Who::A);
    assert!(p.a.established.is_none());
}

#[test]
fn a_lane_that_cannot_open_refuses_the_peer() {
    let mut p = Pair::native();
    p.a.open_error = Some("no memfd today".into());
    p.run();
    assert_eq!(p.a.sent_kinds(), ["Welcome", "Reject"]);
    assert!(p.a.established.is_none());
    assert!(p.death(Who::A).contains("no memfd today"));
    // The Welcome went first: the connector established, then learns the listener gave up.
    assert!(p.c.established.is_some() && p.c.handshake_failed.is_empty());
    assert!(p.death(Who::C).contains("the peer gave up: no memfd today"));
}

#[test]
fn a_second_hello_on_an_established_connection_ends_it() {
    let mut p = Pair::established();
    p.recv(Who::A, 1, None);
    p.send(Who::A, 2, msg(2, &[10, 100]));
    p.inject(Who::A, WireMessage::Hello(hello(1, false, DeviceCopies::Receiver)), vec![]);
    assert!(p.death(Who::A).contains("second handshake"));
    assert!(p.a.recv_result(1).as_ref().is_err_and(|e| e.error.to_string().contains("second handshake")));
    // The lane lets go of everything and hands the send's frames back.
    assert_eq!(p.a.lane.closed, 1);
    let e = p.a.send_result(2).as_ref().expect_err("the connection died");
    assert_msg(&p.mem, e.message.as_ref().expect("the message comes back"), 2, &[10, 100]);
}

#[test]
fn wake_means_nothing_in_any_phase() {
    let mut p = Pair::native();
    p.inject(Who::C, WireMessage::Wake, vec![]);
    p.run();
    assert!(p.c.established.is_some());
    p.inject(Who::A, WireMessage::Wake, vec![]);
    p.inject(Who::C, WireMessage::Wake, vec![]);
    assert!(!p.a.dead() && !p.c.dead());
    assert!(p.a.sent_kinds() == ["Welcome"] && p.c.sent.is_empty());
}
