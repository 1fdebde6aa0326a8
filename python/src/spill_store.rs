//! The tiered device → host → disk store of `ferrylink-spill` for Python
//! (`ferrylink._ferrylink.SpillStore`), the engine of `ferrylink.dask.DeviceHostFile`.
//!
//! Entries are keyed by integers (the mapping keeps the Dask keys); each is a header
//! (bytes) and frames taken from Python objects without a copy: device memory of CUDA
//! objects, host memory through the buffer protocol. The store keeps those objects alive
//! while the entry's frames are theirs, and lets go of them when the entry moves down a
//! tier (device frames copied into the pinned pool, host frames written to a checksummed
//! file). Every operation runs with the GIL released. The store records the keys it
//! moves down ([`PySpillStore::drain_evicted`]), so the mapping can drop its own
//! references to the original objects.
//!
//! Errors are the classes of `ferrylink.dask._spill_errors`: `SpillDiskError` (an
//! `OSError` with the errno: a full disk, an unwritable directory), `CorruptSpillFileError`,
//! `SpillNoRoomError` (a `MemoryError`) and `SpillError`.

use std::mem::ManuallyDrop;
use std::path::PathBuf;

use crate::frames_in::{frames_from_python, Use};
use crate::frames_out::frame_to_python;
use crate::pybuffer::release_deferred;
use crate::spill_copy::{wait_for_producers, PyPinnedPool};
use ferrylink::memory::PinnedPool;
use ferrylink::spill::{SpillConfig, SpillError, SpillStats, SpillStore, Tier, TierStats};
use ferrylink::Message;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyModule, PyType};
use pyo3::PyErrArguments;

/// The module defining the spill exception classes.
static SPILL_ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// An exception of class `name` of `ferrylink.dask._spill_errors`, made from `args`.
fn spill_exception<A>(py: Python<'_>, name: &str, args: A) -> PyErr
where
    A: PyErrArguments + Send + Sync + 'static,
{
    let module = match SPILL_ERRORS.get_or_try_init(py, || py.import("ferrylink.dask._spill_errors").map(Bound::unbind))
    {
        Ok(m) => m.bind(py),
        Err(e) => return e,
    };
    match module.getattr(name).and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from)) {
        Ok(class) => PyErr::from_type(class, args),
        Err(e) => e,
    }
}

/// A store error as its Python class.
pub(crate) fn spill_error(py: Python<'_>, e: &SpillError) -> PyErr {
    match e {
        SpillError::Io { source, path, .. } => {
            let errno = source.raw_os_error().unwrap_or(0);
            let path = path.to_string_lossy().into_owned();
            spill_exception(py, "SpillDiskError", (errno, e.to_string(), path))
        }
        SpillError::Corrupt { .. } => spill_exception(py, "CorruptSpillFileError", (e.to_string(),)),
        SpillError::NoRoom { .. } => spill_exception(py, "SpillNoRoomError", (e.to_string(),)),
        // `Serialize`, and kinds of error added later.
        _ => spill_exception(py, "SpillError", (e.to_string(),)),
    }
}

fn tier_name(tier: Tier) -> &'static str {
    match tier {
        Tier::Device => "device",
        Tier::Host => "host",
        Tier::Disk => "disk",
    }
}

fn tier_named(name: &str) -> PyResult<Tier> {
    match name {
        "device" => Ok(Tier::Device),
        "host" => Ok(Tier::Host),
        "disk" => Ok(Tier::Disk),
        other => Err(PyValueError::new_err(format!("{other:?} is not a tier (device, host or disk)"))),
    }
}

/// A limit of `None` (or 0) as no limit.
fn budget(limit: Option<usize>) -> usize {
    match limit {
        None | Some(0) => usize::MAX,
        Some(n) => n,
    }
}

/// An entry handed to Python: `(header, [HostFrame, ...])`.
type PyEntry = (Py<PyBytes>, Vec<Py<PyAny>>);

/// A message taken out of the store as a [`PyEntry`].
fn message_to_python(py: Python<'_>, msg: Message) -> PyResult<PyEntry> {
    let header = PyBytes::new(py, &msg.header).unbind();
    let frames = msg.frames.into_iter().map(|f| frame_to_python(py, f)).collect::<PyResult<Vec<_>>>()?;
    Ok((header, frames))
}

/// `ferrylink-spill`'s store, keyed by integers.
#[pyclass(name = "SpillStore", module = "ferrylink", frozen)]
pub(crate) struct PySpillStore {
    /// Dropped by hand (see `Drop`), so the buffer exports of its entries are released
    /// as it goes rather than at some later call.
    store: ManuallyDrop<SpillStore<u64>>,
    pool: Option<PinnedPool>,
    device_budget: usize,
    host_budget: usize,
}

#[pymethods]
impl PySpillStore {
    /// A store whose device tier holds up to `device_limit` bytes per device and whose
    /// host tier holds `host_limit` bytes (`None` or 0: no limit), spilling to its own
    /// directory under `directory`; device frames are copied into `pool`.
    #[new]
    #[pyo3(signature = (device_limit, host_limit, directory, pool = None))]
    fn new(
        py: Python<'_>,
        device_limit: Option<usize>,
        host_limit: Option<usize>,
        directory: PathBuf,
        pool: Option<&Bound<'_, PyPinnedPool>>,
    ) -> PyResult<Self> {
        let (device_budget, host_budget) = (budget(device_limit), budget(host_limit));
        let mut config = SpillConfig::new(device_budget, host_budget, directory).with_recorded_evictions();
        let pool = pool.map(|p| p.get().pool.clone());
        if let Some(pool) = &pool {
            config = config.with_pinned_pool(pool.clone());
        }
        let store = py.detach(|| SpillStore::new(config)).map_err(|e| spill_error(py, &e))?;
        Ok(Self { store: ManuallyDrop::new(store), pool, device_budget, host_budget })
    }

    /// The store's own directory (removed when the store is dropped).
    #[getter]
    fn directory(&self) -> PathBuf {
        self.store.dir().to_path_buf()
    }

    /// `(device, host)` budgets in bytes (no limit: the largest integer).
    #[getter]
    fn budgets(&self) -> (usize, usize) {
        (self.device_budget, self.host_budget)
    }

    /// Inserts (or replaces) entry `key`: `header` and the frames of `frames` (device
    /// objects and buffers, taken without a copy and kept alive by the entry). It goes to
    /// the highest tier it fits, evicting least recently used entries down as needed. On
    /// error the entry is not stored (a replaced one is gone) and what evictions were done
    /// stay done.
    fn insert(&self, py: Python<'_>, key: u64, header: &[u8], frames: &Bound<'_, PyAny>) -> PyResult<()> {
        let frames = frames_from_python(frames, Use::Send)?;
        let msg = Message::new(header.to_vec(), frames);
        let result = py.detach(|| {
            if let Err(e) = wait_for_producers(&msg.frames) {
                return Err((SpillError::Serialize(ferrylink::memory::serialize::SerializeError::Cuda(e)), None));
            }
            self.store.insert(key, msg).map_err(|r| (r.error, Some(r.message)))
        });
        let outcome = result.map_err(|(e, message)| {
            drop(message);
            spill_error(py, &e)
        });
        release_deferred(py);
        outcome
    }

    /// A copy of entry `key` in host memory as `(header, frames)` (`HostFrame`s), the
    /// entry left where it is and marked most recently used (from disk: read, checksum
    /// verified); `None` without such an entry. With `pinned`, the copies lie in the
    /// store's pinned pool when it has room (for copies to the device), otherwise in
    /// fresh memory.
    fn read(&self, py: Python<'_>, key: u64, pinned: bool) -> PyResult<Option<PyEntry>> {
        let pool = if pinned { self.pool.as_ref() } else { None };
        let copied = py.detach(|| self.store.read(&key, pool));
        match copied {
            Ok(Some(hm)) => message_to_python(py, hm.into_message()).map(Some),
            Ok(None) => Ok(None),
            Err(e) => Err(spill_error(py, &e)),
        }
    }

    /// Marks entry `key` most recently used; whether it exists. An entry on disk is
    /// only marked (never read).
    fn touch(&self, py: Python<'_>, key: u64) -> PyResult<bool> {
        let touched = py.detach(|| match self.store.tier(&key) {
            None => Ok(false),
            Some(Tier::Disk) => Ok(true),
            Some(_) => self.store.with(&key, |_| ()).map(|found| found.is_some()),
        });
        touched.map_err(|e| spill_error(py, &e))
    }

    /// Drops entry `key` from whichever tier holds it (deleting its file); whether it
    /// existed.
    fn remove(&self, py: Python<'_>, key: u64) -> bool {
        let removed = py.detach(|| self.store.remove(&key));
        release_deferred(py);
        removed
    }

    /// `"device"`, `"host"`, `"disk"`, or `None` without such an entry.
    fn tier(&self, key: u64) -> Option<&'static str> {
        self.store.tier(&key).map(tier_name)
    }

    fn __contains__(&self, key: u64) -> bool {
        self.store.contains(&key)
    }

    fn __len__(&self) -> usize {
        self.store.len()
    }

    /// Moves the least recently used entry of `tier` (`"device"` or `"host"`) one tier
    /// down: `(key, bytes freed in that tier)`, or `None` when the tier is empty.
    fn evict_lru(&self, py: Python<'_>, tier: &str) -> PyResult<Option<(u64, usize)>> {
        let tier = tier_named(tier)?;
        let evicted = py.detach(|| self.store.evict_lru(tier));
        release_deferred(py);
        evicted.map_err(|e| spill_error(py, &e))
    }

    /// The keys moved down a tier since the last call, oldest first.
    fn drain_evicted(&self) -> Vec<u64> {
        self.store.drain_evicted()
    }

    /// Entries and bytes per tier and the store's counters.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        stats_dict(py, &self.store.stats())
    }
}

impl Drop for PySpillStore {
    /// Drops the entries, then releases the buffer exports they held (the objects stored
    /// go with the store, not at the next call into ferrylink).
    fn drop(&mut self) {
        // SAFETY: `store` is dropped once, here, and never used after: `self` goes next.
        unsafe { ManuallyDrop::drop(&mut self.store) };
        Python::attach(release_deferred);
    }
}

fn stats_dict<'py>(py: Python<'py>, s: &SpillStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let tiers: [(&str, &TierStats); 3] = [("device", &s.device), ("host", &s.host), ("disk", &s.disk)];
    for (name, t) in tiers {
        d.set_item(format!("{name}_entries"), t.entries)?;
        d.set_item(format!("{name}_bytes"), t.bytes)?;
    }
    d.set_item("host_releasing", s.host_releasing)?;
    d.set_item("device_to_host", s.device_to_host)?;
    d.set_item("device_to_disk", s.device_to_disk)?;
    d.set_item("host_to_disk", s.host_to_disk)?;
    d.set_item("unspilled_from_disk", s.unspilled_from_disk)?;
    d.set_item("disk_bytes_written", s.disk_bytes_written)?;
    d.set_item("disk_bytes_read", s.disk_bytes_read)?;
    d.set_item("disk_write_errors", s.disk_write_errors)?;
    Ok(d)
}
