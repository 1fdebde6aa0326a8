//! Copies without a launch each: one block of [`LINGER_PTX`] stays on the GPU after its
//! copy, polls a mailbox in mapped pinned host memory for the next, and leaves once
//! nothing came for an idle time. Opt-in (docs/decisions/0030-lingering-kernel-opt-in.md):
//! a launch costs about 4 µs of host time on the H200 machine, a post into the mailbox a
//! few stores.
//!
//! What it costs, and why it ends on its own: while it runs it holds one multiprocessor
//! and keeps its context busy, so `cuCtxSynchronize` (and whatever synchronises the
//! context: `cudaFree`, cudarc's `synchronize`) waits until it left, at most the idle
//! time after the last copy; another process's kernels on the same GPU share it by time
//! slices. It runs on its own non-blocking stream, so no other stream waits for it.
//!
//! A kernel leaving (idle) while the host posts is a race the host settles: the kernel
//! writes the last copy it did, then that it left; [`LingeringCopier::recover`] finds
//! copies posted after the last one done and enqueues them the ordinary way, with the same
//! signal, on the kernel's stream (free once it left).

use super::copy_kernel::{copy_dtod_async, kernel_copy_signalling};
use super::error::check;
use super::launch::launch_kernel;
use super::span_table::mapped_address;
use super::{write_value32, CudaError, CudaResult, Gpu, PinnedStaging, Stream};
use cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The lingering kernel (one entry, `ferrylink_linger_copy`).
pub const LINGER_PTX: &str = include_str!("linger_kernel.ptx");

/// The largest copy the kernel takes (one block; larger ones are launched as before).
pub const LINGER_MAX_BYTES: u64 = 4096;
/// Mailbox slots: copies posted and not yet taken at most.
const SLOTS: u64 = 64;
const THREADS: u32 = 256;
/// Mailbox words (`POSTED` is the host's own record; the kernel reads the slots' tags).
const POSTED: usize = 0;
const TAKEN: usize = 1;
const EXITED: usize = 2;
const STOP: usize = 3;
/// Word index of slot 0 (byte 64); four words a slot.
const SLOT_BASE: usize = 8;
const MAILBOX_BYTES: usize = 64 + SLOTS as usize * 32;
/// Addresses a slot carries fit in 49 bits (the tag takes the 15 above).
const ADDRESS_MASK: u64 = (1 << 49) - 1;

/// The tag of copy `seq` in its slot's words: never 0 (a mailbox starts zeroed), and
/// different from the copy 64 before it in the same slot.
fn tag_of(seq: u64) -> u64 {
    seq % 32767 + 1
}

/// Copy `seq`'s slot words: dst, src, len | value << 16, signal, each tagged.
fn slot_words(seq: u64, (dst, src, len): (u64, u64, u64), (signal, value): (u64, u32)) -> [u64; 4] {
    let tag = tag_of(seq);
    [dst | tag << 49, src | tag << 49, len | u64::from(value) << 16 | tag << 48, signal | tag << 49]
}

/// What [`slot_words`] packed: `((dst, src, len), (signal, value))`.
fn unpack_slot(words: [u64; 4]) -> ((u64, u64, u64), (u64, u32)) {
    let [dst, src, packed, signal] = words;
    let (len, value) = (packed & 0xffff, ((packed >> 16) & 0xffff_ffff) as u32);
    ((dst & ADDRESS_MASK, src & ADDRESS_MASK, len), (signal & ADDRESS_MASK, value))
}

/// One device's lingering copier: the mailbox, the kernel's stream, what was posted.
/// Used by one thread at a time (`&mut self`).
pub struct LingeringCopier {
    gpu: Gpu,
    stream: Stream,
    mailbox: PinnedStaging,
    mailbox_device: u64,
    module: sys::CUmodule,
    function: sys::CUfunction,
    idle_ns: u64,
    /// The last seq posted.
    posted: u64,
    /// The epoch of the kernel launched last (0: none yet).
    epoch: u64,
    /// Whether that kernel may still run (its exit not seen).
    running: bool,
}

// SAFETY: the module and function belong to the device's primary context, which lives as
// long as the process; the mailbox is process memory; `&mut self` serialises use.
unsafe impl Send for LingeringCopier {}

impl LingeringCopier {
    /// A copier for `gpu` whose kernel leaves after `idle` without a copy.
    pub fn new(gpu: &Gpu, idle: Duration) -> CudaResult<LingeringCopier> {
        gpu.bind_to_current_thread()?;
        let ptx = std::ffi::CString::new(LINGER_PTX)
            .map_err(|_| CudaError::invalid("cuModuleLoadData", "the PTX contains a NUL byte"))?;
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: the context is bound; the PTX is NUL-terminated and outlives the call.
        check("cuModuleLoadData", unsafe { sys::cuModuleLoadData(&mut module, ptx.as_ptr().cast()) })?;
        let mut function: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: the module was just loaded; the name is NUL-terminated.
        let found = check("cuModuleGetFunction", unsafe {
            sys::cuModuleGetFunction(&mut function, module, c"ferrylink_linger_copy".as_ptr())
        });
        let built = found.and_then(|()| {
            let mailbox = PinnedStaging::new(gpu, MAILBOX_BYTES)?;
            let mailbox_device = mapped_address(gpu, &mailbox)?;
            Ok((Stream::new(gpu)?, mailbox, mailbox_device))
        });
        let (stream, mailbox, mailbox_device) = match built {
            Ok(parts) => parts,
            Err(e) => {
                // SAFETY: loaded above, used by nothing.
                unsafe { sys::cuModuleUnload(module) };
                return Err(e);
            }
        };
        let copier = LingeringCopier {
            gpu: gpu.clone(),
            stream,
            mailbox,
            mailbox_device,
            module,
            function,
            idle_ns: idle.as_nanos().min(u128::from(u64::MAX)) as u64,
            posted: 0,
            epoch: 0,
            running: false,
        };
        for w in 0..MAILBOX_BYTES / 8 {
            copier.word(w).store(0, Ordering::Relaxed);
        }
        Ok(copier)
    }

    fn word(&self, index: usize) -> &AtomicU64 {
        assert!(index < MAILBOX_BYTES / 8, "mailbox word {index} out of range");
        // SAFETY: the mailbox holds MAILBOX_BYTES bytes, 8-byte aligned (a page from
        // cuMemHostAlloc), alive as long as `self`; the kernel writes its words with
        // aligned 8-byte stores.
        unsafe { &*(self.mailbox.as_ptr().cast::<AtomicU64>().add(index)) }
    }

    /// The kernel's stream (where recovered copies go too).
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Copies `len` bytes from `src` to `dst` and then stores `value` at `signal`
    /// (device-mapped host memory), through the lingering kernel: posted to it when it
    /// runs, else a kernel launched with it. `Ok(false)`: nothing was done (empty, longer
    /// than [`LINGER_MAX_BYTES`], or the mailbox full): copy another way.
    ///
    /// # Safety
    /// `dst` and `src` must be device memory of (or mapped into) this context, valid and
    /// not otherwise used until `value` is seen at `signal`; `signal` a word of mapped
    /// host memory alive until then.
    pub unsafe fn copy(&mut self, (dst, src, len): (u64, u64, u64), (signal, value): (u64, u32)) -> CudaResult<bool> {
        if len == 0 || len > LINGER_MAX_BYTES || (dst | src | signal) > ADDRESS_MASK {
            return Ok(false);
        }
        self.recover()?;
        if self.running && self.posted - self.word(TAKEN).load(Ordering::Acquire) >= SLOTS {
            return Ok(false);
        }
        let seq = self.posted + 1;
        let slot = SLOT_BASE + 4 * (seq % SLOTS) as usize;
        for (i, word) in slot_words(seq, (dst, src, len), (signal, value)).into_iter().enumerate() {
            self.word(slot + i).store(word, Ordering::Release);
        }
        self.word(POSTED).store(seq, Ordering::Release);
        self.posted = seq;
        if !self.running {
            if let Err(e) = self.launch(seq - 1) {
                // Nothing runs to take it: taken back, the caller copies the ordinary way
                // (and meets whatever broke the launch there).
                tracing::debug!(error = %e, "the lingering copy kernel did not launch");
                self.posted = seq - 1;
                self.word(POSTED).store(seq - 1, Ordering::Release);
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Launches a kernel that takes the copies posted after `start`.
    fn launch(&mut self, start: u64) -> CudaResult<()> {
        self.gpu.bind_to_current_thread()?;
        let epoch = self.epoch + 1;
        let (mut p_mailbox, mut p_start, mut p_epoch, mut p_idle) = (self.mailbox_device, start, epoch, self.idle_ns);
        let mut params: [*mut c_void; 4] = [
            (&mut p_mailbox as *mut u64).cast(),
            (&mut p_start as *mut u64).cast(),
            (&mut p_epoch as *mut u64).cast(),
            (&mut p_idle as *mut u64).cast(),
        ];
        // SAFETY: the function belongs to the bound context and takes four u64, read
        // during the call; the mailbox lives until `Drop` stopped the kernel and
        // synchronised its stream.
        unsafe { launch_kernel(self.function, (1, 1), THREADS, &self.stream, &mut params) }?;
        self.epoch = epoch;
        self.running = true;
        tracing::trace!(epoch, "lingering copy kernel launched");
        Ok(())
    }

    /// Whether the kernel launched last may still run (its exit not seen yet).
    pub fn running(&self) -> bool {
        self.running && self.word(EXITED).load(Ordering::Acquire) != self.epoch
    }

    /// When the kernel left: enqueues the copies posted after the last it did, the
    /// ordinary way with the same signals, on its stream. Cheap when it runs (two loads).
    pub fn recover(&mut self) -> CudaResult<()> {
        if !self.running || self.word(EXITED).load(Ordering::Acquire) != self.epoch {
            return Ok(());
        }
        self.running = false;
        let taken = self.word(TAKEN).load(Ordering::Acquire);
        for seq in taken + 1..=self.posted {
            let slot = SLOT_BASE + 4 * (seq % SLOTS) as usize;
            let words = std::array::from_fn(|i| self.word(slot + i).load(Ordering::Relaxed));
            let ((dst, src, len), (signal, value)) = unpack_slot(words);
            let len = len as usize;
            tracing::debug!(seq, "a copy posted as the lingering kernel left: enqueued again");
            // SAFETY: posted with `copy`'s contract, whose caller still waits for the
            // signal (it was never written): the memory is alive and unused.
            unsafe {
                if !kernel_copy_signalling(dst, src, len, &self.stream, (signal, value))? {
                    copy_dtod_async(dst, src, len, &self.stream)?;
                    write_value32(&self.stream, signal, value)?;
                }
            }
        }
        // The kernel is gone: what was posted is done or enqueued.
        self.word(TAKEN).store(self.posted, Ordering::Release);
        Ok(())
    }

    /// Copies posted so far, and the last the kernel reported done.
    pub fn counts(&self) -> (u64, u64) {
        (self.posted, self.word(TAKEN).load(Ordering::Acquire))
    }

    /// Copies taken so far (by the kernel, or enqueued again after it left).
    pub fn copies(&self) -> u64 {
        self.posted
    }

    /// Kernel launches so far.
    pub fn launches(&self) -> u64 {
        self.epoch
    }
}

impl Drop for LingeringCopier {
    fn drop(&mut self) {
        if self.running {
            self.word(STOP).store(self.epoch, Ordering::Release);
        }
        if let Err(e) = self.stream.synchronize() {
            tracing::warn!(error = %e, "waiting for the lingering copy kernel to leave");
        }
        // SAFETY: the kernel left (its stream was synchronised) or never ran; the module
        // is used by nothing else.
        unsafe { sys::cuModuleUnload(self.module) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_pack_and_unpack_with_a_tag_that_changes_per_reuse() {
        let copy = ((0x7f12_3456_7890, 0x1_0000_0010, 4096), (0x7fff_ffff_f000, u32::MAX));
        for seq in [1, 63, 64, 65, 32766, 32767, 32768, u64::MAX - 1] {
            let words = slot_words(seq, copy.0, copy.1);
            assert_eq!(unpack_slot(words), copy, "seq {seq}");
            let tags = [words[0] >> 49, words[1] >> 49, words[2] >> 48, words[3] >> 49];
            assert!(tags.iter().all(|&t| t == tag_of(seq) && t != 0), "seq {seq}: {tags:?}");
            assert_ne!(tag_of(seq), tag_of(seq.wrapping_sub(SLOTS)), "seq {seq} and the copy before in its slot");
        }
        assert!(tag_of(u64::MAX) < 1 << 15, "a tag fits 15 bits");
    }
}
