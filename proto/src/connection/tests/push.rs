//! Connector-copies mode: the pusher fills the listener's targets; push offers.

use super::pair::*;
use super::sim::{device_frame, Mem};
use crate::connection::offers::OFFER_IDLE_DELAY;
use crate::connection::recv::DEVICE_RECV_GRACE;
use crate::wire::{FrameDescriptor, WireMessage};
use ferrylink_memory::Message;
use std::time::Duration;

/// A message of device frames (bytes: `pattern`), one per size.
pub fn device_msg(mem: &Mem, tag: u64, sizes: &[usize]) -> Message {
    let frames = sizes.iter().enumerate().map(|(i, &n)| device_frame(mem, pattern(tag, i, n))).collect();
    Message::new(tag.to_le_bytes().to_vec(), frames)
}

fn data_frames(side: &Side) -> Vec<Vec<FrameDescriptor>> {
    side.sent.iter().filter_map(|m| if let WireMessage::Data(d) = m { Some(d.frames.clone()) } else { None }).collect()
}

/// A pushing pair whose listener delivered one pushed message `[64, 32]` to a plain
/// receive, so it wants an offer of that shape.
fn offer_wanted() -> Pair {
    let mut p = Pair::pushing();
    p.a.lane.offers_enabled = true;
    p.recv(Who::A, 100, None);
    let m = device_msg(&p.mem, 0, &[64, 32]);
    p.send(Who::C, 0, m);
    p.run();
    assert_msg(&p.mem, p.a.recv_result(100).as_ref().expect("pushed"), 0, &[64, 32]);
    assert!(p.c.send_result(0).is_ok());
    p
}

#[test]
fn a_pushed_message_goes_through_push_targets_and_push_done() {
    let mut p = Pair::pushing();
    p.recv(Who::A, 10, None);
    let m = device_msg(&p.mem, 1, &[64, 32]);
    p.send(Who::C, 1, m);
    p.run();
    assert_eq!(p.c.sent_kinds(), ["Data", "PushDone"]);
    assert_eq!(p.a.sent_kinds(), ["Welcome", "PushTargets"]);
    assert_eq!(
        data_frames(&p.c)[0],
        [FrameDescriptor::DevicePush { len: 64 }, FrameDescriptor::DevicePush { len: 32 }]
    );
    assert_eq!(p.c.lane.pushes, 1);
    assert_msg(&p.mem, p.c.send_result(1).as_ref().expect("pushed"), 1, &[64, 32]);
    assert_msg(&p.mem, p.a.recv_result(10).as_ref().expect("delivered"), 1, &[64, 32]);
}

#[test]
fn a_pushed_message_without_a_receive_waits_its_grace_then_lands() {
    let mut p = Pair::pushing();
    let m = device_msg(&p.mem, 1, &[16]);
    p.send(Who::C, 1, m);
    p.run();
    assert_eq!(p.a.sent_kinds(), ["Welcome"], "no targets within the grace");
    assert!(p.a.core.wants_spin(p.now()));
    p.clock.advance(DEVICE_RECV_GRACE / 2);
    p.tick_both();
    assert_eq!(p.a.sent_kinds(), ["Welcome"]);
    p.clock.advance(DEVICE_RECV_GRACE);
    p.tick_both();
    assert_eq!(p.a.sent_kinds(), ["Welcome", "PushTargets"]);
    assert!(p.c.send_result(1).is_ok());
    p.recv(Who::A, 2, None);
    assert_msg(&p.mem, p.a.recv_result(2).as_ref().expect("landed unclaimed"), 1, &[16]);
}

#[test]
fn recv_into_device_buffers_gets_the_push_directly() {
    let mut p = Pair::pushing();
    let target = device_frame(&p.mem, vec![0; 48]);
    let ptr = target.as_device().expect("device").device_ptr();
    p.recv(Who::A, 2, Some(vec![target, super::sim::host(vec![0; 5])]));
    let mut m = device_msg(&p.mem, 3, &[48]);
    m.frames.push(super::sim::host(pattern(3, 1, 5)));
    p.send(Who::C, 1, m);
    p.run();
    let got = p.a.recv_result(2).as_ref().expect("delivered");
    assert_msg(&p.mem, got, 3, &[48, 5]);
    assert_eq!(got.frames[0].as_device().expect("device").device_ptr(), ptr, "the caller's own buffer");
}

#[test]
fn an_offer_is_made_after_the_idle_delay_and_a_fitting_send_fills_it() {
    let mut p = offer_wanted();
    assert!(!p.a.sent_kinds().contains(&"PushOffer"));
    p.clock.advance(OFFER_IDLE_DELAY / 2);
    p.tick_both();
    assert!(!p.a.sent_kinds().contains(&"PushOffer"), "not before the delay");
    p.clock.advance(OFFER_IDLE_DELAY);
    p.tick_both();
    assert_eq!(p.a.sent_kinds().last(), Some(&"PushOffer"));
    p.recv(Who::A, 101, None);
    let m = device_msg(&p.mem, 1, &[64, 32]);
    p.send(Who::C, 1, m);
    p.run();
    let frames = &data_frames(&p.c)[1];
    assert!(frames.iter().all(|f| matches!(f, FrameDescriptor::DeviceOffered { offer: 0, .. })), "{frames:?}");
    assert_msg(&p.mem, p.c.send_result(1).as_ref().expect("copied into the offer"), 1, &[64, 32]);
    assert_msg(&p.mem, p.a.recv_result(101).as_ref().expect("delivered"), 1, &[64, 32]);
    let acks = p.a.sent_kinds().iter().filter(|k| **k == "Ack").count();
    assert_eq!(acks, 0, "offered messages are not acknowledged");
    assert!(p.a.lane.offers_made.is_empty());
    assert_eq!(p.c.core.counters().offered_sends.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[test]
fn an_offer_rides_eagerly_behind_a_send_of_the_listener() {
    let mut p = offer_wanted();
    p.send(Who::A, 7, msg(7, &[4]));
    let kinds = p.a.sent_kinds();
    assert_eq!(&kinds[kinds.len() - 2..], ["Data", "PushOffer"], "the offer follows the data at once");
}

#[test]
fn a_non_fitting_device_send_declines_the_offer_and_pushes() {
    let mut p = offer_wanted();
    p.clock.advance(OFFER_IDLE_DELAY);
    p.tick_both();
    p.recv(Who::A, 101, None);
    let m = device_msg(&p.mem, 1, &[64]);
    p.send(Who::C, 1, m);
    p.run();
    let kinds = p.c.sent_kinds();
    assert_eq!(&kinds[kinds.len() - 3..], ["DeclineOffer", "Data", "PushDone"]);
    assert_eq!(p.a.lane.offers_dropped, [0]);
    assert_msg(&p.mem, p.a.recv_result(101).as_ref().expect("pushed"), 1, &[64]);
    assert!(!p.a.dead() && !p.c.dead());
}

#[test]
fn a_host_send_leaves_the_offer_for_the_next_device_send() {
    let mut p = offer_wanted();
    p.clock.advance(OFFER_IDLE_DELAY);
    p.tick_both();
    p.recv(Who::A, 101, None);
    p.recv(Who::A, 102, None);
    p.send(Who::C, 1, msg(1, &[64, 32]));
    let m = device_msg(&p.mem, 2, &[64, 32]);
    p.send(Who::C, 2, m);
    p.run();
    assert!(!p.c.sent_kinds().contains(&"DeclineOffer"));
    assert!(matches!(data_frames(&p.c)[2][0], FrameDescriptor::DeviceOffered { .. }));
    assert_msg(&p.mem, p.a.recv_result(101).as_ref().expect("host"), 1, &[64, 32]);
    assert_msg(&p.mem, p.a.recv_result(102).as_ref().expect("offered"), 2, &[64, 32]);
}

#[test]
fn no_offer_when_the_lane_cannot_make_one_or_the_message_is_too_big() {
    let mut p = offer_wanted();
    p.a.lane.offers_enabled = false;
    p.clock.advance(OFFER_IDLE_DELAY);
    p.tick_both();
    assert!(!p.a.sent_kinds().contains(&"PushOffer"));
    // A second pushed message, larger than `push_offer_max_bytes`: none wanted.
    let mut p = Pair::pushing();
    p.a.lane.offers_enabled = true;
    p.recv(Who::A, 1, None);
    let m = device_msg(&p.mem, 1, &[(1 << 20) + 1]);
    p.send(Who::C, 1, m);
    p.run();
    p.clock.advance(Duration::from_secs(1));
    p.tick_both();
    assert!(p.a.recv_result(1).is_ok());
    assert!(!p.a.sent_kinds().contains(&"PushOffer"));
}

#[test]
fn offered_sends_in_flight_fail_with_the_connection_and_come_back() {
    let mut p = offer_wanted();
    p.clock.advance(OFFER_IDLE_DELAY);
    p.tick_both();
    let m = device_msg(&p.mem, 1, &[64, 32]);
    p.send(Who::C, 1, m);
    assert!(!p.c.sends.contains_key(&1), "copies still running");
    assert!(p.c.core.wants_spin(p.now()));
    p.act(Who::C, |core, lane, _| core.peer_closed(lane));
    let e = p.c.send_result(1).as_ref().expect_err("the peer went");
    assert_msg(&p.mem, e.message.as_ref().expect("handed back"), 1, &[64, 32]);
    // The copies' late completion changes nothing.
    p.poll_lane(Who::C);
    assert_eq!(p.c.sends[&1].len(), 1);
}

#[test]
fn an_offer_rides_eagerly_only_behind_the_send_it_follows() {
    let mut p = Pair::pushing();
    p.a.lane.offers_enabled = true;
    // The listener sends while no offer is wanted ...
    p.recv(Who::C, 50, None);
    p.send(Who::A, 50, msg(50, &[4]));
    p.run();
    assert!(p.c.recv_result(50).is_ok());
    // ... then a pushed message makes one wanted: it waits for the idle delay or the
    // listener's next send, never goes out as the message is delivered (the listener's
    // reply would wait behind its allocation and export).
    p.recv(Who::A, 100, None);
    p.send(Who::C, 0, device_msg(&p.mem, 0, &[64, 32]));
    p.run();
    assert!(p.a.recv_result(100).is_ok());
    assert!(!p.a.sent_kinds().contains(&"PushOffer"), "{:?}", p.a.sent_kinds());
    p.send(Who::A, 51, msg(51, &[4]));
    let kinds = p.a.sent_kinds();
    assert_eq!(&kinds[kinds.len() - 2..], ["Data", "PushOffer"]);
}
