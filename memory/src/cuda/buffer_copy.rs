//! The synchronous copy helpers of [`DeviceBuffer`] (tests, small transfers): host
//! slices in and out, a whole-buffer `Vec`, fills; each on the buffer's own device and
//! waited for.

use super::context::Gpu;
use super::error::CudaError;
use crate::DeviceBuffer;

impl DeviceBuffer {
    /// Copies `src` into the start of the buffer and waits for the copy (`cuMemcpyHtoD`).
    /// Device memory is written through `&self`: the caller orders it against other users.
    pub fn copy_from_host(&self, src: &[u8]) -> Result<(), CudaError> {
        if src.len() > self.len() {
            return Err(too_long("DeviceBuffer::copy_from_host", src.len(), self.len()));
        }
        let gpu = Gpu::get(self.device_ordinal())?;
        // SAFETY: `ptr..ptr+src.len()` lies within this buffer, valid while `self` lives.
        unsafe { super::copy::memcpy_htod_sync(&gpu, self.device_ptr(), src) }
    }

    /// Copies the start of the buffer into `dst` and waits for the copy (`cuMemcpyDtoH`).
    pub fn copy_to_host(&self, dst: &mut [u8]) -> Result<(), CudaError> {
        if dst.len() > self.len() {
            return Err(too_long("DeviceBuffer::copy_to_host", dst.len(), self.len()));
        }
        let gpu = Gpu::get(self.device_ordinal())?;
        // SAFETY: `ptr..ptr+dst.len()` lies within this buffer, valid while `self` lives.
        unsafe { super::copy::memcpy_dtoh_sync(&gpu, dst, self.device_ptr()) }
    }

    /// The whole buffer as a fresh `Vec` (tests, debugging).
    pub fn to_vec(&self) -> Result<Vec<u8>, CudaError> {
        let mut v = vec![0u8; self.len()];
        self.copy_to_host(&mut v)?;
        Ok(v)
    }

    /// Sets every byte to `value` and waits (`cuMemsetD8`).
    pub fn fill(&self, value: u8) -> Result<(), CudaError> {
        let gpu = Gpu::get(self.device_ordinal())?;
        // SAFETY: the whole range is this buffer, valid while `self` lives.
        unsafe { super::copy::memset_d8_sync(&gpu, self.device_ptr(), value, self.len()) }
    }
}

fn too_long(call: &'static str, n: usize, len: usize) -> CudaError {
    CudaError::InvalidArgument { call, reason: format!("{n} bytes do not fit a buffer of {len}") }
}
