//! `ucx-sys`: raw UCX (ucp) FFI for ferrylink, loaded at run time.
//!
//! What lives here:
//! - [`bindings`]: the ucp types, constants and function signatures, generated **once**
//!   with bindgen from the UCX 1.13 headers (the oldest UCX ferrylink supports) and
//!   committed; `scripts/regenerate.sh` reproduces them. Its [`UcpLib`] is a table of
//!   function pointers resolved from a loaded `libucp`.
//! - [`load`] / [`load_cached`] / [`load_from`]: open `libucp.so.0` (or a path the caller
//!   gives: this crate reads no environment variable) with `libloading`, resolve every
//!   bound symbol and check the library's version (>= 1.13). Nothing links libucp at build time, so the workspace builds and tests
//!   with no libucx and no libclang installed; the absence of UCX is a [`LoadError`].
//! - [`Status`]: `ucs_status_t` as a newtype (never an enum built from an untrusted
//!   integer), and the `UCS_PTR_*` macros as functions ([`ptr_is_err`], [`ptr_is_ptr`],
//!   [`ptr_status`], [`ptr_raw_status`]).
//! - [`init_version`]: `ucp_init` is a `static inline` in the headers, so it is not in the
//!   library; this is its equivalent through `ucp_init_version`.
//!
//! Everything here is raw: the safe context / worker / endpoint / request types live in
//! `ferrylink-ucx`.
#![warn(missing_docs)]

use std::ffi::{c_uint, CStr, OsStr};
use std::fmt;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// Generated ucp bindings (see `scripts/regenerate.sh`). Do not edit by hand.
#[allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    dead_code,
    missing_docs,
    unused_qualifications,
    unsafe_op_in_unsafe_fn,
    rustdoc::all,
    clippy::all,
    clippy::pedantic,
    clippy::missing_safety_doc
)]
#[rustfmt::skip]
pub mod bindings;

pub use bindings::*;

/// The library name [`load`] opens.
pub const DEFAULT_LIBRARY: &str = "libucp.so.0";
/// The environment variable in which ferrylink's configuration (`ferrylink-transport`'s
/// `Config`) takes the `libucp` to open instead of [`DEFAULT_LIBRARY`]; named by
/// [`LoadError::NotFound`]. This crate does not read it.
pub const LIBRARY_ENV: &str = "FERRYLINK_UCX_LIB";
/// The oldest UCX release these bindings support (the headers they come from).
pub const MIN_VERSION: Version = Version { major: 1, minor: 13, release: 0 };

/// A UCX release number, as `ucp_get_version` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Release (patch) number.
    pub release: u32,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.release)
    }
}

/// Why `libucp` could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// The library could not be opened (not installed, wrong path, wrong architecture).
    #[error(
        "{path} not found (install libucx / set {LIBRARY_ENV}): {reason}",
        path = path.display()
    )]
    NotFound {
        /// What was passed to `dlopen`.
        path: PathBuf,
        /// The loader's message.
        reason: String,
    },
    /// The library opened but lacks a function these bindings need (not a libucp?).
    #[error("{path} is not a usable libucp: {reason}", path = path.display())]
    MissingSymbol {
        /// What was passed to `dlopen`.
        path: PathBuf,
        /// The loader's message (names the symbol).
        reason: String,
    },
    /// The library is older than [`MIN_VERSION`].
    #[error("{path} is UCX {found}, ferrylink needs UCX >= {MIN_VERSION}", path = path.display())]
    TooOld {
        /// What was passed to `dlopen`.
        path: PathBuf,
        /// The version the library reports.
        found: Version,
    },
}

/// A loaded `libucp`: every bound function, resolved.
///
/// Dereferences to [`UcpLib`], so the raw functions are called as
/// `unsafe { ucx.ucp_worker_progress(worker) }`. The library is never unloaded: UCX runs
/// its own threads (the async progress thread of libucs) whose code must stay mapped for
/// the life of the process.
pub struct Ucx {
    lib: ManuallyDrop<UcpLib>,
    version: Version,
    path: PathBuf,
}

impl Ucx {
    /// The version the loaded library reports.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The path (or name) the library was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The library's version string (`ucp_get_version_string`).
    pub fn version_string(&self) -> String {
        // SAFETY: ucp_get_version_string takes no arguments and returns a pointer to a
        // static NUL-terminated string (or, defensively, NULL, handled below).
        let ptr = unsafe { self.lib.ucp_get_version_string() };
        if ptr.is_null() {
            return self.version.to_string();
        }
        // SAFETY: non-null, NUL-terminated, static storage inside libucp (never unloaded).
        unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
    }

    /// `ucs_status_string` for `status`.
    pub fn status_string(&self, status: Status) -> String {
        // SAFETY: ucs_status_string accepts any value (unknown codes give a generic
        // message) and returns a static NUL-terminated string or NULL.
        let ptr = unsafe { self.lib.ucs_status_string(status.0) };
        if ptr.is_null() {
            return format!("UCS status {}", status.0);
        }
        // SAFETY: non-null, NUL-terminated, static storage inside libucs (never unloaded).
        unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
    }
}

impl Deref for Ucx {
    type Target = UcpLib;
    fn deref(&self) -> &UcpLib {
        &self.lib
    }
}

impl fmt::Debug for Ucx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ucx").field("path", &self.path).field("version", &self.version).finish()
    }
}

/// Libraries loaded by [`load_cached`], one answer per path, kept for the process.
static LOADED: Mutex<Vec<(PathBuf, Result<&'static Ucx, LoadError>)>> = Mutex::new(Vec::new());
/// The first library [`load_cached`] loaded successfully (what [`loaded`] answers).
static FIRST_LOADED: OnceLock<&'static Ucx> = OnceLock::new();

/// Loads [`DEFAULT_LIBRARY`] once per process: [`load_cached`] of it.
///
/// Reads no environment variable: a caller with another library (ferrylink's
/// configuration reads [`LIBRARY_ENV`]) passes its path to [`load_cached`].
pub fn load() -> Result<&'static Ucx, LoadError> {
    load_cached(DEFAULT_LIBRARY)
}

/// The loader's own words: libloading's error says which call failed ("dlopen failed") and
/// keeps `dlerror()`'s message (the file or symbol, and why) as its source.
fn loader_message(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(source) => format!("{e}: {source}"),
        None => e.to_string(),
    }
}

/// Loads the `libucp` at `path` (as [`load_from`]) once per process and path: later calls
/// with the same path return the same library or the same error. Use [`load_from`] to try
/// a path uncached.
pub fn load_cached(path: impl AsRef<OsStr>) -> Result<&'static Ucx, LoadError> {
    let path = PathBuf::from(path.as_ref());
    let mut loaded = LOADED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, answer)) = loaded.iter().find(|(p, _)| *p == path) {
        return answer.clone();
    }
    let answer = load_from(&path).map(|ucx| &*Box::leak(Box::new(ucx)));
    if let Ok(ucx) = answer {
        FIRST_LOADED.get_or_init(|| ucx);
    }
    loaded.push((path, answer.clone()));
    answer
}

/// The first library [`load`] or [`load_cached`] loaded, if one succeeded; never loads.
pub fn loaded() -> Option<&'static Ucx> {
    FIRST_LOADED.get().copied()
}

/// Opens `path` as `libucp`, resolves every bound function and checks the version. Not
/// cached: every call opens the library again (the handle is never closed, see [`Ucx`]).
pub fn load_from(path: impl AsRef<OsStr>) -> Result<Ucx, LoadError> {
    let path = PathBuf::from(path.as_ref());
    // SAFETY: opening a shared library runs its initialisers. libucp's (and libucs's)
    // constructors only set up UCX's global state; this is the documented way to use UCX
    // and there is no sound alternative for a run-time dependency.
    let library = unsafe { libloading::Library::new(&path) }
        .map_err(|e| LoadError::NotFound { path: path.clone(), reason: loader_message(&e) })?;
    // SAFETY: every symbol is resolved with the signature bindgen read from the UCX 1.13
    // headers; UCX keeps these signatures stable across 1.x releases (checked below that
    // the library is at least 1.13, where all of them exist).
    let lib = unsafe { UcpLib::from_library(library) }
        .map_err(|e| LoadError::MissingSymbol { path: path.clone(), reason: loader_message(&e) })?;
    let (mut major, mut minor, mut release): (c_uint, c_uint, c_uint) = (0, 0, 0);
    // SAFETY: ucp_get_version writes three unsigned ints through valid pointers.
    unsafe { lib.ucp_get_version(&mut major, &mut minor, &mut release) };
    let version = Version { major, minor, release };
    let ucx = Ucx { lib: ManuallyDrop::new(lib), version, path };
    if !version_supported(version) {
        return Err(LoadError::TooOld { path: ucx.path.clone(), found: version });
    }
    Ok(ucx)
}

/// Whether a library of `version` can back these bindings (same major, minor >= 13).
pub fn version_supported(version: Version) -> bool {
    version.major == MIN_VERSION.major && version.minor >= MIN_VERSION.minor
}

/// `ucp_init`: creates a context with the API version of these bindings.
///
/// # Safety
/// `params` must point to a valid `ucp_params_t` whose `field_mask` covers only fields
/// that are initialised (and whose pointers are valid for the call); `config` must be
/// NULL or a live config from `ucp_config_read`; `context_p` must be writable.
pub unsafe fn init_version(
    ucx: &Ucx,
    params: *const ucp_params_t,
    config: *const ucp_config_t,
    context_p: *mut ucp_context_h,
) -> Status {
    // SAFETY: forwarded contract (see # Safety); the API version is the headers' own.
    Status(unsafe { ucx.ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, params, config, context_p) })
}

/// `ucp_dt_make_contig(elem_size)`: the contiguous datatype of `elem_size`-byte elements.
pub const fn dt_make_contig(elem_size: usize) -> ucp_datatype_t {
    ((elem_size as ucp_datatype_t) << UCP_DATATYPE_SHIFT) | UCP_DATATYPE_CONTIG as ucp_datatype_t
}

/// A UCS status code (`ucs_status_t`): `0` OK, `1` in progress, negative errors.
///
/// A newtype over the raw value, so any integer UCX returns is representable; the named
/// constants cover the codes ferrylink looks at.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Status(pub ucs_status_t);

impl Status {
    /// `UCS_OK`.
    pub const OK: Status = Status(UCS_OK);
    /// `UCS_INPROGRESS`.
    pub const IN_PROGRESS: Status = Status(UCS_INPROGRESS);
    /// `UCS_ERR_NO_MESSAGE`.
    pub const ERR_NO_MESSAGE: Status = Status(UCS_ERR_NO_MESSAGE);
    /// `UCS_ERR_NO_RESOURCE`.
    pub const ERR_NO_RESOURCE: Status = Status(UCS_ERR_NO_RESOURCE);
    /// `UCS_ERR_IO_ERROR`.
    pub const ERR_IO_ERROR: Status = Status(UCS_ERR_IO_ERROR);
    /// `UCS_ERR_NO_MEMORY`.
    pub const ERR_NO_MEMORY: Status = Status(UCS_ERR_NO_MEMORY);
    /// `UCS_ERR_INVALID_PARAM`.
    pub const ERR_INVALID_PARAM: Status = Status(UCS_ERR_INVALID_PARAM);
    /// `UCS_ERR_UNREACHABLE`.
    pub const ERR_UNREACHABLE: Status = Status(UCS_ERR_UNREACHABLE);
    /// `UCS_ERR_INVALID_ADDR`.
    pub const ERR_INVALID_ADDR: Status = Status(UCS_ERR_INVALID_ADDR);
    /// `UCS_ERR_MESSAGE_TRUNCATED`.
    pub const ERR_MESSAGE_TRUNCATED: Status = Status(UCS_ERR_MESSAGE_TRUNCATED);
    /// `UCS_ERR_BUSY`.
    pub const ERR_BUSY: Status = Status(UCS_ERR_BUSY);
    /// `UCS_ERR_CANCELED`.
    pub const ERR_CANCELED: Status = Status(UCS_ERR_CANCELED);
    /// `UCS_ERR_TIMED_OUT`.
    pub const ERR_TIMED_OUT: Status = Status(UCS_ERR_TIMED_OUT);
    /// `UCS_ERR_UNSUPPORTED`.
    pub const ERR_UNSUPPORTED: Status = Status(UCS_ERR_UNSUPPORTED);
    /// `UCS_ERR_NOT_CONNECTED`.
    pub const ERR_NOT_CONNECTED: Status = Status(UCS_ERR_NOT_CONNECTED);
    /// `UCS_ERR_CONNECTION_RESET`.
    pub const ERR_CONNECTION_RESET: Status = Status(UCS_ERR_CONNECTION_RESET);
    /// `UCS_ERR_ENDPOINT_TIMEOUT`.
    pub const ERR_ENDPOINT_TIMEOUT: Status = Status(UCS_ERR_ENDPOINT_TIMEOUT);

    /// The raw value.
    pub const fn raw(self) -> ucs_status_t {
        self.0
    }
    /// `UCS_OK`.
    pub const fn is_ok(self) -> bool {
        self.0 == UCS_OK
    }
    /// `UCS_INPROGRESS`.
    pub const fn is_in_progress(self) -> bool {
        self.0 == UCS_INPROGRESS
    }
    /// An error (`UCS_STATUS_IS_ERR`: negative).
    pub const fn is_err(self) -> bool {
        self.0 < 0
    }
    /// `UCS_IS_LINK_ERROR`.
    pub const fn is_link_error(self) -> bool {
        self.0 <= UCS_ERR_FIRST_LINK_FAILURE && self.0 >= UCS_ERR_LAST_LINK_FAILURE
    }
    /// `UCS_IS_ENDPOINT_ERROR`.
    pub const fn is_endpoint_error(self) -> bool {
        self.0 <= UCS_ERR_FIRST_ENDPOINT_FAILURE && self.0 >= UCS_ERR_LAST_ENDPOINT_FAILURE
    }
    /// `Ok(())` for `UCS_OK`, `Err(self)` for anything else (including in progress).
    pub const fn ok(self) -> Result<(), Status> {
        if self.is_ok() {
            Ok(())
        } else {
            Err(self)
        }
    }

    /// A name for the code without the library (for when it is not loaded).
    fn fallback_name(self) -> &'static str {
        match self.0 {
            UCS_OK => "Success",
            UCS_INPROGRESS => "Operation in progress",
            UCS_ERR_NO_MESSAGE => "No pending message",
            UCS_ERR_NO_RESOURCE => "No resources are available to initiate the operation",
            UCS_ERR_IO_ERROR => "Input/output error",
            UCS_ERR_NO_MEMORY => "Out of memory",
            UCS_ERR_INVALID_PARAM => "Invalid parameter",
            UCS_ERR_UNREACHABLE => "Destination is unreachable",
            UCS_ERR_INVALID_ADDR => "Address not valid",
            UCS_ERR_MESSAGE_TRUNCATED => "Message truncated",
            UCS_ERR_BUSY => "Device is busy",
            UCS_ERR_CANCELED => "Request canceled",
            UCS_ERR_TIMED_OUT => "Timed out",
            UCS_ERR_UNSUPPORTED => "Unsupported operation",
            UCS_ERR_NOT_CONNECTED => "Endpoint is not connected",
            UCS_ERR_CONNECTION_RESET => "Connection reset by remote peer",
            UCS_ERR_ENDPOINT_TIMEOUT => "Endpoint timeout",
            _ => "Unknown error",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match loaded() {
            Some(ucx) => write!(f, "{} ({})", ucx.status_string(*self), self.0),
            None => write!(f, "{} ({})", self.fallback_name(), self.0),
        }
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Status({self})")
    }
}

impl std::error::Error for Status {}

/// `UCS_PTR_IS_ERR`: the status pointer encodes an error code.
pub fn ptr_is_err(ptr: ucs_status_ptr_t) -> bool {
    ptr as usize >= UCS_ERR_LAST as isize as usize
}

/// `UCS_PTR_IS_PTR`: the status pointer is a real request pointer (neither NULL/OK nor an
/// error code).
pub fn ptr_is_ptr(ptr: ucs_status_ptr_t) -> bool {
    (ptr as usize).wrapping_sub(1) < (UCS_ERR_LAST as isize as usize).wrapping_sub(1)
}

/// `UCS_PTR_RAW_STATUS`: the status encoded in the pointer, without checking that it is
/// not a real pointer (truncates like the C cast).
pub fn ptr_raw_status(ptr: ucs_status_ptr_t) -> Status {
    Status(ptr as isize as ucs_status_t)
}

/// `UCS_PTR_STATUS`: `IN_PROGRESS` for a request pointer, else the encoded status.
pub fn ptr_status(ptr: ucs_status_ptr_t) -> Status {
    if ptr_is_ptr(ptr) {
        Status::IN_PROGRESS
    } else {
        ptr_raw_status(ptr)
    }
}

/// `UCS_STATUS_PTR`: a status encoded as a status pointer.
pub fn status_ptr(status: Status) -> ucs_status_ptr_t {
    status.0 as isize as ucs_status_ptr_t
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cached library, or `None` after printing the skip line (the kit's
    /// [`ucx_or_skip`]: panics with `FERRYLINK_REQUIRE_UCX=1`).
    fn ucx_or_skip() -> Option<&'static Ucx> {
        ferrylink_testkit::ucx_or_skip(load())
    }

    #[test]
    fn status_pointer_macros_match_c() {
        let null = std::ptr::null_mut();
        assert!(!ptr_is_err(null));
        assert!(!ptr_is_ptr(null));
        assert_eq!(ptr_status(null), Status::OK);
        assert_eq!(ptr_raw_status(null), Status::OK);

        for code in [UCS_ERR_NO_MESSAGE, UCS_ERR_CANCELED, UCS_ERR_ENDPOINT_TIMEOUT, UCS_ERR_LAST] {
            let p = status_ptr(Status(code));
            assert_eq!(p as isize, code as isize);
            assert!(ptr_is_err(p), "{code}");
            assert!(!ptr_is_ptr(p), "{code}");
            assert_eq!(ptr_status(p), Status(code));
        }
        // One below UCS_ERR_LAST is not an error code any more: C treats it as a pointer.
        let below = (UCS_ERR_LAST as isize - 1) as ucs_status_ptr_t;
        assert!(!ptr_is_err(below));
        assert!(ptr_is_ptr(below));

        let mut x = 0u64;
        let real = (&mut x as *mut u64).cast::<std::ffi::c_void>();
        assert!(ptr_is_ptr(real));
        assert!(!ptr_is_err(real));
        assert_eq!(ptr_status(real), Status::IN_PROGRESS);
    }

    #[test]
    fn status_predicates() {
        assert!(Status::OK.is_ok() && !Status::OK.is_err());
        assert!(Status::IN_PROGRESS.is_in_progress() && !Status::IN_PROGRESS.is_err());
        assert!(Status::ERR_BUSY.is_err());
        assert_eq!(Status::OK.ok(), Ok(()));
        assert_eq!(Status::ERR_CANCELED.ok(), Err(Status::ERR_CANCELED));
        assert!(Status::ERR_ENDPOINT_TIMEOUT.is_endpoint_error());
        assert!(Status(UCS_ERR_FIRST_LINK_FAILURE).is_link_error());
        assert!(!Status::ERR_IO_ERROR.is_link_error());
        // Any integer is representable and displays without panicking.
        let odd = Status(-77);
        assert!(odd.to_string().contains("-77"));
        assert_eq!(dt_make_contig(1), 8);
    }

    #[test]
    fn missing_library_is_a_clear_error() {
        let err = load_from("/nonexistent/libucp.so.0").unwrap_err();
        assert!(matches!(err, LoadError::NotFound { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("not found (install libucx / set FERRYLINK_UCX_LIB)"), "{msg}");
        assert!(msg.contains("/nonexistent/libucp.so.0"), "{msg}");
        // The loader's reason, not only which call failed.
        assert!(msg.contains("dlopen failed: ") && msg.contains("No such file"), "{msg}");
    }

    /// A cached load of a path that does not exist: an error naming the path (and how to
    /// choose another), the same error every time, never a panic, and never the library
    /// [`loaded`] reports.
    #[test]
    fn cached_load_of_a_missing_path_fails_clearly() {
        let err = load_cached("/nonexistent").unwrap_err();
        assert!(matches!(err, LoadError::NotFound { .. }), "{err:?}");
        assert_eq!(load_cached("/nonexistent").unwrap_err(), err, "cached");
        assert!(loaded().is_none_or(|ucx| ucx.path() != Path::new("/nonexistent")));
        let msg = err.to_string();
        assert!(msg.starts_with("/nonexistent not found (install libucx / set FERRYLINK_UCX_LIB)"), "{msg}");
    }

    #[test]
    fn a_library_without_ucp_symbols_is_rejected() {
        // libc is always present; it opens but has no ucp_* symbols.
        match load_from("libc.so.6") {
            Err(LoadError::MissingSymbol { reason, .. }) => {
                assert!(reason.contains("ucs_") || reason.contains("ucp_"))
            }
            other => panic!("expected MissingSymbol, got {other:?}"),
        }
    }

    #[test]
    fn version_gate() {
        assert!(version_supported(Version { major: 1, minor: 13, release: 1 }));
        assert!(version_supported(Version { major: 1, minor: 18, release: 0 }));
        assert!(!version_supported(Version { major: 1, minor: 12, release: 9 }));
        assert!(!version_supported(Version { major: 2, minor: 0, release: 0 }));
        let err = LoadError::TooOld {
            path: PathBuf::from("libucp.so.0"),
            found: Version { major: 1, minor: 12, release: 1 },
        };
        assert_eq!(err.to_string(), "libucp.so.0 is UCX 1.12.1, ferrylink needs UCX >= 1.13.0");
    }

    #[test]
    fn loads_the_system_library() {
        let Some(ucx) = ucx_or_skip() else { return };
        assert!(version_supported(ucx.version()), "{:?}", ucx.version());
        let v = ucx.version();
        assert!(ucx.version_string().starts_with(&format!("{}.{}", v.major, v.minor)));
        // ucs_status_string lives in libucs, found through libucp's dependencies.
        assert_eq!(ucx.status_string(Status::OK), "Success");
        assert_eq!(Status::ERR_CANCELED.to_string(), "Request canceled (-16)");
        // An uncached load of the same library works too.
        let again = load_from(ucx.path()).expect("second load");
        assert_eq!(again.version(), ucx.version());
    }

    #[test]
    fn init_and_cleanup_a_context() {
        let Some(ucx) = ucx_or_skip() else { return };
        // SAFETY: zeroed ucp_params_t is valid (all fields plain data or nullable
        // pointers); only the fields named in field_mask are read.
        let mut params: ucp_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = UCP_PARAM_FIELD_FEATURES as u64;
        params.features = UCP_FEATURE_TAG as u64;
        let mut context: ucp_context_h = std::ptr::null_mut();
        // SAFETY: params is initialised for the masked fields; NULL config means "read
        // from the environment"; context is a writable out-pointer.
        let status = unsafe { init_version(ucx, &params, std::ptr::null(), &mut context) };
        assert!(status.is_ok(), "{status}");
        assert!(!context.is_null());
        // SAFETY: context was created above and is cleaned up exactly once.
        unsafe { ucx.ucp_cleanup(context) };
    }
}
