//! Is CUDA here, and how many devices does it have? Never panics.
//!
//! The answer is found once per process ([`probe`]); [`disable`] settles it as "no CUDA"
//! before anything probes (this crate reads no environment variable:
//! `ferrylink-transport` calls it for `FERRYLINK_DISABLE_CUDA=1`).

use std::sync::OnceLock;
use thiserror::Error;

/// Why CUDA cannot be used in this process.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum CudaUnavailable {
    /// `libcuda.so` could not be loaded.
    #[error("the CUDA driver library (libcuda.so) is not present")]
    NoDriverLibrary,
    /// `cuInit` failed.
    #[error("cuInit failed: {0}")]
    InitFailed(String),
    /// The driver works but reports no devices.
    #[error("the CUDA driver reports no devices")]
    NoDevices,
    /// [`disable`] was called before the first probe (`FERRYLINK_DISABLE_CUDA=1`).
    #[error("CUDA is disabled in this process (FERRYLINK_DISABLE_CUDA=1)")]
    Disabled,
}

/// What the probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaProbe {
    /// Number of CUDA devices.
    pub device_count: usize,
}

/// The process's one answer: set by the first [`probe`] or [`disable`].
static PROBE: OnceLock<Result<CudaProbe, CudaUnavailable>> = OnceLock::new();

/// Loads the driver library, initialises it and counts devices, once per process.
pub fn probe() -> Result<CudaProbe, CudaUnavailable> {
    PROBE.get_or_init(run_probe).clone()
}

/// Makes CUDA unavailable to this process ([`CudaUnavailable::Disabled`]) when nothing has
/// probed yet; the driver library is then never loaded. Returns whether CUDA is now
/// unavailable: `false` when an earlier probe already found it, which stays so.
pub fn disable() -> bool {
    PROBE.get_or_init(|| Err(CudaUnavailable::Disabled)).is_err()
}

/// Number of CUDA devices; 0 when CUDA is unavailable.
pub fn device_count() -> usize {
    probe().map(|p| p.device_count).unwrap_or(0)
}

fn run_probe() -> Result<CudaProbe, CudaUnavailable> {
    // SAFETY: is_culib_present only tries to dlopen the library; it calls no CUDA function.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(CudaUnavailable::NoDriverLibrary);
    }
    cudarc::driver::result::init().map_err(|e| CudaUnavailable::InitFailed(e.to_string()))?;
    let mut count: std::ffi::c_int = 0;
    // SAFETY: the library is loaded and initialised (just above); the call writes one
    // int, which starts initialised (cudarc's wrapper would read it uninitialised had a
    // successful call not written it).
    let res = unsafe { cudarc::driver::sys::cuDeviceGetCount(&mut count) };
    res.result().map_err(|e| CudaUnavailable::InitFailed(format!("cuDeviceGetCount: {e}")))?;
    if count <= 0 {
        return Err(CudaUnavailable::NoDevices);
    }
    Ok(CudaProbe { device_count: count as usize })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_never_panics_and_is_stable() {
        let first = probe();
        let second = probe();
        assert_eq!(first, second);
        match first {
            Ok(p) => assert!(p.device_count > 0),
            Err(e) => assert!(!e.to_string().is_empty()),
        }
        assert_eq!(device_count(), first_count(&second));
    }

    #[test]
    fn disable_after_the_probe_changes_nothing() {
        let first = probe();
        assert_eq!(disable(), first.is_err(), "CUDA is unavailable afterwards exactly when it was before");
        assert_eq!(probe(), first);
    }

    fn first_count(p: &Result<CudaProbe, CudaUnavailable>) -> usize {
        p.as_ref().map(|p| p.device_count).unwrap_or(0)
    }
}
