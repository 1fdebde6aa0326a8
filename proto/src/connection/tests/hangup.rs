//! A listener that ends a connection first holds what it lent the connector (offered
//! buffers, messages described and not acknowledged) until the peer hangs up
//! (`recv/hangup.rs`).

use super::pair::*;
use super::sim::device_frame;
use crate::error::TransportError;
use ferrylink_memory::Frame;

/// An offering pair whose listener's receive 10 lent `size` bytes of its own buffers to
/// the connector; the listener's peer hangs up only when told.
fn lent(size: usize) -> (Pair, u64) {
    let mut p = Pair::pushing();
    p.a.lane.offers_enabled = true;
    p.a.manual_hangup = true;
    let buffer = device_frame(&p.mem, vec![0; size]);
    let ptr = buffer.as_device().expect("device").device_ptr();
    p.recv(Who::A, 10, Some(vec![buffer]));
    p.run();
    assert!(p.a.sent_kinds().contains(&"PushOffer"), "the receive is offered");
    (p, ptr)
}

fn buffer_ptr(frames: &[Frame]) -> u64 {
    frames[0].as_device().expect("device").device_ptr()
}

#[test]
fn a_listener_closing_first_gives_offered_buffers_back_only_after_the_peer_hung_up() {
    let (mut p, ptr) = lent(64);
    p.close(Who::A);
    assert_eq!(p.a.sent_kinds().last(), Some(&"Goodbye"));
    assert_eq!((p.a.half_closed, p.a.closed), (1, 0), "its socket's writing half only");
    assert!(p.a.recvs.is_empty(), "the receive waits: the connector may still copy into its buffers");
    assert!(p.a.lane.lent_held, "the lane keeps what it lent past its close");
    assert!(!p.a.core.is_finished(), "the driver keeps the connection to see the peer hang up");
    // A timeout check before the request timeout releases nothing.
    p.tick(Who::A);
    p.clock.advance(REQUEST_TIMEOUT / 2);
    p.tick(Who::A);
    assert!(p.a.recvs.is_empty());

    p.hang_up_to(Who::A);
    let e = p.a.recv_result(10).as_ref().expect_err("the connection ended");
    assert_eq!(e.error, TransportError::EndpointClosed);
    assert_eq!(buffer_ptr(e.buffers.as_ref().expect("handed back after the hangup")), ptr);
    assert_eq!((p.a.half_closed, p.a.closed), (1, 1));
    assert_eq!((p.a.lane.lent_held, p.a.lane.lent_released), (false, 1));
    assert!(p.a.core.is_finished());
    // A second EOF changes nothing.
    p.hang_up_to(Who::A);
    assert_eq!(p.a.recvs[&10].len(), 1, "completed once");
    assert_eq!(p.a.closed, 1);
}

#[test]
fn a_peer_that_never_hangs_up_is_waited_for_one_request_timeout() {
    let (mut p, ptr) = lent(32);
    p.close(Who::A);
    p.tick(Who::A);
    p.clock.advance(REQUEST_TIMEOUT);
    assert!(p.a.recvs.is_empty(), "not before a timeout check");
    p.tick(Who::A);
    let e = p.a.recv_result(10).as_ref().expect_err("the connection ended");
    assert_eq!(buffer_ptr(e.buffers.as_ref().expect("handed back at the deadline")), ptr);
    assert_eq!(p.a.closed, 1);
    assert!(p.a.core.is_finished());
}

#[test]
fn a_listener_whose_peer_ended_first_gives_offered_buffers_back_at_once() {
    let (mut p, ptr) = lent(16);
    p.close(Who::C);
    p.run();
    let e = p.a.recv_result(10).as_ref().expect_err("the peer said goodbye");
    assert!(matches!(e.error, TransportError::PeerClosed { .. }), "{}", e.error);
    assert_eq!(buffer_ptr(e.buffers.as_ref().expect("handed back at once")), ptr);
    assert_eq!((p.a.half_closed, p.a.closed), (0, 1), "nothing to wait for: the peer's copies are over");
    assert!(!p.a.lane.lent_held);
}

#[test]
fn a_protocol_error_holds_the_offered_buffers_too() {
    let (mut p, ptr) = lent(8);
    // The connector answers an offer that was never made: the listener ends the
    // connection, but the connector may still be copying into receive 10's buffers.
    p.inject(Who::A, crate::wire::WireMessage::DeclineOffer { offer: 99 }, Vec::new());
    p.deliver(Who::A);
    assert!(p.a.dead());
    assert_eq!(p.a.half_closed, 1);
    assert!(p.a.recvs.is_empty());
    p.hang_up_to(Who::A);
    let e = p.a.recv_result(10).as_ref().expect_err("ended");
    assert!(e.error.to_string().contains("protocol violation"), "{}", e.error);
    assert_eq!(buffer_ptr(e.buffers.as_ref().expect("handed back")), ptr);
}

#[test]
fn a_send_the_peer_may_still_read_comes_back_after_the_hangup() {
    let mut p = Pair::established();
    p.a.manual_hangup = true;
    // Described to the peer (its Data in the peer's inbox), not acknowledged.
    p.send(Who::A, 7, msg(7, &[4, 9]));
    assert_eq!(p.a.sent_kinds().last(), Some(&"Data"));
    p.close(Who::A);
    assert_eq!(p.a.half_closed, 1);
    assert!(p.a.sends.is_empty(), "the peer may still read the message");
    p.hang_up_to(Who::A);
    let e = p.a.send_result(7).as_ref().expect_err("the connection ended");
    assert_eq!(e.error, TransportError::EndpointClosed);
    assert_msg(&p.mem, e.message.as_ref().expect("the message comes back"), 7, &[4, 9]);
    assert_eq!(p.a.sends[&7].len(), 1, "completed once");
    assert!(p.a.core.is_finished());
}

#[test]
fn nothing_lent_nothing_held() {
    let mut p = Pair::established();
    p.a.manual_hangup = true;
    p.recv(Who::A, 3, None);
    p.close(Who::A);
    assert_eq!((p.a.half_closed, p.a.closed), (0, 1));
    assert_eq!(p.a.recv_result(3).as_ref().expect_err("closed").error, TransportError::EndpointClosed);
    assert!(p.a.core.is_finished());
}
