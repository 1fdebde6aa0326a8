//! Host copies of entries evicted to disk: a large one is freed off the caller's thread
//! (an evicting insert returns without waiting for its pages), one at a time (the next
//! eviction waits for it), and `evict_lru`, asked by a caller under memory pressure,
//! returns only once it is freed. Small and pinned copies are freed in line.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{contents, msg, pattern};
use ferrylink_memory::{HostBuffer, HostRegion, Message};
use ferrylink_spill::{SpillConfig, SpillStore, Tier, RELEASE_ASIDE_MIN};
use ferrylink_testkit::{eventually, returns_within, Gate};

const LARGE: usize = RELEASE_ASIDE_MIN;
const BOUND: Duration = Duration::from_secs(20);

/// Bytes whose buffer's release waits at a gate, then is counted.
struct GatedRegion {
    ptr: *mut u8,
    bytes: Box<[u8]>,
    pinned: bool,
    gate: Arc<Gate>,
    released: Arc<AtomicUsize>,
}

// SAFETY: `ptr` points into `bytes`, which the region owns and never reallocates; the
// store only reads through buffers carved from it.
unsafe impl Send for GatedRegion {}
// SAFETY: as above; the region itself is never written through after construction.
unsafe impl Sync for GatedRegion {}

impl HostRegion for GatedRegion {
    fn base_ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.bytes.len()
    }
    fn region_id(&self) -> u64 {
        self.ptr as u64
    }
    fn is_pinned(&self) -> bool {
        self.pinned
    }
    fn release(&self, _offset: usize, _len: usize) {
        self.gate.pass();
        self.released.fetch_add(1, Ordering::SeqCst);
    }
}

/// Messages whose one frame is released through `gate`, counted in `released`. Dropped
/// (before the store, declared after it), it opens the gate: a failed test does not leave
/// the store's drop waiting for a held release.
#[derive(Default)]
struct Gated {
    gate: Arc<Gate>,
    released: Arc<AtomicUsize>,
}

impl Drop for Gated {
    fn drop(&mut self) {
        self.gate.open();
    }
}

impl Gated {
    fn message(&self, len: usize, seed: u64, pinned: bool) -> Message {
        let mut bytes = pattern(len, seed).into_boxed_slice();
        let ptr = bytes.as_mut_ptr();
        let region = GatedRegion { ptr, bytes, pinned, gate: self.gate.clone(), released: self.released.clone() };
        Message::new(b"gated".to_vec(), vec![HostBuffer::from_region(Arc::new(region), 0, len).into()])
    }
    fn released(&self) -> usize {
        self.released.load(Ordering::SeqCst)
    }
}

/// A store whose host tier holds `entries` large entries.
fn store(dir: &Path, entries: usize) -> Arc<SpillStore<u32>> {
    Arc::new(SpillStore::new(SpillConfig::new(0, entries * LARGE, dir)).unwrap())
}

/// A store holding one large entry, whose gated first entry the second's insert evicted:
/// that copy is being freed, held at the gate. Fails (the gate opened first) if the
/// insert waited for it.
fn evicted_and_held(dir: &Path) -> (Arc<SpillStore<u32>>, Gated) {
    let (s, gated) = (store(dir, 1), Gated::default());
    s.insert(1, gated.message(LARGE, 1, false)).unwrap();
    let store = s.clone();
    if returns_within(BOUND, move || store.insert(2, msg(b"two", &[LARGE], 2)).unwrap()).is_none() {
        gated.gate.open();
        panic!("the evicting insert waited for the evicted copy to be freed");
    }
    (s, gated)
}

/// How long a call that should wait at a gate is given to (wrongly) return: three times
/// an eviction of a large entry, with nothing held back, on this machine and build (an
/// unoptimised build checksums 64 MiB slowly), and 300 ms more.
fn held(dir: &Path) -> Duration {
    let s = store(dir, 1);
    s.insert(1, msg(b"", &[LARGE], 1)).unwrap();
    let start = Instant::now();
    s.insert(2, msg(b"", &[LARGE], 2)).unwrap();
    3 * start.elapsed() + Duration::from_millis(300)
}

/// Starts `f` on a thread and checks that it is still waiting at `gated`'s gate after
/// `held`; then opens the gate and returns what `f` returned (within [`BOUND`]).
fn waits_at_the_gate<T: Send + 'static>(
    gated: &Gated,
    held: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let call: JoinHandle<T> = std::thread::spawn(f);
    std::thread::sleep(held);
    let waited = !call.is_finished();
    gated.gate.open();
    assert!(waited, "{what} returned while a release was held back: it did not wait for it");
    assert!(eventually(BOUND, || call.is_finished()), "{what}: not returned {BOUND:?} after the gate opened");
    call.join().unwrap()
}

#[test]
fn an_evicting_insert_returns_before_the_evicted_copy_is_freed() {
    let tmp = tempfile::tempdir().unwrap();
    let (s, gated) = evicted_and_held(tmp.path());
    assert_eq!((s.tier(&1), s.tier(&2)), (Some(Tier::Disk), Some(Tier::Host)));
    let stats = s.stats();
    assert_eq!((stats.host.bytes, stats.host_releasing), (LARGE, LARGE), "the copy being freed is counted apart");
    assert!(eventually(BOUND, || gated.gate.waiting() == 1), "the copy is not being freed");
    let on_disk = s.take_host(&1).unwrap().unwrap();
    assert_eq!(contents(&on_disk).1, vec![pattern(LARGE, 1)], "the file holds the evicted bytes");
    gated.gate.open();
    assert!(eventually(BOUND, || s.stats().host_releasing == 0), "the copy: not freed within {BOUND:?}");
    assert_eq!(gated.released(), 1);
}

#[test]
fn the_next_eviction_waits_for_the_copy_being_freed() {
    let tmp = tempfile::tempdir().unwrap();
    let (s, gated) = evicted_and_held(tmp.path());
    let store = s.clone();
    waits_at_the_gate(&gated, held(tmp.path()), "the second evicting insert", move || {
        store.insert(3, msg(b"three", &[LARGE], 3)).unwrap()
    });
    assert_eq!(gated.released(), 1);
    assert!(s.stats().host_releasing <= LARGE, "one copy at most is being freed");
    assert_eq!((s.tier(&1), s.tier(&2), s.tier(&3)), (Some(Tier::Disk), Some(Tier::Disk), Some(Tier::Host)));
}

#[test]
fn evict_lru_returns_once_the_evicted_copy_is_freed() {
    let tmp = tempfile::tempdir().unwrap();
    let (s, gated) = (store(tmp.path(), 2), Gated::default());
    s.insert(1, gated.message(LARGE, 1, false)).unwrap();
    let store = s.clone();
    let evicted =
        waits_at_the_gate(&gated, held(tmp.path()), "evict_lru", move || store.evict_lru(Tier::Host).unwrap());
    assert_eq!(evicted, Some((1, LARGE)));
    assert_eq!((gated.released(), s.stats().host_releasing), (1, 0), "freed when evict_lru returned");
    assert_eq!(s.tier(&1), Some(Tier::Disk));
}

#[test]
fn small_and_pinned_copies_are_freed_in_line() {
    for (len, pinned, what) in [(4096, false, "a small copy"), (LARGE, true, "a pinned copy")] {
        let tmp = tempfile::tempdir().unwrap();
        let (s, gated) = (store(tmp.path(), 1), Gated::default());
        s.insert(1, gated.message(len, 1, pinned)).unwrap();
        let store = s.clone();
        waits_at_the_gate(&gated, held(tmp.path()), &format!("an insert evicting {what}"), move || {
            store.insert(2, msg(b"two", &[LARGE], 2)).unwrap()
        });
        assert_eq!((gated.released(), s.stats().host_releasing), (1, 0), "{what}");
        assert_eq!(s.tier(&1), Some(Tier::Disk), "{what}");
    }
}

#[test]
fn dropping_the_store_waits_for_the_copy_being_freed() {
    let tmp = tempfile::tempdir().unwrap();
    let (s, gated) = evicted_and_held(tmp.path());
    let dir = s.dir().to_path_buf();
    let store = Arc::try_unwrap(s).unwrap_or_else(|_| panic!("the store is still shared"));
    waits_at_the_gate(&gated, held(tmp.path()), "the store's drop", move || drop(store));
    assert_eq!(gated.released(), 1, "the copy was freed before the drop returned");
    assert!(!dir.exists(), "the store's directory is removed");
}
