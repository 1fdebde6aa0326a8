//! The samples hold every message and, inside them, every variant of every enum and both
//! sides of every `Option`, exhaustive by construction: the variants that exist are read
//! from bincode's derived decoders (which name the allowed range when they meet an
//! unknown variant), and [`Seen`] destructures every message and struct without `..` or
//! a wildcard arm, so a new message, variant or field fails to compile here or fails
//! [`the_samples_hold_every_variant_of_everything`] until it has a sample.

use super::super::device_frame::*;
use super::super::hello::{GpuInfo, Hello, HostIdentity, UcxInfo, WireCopies, WireLane, WirePolicy};
use super::super::messages::*;
use super::super::onesided::*;
use bincode::error::{AllowedEnumVariants, DecodeError};
use bincode::{Decode, Encode};
use std::any::type_name;
use std::collections::{BTreeMap, BTreeSet};

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_little_endian().with_variable_int_encoding()
}

/// Every variant index of `T`, as its derived decoder states them.
fn variants_of<T: Decode<()>>() -> BTreeSet<u32> {
    // 250 is one varint byte, and no enum here has that many variants.
    match bincode::decode_from_slice::<T, _>(&[250], config()) {
        Err(DecodeError::UnexpectedVariant { allowed: AllowedEnumVariants::Range { min, max }, .. }) => {
            (*min..=*max).collect()
        }
        Err(DecodeError::UnexpectedVariant { allowed: AllowedEnumVariants::Allowed(list), .. }) => {
            list.iter().copied().collect()
        }
        other => panic!("{} is not an enum with fewer than 250 variants: {:?}", type_name::<T>(), other.err()),
    }
}

/// The variant index of `value` (its encoding starts with it).
fn variant_of<T: Encode>(value: &T) -> u32 {
    let bytes = bincode::encode_to_vec(value, config()).expect("encoding into a Vec");
    bincode::decode_from_slice::<u32, _>(&bytes, config()).expect("a variant index first").0
}

/// Variant indices seen, by enum type (or by field, for options).
#[derive(Default, Debug)]
pub(super) struct Seen(pub BTreeMap<&'static str, BTreeSet<u32>>);

impl Seen {
    pub fn of<'a>(messages: impl IntoIterator<Item = &'a WireMessage>) -> Self {
        let mut seen = Self::default();
        for m in messages {
            seen.message(m);
        }
        seen
    }

    fn variant<T: Encode>(&mut self, value: &T) {
        self.at(type_name::<T>(), value);
    }

    fn at<T: Encode>(&mut self, label: &'static str, value: &T) {
        self.0.entry(label).or_default().insert(variant_of(value));
    }

    fn message(&mut self, m: &WireMessage) {
        self.variant(m);
        match m {
            WireMessage::Hello(hello) => self.hello(hello),
            WireMessage::Welcome { hello, lane, control_ring: _ } => {
                self.hello(hello);
                self.variant::<WireLane>(lane);
            }
            WireMessage::Regions(regions) => {
                for RegionAnnouncement { region_id: _, len: _, kind } in regions {
                    self.variant::<RegionKind>(kind);
                }
            }
            WireMessage::Data(DataMessage { seq: _, header: _, frames }) => frames.iter().for_each(|f| self.frame(f)),
            WireMessage::Ack { seq: _, result } => self.variant::<AckResult>(result),
            WireMessage::PushTargets { seq: _, targets } => targets.iter().for_each(|d| self.device(d)),
            WireMessage::PushOffer { offer: _, targets, for_seq } => {
                targets.iter().for_each(|d| self.device(d));
                self.at("PushOffer.for_seq", for_seq);
            }
            WireMessage::Reject { reason: _ }
            | WireMessage::ForgetRegion { region_id: _ }
            | WireMessage::Goodbye
            | WireMessage::PushDone { seq: _ }
            | WireMessage::DeclineOffer { offer: _ }
            | WireMessage::WithdrawOffer { offer: _ }
            | WireMessage::Wake => {}
            WireMessage::ImportKey { request: _, key: _ }
            | WireMessage::NotifyCancelled { grant: _, gate: _ }
            | WireMessage::Revoke { grant: _ }
            | WireMessage::RevokeDone { grant: _ }
            | WireMessage::Unimport { grant: _ } => {}
            WireMessage::ImportAnswer { request: _, answer } => {
                self.variant::<ImportAnswer>(answer);
                if let ImportAnswer::Granted(GrantedRegion { grant: _, len: _, access, memory }) = answer {
                    self.variant::<WireAccess>(access);
                    self.granted(memory);
                }
            }
            WireMessage::Transfer(t) => {
                let TransferMessage { id: _, op, grant: _, local, local_len: _, spans, notify } = t.as_ref();
                self.variant::<TransferOp>(op);
                self.granted(local);
                for WireSpan { local_offset: _, remote_offset: _, len: _ } in spans {}
                self.at("TransferMessage.notify", notify);
            }
            WireMessage::Prepare(t) => {
                let TransferMessage { id: _, op, grant: _, local, local_len: _, spans, notify: _ } = t.as_ref();
                self.variant::<TransferOp>(op);
                self.granted(local);
                for WireSpan { local_offset: _, remote_offset: _, len: _ } in spans {}
            }
            WireMessage::RunPrepared { id: _, prepared: _, notify } => self.at("RunPrepared.notify", notify),
            WireMessage::Notify { grant: _, data: _, gate } => self.at("Notify.gate", gate),
            WireMessage::Unprepare { prepared: _ } => {}
            WireMessage::TransferDone { id: _, outcome } => self.variant::<TransferOutcome>(outcome),
        }
    }

    fn granted(&mut self, m: &GrantedMemory) {
        self.variant::<GrantedMemory>(m);
        match m {
            GrantedMemory::Device(d) => self.device(d),
            GrantedMemory::Host { region_id: _, offset: _ }
            | GrantedMemory::Rma { address: _, rkey: _, device: _ }
            | GrantedMemory::Staged { device: _ }
            | GrantedMemory::Staging { address: _, rkey: _, device: _ } => {}
        }
    }

    fn hello(&mut self, hello: &Hello) {
        let Hello {
            protocol_version: _,
            host: HostIdentity { hostname: _, boot_id: _ },
            uid: _,
            pid: _,
            policy,
            native_available: _,
            ucx,
            gpus,
            peer_access: _,
            device_copies,
            control_ring,
        } = hello;
        self.variant::<WirePolicy>(policy);
        self.variant::<WireCopies>(device_copies);
        self.at("Hello.ucx", ucx);
        self.at("Hello.control_ring", control_ring);
        if let Some(UcxInfo { cuda_aware: _, worker_address: _, tag_prefix: _, tcp_segment }) = ucx {
            self.at("UcxInfo.tcp_segment", tcp_segment);
        }
        // No enum in a GPU's description (a new field makes this think again).
        for GpuInfo { ordinal: _, uuid: _ } in gpus {}
    }

    fn frame(&mut self, frame: &FrameDescriptor) {
        self.variant(frame);
        match frame {
            FrameDescriptor::Device(d) => self.device(d),
            FrameDescriptor::DeviceOffered { offer: _, index: _, len: _, ready, gate } => {
                self.at("FrameDescriptor::DeviceOffered.ready", ready);
                self.at("FrameDescriptor::DeviceOffered.gate", gate);
            }
            FrameDescriptor::Inline(_)
            | FrameDescriptor::HostRegion { region_id: _, offset: _, len: _ }
            | FrameDescriptor::DevicePush { len: _ }
            | FrameDescriptor::Remote { len: _, device: _, chunk: _ } => {}
        }
    }

    fn device(&mut self, d: &DeviceFrameDescriptor) {
        let DeviceFrameDescriptor { memory, offset: _, len: _, device_uuid: _, event } = d;
        self.variant::<DeviceMemory>(memory);
        self.at("DeviceFrameDescriptor.event", event);
    }
}

/// What [`Seen`] must find: every variant of every enum and option it records.
pub(super) fn everything() -> BTreeMap<&'static str, BTreeSet<u32>> {
    BTreeMap::from([
        (type_name::<WireMessage>(), variants_of::<WireMessage>()),
        (type_name::<WireLane>(), variants_of::<WireLane>()),
        (type_name::<WirePolicy>(), variants_of::<WirePolicy>()),
        (type_name::<WireCopies>(), variants_of::<WireCopies>()),
        (type_name::<RegionKind>(), variants_of::<RegionKind>()),
        (type_name::<AckResult>(), variants_of::<AckResult>()),
        (type_name::<FrameDescriptor>(), variants_of::<FrameDescriptor>()),
        (type_name::<DeviceMemory>(), variants_of::<DeviceMemory>()),
        ("Hello.ucx", variants_of::<Option<UcxInfo>>()),
        ("Hello.control_ring", variants_of::<Option<u64>>()),
        ("UcxInfo.tcp_segment", variants_of::<Option<String>>()),
        ("FrameDescriptor::DeviceOffered.ready", variants_of::<Option<[u8; 64]>>()),
        ("FrameDescriptor::DeviceOffered.gate", variants_of::<Option<NotifyGate>>()),
        ("DeviceFrameDescriptor.event", variants_of::<Option<[u8; 64]>>()),
        ("PushOffer.for_seq", variants_of::<Option<u64>>()),
        (type_name::<ImportAnswer>(), variants_of::<ImportAnswer>()),
        (type_name::<WireAccess>(), variants_of::<WireAccess>()),
        (type_name::<GrantedMemory>(), variants_of::<GrantedMemory>()),
        (type_name::<TransferOp>(), variants_of::<TransferOp>()),
        (type_name::<TransferOutcome>(), variants_of::<TransferOutcome>()),
        ("TransferMessage.notify", variants_of::<Option<Vec<u8>>>()),
        ("RunPrepared.notify", variants_of::<Option<Vec<u8>>>()),
        ("Notify.gate", variants_of::<Option<NotifyGate>>()),
    ])
}

#[test]
fn the_samples_hold_every_variant_of_everything() {
    let samples = super::sample_messages();
    let seen = Seen::of(samples.iter().map(|(_, m)| m));
    assert_eq!(seen.0, everything());
}

#[test]
fn every_sample_has_its_own_name() {
    let names: BTreeSet<_> = super::sample_messages().iter().map(|(name, _)| *name).collect();
    assert_eq!(names.len(), super::sample_messages().len());
}
