//! The CUDA layer over cudarc's driver API.
//!
//! cudarc is built with `fallback-dynamic-loading`: nothing links against `libcuda`, and
//! [`probe`] checks for the library before any driver call, so a machine without CUDA gets
//! an [`CudaUnavailable`] answer instead of a panic. Every other piece of ferrylink asks
//! here before it touches CUDA.

mod probe;

pub use probe::{device_count, probe, CudaProbe, CudaUnavailable};
