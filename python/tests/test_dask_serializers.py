"""``ferrylink.dask``'s serialization without a GPU: store entries of host objects, the
device-object rules, and the ``"ferrylink"`` family's handling of what it does not
take (device round trips: test_dask_device_host_file_gpu.py)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import ferrylink
from ferrylink import _ferrylink
from ferrylink.dask import _serializers as ser


class FakeCudaArray:
    """Says it is device memory; no library ferrylink knows made it."""

    def __init__(self, n: int) -> None:
        self.n = n

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": (self.n,), "typestr": "|u1", "data": (0, False), "version": 3}


VALUES = [
    np.arange(1000, dtype=np.float64),
    np.arange(24, dtype=np.int16).reshape(2, 3, 4)[:, ::2],  # not contiguous
    np.asfortranarray(np.arange(12.0).reshape(3, 4)),
    np.array([], dtype=np.uint8),
    {"a": [1, 2.5, "x"], "b": (np.ones(3), b"bytes")},
    "just text",
    None,
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_host_entries_round_trip_exactly(value):
    header, frames, on_device = ser.encode_entry(value)
    assert on_device is False
    # As the store gives them back: copies in fresh memory.
    back = ser.decode_entry(header, [bytearray(memoryview(f).cast("B")) for f in frames])
    if isinstance(value, np.ndarray):
        assert back.dtype == value.dtype and back.shape == value.shape
        np.testing.assert_array_equal(back, value)
    elif isinstance(value, dict):
        assert back["a"] == value["a"] and back["b"][1] == b"bytes"
        np.testing.assert_array_equal(back["b"][0], value["b"][0])
    else:
        assert back == value


def test_array_buffers_are_taken_without_a_copy():
    a = np.arange(1 << 16, dtype=np.float32)
    _, frames, _ = ser.encode_entry(a)
    assert len(frames) == 2, "the pickle, then the array's buffer out of band"
    buffer = np.frombuffer(frames[1], dtype=np.float32)
    assert buffer.ctypes.data == a.ctypes.data


def test_entries_that_are_not_ferrylinks_are_refused():
    with pytest.raises(ValueError, match="not a ferrylink spill entry"):
        ser.decode_entry(b"nonsense0000", [b""])
    header, frames, _ = ser.encode_entry(1)
    with pytest.raises(ValueError, match="not a ferrylink spill entry"):
        ser.decode_entry(header, frames + [b"extra"])


def test_device_objects_are_recognised_in_collections():
    fake = FakeCudaArray(4)
    assert ser.is_device_object(fake)
    assert ser.is_device_object([1, (2, {"k": fake})])
    assert ser.is_device_object({"x": fake})
    assert not ser.is_device_object([np.ones(3), {"y": 2}])
    assert ser.device_kind(fake) is None, "no known library made it"
    assert ser.device_kind(np.ones(3)) is None


def test_unknown_device_objects_are_pickled_as_they_pickle():
    header, frames, on_device = ser.encode_entry([FakeCudaArray(7), 3])
    assert on_device is False, "no device frames: the object pickles itself"
    back = ser.decode_entry(header, frames)
    assert isinstance(back[0], FakeCudaArray) and back[0].n == 7 and back[1] == 3


class RefusingInterface:
    """Has the interface's name but raises for it, as PyTorch does for a CUDA tensor that
    requires grad; no library ferrylink knows made it."""

    @property
    def __cuda_array_interface__(self) -> dict:
        raise RuntimeError("the interface is refused for this object")


def test_an_interface_that_raises_is_not_taken_for_device_memory():
    assert not ser.is_device_object(RefusingInterface())
    assert not ser.is_device_object({"k": [RefusingInterface()]})
    header, frames, on_device = ser.encode_entry([RefusingInterface(), 5])
    assert on_device is False
    back = ser.decode_entry(header, frames)
    assert isinstance(back[0], RefusingInterface) and back[1] == 5


def test_the_ferrylink_family_passes_host_objects_on():
    with pytest.raises(NotImplementedError, match="CUDA objects"):
        ser.ferrylink_dumps(np.ones(3))
    pytest.importorskip("distributed")
    from distributed.protocol import deserialize, serialize
    from distributed.protocol.serialize import families

    ferrylink.dask.register_serializers()
    ferrylink.dask.register_serializers()  # once per process; a second call is harmless
    assert families["ferrylink"][:2] == (ser.ferrylink_dumps, ser.ferrylink_loads)
    header, frames = serialize(np.arange(5), serializers=["ferrylink", "dask"], on_error="raise")
    assert header["serializer"] == "dask"
    np.testing.assert_array_equal(deserialize(header, frames), np.arange(5))


def test_device_copies_refuse_host_memory_and_mismatched_lengths():
    pool = _ferrylink.PinnedPool(1 << 20, region_bytes=1 << 20)
    assert pool.stats()["bytes_in_use"] == 0 and pool.chunk_bytes > 0
    if _ferrylink.device_count() == 0:
        assert pool.is_pinned is False
    with pytest.raises(ferrylink.FrameError, match="host memory, not device memory"):
        _ferrylink.device_to_host([np.zeros(3)], pool)
    with pytest.raises(ferrylink.BufferMismatchError, match="1 sources but 0 targets"):
        _ferrylink.host_to_device([b"abc"], [])
    with pytest.raises(ferrylink.FrameError, match="target device memory"):
        _ferrylink.host_to_device([b"abc"], [bytearray(3)])


def test_the_errors_are_the_packages():
    from ferrylink.dask import CorruptSpillFileError, SpillDiskError, SpillError, SpillNoRoomError

    for cls in (SpillDiskError, CorruptSpillFileError, SpillNoRoomError):
        assert issubclass(cls, SpillError) and issubclass(cls, ferrylink.FerrylinkError)
    assert issubclass(SpillDiskError, OSError) and issubclass(SpillNoRoomError, MemoryError)
    e = SpillDiskError(28, "write x: No space left on device", "/tmp/x")
    assert e.errno == 28 and e.filename == "/tmp/x"
    assert pickle.loads(pickle.dumps(CorruptSpillFileError("checksum mismatch"))).args == ("checksum mismatch",)
