//! The native lane's own bookkeeping, without a peer: what a send holds once the
//! connection ended while the peer may still copy out of it; frames gated on a word of
//! the control rings.

use super::{NativeLane, NativeSettings};
use crate::config::Config;
use crate::device::DeviceState;
use crate::lanes::Lane;
use ferrylink_ipc::control_ring::{ControlRingMemory, GATE_WORDS};
use ferrylink_memory::{Frame, HostBuffer, Message};
use ferrylink_proto::connection::lane::{CoreLane, Readiness};
use ferrylink_proto::connection::PushRole;
use ferrylink_proto::wire::{DataMessage, FrameDescriptor, NotifyGate};
use std::sync::atomic::Ordering;
use std::sync::Arc;

fn lane() -> NativeLane {
    let config = Config::default();
    let device = Arc::new(DeviceState::new(&config, None));
    NativeLane::new(device, PushRole::Target, std::process::id(), NativeSettings::from_config(&config))
}

/// A message whose one host frame is staged (past the inline limit, in private memory).
fn staged_message(lane: &NativeLane) -> Message {
    let len = lane.settings.inline_threshold * 4 + 4096;
    Message::new(b"m".to_vec(), vec![Frame::Host(HostBuffer::from_vec(vec![7u8; len]))])
}

#[test]
fn a_send_released_unacknowledged_while_lent_things_are_held_keeps_its_staging_until_the_hangup() {
    let mut lane = lane();
    let mut message = staged_message(&lane);
    assert!(lane.describe(1, 0, &mut message).is_ok(), "described");
    let staged = lane.staging.used_bytes();
    assert!(staged > 0, "the frame was staged");
    lane.hold_lent_buffers();
    CoreLane::release(&mut lane, 0, &mut message, false);
    assert_eq!(lane.staging.used_bytes(), staged, "the peer may still be copying out of the staging copy");
    lane.close();
    lane.release_lent_buffers();
    assert!(lane.held_sends.is_empty());
}

#[test]
fn sends_go_at_once_when_acknowledged_or_nothing_is_held() {
    let mut lane = lane();
    let mut message = staged_message(&lane);
    assert!(lane.describe(1, 0, &mut message).is_ok(), "described");
    CoreLane::release(&mut lane, 0, &mut message, false);
    assert_eq!(lane.staging.used_bytes(), 0, "not held: the staging copy went back");

    let mut message = staged_message(&lane);
    assert!(lane.describe(2, 1, &mut message).is_ok(), "described");
    lane.hold_lent_buffers();
    CoreLane::release(&mut lane, 1, &mut message, true);
    assert_eq!(lane.staging.used_bytes(), 0, "acknowledged: the peer is done with it");
    assert!(lane.held_sends.is_empty());
}

/// A message of one device frame filled into an offer, its end marked by `gate`.
fn gated_offered(gate: NotifyGate) -> DataMessage {
    let frames = vec![FrameDescriptor::DeviceOffered { offer: 1, index: 0, len: 8, ready: None, gate: Some(gate) }];
    DataMessage { seq: 0, header: vec![], frames }
}

#[test]
fn a_frame_gated_on_a_control_ring_word_waits_for_it_and_a_lying_gate_is_the_peers_fault() {
    let mut lane = lane();
    // No control rings on this connection: a gate cannot be read.
    let gate = NotifyGate { index: 300, value: 1 };
    assert!(matches!(lane.ready_events(&gated_offered(gate)), Readiness::Failed(f) if f.peer_at_fault));
    let ring = ControlRingMemory::create(4096).unwrap();
    lane.use_control_ring(&ring, false);
    // The connector's copies write word 300 (the acceptor reads it): shut until it holds 1.
    assert!(matches!(lane.ready_events(&gated_offered(gate)), Readiness::Pending));
    ring.gate_word(300).unwrap().store(1, Ordering::Release);
    assert!(matches!(lane.ready_events(&gated_offered(gate)), Readiness::Ready));
    // A later value of the same word is not there yet; one past the words never is.
    assert!(matches!(lane.ready_events(&gated_offered(NotifyGate { index: 300, value: 2 })), Readiness::Pending));
    let outside = NotifyGate { index: GATE_WORDS as u32, value: 1 };
    assert!(matches!(lane.ready_events(&gated_offered(outside)), Readiness::Failed(f) if f.peer_at_fault));
}
