"""Round-trip benchmark with ucx-py's options and table: ``python -m
ferrylink.benchmarks.send_recv``.

The client sends ``n`` bytes to a server process, which sends them back; bandwidth is
2·n/t per round trip, as ucx-py and ferrylink's Rust ``local-send-recv`` report it. The
table (or ``--json`` record) carries the lane, the latencies, the first round trip, and
the hardware ceiling measured in the same run with the Rust benchmark's own code (host:
``memcpy`` both ways; device: the faster of ``cuMemcpyDtoD`` and ferrylink's copy kernel,
or ``cuMemcpyPeer`` between two devices) with the efficiency against it, so the Python
and Rust figures compare directly.

Object types: ``host`` (``ferrylink.host_buffer``: shared memory, sent without a copy,
as the Rust benchmark's host buffers are) and ``numpy`` (a NumPy array, copied once
into staging on each send) on the host; ``torch`` (a CUDA uint8
tensor from PyTorch's caching allocator), ``cupy``, and ``ferrylink`` (ferrylink's own
device pool, no GPU library needed) on the device; ``device`` is ``torch`` when PyTorch is
installed, else ``ferrylink``. Without ``--reuse-alloc`` each side receives into fresh
memory every round trip (``recv()``); with it, into one buffer (``recv_into``). The first
and the last echo are compared with what was sent, outside the timing.

Each side posts its receive (``irecv``/``irecv_into``) before the message it waits for can
come, as the Rust benchmark does: the client before its send, the server two ahead (one,
the reused buffer, with ``--reuse-alloc``). ``--sequential`` runs ucx-py's order instead:
a blocking send, then a blocking receive.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, List, Optional, Tuple

import ferrylink
from ferrylink import _ferrylink
from ferrylink.benchmarks import onesided

HOST_TYPES = ("host", "numpy")
# Receives the server keeps posted into fresh memory (the Rust benchmark's
# SERVER_RECEIVES_POSTED).
SERVER_RECEIVES_POSTED = 2
DEVICE_TYPES = ("device", "torch", "cupy", "ferrylink")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ferrylink.benchmarks.send_recv", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "-n",
        "--n-bytes",
        default="10MB",
        type=_ferrylink.parse_size,
        help="message size: 1000000, 100MB, 10MiB, 1GB (default 10MB)",
    )
    p.add_argument(
        "-o",
        "--object-type",
        choices=HOST_TYPES + DEVICE_TYPES,
        help="memory to send (default: device with a GPU, else host)",
    )
    p.add_argument(
        "--op",
        choices=("send",) + onesided.OPS,
        default="send",
        help="send: two-sided (default); put or get: the round trip one-sided, into registered memory",
    )
    p.add_argument("--n-iter", type=int, default=10, help="timed round trips (default 10)")
    p.add_argument("--n-warmup-iter", type=int, default=1, help="untimed round trips before them (default 1)")
    p.add_argument("--reuse-alloc", action="store_true", help="receive into one preallocated buffer on both sides")
    p.add_argument("-d", "--server-dev", type=int, default=0, help="the server's CUDA device")
    p.add_argument("-e", "--client-dev", type=int, default=0, help="the client's CUDA device")
    p.add_argument("--api", choices=("blocking", "asyncio"), default="blocking", help="blocking calls or awaited ones")
    p.add_argument(
        "--sequential",
        action="store_true",
        help="send, then receive, as ucx-py's benchmark does (default: each side posts its receive before the message "
        "it waits for comes, as the Rust benchmark does)",
    )
    p.add_argument("--server-only", action="store_true", help="only run the server; prints its socket path")
    p.add_argument("--client-only", action="store_true", help="only run the client, connecting to --server-address")
    p.add_argument("-s", "--server-address", help="the server's socket path, or its host with -p (with --client-only)")
    p.add_argument("-p", "--port", type=int, help="meet over TCP on this port (0: any) and move the data over UCX")
    p.add_argument("--json", action="store_true", help="print one JSON record instead of the table")
    p.add_argument("--no-detailed-report", action="store_true", help="leave out the per-iteration rows")
    args = p.parse_args(argv)
    if args.client_only and not args.server_address:
        p.error("--client-only needs --server-address")
    if args.op != "send":
        if args.reuse_alloc or args.sequential:
            p.error(f"--op {args.op} registers its memory once: --reuse-alloc and --sequential do not apply")
        if args.object_type == "numpy":
            p.error(f"--op {args.op} needs memory a peer can map: -o host (shared buffers), not numpy")
        if args.api != "blocking":
            p.error(f"--op {args.op} runs with --api blocking only")
    if args.object_type is None:
        args.object_type = "device" if ferrylink.device_count() > 0 else "host"
    if args.object_type == "device":
        args.object_type = "torch" if _importable("torch") else "ferrylink"
    return args


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


class Buffers:
    """Allocates, fills and compares the benchmark's buffers of one object type."""

    def __init__(self, kind: str, n: int, device: int) -> None:
        self.kind, self.n, self.device = kind, n, device
        if kind == "torch":
            import torch

            self.torch = torch
        elif kind == "cupy":
            import cupy

            self.cupy = cupy
            cupy.cuda.Device(device).use()
        elif kind == "numpy":
            import numpy

            self.numpy = numpy

    def empty(self) -> Any:
        if self.kind == "host":
            return ferrylink.host_buffer(self.n)
        if self.kind == "numpy":
            return self.numpy.empty(self.n, dtype=self.numpy.uint8)
        if self.kind == "torch":
            return self.torch.empty(self.n, dtype=self.torch.uint8, device=f"cuda:{self.device}")
        if self.kind == "cupy":
            return self.cupy.empty(self.n, dtype=self.cupy.uint8)
        return ferrylink.alloc_device(self.n, self.device)

    def filled(self) -> Any:
        buf = self.empty()
        # Bytes 0, 1, ..., 255, 0, 1, ... (no temporary wider than the buffer).
        if self.kind == "host":
            buf[:] = bytes(range(256)) * (self.n // 256) + bytes(range(self.n % 256))
        elif self.kind == "numpy":
            buf[:] = self.numpy.resize(self.numpy.arange(256, dtype=self.numpy.uint8), self.n)
        elif self.kind == "torch":
            ramp = self.torch.arange(256, dtype=self.torch.uint8, device=buf.device)
            buf.copy_(ramp.repeat(self.n // 256 + 1)[: self.n])
            self.torch.cuda.synchronize(buf.device)
        elif self.kind == "cupy":
            ramp = self.cupy.arange(256, dtype=self.cupy.uint8)
            buf[:] = self.cupy.tile(ramp, self.n // 256 + 1)[: self.n]
            self.cupy.cuda.Device(self.device).synchronize()
        return buf

    def equal(self, a: Any, b: Any) -> Optional[bool]:
        """Whether two buffers hold the same bytes (``None``: cannot tell without a GPU
        library, for ferrylink's own memory)."""
        if self.kind in HOST_TYPES:
            return memoryview(a).cast("B") == memoryview(b).cast("B")
        if self.kind == "torch":
            t = self.torch
            return bool(t.equal(t.from_dlpack(a).view(t.uint8).flatten(), t.from_dlpack(b).view(t.uint8).flatten()))
        if self.kind == "cupy":
            c = self.cupy
            return bool((c.asarray(a).view(c.uint8).ravel() == c.asarray(b).view(c.uint8).ravel()).all())
        return None


def serve(args: argparse.Namespace, announce: Callable[[str], None]) -> None:
    device = args.server_dev
    buffers = Buffers(args.object_type, args.n_bytes, device)
    ctx = ferrylink.Context(recv_device=device)
    if args.port is not None:
        listener = ctx.listen_tcp(args.port, args.server_address or "0.0.0.0")
        address = listener.tcp_address
        assert address is not None  # a TCP listener has one
        host, port = address
        announce(f"tcp:{'127.0.0.1' if host == '0.0.0.0' else host}:{port}")
    else:
        listener = ctx.listen(args.server_address if args.server_address else None)
        announce(listener.path)
    ep = listener.accept()
    target = [buffers.empty()] if args.reuse_alloc else None
    total = args.n_warmup_iter + args.n_iter
    if args.op != "send":
        onesided.serve(ctx, ep, buffers.empty(), args.op, total)
    elif args.sequential:
        for _ in range(total):
            header, frames = ep.recv_into(target) if target else ep.recv()
            ep.send(header, frames)
    else:
        echo_keeping_receives_posted(ep, target, total)
    ep.close()
    listener.close()


def post_receive(ep: ferrylink.Endpoint, target: Optional[List[Any]]) -> ferrylink.Request:
    return ep.irecv_into(target) if target else ep.irecv()


def echo_keeping_receives_posted(ep: ferrylink.Endpoint, target: Optional[List[Any]], total: int) -> None:
    """The server as the Rust benchmark's: receives stay posted ahead of their messages
    (two into fresh memory; the one ``--reuse-alloc`` buffer again once its echo gave it
    back), so the transport offers their buffers to the client before it sends."""
    depth = 1 if target else SERVER_RECEIVES_POSTED
    posted = collections.deque(post_receive(ep, target) for _ in range(min(depth, total)))
    for i in range(total):
        request = posted.popleft() if posted else post_receive(ep, target)
        header, frames = request.wait()
        echo = ep.isend(header, frames)
        if depth > 1 and i + depth < total:
            posted.append(post_receive(ep, target))
        echo.wait()


def client_round_trips(
    args: argparse.Namespace, ep: ferrylink.Endpoint, buffers: Buffers
) -> Tuple[List[float], List[Optional[bool]]]:
    """Runs the round trips; returns each timed one's seconds (the first warm-up's too,
    first) and the echo comparisons."""
    send = [buffers.filled()]
    target = [buffers.empty()] if args.reuse_alloc else None
    total = args.n_warmup_iter + args.n_iter
    times: List[float] = []
    checks: List[Optional[bool]] = []
    if args.api == "blocking":
        for i in range(total):
            t0 = time.perf_counter()
            if args.sequential:
                ep.send(b"", send)
                _, frames = ep.recv_into(target) if target else ep.recv()
            else:
                echo = post_receive(ep, target)
                ep.send(b"", send)
                _, frames = echo.wait()
            times.append(time.perf_counter() - t0)
            if i in (0, total - 1):
                checks.append(buffers.equal(send[0], frames[0]))
    else:

        async def run() -> None:
            for i in range(total):
                t0 = time.perf_counter()
                if args.sequential:
                    await ep.send_async(b"", send)
                    _, frames = await (ep.recv_into_async(target) if target else ep.recv_async())
                else:
                    echo = post_receive(ep, target)
                    await ep.send_async(b"", send)
                    _, frames = await echo
                times.append(time.perf_counter() - t0)
                if i in (0, total - 1):
                    checks.append(buffers.equal(send[0], frames[0]))

        asyncio.run(run())
    return times, checks


def onesided_round_trips(
    args: argparse.Namespace, ctx: ferrylink.Context, ep: ferrylink.Endpoint, buffers: Buffers
) -> Tuple[List[float], List[Optional[bool]]]:
    """``--op put|get``: the round trips one-sided; then the landing region compared
    with the source (see :mod:`ferrylink.benchmarks.onesided`)."""
    source, landing = buffers.filled(), buffers.empty()
    total = args.n_warmup_iter + args.n_iter
    times = onesided.client_round_trips(ctx, ep, source, landing, args.op, total)
    checks = [buffers.equal(source, landing)] if onesided.checkable(args.op, total) else []
    return times, checks


def start_server(args: argparse.Namespace, argv: List[str]) -> Tuple[subprocess.Popen, str]:
    """The server as a separate process (never a fork), and the path it listens at."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ferrylink.benchmarks.send_recv", "--server-only", *argv],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    path = proc.stdout.readline().strip()
    if not path:
        proc.wait()
        raise SystemExit(f"the server process exited (status {proc.returncode}) without listening")
    return proc, path


def ceiling(args: argparse.Namespace) -> Optional[Tuple[float, str, float, int]]:
    iters = max(args.n_iter, 1)
    try:
        if args.object_type in HOST_TYPES:
            return _ferrylink.host_ceiling(args.n_bytes, iters)
        return _ferrylink.device_ceiling(args.n_bytes, iters, args.server_dev, args.client_dev)
    except ferrylink.FerrylinkError as e:
        print(f"warning: {e}", file=sys.stderr)
        return None


def report(args: argparse.Namespace, lane: str, times: List[float], checks: List[Optional[bool]]) -> str:
    n = args.n_bytes
    timed = times[args.n_warmup_iter :]
    bandwidths = [2 * n / t for t in timed]
    avg_bw = 2 * n * len(timed) / sum(timed)
    ceil = ceiling(args)
    efficiency = avg_bw / ceil[0] if ceil and ceil[0] > 0 else None
    devices = "host" if args.object_type in HOST_TYPES else f"{args.server_dev}, {args.client_dev}"
    record = {
        "schema_version": 1,
        "benchmark": "ferrylink.benchmarks.send_recv",
        "case": "roundtrip",
        "api": args.api,
        "lane": lane,
        "ucx_tls": os.environ.get("UCX_TLS") if lane == "ucx" else None,
        "object_type": args.object_type,
        "memory": args.object_type if args.object_type in DEVICE_TYPES else None,
        "n_bytes": n,
        "n_iter": args.n_iter,
        "n_warmup_iter": args.n_warmup_iter,
        "reuse_alloc": args.reuse_alloc,
        "receives_posted_ahead": not args.sequential,
        "op": args.op,
        "server_dev": None if devices == "host" else args.server_dev,
        "client_dev": None if devices == "host" else args.client_dev,
        "bandwidth_avg_gbps": avg_bw / 1e9,
        "bandwidth_median_gbps": statistics.median(bandwidths) / 1e9,
        "latency_avg_us": statistics.fmean(timed) * 1e6,
        "latency_median_us": statistics.median(timed) * 1e6,
        "first_round_trip_us": times[0] * 1e6,
        "ceiling_gbps": ceil[0] / 1e9 if ceil else None,
        "ceiling_method": ceil[1] if ceil else None,
        "ceiling_time_us": ceil[2] * 1e6 if ceil else None,
        "ceiling_n_iter": ceil[3] if ceil else None,
        "efficiency": efficiency,
        "echo_checked": [c for c in checks if c is not None],
        "iterations": [{"bandwidth_gbps": b / 1e9, "latency_us": t * 1e6} for b, t in zip(bandwidths, timed)],
    }
    if args.json:
        return json.dumps(record)
    fmt_rate, fmt_s = _ferrylink.format_rate, _ferrylink.format_seconds
    rows: List[Any] = [
        "Roundtrip benchmark",
        "-",
        ("n_iter", str(args.n_iter)),
        ("n_warmup_iter", str(args.n_warmup_iter)),
        ("n_bytes", _ferrylink.format_bytes(n)),
        ("object", args.object_type),
        ("reuse alloc", str(args.reuse_alloc)),
        ("receives", "sequential" if args.sequential else "posted ahead"),
        ("op", args.op),
        ("lane", lane),
        ("api", f"Python {args.api}"),
    ]
    if lane == "ucx":
        rows.append(("UCX_TLS", os.environ.get("UCX_TLS", "all")))
    rows += [
        "=",
        ("Device(s)", devices),
        ("Average", fmt_rate(avg_bw)),
        ("Median", fmt_rate(statistics.median(bandwidths))),
        ("Latency avg", fmt_s(statistics.fmean(timed))),
        ("Latency median", fmt_s(statistics.median(timed))),
        ("first round trip", fmt_s(times[0])),
        ("Ceiling", f"{fmt_rate(ceil[0])} ({ceil[1]})" if ceil else "not measured"),
        ("Efficiency", f"{efficiency * 100:.1f} %" if efficiency is not None else "n/a"),
    ]
    if not args.no_detailed_report:
        rows += ["-", "Iterations", "-"]
        rows += [(f"{i:03}", f"{fmt_rate(b):>12} | {fmt_s(t):>10}") for i, (b, t) in enumerate(zip(bandwidths, timed))]
    return render(rows)


def render(rows: List[Any]) -> str:
    """ucx-py's table: ``key | value`` rows between ``-`` and ``=`` rules (the Rust
    benchmark's `Table`)."""
    keys = [r[0] for r in rows if isinstance(r, tuple)]
    key_width = max([len(k) for k in keys] + [11])
    widths = [len(r) for r in rows if isinstance(r, str) and len(r) > 1]
    widths += [key_width + 3 + len(r[1]) for r in rows if isinstance(r, tuple)]
    line_width = max(widths + [26])
    out = []
    for r in rows:
        if isinstance(r, tuple):
            out.append(f"{r[0]:<{key_width}} | {r[1]}")
        elif r in ("-", "="):
            out.append(r * line_width)
        else:
            out.append(r)
    return "\n".join(out)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # UCX prints its log on stdout unless told otherwise: into the table, the JSON record,
    # or the server's path line the client reads. Before UCX loads; the server inherits it.
    os.environ.setdefault("UCX_LOG_FILE", "stderr")
    args = parse_args(argv)
    if args.server_only:
        serve(args, lambda path: print(path, flush=True))
        return 0
    server = None
    if args.client_only:
        path = args.server_address if args.port is None else f"tcp:{args.server_address}:{args.port}"
    else:
        server, path = start_server(args, [a for a in argv if a != "--json"])
    try:
        buffers = Buffers(args.object_type, args.n_bytes, args.client_dev)
        with ferrylink.Context(recv_device=args.client_dev) as ctx:
            if path.startswith("tcp:"):
                host, port = path[4:].rsplit(":", 1)
                ep = ctx.connect_tcp(host, int(port))
            else:
                ep = ctx.connect(path)
            if args.op == "send":
                times, checks = client_round_trips(args, ep, buffers)
            else:
                times, checks = onesided_round_trips(args, ctx, ep, buffers)
            lane = ep.lane
            ep.close()
    except BaseException:
        if server is not None:
            server.kill()
        raise
    finally:
        if server is not None:
            server.wait()
    if any(c is False for c in checks):
        print("error: an echo differs from what was sent", file=sys.stderr)
        return 1
    print(report(args, lane, times, checks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
