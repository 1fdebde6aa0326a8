//! cudarc interop: a `CudaSlice<T>` of any `T: DeviceRepr` becomes a [`DeviceBuffer`]
//! (no copy, no synchronize: the send orders itself after the slice's stream) and comes
//! back out with [`DeviceBuffer::into_cuda_slice`]; a `DeviceBuffer` is a cudarc
//! `DevicePtr`/`DevicePtrMut`, so cudarc kernels launch on received memory directly.
//!
//! Imported memory is never wrapped in a `CudaSlice`: cudarc would free it on drop
//! instead of closing the mapping. `DeviceBuffer` implements cudarc's traits instead.

use super::error::{available, from_driver, CudaResult};
use crate::{DeviceBuffer, DeviceMemoryOwner};
use cudarc::driver::{sys, CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, DeviceSlice};
use cudarc::driver::{LaunchArgs, PushKernelArg, SyncOnDrop};
use std::any::Any;
use std::sync::{Arc, Mutex, OnceLock};

/// Keeps a cudarc slice alive for the buffers made from it; gives it back when asked.
struct SliceOwner<T: DeviceRepr> {
    slice: Mutex<Option<CudaSlice<T>>>,
    bytes: usize,
    ordinal: usize,
}

impl<T: DeviceRepr + Send + Sync + 'static> DeviceMemoryOwner for SliceOwner<T> {
    fn describe(&self) -> String {
        format!("cudarc CudaSlice<{}> ({} B, device {})", std::any::type_name::<T>(), self.bytes, self.ordinal)
    }
    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

/// Wraps a cudarc slice without a copy; cudarc frees it when the buffer (and every
/// buffer carved from the same owner) is gone, or [`DeviceBuffer::into_cuda_slice`]
/// gives it back. The buffer's producer stream is the slice's own stream, made to wait
/// for the slice's last write on any other stream first: a send of the buffer is ordered
/// after that work on the GPU (no synchronize here or on the progress thread).
pub fn from_cuda_slice<T: DeviceRepr + Send + Sync + 'static>(slice: CudaSlice<T>) -> CudaResult<DeviceBuffer> {
    available()?;
    let stream = slice.stream().clone();
    let ptr = {
        // `device_ptr` makes `stream` wait for the slice's last write (cudarc's events);
        // the record it returns marks this (empty) read.
        let (ptr, _record) = slice.device_ptr(&stream);
        ptr
    };
    let bytes = slice.num_bytes();
    let ordinal = slice.ordinal();
    let owner = Arc::new(SliceOwner { slice: Mutex::new(Some(slice)), bytes, ordinal });
    // SAFETY: `ptr..ptr+bytes` is the slice's device memory on `ordinal`; the owner keeps
    // the slice (and so the memory) alive, and the slice is not reachable elsewhere.
    let buf = unsafe { DeviceBuffer::from_raw_parts(ptr, bytes, ordinal, owner) };
    Ok(buf.produced_on(&stream))
}

impl DeviceBuffer {
    /// The cudarc slice this buffer was made from ([`from_cuda_slice`]), when it covers
    /// all of it, is of element type `T` and no other buffer shares its owner; otherwise
    /// the buffer itself comes back.
    pub fn into_cuda_slice<T: DeviceRepr + Send + Sync + 'static>(self) -> Result<CudaSlice<T>, DeviceBuffer> {
        let taken = {
            let owner = self.owner();
            let whole = Arc::strong_count(owner) == 1;
            match owner.as_any().and_then(|a| a.downcast_ref::<SliceOwner<T>>()) {
                Some(o) if whole && o.bytes == self.len() => {
                    let mut slot = o.slice.lock().unwrap_or_else(|e| e.into_inner());
                    match slot.as_ref() {
                        Some(s) if s.num_bytes() == self.len() => slot.take(),
                        _ => None,
                    }
                }
                _ => None,
            }
        };
        taken.ok_or(self)
    }
}

/// The cudarc default stream of device `ordinal`'s primary context (one per device).
pub fn cudarc_stream(ordinal: usize) -> CudaResult<Arc<CudaStream>> {
    available()?;
    static STREAMS: OnceLock<Mutex<Vec<Option<Arc<CudaStream>>>>> = OnceLock::new();
    let mut streams = STREAMS.get_or_init(|| Mutex::new(Vec::new())).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(Some(s)) = streams.get(ordinal) {
        return Ok(s.clone());
    }
    let ctx = CudaContext::new(ordinal).map_err(|e| from_driver("cuDevicePrimaryCtxRetain", e))?;
    let stream = ctx.default_stream();
    if streams.len() <= ordinal {
        streams.resize(ordinal + 1, None);
    }
    streams[ordinal] = Some(stream.clone());
    Ok(stream)
}

impl DeviceSlice<u8> for DeviceBuffer {
    fn len(&self) -> usize {
        DeviceBuffer::len(self)
    }

    /// The buffer's producer stream when it is a cudarc one, else the device's cudarc
    /// default stream.
    ///
    /// # Panics
    /// When cudarc cannot open the buffer's device: only for a buffer made with
    /// [`DeviceBuffer::from_raw_parts`] for memory that is not device memory of a device
    /// this process can open, against that function's contract.
    fn stream(&self) -> &Arc<CudaStream> {
        if let Some(crate::ProducerStream::Cudarc(s)) = self.producer_stream() {
            return s;
        }
        self.cudarc_stream.get_or_init(|| match cudarc_stream(self.device_ordinal()) {
            Ok(s) => s,
            Err(e) => panic!("DeviceBuffer on device {} that cudarc cannot open: {e}", self.device_ordinal()),
        })
    }
}

/// Received and pool buffers are complete when handed out (the transport synchronised
/// its copies): cudarc has nothing to wait for, and nothing to record.
impl DevicePtr<u8> for DeviceBuffer {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.device_ptr(), SyncOnDrop::Sync(None))
    }
}

impl DevicePtrMut<u8> for DeviceBuffer {
    fn device_ptr_mut<'a>(&'a mut self, _stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (DeviceBuffer::device_ptr(self), SyncOnDrop::Sync(None))
    }
}

// SAFETY: the argument is a pointer to the buffer's `CUdeviceptr`, which lives as long as
// the borrow, so as long as the launch builder holding it; the kernel sees a device
// pointer to memory the buffer keeps alive (received buffers are complete: nothing to
// wait for).
unsafe impl<'a, 'b: 'a> PushKernelArg<&'b DeviceBuffer> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b DeviceBuffer) -> &mut Self {
        self.arg(arg.device_ptr_ref())
    }
}

// SAFETY: as above; `&mut` only says the kernel may write the buffer.
unsafe impl<'a, 'b: 'a> PushKernelArg<&'b mut DeviceBuffer> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut DeviceBuffer) -> &mut Self {
        self.arg(arg.device_ptr_ref())
    }
}
