"""``DeviceHostFile``: a Dask worker's data store over ferrylink's tiered spill store.

Device objects (``__cuda_array_interface__``: torch CUDA tensors, CuPy, Numba, RMM)
live in the device tier, host objects in the host tier; past a tier's byte limit the
least recently used entries move down (device → host through the pinned pool, host →
disk into checksummed files), and reading an entry brings it back up. The tiers, their
budgets, the copies and the files are the Rust store's (``ferrylink-spill``); this
module keeps the keys and the original objects of the entries still in memory as they
were stored.
"""

from __future__ import annotations

import itertools
import logging
import os
import tempfile
import threading
from collections.abc import Mapping, MutableMapping
from typing import Any, Dict, Hashable, Iterator, Optional, Tuple, Union

from .. import _ferrylink
from .._core import _host_view
from ._serializers import decode_entry, encode_entry, shared_pinned_pool
from ._spill_errors import SpillError

__all__ = ["DeviceHostFile"]

Key = Hashable
Limit = Union[int, float, str, None]

logger = logging.getLogger("distributed.worker")


def _limit(limit: Limit, name: str) -> Optional[int]:
    """A byte limit as the store takes it (``None``: no limit)."""
    if limit is None:
        return None
    size: Any = limit
    if isinstance(limit, str):
        try:
            size = _ferrylink.parse_size(limit)
        except ValueError:
            size = None
    if isinstance(size, bool) or not isinstance(size, (int, float)) or size < 0:
        raise ValueError(f"{name} must be a number of bytes, a size such as '4GiB', or None, not {limit!r}")
    return int(size) or None


def _nbytes(frame: Any) -> int:
    nbytes = getattr(frame, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    size = getattr(frame, "size", None)  # rmm.DeviceBuffer
    if isinstance(size, int) and hasattr(frame, "__cuda_array_interface__"):
        return size
    return memoryview(frame).nbytes


class _TierView(Mapping):
    """The keys of one tier (``dhf.device``, ``dhf.host``, ``dhf.disk``), read-only.
    Its values are the mapping's, read as :meth:`DeviceHostFile.__getitem__` reads
    them (which may move them up)."""

    def __init__(self, owner: "DeviceHostFile", tier: str) -> None:
        self._owner = owner
        self._tier = tier

    def __iter__(self) -> Iterator[Key]:
        return iter([k for k in list(self._owner._ids) if self._owner.tier_of(k) == self._tier])

    def __len__(self) -> int:
        return int(self._owner._store.stats()[f"{self._tier}_entries"])

    def __contains__(self, key: object) -> bool:
        return self._owner.tier_of(key) == self._tier  # type: ignore[arg-type]

    def __getitem__(self, key: Key) -> Any:
        if self._owner.tier_of(key) != self._tier:
            raise KeyError(key)
        return self._owner[key]


class DeviceHostFile(MutableMapping):
    """A ``MutableMapping`` a Dask worker takes as its data (``Worker(data=...)``,
    ``LocalCluster(data=(DeviceHostFile, {...}))``), with dask-cuda's constructor.

    Parameters
    ----------
    worker_local_directory:
        Where spill files go (the store makes a directory of its own in it, removed
        when the mapping is dropped); Dask passes the worker's local directory. ``None``:
        the system's temporary directory.
    device_memory_limit:
        Bytes of device memory per device for device objects; past it the least
        recently used move to host memory. ``None`` or 0: no limit.
    memory_limit:
        Bytes of host memory for host entries (host objects and the host copies of
        device objects); past it the least recently used move to disk. ``None`` or 0:
        no limit. Sizes such as ``"4GiB"`` are taken for either limit.
    log_spilling:
        Log each entry moved down a tier to the ``distributed.worker`` logger (INFO).
    pinned_pool:
        The pinned pool device objects are copied into (default: the process's shared
        pool, on a machine with a GPU).

    An entry's weight is its bytes: a device object's device bytes in the device tier,
    its serialized bytes (pickle protocol 5, buffers out of band) in the host and disk
    tiers. An entry heavier than a tier goes straight to the next one. Reading an entry
    that lies below where it belongs moves it up (a copy is stored under a fresh
    identity, then the old one removed, so a failed move leaves it where it was); one
    heavier than the tier above is read and left where it is.

    Values that cannot be pickled are kept in memory as they are, in :attr:`others`,
    and never spilled. Failures raise the classes of ``ferrylink.dask`` (a full disk
    or an unwritable directory: :class:`~ferrylink.dask.SpillDiskError`, an ``OSError``
    with its ``errno``; a damaged file: :class:`~ferrylink.dask.CorruptSpillFileError`)
    and lose nothing that was in memory.
    """

    def __init__(
        self,
        worker_local_directory: Union[str, "os.PathLike[str]", None] = None,
        *,
        device_memory_limit: Limit = None,
        memory_limit: Limit = None,
        log_spilling: bool = False,
        pinned_pool: Optional[_ferrylink.PinnedPool] = None,
    ) -> None:
        directory = os.fspath(worker_local_directory) if worker_local_directory else tempfile.gettempdir()
        device_limit = _limit(device_memory_limit, "device_memory_limit")
        host_limit = _limit(memory_limit, "memory_limit")
        if pinned_pool is None and _ferrylink.device_count() > 0:
            pinned_pool = shared_pinned_pool()
        self._store = _ferrylink.SpillStore(device_limit, host_limit, directory, pinned_pool)
        self._device_budget, self._host_budget = self._store.budgets
        self._lock = threading.RLock()
        self._ids: Dict[Key, int] = {}
        self._keys: Dict[int, Key] = {}
        # The value each entry was stored from, while the entry is in that value's tier.
        self._live: Dict[int, Any] = {}
        # (weight, device bytes) of each entry.
        self._sizes: Dict[int, Tuple[int, int]] = {}
        self._next_id = itertools.count(1)
        self.log_spilling = log_spilling
        self.addr = "Unknown Address"
        #: Values kept as they are and never spilled (they cannot be pickled).
        self.others: Dict[Key, Any] = {}

    @property
    def device(self) -> Mapping:
        """The keys in the device tier (a read-only view)."""
        return _TierView(self, "device")

    @property
    def host(self) -> Mapping:
        """The keys in the host tier (a read-only view)."""
        return _TierView(self, "host")

    @property
    def disk(self) -> Mapping:
        """The keys in the disk tier (a read-only view)."""
        return _TierView(self, "disk")

    # -- Dask's memory manager (distributed.spill.ManualEvictProto) --------------------

    @property
    def fast(self) -> Mapping:
        """Host memory: what :meth:`evict` moves to disk (empty: nothing to evict)."""
        return self.host

    def evict(self) -> int:
        """Moves the least recently used host entry to disk: the bytes it freed, or -1
        when nothing could be evicted (none there, or the write failed: the entry stays
        in memory and the failure is logged). Never raises."""
        try:
            with self._lock:
                try:
                    evicted = self._store.evict_lru("host")
                finally:
                    self._drop_evicted()
        except Exception as e:  # the memory manager's contract: log, never raise
            logger.warning("Worker at <%s>: could not evict to disk: %s", self.addr, e)
            return -1
        return -1 if evicted is None else int(evicted[1])

    def set_address(self, addr: str) -> None:
        """The worker's address, for the spill log lines."""
        self.addr = addr

    # -- the mapping ---------------------------------------------------------------

    def __setitem__(self, key: Key, value: Any) -> None:
        with self._lock:
            if key in self:
                del self[key]
            try:
                header, frames, on_device = encode_entry(value)
            except Exception as e:
                logger.info("Worker at <%s>: key %r cannot be pickled (%s): kept in memory", self.addr, key, e)
                self.others[key] = value
                return
            self._store_entry(key, value, header, frames, on_device)

    def _store_entry(self, key: Key, value: Any, header: bytes, frames: list, on_device: bool) -> int:
        """Stores an encoded entry under a fresh identity for ``key``; raises without
        changing what ``key`` referred to."""
        ident = next(self._next_id)
        try:
            self._store.insert(ident, header, frames)
        finally:
            self._drop_evicted()
        old = self._ids.get(key)
        if old is not None:
            self._forget(old)
        self._ids[key] = ident
        self._keys[ident] = key
        device_bytes = sum(_nbytes(f) for f in frames if hasattr(f, "__cuda_array_interface__"))
        self._sizes[ident] = (sum(_nbytes(f) for f in frames), device_bytes)
        if self._store.tier(ident) == ("device" if on_device else "host"):
            self._live[ident] = value
        return ident

    def __getitem__(self, key: Key) -> Any:
        with self._lock:
            if key in self.others:
                return self.others[key]
            ident = self._ids[key]
            if ident in self._live:
                self._store.touch(ident)
                return self._live[ident]
            return self._load(key, ident)

    def _load(self, key: Key, ident: int) -> Any:
        """Reads an entry that is not in memory as it was stored, and moves it up
        when the tier it belongs to can hold it."""
        weight, device_bytes = self._sizes[ident]
        entry = self._store.read(ident, bool(device_bytes))
        if entry is None:
            raise KeyError(key)
        header, frames = entry
        value = decode_entry(header, [_host_view(f) for f in frames])
        fits = device_bytes <= self._device_budget if device_bytes else weight <= self._host_budget
        if not fits:
            return value
        header, frames, on_device = encode_entry(value)
        try:
            self._store_entry(key, value, header, frames, on_device)
        except SpillError as e:
            logger.warning("Worker at <%s>: key %r stays where it was: %s", self.addr, key, e)
        return value

    def __delitem__(self, key: Key) -> None:
        with self._lock:
            if key in self.others:
                del self.others[key]
                return
            self._forget(self._ids.pop(key))

    def _forget(self, ident: int) -> None:
        """Drops an entry from every tier."""
        self._store.remove(ident)
        self._keys.pop(ident, None)
        self._live.pop(ident, None)
        self._sizes.pop(ident, None)

    def _drop_evicted(self) -> None:
        """Lets go of the original values of the entries the store moved down."""
        for ident in self._store.drain_evicted():
            self._live.pop(ident, None)
            if self.log_spilling and ident in self._keys:
                logger.info(
                    "Worker at <%s>: Spilled key %s with %s bytes to %s",
                    self.addr,
                    self._keys[ident],
                    self._sizes.get(ident, (0, 0))[0],
                    self._store.tier(ident),
                )

    def __contains__(self, key: object) -> bool:
        return key in self._ids or key in self.others

    def __len__(self) -> int:
        return len(self._ids) + len(self.others)

    def __iter__(self) -> Iterator[Key]:
        return iter([*self._ids, *self.others])

    # -- where things are ----------------------------------------------------------

    def tier_of(self, key: Key) -> Optional[str]:
        """``"device"``, ``"host"``, ``"disk"``, ``"others"``, or ``None`` for a key
        not in the mapping."""
        if key in self.others:
            return "others"
        ident = self._ids.get(key)
        return None if ident is None else self._store.tier(ident)

    @property
    def nbytes(self) -> Dict[str, int]:
        """Bytes counted in each tier (``device``, ``host``, ``disk``)."""
        s = self._store.stats()
        return {t: int(s[f"{t}_bytes"]) for t in ("device", "host", "disk")}

    def stats(self) -> Dict[str, int]:
        """Entries and bytes per tier, and the store's counters (evictions each way,
        reads from disk, bytes written and read, failed writes)."""
        return dict(self._store.stats())

    @property
    def directory(self) -> str:
        """The store's own directory of spill files."""
        return os.fspath(self._store.directory)

    def __repr__(self) -> str:
        n = self.nbytes
        return (
            f"<DeviceHostFile: {len(self)} keys; device {len(self.device)} ({n['device']} B), "
            f"host {len(self.host)} ({n['host']} B), disk {len(self.disk)} ({n['disk']} B), "
            f"others {len(self.others)}>"
        )
