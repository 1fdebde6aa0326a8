//! Every bound the decoder enforces, each on its own: accepted at the bound, refused one
//! past it with its own message (so removing or loosening any one check fails a test).

use super::super::codec::*;
use super::super::samples::every_device_memory;
use super::super::*;
use super::{frame_of_body, limits};

/// Decodes the frame of `m`; panics unless it is accepted whole and unchanged.
fn accepted(m: &WireMessage, limits: &Limits) {
    let bytes = encode_frame(m);
    match decode_frame(&bytes, limits) {
        Ok(Some((back, used))) => {
            assert_eq!(&back, m);
            assert_eq!(used, bytes.len());
        }
        other => panic!("refused: {other:?}"),
    }
}

/// The reason the frame of `m` breaks a limit; panics when it is accepted or fails otherwise.
fn refused(m: &WireMessage, limits: &Limits) -> String {
    match decode_frame(&encode_frame(m), limits) {
        Err(WireError::LimitExceeded(reason)) => reason,
        other => panic!("not refused for a limit: {other:?}"),
    }
}

fn data(header: Vec<u8>, frames: Vec<FrameDescriptor>) -> WireMessage {
    WireMessage::Data(DataMessage { seq: 1, header, frames })
}

fn device(memory: DeviceMemory, offset: u64, len: u64) -> DeviceFrameDescriptor {
    DeviceFrameDescriptor { memory, offset, len, device_uuid: [1; 16], event: None }
}

fn legacy(alloc_len: u64) -> DeviceMemory {
    DeviceMemory::LegacyIpc { handle: [5; 64], buffer_id: 1, alloc_len }
}

fn pool(alloc_len: u64) -> DeviceMemory {
    DeviceMemory::PoolPointer { pool: 3, export: [6; 64], alloc_len }
}

fn vmm(chunks: usize) -> DeviceMemory {
    DeviceMemory::Vmm { chunks: (0..chunks as u64).map(|c| (1 << 63) + c).collect() }
}

#[test]
fn regions_announced_at_once_are_bounded_by_the_descriptors_one_call_passes() {
    let regions = |n: u64| WireMessage::Regions((0..n).map(|id| RegionAnnouncement::host(id, 4096)).collect());
    accepted(&regions(MAX_NEW_REGIONS as u64), &limits());
    assert_eq!(
        refused(&regions(MAX_NEW_REGIONS as u64 + 1), &limits()),
        format!("{} regions announced at once (at most {MAX_NEW_REGIONS})", MAX_NEW_REGIONS + 1)
    );
}

/// Both messages that carry push targets, around `targets`.
fn push_messages(targets: Vec<DeviceFrameDescriptor>) -> [WireMessage; 2] {
    [
        WireMessage::PushTargets { seq: 1, targets: targets.clone() },
        WireMessage::PushOffer { offer: 1, targets, for_seq: None },
    ]
}

#[test]
fn push_targets_must_lie_in_their_allocations() {
    for m in push_messages(every_device_memory()) {
        accepted(&m, &limits());
    }
    for memory in [legacy(4096), pool(4096)] {
        let at_the_end = vec![device(memory.clone(), 0, 4096), device(memory.clone(), 4000, 96)];
        for m in push_messages(at_the_end) {
            accepted(&m, &limits());
        }
        let past_the_end = vec![device(memory.clone(), 0, 4096), device(memory.clone(), 4000, 97)];
        for m in push_messages(past_the_end) {
            assert_eq!(refused(&m, &limits()), "push target 1: 4000+97 lies outside its allocation of 4096 bytes");
        }
        for m in push_messages(vec![device(memory, u64::MAX, 1)]) {
            assert_eq!(refused(&m, &limits()), "push target 0: offset + length overflows");
        }
    }
}

#[test]
fn push_targets_name_one_to_the_most_vmm_chunks() {
    for chunks in [1, MAX_VMM_CHUNKS_PER_FRAME] {
        for m in push_messages(vec![device(vmm(chunks), 0, 1)]) {
            accepted(&m, &limits());
        }
    }
    for chunks in [0, MAX_VMM_CHUNKS_PER_FRAME + 1] {
        for m in push_messages(vec![device(vmm(chunks), 0, 1)]) {
            let expected = format!("push target 0: {chunks} VMM chunks (1 to {MAX_VMM_CHUNKS_PER_FRAME})");
            assert_eq!(refused(&m, &limits()), expected);
        }
    }
}

#[test]
fn push_targets_are_at_most_the_frames_of_a_message() {
    let tight = Limits { max_frames: 3, ..limits() };
    let targets = |n: usize| (0..n).map(|_| device(legacy(64), 0, 64)).collect::<Vec<_>>();
    for m in push_messages(targets(3)) {
        accepted(&m, &tight);
    }
    for m in push_messages(targets(4)) {
        assert_eq!(refused(&m, &tight), "4 push targets");
    }
}

#[test]
fn the_header_is_bounded() {
    let tight = Limits { max_header_bytes: 10, ..limits() };
    accepted(&data(vec![7; 10], vec![]), &tight);
    assert_eq!(refused(&data(vec![7; 11], vec![]), &tight), "header of 11 bytes (at most 10)");
}

#[test]
fn the_frame_count_is_bounded() {
    let tight = Limits { max_frames: 3, ..limits() };
    let frames = |n| vec![FrameDescriptor::DevicePush { len: 1 }; n];
    accepted(&data(vec![], frames(3)), &tight);
    assert_eq!(refused(&data(vec![], frames(4)), &tight), "4 frames (at most 3)");
}

#[test]
fn every_kind_of_frame_is_bounded_in_length() {
    let tight = Limits { max_frame_len: 100, ..limits() };
    let of_len = |len: u64| {
        vec![
            FrameDescriptor::HostRegion { region_id: 1, offset: 0, len },
            FrameDescriptor::Device(device(legacy(1 << 20), 0, len)),
            FrameDescriptor::DevicePush { len },
            FrameDescriptor::DeviceOffered { offer: 1, index: 0, len, ready: None, gate: None },
            FrameDescriptor::Remote { len, device: false, chunk: 0 },
        ]
    };
    accepted(&data(vec![], of_len(100)), &tight);
    for (i, frame) in of_len(101).into_iter().enumerate() {
        let mut frames = of_len(100);
        frames[i] = frame;
        assert_eq!(refused(&data(vec![], frames), &tight), format!("frame {i} of 101 bytes (at most 100)"));
    }
    let inline = Limits { max_frame_len: 100, inline_threshold: 1000, ..limits() };
    accepted(&data(vec![], vec![FrameDescriptor::Inline(vec![1; 100])]), &inline);
    let too_long = data(vec![], vec![FrameDescriptor::Inline(vec![1; 101])]);
    assert_eq!(refused(&too_long, &inline), "frame 0 of 101 bytes (at most 100)");
}

#[test]
fn inline_frames_are_bounded_one_by_one_and_together() {
    let threshold = limits().inline_threshold;
    let inline = |n: usize| FrameDescriptor::Inline(vec![3; n]);
    accepted(&data(vec![], vec![inline(threshold)]), &limits());
    let one_too_long = data(vec![], vec![inline(1), inline(threshold + 1)]);
    assert_eq!(
        refused(&one_too_long, &limits()),
        format!("inline frame 1 of {} bytes (at most {threshold})", threshold + 1)
    );
    // Frames each under the threshold that add up to the budget, then one byte more.
    let mut frames: Vec<_> = (0..INLINE_BUDGET / threshold).map(|_| inline(threshold)).collect();
    assert_eq!(frames.len() * threshold, INLINE_BUDGET);
    accepted(&data(vec![], frames.clone()), &limits());
    frames.push(inline(1));
    let expected = format!("{} inline bytes in one message (at most {INLINE_BUDGET})", INLINE_BUDGET + 1);
    assert_eq!(refused(&data(vec![], frames), &limits()), expected);
}

#[test]
fn host_region_frames_may_not_wrap_around() {
    let host = |offset, len| data(vec![], vec![FrameDescriptor::HostRegion { region_id: 1, offset, len }]);
    accepted(&host(u64::MAX - 10, 10), &limits());
    assert_eq!(refused(&host(u64::MAX - 10, 11), &limits()), "frame 0: offset + length overflows");
}

#[test]
fn staged_remote_frames_fit_the_chunk_bits_of_their_tags() {
    let remote = |len, chunk| data(vec![], vec![FrameDescriptor::Remote { len, device: true, chunk }]);
    accepted(&remote(MAX_REMOTE_CHUNKS * 1000, 1000), &limits());
    accepted(&remote(1 << 40, 0), &limits()); // one tagged message: no chunks
    let expected = format!(
        "frame 0: {} bytes in chunks of 1000 is more than {MAX_REMOTE_CHUNKS} chunks",
        MAX_REMOTE_CHUNKS * 1000 + 1
    );
    assert_eq!(refused(&remote(MAX_REMOTE_CHUNKS * 1000 + 1, 1000), &limits()), expected);
}

#[test]
fn device_frames_lie_in_their_allocations_and_name_one_to_the_most_vmm_chunks() {
    let one = |d| data(vec![], vec![FrameDescriptor::DevicePush { len: 0 }, FrameDescriptor::Device(d)]);
    for memory in [legacy(4096), pool(4096)] {
        accepted(&one(device(memory.clone(), 4000, 96)), &limits());
        let past = refused(&one(device(memory.clone(), 4000, 97)), &limits());
        assert_eq!(past, "device frame 1: 4000+97 lies outside its allocation of 4096 bytes");
        let wraps = refused(&one(device(memory, u64::MAX, 1)), &limits());
        assert_eq!(wraps, "device frame 1: offset + length overflows");
    }
    for chunks in [1, MAX_VMM_CHUNKS_PER_FRAME] {
        accepted(&one(device(vmm(chunks), 1 << 40, 1 << 30)), &limits());
    }
    for chunks in [0, MAX_VMM_CHUNKS_PER_FRAME + 1] {
        let expected = format!("device frame 1: {chunks} VMM chunks (1 to {MAX_VMM_CHUNKS_PER_FRAME})");
        assert_eq!(refused(&one(device(vmm(chunks), 0, 1)), &limits()), expected);
    }
    let wraps = refused(&one(device(vmm(1), u64::MAX, 1)), &limits());
    assert_eq!(wraps, "device frame 1: offset + length overflows");
}

#[test]
fn the_largest_well_formed_messages_fit_the_body_limit() {
    let l = limits();
    // The longest descriptor: a VMM frame over the most chunks, ids and numbers at their
    // longest encodings, with an event.
    let longest = DeviceFrameDescriptor {
        memory: DeviceMemory::Vmm { chunks: vec![u64::MAX; MAX_VMM_CHUNKS_PER_FRAME] },
        offset: u64::MAX / 2,
        len: l.max_frame_len,
        device_uuid: [0xff; 16],
        event: Some([0xff; 64]),
    };
    let frames = vec![FrameDescriptor::Device(longest.clone()); l.max_frames];
    let message = WireMessage::Data(DataMessage { seq: u64::MAX, header: vec![1; l.max_header_bytes], frames });
    let len = encode_frame(&message).len() - FRAME_PREFIX_LEN;
    assert!(len <= l.max_body_bytes(), "a body of {len} bytes, the limit is {}", l.max_body_bytes());
    accepted(&message, &l);
    accepted(
        &WireMessage::PushOffer { offer: u64::MAX, targets: vec![longest; l.max_frames], for_seq: Some(u64::MAX) },
        &l,
    );
}

#[test]
fn a_small_body_cannot_claim_a_large_allocation() {
    // A Data message whose header claims 1 MiB (a legal header length) in a 7-byte body:
    // the allocation limit scaled to the body refuses it before allocating.
    let mut body = vec![4u8, 0]; // variant index of Data, seq 0
    body.push(252); // bincode 2's varint marker for a u32 that follows
    body.extend_from_slice(&(1u32 << 20).to_le_bytes());
    let err = decode_frame(&frame_of_body(&body), &limits()).unwrap_err();
    assert_eq!(err, WireError::Malformed("LimitExceeded".into()));
    // 2^60 bytes: beyond any limit.
    let mut body = vec![4u8, 0, 253];
    body.extend_from_slice(&(1u64 << 60).to_le_bytes());
    let err = decode_frame(&frame_of_body(&body), &limits()).unwrap_err();
    assert_eq!(err, WireError::Malformed("LimitExceeded".into()));
}

#[test]
fn the_allocation_limit_leaves_room_for_the_densest_encodings() {
    // bincode claims `len * size_of::<T>()` bytes for a sequence of `len` elements: a body
    // of the smallest encoded elements must stay within EXPANSION times its length.
    fn fits<T: bincode::Encode>(smallest: T) {
        let encoded = bincode::encode_to_vec(&smallest, bincode::config::standard()).unwrap().len();
        let name = std::any::type_name::<T>();
        assert!(
            std::mem::size_of::<T>() <= EXPANSION * encoded,
            "{name}: {} in memory, {encoded} encoded",
            std::mem::size_of::<T>()
        );
    }
    fits(FrameDescriptor::DevicePush { len: 0 });
    fits(FrameDescriptor::Inline(vec![]));
    fits(device(DeviceMemory::Vmm { chunks: vec![] }, 0, 0));
    fits(RegionAnnouncement::host(0, 0));
    fits(GpuInfo { ordinal: 0, uuid: [0; 16] });
    fits((0u32, 0u32));
    fits(0u64);
    let many_frames = data(vec![], vec![FrameDescriptor::DevicePush { len: 0 }; limits().max_frames]);
    accepted(&many_frames, &limits());
}
