"""Blocking calls release the GIL, and Ctrl-C interrupts them without losing a message."""

from __future__ import annotations

import signal
import threading
import time


def test_ctrl_c_interrupts_a_blocked_receive_and_loses_nothing(ctx, spawn):
    listener = ctx.listen()
    peer = spawn("interrupt", listener.path)
    ep = listener.accept()
    assert peer.line() == "waiting"
    time.sleep(0.3)  # lets the peer block in recv (it passes as well if it had not yet)
    peer.proc.send_signal(signal.SIGINT)
    assert peer.line() == "interrupted"
    ep.send(b"after the interrupt", [])
    assert peer.line() == "after the interrupt"
    assert peer.wait() == 0


def test_other_threads_run_while_one_waits(ctx):
    listener = ctx.listen()
    a = ctx.connect(listener.path)
    b = listener.accept()
    received = []
    waiting = threading.Thread(target=lambda: received.append(a.recv()))
    waiting.start()
    # This thread needs the GIL for every step; were it held by the waiting receive,
    # nothing would happen here until the receive timed out.
    total = sum(i * i for i in range(200_000))
    assert total > 0 and waiting.is_alive() and not received
    b.send(b"release", [])
    waiting.join(timeout=30)
    assert received and received[0].header == b"release"


def test_a_blocked_accept_can_be_interrupted(spawn):
    peer = spawn("accept-interrupt")
    assert peer.line() == "listening"
    time.sleep(0.3)  # lets the peer block in accept (it passes as well if it had not yet)
    peer.proc.send_signal(signal.SIGINT)
    assert peer.line() == "interrupted"
    assert peer.wait() == 0
