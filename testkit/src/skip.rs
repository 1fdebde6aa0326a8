//! Tests that need a GPU or UCX.
//!
//! GPU tests are ignored unless their crate is built with its feature `gpu-tests` (the GPU
//! machine's build), and one that runs needs a device: `require_gpu` fails it without
//! one, so a GPU test never passes without having run. UCX tests run everywhere: without
//! UCX they print `skipped: UCX not available` and pass, unless `FERRYLINK_REQUIRE_UCX=1`
//! (CI sets it), when they fail. Two-host tests ([`crate::two_host`]) skip likewise where
//! namespaces cannot be made, unless `FERRYLINK_REQUIRE_NETNS=1`.

use std::fmt::Display;

/// What a test may skip without (a GPU is never skipped: see `require_gpu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// A loadable, usable UCX; required with `FERRYLINK_REQUIRE_UCX=1`.
    Ucx,
    /// Network, mount, UTS and PID namespaces and veth pairs (a second host on this
    /// machine: [`crate::two_host`]); required with `FERRYLINK_REQUIRE_NETNS=1`.
    Netns,
}

impl Need {
    /// The variable that makes the need a requirement (`=1`).
    pub fn require_var(self) -> &'static str {
        match self {
            Need::Ucx => "FERRYLINK_REQUIRE_UCX",
            Need::Netns => "FERRYLINK_REQUIRE_NETNS",
        }
    }

    /// Whether this run requires it (the tests that need it fail instead of skipping).
    pub fn required(self) -> bool {
        std::env::var(self.require_var()).as_deref() == Ok("1")
    }

    fn missing(self) -> &'static str {
        match self {
            Need::Ucx => "UCX not available",
            Need::Netns => "namespaces for a second host cannot be made",
        }
    }
}

/// The need is not met (`reason`): prints `skipped: ...` for the test to return, or
/// panics when the need is required.
pub fn skip_or_fail(need: Need, reason: impl Display) {
    if need.required() {
        panic!("{}=1 but {}: {reason}", need.require_var(), need.missing());
    }
    println!("skipped: {} ({reason})", need.missing());
}

/// `Some` of what an attempt to get what the test needs gave; `None` after
/// [`skip_or_fail`] when it failed.
pub fn or_skip<T, E: Display>(need: Need, attempt: Result<T, E>) -> Option<T> {
    match attempt {
        Ok(value) => Some(value),
        Err(e) => {
            skip_or_fail(need, e);
            None
        }
    }
}

/// [`or_skip`] for UCX: `attempt` is whatever the layer under test calls loading UCX (a
/// `UcxContext`, a transport context forced onto the UCX lane, the library itself).
/// Errors that do not mean "UCX is missing" should fail the test: map them to a panic
/// before calling this.
pub fn ucx_or_skip<T, E: Display>(attempt: Result<T, E>) -> Option<T> {
    or_skip(Need::Ucx, attempt)
}

/// A CUDA device is here; otherwise the test fails with `no CUDA device (why)`.
///
/// The first line of every GPU test. GPU tests carry
/// `#[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]`,
/// so CI (no GPU) counts them ignored and the GPU machine's build (`--features gpu-tests`)
/// runs them; one run on a machine without a device fails here instead of passing.
///
/// Probes as `ferrylink_memory::cuda::probe` does (honouring `FERRYLINK_DISABLE_CUDA`),
/// with its own code: the kit cannot depend on ferrylink-memory, whose unit tests use it.
#[cfg(feature = "cuda")]
#[track_caller]
pub fn require_gpu() {
    static PROBE: std::sync::OnceLock<Result<usize, String>> = std::sync::OnceLock::new();
    if let Err(reason) = PROBE.get_or_init(probe_cuda) {
        panic!("no CUDA device ({reason}): this test needs one (README: Tests on a GPU machine)");
    }
}

/// The number of CUDA devices, or why there is none.
#[cfg(feature = "cuda")]
fn probe_cuda() -> Result<usize, String> {
    if std::env::var_os("FERRYLINK_DISABLE_CUDA").is_some() {
        return Err("FERRYLINK_DISABLE_CUDA is set".into());
    }
    // SAFETY: is_culib_present only tries to dlopen the driver library; it calls no CUDA
    // function.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("the CUDA driver library (libcuda) is not installed".into());
    }
    cudarc::driver::result::init().map_err(|e| format!("cuInit failed: {e}"))?;
    let count = cudarc::driver::result::device::get_count().map_err(|e| format!("cuDeviceGetCount failed: {e}"))?;
    if count <= 0 {
        return Err("the driver sees no device".into());
    }
    Ok(count as usize)
}
