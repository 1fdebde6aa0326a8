"""``ferrylink.dask.DeviceHostFile`` with host objects: the host and disk tiers.

No GPU and no ``distributed`` needed. Weights are an entry's serialized bytes: a
1000-element float64 array is 8000 bytes of buffer plus its pickle (``WEIGHT``), so a
16 KiB tier holds two of them, as in dask-cuda's own step-by-step test.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Dict, Iterator, Optional

import numpy as np
import pytest

from ferrylink.dask import CorruptSpillFileError, DeviceHostFile, SpillDiskError
from conftest import Peer

LIMIT = 16 * 1024


def array(seed: int, n: int = 1000) -> np.ndarray:
    return np.random.default_rng(seed).random(n)


def placement(dhf: DeviceHostFile) -> Dict[str, set]:
    return {
        "device": set(dhf.device.keys()),
        "host": set(dhf.host.keys()),
        "disk": set(dhf.disk.keys()),
        "others": set(dhf.others.keys()),
    }


def where(device=(), host=(), disk=(), others=()) -> Dict[str, set]:
    return {"device": set(device), "host": set(host), "disk": set(disk), "others": set(others)}


def spill_files(dhf: DeviceHostFile) -> list:
    return sorted(p for p in os.listdir(dhf.directory) if p.endswith(".spill"))


@pytest.fixture
def dhf(tmp_path):
    return DeviceHostFile(tmp_path, device_memory_limit=LIMIT, memory_limit=LIMIT)


def test_placement_step_by_step_with_promotion_on_read(dhf):
    a = {i: array(i) for i in range(1, 5)}
    dhf["a1"] = a[1]
    weight = dhf.nbytes["host"]
    assert 8000 < weight < LIMIT // 2, "two entries fit a tier"
    assert placement(dhf) == where(host={"a1"})
    dhf["a2"] = a[2]
    assert placement(dhf) == where(host={"a1", "a2"})
    dhf["a3"] = a[3]
    assert placement(dhf) == where(host={"a2", "a3"}, disk={"a1"})
    dhf["a4"] = a[4]
    assert placement(dhf) == where(host={"a3", "a4"}, disk={"a1", "a2"})
    assert dhf.nbytes == {"device": 0, "host": 2 * weight, "disk": 2 * weight}

    # Reading a1 brings it back and pushes the least recently used (a3) down.
    np.testing.assert_array_equal(dhf["a1"], a[1])
    assert placement(dhf) == where(host={"a4", "a1"}, disk={"a2", "a3"})
    # An in-memory read returns the very object stored and makes it most recent.
    assert dhf["a4"] is a[4]
    dhf["a2"] = a[2]  # replacing a key drops the old entry first
    assert placement(dhf) == where(host={"a4", "a2"}, disk={"a1", "a3"})
    assert len(spill_files(dhf)) == 2
    for k in ("a1", "a2", "a3", "a4"):
        np.testing.assert_array_equal(dhf[k], a[int(k[1])])
    stats = dhf.stats()
    assert stats["host_to_disk"] >= 5 and stats["unspilled_from_disk"] >= 3
    assert stats["device_entries"] == 0
    assert stats["host_releasing"] == 0, "small evicted copies are freed in line"


def test_deletion_frees_every_tier_and_file(dhf):
    for i in range(6):
        dhf[f"x{i}"] = array(i)
    assert len(dhf.disk) == 4 and len(spill_files(dhf)) == 4
    assert sorted(dhf) == [f"x{i}" for i in range(6)] and len(dhf) == 6
    for i in range(6):
        assert f"x{i}" in dhf
        del dhf[f"x{i}"]
        assert f"x{i}" not in dhf
    assert placement(dhf) == where()
    assert dhf.nbytes == {"device": 0, "host": 0, "disk": 0}
    assert spill_files(dhf) == [] and len(dhf) == 0
    with pytest.raises(KeyError):
        dhf["x0"]
    with pytest.raises(KeyError):
        del dhf["x0"]


def test_an_oversize_object_goes_straight_to_disk_and_is_read_there(dhf):
    dhf["small"] = array(1)
    big = array(2, 4000)  # 32 KB, twice the host tier
    dhf["big"] = big
    assert placement(dhf) == where(host={"small"}, disk={"big"}), "evicting nothing"
    np.testing.assert_array_equal(dhf["big"], big)
    assert placement(dhf) == where(host={"small"}, disk={"big"}), "read from disk, left there"
    assert dhf["small"] is not None and len(spill_files(dhf)) == 1
    del dhf["big"]
    assert spill_files(dhf) == []


def test_no_limit_keeps_everything_in_memory(tmp_path):
    dhf = DeviceHostFile(tmp_path, device_memory_limit=None, memory_limit=0)
    values = {f"k{i}": array(i, 10_000) for i in range(20)}
    dhf.update(values)
    assert placement(dhf) == where(host=set(values))
    assert all(dhf[k] is v for k, v in values.items())


def test_limits_take_sizes_and_refuse_nonsense(tmp_path):
    dhf = DeviceHostFile(tmp_path, device_memory_limit="1MiB", memory_limit="16KiB")
    for i in range(3):
        dhf[i] = array(i)
    assert placement(dhf) == where(host={1, 2}, disk={0})
    for bad in (-1, "lots", [3]):
        with pytest.raises(ValueError, match="memory_limit"):
            DeviceHostFile(tmp_path, memory_limit=bad)


def test_evict_returns_the_bytes_freed_or_minus_one(dhf):
    assert dhf.evict() == -1, "nothing to evict"
    assert not dhf.fast
    dhf["a"] = array(1)
    dhf["b"] = array(2)
    dhf["a"]  # b is now the least recently used
    weight = dhf.nbytes["host"] // 2
    assert len(dhf.fast) == 2
    assert dhf.evict() == weight
    assert placement(dhf) == where(host={"a"}, disk={"b"})
    assert dhf.evict() == weight
    assert placement(dhf) == where(disk={"a", "b"})
    assert not dhf.fast and dhf.evict() == -1
    np.testing.assert_array_equal(dhf["b"], array(2))


def test_keys_of_any_hashable_kind_and_values_that_cannot_be_pickled(dhf):
    lock = threading.Lock()
    dhf[("x", 0, 1)] = array(1)
    dhf[b"y"] = {"nested": [array(2), "text", 3]}
    dhf["lock"] = lock
    assert dhf["lock"] is lock and placement(dhf)["others"] == {"lock"}
    assert dhf.tier_of("lock") == "others" and dhf.tier_of("missing") is None
    dhf["z"] = array(3)
    got = dhf[b"y"]
    np.testing.assert_array_equal(got["nested"][0], array(2))
    assert got["nested"][1:] == ["text", 3]
    np.testing.assert_array_equal(dhf[("x", 0, 1)], array(1))
    assert len(dhf) == 4 and set(dhf) == {("x", 0, 1), b"y", "lock", "z"}
    del dhf["lock"]
    assert "lock" not in dhf and len(dhf) == 3


def test_a_corrupt_spill_file_raises_and_memory_is_untouched(dhf):
    for i in range(3):
        dhf[f"a{i}"] = array(i)
    assert placement(dhf) == where(host={"a1", "a2"}, disk={"a0"})
    (name,) = spill_files(dhf)
    path = Path(dhf.directory, name)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))

    with pytest.raises(CorruptSpillFileError, match="checksum"):
        dhf["a0"]
    assert placement(dhf) == where(host={"a1", "a2"}, disk={"a0"})
    np.testing.assert_array_equal(dhf["a1"], array(1))
    np.testing.assert_array_equal(dhf["a2"], array(2))
    del dhf["a0"]
    assert spill_files(dhf) == [] and placement(dhf) == where(host={"a1", "a2"})


@contextlib.contextmanager
def tmpfs(path: Path, size: str, read_only: bool = False) -> Iterator[Optional[Path]]:
    """A tmpfs of ``size`` mounted at ``path`` (``None`` where mounting is not
    allowed: not root, or no mount namespace of our own)."""
    path.mkdir()
    options = f"size={size}" + (",ro" if read_only else "")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    try:
        yield path if mounted.returncode == 0 else None
    finally:
        if mounted.returncode == 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_a_full_tmpfs_raises_enospc_and_keeps_memory(tmp_path):
    with tmpfs(tmp_path / "small", "64k") as mnt:
        if mnt is None:
            pytest.skip("cannot mount a tmpfs here (needs root); the file-size-limit test covers a failing write")
        dhf = DeviceHostFile(mnt, memory_limit=LIMIT)
        stored = {}
        with pytest.raises(SpillDiskError) as failure:
            for i in range(40):  # 64 KiB of tmpfs holds at most 8 entries
                stored[i] = array(i)
                dhf[i] = stored[i]
        assert failure.value.errno == errno.ENOSPC
        failed = max(stored)
        assert failed not in dhf and failed >= 2
        for k in range(failed):
            assert dhf.tier_of(k) in ("host", "disk")
            np.testing.assert_array_equal(dhf[k], stored[k])
        assert dhf.stats()["disk_write_errors"] >= 1
        assert not [p for p in os.listdir(dhf.directory) if p.endswith(".tmp")]
        del dhf


# A child with a file size limit of 4 KiB: the small entry's file fits, a 1000-element
# array's does not (EFBIG; SIGXFSZ ignored so the write fails instead of killing the
# process).
FILE_SIZE_LIMIT_CHILD = r"""
import errno, json, resource, signal, sys
import numpy as np
from ferrylink.dask import DeviceHostFile, SpillDiskError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
dhf = DeviceHostFile(sys.argv[1], memory_limit=16 * 1024)
a = {i: np.random.default_rng(i).random(100 if i == 0 else 1000) for i in range(4)}
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
out = {}
dhf[0] = a[0]; dhf[1] = a[1]; dhf[2] = a[2]          # 0 goes to disk: its file fits
try:
    dhf[3] = a[3]                                    # 1's file does not
except SpillDiskError as e:
    out["errno"] = e.errno
out["evict"] = dhf.evict()                           # fails too: -1, no exception
out["tiers"] = {str(k): dhf.tier_of(k) for k in range(4)}
out["equal"] = all(np.array_equal(dhf[k], a[k]) for k in range(3))
out["tiers_after_reads"] = {str(k): dhf.tier_of(k) for k in range(3)}
out["errors"] = dhf.stats()["disk_write_errors"]
print(json.dumps(out))
"""


def test_a_file_size_limit_fails_the_write_and_keeps_memory(tmp_path):
    import json

    done = subprocess.run(
        [sys.executable, "-B", "-c", FILE_SIZE_LIMIT_CHILD, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=Peer.child_env(),
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["errno"] == errno.EFBIG
    assert out["evict"] == -1
    assert out["tiers"] == {"0": "disk", "1": "host", "2": "host", "3": None}
    assert out["equal"] is True
    # Reading 0 back needs 1 written out, which fails: 0 stays on disk.
    assert out["tiers_after_reads"] == {"0": "disk", "1": "host", "2": "host"}
    assert out["errors"] >= 3


def test_an_unwritable_directory_raises_and_keeps_memory(tmp_path):
    if os.geteuid() == 0:
        with tmpfs(tmp_path / "ro", "1m", read_only=True) as mnt:
            if mnt is None:
                pytest.skip("root ignores permissions and a read-only tmpfs cannot be mounted here")
            with pytest.raises(SpillDiskError) as failure:
                DeviceHostFile(mnt, memory_limit=LIMIT)
            assert failure.value.errno == errno.EROFS
        with tmpfs(tmp_path / "rw", "1m") as mnt:
            assert mnt is not None
            dhf = DeviceHostFile(mnt, memory_limit=LIMIT)
            dhf[0] = array(0)
            dhf[1] = array(1)
            remount = subprocess.run(["mount", "-o", "remount,ro", str(mnt)], capture_output=True)
            assert remount.returncode == 0, remount.stderr
            expected_errno = errno.EROFS
            check_later_write(dhf, expected_errno)
            del dhf
    else:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        try:
            with pytest.raises(SpillDiskError) as failure:
                DeviceHostFile(locked / "inner", memory_limit=LIMIT)
            assert failure.value.errno == errno.EACCES
            dhf = DeviceHostFile(tmp_path, memory_limit=LIMIT)
            dhf[0] = array(0)
            dhf[1] = array(1)
            Path(dhf.directory).chmod(0o500)
            check_later_write(dhf, errno.EACCES)
            Path(dhf.directory).chmod(0o700)
        finally:
            locked.chmod(0o700)


def check_later_write(dhf: DeviceHostFile, expected_errno: int) -> None:
    """The directory became unwritable after two entries were stored in memory."""
    with pytest.raises(SpillDiskError) as failure:
        dhf[2] = array(2)
    assert failure.value.errno == expected_errno
    assert failure.value.filename and failure.value.filename.startswith(dhf.directory)
    assert dhf.evict() == -1
    assert placement(dhf) == where(host={0, 1})
    np.testing.assert_array_equal(dhf[0], array(0))
    np.testing.assert_array_equal(dhf[1], array(1))


@pytest.mark.parametrize("count,sizes", [(10, (1, 1000)), (100, (100, 100)), (100, (1, 1000)), (30, (1000, 1000))])
def test_shuffled_sets_reads_and_deletes_like_dask_cuda(tmp_path, count, sizes):
    rng = np.random.default_rng(count + sizes[0])
    dhf = DeviceHostFile(tmp_path, device_memory_limit=LIMIT, memory_limit=LIMIT)
    items = [(f"x-{i}", rng.random(int(rng.integers(sizes[0], sizes[1] + 1)))) for i in range(count)]
    for k, v in [items[i] for i in rng.permutation(count)]:
        dhf[k] = v
        assert dhf.nbytes["host"] <= LIMIT
    assert len(dhf) == count and set(dhf) == {k for k, _ in items}
    for k, v in [items[i] for i in rng.permutation(count)]:
        np.testing.assert_array_equal(dhf[k], v)
        assert dhf.nbytes["host"] <= LIMIT
        del dhf[k]
    assert placement(dhf) == where() and spill_files(dhf) == [] and len(dhf) == 0


def test_stored_objects_are_let_go_when_they_leave_memory(tmp_path):
    import gc

    a, b, c = array(1), array(2), array(3)
    counts = [sys.getrefcount(a), sys.getrefcount(b), sys.getrefcount(c)]
    dhf = DeviceHostFile(tmp_path, memory_limit=LIMIT)
    dhf["a"], dhf["b"] = a, b
    assert sys.getrefcount(a) > counts[0], "held while in memory"
    dhf["c"] = c  # a goes to disk: the mapping and the store let go of it
    assert sys.getrefcount(a) == counts[0]
    del dhf["b"]
    assert sys.getrefcount(b) == counts[1]
    del dhf
    gc.collect()
    assert sys.getrefcount(c) == counts[2], "a dropped mapping lets go at once"


def test_threads_sharing_a_mapping(tmp_path):
    dhf = DeviceHostFile(tmp_path, memory_limit=LIMIT)
    errors: list = []

    def work(t: int) -> None:
        try:
            for i in range(150):
                key = (t, i % 7)
                dhf[key] = array(t * 1000 + i, 300)
                np.testing.assert_array_equal(dhf[key], array(t * 1000 + i, 300))
                if i % 3 == 0:
                    del dhf[key]
                if i % 5 == 0:
                    dhf.evict()
        except Exception as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not any(th.is_alive() for th in threads), "a thread is stuck"
    assert errors == []
    assert dhf.nbytes["host"] <= LIMIT
    assert len(dhf) == len(dhf.device) + len(dhf.host) + len(dhf.disk)
    for key in list(dhf):
        t, j = key
        last = max(i for i in range(150) if i % 7 == j)
        np.testing.assert_array_equal(dhf[key], array(t * 1000 + last, 300))
