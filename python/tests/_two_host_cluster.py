"""The first host's side of ``test_dask_comm_two_host.py``, run by the ``two-host``
helper inside the first host's network: a scheduler and a worker here (a
``LocalCluster`` on the first host's address), a worker on the second host joining
(started by the helper), and a dask.array computation that moves chunks between them,
checked against NumPy. Prints ``two-host cluster: ok`` and exits 0 when every check
held; any failure raises (non-zero exit).

Usage: ``python _two_host_cluster.py PORT BOUND_S`` (the scheduler's port; the bound of
every wait).
"""

from __future__ import annotations

import os
import socket
import sys

import numpy as np
from distributed import Client, LocalCluster


def where_and_sum(x):
    from distributed import get_worker

    return get_worker().address, float(np.asarray(x).sum())


def main(port: int, bound_s: float) -> None:
    import dask.array as da

    first, second = os.environ["FERRYLINK_FIRST_HOST"], os.environ["FERRYLINK_SECOND_HOST"]
    with LocalCluster(
        protocol="ferrylink",
        host=first,
        scheduler_port=port,
        n_workers=1,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        timeout=bound_s,
        death_timeout=bound_s,
    ) as local, Client(local, timeout=bound_s) as client:
        client.wait_for_workers(2, timeout=bound_s)
        workers = sorted(client.scheduler_info()["workers"])
        hosts = {w.split("://")[1].rsplit(":", 1)[0] for w in workers}
        assert hosts == {first, second}, f"the workers are not one on each host: {workers}"
        names = client.run(socket.gethostname)
        assert len(set(names.values())) == 2, f"both workers report one hostname: {names}"
        # The local worker meets the scheduler on its native lane, the other host's over UCX.
        lanes = {bs.comm.extra_info["lane"] for bs in local.scheduler.stream_comms.values()}
        assert lanes == {"native", "ucx"}, f"the scheduler's streams use {lanes}"

        expected = np.random.RandomState(11).random_sample((400, 400))
        x = da.from_array(expected, chunks=(50, 400))
        # Row blocks to column blocks: every output chunk takes a piece of every input,
        # so chunks cross between the hosts.
        y = x.rechunk((400, 50)).persist()
        got = (y @ y.T + y.sum(axis=0)).compute(timeout=bound_s)
        np.testing.assert_allclose(got, expected @ expected.T + expected.sum(axis=0))

        # Data one host holds, read on both: the other host fetches it over ferrylink.
        data = np.arange(1 << 18, dtype=np.float64)
        for holder in workers:
            [scattered] = client.scatter([data], workers=[holder])
            futures = [client.submit(where_and_sum, scattered, workers=[w], pure=False) for w in workers]
            results = client.gather(futures)
            assert sorted(addr for addr, _ in results) == workers
            assert all(total == float(data.sum()) for _, total in results)
            del scattered, futures
        print("two-host cluster: ok", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]))
