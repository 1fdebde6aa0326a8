"""Dask workers whose data is a ``ferrylink.dask.DeviceHostFile``: a ``LocalCluster``
of worker processes computing a graph larger than their budgets, checked against NumPy
(host objects here; device objects in test_dask_device_host_file_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")
da = pytest.importorskip("dask.array")

from ferrylink.dask import DeviceHostFile  # noqa: E402


def worker_stats(dask_worker) -> dict:
    data = dask_worker.data
    return {"type": type(data).__name__, "stats": data.stats(), "keys": len(data)}


def test_a_graph_larger_than_the_workers_memory_limits():
    def values(i, j):
        return np.sin(i * 0.01 + j * 0.003) + np.cos(i * j * 1e-5)

    shape = (1200, 1200)  # 11.5 MB in 144 chunks of 80 KB
    x_np = np.fromfunction(values, shape)
    limits = {"device_memory_limit": "1MiB", "memory_limit": "1MiB"}
    with distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        data=(DeviceHostFile, limits),
        dashboard_address=None,
        memory_limit=0,
        silence_logs=40,
    ) as cluster, distributed.Client(cluster, timeout="60s") as client:
        x = da.fromfunction(values, shape=shape, chunks=100, dtype=float)
        y = ((x + x.T) * 2 - 1).persist()  # 11.5 MB persisted on 2 MiB of host budget
        distributed.wait(y, timeout=120)
        before = client.run(worker_stats)
        total = client.compute((y @ y[:, :50]).sum(axis=0) + y.mean(axis=1)[:50]).result(timeout=120)
        after = client.run(worker_stats)

    y_np = (x_np + x_np.T) * 2 - 1
    np.testing.assert_allclose(total, (y_np @ y_np[:, :50]).sum(axis=0) + y_np.mean(axis=1)[:50], rtol=1e-10)
    for addr, s in before.items():
        assert s["type"] == "DeviceHostFile", addr
        assert s["stats"]["host_bytes"] <= 1 << 20, s
        assert s["stats"]["disk_entries"] > 0 and s["stats"]["host_to_disk"] > 0, s
    assert sum(s["stats"]["unspilled_from_disk"] for s in after.values()) > 0, after
