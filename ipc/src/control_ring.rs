//! Control rings: the control messages of one native connection through shared memory.
//!
//! A Unix-socket hop costs a `sendmsg` on one side and an `epoll_wait` plus `recvmsg`
//! calls on the other; a store the other side's spinning progress thread loads costs far
//! less.
//! [`ControlRingMemory`] is one sealed memfd holding two single-producer single-consumer
//! byte rings, one per direction; the socket then carries only what shared memory cannot:
//! file descriptors, wake-ups for a peer that went to sleep, and the end of the peer.
//!
//! # Layout
//! One 4 KiB header page, then the connector→acceptor ring, then the acceptor→connector
//! ring, each `ring_bytes` long (a power of two). Each direction's header holds, on cache
//! lines of their own, the writer's `head` and the reader's `tail` (byte counts since the
//! start, wrapping at 2^64) and the reader's `sleeping` flag.
//!
//! # Trust
//! The peer can write anything into the shared pages. Each side keeps its own index
//! privately and only *reads* the peer's, checking that the distance between them never
//! exceeds the ring (else [`RingError::Corrupt`]); bytes are copied out before they are
//! decoded, so a peer scribbling on them can only produce a malformed message, which the
//! bounded decoder rejects. The memfd must be sealed against shrinking, so a peer cannot
//! truncate it under our mapping.
//!
//! # Gate words
//! The header page's second half holds [`GATE_WORDS`] 32-bit words a side's GPU writes
//! after copies that side ran into the peer's memory (`ferrylink-transport` registers the
//! page with CUDA, gives each side half of the words, and tells the peer which word to
//! wait for): the peer reads them, which is all the trust they need — a peer scribbling
//! on one can only release a notification early, which it could as well have sent early.
//!
//! # Sleeping
//! A reader about to block arms [`RingReader::arm_sleep`] (store, full fence, re-check);
//! a writer calls [`RingWriter::reader_sleeping`] (full fence, load) after publishing
//! and, when it is set, sends a wake-up over the socket. Either the reader sees the bytes
//! before it blocks, or the writer sees the flag: a message is never left unnoticed.

use crate::memfd::{create_sealed, map, sealed_size, unmap, ImportError};
use nix::sys::mman::ProtFlags;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use thiserror::Error;

/// Bytes of the header page.
const HEADER_BYTES: usize = 4096;
/// Offset of each direction's header inside the header page.
const DIRECTION_HEADER: [usize; 2] = [0, 1024];
/// Offsets inside a direction header (each on its own cache line).
const HEAD: usize = 0;
const TAIL: usize = 128;
const SLEEPING: usize = 256;

/// Offset of the gate words inside the header page.
const GATE_OFFSET: usize = 2048;
/// Gate words in the header page (its second half).
pub const GATE_WORDS: usize = (HEADER_BYTES - GATE_OFFSET) / 4;

/// The smallest ring accepted.
pub const MIN_RING_BYTES: usize = 4096;
/// The largest ring accepted.
pub const MAX_RING_BYTES: usize = 64 << 20;

/// What went wrong with a control ring.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RingError {
    /// The ring size is not a power of two within the accepted range.
    #[error("a control ring of {0} bytes is not a power of two between {MIN_RING_BYTES} and {MAX_RING_BYTES}")]
    BadSize(u64),
    /// The received descriptor is no memfd sealed against shrinking, or has the wrong size.
    #[error("the control ring memory is unusable: {0}")]
    BadMemory(String),
    /// The peer's index says more bytes are in the ring than it holds.
    #[error("the peer corrupted the control ring: {0}")]
    Corrupt(String),
    /// Creating or mapping the memory failed.
    #[error("control ring memory: {0}")]
    Io(#[from] std::io::Error),
}

/// Which ring of the pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Written by the side that connected, read by the side that accepted.
    ConnectorToAcceptor,
    /// Written by the side that accepted, read by the side that connected.
    AcceptorToConnector,
}

impl Direction {
    fn index(self) -> usize {
        match self {
            Direction::ConnectorToAcceptor => 0,
            Direction::AcceptorToConnector => 1,
        }
    }
}

/// The shared memory of a ring pair, mapped read-write.
pub struct ControlRingMemory {
    fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
    ring_bytes: usize,
}

// SAFETY: the mapping is owned by this struct and lives as long as it; all access to the
// shared indices is atomic, and each byte range of a ring is written by one side only
// (the writer owns head..tail+ring_bytes, the reader tail..head), see `RingWriter`/`RingReader`.
unsafe impl Send for ControlRingMemory {}
// SAFETY: as above.
unsafe impl Sync for ControlRingMemory {}

/// Whether rings of `ring_bytes` are accepted: a power of two from [`MIN_RING_BYTES`] to
/// [`MAX_RING_BYTES`].
pub fn is_valid_ring_size(ring_bytes: u64) -> bool {
    ring_bytes.is_power_of_two() && (MIN_RING_BYTES as u64..=MAX_RING_BYTES as u64).contains(&ring_bytes)
}

fn check_size(ring_bytes: u64) -> Result<usize, RingError> {
    if is_valid_ring_size(ring_bytes) {
        Ok(ring_bytes as usize)
    } else {
        Err(RingError::BadSize(ring_bytes))
    }
}

impl ControlRingMemory {
    /// Creates a ring pair of `ring_bytes` per direction in a fresh sealed memfd.
    pub fn create(ring_bytes: usize) -> Result<Arc<Self>, RingError> {
        let ring_bytes = check_size(ring_bytes as u64)?;
        let len = HEADER_BYTES + 2 * ring_bytes;
        let fd = create_sealed("ferrylink-control-ring", len)?;
        // PROT_READ and PROT_WRITE share no bit: `^` would give the same value (an
        // equivalent mutant, here and in `import`).
        let ptr = map(&fd, len, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE)?;
        Ok(Arc::new(Self { fd, ptr, len, ring_bytes }))
    }

    /// Maps a peer's ring pair: `fd` must be a memfd sealed against shrinking, exactly as
    /// large as a pair of `ring_bytes` rings.
    pub fn import(fd: OwnedFd, ring_bytes: u64) -> Result<Arc<Self>, RingError> {
        let ring_bytes = check_size(ring_bytes)?;
        let size = match sealed_size(&fd) {
            Ok(size) => size,
            Err(ImportError::Io(e)) => return Err(RingError::Io(e)),
            Err(e) => return Err(RingError::BadMemory(e.to_string())),
        };
        let len = HEADER_BYTES + 2 * ring_bytes;
        if size != len as u64 {
            return Err(RingError::BadMemory(format!("the memfd holds {size} bytes, a ring pair needs {len}")));
        }
        let ptr = map(&fd, len, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE)?;
        Ok(Arc::new(Self { fd, ptr, len, ring_bytes }))
    }

    /// Bytes of each ring.
    pub fn ring_bytes(&self) -> usize {
        self.ring_bytes
    }

    /// The memfd, to pass to the peer.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Gate word `index` (below [`GATE_WORDS`]; `None` beyond), shared with the peer.
    pub fn gate_word(&self, index: usize) -> Option<&AtomicU32> {
        (index < GATE_WORDS).then(|| {
            // SAFETY: GATE_OFFSET + 4·index < HEADER_BYTES lies in the header page of the
            // live mapping, 4-byte aligned (the mapping is page aligned), and is only
            // accessed atomically by processes (or written whole by a GPU).
            unsafe { &*(self.ptr.as_ptr().add(GATE_OFFSET + index * 4) as *const AtomicU32) }
        })
    }

    /// The header page's start and length (for registering it with a GPU driver, which
    /// then writes the gate words), and the gate words' offset in it.
    pub fn header_page(&self) -> (NonNull<u8>, usize, usize) {
        (self.ptr, HEADER_BYTES, GATE_OFFSET)
    }

    /// The writing end of one direction (one writer per direction and process).
    pub fn writer(self: &Arc<Self>, direction: Direction) -> RingWriter {
        let end = RingEnd::new(self.clone(), direction);
        let head = end.head().load(Ordering::Acquire);
        RingWriter { end, head }
    }

    /// The reading end of one direction (one reader per direction and process).
    pub fn reader(self: &Arc<Self>, direction: Direction) -> RingReader {
        let end = RingEnd::new(self.clone(), direction);
        let tail = end.tail().load(Ordering::Acquire);
        RingReader { end, tail, armed: false }
    }
}

impl Drop for ControlRingMemory {
    fn drop(&mut self) {
        unmap(self.ptr, self.len);
    }
}

/// One direction of a mapped ring pair.
struct RingEnd {
    mem: Arc<ControlRingMemory>,
    header: usize,
    data: usize,
}

impl RingEnd {
    fn new(mem: Arc<ControlRingMemory>, direction: Direction) -> Self {
        let i = direction.index();
        let data = HEADER_BYTES + i * mem.ring_bytes;
        Self { header: DIRECTION_HEADER[i], data, mem }
    }

    fn atomic_u64(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: header + offset lies in the header page of our live mapping (constants),
        // is 8-byte aligned (the mapping is page aligned, the offsets multiples of 64), and
        // the memory is only ever accessed atomically by both processes.
        unsafe { &*(self.mem.ptr.as_ptr().add(self.header + offset) as *const AtomicU64) }
    }

    fn head(&self) -> &AtomicU64 {
        self.atomic_u64(HEAD)
    }

    fn tail(&self) -> &AtomicU64 {
        self.atomic_u64(TAIL)
    }

    fn sleeping(&self) -> &AtomicU32 {
        // SAFETY: as in `atomic_u64`: in the header page, 4-byte aligned, atomic only.
        unsafe { &*(self.mem.ptr.as_ptr().add(self.header + SLEEPING) as *const AtomicU32) }
    }

    fn cap(&self) -> u64 {
        self.mem.ring_bytes as u64
    }

    /// Copies `src` into the ring from byte position `pos` on, wrapping at its end.
    fn copy_in(&self, pos: u64, src: &[u8]) {
        let cap = self.mem.ring_bytes;
        let at = (pos % cap as u64) as usize;
        let first = src.len().min(cap - at);
        let base = self.mem.ptr.as_ptr();
        // SAFETY: both pieces lie inside this direction's data area of the live mapping
        // (at < cap, first <= cap - at, the rest < cap); `src` is local memory, distinct.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), base.add(self.data + at), first);
            std::ptr::copy_nonoverlapping(src.as_ptr().add(first), base.add(self.data), src.len() - first);
        }
    }

    /// Copies ring bytes from position `pos` on into `dst`, wrapping at its end.
    fn copy_out(&self, pos: u64, dst: &mut [u8]) {
        let cap = self.mem.ring_bytes;
        let at = (pos % cap as u64) as usize;
        let first = dst.len().min(cap - at);
        let base = self.mem.ptr.as_ptr();
        let len = dst.len();
        // SAFETY: as in `copy_in`, with `dst` the local, distinct destination.
        unsafe {
            std::ptr::copy_nonoverlapping(base.add(self.data + at), dst.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(base.add(self.data), dst.as_mut_ptr().add(first), len - first);
        }
    }
}

/// The writing end of a ring.
pub struct RingWriter {
    end: RingEnd,
    /// Bytes written so far (ours: the shared copy is only published).
    head: u64,
}

impl RingWriter {
    /// Writes as much of `bytes` as fits; the count written (0 when the ring is full).
    pub fn write(&mut self, bytes: &[u8]) -> Result<usize, RingError> {
        let tail = self.end.tail().load(Ordering::Acquire);
        let used = self.head.wrapping_sub(tail);
        if used > self.end.cap() {
            return Err(RingError::Corrupt(format!(
                "the reader claims to be {used} bytes behind in a ring of {}",
                self.end.cap()
            )));
        }
        let n = bytes.len().min((self.end.cap() - used) as usize);
        if n == 0 {
            return Ok(0);
        }
        self.end.copy_in(self.head, &bytes[..n]);
        self.head = self.head.wrapping_add(n as u64);
        self.end.head().store(self.head, Ordering::Release);
        Ok(n)
    }

    /// Whether the reader said it may block: call after publishing and, when true, wake it.
    pub fn reader_sleeping(&self) -> bool {
        // Pairs with the fence in `RingReader::arm_sleep`.
        fence(Ordering::SeqCst);
        self.end.sleeping().load(Ordering::SeqCst) != 0
    }

    /// Bytes written and not yet read by the peer.
    pub fn unread(&self) -> u64 {
        self.head.wrapping_sub(self.end.tail().load(Ordering::Acquire)).min(self.end.cap())
    }
}

/// The reading end of a ring.
pub struct RingReader {
    end: RingEnd,
    /// Bytes read so far (ours).
    tail: u64,
    armed: bool,
}

impl RingReader {
    /// Bytes waiting to be read (an error when the writer's index is impossible).
    pub fn available(&self) -> Result<usize, RingError> {
        let head = self.end.head().load(Ordering::Acquire);
        let avail = head.wrapping_sub(self.tail);
        if avail > self.end.cap() {
            return Err(RingError::Corrupt(format!(
                "the writer claims {avail} unread bytes in a ring of {}",
                self.end.cap()
            )));
        }
        Ok(avail as usize)
    }

    /// Reads what is there, up to `buf.len()` bytes; the count read.
    pub fn read(&mut self, buf: &mut [u8]) -> Result<usize, RingError> {
        let n = self.available()?.min(buf.len());
        if n == 0 {
            return Ok(0);
        }
        self.end.copy_out(self.tail, &mut buf[..n]);
        self.tail = self.tail.wrapping_add(n as u64);
        self.end.tail().store(self.tail, Ordering::Release);
        Ok(n)
    }

    /// Says this side may block; `true` when bytes arrived meanwhile (then do not block).
    pub fn arm_sleep(&mut self) -> bool {
        self.armed = true;
        self.end.sleeping().store(1, Ordering::SeqCst);
        // Pairs with the fence in `RingWriter::reader_sleeping`.
        fence(Ordering::SeqCst);
        !matches!(self.available(), Ok(0))
    }

    /// This side is awake again (cheap when it was not armed).
    pub fn disarm_sleep(&mut self) {
        if self.armed {
            self.armed = false;
            self.end.sleeping().store(0, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrylink_testkit::pattern;
    use nix::fcntl::SealFlag;
    use proptest::prelude::*;

    /// A ring pair and a second mapping of it through its fd, as the peer would have.
    fn pair(ring_bytes: usize) -> (Arc<ControlRingMemory>, Arc<ControlRingMemory>) {
        let ours = ControlRingMemory::create(ring_bytes).unwrap();
        let fd = ours.fd().try_clone_to_owned().unwrap();
        let theirs = ControlRingMemory::import(fd, ring_bytes as u64).unwrap();
        (ours, theirs)
    }

    #[test]
    fn bytes_written_on_one_mapping_are_read_on_the_other_across_the_wrap() {
        let (ours, theirs) = pair(4096);
        let mut w = ours.writer(Direction::ConnectorToAcceptor);
        let mut r = theirs.reader(Direction::ConnectorToAcceptor);
        for round in 0..5u64 {
            let sent = pattern(3000, round);
            assert_eq!(w.write(&sent).unwrap(), 3000);
            let mut got = vec![0u8; 4096];
            assert_eq!(r.read(&mut got).unwrap(), 3000);
            assert_eq!(&got[..3000], &sent[..], "round {round}");
        }
        // The other direction is independent.
        let mut w2 = theirs.writer(Direction::AcceptorToConnector);
        let mut r2 = ours.reader(Direction::AcceptorToConnector);
        assert_eq!(w2.write(b"back").unwrap(), 4);
        let mut got = [0u8; 8];
        assert_eq!(r2.read(&mut got).unwrap(), 4);
        assert_eq!(&got[..4], b"back");
        assert_eq!(r.available().unwrap(), 0);
    }

    #[test]
    fn gate_words_are_shared_and_leave_the_rings_and_indices_alone() {
        let (ours, theirs) = pair(4096);
        let mut w = ours.writer(Direction::ConnectorToAcceptor);
        let mut r = theirs.reader(Direction::ConnectorToAcceptor);
        for i in 0..GATE_WORDS {
            ours.gate_word(i).unwrap().store(i as u32 + 1, Ordering::Release);
        }
        assert!(ours.gate_word(GATE_WORDS).is_none());
        assert!((0..GATE_WORDS).all(|i| theirs.gate_word(i).unwrap().load(Ordering::Acquire) == i as u32 + 1));
        // Every index and flag of both directions is untouched, and the rings still work.
        assert_eq!(w.write(b"after").unwrap(), 5);
        let mut got = [0u8; 8];
        assert_eq!(r.read(&mut got).unwrap(), 5);
        assert_eq!(&got[..5], b"after");
        let (page, len, offset) = ours.header_page();
        assert_eq!((len, offset + GATE_WORDS * 4), (HEADER_BYTES, HEADER_BYTES));
        assert_eq!(page.as_ptr().wrapping_add(offset) as usize, ours.gate_word(0).unwrap() as *const _ as usize);
    }

    #[test]
    fn a_full_ring_takes_nothing_until_the_reader_makes_room() {
        let (ours, theirs) = pair(4096);
        let mut w = ours.writer(Direction::AcceptorToConnector);
        let mut r = theirs.reader(Direction::AcceptorToConnector);
        assert_eq!(w.write(&pattern(5000, 1)).unwrap(), 4096);
        assert_eq!(w.write(b"more").unwrap(), 0);
        assert_eq!(w.unread(), 4096);
        let mut got = vec![0u8; 100];
        assert_eq!(r.read(&mut got).unwrap(), 100);
        assert_eq!(got, pattern(5000, 1)[..100]);
        assert_eq!(w.write(&pattern(200, 2)).unwrap(), 100);
    }

    #[test]
    fn impossible_peer_indices_are_reported_not_trusted() {
        let (ours, theirs) = pair(4096);
        let mut r = ours.reader(Direction::ConnectorToAcceptor);
        // The "peer" claims to have written more than the ring holds.
        theirs.writer(Direction::ConnectorToAcceptor).end.head().store(4097, Ordering::SeqCst);
        assert!(matches!(r.available(), Err(RingError::Corrupt(_))));
        assert!(matches!(r.read(&mut [0u8; 16]), Err(RingError::Corrupt(_))));
        // ... or to have read bytes that were never written.
        let mut w = ours.writer(Direction::AcceptorToConnector);
        theirs.reader(Direction::AcceptorToConnector).end.tail().store(10, Ordering::SeqCst);
        assert!(matches!(w.write(b"x"), Err(RingError::Corrupt(_))));
    }

    #[test]
    fn a_sleeping_reader_is_seen_by_the_writer_and_bytes_keep_it_awake() {
        let (ours, theirs) = pair(4096);
        let mut r = ours.reader(Direction::ConnectorToAcceptor);
        let mut w = theirs.writer(Direction::ConnectorToAcceptor);
        assert!(!w.reader_sleeping());
        assert!(!r.arm_sleep(), "nothing to read: it may sleep");
        assert!(w.reader_sleeping());
        w.write(b"hi").unwrap();
        r.disarm_sleep();
        assert!(!w.reader_sleeping());
        assert!(r.arm_sleep(), "bytes are waiting: it must not sleep");
        r.disarm_sleep();
    }

    #[test]
    fn import_refuses_bad_sizes_plain_files_unsealed_memfds_and_wrong_lengths() {
        assert!(matches!(ControlRingMemory::create(5000), Err(RingError::BadSize(5000))));
        assert!(matches!(ControlRingMemory::create(2048), Err(RingError::BadSize(_))));
        let ring = ControlRingMemory::create(4096).unwrap();
        let fd = ring.fd().try_clone_to_owned().unwrap();
        assert!(matches!(ControlRingMemory::import(fd, 8192), Err(RingError::BadMemory(_))));
        let file = pipe_fd();
        assert!(matches!(ControlRingMemory::import(file, 4096), Err(RingError::BadMemory(_))));
        let unsealed = nix::sys::memfd::memfd_create(c"unsealed", nix::sys::memfd::MFdFlags::MFD_CLOEXEC).unwrap();
        nix::unistd::ftruncate(&unsealed, (HEADER_BYTES + 2 * 4096) as i64).unwrap();
        assert!(matches!(ControlRingMemory::import(unsealed, 4096), Err(RingError::BadMemory(_))));
    }

    #[test]
    fn ring_memory_sealed_against_grow_only_is_refused() {
        let len = HEADER_BYTES + 2 * 4096;
        let grow_only = crate::memfd::tests::memfd_sealed_with(len, SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL);
        assert!(matches!(ControlRingMemory::import(grow_only, 4096), Err(RingError::BadMemory(_))));
    }

    #[test]
    fn ring_memory_sealed_against_shrink_only_is_accepted() {
        let len = HEADER_BYTES + 2 * 4096;
        let shrink_only = crate::memfd::tests::memfd_sealed_with(len, SealFlag::F_SEAL_SHRINK);
        let ring = ControlRingMemory::import(shrink_only, 4096).expect("a shrink seal keeps the mapping whole");
        assert_eq!(ring.ring_bytes(), 4096);
    }

    #[test]
    fn dropping_an_imported_ring_pair_unmaps_it() {
        let name = format!("ring-drop-probe-{}", std::process::id());
        let fd = crate::memfd::tests::named_memfd(&name, HEADER_BYTES + 2 * 4096);
        let ring = ControlRingMemory::import(fd, 4096).unwrap();
        assert!(crate::memfd::tests::is_mapped(&name), "the ring pair is mapped");
        drop(ring);
        assert!(!crate::memfd::tests::is_mapped(&name), "the mapping outlived the ring pair");
    }

    fn pipe_fd() -> OwnedFd {
        let (r, _w) = nix::unistd::pipe().unwrap();
        r
    }

    proptest! {
        /// Any interleaving of chunked writes and reads delivers the byte stream intact.
        #[test]
        fn the_byte_stream_survives_any_chunking(ops in proptest::collection::vec((any::<bool>(), 1usize..6000), 1..60)) {
            let (ours, theirs) = pair(4096);
            let mut w = ours.writer(Direction::ConnectorToAcceptor);
            let mut r = theirs.reader(Direction::ConnectorToAcceptor);
            let (mut sent, mut got) = (Vec::new(), Vec::new());
            let mut next = 0u32;
            for (write, n) in ops {
                if write {
                    let chunk: Vec<u8> = (0..n).map(|i| ((next as usize + i) % 251) as u8).collect();
                    let k = w.write(&chunk).unwrap();
                    sent.extend_from_slice(&chunk[..k]);
                    next = next.wrapping_add(k as u32);
                } else {
                    let mut buf = vec![0u8; n];
                    let k = r.read(&mut buf).unwrap();
                    got.extend_from_slice(&buf[..k]);
                }
            }
            let mut rest = vec![0u8; 4096];
            let k = r.read(&mut rest).unwrap();
            got.extend_from_slice(&rest[..k]);
            prop_assert_eq!(got, sent);
        }
    }
}
