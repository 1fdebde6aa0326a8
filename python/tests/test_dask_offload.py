"""When the ``ferrylink://`` comm hands Dask's (de)serialization to a thread, and the
host-only fast path of its parts.

distributed offloads a message over ``distributed.comm.offload`` bytes. The comm counts
the host bytes: device objects the ``"cuda"`` family passes through do not count (no
GPU is needed: a stand-in object with a CUDA Array Interface is never dereferenced).
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("distributed")

import distributed.comm.utils  # noqa: E402
import numpy as np  # noqa: E402
from dask.sizeof import sizeof  # noqa: E402
from distributed.protocol import to_serialize  # noqa: E402
from distributed.protocol.cuda import cuda_serialize  # noqa: E402
from distributed.protocol.serialize import Serialized, ToPickle  # noqa: E402
from distributed.sizeof import safe_sizeof  # noqa: E402

from ferrylink.dask import _comm, _frames, _offload  # noqa: E402

from test_dask_comm import comm_pair, lane, run  # noqa: E402,F401  (lane: a fixture)

THRESHOLD = 1000
CUDA_FIRST = _comm.DEFAULT_SERIALIZERS


class _DeviceLike:
    """Stands for device memory of ``nbytes``."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes

    @property
    def __cuda_array_interface__(self):
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": (0, False), "version": 3}


class PassedThrough(_DeviceLike):
    """A device type the ``"cuda"`` family serializes (as RMM, CuPy and torch are)."""


class NotCudaSerializable(_DeviceLike):
    """A device type with no ``"cuda"`` serializer: other families copy it to host."""


@sizeof.register(_DeviceLike)
def _sizeof_device_like(x: _DeviceLike) -> int:
    return x.nbytes


@cuda_serialize.register(PassedThrough)
def _serialize_passed_through(x: PassedThrough):
    return {}, [x]


@pytest.fixture(autouse=True)
def threshold(monkeypatch):
    monkeypatch.setattr(distributed.comm.utils, "OFFLOAD_THRESHOLD", THRESHOLD)


def test_host_volume_is_offloaded_as_distributed_offloads_it():
    big = {"op": "x", "data": to_serialize(np.zeros(2 * THRESHOLD, np.uint8))}
    assert _offload.serializing_is_heavy(big, CUDA_FIRST)
    assert _offload.serializing_is_heavy(big, ("dask", "pickle"))
    assert _offload.serializing_is_heavy({"op": "x", "text": "y" * 2 * THRESHOLD}, CUDA_FIRST)
    assert _offload.serializing_is_heavy([b"z" * 600, {"k": bytearray(600)}], CUDA_FIRST)
    assert not _offload.serializing_is_heavy({"op": "heartbeat", "now": 1.0, "m": {"a": [1, 2]}}, CUDA_FIRST)
    assert not _offload.serializing_is_heavy({"data": to_serialize(np.zeros(8, np.uint8))}, CUDA_FIRST)


def test_device_volume_the_cuda_family_passes_through_is_serialized_in_place():
    device = {"op": "x", "data": to_serialize(PassedThrough(1 << 30))}
    assert not _offload.serializing_is_heavy(device, CUDA_FIRST)
    assert not _offload.serializing_is_heavy({"d": [PassedThrough(1 << 30)] * 3}, CUDA_FIRST)
    # Without the "cuda" family, or pickled, or of a type it lacks, the bytes are copied.
    assert _offload.serializing_is_heavy(device, ("dask", "pickle"))
    assert _offload.serializing_is_heavy({"data": ToPickle(PassedThrough(1 << 30))}, CUDA_FIRST)
    assert _offload.serializing_is_heavy({"data": to_serialize(NotCudaSerializable(1 << 30))}, CUDA_FIRST)
    # Host bytes beside device objects still count.
    mixed = {"data": to_serialize(PassedThrough(1 << 30)), "text": "y" * 2 * THRESHOLD}
    assert _offload.serializing_is_heavy(mixed, CUDA_FIRST)
    serialized = Serialized({}, [PassedThrough(1 << 30), b"h" * 10])
    assert not _offload.serializing_is_heavy({"data": serialized}, CUDA_FIRST)


def test_what_is_not_walked_is_judged_by_dasks_estimate():
    long = {"keys": [b"k" * 100] * 500}
    assert _offload.serializing_is_heavy(long, CUDA_FIRST) == (safe_sizeof(long["keys"]) > THRESHOLD)
    assert _offload.serializing_is_heavy(long, CUDA_FIRST)
    deep: list = []
    for _ in range(2 * _offload.WALKED_OBJECTS_MAX):
        deep = [deep]
    size = safe_sizeof(deep, default_size=-1)
    assert _offload.serializing_is_heavy(deep, CUDA_FIRST) == (size == -1 or size > THRESHOLD)


def test_no_threshold_means_no_offload(monkeypatch):
    monkeypatch.setattr(distributed.comm.utils, "OFFLOAD_THRESHOLD", 0)
    assert not _offload.serializing_is_heavy({"x": b"y" * (1 << 20)}, CUDA_FIRST)
    assert not _offload.host_bytes_over_threshold([memoryview(b"y" * (1 << 20))])


def test_received_host_bytes_decide_the_read_side():
    assert _offload.host_bytes_over_threshold([memoryview(b"a" * 600), memoryview(bytearray(600))])
    assert not _offload.host_bytes_over_threshold([memoryview(b"a" * 10), PassedThrough(1 << 30)])


def test_the_comm_offloads_a_large_host_message_and_not_a_small_one(lane, monkeypatch):
    offloaded = []
    real_offload = distributed.comm.utils.offload

    async def counting_offload(fn, *args, **kwargs):
        offloaded.append(fn.__name__)
        return await real_offload(fn, *args, **kwargs)

    monkeypatch.setattr(distributed.comm.utils, "offload", counting_offload)

    async def main():
        listener, client, server = await comm_pair()
        await client.write({"op": "small", "data": to_serialize(np.arange(8, dtype=np.uint8))})
        assert (await server.read())["op"] == "small"
        assert offloaded == []
        sent = np.arange(4 * THRESHOLD, dtype=np.uint8)
        await client.write({"op": "big", "data": to_serialize(sent)})
        np.testing.assert_array_equal((await server.read())["data"], sent)
        assert offloaded == ["_to_frames", "_from_frames"]
        # The comm's own rule decides, not distributed's size of everything.
        offloaded.clear()
        with monkeypatch.context() as m:
            m.setattr(_offload, "serializing_is_heavy", lambda msg, serializers: False)
            m.setattr(_offload, "host_bytes_over_threshold", lambda frames: False)
            await client.write({"op": "big", "data": to_serialize(sent)})
            np.testing.assert_array_equal((await server.read())["data"], sent)
        assert offloaded == []
        listener.stop()
        client.abort()
        server.abort()

    run(main())


def test_a_host_only_part_is_recognised_without_parsing():
    frames = [b"a", bytearray(b"bc"), memoryview(b"def")]
    (part,) = _frames.split_parts(frames, memoryview)
    assert part.header == _frames.pack_part_header(b"hhh", [], True)
    assert part.host[0] is frames[0] and part.host[1] is frames[1], "sent as they are"
    assert _frames.host_only_part(part.header) == 3
    assert _frames.host_only_part(_frames.pack_part_header(b"hhh", [], False)) is None
    assert _frames.host_only_part(_frames.pack_part_header(b"hd", [4], True)) is None
    (device_part,) = _frames.split_parts([b"a", PassedThrough(16)], memoryview)
    assert _frames.unpack_part_header(device_part.header) == (b"hd", [16], True)


def test_a_message_of_many_parts_still_arrives_whole(lane, monkeypatch):
    monkeypatch.setattr(_frames, "PART_FRAMES", 2)

    async def main():
        listener, client, server = await comm_pair()
        payload = [to_serialize(np.full(3, i, np.uint8)) for i in range(5)]
        await client.write({"op": "many", "data": payload})
        got = await asyncio.wait_for(server.read(), 30)
        for i, array in enumerate(got["data"]):
            np.testing.assert_array_equal(array, np.full(3, i, np.uint8))
        listener.stop()
        client.abort()
        server.abort()

    run(main())
