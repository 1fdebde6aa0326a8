"""``ferrylink.dask.DeviceHostFile`` and the ``"ferrylink"`` serializers with device
objects: torch CUDA tensors (and RMM ``DeviceBuffer``\\ s, CuPy arrays where they are
importable).

Each test skips without a CUDA device and torch, and fails instead when
``FERRYLINK_REQUIRE_GPU=1`` (python/tools/dask_spill_gpu_run.sh sets it).
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

from conftest import require_gpu

LIMIT = 16 * 1024


@pytest.fixture
def torch():
    require_gpu()
    import torch

    return torch


def placement(dhf):
    return {t: set(getattr(dhf, t).keys()) for t in ("device", "host", "disk", "others")}


def where(device=(), host=(), disk=()):
    return {"device": set(device), "host": set(host), "disk": set(disk), "others": set()}


def test_placement_step_by_step_like_dask_cuda(torch, tmp_path):
    from ferrylink.dask import DeviceHostFile

    dhf = DeviceHostFile(tmp_path, device_memory_limit=LIMIT, memory_limit=LIMIT)
    a = np.random.default_rng(1).random(1000)
    b = torch.rand(1000, dtype=torch.float64, device="cuda")

    dhf["a1"] = a
    assert placement(dhf) == where(host={"a1"})
    dhf["b1"] = b
    assert placement(dhf) == where(device={"b1"}, host={"a1"})
    dhf["b2"] = b
    assert placement(dhf) == where(device={"b1", "b2"}, host={"a1"})
    dhf["b3"] = b
    assert placement(dhf) == where(device={"b2", "b3"}, host={"a1", "b1"})
    dhf["a2"] = a
    assert placement(dhf) == where(device={"b2", "b3"}, host={"a2", "b1"}, disk={"a1"})
    dhf["b4"] = b
    assert placement(dhf) == where(device={"b3", "b4"}, host={"a2", "b2"}, disk={"a1", "b1"})
    dhf["b4"] = b
    assert placement(dhf) == where(device={"b3", "b4"}, host={"a2", "b2"}, disk={"a1", "b1"})
    assert dhf.nbytes["device"] == 2 * b.nbytes
    assert dhf["b4"] is b, "an entry in its own tier is the object stored"

    # b1 comes back from disk to the device, pushing the least recently used (b3) down.
    b1 = dhf["b1"]
    assert isinstance(b1, torch.Tensor) and b1.is_cuda and b1.dtype == b.dtype and torch.equal(b1, b)
    assert placement(dhf)["device"] == {"b4", "b1"} and dhf.tier_of("b3") in ("host", "disk")
    stats = dhf.stats()
    assert stats["device_to_host"] >= 3 and stats["unspilled_from_disk"] >= 1
    for k, v in (("a1", a), ("a2", a), ("b1", b), ("b2", b), ("b3", b), ("b4", b)):
        got = dhf[k]
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(got, v)
        else:
            assert torch.equal(got, v)
        del dhf[k]
    assert placement(dhf) == where() and dhf.nbytes == {"device": 0, "host": 0, "disk": 0}

    dhf["x"] = b
    dhf["x"] = a
    assert placement(dhf) == where(host={"x"})


def test_device_objects_of_every_dtype_and_in_collections_come_back_exact(torch, tmp_path):
    from ferrylink.dask import DeviceHostFile

    dhf = DeviceHostFile(tmp_path, device_memory_limit=1 << 20, memory_limit=1 << 20)
    g = torch.Generator(device="cuda").manual_seed(3)
    values = {
        "f16": torch.randn(64, 33, device="cuda", generator=g).half(),
        "bf16": torch.randn(7, 9, device="cuda", generator=g).bfloat16(),
        "i8": torch.randint(-100, 100, (255,), device="cuda", generator=g).to(torch.int8),
        "bool": torch.rand(33, device="cuda", generator=g) > 0.5,
        "empty": torch.empty(0, device="cuda"),
        "strided": torch.randn(64, 64, device="cuda", generator=g)[:, ::2],
        "grad": torch.randn(10, device="cuda", generator=g).requires_grad_(),
        "pair": (torch.arange(10, device="cuda"), np.arange(5)),
        "dict": {"w": torch.ones(3, 3, device="cuda"), "n": 4},
    }
    for k, v in values.items():
        dhf[k] = v
    dhf["filler"] = torch.zeros(1 << 18, device="cuda")  # 1 MiB: pushes every other down
    # Everything with device bytes moved down; the empty tensor weighs nothing there.
    assert dhf.tier_of("empty") == "device"
    for k, v in values.items():
        assert dhf.tier_of(k) in ("host", "disk") or k == "empty", k
        got = dhf[k]
        if k == "pair":
            assert torch.equal(got[0], v[0]) and np.array_equal(got[1], v[1])
        elif k == "dict":
            assert torch.equal(got["w"], v["w"]) and got["n"] == 4
        else:
            assert got.dtype == v.dtype and got.shape == v.shape and got.device == v.device, k
            assert torch.equal(got.detach(), v.detach()), k
            assert got.requires_grad == v.requires_grad, k


def test_an_oversize_device_object_goes_to_host_and_is_read_there(torch, tmp_path):
    from ferrylink.dask import DeviceHostFile

    dhf = DeviceHostFile(tmp_path, device_memory_limit=LIMIT, memory_limit=1 << 20)
    big = torch.arange(LIMIT, device="cuda", dtype=torch.float32)  # four times the device tier
    dhf["small"] = torch.ones(10, device="cuda")
    dhf["big"] = big
    assert placement(dhf) == where(device={"small"}, host={"big"})
    del big
    gc.collect()
    got = dhf["big"]
    assert torch.equal(got, torch.arange(LIMIT, device="cuda", dtype=torch.float32))
    assert placement(dhf) == where(device={"small"}, host={"big"}), "read, left on the host"
    assert dhf.evict() > LIMIT and placement(dhf) == where(device={"small"}, disk={"big"})


def test_evicted_device_memory_is_freed(torch, tmp_path):
    from ferrylink.dask import DeviceHostFile

    dhf = DeviceHostFile(tmp_path, device_memory_limit=64 << 20, memory_limit=1 << 30)
    gc.collect()  # earlier tests' garbage goes before the baseline
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    for i in range(8):
        dhf[i] = torch.full((4 << 20,), float(i), device="cuda")  # 16 MiB each
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - base <= 64 << 20, "only the device tier's entries hold device memory"
    assert len(dhf.device) == 4 and len(dhf.host) == 4
    for i in range(8):
        assert float(dhf[i][123]) == float(i)
    del dhf
    gc.collect()
    assert torch.cuda.memory_allocated() == base


def test_the_ferrylink_family_round_trips_through_pinned_frames(torch):
    from distributed.protocol import deserialize, serialize

    from ferrylink.dask import register_serializers
    from ferrylink.dask._serializers import shared_pinned_pool

    register_serializers()
    pool = shared_pinned_pool()
    gc.collect()  # earlier tests' mappings give their pool memory back first
    in_use = pool.stats()["bytes_in_use"]
    g = torch.Generator(device="cuda").manual_seed(5)
    for t in (
        torch.randn(1 << 20, device="cuda", generator=g),
        torch.randint(0, 255, (3, 5, 7), device="cuda", generator=g).to(torch.uint8),
        torch.randn(128, 64, device="cuda", generator=g).t(),
    ):
        header, frames = serialize(t, serializers=["ferrylink"], on_error="raise")
        assert header["serializer"] == "ferrylink" and len(frames) == 1
        assert pool.stats()["bytes_in_use"] >= in_use + t.nbytes
        for given in (frames, [bytes(f) for f in frames]):  # as received over TCP, too
            back = deserialize(header, given)
            assert back.is_cuda and back.dtype == t.dtype and back.shape == t.shape and torch.equal(back, t)
        del frames
        gc.collect()
        assert pool.stats()["bytes_in_use"] == in_use, "the frame's pool memory is returned"
    header, _ = serialize(np.arange(3), serializers=["ferrylink", "dask"], on_error="raise")
    assert header["serializer"] == "dask", "host objects go to the next family"


def test_rmm_device_buffers(torch, tmp_path):
    rmm = pytest.importorskip("rmm")
    from distributed.protocol import deserialize, serialize

    from ferrylink.dask import DeviceHostFile, register_serializers

    register_serializers()
    data = np.random.default_rng(9).integers(0, 255, 1 << 16, dtype=np.uint8)
    buf = rmm.DeviceBuffer.to_device(data.tobytes())
    header, frames = serialize(buf, serializers=["ferrylink"], on_error="raise")
    back = deserialize(header, frames)
    assert isinstance(back, rmm.DeviceBuffer) and bytes(back.copy_to_host()) == data.tobytes()
    dhf = DeviceHostFile(tmp_path, device_memory_limit=1 << 16, memory_limit=1 << 20)
    dhf["one"] = buf
    dhf["two"] = rmm.DeviceBuffer.to_device(data[::-1].tobytes())
    assert placement(dhf) == where(device={"two"}, host={"one"})
    got = dhf["one"]
    assert isinstance(got, rmm.DeviceBuffer) and bytes(got.copy_to_host()) == data.tobytes()
    assert placement(dhf) == where(device={"one"}, host={"two"})


def make_block(i, n):
    import torch

    return torch.arange(n, dtype=torch.float64, device="cuda") * (i + 1) + i


def add_blocks(x, y):
    return x + y


def to_numpy(t):
    return t.cpu().numpy()


def device_stats(dask_worker):
    return dask_worker.data.stats()


def test_a_local_cluster_spills_device_blocks_and_matches_numpy(torch):
    """Each block stays on the worker that made it (Dask's default serializers cannot
    move a torch CUDA tensor: its "dask" serializer calls ``.numpy()``); only NumPy
    results travel."""
    distributed = pytest.importorskip("distributed")
    from ferrylink.dask import DeviceHostFile

    n = 1 << 17  # 1 MiB blocks; 32 blocks and 32 sums on 4 MiB of device memory per worker
    limits = {"device_memory_limit": "4MiB", "memory_limit": "8MiB"}
    with distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        data=(DeviceHostFile, limits),
        dashboard_address=None,
        memory_limit=0,
        silence_logs=40,
    ) as cluster, distributed.Client(cluster, timeout="60s") as client:
        workers = sorted(client.scheduler_info()["workers"])
        assert len(workers) == 2

        def on(i):
            return {"workers": [workers[i % 2]], "allow_other_workers": False}

        blocks = [client.submit(make_block, i, n, pure=False, **on(i)) for i in range(32)]
        sums = [client.submit(add_blocks, blocks[i], blocks[i ^ 2], **on(i)) for i in range(32)]
        results = [client.submit(to_numpy, sums[i], **on(i)) for i in range(32)]
        got = client.gather(results)
        stats = client.run(device_stats)
    base = np.arange(n, dtype=np.float64)
    for i, g in enumerate(got):
        j = i ^ 2
        np.testing.assert_array_equal(g, (base * (i + 1) + i) + (base * (j + 1) + j))
    for s in stats.values():
        assert s["device_bytes"] <= 4 << 20 and s["device_to_host"] > 0, s
    assert sum(s["host_to_disk"] for s in stats.values()) > 0, stats
