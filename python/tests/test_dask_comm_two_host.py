"""The Dask comm backend across two hosts on one machine: a scheduler and a worker on the
first host, a worker on the second (its own network, mounts, ``/tmp``, ``/dev/shm`` and
hostname), a dask.array computation checked against NumPy over ``ferrylink://``: the
worker on the second host meets the others over TCP and moves data on the UCX lane.

The hosts come from the Rust harness's ``two-host`` binary (``testkit``; built by
``cargo test --workspace``, found in the target directory or through
``FERRYLINK_TWO_HOST_BIN``), which runs ``_two_host_cluster.py`` on the first host and
the worker on the second, keeping this interpreter's environment visible there (it may
live under ``/tmp``), and removes both hosts at the end. Where namespaces cannot be made
(or the binary is missing) the test skips with the reason; ``FERRYLINK_REQUIRE_NETNS=1``
makes that a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

import pytest

pytest.importorskip("distributed")

import ferrylink  # noqa: E402

from conftest import Peer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("_two_host_cluster.py")
#: The bound of every wait inside the cluster; the helper's bound and this test's are
#: larger, so the cluster's own errors come first.
BOUND_S = 90
HELPER_BOUND_S = 240
#: The scheduler's port: the first host's network is the test's own, so it is free.
PORT = 8786
#: What the helper exits with where the hosts cannot be made.
NO_HOSTS = 77


def no_hosts_here(reason: str) -> None:
    """Skips with ``reason``, or fails under ``FERRYLINK_REQUIRE_NETNS=1``."""
    if os.environ.get("FERRYLINK_REQUIRE_NETNS") == "1":
        pytest.fail(f"FERRYLINK_REQUIRE_NETNS=1 but namespaces for a second host cannot be made: {reason}")
    pytest.skip(f"namespaces for a second host cannot be made: {reason}")


def helper_binary() -> Optional[Path]:
    named = os.environ.get("FERRYLINK_TWO_HOST_BIN")
    if named:
        return Path(named)
    targets = [Path(os.environ["CARGO_TARGET_DIR"])] if os.environ.get("CARGO_TARGET_DIR") else []
    targets.append(REPO / "target")
    for target in targets:
        for profile in ("debug", "release"):
            candidate = target / profile / "two-host"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
    return None


def kept_dirs() -> List[str]:
    """What the second host's worker needs that may lie under /tmp: this interpreter's
    environment and the installed package."""
    package_root = Path(ferrylink.__file__).resolve().parent.parent
    dirs = sorted({Path(sys.prefix).resolve(), package_root})
    # One inside another comes with it.
    return [str(d) for d in dirs if not any(o != d and o in d.parents for o in dirs)]


def ferrylink_namespaces() -> List[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=20)
    return [line.split()[0] for line in listed.stdout.splitlines() if line.startswith("ferrylink-")]


def test_two_host_dask_cluster_across_hosts():
    helper = helper_binary()
    if helper is None:
        no_hosts_here("no two-host binary (cargo build -p ferrylink-testkit, or FERRYLINK_TWO_HOST_BIN)")
    if shutil.which("ip") is None:
        no_hosts_here("no `ip` command (iproute2)")
    before = set(ferrylink_namespaces())
    worker = (
        f"exec {sys.executable} -m distributed.cli.dask_worker ferrylink://$FERRYLINK_FIRST_HOST:{PORT}"
        f" --host $FERRYLINK_SECOND_HOST --nthreads 1 --no-nanny --no-dashboard --death-timeout {BOUND_S}"
    )
    args = [str(helper), "--timeout", str(HELPER_BOUND_S - 30), "--second", worker]
    for kept in kept_dirs():
        args += ["--keep", kept]
    args += ["--", sys.executable, str(DRIVER), str(PORT), str(BOUND_S)]
    try:
        run = subprocess.run(args, env=Peer.child_env(), capture_output=True, text=True, timeout=HELPER_BOUND_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the two-host run took over {HELPER_BOUND_S} s: {e.stderr!s:.4000}")
    output = f"--- stdout\n{run.stdout[-6000:]}\n--- stderr\n{run.stderr[-6000:]}"
    if run.returncode == NO_HOSTS:
        no_hosts_here(run.stderr.strip().splitlines()[-1] if run.stderr.strip() else "no reason given")
    assert run.returncode == 0, f"the two-host cluster failed (exit {run.returncode})\n{output}"
    assert "two-host cluster: ok" in run.stdout, output
    # The helper removed both hosts.
    assert set(ferrylink_namespaces()) <= before, f"namespaces left behind: {ferrylink_namespaces()}"
