//! Many copies of one device in one launch: a gather/scatter kernel over a table of
//! (destination, source, length) entries, a row of blocks per entry sharing its bytes
//! (16-byte loads and stores where both ends are 16-byte aligned, bytes for the rest).
//! Two kernels of one PTX module: where each thread of a row has four vectors to move,
//! one that keeps its four loads in flight at once; else one that moves a vector at a
//! time (and holds fewer registers, so more blocks fit a multiprocessor).
//!
//! One-sided batches move thousands of small blocks (KV-cache pages); a launch per block
//! costs a few microseconds each, far more than moving 64 KiB at HBM speed. A
//! [`SpanBatch`] writes its entries straight into pinned host memory kept per device
//! (`span_table`); the kernel reads them there through the memory's device address, or,
//! where the driver gives none, from a device copy made on the same stream ahead of the
//! launch. The caller keeps the returned [`SpanTable`] until the stream's work completed.
//! Like the copy kernel, the PTX is compiled by the driver's JIT on first use: without it
//! (or for a single entry) the copies go one by one.

use super::context::Gpu;
use super::copy::{memcpy_htod_async, memcpy_htod_sync};
use super::copy_kernel::copy_dtod_async;
use super::error::{check, CudaError, CudaResult};
use super::launch::launch_kernel;
use super::pool::DevicePool;
use super::span_table::{HostTable, ENTRY_BYTES};
use super::stream::Stream;
use crate::DeviceBuffer;
use cudarc::driver::sys;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

/// The kernels (`ferrylink_copy_spans`, `ferrylink_copy_spans_wide`): `table` holds
/// `count` entries of three u64 (dst, src, len); a row of blocks per entry, the row's
/// blocks sharing the entry's 16-byte vectors.
pub const SPAN_KERNEL_PTX: &str = include_str!("span_kernel.ptx");

const THREADS_PER_BLOCK: u32 = 256;
/// Bytes of an entry per block of its row: two steps of [`THREADS_PER_BLOCK`] threads
/// copying 16 bytes each.
const BLOCK_SHARE_BYTES: u64 = THREADS_PER_BLOCK as u64 * 16 * 2;
/// Bytes of an entry per block of the wide kernel's rows: one step of
/// [`THREADS_PER_BLOCK`] threads with four 16-byte loads each in flight. The wide kernel
/// runs where the table is in device memory and the longest entry fills such a block.
const WIDE_BLOCK_SHARE_BYTES: u64 = THREADS_PER_BLOCK as u64 * 16 * 4;
/// Blocks per launch at most; rows beyond take further entries in turn, blocks beyond a
/// row's share step through its entries.
const MAX_GRID_BLOCKS: u64 = 1 << 16;
/// Rows at most (the driver's limit on a grid's second dimension).
const MAX_GRID_ROWS: u64 = 65_535;

/// The table of a launched batch: keep it until the stream's work completed.
#[must_use = "the kernel reads the table until the stream's work completed"]
pub struct SpanTable {
    _table: Option<TableHeld>,
}

/// What a launch's table lives in (held, never read here: the kernel reads it).
enum TableHeld {
    /// A batch's own table (and its device copy, where the kernel cannot read it in place).
    Once { _device: Option<DeviceBuffer>, _host: HostTable },
    /// A kept batch's table, shared by every launch of it.
    Kept { _listed: Arc<ListedSpans> },
}

/// A batch listed once and launched any number of times ([`SpanBatch::keep`],
/// [`launch_listed`]): a prepared one-sided transfer's copies, whose table is written
/// once instead of per transfer. The table is never written again.
pub struct ListedSpans {
    host: HostTable,
    entries: usize,
    /// The longest entry's bytes (the grid's width).
    longest: u64,
    /// The device copy of the table (none where device memory was refused: the kernel
    /// reads the pinned one in place).
    device_table: Option<DeviceBuffer>,
    /// The table's device address for the kernel.
    table_ptr: u64,
}

impl ListedSpans {
    /// Entries listed (empty ones left out).
    pub fn len(&self) -> usize {
        self.entries
    }

    /// Whether nothing was listed.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// The one entry `(dst, src, len)`, when exactly one was listed.
    pub fn only_entry(&self) -> Option<(u64, u64, u64)> {
        (self.entries == 1).then(|| entry_of(self.host.bytes(), 0))
    }

    fn listing(&self) -> Listing {
        let in_device = self.device_table.is_some();
        Listing { table: self.table_ptr, entries: self.entries, longest: self.longest, in_device }
    }
}

struct LoadedSpanKernel {
    _module: sys::CUmodule,
    function: sys::CUfunction,
    wide: sys::CUfunction,
}

// SAFETY: module and function handles of a primary context that lives as long as the
// process; used from any thread with that context bound (every launch binds it first).
unsafe impl Send for LoadedSpanKernel {}
// SAFETY: as above; launching does not mutate the handles.
unsafe impl Sync for LoadedSpanKernel {}

impl LoadedSpanKernel {
    fn load(gpu: &Gpu) -> CudaResult<LoadedSpanKernel> {
        gpu.bind_to_current_thread()?;
        let ptx = std::ffi::CString::new(SPAN_KERNEL_PTX)
            .map_err(|_| CudaError::invalid("cuModuleLoadData", "the PTX contains a NUL byte"))?;
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: the context is bound; `ptx` is a NUL-terminated PTX image that outlives
        // the call; the driver writes one module handle.
        check("cuModuleLoadData", unsafe { sys::cuModuleLoadData(&mut module, ptx.as_ptr().cast()) })?;
        if module.is_null() {
            return Err(CudaError::invalid("cuModuleLoadData", "the driver returned a null module"));
        }
        let functions = function_of(module, c"ferrylink_copy_spans")
            .and_then(|function| Ok((function, function_of(module, c"ferrylink_copy_spans_wide")?)));
        match functions {
            Ok((function, wide)) => Ok(LoadedSpanKernel { _module: module, function, wide }),
            Err(e) => {
                // SAFETY: loaded above, nothing of it in use, unloaded once.
                let _ = unsafe { sys::cuModuleUnload(module) };
                Err(e)
            }
        }
    }
}

/// The function `name` of a loaded module.
fn function_of(module: sys::CUmodule, name: &std::ffi::CStr) -> CudaResult<sys::CUfunction> {
    let mut function: sys::CUfunction = std::ptr::null_mut();
    // SAFETY: `module` is loaded; the name is NUL-terminated; one handle written.
    check("cuModuleGetFunction", unsafe { sys::cuModuleGetFunction(&mut function, module, name.as_ptr()) })?;
    if function.is_null() {
        return Err(CudaError::invalid("cuModuleGetFunction", "the driver returned a null function"));
    }
    Ok(function)
}

fn loaded(gpu: &Gpu) -> Option<Arc<LoadedSpanKernel>> {
    static KERNELS: OnceLock<Mutex<HashMap<usize, Option<Arc<LoadedSpanKernel>>>>> = OnceLock::new();
    let mut kernels = KERNELS.get_or_init(|| Mutex::new(HashMap::new())).lock().unwrap_or_else(|p| p.into_inner());
    kernels
        .entry(gpu.ordinal())
        .or_insert_with(|| match LoadedSpanKernel::load(gpu) {
            Ok(k) => Some(Arc::new(k)),
            Err(e) => {
                tracing::warn!(device = gpu.ordinal(), error = %e, "the span kernel did not load; spans copy one by one");
                None
            }
        })
        .clone()
}

/// Whether the span kernel loads on `gpu` (its PTX compiled by the driver); without it,
/// batches copy entry by entry.
pub fn kernel_available(gpu: &Gpu) -> bool {
    loaded(gpu).is_some()
}

/// Copies listed for one launch on a device: each `(dst, src, len)` written into the
/// pinned table as it is pushed (no intermediate list); [`SpanBatch::launch`] enqueues
/// them.
pub struct SpanBatch {
    gpu: Gpu,
    host: HostTable,
    entries: usize,
    /// The longest entry's bytes.
    longest: u64,
}

impl SpanBatch {
    /// A batch for `gpu` with room for `entries` entries (it grows past them).
    pub fn with_capacity(gpu: &Gpu, entries: usize) -> SpanBatch {
        SpanBatch {
            gpu: gpu.clone(),
            host: HostTable::with_capacity(gpu, entries.max(1) * ENTRY_BYTES),
            entries: 0,
            longest: 0,
        }
    }

    /// Entries the host table holds.
    fn capacity(&self) -> usize {
        self.host.bytes().len() / ENTRY_BYTES
    }

    /// Makes room for `more` entries beyond those pushed.
    pub fn reserve(&mut self, more: usize) {
        let need = self.entries.saturating_add(more);
        if need <= self.capacity() {
            return;
        }
        let mut bigger = HostTable::with_capacity(&self.gpu, need.saturating_mul(2).saturating_mul(ENTRY_BYTES));
        let used = self.entries * ENTRY_BYTES;
        bigger.bytes_mut()[..used].copy_from_slice(&self.host.bytes()[..used]);
        self.host = bigger;
    }

    /// Adds a copy of `len` bytes from `src` to `dst`; an empty one is left out.
    pub fn push(&mut self, dst: u64, src: u64, len: u64) {
        self.push_each(1, |_| (dst, src, len));
    }

    /// [`SpanBatch::push_all`] of entries that cannot fail.
    fn push_each(&mut self, n: usize, mut entry: impl FnMut(usize) -> (u64, u64, u64)) {
        let pushed: Result<(), std::convert::Infallible> = self.push_all(n, |i| Ok(entry(i)));
        if let Err(never) = pushed {
            match never {}
        }
    }

    /// Adds `n` copies, the `i`-th `(dst, src, len)` given by `entry(i)` (empty ones left
    /// out), writing them straight into the table: room is made once, not per entry (a
    /// loop of `push` took 4.5–7.9 µs for 1000 entries on the H200, the same writes in
    /// one pass 0.6 µs). The first error of `entry` stops it and is returned; the
    /// entries before it stay.
    pub fn push_all<E>(
        &mut self,
        n: usize,
        mut entry: impl FnMut(usize) -> Result<(u64, u64, u64), E>,
    ) -> Result<(), E> {
        self.reserve(n);
        let mut written = self.entries;
        let mut longest = self.longest;
        let table = self.host.bytes_mut();
        let mut result = Ok(());
        for i in 0..n {
            let (dst, src, len) = match entry(i) {
                Ok(e) => e,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            if len == 0 {
                continue;
            }
            // `reserve` made room for `n` more.
            let at = written * ENTRY_BYTES;
            let slot = &mut table[at..at + ENTRY_BYTES];
            slot[..8].copy_from_slice(&dst.to_ne_bytes());
            slot[8..16].copy_from_slice(&src.to_ne_bytes());
            slot[16..].copy_from_slice(&len.to_ne_bytes());
            written += 1;
            longest = longest.max(len);
        }
        self.entries = written;
        self.longest = longest;
        result
    }

    /// The one entry `(dst, src, len)`, when exactly one was pushed.
    pub fn only_entry(&self) -> Option<(u64, u64, u64)> {
        (self.entries == 1).then(|| entry_of(self.host.bytes(), 0))
    }

    /// Entries pushed (empty ones left out).
    pub fn len(&self) -> usize {
        self.entries
    }

    /// Whether no entry was pushed.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Enqueues the copies on `stream` (of this batch's device): one launch of the span
    /// kernel when there are several and it loads, else one copy each.
    ///
    /// # Safety
    /// Every range must be valid device memory of `stream`'s device (or mapped into its
    /// context) until the stream's work completed; destinations must not overlap each
    /// other or any source.
    pub unsafe fn launch(self, stream: &Stream) -> CudaResult<SpanTable> {
        let kernel = if self.entries > 1 { loaded(stream.gpu()) } else { None };
        let Some(kernel) = kernel else {
            // SAFETY: the caller's contract.
            unsafe { copy_one_by_one(self.host.bytes(), self.entries, stream)? };
            return Ok(SpanTable { _table: None });
        };
        let bytes = self.entries * ENTRY_BYTES;
        let (device_table, table_ptr) = match self.host.device_ptr() {
            Some(in_place) => (None, in_place),
            None => {
                let table = DevicePool::shared(stream.gpu().ordinal())?.alloc(bytes)?;
                // SAFETY: `table` and the host table hold `bytes` bytes; both live in the
                // returned SpanTable until the stream's work completed.
                unsafe { memcpy_htod_async(table.device_ptr(), self.host.bytes().as_ptr(), bytes, stream)? };
                let ptr = table.device_ptr();
                (Some(table), ptr)
            }
        };
        let in_device = device_table.is_some();
        let listing = Listing { table: table_ptr, entries: self.entries, longest: self.longest, in_device };
        if let Err(e) = launch(&kernel, listing, stream) {
            // A copy of the table may still run: it stays until that did.
            if let Err(sync) = stream.synchronize() {
                tracing::warn!(error = %sync, "synchronising after a failed span kernel launch");
            }
            return Err(e);
        }
        tracing::trace!(entries = self.entries, in_place = device_table.is_none(), "span kernel launched");
        Ok(SpanTable { _table: Some(TableHeld::Once { _device: device_table, _host: self.host }) })
    }
}

impl SpanBatch {
    /// Keeps the listed entries for [`launch_listed`], any number of times. The table is
    /// copied into device memory now (and waited for), once: every launch then reads it
    /// from device memory, not across PCIe from the pinned table (each block's first
    /// read). Where device memory is refused, launches read the pinned table in place.
    pub fn keep(self) -> CudaResult<Arc<ListedSpans>> {
        let image = &self.host.bytes()[..(self.entries * ENTRY_BYTES).max(ENTRY_BYTES)];
        let copied =
            DevicePool::shared(self.gpu.ordinal()).and_then(|pool| pool.alloc(image.len())).and_then(|table| {
                // SAFETY: `table` holds `image.len()` bytes; the copy is synchronous.
                unsafe { memcpy_htod_sync(&self.gpu, table.device_ptr(), image)? };
                Ok(table)
            });
        let (device_table, table_ptr) = match (copied, self.host.device_ptr()) {
            (Ok(table), _) => {
                let ptr = table.device_ptr();
                (Some(table), ptr)
            }
            (Err(_), Some(in_place)) => (None, in_place),
            (Err(e), None) => return Err(e),
        };
        let (host, entries, longest) = (self.host, self.entries, self.longest);
        Ok(Arc::new(ListedSpans { host, entries, longest, device_table, table_ptr }))
    }
}

/// Enqueues the copies of `listed` on `stream` (of the device it was listed for): one
/// launch of the span kernel when there are several and it loads, else one copy each.
/// The returned table holds `listed` until dropped.
///
/// Callers learn of the end by a [`DoneFlag`](super::DoneFlag) recorded on `stream`
/// after it. The kernel does not write one itself: with a last-block counter (each block
/// adding to it once its threads are done, the last writing the flag) the host
/// saw 1000 × 64 KiB done 55.9 µs after the launch, against 50.0 µs with the flag
/// written by the stream after the kernel (rows of 16 blocks, H200,
/// `memory/examples/span_copy_rate`, docs/decisions/0027-span-kernel.md).
///
/// # Safety
/// As [`SpanBatch::launch`]: every range must be valid device memory of `stream`'s device
/// (or mapped into its context) until the stream's work completed; destinations must not
/// overlap each other or any source.
pub unsafe fn launch_listed(listed: &Arc<ListedSpans>, stream: &Stream) -> CudaResult<SpanTable> {
    let kernel = if listed.entries > 1 { loaded(stream.gpu()) } else { None };
    let held = SpanTable { _table: Some(TableHeld::Kept { _listed: listed.clone() }) };
    let Some(kernel) = kernel else {
        // SAFETY: the caller's contract.
        unsafe { copy_one_by_one(listed.host.bytes(), listed.entries, stream)? };
        return Ok(held);
    };
    launch(&kernel, listed.listing(), stream)?;
    tracing::trace!(entries = listed.entries, "span kernel launched on a kept table");
    Ok(held)
}

/// Copies the first `entries` entries of `table` one by one on `stream` (no kernel: one
/// entry, or the kernel did not load).
///
/// # Safety
/// As [`SpanBatch::launch`], for each entry.
unsafe fn copy_one_by_one(table: &[u8], entries: usize, stream: &Stream) -> CudaResult<()> {
    for i in 0..entries {
        let (dst, src, len) = entry_of(table, i);
        // SAFETY: the caller's contract, entry by entry.
        unsafe { copy_dtod_async(dst, src, len as usize, stream)? };
    }
    Ok(())
}

/// Entry `i` of a table's bytes.
fn entry_of(table: &[u8], i: usize) -> (u64, u64, u64) {
    let bytes = &table[i * ENTRY_BYTES..(i + 1) * ENTRY_BYTES];
    let word = |k: usize| u64::from_ne_bytes(bytes[k * 8..k * 8 + 8].try_into().unwrap_or([0; 8]));
    (word(0), word(1), word(2))
}

/// Copies each `(dst, src, len)` on `stream`'s device: in one launch of the span kernel
/// when there are several and it loads, else one copy each. Empty entries are skipped.
///
/// # Safety
/// Every range must be valid device memory of `stream`'s device (or mapped into its
/// context) until the stream's work completed; destinations must not overlap each other
/// or any source.
pub unsafe fn copy_spans_async(spans: &[(u64, u64, u64)], stream: &Stream) -> CudaResult<SpanTable> {
    let mut batch = SpanBatch::with_capacity(stream.gpu(), spans.len());
    batch.push_each(spans.len(), |i| spans[i]);
    // SAFETY: the caller's contract.
    unsafe { batch.launch(stream) }
}

/// A table to launch: its device address, its entries, its longest entry's bytes, and
/// whether it is in device memory (else mapped host memory).
#[derive(Clone, Copy)]
struct Listing {
    table: u64,
    entries: usize,
    longest: u64,
    in_device: bool,
}

/// How a listing is launched: which kernel, and the grid's columns and rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    wide: bool,
    columns: u32,
    rows: u32,
}

/// The launch for `entries` entries whose longest has `longest` bytes: a row per entry
/// (up to [`MAX_GRID_ROWS`], rows then take entries in turn) and, for a table in device
/// memory, a block per share of the longest entry in each row ([`WIDE_BLOCK_SHARE_BYTES`]
/// with the wide kernel, which runs where the longest entry fills such a share, else
/// [`BLOCK_SHARE_BYTES`]), within [`MAX_GRID_BLOCKS`] blocks in all; at least one of each.
///
/// Measured on the H200 (`memory/examples/span_copy_rate`, 1000 entries of 64 KiB, table
/// in device memory, kernel time): one block per entry 40.5 µs; rows of 8 blocks
/// 37.9 µs, of 16 40.1 µs, of 32 46.7 µs; the wide kernel's rows of 4 blocks
/// 37.3–38.6 µs against 38.0–39.7 µs for rows of 8 of the other in the same three
/// runs, and 37.3–37.9 µs with the blocks in order (the copy kernel on the same 64 MB
/// 36.3–37.9 µs); its rows of 16 (one vector per thread) 47.3–48.9 µs against 40.5–41.1
/// µs. A table in pinned
/// host memory keeps one block per entry: every block reads its entry across PCIe, and
/// rows of 16 blocks took a not-prepared batch's round trip from 204 to 320 µs.
fn shape(entries: usize, longest: u64, in_device: bool) -> Shape {
    let rows = (entries as u64).clamp(1, MAX_GRID_ROWS);
    let wide = in_device && longest >= WIDE_BLOCK_SHARE_BYTES;
    let share = if wide { WIDE_BLOCK_SHARE_BYTES } else { BLOCK_SHARE_BYTES };
    let columns = match in_device {
        true => longest.div_ceil(share).clamp(1, (MAX_GRID_BLOCKS / rows).max(1)),
        false => 1,
    };
    // Both are at most 2^16 by the clamps.
    Shape { wide, columns: columns as u32, rows: rows as u32 }
}

/// Launches the span kernel over the table of `listing` on `stream`.
fn launch(kernel: &LoadedSpanKernel, listing: Listing, stream: &Stream) -> CudaResult<()> {
    stream.gpu().bind_to_current_thread()?;
    let mut p_table = listing.table;
    let mut p_count = listing.entries as u64;
    let mut params: [*mut c_void; 2] = [(&mut p_table as *mut u64).cast(), (&mut p_count as *mut u64).cast()];
    let Shape { wide, columns, rows } = shape(listing.entries, listing.longest, listing.in_device);
    let function = if wide { kernel.wide } else { kernel.function };
    // SAFETY: the function belongs to the bound context; `params` points at two u64
    // matching the kernel's parameters, read during the call; the table is readable by
    // the device before the kernel runs (written on the host before the launch, or
    // copied on the same stream); the memory contract is the caller's.
    unsafe { launch_kernel(function, (columns, rows), THREADS_PER_BLOCK, stream, &mut params) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid(entries: usize, longest: u64, in_device: bool) -> (bool, u32, u32) {
        let Shape { wide, columns, rows } = shape(entries, longest, in_device);
        (wide, columns, rows)
    }

    #[test]
    fn a_row_per_entry_and_a_block_per_share_of_the_longest() {
        // The one-sided benchmark's batch: 1000 rows of 4 blocks of the wide kernel (256 threads, four
        // 16-byte loads each).
        assert_eq!(grid(1000, 64 << 10, true), (true, 4, 1000));
        // Short entries still get a block; an empty listing one block in all.
        assert_eq!(grid(3, 1, true), (false, 1, 3));
        assert_eq!(grid(0, 0, true), (false, 1, 1));
        // Entries shorter than a wide share: the other kernel, a block per 8 KiB; a
        // partial share gets its block.
        assert_eq!(grid(2, BLOCK_SHARE_BYTES + 1, true), (false, 2, 2));
        assert_eq!(grid(2, WIDE_BLOCK_SHARE_BYTES - 1, true), (false, 2, 2));
        assert_eq!(grid(2, WIDE_BLOCK_SHARE_BYTES, true), (true, 1, 2));
        assert_eq!(grid(2, WIDE_BLOCK_SHARE_BYTES + 1, true), (true, 2, 2));
        // A table in host memory: one block per entry of the other kernel, whatever its
        // length.
        assert_eq!(grid(1000, 64 << 10, false), (false, 1, 1000));
    }

    #[test]
    fn grids_stay_within_the_block_and_row_limits() {
        for (entries, longest) in [(2, 1u64 << 40), (1 << 20, 1 << 30), (70_000, 8), (65_535, u64::MAX), (1, u64::MAX)]
        {
            for in_device in [true, false] {
                let (_, columns, rows) = grid(entries, longest, in_device);
                let blocks = u64::from(columns) * u64::from(rows);
                assert!(columns >= 1 && rows >= 1, "{entries} × {longest}");
                assert!(u64::from(rows) <= MAX_GRID_ROWS, "{entries} × {longest}: {rows} rows");
                assert!(blocks <= MAX_GRID_BLOCKS.max(MAX_GRID_ROWS), "{entries} × {longest}: {blocks} blocks");
            }
        }
        // Two long entries share the blocks between them.
        assert_eq!(grid(2, 1 << 40, true), (true, (MAX_GRID_BLOCKS / 2) as u32, 2));
    }
}
