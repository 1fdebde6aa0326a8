"""The other process of the tests: ``python _peer.py MODE [ARGS]``.

Modes (each prints what the test waits for, one line at a time, on stdout):

- ``listen-echo``: listens, prints its path, accepts one peer and sends back every
  message it receives (header and frames, as they landed) until a header ``b"stop"``.
- ``connect-echo PATH``: the same, connecting to PATH (``tcp:HOST:PORT``: over TCP).
- ``connect-send PATH N``: connects and sends N messages (header ``b"<i>"``, one host
  frame holding i as 8 bytes), then waits for a ``b"bye"`` message.
- ``interrupt PATH``: connects, prints ``waiting``, blocks in ``recv`` until SIGINT,
  prints ``interrupted``, then receives once more and prints that header.
- ``accept-interrupt``: listens, prints ``listening``, blocks in ``accept`` until SIGINT,
  prints ``interrupted``.
- ``send-torch PATH``: connects, sends a CUDA float32 tensor from PyTorch's caching
  allocator, receives the echo, prints ``<echo equal> <bounced bytes>``.
- ``put-torch PATH``: connects, imports the key the listener sends (a message header),
  puts a CUDA float32 tensor into that region with the notification ``b"put done"``,
  gets it back into a second tensor, prints ``<equal> <region is device>``, waits for a
  last message.
- ``prepared-torch PATH``: connects, imports the key the listener sends, prepares a put
  of a CUDA tensor's four blocks into the region's four, reversed, and posts it twice
  (the source rewritten before each post, notifications ``b"round 0"``, ``b"round 1"``,
  a message awaited after each), then prints ``posted 2``.
- ``ordered-torch PATH``: connects, imports the listener's key, registers CUDA tensors
  of its own and sends its region's key; then three rounds of :func:`ordered_turn` into
  the listener's region (a ``b"checked"`` message awaited after each), printing
  ``gets ok <n>``; then checks its region after each of the listener's three put
  notifications (``b"put <r>"``, holding 10 + r), answering ``b"checked"``, and prints
  ``puts seen <n>``; waits for a last message.
- ``exit-in-flight PATH``: connects, leaves a 32 MiB send and a receive in flight, and
  exits without waiting for them (the interpreter shuts down around them).
- ``listen-hold``: listens, prints its path, accepts, prints ``accepted`` and sleeps (to
  be killed).

Started with ``subprocess`` (never forked), so CUDA may be in use on either side.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import ferrylink

#: What the "exit-in-flight" kind of peer keeps alive until the interpreter shuts down.
in_flight: list = []


def _interruptible() -> None:
    """Ctrl-C raises ``KeyboardInterrupt`` here, as in a program started from a terminal,
    even when this process was started with SIGINT ignored (a parent run in the background
    of a non-interactive shell passes that on, and Python then installs no handler)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def echo(ep: ferrylink.Endpoint) -> None:
    while True:
        header, frames = ep.recv()
        ep.send(header, frames)
        if header == b"stop":
            return


# About 25 ms of one GPU thread spinning on the H200 (`torch.cuda._sleep` counts cycles).
ORDERING_SLEEP_CYCLES = 50_000_000
# Floats in each tensor of the ordering test.
ORDERING_FLOATS = 1 << 20


def ordered_turn(torch, ep, local, region, value: float, note: bytes) -> bool:
    """One round of one side's transfers behind work on PyTorch's default stream (the
    legacy default stream): a put of ``local["src"]``, filled with ``value`` there behind
    a long GPU sleep, with the notification ``note``; then a get of the region into
    ``local["back"]``, cleared there behind another sleep. Whether ``back`` holds
    ``value`` (the get landed after the clearing, and the put carried the fill)."""
    torch.cuda._sleep(ORDERING_SLEEP_CYCLES)
    local["src"].fill_(value)
    ep.put(local["src_reg"], region, notify=note)
    torch.cuda._sleep(ORDERING_SLEEP_CYCLES)
    local["back"].fill_(-1.0)
    ep.get(local["back_reg"], region)
    return bool(torch.equal(local["back"], torch.full_like(local["back"], value)))


def ordering_tensors(torch, ctx) -> dict:
    """A side's tensors for the ordering test, zeroed and synchronised, registered: its
    region (``mine``), a put's source and a get's destination."""
    local = {
        name: torch.zeros(ORDERING_FLOATS, dtype=torch.float32, device="cuda") for name in ("mine", "src", "back")
    }
    torch.cuda.synchronize()
    local["mine_reg"] = ctx.register(local["mine"], "rw")
    local["src_reg"] = ctx.register(local["src"], "r")
    local["back_reg"] = ctx.register(local["back"], "w")
    return local


def ordered_torch(ctx, path: str) -> None:
    """The ``ordered-torch`` mode (see the module's documentation)."""
    import torch

    ep = ctx.connect(path)
    key, _ = ep.recv()
    region = ep.import_region(key)
    local = ordering_tensors(torch, ctx)
    ep.send(local["mine_reg"].key, [])
    gets_ok = 0
    for round_ in range(3):
        gets_ok += ordered_turn(torch, ep, local, region, float(round_ + 1), b"put %d" % round_)
        ep.recv()
    print(f"gets ok {gets_ok}", flush=True)
    seen = 0
    for round_ in range(3):
        if ep.recv_notification() == b"put %d" % round_:
            seen += bool(torch.equal(local["mine"], torch.full_like(local["mine"], 10.0 + round_)))
        ep.send(b"checked", [])
    print(f"puts seen {seen}", flush=True)
    ep.recv()


def main(argv: list) -> int:
    mode = argv[0]
    ctx = ferrylink.Context()
    if mode == "listen-echo":
        listener = ctx.listen()
        print(listener.path, flush=True)
        ep = listener.accept()
        print(ep.lane, flush=True)
        echo(ep)
    elif mode == "connect-echo":
        if argv[1].startswith("tcp:"):
            host, port = argv[1][4:].rsplit(":", 1)
            ep = ctx.connect_tcp(host, int(port))
        else:
            ep = ctx.connect(argv[1])
        echo(ep)
    elif mode == "connect-send":
        ep = ctx.connect(argv[1])
        for i in range(int(argv[2])):
            ep.send(str(i).encode(), [i.to_bytes(8, "little")])
        ep.recv()
    elif mode == "interrupt":
        _interruptible()
        ep = ctx.connect(argv[1])
        try:
            # Inside the try: a SIGINT right after this line still lands in it.
            print("waiting", flush=True)
            ep.recv()
            print("not interrupted", flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        header, _ = ep.recv()
        print(header.decode(), flush=True)
    elif mode == "accept-interrupt":
        _interruptible()
        listener = ctx.listen()
        try:
            print("listening", flush=True)
            listener.accept()
            print("not interrupted", flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    elif mode == "send-torch":
        import torch

        ep = ctx.connect(argv[1])
        t = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
        ep.send(b"torch", [t])
        _, (frame,) = ep.recv()
        back = torch.from_dlpack(frame).view(torch.float32)
        print(f"{bool(torch.equal(back, t))} {ep.stats()['bounced_bytes']}", flush=True)
    elif mode == "put-torch":
        # Imports the key the listener sends, puts a CUDA tensor into its region with a
        # notification, then gets it back into a second tensor and prints whether it
        # matches.
        import torch

        ep = ctx.connect(argv[1])
        key, _ = ep.recv()
        region = ep.import_region(key)
        t = torch.arange(1 << 18, dtype=torch.float32, device="cuda")
        ep.put(ctx.register(t, "r"), region, notify=b"put done")
        back = torch.zeros_like(t)
        ep.get(ctx.register(back, "w"), region)
        print(f"{bool(torch.equal(back, t))} {region.is_device}", flush=True)
        ep.recv()
    elif mode == "prepared-torch":
        import torch

        ep = ctx.connect(argv[1])
        key, _ = ep.recv()
        region = ep.import_region(key)
        n = 1 << 16  # floats per block
        t = torch.zeros(4 * n, dtype=torch.float32, device="cuda")
        local = ctx.register(t, "r")
        block = 4 * n
        prepared = ep.prepare_put(local, region, spans=[(i * block, (3 - i) * block, block) for i in range(4)])
        for round_ in range(2):
            t.copy_(torch.arange(4 * n, dtype=torch.float32, device="cuda") + 1000 * round_)
            torch.cuda.synchronize()
            ep.post(prepared, notify=b"round %d" % round_)
            ep.recv()
        print("posted 2", flush=True)
    elif mode == "ordered-torch":
        ordered_torch(ctx, argv[1])
    elif mode == "exit-in-flight":
        ep = ctx.connect(argv[1])
        global in_flight  # alive until the interpreter shuts down
        in_flight = [ep._ep.send_op(b"big", [bytearray(32 << 20)]), ep._ep.recv_op(), ctx, ep]
        print("leaving", flush=True)
    elif mode == "listen-hold":
        listener = ctx.listen()
        print(listener.path, flush=True)
        ep = listener.accept()
        print("accepted", flush=True)
        time.sleep(600)
        ep.close()
    else:
        print(f"unknown mode {mode}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    os.environ.setdefault("FERRYLINK_TIMEOUT_MS", "30000")
    sys.exit(main(sys.argv[1:]))
