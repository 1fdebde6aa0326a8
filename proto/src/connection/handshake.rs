//! The handshake: `Hello` from the connecting side, `Welcome` (or `Reject`) from the
//! accepting side, each side computing the lane with [`negotiate`] and checking the
//! other's choice.

use super::{Connection, Output, Phase, PushRole, Role};
use crate::error::ConnectError;
use crate::lane_kind::LaneKind;
use crate::negotiate::negotiate;
use crate::payload::Payload;
use crate::peer::PeerInfo;
use crate::policy::DeviceCopies;
use crate::wire::{Hello, WireMessage};

impl<P: Payload> Connection<P> {
    pub(super) fn handshake(&mut self, message: WireMessage) {
        match (self.role, message) {
            (Role::Acceptor, WireMessage::Hello(remote)) => match negotiate(&self.local, &remote) {
                Ok(lane) => {
                    let control_ring = remote.control_ring.is_some() && self.ring_taken;
                    let welcome = WireMessage::Welcome { hello: self.local.clone(), lane: lane.into(), control_ring };
                    self.transmit(welcome);
                    if control_ring {
                        self.out.push_back(Output::UseRing);
                    }
                    let copies = remote.device_copies.into();
                    self.open_lane(remote, lane, copies);
                }
                Err(e) => self.refuse(e.to_string()),
            },
            (Role::Connector { ring_offered }, WireMessage::Welcome { hello, lane, control_ring }) => {
                let lane = LaneKind::from(lane);
                match negotiate(&self.local, &hello) {
                    Ok(ours) if ours == lane => {
                        match (control_ring, ring_offered) {
                            (true, true) => self.out.push_back(Output::UseRing),
                            (true, false) => {
                                return self.protocol_error("the listener took control rings never offered")
                            }
                            (false, _) => {}
                        }
                        let copies = self.local.device_copies.into();
                        self.open_lane(hello, lane, copies)
                    }
                    Ok(ours) => self.refuse(format!("the listener chose the {lane} lane, this side computed {ours}")),
                    Err(e) => self.refuse(e.to_string()),
                }
            }
            (Role::Connector { .. }, WireMessage::Reject { reason }) => {
                if self.reply_pending {
                    self.reply_pending = false;
                    self.out.push_back(Output::HandshakeFailed(ConnectError::Rejected { reason: reason.clone() }));
                }
                self.fail_peer(reason, &mut super::lane::NoLane);
            }
            (_, other) => self.protocol_error(&format!("unexpected {} during the handshake", super::kind(&other))),
        }
    }

    /// Says why we give up, then fails the connection (both sides report the reason).
    fn refuse(&mut self, reason: String) {
        tracing::warn!("handshake with {} refused: {reason}", self.peer);
        self.transmit(WireMessage::Reject { reason: reason.clone() });
        self.out.push_back(Output::Flush);
        if self.reply_pending {
            self.reply_pending = false;
            self.out.push_back(Output::HandshakeFailed(ConnectError::Handshake(reason.clone())));
        }
        self.fail_peer(reason, &mut super::lane::NoLane);
    }

    fn open_lane(&mut self, remote: Hello, lane: LaneKind, copies: DeviceCopies) {
        self.peer = format!("pid {} on {}", remote.pid, remote.host.hostname);
        self.push = PushRole::of(lane, copies, self.role);
        self.phase = Phase::OpeningLane;
        self.out.push_back(Output::OpenLane { lane, push: self.push, remote: Box::new(remote) });
    }

    /// The driver opened the lane (`Err`: why it could not, which refuses the peer).
    pub fn lane_opened(&mut self, opened: Result<(LaneKind, Hello), String>) {
        if self.phase != Phase::OpeningLane {
            return;
        }
        let (lane, remote) = match opened {
            Ok(opened) => opened,
            Err(reason) => return self.refuse(reason),
        };
        self.phase = Phase::Established;
        self.established = true;
        self.reply_pending = false;
        let peer = PeerInfo::from_hello(remote);
        self.out.push_back(Output::Established { lane, push: self.push, peer: Box::new(peer) });
    }
}
