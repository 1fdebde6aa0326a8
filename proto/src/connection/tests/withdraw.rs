//! Requests whose handles were dropped: withdrawn sends and receives, and messages that
//! completed into a dropped receive coming back in order.

use super::pair::*;
use super::push::device_msg;
use super::sim::LandMode;
use crate::wire::WireMessage;

fn data_seqs(side: &Side) -> Vec<u64> {
    side.sent.iter().filter_map(|m| if let WireMessage::Data(d) = m { Some(d.seq) } else { None }).collect()
}

/// Takes the message that completed receive `id` (as a dropped handle leaves it).
fn take_delivered(side: &mut Side, id: u64) -> ferrylink_memory::Message {
    let mut all = side.recvs.remove(&id).unwrap_or_else(|| panic!("receive {id} did not complete"));
    assert_eq!(all.len(), 1);
    all.pop().expect("one").expect("a message")
}

#[test]
fn a_withdrawn_receive_takes_nothing_and_the_next_one_gets_the_message() {
    let mut p = Pair::established();
    p.recv(Who::A, 10, None);
    let mut withdrawn = false;
    p.act(Who::A, |core, lane, _| withdrawn = core.withdraw(10, lane));
    assert!(withdrawn, "a posted receive is withdrawn");
    p.send(Who::C, 1, msg(1, &[300]));
    p.run();
    assert!(!p.a.recvs.contains_key(&10), "a withdrawn receive never completes");
    p.recv(Who::A, 11, None);
    p.run();
    assert_msg(&p.mem, p.a.recv_result(11).as_ref().expect("delivered"), 1, &[300]);
}

#[test]
fn a_withdrawn_receive_no_longer_counts_as_posted_and_is_withdrawn_once() {
    let mut p = Pair::established();
    let posted = |p: &Pair| {
        let mut stats = crate::stats::ContextStats::default();
        p.a.core.add_stats(&mut stats);
        stats.recvs_posted
    };
    p.recv(Who::A, 10, None);
    assert_eq!(posted(&p), 1);
    let mut withdrawn = (false, false);
    p.act(Who::A, |core, lane, _| withdrawn.0 = core.withdraw(10, lane));
    p.act(Who::A, |core, lane, _| withdrawn.1 = core.withdraw(10, lane));
    assert_eq!(withdrawn, (true, false), "withdrawn the first time only");
    assert_eq!(posted(&p), 0);
}

#[test]
fn returned_messages_go_first_in_the_order_they_came_whatever_the_order_of_the_drops() {
    let mut p = Pair::established();
    p.recv(Who::A, 10, None);
    p.recv(Who::A, 11, None);
    for tag in 1..=3 {
        p.send(Who::C, tag, msg(tag, &[200]));
    }
    p.run();
    let first = take_delivered(&mut p.a, 10);
    let second = take_delivered(&mut p.a, 11);
    assert_eq!((tag_of(&first), tag_of(&second)), (1, 2));
    assert_eq!(p.a.core.recv.landed_bytes, 200, "the third waits unclaimed");
    // The later receive's handle goes first.
    p.act(Who::A, |core, lane, now| core.return_undelivered(11, second, now, lane));
    p.act(Who::A, |core, lane, now| core.return_undelivered(10, first, now, lane));
    assert_eq!(p.a.core.recv.landed_bytes, 600, "returned messages count as unclaimed");
    for id in 20..23 {
        p.recv(Who::A, id, None);
    }
    p.run();
    for (id, tag) in [(20, 1), (21, 2), (22, 3)] {
        assert_msg(&p.mem, p.a.recv_result(id).as_ref().expect("delivered"), tag, &[200]);
    }
    assert_eq!(p.a.core.recv.landed_bytes, 0);
}

#[test]
fn a_returned_message_goes_to_a_receive_already_waiting() {
    let mut p = Pair::established();
    p.recv(Who::A, 10, None);
    p.send(Who::C, 1, msg(1, &[300]));
    p.run();
    let message = take_delivered(&mut p.a, 10);
    p.recv(Who::A, 11, None);
    p.act(Who::A, |core, lane, now| core.return_undelivered(10, message, now, lane));
    assert_msg(&p.mem, p.a.recv_result(11).as_ref().expect("delivered"), 1, &[300]);
}

#[test]
fn a_returned_message_is_still_received_after_the_connection_died() {
    let mut p = Pair::established();
    p.recv(Who::A, 10, None);
    p.send(Who::C, 1, msg(1, &[300]));
    p.run();
    let message = take_delivered(&mut p.a, 10);
    p.close(Who::C);
    p.run();
    assert!(p.a.dead());
    p.act(Who::A, |core, lane, now| core.return_undelivered(10, message, now, lane));
    p.recv(Who::A, 11, None);
    assert_msg(&p.mem, p.a.recv_result(11).as_ref().expect("kept"), 1, &[300]);
}

#[test]
fn a_withdrawn_queued_send_is_never_described_and_the_next_one_goes() {
    let mut p = Pair::established();
    p.c.lane.staging_capacity = 1000;
    p.send(Who::C, 1, msg(1, &[600]));
    p.send(Who::C, 2, msg(2, &[600]));
    assert_eq!(data_seqs(&p.c), [0], "the second waits for staging room");
    let mut withdrawn = false;
    p.act(Who::C, |core, lane, _| withdrawn = core.withdraw(2, lane));
    assert!(withdrawn);
    assert_eq!(p.c.lane.discarded, [2], "the lane forgets what it kept for the send");
    p.recv(Who::A, 10, None);
    p.recv(Who::A, 11, None);
    p.run();
    p.send(Who::C, 3, msg(3, &[600]));
    p.run();
    assert_msg(&p.mem, p.a.recv_result(10).as_ref().expect("first"), 1, &[600]);
    assert_msg(&p.mem, p.a.recv_result(11).as_ref().expect("third"), 3, &[600]);
    assert_eq!(data_seqs(&p.c), [0, 1], "the withdrawn send never went out");
    assert!(!p.c.sends.contains_key(&2), "a withdrawn send never completes");
    assert!(p.c.send_result(3).is_ok());
}

#[test]
fn a_send_in_flight_is_not_withdrawn_and_still_arrives() {
    let mut p = Pair::established();
    p.send(Who::C, 1, msg(1, &[600]));
    let mut withdrawn = true;
    p.act(Who::C, |core, lane, _| withdrawn = core.withdraw(1, lane));
    assert!(!withdrawn, "a described send is under way");
    p.recv(Who::A, 10, None);
    p.run();
    assert_msg(&p.mem, p.a.recv_result(10).as_ref().expect("arrived"), 1, &[600]);
    assert!(p.c.send_result(1).is_ok(), "and completes as usual");
}

#[test]
fn a_receive_withdrawn_while_its_message_lands_keeps_the_message_first() {
    // The UCX lane lands in the background: the first message is landing for receive 10
    // when its handle goes; the second lands at once. The next receives must get them in
    // order (the GPU run of the select! race over UCX found the second delivered first).
    let mut p = Pair::established();
    p.a.lane.land_mode = LandMode::InProgress;
    p.recv(Who::A, 10, None);
    p.send(Who::C, 1, msg(1, &[300]));
    p.run();
    assert_eq!(p.a.lane.landings(), 1);
    let mut withdrawn = false;
    p.act(Who::A, |core, lane, _| withdrawn = core.withdraw(10, lane));
    assert!(withdrawn, "a receive whose message is landing gives it up");
    assert_eq!(p.a.core.recv.landed_bytes, 300, "the landing message now counts as unclaimed");
    p.a.lane.land_mode = LandMode::Done;
    p.recv(Who::A, 11, None);
    p.send(Who::C, 2, msg(2, &[40]));
    p.run();
    assert!(!p.a.recvs.contains_key(&11), "the second message must not overtake the first");
    p.a.lane.complete_landings(false);
    p.run();
    p.recv(Who::A, 12, None);
    p.run();
    assert!(!p.a.recvs.contains_key(&10), "a withdrawn receive never completes");
    assert_msg(&p.mem, p.a.recv_result(11).as_ref().expect("first"), 1, &[300]);
    assert_msg(&p.mem, p.a.recv_result(12).as_ref().expect("second"), 2, &[40]);
    assert_eq!(p.a.core.recv.landed_bytes, 0);
}

#[test]
fn a_message_that_landed_behind_a_given_up_one_waits_behind_it() {
    // Found by the property test: the connector pushes message 1 (device, awaiting its
    // push) into receive 10; message 2 (host) lands unclaimed meanwhile. Receive 10 is
    // withdrawn: the next receives must get 1, then 2.
    let mut p = Pair::pushing();
    p.send(Who::C, 1, device_msg(&p.mem, 1, &[64]));
    p.recv(Who::A, 10, None);
    p.send(Who::C, 2, msg(2, &[5]));
    p.deliver(Who::A);
    p.deliver(Who::A);
    let mut withdrawn = false;
    p.act(Who::A, |core, lane, _| withdrawn = core.withdraw(10, lane));
    assert!(withdrawn);
    p.recv(Who::A, 11, None);
    p.recv(Who::A, 12, None);
    p.run();
    assert!(!p.a.recvs.contains_key(&10), "a withdrawn receive never completes");
    assert_eq!(tag_of(p.a.recv_result(11).as_ref().expect("first")), 1, "the given-up message goes first");
    assert_eq!(tag_of(p.a.recv_result(12).as_ref().expect("second")), 2);
}
