"""``python -m ferrylink.benchmarks.send_recv`` runs, checks its echoes and reports."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import Peer, no_ucx_here


def run_benchmark(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "ferrylink.benchmarks.send_recv", *args],
        capture_output=True,
        text=True,
        env=Peer.child_env(),
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_table_has_ucx_pys_rows_and_the_ceiling():
    out = run_benchmark("-o", "host", "-n", "2MB", "--n-iter", "3")
    rows = ["Roundtrip benchmark", "n_bytes          | 2.00 MB", "lane             | native", "Device(s)"]
    rows += ["Average", "Median", "Latency median", "Ceiling", "Efficiency", "000", "002"]
    for row in rows:
        assert row in out, out


def test_json_records_carry_every_figure():
    out = run_benchmark("-o", "host", "-n", "100kB", "--n-iter", "4", "--reuse-alloc", "--api", "asyncio", "--json")
    record = json.loads(out)
    assert record["n_bytes"] == 100_000 and record["n_iter"] == 4 and record["reuse_alloc"]
    assert record["lane"] == "native" and record["api"] == "asyncio"
    assert record["echo_checked"] == [True, True]
    assert len(record["iterations"]) == 4 and record["ceiling_gbps"] > 0 and record["efficiency"] > 0
    assert record["receives_posted_ahead"]


@pytest.mark.parametrize("api", ["blocking", "asyncio"])
@pytest.mark.parametrize("reuse", [[], ["--reuse-alloc"]])
def test_both_receive_orders_echo_every_kind_of_receive(api, reuse):
    for order in ([], ["--sequential"]):
        out = run_benchmark("-o", "host", "-n", "10kB", "--n-iter", "20", "--api", api, "--json", *reuse, *order)
        record = json.loads(out)
        assert record["receives_posted_ahead"] == (order == [])
        assert record["echo_checked"] == [True, True] and len(record["iterations"]) == 20


def test_over_tcp_the_data_goes_over_ucx():
    try:
        out = run_benchmark("-o", "host", "-n", "1MB", "--n-iter", "3", "-p", "0", "--json")
    except AssertionError as e:
        no_ucx_here(e, "no UCX lane here")
    record = json.loads(out)
    assert record["lane"] == "ucx" and record["echo_checked"] == [True, True]


def test_ucx_logs_stay_out_of_the_json_and_the_path_line():
    """UCX logs on stdout by default; the benchmark sends them to stderr, so the server's
    path line and the record stay readable with UCX talking at debug level."""
    args = ("-o", "host", "-n", "10kB", "--n-iter", "3", "-p", "0", "--json")
    try:
        run_benchmark(*args)
    except AssertionError as e:
        no_ucx_here(e, "no UCX lane here")
    env = Peer.child_env({"UCX_LOG_LEVEL": "debug"})
    env.pop("UCX_LOG_FILE", None)
    out = subprocess.run(
        [sys.executable, "-m", "ferrylink.benchmarks.send_recv", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 1, out.stdout[:3000]
    assert json.loads(lines[0])["lane"] == "ucx"
    assert "UCX  DEBUG" in out.stderr


@pytest.mark.parametrize("op", ["put", "get"])
def test_one_sided_round_trips_are_timed_and_checked(op):
    out = run_benchmark("-o", "host", "-n", "100kB", "--n-iter", "20", "--op", op, "--json")
    record = json.loads(out)
    assert record["op"] == op and record["lane"] == "native"
    assert record["echo_checked"] == [True] and len(record["iterations"]) == 20
    table = run_benchmark("-o", "host", "-n", "1kB", "--n-iter", "3", "--op", op, "--no-detailed-report")
    assert f"op               | {op}" in table, table


def test_a_single_get_cannot_be_checked_and_says_so():
    record = json.loads(run_benchmark("-o", "host", "-n", "1kB", "--n-iter", "1", "--n-warmup-iter", "0",
                                      "--op", "get", "--json"))
    assert record["echo_checked"] == []


@pytest.mark.parametrize(
    "extra", [["--reuse-alloc"], ["--sequential"], ["--api", "asyncio"], ["-o", "numpy"]]
)
def test_one_sided_runs_refuse_what_does_not_apply(extra):
    out = subprocess.run(
        [sys.executable, "-m", "ferrylink.benchmarks.send_recv", "-o", "host", "--op", "put", *extra],
        capture_output=True,
        text=True,
        env=Peer.child_env(),
        timeout=60,
    )
    assert out.returncode == 2 and "--op put" in out.stderr, out.stderr
