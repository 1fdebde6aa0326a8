//! Properties of the decoder, each stated by [`check_decode_invariant`] (the fuzz
//! target's invariant): over generated messages, mutated samples, random bytes, and
//! random bodies behind valid prefixes (which must reach the body parsing).

use super::super::codec::{validate, MAX_NEW_REGIONS};
use super::super::device_frame::*;
use super::super::hello::*;
use super::super::messages::*;
use super::super::*;
use super::coverage::{everything, Seen};
use super::{frame_of_body, limits};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

fn small_u64() -> impl Strategy<Value = u64> {
    prop_oneof![0..300u64, any::<u64>()]
}

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..max)
}

fn hello() -> impl Strategy<Value = Hello> {
    let ucx = prop::option::of((any::<bool>(), bytes(16), any::<u16>(), prop::option::of("[0-9]{1,7}K?")).prop_map(
        |(cuda_aware, worker_address, tag_prefix, tcp_segment)| UcxInfo {
            cuda_aware,
            worker_address,
            tag_prefix,
            tcp_segment,
        },
    ));
    let policy = prop_oneof![Just(WirePolicy::Auto), Just(WirePolicy::Native), Just(WirePolicy::Ucx)];
    let copies = prop_oneof![Just(WireCopies::Receiver), Just(WireCopies::Connector)];
    let gpus = prop::collection::vec(
        (any::<u32>(), any::<[u8; 16]>()).prop_map(|(ordinal, uuid)| GpuInfo { ordinal, uuid }),
        0..3,
    );
    (
        ("[a-z]{0,8}", "[0-9a-f-]{0,8}"),
        any::<(u16, u32, u32)>(),
        policy,
        any::<bool>(),
        ucx,
        gpus,
        copies,
        prop::option::of(small_u64()),
    )
        .prop_map(
            |(
                (hostname, boot_id),
                (protocol_version, uid, pid),
                policy,
                native_available,
                ucx,
                gpus,
                device_copies,
                control_ring,
            )| Hello {
                protocol_version,
                host: HostIdentity { hostname, boot_id },
                uid,
                pid,
                policy,
                native_available,
                ucx,
                peer_access: gpus.iter().map(|g| (g.ordinal, g.ordinal)).collect(),
                gpus,
                device_copies,
                control_ring,
            },
        )
}

fn device_memory() -> impl Strategy<Value = DeviceMemory> {
    prop_oneof![
        (any::<[u8; 64]>(), small_u64(), small_u64())
            .prop_map(|(handle, buffer_id, alloc_len)| DeviceMemory::LegacyIpc { handle, buffer_id, alloc_len }),
        prop::collection::vec(small_u64(), 0..70).prop_map(|chunks| DeviceMemory::Vmm { chunks }),
        (small_u64(), any::<[u8; 64]>(), small_u64()).prop_map(|(pool, export, alloc_len)| DeviceMemory::PoolPointer {
            pool,
            export,
            alloc_len
        }),
    ]
}

fn device_frame() -> impl Strategy<Value = DeviceFrameDescriptor> {
    (device_memory(), small_u64(), small_u64(), any::<[u8; 16]>(), prop::option::of(any::<[u8; 64]>())).prop_map(
        |(memory, offset, len, device_uuid, event)| DeviceFrameDescriptor { memory, offset, len, device_uuid, event },
    )
}

fn frame() -> impl Strategy<Value = FrameDescriptor> {
    prop_oneof![
        bytes(64).prop_map(FrameDescriptor::Inline),
        (small_u64(), small_u64(), small_u64()).prop_map(|(region_id, offset, len)| FrameDescriptor::HostRegion {
            region_id,
            offset,
            len
        }),
        device_frame().prop_map(FrameDescriptor::Device),
        small_u64().prop_map(|len| FrameDescriptor::DevicePush { len }),
        (
            (small_u64(), any::<u32>(), small_u64()),
            prop::option::of(any::<[u8; 64]>()),
            prop::option::of((any::<u32>(), any::<u32>())),
        )
            .prop_map(|((offer, index, len), ready, gate)| FrameDescriptor::DeviceOffered {
                offer,
                index,
                len,
                ready,
                gate: gate.map(|(index, value)| NotifyGate { index, value }),
            }),
        (small_u64(), any::<bool>(), small_u64()).prop_map(|(len, device, chunk)| FrameDescriptor::Remote {
            len,
            device,
            chunk
        }),
    ]
}

fn region() -> impl Strategy<Value = RegionAnnouncement> {
    let kind = prop_oneof![
        Just(RegionKind::HostMemfd),
        Just(RegionKind::HostGrant),
        any::<[u8; 16]>().prop_map(|device_uuid| RegionKind::DeviceVmmChunk { device_uuid }),
        any::<[u8; 16]>().prop_map(|device_uuid| RegionKind::DevicePool { device_uuid }),
    ];
    (small_u64(), small_u64(), kind).prop_map(|(region_id, len, kind)| RegionAnnouncement { region_id, len, kind })
}

fn granted_memory() -> impl Strategy<Value = GrantedMemory> {
    prop_oneof![
        (small_u64(), small_u64()).prop_map(|(region_id, offset)| GrantedMemory::Host { region_id, offset }),
        device_frame().prop_map(GrantedMemory::Device),
        (small_u64(), bytes(200), any::<bool>()).prop_map(|(address, rkey, device)| GrantedMemory::Rma {
            address,
            rkey,
            device
        }),
        any::<bool>().prop_map(|device| GrantedMemory::Staged { device }),
        (small_u64(), bytes(200), any::<bool>()).prop_map(|(address, rkey, device)| GrantedMemory::Staging {
            address,
            rkey,
            device
        }),
    ]
}

/// Any one-sided message, well-formed or breaking a limit.
fn onesided_message() -> impl Strategy<Value = WireMessage> {
    let access = prop_oneof![Just(WireAccess::Read), Just(WireAccess::Write), Just(WireAccess::ReadWrite)];
    let op = || prop_oneof![Just(TransferOp::Put), Just(TransferOp::Get)];
    let span = || {
        (small_u64(), small_u64(), small_u64()).prop_map(|(local_offset, remote_offset, len)| WireSpan {
            local_offset,
            remote_offset,
            len,
        })
    };
    let answer = prop_oneof![
        (small_u64(), small_u64(), access, granted_memory()).prop_map(|(grant, len, access, memory)| {
            ImportAnswer::Granted(GrantedRegion { grant, len, access, memory })
        }),
        "[a-z ]{0,12}".prop_map(ImportAnswer::Refused),
    ];
    let outcome = prop_oneof![Just(TransferOutcome::Done), "[a-z ]{0,12}".prop_map(TransferOutcome::Failed)];
    let transfer = || {
        (
            small_u64(),
            op(),
            small_u64(),
            granted_memory(),
            small_u64(),
            prop::collection::vec(span(), 0..8),
            prop::option::of(bytes(32)),
        )
            .prop_map(|(id, op, grant, local, local_len, spans, notify)| {
                Box::new(TransferMessage { id, op, grant, local, local_len, spans, notify })
            })
    };
    prop_oneof![
        (small_u64(), bytes(80)).prop_map(|(request, key)| WireMessage::ImportKey { request, key }),
        (small_u64(), answer).prop_map(|(request, answer)| WireMessage::ImportAnswer { request, answer }),
        transfer().prop_map(WireMessage::Transfer),
        transfer().prop_map(WireMessage::Prepare),
        (small_u64(), small_u64(), prop::option::of(bytes(32)))
            .prop_map(|(id, prepared, notify)| WireMessage::RunPrepared { id, prepared, notify }),
        small_u64().prop_map(|prepared| WireMessage::Unprepare { prepared }),
        (small_u64(), outcome).prop_map(|(id, outcome)| WireMessage::TransferDone { id, outcome }),
        (small_u64(), bytes(64), proptest::option::of((any::<u32>(), any::<u32>()))).prop_map(|(grant, data, gate)| {
            WireMessage::Notify { grant, data, gate: gate.map(|(index, value)| NotifyGate { index, value }) }
        }),
        (small_u64(), any::<u32>(), any::<u32>()).prop_map(|(grant, index, value)| WireMessage::NotifyCancelled {
            grant,
            gate: NotifyGate { index, value }
        }),
        small_u64().prop_map(|grant| WireMessage::Revoke { grant }),
        small_u64().prop_map(|grant| WireMessage::RevokeDone { grant }),
        small_u64().prop_map(|grant| WireMessage::Unimport { grant }),
    ]
}

/// Any message, well-formed or breaking a limit (small enough never to be oversized).
fn message() -> impl Strategy<Value = WireMessage> {
    let lane = prop_oneof![Just(WireLane::Native), Just(WireLane::Ucx)];
    let ack = prop_oneof![Just(AckResult::Delivered), "[a-z ]{0,12}".prop_map(AckResult::Refused)];
    let targets = || prop::collection::vec(device_frame(), 0..6);
    prop_oneof![
        hello().prop_map(WireMessage::Hello),
        (hello(), lane, any::<bool>()).prop_map(|(hello, lane, control_ring)| WireMessage::Welcome {
            hello,
            lane,
            control_ring
        }),
        "[a-z ]{0,12}".prop_map(|reason| WireMessage::Reject { reason }),
        prop::collection::vec(region(), 0..MAX_NEW_REGIONS + 3).prop_map(WireMessage::Regions),
        (small_u64(), bytes(64), prop::collection::vec(frame(), 0..8))
            .prop_map(|(seq, header, frames)| WireMessage::Data(DataMessage { seq, header, frames })),
        (small_u64(), ack).prop_map(|(seq, result)| WireMessage::Ack { seq, result }),
        small_u64().prop_map(|region_id| WireMessage::ForgetRegion { region_id }),
        Just(WireMessage::Goodbye),
        (small_u64(), targets()).prop_map(|(seq, targets)| WireMessage::PushTargets { seq, targets }),
        small_u64().prop_map(|seq| WireMessage::PushDone { seq }),
        (small_u64(), targets(), prop::option::of(small_u64()))
            .prop_map(|(offer, targets, for_seq)| WireMessage::PushOffer { offer, targets, for_seq }),
        small_u64().prop_map(|offer| WireMessage::DeclineOffer { offer }),
        small_u64().prop_map(|offer| WireMessage::WithdrawOffer { offer }),
        onesided_message(),
        Just(WireMessage::Wake),
    ]
}

/// Limits tight enough that generated messages break each of them now and then.
fn generated_limits() -> Limits {
    Limits { max_header_bytes: 48, max_frames: 6, max_frame_len: 1 << 40, inline_threshold: 48 }
}

/// Bytes that start like a frame: a valid prefix (reserved bytes random) declaring the
/// body that follows, the body a mutated sample or a message's variant index and random
/// bytes; now and then cut short.
fn frame_like() -> impl Strategy<Value = Vec<u8>> {
    let samples: Vec<Vec<u8>> =
        sample_messages().iter().map(|(_, m)| encode_frame(m)[FRAME_PREFIX_LEN..].to_vec()).collect();
    // Every message's variant index (the samples hold every message).
    let variants: Vec<u8> = samples.iter().map(|body| body[0]).collect();
    let mutated =
        (prop::sample::select(samples), prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4))
            .prop_map(|(mut body, edits)| {
                // The message's variant index stays; a body of nothing else grows instead.
                for (at, byte) in edits {
                    match body.len() {
                        1 => body.push(byte),
                        len => body[1 + at.index(len - 1)] = byte,
                    }
                }
                body
            });
    let variant_and_noise =
        (prop::sample::select(variants), bytes(96)).prop_map(|(variant, tail)| [vec![variant], tail].concat());
    let body = prop_oneof![3 => mutated, 1 => variant_and_noise];
    (body, any::<[u8; 2]>(), prop::option::weighted(0.05, any::<prop::sample::Index>())).prop_map(
        |(body, reserved, cut)| {
            let mut frame = frame_of_body(&body);
            frame[6..8].copy_from_slice(&reserved);
            if let Some(cut) = cut {
                frame.truncate(cut.index(frame.len()));
            }
            frame
        },
    )
}

/// Checks the invariant, failing the property with the violation.
fn invariant(bytes: &[u8], limits: &Limits) -> Result<DecodeOutcome, TestCaseError> {
    check_decode_invariant(bytes, limits).map_err(|e| TestCaseError::fail(format!("{e} (input {bytes:02x?})")))
}

proptest! {
    #[test]
    fn generated_messages_round_trip_or_break_the_limit_validation_names(m in message(), after in bytes(16)) {
        let limits = generated_limits();
        let mut bytes = encode_frame(&m);
        let len = bytes.len();
        bytes.extend_from_slice(&after);
        let outcome = invariant(&bytes, &limits)?;
        match validate(&m, &limits) {
            Ok(()) => prop_assert_eq!(outcome, DecodeOutcome::Accepted { message: m, used: len }),
            Err(e) => prop_assert_eq!(outcome, DecodeOutcome::Rejected(e)),
        }
    }

    #[test]
    fn mutated_samples_keep_the_invariant(
        which in any::<prop::sample::Index>(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let samples = sample_messages();
        let mut bytes = encode_frame(&which.get(&samples).1);
        for (at, byte) in edits {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        invariant(&bytes, &limits())?;
    }

    #[test]
    fn arbitrary_bytes_keep_the_invariant(bytes in bytes(2048)) {
        invariant(&bytes, &limits())?;
    }
}

#[test]
fn generated_messages_hold_every_variant_of_everything() {
    let mut runner = TestRunner::deterministic();
    let strategy = message();
    let generated: Vec<_> = (0..6000).map(|_| strategy.new_tree(&mut runner).unwrap().current()).collect();
    assert_eq!(Seen::of(&generated).0, everything());
}

/// Where decoding a frame-like input stopped.
#[derive(Debug, Default)]
struct Reached {
    inputs: usize,
    /// Rejected or waited for on its prefix (magic, version, length).
    stopped_at_the_prefix: usize,
    /// Refused at the message's own variant index.
    stopped_at_the_variant: usize,
    /// Decoded whole (then accepted or refused for a limit).
    decoded: usize,
    accepted: usize,
}

#[test]
fn random_bodies_behind_valid_prefixes_reach_the_body_parsing() {
    let mut runner = TestRunner::deterministic();
    let strategy = frame_like();
    let mut reached = Reached::default();
    for _ in 0..20_000 {
        let bytes = strategy.new_tree(&mut runner).unwrap().current();
        let outcome = check_decode_invariant(&bytes, &limits()).unwrap_or_else(|e| panic!("{e}: input {bytes:02x?}"));
        reached.inputs += 1;
        match outcome {
            DecodeOutcome::NeedsMore
            | DecodeOutcome::Rejected(
                WireError::BadMagic(_) | WireError::UnknownVersion { .. } | WireError::Oversized { .. },
            ) => reached.stopped_at_the_prefix += 1,
            DecodeOutcome::Rejected(WireError::Malformed(e))
                if e.contains("UnexpectedVariant") && e.contains("WireMessage") =>
            {
                reached.stopped_at_the_variant += 1
            }
            DecodeOutcome::Rejected(WireError::Malformed(_)) => {}
            DecodeOutcome::Rejected(WireError::LimitExceeded(_)) => reached.decoded += 1,
            DecodeOutcome::Accepted { .. } => {
                reached.decoded += 1;
                reached.accepted += 1;
            }
        }
    }
    println!("{reached:?}");
    let share = |n: usize| n as f64 / reached.inputs as f64;
    assert!(share(reached.stopped_at_the_prefix) <= 0.10, "{reached:?}");
    assert!(share(reached.stopped_at_the_variant) <= 0.10, "{reached:?}");
    assert!(share(reached.decoded) >= 0.25, "{reached:?}");
    assert!(share(reached.accepted) >= 0.20, "{reached:?}");
}
