"""Shared pieces of the tests: peer processes and the GPU requirement.

Peers are separate Python processes started with ``subprocess`` (tests/_peer.py), never
forked: a process that used CUDA must not fork.
"""

from __future__ import annotations

import asyncio
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import List, Optional

import pytest

import ferrylink

PEER_SCRIPT = Path(__file__).with_name("_peer.py")
# Generous: a peer that does not answer within this fails the test instead of hanging it.
LINE_TIMEOUT_S = 60.0
# Every context the tests make gives up after this (FERRYLINK_TIMEOUT_MS), so a broken
# transport fails a test instead of hanging it for the default minute.
TIMEOUT_MS = 20000


class Peer:
    """A peer process whose stdout is read line by line."""

    @staticmethod
    def child_env(extra: Optional[dict] = None) -> dict:
        """This process's environment, with the installed ferrylink on the child's path
        and the tests' timeout, plus ``extra``."""
        env = dict(os.environ)
        package_root = str(Path(ferrylink.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        env["FERRYLINK_TIMEOUT_MS"] = str(TIMEOUT_MS)
        env.update(extra or {})
        return env

    def __init__(self, *args: str, env: Optional[dict] = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(PEER_SCRIPT), *args],
            stdout=subprocess.PIPE,
            env=self.child_env(env),
            text=True,
        )
        self._lines: "queue.Queue[Optional[str]]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def line(self) -> str:
        """The next line the peer prints (fails if it exits or stays silent)."""
        try:
            line = self._lines.get(timeout=LINE_TIMEOUT_S)
        except queue.Empty:
            raise AssertionError(f"the peer printed nothing for {LINE_TIMEOUT_S} s") from None
        if line is None:
            raise AssertionError(f"the peer exited (status {self.proc.wait()}) before printing a line")
        return line

    def wait(self) -> int:
        return self.proc.wait(timeout=LINE_TIMEOUT_S)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def spawn():
    """Starts peers (``spawn("listen-echo")``); every one is ended after the test."""
    peers: List[Peer] = []

    def start(*args: str, env: Optional[dict] = None) -> Peer:
        peer = Peer(*args, env=env)
        peers.append(peer)
        return peer

    yield start
    for peer in peers:
        peer.kill()


@pytest.fixture
def ctx():
    """A context whose waits end after TIMEOUT_MS."""
    context = ferrylink.Context(timeout_ms=TIMEOUT_MS)
    yield context
    context.close()


@pytest.fixture
def echo_ep(ctx, spawn):
    """An endpoint connected to an echoing peer (the peer listens)."""
    peer = spawn("listen-echo")
    ep = ctx.connect(peer.line())
    assert peer.line() == ep.lane
    yield ep
    try:
        ep.send(b"stop", [])
        ep.recv()
    finally:
        ep.close()


def require_gpu() -> None:
    """Skips the test without a usable CUDA device and torch, or fails it when
    ``FERRYLINK_REQUIRE_GPU=1`` (the GPU machine's run, where a skip would hide a
    missing device)."""
    required = os.environ.get("FERRYLINK_REQUIRE_GPU") == "1"
    reason = None
    try:
        import torch  # noqa: F401
    except ImportError:
        reason = "torch is not installed"
    else:
        if not torch.cuda.is_available():
            reason = "torch sees no CUDA device"
        elif ferrylink.device_count() == 0:
            reason = "ferrylink sees no CUDA device"
    if reason is None:
        return
    if required:
        pytest.fail(f"FERRYLINK_REQUIRE_GPU=1 but {reason}")
    pytest.skip(f"needs a CUDA device and torch: {reason}")


def run(coro):
    """Runs a test's coroutine on a fresh event loop, bounded like every wait here."""
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT_MS / 1000 + 30))


def wait_until_done(request, what: str) -> None:
    """Polls ``request.done()`` until it is true, failing with ``what`` after TIMEOUT_MS."""
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while not request.done():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


def no_ucx_here(error: BaseException, reason: str) -> None:
    """Called where what needed UCX failed with ``error``: re-raises it when
    ``FERRYLINK_REQUIRE_UCX=1`` (CI must have UCX), else skips the test with ``reason``."""
    if os.environ.get("FERRYLINK_REQUIRE_UCX") == "1":
        raise error
    pytest.skip(reason)
