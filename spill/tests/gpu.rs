//! Device tier tests: ignored unless built with `--features gpu-tests`, failing without a
//! CUDA device.

mod common;

use std::sync::Arc;

use common::{contents, pattern};
use cudarc::driver::result;
use ferrylink_memory::serialize::SerializeError;
use ferrylink_memory::{DeviceBuffer, DeviceMemoryOwner, Frame, MakeRoom, Message, PinnedPool, PinnedPoolConfig};
use ferrylink_spill::{SpillConfig, SpillStore, Tier};
use ferrylink_testkit::require_gpu;

fn bind() {
    let dev = result::device::get(0).unwrap();
    // SAFETY: `dev` comes from cuDeviceGet; the primary context is retained for the
    // process (never released in tests).
    unsafe {
        let ctx = result::primary_ctx::retain(dev).unwrap();
        result::ctx::set_current(ctx).unwrap();
    }
}

struct Malloc(u64);
impl DeviceMemoryOwner for Malloc {
    fn describe(&self) -> String {
        "test cuMemAlloc".into()
    }
}
impl Drop for Malloc {
    fn drop(&mut self) {
        bind();
        // SAFETY: allocated in `alloc`, freed once here.
        let _ = unsafe { result::free_sync(self.0) };
    }
}

fn alloc(ordinal: usize, len: usize) -> Result<DeviceBuffer, SerializeError> {
    bind();
    // SAFETY: plain allocation in the current context.
    let ptr = unsafe { result::malloc_sync(len.max(1)) }.map_err(|e| SerializeError::DeviceAlloc {
        device_ordinal: ordinal,
        len,
        reason: e.to_string(),
    })?;
    // SAFETY: `len` fresh bytes on device 0, owned by the guard.
    Ok(unsafe { DeviceBuffer::from_raw_parts(ptr, len, ordinal, Arc::new(Malloc(ptr))) })
}

fn device_msg(header: &[u8], sizes: &[usize], seed: u8) -> Message {
    let frames = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let d = alloc(0, n).unwrap();
            let bytes = pattern(n, seed.wrapping_add(i as u8).into());
            // SAFETY: `d` holds `n` bytes; synchronous copy.
            unsafe { result::memcpy_htod_sync(d.device_ptr(), &bytes) }.unwrap();
            Frame::Device(d)
        })
        .collect();
    Message::new(header.to_vec(), frames)
}

/// Contents of a message with host or device frames.
fn read_back(m: &Message) -> (Vec<u8>, Vec<Vec<u8>>) {
    let frames = m
        .frames
        .iter()
        .map(|f| match f {
            Frame::Host(h) => h.to_vec(),
            Frame::Device(d) => {
                bind();
                let mut v = vec![0u8; d.len()];
                // SAFETY: `d` holds `v.len()` bytes.
                unsafe { result::memcpy_dtoh_sync(&mut v, d.device_ptr()) }.unwrap();
                v
            }
        })
        .collect();
    (m.header.clone(), frames)
}

fn store(device_budget: usize, host_budget: usize, dir: &std::path::Path) -> SpillStore<u32> {
    let pool =
        PinnedPool::new(PinnedPoolConfig::default().with_chunk_size(1 << 20).with_region_size(16 << 20)).unwrap();
    let cfg =
        SpillConfig::new(device_budget, host_budget, dir).with_pinned_pool(pool).with_device_allocator(Arc::new(alloc));
    SpillStore::new(cfg).unwrap()
}

const MB: usize = 1 << 20;

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn device_entries_evict_to_host_and_disk_and_come_back() {
    require_gpu();
    let tmp = tempfile::tempdir().unwrap();
    let s = store(4 * MB, 5 * MB / 2, tmp.path());
    let want = |k: u32| read_back(&device_msg(b"h", &[MB + k as usize, 1000], k as u8));
    for k in 0..6u32 {
        s.insert(k, device_msg(b"h", &[MB + k as usize, 1000], k as u8)).unwrap();
        let st = s.stats();
        assert!(st.device.bytes <= 4 * MB && st.host.bytes <= 5 * MB / 2, "{st:?}");
    }
    assert_eq!(s.tier(&0), Some(Tier::Disk));
    assert_eq!(s.tier(&5), Some(Tier::Device));
    let st = s.stats();
    assert!(st.device_to_host >= 3 && st.host_to_disk >= 1, "{st:?}");

    // with() brings a disk entry back to the device.
    assert_eq!(s.with(&0, read_back).unwrap().unwrap(), want(0));
    assert_eq!(s.tier(&0), Some(Tier::Device));
    assert!(s.stats().device.bytes <= 4 * MB);
    // take() returns device frames.
    for k in 0..6u32 {
        let m = s.take(&k).unwrap().unwrap();
        assert!(m.frames[0].as_device().is_some(), "entry {k} back on the device");
        assert_eq!(read_back(&m), want(k));
    }
    assert!(s.is_empty());
    // take_host leaves evicted frames on the host.
    s.insert(1, device_msg(b"x", &[2 * MB], 1)).unwrap();
    s.insert(2, device_msg(b"y", &[3 * MB], 2)).unwrap();
    assert_eq!(s.tier(&1), Some(Tier::Host));
    let m = s.take_host(&1).unwrap().unwrap();
    assert!(m.frames[0].as_host().is_some());
    assert_eq!(contents(&m).1[0], pattern(2 * MB, 1));
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn make_room_evicts_device_lru() {
    require_gpu();
    let tmp = tempfile::tempdir().unwrap();
    let s = store(4 * MB, 16 * MB, tmp.path());
    s.insert(1, device_msg(b"", &[2 * MB], 1)).unwrap();
    s.insert(2, device_msg(b"", &[2 * MB], 2)).unwrap();
    s.with(&1, |_| ()).unwrap();
    s.make_room(0, MB).unwrap();
    assert_eq!(s.tier(&2), Some(Tier::Host), "least recently used went to host");
    assert_eq!(s.tier(&1), Some(Tier::Device));
    assert_eq!(s.device_bytes(0), 2 * MB);
    assert!(s.make_room(0, 5 * MB).is_err());
    s.make_room(0, 4 * MB).unwrap();
    assert_eq!(s.device_bytes(0), 0);
    assert_eq!(read_back(&s.take(&2).unwrap().unwrap()).1[0], pattern(2 * MB, 2));
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn oversized_device_entries_skip_tiers() {
    require_gpu();
    let tmp = tempfile::tempdir().unwrap();
    let s = store(MB, 2 * MB, tmp.path());
    s.insert(1, device_msg(b"", &[MB + 1], 1)).unwrap();
    assert_eq!(s.tier(&1), Some(Tier::Host), "larger than the device budget");
    s.insert(2, device_msg(b"", &[3 * MB], 2)).unwrap();
    assert_eq!(s.tier(&2), Some(Tier::Disk), "larger than both budgets");
    // Too big for the device budget: comes back as host frames.
    let m = s.take(&2).unwrap().unwrap();
    assert_eq!(read_back(&m).1[0], pattern(3 * MB, 2));
    // A device entry that fits the device but not the host is evicted straight to disk.
    let s = store(4 * MB, MB, tmp.path());
    s.insert(3, device_msg(b"", &[3 * MB], 3)).unwrap();
    s.make_room(0, 4 * MB).unwrap();
    assert_eq!(s.tier(&3), Some(Tier::Disk));
    assert_eq!(s.stats().device_to_disk, 1);
    let m = s.take(&3).unwrap().unwrap();
    assert!(m.frames[0].as_device().is_some());
    assert_eq!(read_back(&m).1[0], pattern(3 * MB, 3));
}

#[test]
#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
fn a_device_entry_read_is_copied_to_the_host_and_stays_on_the_device() {
    require_gpu();
    let tmp = tempfile::tempdir().unwrap();
    let s = store(8 * MB, 8 * MB, tmp.path());
    s.insert(1, device_msg(b"one", &[MB + 3, 4096], 11)).unwrap();
    s.insert(2, device_msg(b"two", &[MB], 12)).unwrap();
    let pool = PinnedPool::new(PinnedPoolConfig::default().with_chunk_size(1 << 20).with_region_size(4 << 20)).unwrap();
    let hm = s.read(&1, Some(&pool)).unwrap().unwrap();
    assert_eq!(hm.header, b"one");
    let frames: Vec<Vec<u8>> = hm.frames.iter().map(|f| f.to_vec()).collect();
    assert_eq!(frames, [pattern(MB + 3, 11), pattern(4096, 12)]);
    assert!(hm.frames.iter().all(|f| f.region().is_some()), "the copies lie in the pool");
    assert!(
        hm.origins.iter().all(|o| matches!(o, ferrylink_memory::serialize::FrameOrigin::Device { ordinal: 0 })),
        "{:?}",
        hm.origins
    );
    assert_eq!((s.tier(&1), s.tier(&2)), (Some(Tier::Device), Some(Tier::Device)), "nothing moved");
    // The read made 1 the most recently used: the device tier's LRU entry is now 2.
    assert_eq!(s.evict_lru(Tier::Device).unwrap(), Some((2, MB)));
    assert_eq!((s.tier(&1), s.tier(&2)), (Some(Tier::Device), Some(Tier::Host)));
    // The entry itself is unchanged by the read.
    let m = s.take(&1).unwrap().unwrap();
    assert_eq!(read_back(&m), (b"one".to_vec(), vec![pattern(MB + 3, 11), pattern(4096, 12)]));
}
