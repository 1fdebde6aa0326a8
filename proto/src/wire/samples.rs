//! One well-formed sample of every message, together naming every variant of every enum
//! (and both sides of every `Option`) a message can hold. The codec's tests check that
//! the samples cover all of them (`tests/coverage.rs`: the variant counts come from
//! bincode's derives, so a new variant without a sample fails a test), and the fuzz
//! target's seed corpus is made of their frames (`tests/corpus.rs`).

use super::device_frame::{DeviceFrameDescriptor, DeviceMemory};
use super::hello::{GpuInfo, Hello, HostIdentity, UcxInfo, WireCopies, WireLane, WirePolicy};
use super::messages::{AckResult, DataMessage, FrameDescriptor, RegionAnnouncement, RegionKind, WireMessage};
use super::onesided::{
    GrantedMemory, GrantedRegion, ImportAnswer, NotifyGate, TransferMessage, TransferOp, TransferOutcome, WireAccess,
    WireSpan,
};
use super::PROTOCOL_VERSION;

/// The samples, each with a short name (the file name of its seed in the fuzz corpus).
pub fn sample_messages() -> Vec<(&'static str, WireMessage)> {
    vec![
        ("hello", WireMessage::Hello(full_hello())),
        ("hello-bare", WireMessage::Hello(bare_hello())),
        (
            "welcome-native",
            WireMessage::Welcome { hello: ucx_only_hello(), lane: WireLane::Native, control_ring: true },
        ),
        ("welcome-ucx", WireMessage::Welcome { hello: ucx_only_hello(), lane: WireLane::Ucx, control_ring: false }),
        ("reject", WireMessage::Reject { reason: "no".into() }),
        ("regions", WireMessage::Regions(every_region_kind())),
        ("data", WireMessage::Data(data_with_every_frame_kind())),
        ("ack-delivered", WireMessage::Ack { seq: 1, result: AckResult::Delivered }),
        ("ack-refused", WireMessage::Ack { seq: 2, result: AckResult::Refused("size".into()) }),
        ("forget-region", WireMessage::ForgetRegion { region_id: 5 }),
        ("goodbye", WireMessage::Goodbye),
        ("push-targets", WireMessage::PushTargets { seq: 4, targets: every_device_memory() }),
        ("push-done", WireMessage::PushDone { seq: 4 }),
        ("push-offer", WireMessage::PushOffer { offer: 7, targets: every_device_memory(), for_seq: None }),
        (
            "push-offer-for-receive",
            WireMessage::PushOffer { offer: 8, targets: every_device_memory(), for_seq: Some(3) },
        ),
        ("decline-offer", WireMessage::DeclineOffer { offer: 7 }),
        ("withdraw-offer", WireMessage::WithdrawOffer { offer: 8 }),
        ("import-key", WireMessage::ImportKey { request: 3, key: sample_key().to_vec() }),
        ("import-key-garbage", WireMessage::ImportKey { request: 4, key: vec![7; 48] }),
        (
            "import-granted-host",
            WireMessage::ImportAnswer {
                request: 3,
                answer: granted(WireAccess::Write, GrantedMemory::Host { region_id: 3, offset: 64 }),
            },
        ),
        (
            "import-granted-device",
            WireMessage::ImportAnswer {
                request: 4,
                answer: granted(WireAccess::Read, GrantedMemory::Device(every_device_memory().remove(0))),
            },
        ),
        (
            "import-granted-rma",
            WireMessage::ImportAnswer {
                request: 5,
                answer: granted(
                    WireAccess::ReadWrite,
                    GrantedMemory::Rma { address: 1 << 40, rkey: vec![1; 90], device: true },
                ),
            },
        ),
        (
            "import-granted-staged",
            WireMessage::ImportAnswer {
                request: 7,
                answer: granted(WireAccess::Write, GrantedMemory::Staged { device: true }),
            },
        ),
        ("import-refused", WireMessage::ImportAnswer { request: 6, answer: ImportAnswer::Refused("revoked".into()) }),
        ("transfer-put", WireMessage::Transfer(Box::new(transfer(TransferOp::Put, Some(b"kv ready".to_vec()))))),
        ("transfer-get", WireMessage::Transfer(Box::new(transfer(TransferOp::Get, None)))),
        ("transfer-staged", WireMessage::Transfer(Box::new(staged_transfer()))),
        ("prepare", WireMessage::Prepare(Box::new(transfer(TransferOp::Put, None)))),
        ("run-prepared", WireMessage::RunPrepared { id: 9, prepared: 7, notify: Some(b"kv ready".to_vec()) }),
        ("run-prepared-silent", WireMessage::RunPrepared { id: 10, prepared: 7, notify: None }),
        ("unprepare", WireMessage::Unprepare { prepared: 7 }),
        ("transfer-done", WireMessage::TransferDone { id: 7, outcome: TransferOutcome::Done }),
        ("transfer-failed", WireMessage::TransferDone { id: 8, outcome: TransferOutcome::Failed("revoked".into()) }),
        ("notify", WireMessage::Notify { grant: 1, data: b"block 7".to_vec(), gate: None }),
        (
            "notify-gated",
            WireMessage::Notify { grant: 1, data: b"block 8".to_vec(), gate: Some(NotifyGate { index: 3, value: 9 }) },
        ),
        ("notify-cancelled", WireMessage::NotifyCancelled { grant: 1, gate: NotifyGate { index: 3, value: 9 } }),
        ("revoke", WireMessage::Revoke { grant: 1 }),
        ("revoke-done", WireMessage::RevokeDone { grant: 1 }),
        ("unimport", WireMessage::Unimport { grant: 2 }),
        ("wake", WireMessage::Wake),
    ]
}

/// A well-formed key's bytes.
fn sample_key() -> [u8; crate::region::KEY_LEN] {
    crate::region::RemoteKey {
        context: [4; 16],
        registration: 9,
        secret: 0x0123_4567_89AB_CDEF,
        len: 1 << 20,
        access: crate::region::Access::ReadWrite,
        memory: crate::region::MemoryKind::Device,
    }
    .to_bytes()
}

fn granted(access: WireAccess, memory: GrantedMemory) -> ImportAnswer {
    ImportAnswer::Granted(GrantedRegion { grant: 1, len: 1 << 20, access, memory })
}

/// A transfer of three spans (a gap between the first two).
fn transfer(op: TransferOp, notify: Option<Vec<u8>>) -> TransferMessage {
    let spans = vec![
        WireSpan { local_offset: 0, remote_offset: 0, len: 4096 },
        WireSpan { local_offset: 4096, remote_offset: 8192, len: 4096 },
        WireSpan { local_offset: 8192, remote_offset: 16384, len: 1 },
    ];
    let local = match op {
        TransferOp::Put => GrantedMemory::Host { region_id: 5, offset: 0 },
        TransferOp::Get => GrantedMemory::Device(every_device_memory().remove(2)),
    };
    TransferMessage { id: 7, op, grant: 1, local, local_len: 1 << 20, spans, notify }
}

/// A transfer whose initiator staged its bytes (packed) for the owner to fetch.
fn staged_transfer() -> TransferMessage {
    let spans = vec![
        WireSpan { local_offset: 0, remote_offset: 1 << 20, len: 65536 },
        WireSpan { local_offset: 65536, remote_offset: 0, len: 65536 },
    ];
    let local = GrantedMemory::Staging { address: 1 << 44, rkey: vec![2; 120], device: true };
    TransferMessage { id: 9, op: TransferOp::Put, grant: 3, local, local_len: 131072, spans, notify: None }
}

/// A connector's introduction with everything present.
pub fn full_hello() -> Hello {
    Hello {
        protocol_version: PROTOCOL_VERSION,
        host: HostIdentity { hostname: "h".into(), boot_id: "b".into() },
        uid: 1000,
        pid: 42,
        policy: WirePolicy::Auto,
        native_available: true,
        ucx: Some(UcxInfo {
            cuda_aware: false,
            worker_address: vec![1, 2, 3],
            tag_prefix: 9,
            tcp_segment: Some("524288".into()),
        }),
        gpus: vec![GpuInfo { ordinal: 0, uuid: [7; 16] }],
        peer_access: vec![(0, 0)],
        device_copies: WireCopies::Connector,
        control_ring: Some(1 << 20),
    }
}

/// A native-only introduction without UCX, GPUs or control rings.
fn bare_hello() -> Hello {
    Hello {
        policy: WirePolicy::Native,
        ucx: None,
        gpus: vec![],
        peer_access: vec![],
        device_copies: WireCopies::Receiver,
        control_ring: None,
        ..full_hello()
    }
}

/// An acceptor that forces UCX, whose UCX does not use TCP.
fn ucx_only_hello() -> Hello {
    let mut hello = Hello { policy: WirePolicy::Ucx, native_available: false, control_ring: None, ..full_hello() };
    if let Some(ucx) = &mut hello.ucx {
        ucx.cuda_aware = true;
        ucx.tcp_segment = None;
    }
    hello
}

fn every_region_kind() -> Vec<RegionAnnouncement> {
    vec![
        RegionAnnouncement::host(3, 4096),
        RegionAnnouncement {
            region_id: 1 << 63,
            len: 2 << 20,
            kind: RegionKind::DeviceVmmChunk { device_uuid: [3; 16] },
        },
        RegionAnnouncement { region_id: (1 << 63) + 1, len: 0, kind: RegionKind::DevicePool { device_uuid: [3; 16] } },
        RegionAnnouncement { region_id: 5, len: 1 << 20, kind: RegionKind::HostGrant },
    ]
}

/// One device frame of each kind of memory, with and without an event.
pub fn every_device_memory() -> Vec<DeviceFrameDescriptor> {
    vec![
        DeviceFrameDescriptor {
            memory: DeviceMemory::LegacyIpc { handle: [5; 64], buffer_id: 11, alloc_len: 1 << 20 },
            offset: 512,
            len: 1024,
            device_uuid: [1; 16],
            event: Some([2; 64]),
        },
        DeviceFrameDescriptor {
            memory: DeviceMemory::Vmm { chunks: vec![1 << 63, (1 << 63) + 1] },
            offset: 4096,
            len: 1 << 21,
            device_uuid: [1; 16],
            event: None,
        },
        DeviceFrameDescriptor {
            memory: DeviceMemory::PoolPointer { pool: 1 << 62, export: [9; 64], alloc_len: 1 << 20 },
            offset: 0,
            len: 1 << 20,
            device_uuid: [1; 16],
            event: None,
        },
    ]
}

/// A data message with a frame of every kind (and both forms of those with options).
pub fn data_with_every_frame_kind() -> DataMessage {
    let mut frames = vec![
        FrameDescriptor::Inline(vec![1, 2, 3]),
        FrameDescriptor::DevicePush { len: 4096 },
        FrameDescriptor::DeviceOffered { offer: 2, index: 0, len: 4096, ready: None, gate: None },
        FrameDescriptor::DeviceOffered { offer: 2, index: 1, len: 64, ready: Some([4; 64]), gate: None },
        FrameDescriptor::DeviceOffered {
            offer: 2,
            index: 2,
            len: 8,
            ready: None,
            gate: Some(NotifyGate { index: 5, value: 2 }),
        },
        FrameDescriptor::Remote { len: 1 << 30, device: true, chunk: 8 << 20 },
        FrameDescriptor::Remote { len: 100, device: false, chunk: 0 },
        FrameDescriptor::HostRegion { region_id: 3, offset: 64, len: 100 },
    ];
    frames.extend(every_device_memory().into_iter().map(FrameDescriptor::Device));
    DataMessage { seq: 9, header: b"hdr".to_vec(), frames }
}
