//! The kernels and copy calls `span_copy_rate` compares: the transport's span and copy
//! kernels' PTX (and the first span kernel, `span_kernel_v1.ptx`: one block per
//! entry; the copy kernel's earlier grid) with other cache hints and launch shapes, and
//! `cuMemcpyBatchAsync`.

use super::Error;
use cudarc::driver::sys;
use ferrylink_memory::cuda::copy::memcpy_htod_sync;
use ferrylink_memory::cuda::copy_kernel::KERNEL_PTX;
use ferrylink_memory::cuda::span_kernel::SPAN_KERNEL_PTX;
use ferrylink_memory::cuda::{DevicePool, DoneFlag, Event, Gpu, Stream};
use ferrylink_memory::DeviceBuffer;
use std::ffi::c_void;

pub fn check(what: &str, res: sys::CUresult) -> Result<(), Error> {
    if res == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: {res:?}").into())
    }
}

/// Cache hints on the 16-byte loads and stores.
#[derive(Clone, Copy)]
pub enum Hints {
    /// As the transport's kernels.
    None,
    /// `ld.global.cs` / `st.global.cs`: streaming, evict first.
    Streaming,
    /// `ld.global.nc`: loads through the read-only (non-coherent) path.
    ReadOnly,
}

impl Hints {
    pub fn name(self) -> &'static str {
        match self {
            Hints::None => "plain",
            Hints::Streaming => "cs",
            Hints::ReadOnly => "nc",
        }
    }

    fn apply(self, ptx: &str) -> String {
        let (load, store) = match self {
            Hints::None => return ptx.to_string(),
            Hints::Streaming => ("ld.global.cs.v4.u32", "st.global.cs.v4.u32"),
            Hints::ReadOnly => ("ld.global.nc.v4.u32", "st.global.v4.u32"),
        };
        ptx.replace("ld.global.v4.u32", load).replace("st.global.v4.u32", store)
    }
}

fn load_function(gpu: &Gpu, ptx: &str, name: &std::ffi::CStr) -> Result<(sys::CUmodule, sys::CUfunction), Error> {
    gpu.bind_to_current_thread()?;
    let text = std::ffi::CString::new(ptx)?;
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: the context is bound; the PTX is NUL-terminated and outlives the call.
    check("cuModuleLoadData", unsafe { sys::cuModuleLoadData(&mut module, text.as_ptr().cast()) })?;
    let mut function: sys::CUfunction = std::ptr::null_mut();
    // SAFETY: the module was just loaded; the name is NUL-terminated.
    check("cuModuleGetFunction", unsafe { sys::cuModuleGetFunction(&mut function, module, name.as_ptr()) })?;
    Ok((module, function))
}

/// # Safety
/// `params` match the function's parameters; the memory they name is valid until the
/// stream's work completed.
unsafe fn launch(
    function: sys::CUfunction,
    (columns, rows): (u32, u32),
    threads: u32,
    stream: &Stream,
    params: &mut [*mut c_void],
) -> Result<(), Error> {
    // SAFETY: the caller's contract.
    let res = unsafe {
        sys::cuLaunchKernel(
            function,
            columns,
            rows,
            1,
            threads,
            1,
            1,
            0,
            stream.raw(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    check("cuLaunchKernel", res)
}

/// The first span kernel: one block per entry.
const SPAN_KERNEL_V1_PTX: &str = include_str!("span_kernel_v1.ptx");

/// Which span kernel's PTX.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// The first span kernel: one block per entry, five parameters.
    V1,
    /// The transport's `ferrylink_copy_spans`: a load and a store at a time per thread.
    Span,
    /// The transport's `ferrylink_copy_spans_wide`: up to four loads of a thread in
    /// flight before its stores.
    Wide,
}

/// How a span kernel variant is built and launched.
#[derive(Clone, Copy)]
pub struct SpanShape {
    /// Which kernel (`V1`: `columns` is 1).
    pub kernel: Kernel,
    pub hints: Hints,
    pub threads: u32,
    /// Blocks per entry (the grid's x).
    pub columns: u32,
    /// The table in pinned host memory, read in place (else device memory).
    pub pinned: bool,
    /// How the host learns the launch ended.
    pub done: Done,
}

impl SpanShape {
    pub fn name(&self) -> String {
        let kernel = match self.kernel {
            Kernel::V1 => "v1",
            Kernel::Span => "span",
            Kernel::Wide => "wide",
        };
        let table = if self.pinned { " pinned" } else { "" };
        format!("{kernel} {} {}x{}{table}{}", self.hints.name(), self.columns, self.threads, self.done.suffix())
    }
}

/// How the host learns that queued work ended, beyond the timing events.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Done {
    /// `cuStreamSynchronize` only.
    Sync,
    /// A completion flag recorded after the work, spun on.
    Flag,
    /// An event recorded after the work, `cuEventQuery` spun on.
    Event,
}

impl Done {
    pub fn suffix(self) -> &'static str {
        match self {
            Done::Sync => "",
            Done::Flag => " +flag",
            Done::Event => " +event",
        }
    }
}

/// A flag and an event to wait on work with.
pub struct Waiter {
    flag: DoneFlag,
    event: Event,
}

impl Waiter {
    pub fn new(gpu: &Gpu) -> Result<Waiter, Error> {
        Ok(Waiter { flag: DoneFlag::acquire(gpu)?, event: Event::new(gpu)? })
    }

    /// Records `done`'s mark after the work queued on `stream` and spins until it is seen.
    pub fn finish(&mut self, stream: &Stream, done: Done) -> Result<(), Error> {
        match done {
            Done::Sync => return Ok(()),
            Done::Flag => self.flag.record(stream)?,
            Done::Event => self.event.record(stream)?,
        }
        let started = std::time::Instant::now();
        let seen = || -> Result<bool, Error> {
            match done {
                Done::Flag => Ok(self.flag.is_set()),
                _ => Ok(self.event.query()?),
            }
        };
        while !seen()? {
            if started.elapsed() > std::time::Duration::from_secs(5) {
                return Err("the work's end was not seen in 5 s".into());
            }
            std::hint::spin_loop();
        }
        Ok(())
    }
}

/// A table of entries where a kernel reads it: device memory, or pinned host memory
/// mapped for the device (`cuMemHostAlloc` with `CU_MEMHOSTALLOC_DEVICEMAP`).
enum Table {
    Device(DeviceBuffer),
    Pinned { host: *mut c_void, device: u64 },
}

impl Table {
    fn new(gpu: &Gpu, image: &[u8], pinned: bool) -> Result<Table, Error> {
        if !pinned {
            let table = DevicePool::shared(gpu.ordinal())?.alloc(image.len())?;
            // SAFETY: `table` holds the image's length of this device.
            unsafe { memcpy_htod_sync(gpu, table.device_ptr(), image)? };
            return Ok(Table::Device(table));
        }
        gpu.bind_to_current_thread()?;
        let mut host: *mut c_void = std::ptr::null_mut();
        // SAFETY: the context is bound; the driver writes one pointer.
        check("cuMemHostAlloc", unsafe {
            sys::cuMemHostAlloc(&mut host, image.len(), sys::CU_MEMHOSTALLOC_DEVICEMAP)
        })?;
        // SAFETY: `host` holds `image.len()` bytes just allocated.
        unsafe { std::ptr::copy_nonoverlapping(image.as_ptr(), host.cast::<u8>(), image.len()) };
        let mut device = 0u64;
        // SAFETY: `host` is mapped pinned memory of the bound context; one address written.
        let mapped =
            check("cuMemHostGetDevicePointer", unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host, 0) });
        if let Err(e) = mapped {
            // SAFETY: allocated above, unused.
            unsafe { sys::cuMemFreeHost(host) };
            return Err(e);
        }
        Ok(Table::Pinned { host, device })
    }

    fn device_ptr(&self) -> u64 {
        match self {
            Table::Device(buffer) => buffer.device_ptr(),
            Table::Pinned { device, .. } => *device,
        }
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        if let Table::Pinned { host, .. } = self {
            // SAFETY: allocated by cuMemHostAlloc; every launch reading it was waited for.
            unsafe { sys::cuMemFreeHost(*host) };
        }
    }
}

/// A span kernel's PTX with its hints, over a table in device or pinned memory.
pub struct SpanVariant {
    _module: sys::CUmodule,
    function: sys::CUfunction,
    table: Table,
    entries: u64,
    shape: SpanShape,
    waiter: Waiter,
}

impl SpanVariant {
    pub fn load(gpu: &Gpu, entries: &[(u64, u64, u64)], shape: SpanShape) -> Result<SpanVariant, Error> {
        let (ptx, name) = match shape.kernel {
            Kernel::V1 => (SPAN_KERNEL_V1_PTX, c"ferrylink_copy_spans"),
            Kernel::Span => (SPAN_KERNEL_PTX, c"ferrylink_copy_spans"),
            Kernel::Wide => (SPAN_KERNEL_PTX, c"ferrylink_copy_spans_wide"),
        };
        let (module, function) = load_function(gpu, &shape.hints.apply(ptx), name)?;
        let image: Vec<u8> = entries.iter().flat_map(|&(d, s, l)| [d, s, l]).flat_map(u64::to_ne_bytes).collect();
        let table = Table::new(gpu, &image, shape.pinned)?;
        let waiter = Waiter::new(gpu)?;
        Ok(SpanVariant { _module: module, function, table, entries: entries.len() as u64, shape, waiter })
    }

    /// Launches, then waits as the shape says.
    pub fn launch(&mut self, stream: &Stream) -> Result<(), Error> {
        // v1's flag, counter and value: none.
        let (mut table, mut count, mut none, mut none2, mut value) =
            (self.table.device_ptr(), self.entries, 0u64, 0u64, 0u32);
        let mut params: [*mut c_void; 5] = [
            (&mut table as *mut u64).cast(),
            (&mut count as *mut u64).cast(),
            (&mut none as *mut u64).cast(),
            (&mut none2 as *mut u64).cast(),
            (&mut value as *mut u32).cast(),
        ];
        let rows = self.entries.min(65_535) as u32;
        let (grid, used) =
            if self.shape.kernel == Kernel::V1 { ((rows, 1), 5) } else { ((self.shape.columns, rows), 2) };
        // SAFETY: the parameters the kernel takes (v1: four u64 and a u32, else two u64);
        // the table and the memory the entries name live until the caller synchronised
        // the stream.
        unsafe { launch(self.function, grid, self.shape.threads, stream, &mut params[..used])? };
        self.waiter.finish(stream, self.shape.done)
    }
}

/// The copy kernel as it was first launched: at most 8 blocks per multiprocessor, each
/// thread looping over the copy.
pub struct OldGridCopy {
    _module: sys::CUmodule,
    function: sys::CUfunction,
    max_blocks: u64,
}

impl OldGridCopy {
    pub const NAME: &'static str = "copy kernel 8/SM (first grid)";

    pub fn load(gpu: &Gpu) -> Result<OldGridCopy, Error> {
        let (module, function) = load_function(gpu, KERNEL_PTX, c"ferrylink_copy")?;
        Ok(OldGridCopy { _module: module, function, max_blocks: 8 * u64::from(multiprocessors(gpu)?) })
    }

    /// Copies `len` bytes (a multiple of 16, both ends 16-byte aligned).
    pub fn launch(&self, dst: u64, src: u64, len: usize, stream: &Stream) -> Result<(), Error> {
        let (mut d, mut s, mut n16) = (dst, src, (len / 16) as u64);
        let (mut tail_off, mut tail_len) = (n16 * 16, (len % 16) as u64);
        let blocks = n16.div_ceil(256).clamp(1, self.max_blocks) as u32;
        let mut params: [*mut c_void; 5] = [
            (&mut d as *mut u64).cast(),
            (&mut s as *mut u64).cast(),
            (&mut n16 as *mut u64).cast(),
            (&mut tail_off as *mut u64).cast(),
            (&mut tail_len as *mut u64).cast(),
        ];
        // SAFETY: five u64 as the kernel takes; the caller keeps both ranges valid until
        // it synchronised the stream.
        unsafe { launch(self.function, (blocks, 1), 256, stream, &mut params) }
    }
}

/// The whole batch in one `cuMemcpyBatchAsync` (the copy engines), ordered after the
/// stream's earlier work.
pub fn memcpy_batch(entries: &[(u64, u64, u64)], gpu: &Gpu, stream: &Stream) -> Result<(), Error> {
    let mut version = 0i32;
    // SAFETY: one int written.
    check("cuDriverGetVersion", unsafe { sys::cuDriverGetVersion(&mut version) })?;
    if version < 12080 {
        return Err(format!("the driver ({version}) predates cuMemcpyBatchAsync (12.8)").into());
    }
    batch::copy(entries, gpu, stream)
}

/// `cuMemcpyBatchAsync` in the bindings of CUDA 12.8 and later: the 12.x function reports
/// the failing entry, the 13.x one (`_v2`) does not.
#[cfg(any(
    feature = "cuda-12080",
    feature = "cuda-12090",
    feature = "cuda-13000",
    feature = "cuda-13010",
    feature = "cuda-13020",
    feature = "cuda-13030",
    feature = "cuda-13040"
))]
mod batch {
    use super::{check, Error};
    use cudarc::driver::sys;
    use ferrylink_memory::cuda::{Gpu, Stream};

    pub fn copy(entries: &[(u64, u64, u64)], gpu: &Gpu, stream: &Stream) -> Result<(), Error> {
        let mut dsts: Vec<u64> = entries.iter().map(|e| e.0).collect();
        let mut srcs: Vec<u64> = entries.iter().map(|e| e.1).collect();
        let mut sizes: Vec<usize> = entries.iter().map(|e| e.2 as usize).collect();
        let device = device_location(gpu.ordinal() as i32);
        let mut attrs = [sys::CUmemcpyAttributes {
            srcAccessOrder: sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
            srcLocHint: device,
            dstLocHint: device,
            flags: 0,
        }];
        let mut attr_index = [0usize];
        #[cfg(any(feature = "cuda-12080", feature = "cuda-12090"))]
        {
            let mut fail_index = usize::MAX;
            // SAFETY: three arrays of `entries.len()` elements, one attribute applying from
            // entry 0; every range lies in memory the caller keeps until the stream is waited
            // for; one index written.
            let res = unsafe {
                sys::cuMemcpyBatchAsync(
                    dsts.as_mut_ptr(),
                    srcs.as_mut_ptr(),
                    sizes.as_mut_ptr(),
                    entries.len(),
                    attrs.as_mut_ptr(),
                    attr_index.as_mut_ptr(),
                    1,
                    &mut fail_index,
                    stream.raw(),
                )
            };
            check("cuMemcpyBatchAsync", res).map_err(|e| format!("{e} (entry {fail_index})").into())
        }
        #[cfg(not(any(feature = "cuda-12080", feature = "cuda-12090")))]
        {
            // SAFETY: three arrays of `entries.len()` elements, one attribute applying from
            // entry 0; every range lies in memory the caller keeps until the stream is waited
            // for.
            let res = unsafe {
                sys::cuMemcpyBatchAsync_v2(
                    dsts.as_mut_ptr(),
                    srcs.as_mut_ptr(),
                    sizes.as_mut_ptr(),
                    entries.len(),
                    attrs.as_mut_ptr(),
                    attr_index.as_mut_ptr(),
                    1,
                    stream.raw(),
                )
            };
            check("cuMemcpyBatchAsync", res)
        }
    }

    /// The device as a memory location, in every CUDA version of the bindings (13.2 moved
    /// `id` into a union whose first member it is; the layout stayed the same).
    fn device_location(id: std::ffi::c_int) -> sys::CUmemLocation {
        #[repr(C)]
        struct Location {
            type_: sys::CUmemLocationType,
            id: std::ffi::c_int,
        }
        let type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        // SAFETY: both are `repr(C)`: the same enum, then a C int or a 4-byte union that
        // starts with it; `transmute` checks the sizes.
        unsafe { std::mem::transmute::<Location, sys::CUmemLocation>(Location { type_, id }) }
    }
}

/// Older bindings (or a version from `cuda-version-from-build-system`) have no
/// `cuMemcpyBatchAsync`.
#[cfg(not(any(
    feature = "cuda-12080",
    feature = "cuda-12090",
    feature = "cuda-13000",
    feature = "cuda-13010",
    feature = "cuda-13020",
    feature = "cuda-13030",
    feature = "cuda-13040"
)))]
mod batch {
    use super::Error;
    use ferrylink_memory::cuda::{Gpu, Stream};

    pub fn copy(_: &[(u64, u64, u64)], _: &Gpu, _: &Stream) -> Result<(), Error> {
        Err("built against CUDA bindings without cuMemcpyBatchAsync (choose cuda-12080 or later)".into())
    }
}

fn multiprocessors(gpu: &Gpu) -> Result<u32, Error> {
    let mut value = 0i32;
    let attribute = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
    // SAFETY: one int written for a valid device handle.
    check("cuDeviceGetAttribute", unsafe { sys::cuDeviceGetAttribute(&mut value, attribute, gpu.raw_device()) })?;
    Ok(value.max(1) as u32)
}
