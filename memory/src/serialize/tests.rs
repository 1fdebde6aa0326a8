//! Unit tests of serialization: host-only conversions and user types everywhere, device
//! round trips with `--features gpu-tests` (ignored without it, failing without a device).

use super::*;
use crate::pinned::bind_primary_context;
use crate::{DeviceBuffer, DeviceMemoryOwner, Frame, HostBuffer, Message, PinnedPool, PinnedPoolConfig, Registration};
use ferrylink_testkit::{pattern, require_gpu};
use std::sync::Arc;

#[test]
fn host_only_messages_convert_without_cuda() {
    let msg = Message::new(b"h".to_vec(), vec![pattern(10, 1).into(), pattern(0, 0).into()]);
    let hm = device_to_host_with(msg, None).unwrap();
    assert_eq!(hm.origins, vec![FrameOrigin::Host; 2]);
    assert_eq!(hm.payload_len(), 10);
    let back = host_to_device(hm, |_, _| panic!("no device frame")).unwrap();
    assert_eq!(back.header, b"h");
    assert_eq!(back.frames[0].as_host().unwrap().to_vec(), pattern(10, 1));
}

#[test]
fn mismatched_origins_are_a_layout_error() {
    let hm = HostMessage { header: vec![], frames: vec![HostBuffer::zeroed(1)], origins: vec![] };
    let f = host_to_device(hm, |_, _| panic!()).unwrap_err();
    assert!(matches!(f.error, SerializeError::Layout(_)));
    assert_eq!(f.value.frames.len(), 1);
}

struct Fake;
impl DeviceMemoryOwner for Fake {
    fn describe(&self) -> String {
        "fake".into()
    }
}

#[test]
#[cfg_attr(
    feature = "gpu-tests",
    ignore = "covers a machine without CUDA: the GPU build runs the device tests instead"
)]
fn device_frames_without_cuda_are_unsupported_and_returned() {
    if crate::cuda::probe().is_ok() {
        eprintln!("skipped: CUDA present (this test covers its absence)");
        return;
    }
    // SAFETY: never dereferenced: without CUDA the conversion refuses before copying.
    let d = unsafe { DeviceBuffer::from_raw_parts(0x1000, 64, 0, Arc::new(Fake)) };
    let msg = Message::new(vec![], vec![Frame::Host(HostBuffer::zeroed(3)), Frame::Device(d)]);
    let f = device_to_host_with(msg, None).unwrap_err();
    assert!(matches!(f.error, SerializeError::Unsupported(_)), "{}", f.error);
    assert_eq!(f.value.frames.len(), 2);
    assert_eq!(f.value.device_bytes(), 64);

    let hm = HostMessage {
        header: vec![],
        frames: vec![HostBuffer::zeroed(4)],
        origins: vec![FrameOrigin::Device { ordinal: 0 }],
    };
    let f = host_to_device(hm, |_, _| panic!("must not allocate")).unwrap_err();
    assert!(matches!(f.error, SerializeError::Unsupported(_)));
    assert_eq!(f.value.frames.len(), 1);
}

#[test]
fn user_types_round_trip_and_mismatches_return_the_message() {
    let v = pattern(100, 3);
    assert_eq!(Vec::<u8>::from_frames(v.clone().into_frames()).unwrap(), v);
    assert_eq!(Vec::<u8>::from_frames(v.as_slice().into_frames()).unwrap(), v);
    let h = HostBuffer::from_region_free(&v);
    assert_eq!(HostBuffer::from_frames(h.into_frames()).unwrap().to_vec(), v);
    let frames = vec![Frame::from(v.clone()), Frame::from(vec![1u8])];
    let back = Vec::<Frame>::from_frames(frames.into_frames()).unwrap();
    assert_eq!(back.len(), 2);

    let f = Vec::<u8>::from_frames(Message::new(b"other".to_vec(), vec![v.clone().into()])).unwrap_err();
    assert!(matches!(f.error, SerializeError::WrongType { .. }));
    assert_eq!(f.value.header, b"other");
    assert_eq!(f.value.frames[0].as_host().unwrap().to_vec(), v);
    let f = DeviceBuffer::from_frames(v.clone().into_frames()).unwrap_err();
    assert!(f.to_string().contains("device buffer"), "{f}");
    assert_eq!(f.value.frames.len(), 1);
}

trait FromRegionFree {
    fn from_region_free(v: &[u8]) -> HostBuffer;
}
impl FromRegionFree for HostBuffer {
    fn from_region_free(v: &[u8]) -> HostBuffer {
        HostBuffer::from_vec(v.to_vec())
    }
}

// ---- GPU tests: skipped (and passing) without a CUDA device ----

struct Malloc(u64);
impl DeviceMemoryOwner for Malloc {
    fn describe(&self) -> String {
        "test cuMemAlloc".into()
    }
}
impl Drop for Malloc {
    fn drop(&mut self) {
        if bind_primary_context(0).is_ok() {
            // SAFETY: allocated by `device_alloc`, freed once here.
            let _ = unsafe { cudarc::driver::result::free_sync(self.0) };
        }
    }
}

fn device_alloc(ordinal: usize, len: usize) -> Result<DeviceBuffer, SerializeError> {
    bind_primary_context(ordinal).map_err(SerializeError::Cuda)?;
    // SAFETY: plain allocation in the current (primary) context.
    let ptr = unsafe { cudarc::driver::result::malloc_sync(len.max(1)) }.map_err(|e| SerializeError::DeviceAlloc {
        device_ordinal: ordinal,
        len,
        reason: e.to_string(),
    })?;
    // SAFETY: `ptr` is `len` fresh bytes on `ordinal`, kept alive by its owner.
    Ok(unsafe { DeviceBuffer::from_raw_parts(ptr, len, ordinal, Arc::new(Malloc(ptr))) })
}

fn device_with(bytes: &[u8]) -> DeviceBuffer {
    let d = device_alloc(0, bytes.len()).unwrap();
    // SAFETY: `d` holds `bytes.len()` bytes; synchronous copy.
    unsafe { cudarc::driver::result::memcpy_htod_sync(d.device_ptr(), bytes) }.unwrap();
    // A "synchronous" copy from pageable memory returns before its DMA finished:
    // the serializer's copies on its own stream could read
    // the bytes before they are there (seen on the H200 with four test binaries at once).
    cudarc::driver::result::ctx::synchronize().unwrap();
    d
}

fn round_trip(pool: Option<&PinnedPool>, sizes: &[usize]) {
    let data: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| pattern(n, i as u64)).collect();
    let mut frames: Vec<Frame> = data.iter().map(|d| Frame::Device(device_with(d))).collect();
    frames.push(Frame::from(b"host".to_vec()));
    let hm = device_to_host_with(Message::new(b"m".to_vec(), frames), pool).unwrap();
    for (h, d) in hm.frames.iter().zip(&data) {
        assert_eq!(h.as_slice(), d.as_slice());
    }
    assert_eq!(*hm.origins.last().unwrap(), FrameOrigin::Host);
    let msg = host_to_device(hm, device_alloc).unwrap();
    assert_eq!(msg.frames.len(), data.len() + 1);
    let back = device_to_host_with(msg, None).unwrap();
    for (h, d) in back.frames.iter().zip(&data) {
        assert_eq!(h.as_slice(), d.as_slice());
    }
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn gpu_round_trip_through_the_pool() {
    require_gpu();
    let pool =
        PinnedPool::new(PinnedPoolConfig::default().with_chunk_size(1 << 20).with_region_size(32 << 20)).unwrap();
    assert!(pool.is_pinned());
    round_trip(Some(&pool), &[1, 1 << 20, (5 << 20) + 7, 0]);
    assert_eq!(pool.stats().bytes_in_use, 0);
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn gpu_round_trip_staged_and_unpooled() {
    require_gpu();
    // Frames larger than the pool: pageable destination through pinned staging.
    let pool = PinnedPool::new(PinnedPoolConfig::default().with_chunk_size(1 << 20).with_region_size(4 << 20)).unwrap();
    round_trip(Some(&pool), &[(9 << 20) + 3]);
    let unpinned = PinnedPool::new(
        PinnedPoolConfig::default()
            .with_chunk_size(1 << 20)
            .with_region_size(2 << 20)
            .with_registration(Registration::Never),
    )
    .unwrap();
    round_trip(Some(&unpinned), &[3 << 20, 100]);
    round_trip(None, &[(6 << 20) + 1, 10]);
}
