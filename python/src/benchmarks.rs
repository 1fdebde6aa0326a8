//! The ceilings of the Rust benchmark `local-send-recv`, for
//! `python -m ferrylink.benchmarks.send_recv`: the same raw copies, timed the same way, so
//! the two benchmarks' efficiencies compare like with like.

use crate::errors;
use ferrylink_ceiling::{device_copy_roundtrip, host_memcpy_roundtrip, Ceiling};
use pyo3::prelude::*;

/// `(bytes per second, what was timed, total seconds, iterations)`.
type CeilingTuple = (f64, String, f64, usize);

fn as_tuple(c: Ceiling) -> CeilingTuple {
    (c.bytes_per_sec, c.method, c.total_seconds, c.n_iter)
}

/// `memcpy` of `nbytes` A → B and back, `iters` times: 2·n/t.
#[pyfunction]
pub(crate) fn host_ceiling(py: Python<'_>, nbytes: usize, iters: usize) -> CeilingTuple {
    as_tuple(py.detach(|| host_memcpy_roundtrip(nbytes, iters)))
}

/// Raw device copies of `nbytes` client device → server device and back, `iters`
/// times (one device: the faster of `cuMemcpyDtoD` and ferrylink's copy kernel).
#[pyfunction]
pub(crate) fn device_ceiling(
    py: Python<'_>,
    nbytes: usize,
    iters: usize,
    server_device: usize,
    client_device: usize,
) -> PyResult<CeilingTuple> {
    py.detach(|| device_copy_roundtrip(client_device, server_device, nbytes, iters))
        .map(as_tuple)
        .map_err(|e| errors::error(py, "UnsupportedError", format!("measuring the device ceiling failed: {e}")))
}

/// `local-send-recv`'s sizes: `1000000`, `100MB` (10^6), `10MiB` (2^20), `1GB`...
#[pyfunction]
pub(crate) fn parse_size(text: &str) -> PyResult<u64> {
    ferrylink_ceiling::size::parse_size(text)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("{text:?} is not a size: {e}")))
}

/// `12.34 MB` (decimal units), as `local-send-recv` prints sizes.
#[pyfunction]
pub(crate) fn format_bytes(n: f64) -> String {
    ferrylink_ceiling::size::format_bytes(n)
}

/// `12.34 GB/s`.
#[pyfunction]
pub(crate) fn format_rate(bytes_per_sec: f64) -> String {
    ferrylink_ceiling::size::format_rate(bytes_per_sec)
}

/// `12.34 us`, `5.67 ms` or `1.23 s`.
#[pyfunction]
pub(crate) fn format_seconds(secs: f64) -> String {
    ferrylink_ceiling::size::format_seconds(secs)
}
