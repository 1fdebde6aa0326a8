//! `ferrylink._ferrylink`: the extension module of the `ferrylink` Python package.
//!
//! It wraps the Rust API of the `ferrylink` facade for CPython (abi3, 3.9 and later):
//! [`context::PyContext`] and [`context::PyListener`] set up connections,
//! [`endpoint::PyEndpoint`] sends and receives, [`onesided`] registers memory and moves
//! it one-sided, [`ops::PyOp`] is one request in flight
//! (waited for with the GIL released and Ctrl-C honoured, or polled by the asyncio
//! layer through [`wakeup::PyWakeup`]). Frames come in from Python objects in
//! [`frames_in`] (the buffer protocol on the host, DLPack or `__cuda_array_interface__`
//! on the device) and go out as [`frames_out::PyHostFrame`] and
//! [`frames_out::PyDeviceFrame`] (DLPack and `__cuda_array_interface__`). The public
//! Python API, its docstrings and its asyncio forms live in the pure-Python package
//! around this module (`python/ferrylink/`); errors are raised as the exception classes
//! it defines ([`errors`]). `spill_store::PySpillStore` (the tiered store of
//! `ferrylink-spill`) and `spill_copy` (the pinned pool and device ↔ host copies) are
//! the engine of `ferrylink.dask`'s `DeviceHostFile` and `"ferrylink"` serializers.
//!
//! Nothing here takes the GIL from a thread that does not hold it: memory that Python
//! owns and a ferrylink thread may let go of is released later, on a Python thread
//! ([`pybuffer::release_deferred`]), or through pyo3's own deferred reference counting.

// The crate docs map the extension's modules for a reader of its source, private ones
// included (`cargo doc --document-private-items` renders them); the public docs alone
// leave those links unresolved.
#![allow(rustdoc::private_intra_doc_links)]

mod benchmarks;
mod config;
mod context;
mod dlpack;
mod endpoint;
mod errors;
mod frames_in;
mod frames_out;
mod onesided;
mod ops;
mod pybuffer;
mod shared_host;
mod spill_copy;
mod spill_store;
mod wakeup;

use pyo3::prelude::*;

/// Sets up `tracing` output on stderr when `RUST_LOG` holds a filter (such as
/// `ferrylink_transport=debug`), as ferrylink's Rust binaries do; without it the Rust
/// side's logs are dropped.
fn init_logging() {
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_default_env() {
        let _already_set = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    }
}

/// The extension module.
#[pymodule]
fn _ferrylink(m: &Bound<'_, PyModule>) -> PyResult<()> {
    init_logging();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<context::PyContext>()?;
    m.add_class::<context::PyListener>()?;
    m.add_class::<endpoint::PyEndpoint>()?;
    m.add_class::<ops::PyOp>()?;
    m.add_class::<onesided::PyRegistration>()?;
    m.add_class::<onesided::PyRemoteRegion>()?;
    m.add_class::<onesided::PyPreparedTransfer>()?;
    m.add_class::<wakeup::PyWakeup>()?;
    m.add_class::<frames_out::PyHostFrame>()?;
    m.add_class::<frames_out::PyDeviceFrame>()?;
    m.add_class::<spill_copy::PyPinnedPool>()?;
    m.add_class::<spill_store::PySpillStore>()?;
    m.add_function(wrap_pyfunction!(spill_copy::device_to_host, m)?)?;
    m.add_function(wrap_pyfunction!(spill_copy::host_to_device, m)?)?;
    m.add_function(wrap_pyfunction!(config::config_keys, m)?)?;
    m.add_function(wrap_pyfunction!(frames_out::device_count, m)?)?;
    m.add_function(wrap_pyfunction!(frames_out::alloc_device, m)?)?;
    m.add_function(wrap_pyfunction!(frames_out::shared_host_buffer, m)?)?;
    m.add_function(wrap_pyfunction!(benchmarks::host_ceiling, m)?)?;
    m.add_function(wrap_pyfunction!(benchmarks::device_ceiling, m)?)?;
    m.add_function(wrap_pyfunction!(benchmarks::parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(benchmarks::format_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(benchmarks::format_rate, m)?)?;
    m.add_function(wrap_pyfunction!(benchmarks::format_seconds, m)?)?;
    Ok(())
}
