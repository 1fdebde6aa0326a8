//! Completion flags: a word of pinned host memory that the GPU writes
//! (`cuStreamWriteValue32`, with its memory barrier) once the work queued before it on a
//! stream is done, and that the host reads without a driver call. Spinning on one is
//! 0.6–1.1 µs faster per copy than `cuEventQuery` on an event recorded in its place (H200,
//! `memory/examples/copy_latency_floor`, docs/decisions/0028-completion-words-not-resident-kernel.md).
//!
//! Flags live in pinned pages kept per device; a flag's word keeps its last value when the
//! flag goes back, and each use writes the next value, so a late write of an earlier use
//! is never taken for the current one. A flag dropped before its write was seen is not
//! reused (the write may still land). Where the driver refuses stream memory operations
//! or mapped pinned memory, [`DoneFlag::acquire`] says so and callers keep using events.

use super::context::Gpu;
use super::error::{check, CudaError, CudaResult};
use super::pinned::PinnedStaging;
use super::span_table::mapped_address;
use super::stream::Stream;
use cudarc::driver::sys;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// Flags per pinned page (4 KiB of u32 words).
const FLAGS_PER_PAGE: usize = 1024;

/// A page of flags: its memory and the device address of its first word.
struct Page {
    memory: PinnedStaging,
    device: u64,
}

/// One device's flags: pages and the free words (page, index, last value written).
#[derive(Default)]
struct DeviceFlags {
    pages: Vec<Arc<Page>>,
    free: Vec<(usize, usize, u32)>,
    /// Stream memory operations or mapped pinned memory are refused here.
    unsupported: Option<String>,
}

fn devices() -> MutexGuard<'static, HashMap<usize, DeviceFlags>> {
    static FLAGS: OnceLock<Mutex<HashMap<usize, DeviceFlags>>> = OnceLock::new();
    FLAGS.get_or_init(|| Mutex::new(HashMap::new())).lock().unwrap_or_else(|p| p.into_inner())
}

/// A completion flag of one device, armed by [`DoneFlag::record`].
pub struct DoneFlag {
    device: usize,
    page: Arc<Page>,
    page_index: usize,
    index: usize,
    /// The value the last `record` asked the GPU to write.
    value: u32,
}

// SAFETY: the word is read through an atomic and written only by the GPU; the page is
// owned by the Arc and freed with it.
unsafe impl Send for DoneFlag {}
// SAFETY: shared access only reads the word atomically.
unsafe impl Sync for DoneFlag {}

impl DoneFlag {
    /// A flag of `gpu`'s device; an error where the device cannot use them (the caller
    /// falls back to events).
    pub fn acquire(gpu: &Gpu) -> CudaResult<DoneFlag> {
        let device = gpu.ordinal();
        let mut devices = devices();
        let flags = devices.entry(device).or_default();
        if let Some(reason) = &flags.unsupported {
            return Err(CudaError::invalid("cuStreamWriteValue32", reason.clone()));
        }
        if flags.free.is_empty() {
            let page = match new_page(gpu) {
                Ok(page) => page,
                Err(e) => {
                    flags.unsupported = Some(e.to_string());
                    return Err(e);
                }
            };
            let page_index = flags.pages.len();
            flags.pages.push(Arc::new(page));
            flags.free.extend((0..FLAGS_PER_PAGE).rev().map(|i| (page_index, i, 0)));
        }
        let Some((page_index, index, value)) = flags.free.pop() else {
            return Err(CudaError::invalid("cuStreamWriteValue32", "no completion flag left"));
        };
        let page = flags.pages[page_index].clone();
        Ok(DoneFlag { device, page, page_index, index, value })
    }

    /// Has the GPU write the flag's next value on `stream` once the work queued there
    /// before is done (and its memory writes visible).
    pub fn record(&mut self, stream: &Stream) -> CudaResult<()> {
        stream.gpu().bind_to_current_thread()?;
        let next = self.value.wrapping_add(1);
        let address = self.page.device + (self.index * 4) as u64;
        // SAFETY: the address is a word of this flag's mapped pinned page (kept alive by
        // the Arc, on this stream's device), written by nothing else while the flag is
        // ours; the stream is live.
        let written =
            check("cuStreamWriteValue32", unsafe { sys::cuStreamWriteValue32_v2(stream.raw(), address, next, 0) });
        if let Err(e) = written {
            devices().entry(self.device).or_default().unsupported = Some(e.to_string());
            return Err(e);
        }
        self.value = next;
        Ok(())
    }

    /// Arms the flag for a kernel that writes it itself: `launch` gets the device address
    /// of the flag's word and the next value, and enqueues the kernel; once it did,
    /// [`DoneFlag::is_set`] waits for that value. A failed launch leaves the flag as it
    /// was.
    pub fn arm_for_kernel(&mut self, launch: impl FnOnce(u64, u32) -> CudaResult<()>) -> CudaResult<()> {
        self.try_arm_for_kernel(|address, value| launch(address, value).map(|()| true)).map(drop)
    }

    /// [`DoneFlag::arm_for_kernel`] for work that may decline: `enqueue` returns whether
    /// it enqueued anything; the flag is armed only then (and so is the answer).
    pub fn try_arm_for_kernel(&mut self, enqueue: impl FnOnce(u64, u32) -> CudaResult<bool>) -> CudaResult<bool> {
        let next = self.value.wrapping_add(1);
        let enqueued = enqueue(self.page.device + (self.index * 4) as u64, next)?;
        if enqueued {
            self.value = next;
        }
        Ok(enqueued)
    }

    /// The ordinal of the device whose streams may write this flag.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Whether the GPU wrote the value of the last `record` (a load, no driver call).
    pub fn is_set(&self) -> bool {
        self.word().load(Ordering::Acquire) == self.value
    }

    /// Waits (spinning, yielding now and then) until [`DoneFlag::is_set`].
    pub fn wait(&self) {
        let mut spins = 0u32;
        while !self.is_set() {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    fn word(&self) -> &AtomicU32 {
        let base = self.page.memory.as_ptr().cast::<AtomicU32>();
        // SAFETY: `index` < FLAGS_PER_PAGE words of the page, which is 4-byte aligned
        // (page-aligned pinned memory) and lives as long as the Arc this flag holds; the
        // GPU writes it whole.
        unsafe { &*base.add(self.index) }
    }
}

impl Drop for DoneFlag {
    fn drop(&mut self) {
        // A write still due could land on the next user's word: such a word is not reused.
        if self.is_set() {
            devices().entry(self.device).or_default().free.push((self.page_index, self.index, self.value));
        }
    }
}

/// A page of flags, all zero, mapped for the device.
fn new_page(gpu: &Gpu) -> CudaResult<Page> {
    let mut memory = PinnedStaging::new(gpu, FLAGS_PER_PAGE * 4)?;
    memory.as_mut_slice().fill(0);
    let device = mapped_address(gpu, &memory)?;
    Ok(Page { memory, device })
}
