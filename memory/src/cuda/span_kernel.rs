//! Many copies of one device in one launch: a gather/scatter kernel over a table of
//! (destination, source, length) entries, one block per entry in turn (16-byte loads and
//! stores where both ends are 16-byte aligned, bytes for the rest).
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
use super::done_flag::DoneFlag;
use super::error::{check, CudaError, CudaResult};
use super::pool::DevicePool;
use super::span_table::{HostTable, ENTRY_BYTES};
use super::stream::Stream;
use crate::DeviceBuffer;
use cudarc::driver::sys;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

/// The kernel: `table` holds `count` entries of three u64 (dst, src, len).
pub const SPAN_KERNEL_PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry ferrylink_copy_spans(
    .param .u64 p_table,
    .param .u64 p_count,
    .param .u64 p_flag,
    .param .u64 p_counter,
    .param .u32 p_value
)
{
    .reg .pred %p<6>;
    .reg .b32 %r<10>;
    .reg .b32 %v<4>;
    .reg .b64 %rd<32>;

    ld.param.u64 %rd1, [p_table];
    ld.param.u64 %rd2, [p_count];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %nctaid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %ntid.x;
    cvt.u64.u32 %rd3, %r1;
    cvt.u64.u32 %rd4, %r2;
    cvt.u64.u32 %rd5, %r3;
    cvt.u64.u32 %rd6, %r4;
    mov.u64 %rd22, 0;

SPAN:
    setp.ge.u64 %p1, %rd3, %rd2;
    @%p1 bra DONE;
    mul.lo.u64 %rd7, %rd3, 24;
    add.u64 %rd8, %rd1, %rd7;
    ld.global.u64 %rd9, [%rd8];
    ld.global.u64 %rd10, [%rd8+8];
    ld.global.u64 %rd11, [%rd8+16];
    or.b64 %rd12, %rd9, %rd10;
    and.b64 %rd12, %rd12, 15;
    setp.eq.u64 %p2, %rd12, 0;
    shr.u64 %rd13, %rd11, 4;
    selp.b64 %rd13, %rd13, %rd22, %p2;
    mov.u64 %rd14, %rd5;

VEC:
    setp.ge.u64 %p3, %rd14, %rd13;
    @%p3 bra TAIL;
    shl.b64 %rd15, %rd14, 4;
    add.u64 %rd16, %rd10, %rd15;
    add.u64 %rd17, %rd9, %rd15;
    ld.global.v4.u32 {%v0, %v1, %v2, %v3}, [%rd16];
    st.global.v4.u32 [%rd17], {%v0, %v1, %v2, %v3};
    add.u64 %rd14, %rd14, %rd6;
    bra VEC;

TAIL:
    shl.b64 %rd18, %rd13, 4;
    add.u64 %rd19, %rd18, %rd5;

BYTE:
    setp.ge.u64 %p4, %rd19, %rd11;
    @%p4 bra NEXT;
    add.u64 %rd20, %rd10, %rd19;
    add.u64 %rd21, %rd9, %rd19;
    ld.global.u8 %r5, [%rd20];
    st.global.u8 [%rd21], %r5;
    add.u64 %rd19, %rd19, %rd6;
    bra BYTE;

NEXT:
    add.u64 %rd3, %rd3, %rd4;
    bra SPAN;

DONE:
    ld.param.u64 %rd30, [p_flag];
    setp.eq.u64 %p5, %rd30, 0;
    @%p5 bra EXIT;
    bar.sync 0;
    setp.ne.u32 %p5, %r3, 0;
    @%p5 bra EXIT;
    ld.param.u64 %rd31, [p_counter];
    membar.gl;
    atom.global.add.u32 %r6, [%rd31], 1;
    sub.u32 %r7, %r2, 1;
    setp.ne.u32 %p5, %r6, %r7;
    @%p5 bra EXIT;
    membar.gl;
    st.global.u32 [%rd31], 0;
    ld.param.u32 %r8, [p_value];
    membar.sys;
    st.volatile.global.u32 [%rd30], %r8;

EXIT:
    ret;
}
"#;

const THREADS_PER_BLOCK: u32 = 256;
/// Blocks at most (entries beyond are taken in turn by the same blocks).
const MAX_BLOCKS: u32 = 4096;

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
    /// The device copy of the table, where the kernel cannot read the pinned one in place.
    _device_table: Option<DeviceBuffer>,
    /// The table's device address for the kernel.
    table_ptr: u64,
    /// The word after the table in its device copy: the last block's counter for a
    /// kernel-written completion flag (none without a device copy).
    counter: Option<u64>,
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
}

struct LoadedSpanKernel {
    _module: sys::CUmodule,
    function: sys::CUfunction,
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
        let mut function: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: `module` was just loaded; the name is NUL-terminated; one handle written.
        let res = unsafe { sys::cuModuleGetFunction(&mut function, module, c"ferrylink_copy_spans".as_ptr()) };
        if let Err(e) = check("cuModuleGetFunction", res).and_then(|()| {
            if function.is_null() {
                Err(CudaError::invalid("cuModuleGetFunction", "the driver returned a null function"))
            } else {
                Ok(())
            }
        }) {
            // SAFETY: loaded above, nothing of it in use, unloaded once.
            let _ = unsafe { sys::cuModuleUnload(module) };
            return Err(e);
        }
        Ok(LoadedSpanKernel { _module: module, function })
    }
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
}

impl SpanBatch {
    /// A batch for `gpu` with room for `entries` entries (it grows past them).
    pub fn with_capacity(gpu: &Gpu, entries: usize) -> SpanBatch {
        SpanBatch { gpu: gpu.clone(), host: HostTable::with_capacity(gpu, entries.max(1) * ENTRY_BYTES), entries: 0 }
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
        }
        self.entries = written;
        result
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
        if let Err(e) = launch(&kernel, (table_ptr, self.entries), None, stream) {
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
        // The entries, then the counter word (zero).
        let mut image = self.host.bytes()[..self.entries * ENTRY_BYTES].to_vec();
        image.extend_from_slice(&[0; 8]);
        let copied =
            DevicePool::shared(self.gpu.ordinal()).and_then(|pool| pool.alloc(image.len())).and_then(|table| {
                // SAFETY: `table` holds `image.len()` bytes; the copy is synchronous.
                unsafe { memcpy_htod_sync(&self.gpu, table.device_ptr(), &image)? };
                Ok(table)
            });
        let (device_table, table_ptr, counter) = match (copied, self.host.device_ptr()) {
            (Ok(table), _) => {
                let ptr = table.device_ptr();
                (Some(table), ptr, Some(ptr + (self.entries * ENTRY_BYTES) as u64))
            }
            (Err(_), Some(in_place)) => (None, in_place, None),
            (Err(e), None) => return Err(e),
        };
        let (host, entries) = (self.host, self.entries);
        Ok(Arc::new(ListedSpans { host, entries, _device_table: device_table, table_ptr, counter }))
    }
}

/// Enqueues the copies of `listed` on `stream` (of the device it was listed for): one
/// launch of the span kernel when there are several and it loads, else one copy each.
/// With `done`, the flag is set once the copies are done: written by the kernel's last
/// block where it can (no stream operation after the launch), else recorded on `stream`
/// after them. The returned table holds `listed` until dropped.
///
/// # Safety
/// As [`SpanBatch::launch`]: every range must be valid device memory of `stream`'s device
/// (or mapped into its context) until the stream's work completed; destinations must not
/// overlap each other or any source. Launches of one `listed` with a flag must not run
/// at the same time (they share its counter): launch it on one stream.
pub unsafe fn launch_listed(
    listed: &Arc<ListedSpans>,
    stream: &Stream,
    done: Option<&mut DoneFlag>,
) -> CudaResult<SpanTable> {
    let kernel = if listed.entries > 1 { loaded(stream.gpu()) } else { None };
    let held = SpanTable { _table: Some(TableHeld::Kept { _listed: listed.clone() }) };
    let Some(kernel) = kernel else {
        // SAFETY: the caller's contract.
        unsafe { copy_one_by_one(listed.host.bytes(), listed.entries, stream)? };
        if let Some(flag) = done {
            flag.record(stream)?;
        }
        return Ok(held);
    };
    match (done, listed.counter) {
        (Some(flag), Some(counter)) => {
            let (address, value) = flag.arm_for_kernel();
            launch(
                &kernel,
                (listed.table_ptr, listed.entries),
                Some(KernelFlag { flag: address, counter, value }),
                stream,
            )?;
        }
        (done, _) => {
            launch(&kernel, (listed.table_ptr, listed.entries), None, stream)?;
            if let Some(flag) = done {
                flag.record(stream)?;
            }
        }
    }
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

/// Where a launch's last block writes `value` once every block's copies are done: the
/// flag's device address and a counter word in device memory (0 between launches; the
/// last block puts it back).
#[derive(Clone, Copy)]
struct KernelFlag {
    flag: u64,
    counter: u64,
    value: u32,
}

/// Launches the span kernel over the `entries` of the table at `table` (device or
/// mapped host memory) on `stream`; with `flag`, its last block writes the flag.
fn launch(
    kernel: &LoadedSpanKernel,
    (table, entries): (u64, usize),
    flag: Option<KernelFlag>,
    stream: &Stream,
) -> CudaResult<()> {
    stream.gpu().bind_to_current_thread()?;
    let mut p_table = table;
    let mut p_count = entries as u64;
    let KernelFlag { flag: mut p_flag, counter: mut p_counter, value: mut p_value } =
        flag.unwrap_or(KernelFlag { flag: 0, counter: 0, value: 0 });
    let mut params: [*mut c_void; 5] = [
        (&mut p_table as *mut u64).cast(),
        (&mut p_count as *mut u64).cast(),
        (&mut p_flag as *mut u64).cast(),
        (&mut p_counter as *mut u64).cast(),
        (&mut p_value as *mut u32).cast(),
    ];
    let blocks = u32::try_from(entries).unwrap_or(MAX_BLOCKS).clamp(1, MAX_BLOCKS);
    // SAFETY: the function belongs to the bound context; `params` points at four u64
    // and a u32 matching the kernel's parameters, read during the call; the table is readable by
    // the device before the kernel runs (written on the host before the launch, or
    // copied on the same stream); the memory contract is the caller's.
    check("cuLaunchKernel", unsafe {
        sys::cuLaunchKernel(
            kernel.function,
            blocks,
            1,
            1,
            THREADS_PER_BLOCK,
            1,
            1,
            0,
            stream.raw(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    })
}
