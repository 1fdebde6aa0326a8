//! `UcxContext`: one `ucp_context` (the loaded library, configuration, features).

use std::ffi::{CString, OsStr};
use std::fmt;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::Arc;

use ucx_sys::{Status, Ucx, Version};

use super::error::{check, non_null, UcxError};
use super::setup;

/// The size of UCX's TCP receive segments in the contexts ferrylink creates
/// (`UCX_TCP_RX_SEG_SIZE`; UCX's own default is 64 KiB), unless the environment or an
/// option chooses one.
///
/// Our endpoints handle peer failure (`UCP_ERR_HANDLING_MODE_PEER`), and with that UCX
/// 1.13 gives TCP no RMA lane: a rendezvous payload travels as active messages of at most
/// one receive segment each, which the receiver `recv`s into a segment and copies into the
/// posted buffer. With 64 KiB segments the per-segment work (a `sendmsg`, a `recv`, an
/// active-message dispatch, a copy) dominates: on the 2-core development VM, 64 MiB round
/// trips over TCP loopback ran at 1.7 GB/s (median), as did `ucx_perftest -t tag_lat -e`
/// (error handling on, like us). With 512 KiB: 3.2 GB/s, and `tag_lat -e` 4.0 GB/s. 1 MiB
/// measured the same, 2 MiB slower, and 4 MiB made `ucx_perftest` fail now and then.
///
/// **Both sides of a TCP connection must use the same size**: UCX assumes symmetric
/// configuration, and a receiver whose segments are smaller than the sender's fragments
/// aborts (`tcp_ep.c` assertion `hdr->length <= rx_seg_size - sizeof(*hdr)`). Every
/// context made from [`UcxConfig::new`] with the same UCX agrees, and so does a peer with
/// `UCX_TCP_RX_SEG_SIZE=512K`; a peer with UCX's defaults does not, nor one whose UCX
/// refused the option (it is applied by name, and names are matched differently across
/// UCX versions: see [`UcxConfig::default_options`]).
pub const TCP_RX_SEG_SIZE: &str = "512K";

/// Options applied to the context's configuration with `ucp_config_modify`, on top of
/// the `UCX_*` environment variables (names without the `UCX_` prefix, e.g. `TLS`).
///
/// Options are per context, so tests running in parallel threads can each pick their
/// transports without touching the process environment.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UcxConfig {
    options: Vec<(String, String)>,
    wakeup: bool,
    rma: bool,
    ferrylink_defaults: bool,
    library: Option<PathBuf>,
}

impl Default for UcxConfig {
    fn default() -> Self {
        Self { options: Vec::new(), wakeup: true, rma: false, ferrylink_defaults: true, library: None }
    }
}

impl UcxConfig {
    /// UCX's defaults, then ferrylink's ([`TCP_RX_SEG_SIZE`]; see
    /// [`default_options`](Self::default_options)), then the `UCX_*` environment
    /// variables, then the options [`set`](Self::set) here.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `name` (e.g. `"TLS"`, `"NET_DEVICES"`) to `value`; later settings of the same
    /// name win, and settings win over the environment.
    ///
    /// A transport's option goes without the transport's prefix up to UCX 1.17
    /// (`"RX_SEG_SIZE"` for `UCX_TCP_RX_SEG_SIZE`) and with it from 1.18 (see
    /// [`default_options`](Self::default_options)). A name no transport has is accepted
    /// here by UCX 1.13 and only makes UCX warn "invalid configuration" when a worker is
    /// created.
    pub fn set(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.options.push((name.into(), value.into()));
        self
    }

    /// Whether workers get an event fd ([`UcxWorker::event_fd`](super::UcxWorker::event_fd),
    /// `arm`) so a progress thread can sleep; on by default. Without it workers can only
    /// be busy-polled.
    pub fn wakeup(mut self, on: bool) -> Self {
        self.wakeup = on;
        self
    }

    /// Whether the context has UCX's RMA feature (`UCP_FEATURE_RMA`): memory
    /// registrations peers may access ([`UcxContext::register`](super::UcxContext::register)),
    /// and puts and gets into theirs ([`UcxEndpoint::put`](super::UcxEndpoint::put)). Off by
    /// default: it changes which transport lanes UCX wires up, so the tag-only lane keeps
    /// the contexts it was measured with.
    ///
    /// **Both peers need it**: where UCX emulates RMA over active messages (TCP), the
    /// target's worker only handles the emulation's messages with the feature on; without
    /// it the target drops them and the initiator's flush never completes (until the
    /// endpoint fails). Agree on it before the first put (the handshake).
    pub fn rma(mut self, on: bool) -> Self {
        self.rma = on;
        self
    }

    /// Whether ferrylink's defaults apply (on by default); off, the context gets UCX's own
    /// defaults under the environment and the options. Its TCP peers must then agree with
    /// it, not with ferrylink (see [`TCP_RX_SEG_SIZE`]).
    pub fn ferrylink_defaults(mut self, on: bool) -> Self {
        self.ferrylink_defaults = on;
        self
    }

    /// The `libucp` [`UcxContext::new`] loads instead of [`ucx_sys::DEFAULT_LIBRARY`]
    /// (once per process and path, see [`ucx_sys::load_cached`]).
    pub fn library_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.library = Some(path.into());
        self
    }

    /// The library [`UcxContext::new`] loads: the [`library_path`](Self::library_path)
    /// set, else `None` for [`ucx_sys::DEFAULT_LIBRARY`].
    pub fn library(&self) -> Option<&Path> {
        self.library.as_deref()
    }

    /// The overrides, in the order they are applied.
    pub fn options(&self) -> &[(String, String)] {
        &self.options
    }

    /// ferrylink's defaults that the environment (read through `env`) and the options
    /// leave to us, as `ucp_config_modify` names them in UCX `version`. They are applied
    /// before the options, and one UCX refuses is skipped (logged), never an error.
    ///
    /// The TCP segment is ferrylink's unless `UCX_TCP_RX_SEG_SIZE` or an option sets one,
    /// or the transports (the last `TLS` option, else `UCX_TLS`) leave TCP out: UCX warns
    /// about an option no transport uses.
    pub fn default_options(&self, version: Version, env: impl Fn(&str) -> Option<String>) -> Vec<(String, String)> {
        let option = |name: &str| self.options.iter().rev().find(|(n, _)| n == name).map(|(_, v)| v.clone());
        let segment_chosen = env("UCX_TCP_RX_SEG_SIZE").is_some()
            || option("RX_SEG_SIZE").is_some()
            || option("TCP_RX_SEG_SIZE").is_some();
        let tls = option("TLS").or_else(|| env("UCX_TLS"));
        let mut defaults = Vec::new();
        if self.ferrylink_defaults && !segment_chosen && tls_includes_tcp(tls.as_deref()) {
            defaults.push((transport_option_name(version, "TCP_", "RX_SEG_SIZE"), TCP_RX_SEG_SIZE.to_string()));
        }
        defaults
    }
}

/// The name `ucp_config_modify` knows transport option `name` (of the transport whose
/// variables start with `UCX_{prefix}`) by in UCX `version`.
///
/// `ucp_config_modify` hands names UCP does not know to every transport's configuration
/// (`uct_config_modify`). Up to 1.17 that matched them without the transport's prefix
/// (verified with 1.13: `RX_SEG_SIZE` reaches TCP, `TCP_RX_SEG_SIZE` is unused and makes
/// UCX warn "invalid configuration"); later versions match the prefixed name, as the
/// variables are spelt (`uct_config_modify` passes the table's prefix; not verified
/// here, no such UCX on the development VM).
fn transport_option_name(version: Version, prefix: &str, name: &str) -> String {
    if version.major == 1 && version.minor < 18 {
        name.to_string()
    } else {
        format!("{prefix}{name}")
    }
}

/// Whether a `UCX_TLS` value lets UCX use TCP: unset, `all`, a list naming `tcp`, or an
/// exclusion list (`^...`) that does not name it. Entries may carry a `:suffix`
/// (`tcp:aux`).
/// What sets the TCP receive segment, strongest first: an explicit option, the
/// environment, ferrylink's default (when UCX took it), UCX's own default.
fn effective_tcp_segment(
    config: &UcxConfig,
    defaults: &[(String, String)],
    env: impl Fn(&str) -> Option<String>,
) -> Option<String> {
    let option = |name: &str| config.options.iter().rev().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    if !tls_includes_tcp(option("TLS").or_else(|| env("UCX_TLS")).as_deref()) {
        return None;
    }
    let chosen = option("TCP_RX_SEG_SIZE")
        .or_else(|| option("RX_SEG_SIZE"))
        .or_else(|| env("UCX_TCP_RX_SEG_SIZE"))
        .or_else(|| defaults.iter().find(|(n, _)| n.ends_with("RX_SEG_SIZE")).map(|(_, v)| v.clone()));
    Some(match chosen {
        Some(v) => normalized_size(&v),
        None => "ucx-default".into(),
    })
}

/// A UCX memory size (`512K`, `64kb`, `1M`, `65536`) in bytes, or the value as given
/// (trimmed, lower case) when it does not parse.
fn normalized_size(value: &str) -> String {
    let v = value.trim().to_ascii_lowercase();
    let digits = v.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &v[digits.len()..];
    let scale: Option<u64> = match unit {
        "" | "b" => Some(1),
        "k" | "kb" => Some(1 << 10),
        "m" | "mb" => Some(1 << 20),
        "g" | "gb" => Some(1 << 30),
        _ => None,
    };
    match (digits.parse::<u64>(), scale) {
        (Ok(n), Some(s)) => n.saturating_mul(s).to_string(),
        _ => v,
    }
}

fn tls_includes_tcp(tls: Option<&str>) -> bool {
    let Some(tls) = tls.map(str::trim).filter(|t| !t.is_empty()) else { return true };
    let (exclude, list) = match tls.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, tls),
    };
    let names = || list.split(',').map(|t| t.split(':').next().unwrap_or("").trim());
    if exclude {
        !names().any(|t| t == "tcp")
    } else {
        names().any(|t| t == "tcp" || t == "all")
    }
}

pub(crate) struct ContextInner {
    pub(crate) ucx: &'static Ucx,
    pub(crate) handle: ucx_sys::ucp_context_h,
    memory_types: u64,
    pub(crate) wakeup: bool,
    rma: bool,
    tcp_segment: Option<String>,
}

// SAFETY: the context is created with `mt_workers_shared = 1`, which makes UCX protect
// the context's shared state so workers may be created and used from different threads.
// The handle is only read (passed to UCX) after creation; cleanup happens once, in Drop,
// when no worker refers to it any more (workers hold an Arc).
unsafe impl Send for ContextInner {}
// SAFETY: see Send: every use through `&ContextInner` is a UCX call UCX makes thread-safe
// for a context with shared workers.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // SAFETY: handle came from a successful ucp_init_version and is cleaned up exactly
        // once; every worker created from it has been destroyed (they keep us alive).
        unsafe { self.ucx.ucp_cleanup(self.handle) };
    }
}

/// A UCX context with the tag-matching and wakeup features (and RMA when
/// [`UcxConfig::rma`] asks for it). Cheap to clone (shared).
///
/// `Send + Sync`: create it anywhere, then create each [`UcxWorker`](super::UcxWorker) on
/// the thread that will progress it.
#[derive(Clone)]
pub struct UcxContext {
    pub(crate) inner: Arc<ContextInner>,
}

impl UcxContext {
    /// Loads `libucp` (the config's [`library`](UcxConfig::library), else
    /// [`ucx_sys::DEFAULT_LIBRARY`]; once per process and path, see
    /// [`ucx_sys::load_cached`]) and creates a context with `config`.
    ///
    /// Returns [`UcxError::Unavailable`] (naming the path) when that library cannot be
    /// used, never panics.
    pub fn new(config: &UcxConfig) -> Result<Self, UcxError> {
        let _setup = setup::lock();
        let ucx = match config.library() {
            Some(path) => ucx_sys::load_cached(path)?,
            None => ucx_sys::load()?,
        };
        Self::create(ucx, config)
    }

    /// Creates a context from the `libucp` at `path` (opened uncached; the library stays
    /// loaded for the rest of the process, as UCX requires).
    pub fn with_library_path(path: impl AsRef<OsStr>, config: &UcxConfig) -> Result<Self, UcxError> {
        let _setup = setup::lock();
        let ucx: &'static Ucx = Box::leak(Box::new(ucx_sys::load_from(path)?));
        Self::create(ucx, config)
    }

    /// Creates a context from an already loaded library.
    pub fn with_library(ucx: &'static Ucx, config: &UcxConfig) -> Result<Self, UcxError> {
        let _setup = setup::lock();
        Self::create(ucx, config)
    }

    /// Creates the context; the caller holds the [`setup`] lock.
    fn create(ucx: &'static Ucx, config: &UcxConfig) -> Result<Self, UcxError> {
        let ucp_config = ConfigGuard::read(ucx)?;
        let mut defaults = Vec::new();
        for (name, value) in config.default_options(ucx.version(), |name| std::env::var(name).ok()) {
            // A default this UCX does not take leaves UCX's own value: never worth failing for.
            match ucp_config.modify(&name, &value) {
                Ok(()) => defaults.push((name, value)),
                Err(e) => tracing::debug!("UCX refused ferrylink's default {name}={value}: {e}"),
            }
        }
        for (name, value) in &config.options {
            ucp_config.modify(name, value)?;
        }

        // SAFETY: ucp_params_t is plain data (integers, nullable pointers, Option<fn>);
        // all-zero is a valid value and only the fields in field_mask are read.
        let mut params: ucx_sys::ucp_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = (ucx_sys::UCP_PARAM_FIELD_FEATURES | ucx_sys::UCP_PARAM_FIELD_MT_WORKERS_SHARED) as u64;
        params.features = ucx_sys::UCP_FEATURE_TAG as u64;
        if config.wakeup {
            params.features |= ucx_sys::UCP_FEATURE_WAKEUP as u64;
        }
        if config.rma {
            params.features |= ucx_sys::UCP_FEATURE_RMA as u64;
        }
        params.mt_workers_shared = 1;
        let mut handle: ucx_sys::ucp_context_h = ptr::null_mut();
        // SAFETY: params is initialised for its field_mask; the config is live until
        // ucp_config_guard drops (after this call); handle is a writable out-pointer.
        let status = unsafe { ucx_sys::init_version(ucx, &params, ucp_config.0, &mut handle) };
        check("ucp_init_version", status)?;
        // Success with no context: nothing to clean up, and nothing to use.
        let handle = non_null("ucp_init_version", handle)?;
        drop(ucp_config);

        let tcp_segment = effective_tcp_segment(config, &defaults, |name| std::env::var(name).ok());
        let mut inner =
            ContextInner { ucx, handle, memory_types: 0, wakeup: config.wakeup, rma: config.rma, tcp_segment };
        // SAFETY: zeroed ucp_context_attr_t is valid plain data; field_mask selects what
        // UCX fills in.
        let mut attr: ucx_sys::ucp_context_attr_t = unsafe { std::mem::zeroed() };
        attr.field_mask = ucx_sys::UCP_ATTR_FIELD_MEMORY_TYPES as u64;
        // SAFETY: handle is the live context just created; attr is writable.
        let status = Status(unsafe { ucx.ucp_context_query(handle, &mut attr) });
        // On failure `inner` drops here and cleans the context up.
        check("ucp_context_query", status)?;
        inner.memory_types = attr.memory_types;
        tracing::debug!(
            version = %ucx.version(),
            memory_types = format_args!("{:#x}", attr.memory_types),
            ?defaults,
            options = ?config.options,
            "UCX context created"
        );
        Ok(Self { inner: Arc::new(inner) })
    }

    /// The TCP receive segment this context's TCP transport uses, as configured (bytes
    /// when the value parses, else the value as given; `"ucx-default"` when nothing set
    /// it), or `None` when its transports leave TCP out. Both ends of a TCP connection
    /// must use the same one: UCX aborts a receiver whose segments are smaller than the
    /// sender's, so the handshake compares them (see `negotiate`).
    pub fn tcp_segment(&self) -> Option<&str> {
        self.inner.tcp_segment.as_deref()
    }

    /// The loaded library's version.
    pub fn version(&self) -> Version {
        self.inner.ucx.version()
    }

    /// The memory types this context can access, as a bit set indexed by
    /// `ucs_memory_type_t` (bit 0 host, bit 1 CUDA, ...).
    pub fn memory_types(&self) -> u64 {
        self.inner.memory_types
    }

    /// Whether this UCX can send from and receive into CUDA device memory directly
    /// (a CUDA-aware build with its CUDA transports loaded).
    pub fn supports_cuda_memory(&self) -> bool {
        self.inner.memory_types & (1u64 << ucx_sys::UCS_MEMORY_TYPE_CUDA) != 0
    }

    /// Whether the context was created with the RMA feature ([`UcxConfig::rma`]).
    pub fn supports_rma(&self) -> bool {
        self.inner.rma
    }

    /// The raw context, for calls this layer does not wrap. Valid while `self` lives.
    pub fn as_raw(&self) -> ucx_sys::ucp_context_h {
        self.inner.handle
    }
}

impl fmt::Debug for UcxContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UcxContext")
            .field("version", &self.version())
            .field("cuda", &self.supports_cuda_memory())
            .field("rma", &self.supports_rma())
            .finish()
    }
}

/// A `ucp_config_t` released on drop.
struct ConfigGuard(*mut ucx_sys::ucp_config_t, &'static Ucx);

impl ConfigGuard {
    fn read(ucx: &'static Ucx) -> Result<Self, UcxError> {
        let mut config = ptr::null_mut();
        // SAFETY: NULL prefix and file mean "UCX_ environment variables"; config is a
        // writable out-pointer.
        let status = Status(unsafe { ucx.ucp_config_read(ptr::null(), ptr::null(), &mut config) });
        check("ucp_config_read", status)?;
        // A null config is refused before a guard exists: it would be released on drop.
        Ok(Self(non_null("ucp_config_read", config)?, ucx))
    }

    fn modify(&self, name: &str, value: &str) -> Result<(), UcxError> {
        let c_name = CString::new(name).map_err(|_| UcxError::InteriorNul { what: "UCX option name" })?;
        let c_value = CString::new(value).map_err(|_| UcxError::InteriorNul { what: "UCX option value" })?;
        // SAFETY: the config is live (owned by self); both strings are NUL-terminated and
        // outlive the call (UCX copies them).
        let status = Status(unsafe { self.1.ucp_config_modify(self.0, c_name.as_ptr(), c_value.as_ptr()) });
        status.ok().map_err(|status| UcxError::Config { name: name.into(), value: value.into(), status })
    }
}

impl Drop for ConfigGuard {
    fn drop(&mut self) {
        // SAFETY: the config came from ucp_config_read and is released exactly once.
        unsafe { self.1.ucp_config_release(self.0) };
    }
}

#[cfg(test)]
mod segment_tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
    }

    #[test]
    fn sizes_normalise_to_bytes_and_odd_values_stay_as_given() {
        assert_eq!(normalized_size("512K"), "524288");
        assert_eq!(normalized_size(" 64kb "), "65536");
        assert_eq!(normalized_size("1M"), "1048576");
        assert_eq!(normalized_size("65536"), "65536");
        assert_eq!(normalized_size("auto"), "auto");
    }

    #[test]
    fn the_effective_segment_follows_option_then_environment_then_default() {
        let ferrylink = vec![("RX_SEG_SIZE".to_string(), "512K".to_string())];
        let config = UcxConfig::new();
        assert_eq!(effective_tcp_segment(&config, &ferrylink, env(&[])).as_deref(), Some("524288"));
        assert_eq!(effective_tcp_segment(&config, &[], env(&[])).as_deref(), Some("ucx-default"));
        let from_env = env(&[("UCX_TCP_RX_SEG_SIZE", "128K")]);
        assert_eq!(effective_tcp_segment(&config, &[], from_env).as_deref(), Some("131072"));
        let option = UcxConfig::new().set("RX_SEG_SIZE", "1M");
        let from_env = env(&[("UCX_TCP_RX_SEG_SIZE", "128K")]);
        assert_eq!(effective_tcp_segment(&option, &ferrylink, from_env).as_deref(), Some("1048576"));
        // Without TCP among the transports there is no segment to agree on.
        assert_eq!(effective_tcp_segment(&config, &ferrylink, env(&[("UCX_TLS", "shm,cuda_copy")])), None);
    }
}
