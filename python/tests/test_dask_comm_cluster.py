"""Dask clusters on ``ferrylink://``: ``LocalCluster(protocol="ferrylink", processes=True)``.

Computations are checked against NumPy; a worker is killed with SIGKILL in the middle of
a graph; a cluster's shutdown leaves no thread, descriptor or listener behind. Every
wait is bounded (``BOUND_S``), generously, for a loaded two-core machine.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time

import pytest

pytest.importorskip("distributed")

import numpy as np  # noqa: E402
from distributed import Client, LocalCluster, get_worker  # noqa: E402

import ferrylink  # noqa: E402
from ferrylink.dask import _addresses, _comm  # noqa: E402

from conftest import no_ucx_here  # noqa: E402

BOUND_S = 120


def cluster(n_workers: int = 2) -> LocalCluster:
    return LocalCluster(
        protocol="ferrylink",
        n_workers=n_workers,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        host="127.0.0.1",
        timeout=BOUND_S,
        death_timeout=BOUND_S,
    )


def stream_lanes(local: LocalCluster) -> set:
    """The lanes of the scheduler's streams to its workers."""
    return {bs.comm.extra_info["lane"] for bs in local.scheduler.stream_comms.values()}


def where_and_sum(x):
    return get_worker().address, float(np.asarray(x).sum())


def fetched_from(key, dask_worker=None):
    """The workers ``dask_worker`` fetched ``key`` from."""
    return [entry["who"] for entry in dask_worker.transfer_incoming_log if key in entry["keys"]]


@pytest.fixture(params=["auto", "ucx"])
def transport(request, monkeypatch):
    """The lane policy of this process and the workers it starts."""
    monkeypatch.setenv("FERRYLINK_TRANSPORT", request.param)
    context = ferrylink.Context()
    if request.param == "ucx":
        try:
            probe = context.listen_tcp(0, "127.0.0.1")
            context.connect_tcp("127.0.0.1", probe.tcp_address[1]).close()
            probe.close()
        except ferrylink.FerrylinkError as e:
            no_ucx_here(e, f"the UCX lane is not available here: {e}")
    monkeypatch.setitem(_comm._context_state, "context", context)
    monkeypatch.setitem(_comm._context_state, "pid", os.getpid())
    return "ucx" if request.param == "ucx" else "native"


def test_rechunk_and_scatter_on_a_process_cluster(transport):
    import dask.array as da

    expected = np.random.RandomState(7).random_sample((600, 600))
    with cluster(3) as local, Client(local, timeout=BOUND_S) as client:
        assert local.scheduler_address.startswith("ferrylink://")
        assert stream_lanes(local) == {transport}
        x = da.from_array(expected, chunks=(50, 600))
        # Row blocks to column blocks: every output chunk takes a piece of every input.
        y = x.rechunk((600, 50)).persist()
        got = (y @ y.T + y.sum(axis=0)).compute(timeout=BOUND_S)
        np.testing.assert_allclose(got, expected @ expected.T + expected.sum(axis=0))

        workers = sorted(client.scheduler_info()["workers"])
        data = np.arange(1 << 20, dtype=np.float64)
        [scattered] = client.scatter([data], workers=[workers[0]])
        futures = [client.submit(where_and_sum, scattered, workers=[w], pure=False) for w in workers]
        results = client.gather(futures)
        assert sorted(addr for addr, _ in results) == workers
        assert all(total == float(data.sum()) for _, total in results)
        # Every other worker fetched it, over a ferrylink comm, from one that held it.
        fetched = client.run(fetched_from, scattered.key)
        assert not fetched.pop(workers[0])
        assert all(sources and all(s.startswith("ferrylink://") for s in sources) for sources in fetched.values())


def slow_inc(x, delay):
    time.sleep(delay)
    return x + 1


def test_a_worker_killed_mid_graph_leaves_the_right_result():
    with cluster(2) as local, Client(local, timeout=BOUND_S) as client:
        pids = client.run(os.getpid)
        victim = sorted(pids)[0]
        # Chains of slow tasks, so the kill lands while work is running and data sits
        # on both workers.
        layers = [client.map(slow_inc, range(16), [0.0] * 16, pure=False)]
        for _ in range(6):
            layers.append(client.map(slow_inc, layers[-1], [0.05] * 16, pure=False))
        total = client.submit(sum, layers[-1])
        deadline = time.monotonic() + BOUND_S
        while not any(f.done() for f in layers[2]):
            assert time.monotonic() < deadline, "the graph did not start"
            time.sleep(0.02)
        assert not total.done()
        os.kill(pids[victim], signal.SIGKILL)
        assert total.result(timeout=BOUND_S) == sum(range(16)) + 16 * 7
        # The Nanny started a new worker; both take work again.
        client.wait_for_workers(2, timeout=BOUND_S)
        assert client.submit(slow_inc, 1, 0.0, pure=False).result(timeout=BOUND_S) == 2


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def open_fds() -> dict:
    """This process's descriptors and what each is."""
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return out


def wakeup_fds() -> dict:
    from ferrylink import _asyncio

    return {w.wakeup.fileno(): (repr(loop), loop.is_closed()) for loop, w in list(_asyncio._loops.items())}


def run_cluster_once() -> list:
    with cluster(2) as local, Client(local, timeout=BOUND_S) as client:
        futures = client.map(slow_inc, range(20), [0.0] * 20)
        assert sum(client.gather(futures)) == sum(range(1, 21))
        ports = [int(a.rsplit(":", 1)[1]) for a in [local.scheduler_address, *client.scheduler_info()["workers"]]]
    return ports


def drop_wakeups_of_closed_loops() -> int:
    """Lets go of ferrylink's asyncio wake-up channels (a socket pair each) of event loops
    that are closed but still alive: distributed keeps its closed loops referenced, and
    ferrylink._asyncio keeps a loop's channel as long as the loop object lives. The tasks
    a closed loop abandoned (a comm's read still posted) hold their requests, and each
    request the channel's waker, in reference cycles: a collection lets them go now, as
    the garbage collector would in its own time. Returns how many channels there were."""
    from ferrylink import _asyncio

    closed = [loop for loop in list(_asyncio._loops.keys()) if loop.is_closed()]
    for loop in closed:
        _asyncio._loops.pop(loop, None)
    gc.collect()
    return len(closed)


def test_shutdown_leaves_no_thread_descriptor_or_listener():
    run_cluster_once()  # this process's context, executors and imports, once
    drop_wakeups_of_closed_loops()
    context = _comm.process_context()
    settled = (-1, -1)
    for _ in range(100):  # until the first cluster's threads and descriptors are gone
        time.sleep(0.2)
        now = (threading.active_count(), fd_count())
        if now == settled:
            break
        settled = now
    threads, fds, stats = threading.active_count(), fd_count(), context.stats()
    before = open_fds()

    ports = run_cluster_once()

    drop_wakeups_of_closed_loops()
    deadline = time.monotonic() + BOUND_S / 2
    while time.monotonic() < deadline:
        now = context.stats()
        if threading.active_count() <= threads and fd_count() <= fds and now["endpoints"] <= stats["endpoints"]:
            break
        time.sleep(0.1)
    assert threading.active_count() <= threads, [t.name for t in threading.enumerate()]
    new = {fd: what for fd, what in open_fds().items() if before.get(fd) != what}
    assert fd_count() <= fds, (new, wakeup_fds())
    now = context.stats()
    assert now["endpoints"] <= stats["endpoints"] and now["listeners"] == 0, now
    for port in ports:
        for host in ("127.0.0.1", "0.0.0.0"):
            assert not os.path.exists(_addresses.socket_path(port, host))
