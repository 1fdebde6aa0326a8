"""The examples in python/examples run as a newcomer would run them (host memory; with
``--device`` on the GPU machine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import Peer, require_gpu

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        env=Peer.child_env(),
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_ping_pong_sends_and_checks_every_round():
    out = run_example("ping_pong.py")
    assert "over the native lane" in out
    assert sum(line.startswith("round ") for line in out.splitlines()) == 5, out


def test_one_sided_writes_the_blocks_and_reads_one_back():
    out = run_example("one_sided.py")
    assert "notified b'blocks 12-15 written'; block 11 holds 1, block 12 holds 7" in out, out
    assert "read the owner's block 0: b'\\x01\\x01\\x01\\x01'" in out, out


@pytest.mark.parametrize("name", ["ping_pong.py", "one_sided.py"])
def test_the_examples_run_on_the_device(name):
    require_gpu()
    run_example(name, "--device")
