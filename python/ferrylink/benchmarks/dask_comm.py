"""Round trips of one Dask message through two comms: ``python -m
ferrylink.benchmarks.dask_comm``.

A server process listens on each scheme (``ferrylink://``, ``ucx://`` where
distributed-ucxx is installed, ``tcp://``) and echoes every message; the client writes one
message holding one object of N bytes (``{"data": to_serialize(obj)}``) and reads the echo.
Each side keeps a read posted, as Dask's comm loops do: the client posts its read before
it writes, the server posts the next read before it writes the echo. Beside each figure,
in the same run and to the same server, the Python API's own round trip of the same
frames (what ``to_frames`` makes of the message for ``ferrylink://``, whole frames, sent
with ``Endpoint.send_async`` and echoed with a receive kept posted): the difference is
what Dask's layer and the comm add.
The floor beside it is that round trip plus Dask's own work on the message at both ends
(``to_frames`` and ``from_frames``, timed in the client process in the same run), which
any comm pays: what a comm could reach without changing Dask's serialization.

Objects: ``host`` (a NumPy uint8 array) and ``device`` (an ``rmm.DeviceBuffer`` where RMM is
installed, else a PyTorch CUDA tensor; ``--device-object`` picks). Device objects are
written with distributed's ``"cuda"`` serializers first; ``tcp://`` carries host objects
only. The first and the last echo are compared with what was sent, outside the timing.
Figures are medians (and minima) over ``--iters`` round trips after ``--warmup``.

RMM's default memory resource gives every received device frame a ``cudaMalloc`` of its
own (and a ``cudaFree`` after), which a peer maps afresh; ``--rmm-pool SIZE`` makes both
processes allocate from an RMM pool instead, as dask-cuda's ``rmm_pool_size`` does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

SERIALIZERS = ("cuda", "dask", "pickle", "error")
SCHEMES = ("ferrylink", "ucx", "tcp")
SIZES = ("8B", "1MB", "100MB", "1GB")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ferrylink.benchmarks.dask_comm", description=__doc__.split("\n\n")[0])
    p.add_argument("--schemes", default=",".join(SCHEMES), help="comma-separated: ferrylink,ucx,tcp")
    p.add_argument("--sizes", default=",".join(SIZES), help="comma-separated message sizes (default 8B,1MB,100MB,1GB)")
    p.add_argument("--objects", default="host,device", help="comma-separated: host,device")
    p.add_argument("--device-object", choices=("auto", "rmm", "torch"), default="auto")
    p.add_argument("--iters", type=int, default=0, help="round trips per figure (default: by size)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--json", action="store_true", help="one JSON record per figure instead of the table")
    p.add_argument("--rmm-pool", metavar="SIZE", help="both processes allocate from an RMM pool of SIZE (e.g. 8GB)")
    p.add_argument("--serve", metavar="SCHEME", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def parse_size(text: str) -> int:
    from ferrylink import _ferrylink

    return int(_ferrylink.parse_size(text))


def default_iters(nbytes: int) -> int:
    if nbytes <= 1 << 20:
        return 200
    if nbytes <= 128 << 20:
        return 20
    return 10


def use_rmm_pool(size: Optional[str]) -> None:
    """Makes RMM allocate from a pool of ``size`` in this process (nothing without one or
    without RMM)."""
    if not size:
        return
    try:
        import rmm  # type: ignore[import-not-found]
    except ImportError:
        return
    rmm.reinitialize(pool_allocator=True, initial_pool_size=parse_size(size))


def device_kind(choice: str) -> str:
    if choice != "auto":
        return choice
    try:
        import rmm  # noqa: F401
    except ImportError:
        return "torch"
    return "rmm"


def make_object(kind: str, nbytes: int, device: str) -> Any:
    import numpy as np

    host = np.frombuffer(os.urandom(min(nbytes, 1 << 20)), dtype=np.uint8)
    host = np.resize(host, nbytes)
    if kind == "host":
        return host
    if device == "rmm":
        import rmm  # type: ignore[import-not-found]

        return rmm.DeviceBuffer.to_device(host)
    import torch  # type: ignore[import-not-found]

    return torch.from_numpy(host).cuda()


def host_bytes(obj: Any) -> bytes:
    """The bytes of a host or device object, copied to the host."""
    if hasattr(obj, "copy_to_host"):
        return bytes(obj.copy_to_host())
    if hasattr(obj, "cpu"):
        return obj.cpu().numpy().tobytes()
    return memoryview(obj).tobytes()


# ---- the server process ----------------------------------------------------------


async def echo_comm(comm: Any) -> None:
    from distributed.comm import CommClosedError
    from distributed.protocol import to_serialize

    pending = asyncio.ensure_future(comm.read())
    try:
        while True:
            msg = await pending
            if msg == "stop":
                return
            pending = asyncio.ensure_future(comm.read())
            msg["data"] = to_serialize(msg["data"])
            await comm.write(msg, serializers=SERIALIZERS)
    except CommClosedError:
        return
    finally:
        pending.cancel()


async def echo_endpoint(endpoint: Any) -> None:
    import ferrylink

    pending = asyncio.ensure_future(endpoint.recv_async())
    try:
        while True:
            msg = await pending
            if msg.header == b"stop":
                return
            pending = asyncio.ensure_future(endpoint.recv_async())
            await endpoint.send_async(msg.header, msg.frames)
    except ferrylink.FerrylinkError:
        return
    finally:
        pending.cancel()


async def serve(scheme: str) -> None:
    from distributed.comm import listen

    import ferrylink

    done = asyncio.Event()

    async def handle(comm: Any) -> None:
        await echo_comm(comm)
        done.set()

    listener = await listen(f"{scheme}://127.0.0.1:0", handle, deserialize=True)
    context = ferrylink.Context()
    raw = context.listen()
    print(json.dumps({"comm": listener.contact_address, "api": raw.path}), flush=True)
    endpoint = await raw.accept_async()
    await asyncio.gather(echo_endpoint(endpoint), done.wait())
    listener.stop()


# ---- the client ------------------------------------------------------------------


def start_server(scheme: str, rmm_pool: Optional[str] = None) -> Tuple[subprocess.Popen, Dict[str, str]]:
    pool = ["--rmm-pool", rmm_pool] if rmm_pool else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "ferrylink.benchmarks.dask_comm", "--serve", scheme, *pool],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, server_addresses(proc, scheme)


def server_addresses(proc: subprocess.Popen, scheme: str) -> Dict[str, str]:
    """The addresses the server prints, passing over (to stderr) any other line a library
    printed on its stdout before them."""
    assert proc.stdout is not None
    for line in proc.stdout:
        try:
            addresses = json.loads(line)
        except ValueError:
            addresses = None
        if isinstance(addresses, dict) and "comm" in addresses and "api" in addresses:
            return addresses
        sys.stderr.write(f"{scheme}:// server: {line}")
    raise RuntimeError(f"the {scheme}:// server exited with status {proc.wait()} before printing its addresses")


async def comm_round_trips(comm: Any, obj: Any, iters: int, warmup: int) -> Tuple[List[float], bool]:
    from distributed.protocol import to_serialize

    times: List[float] = []
    checks: List[bool] = []
    expected = host_bytes(obj)
    for i in range(warmup + iters):
        read = asyncio.ensure_future(comm.read())
        start = time.perf_counter()
        await comm.write({"data": to_serialize(obj)}, serializers=SERIALIZERS)
        echo = await read
        elapsed = time.perf_counter() - start
        if i >= warmup:
            times.append(elapsed)
        if i in (0, warmup + iters - 1):
            checks.append(host_bytes(echo["data"]) == expected)
    return times, all(checks)


async def api_round_trips(endpoint: Any, frames: List[Any], iters: int, warmup: int) -> List[float]:
    times: List[float] = []
    for i in range(warmup + iters):
        request = endpoint.irecv()
        start = time.perf_counter()
        await endpoint.send_async(b"echo", frames)
        await request
        elapsed = time.perf_counter() - start
        if i >= warmup:
            times.append(elapsed)
    return times


async def serialization_times(obj: Any, iters: int) -> List[float]:
    """Dask's own work on one message at both ends of a round trip, in this process:
    twice ``to_frames`` then ``from_frames`` of the message, as each comm does it."""
    from distributed.comm.utils import from_frames

    times: List[float] = []
    for _ in range(iters + 1):
        start = time.perf_counter()
        frames = await message_frames(obj)
        await from_frames(frames)
        times.append(2 * (time.perf_counter() - start))
    return times[1:]


async def message_frames(obj: Any) -> List[Any]:
    from distributed.comm.utils import to_frames
    from distributed.protocol import to_serialize

    from ferrylink.dask._comm import FRAME_SPLIT_SIZE

    return await to_frames({"data": to_serialize(obj)}, serializers=SERIALIZERS, frame_split_size=FRAME_SPLIT_SIZE)


def record(
    scheme: str,
    kind: str,
    nbytes: int,
    times: List[float],
    api: List[float],
    ok: bool,
    rmm_pool: Optional[str] = None,
    serialization: Optional[List[float]] = None,
) -> Dict[str, Any]:
    median = statistics.median(times)
    out: Dict[str, Any] = {
        "scheme": scheme,
        "rmm_pool": rmm_pool,
        "object": kind,
        "bytes": nbytes,
        "median_s": median,
        "min_s": min(times),
        "iters": len(times),
        "checked": ok,
    }
    if api:
        out["api_median_s"] = statistics.median(api)
        out["added_s"] = median - out["api_median_s"]
        out["ratio"] = median / out["api_median_s"]
    if api and serialization:
        # The floor of a comm round trip: the transport's own (the Python API's) plus
        # Dask's serialization at both ends, which every comm pays.
        out["serialize_s"] = statistics.median(serialization)
        out["floor_s"] = out["api_median_s"] + out["serialize_s"]
        out["floor_ratio"] = median / out["floor_s"]
    return out


async def bench_scheme(scheme: str, args: argparse.Namespace, device: str, emit: Any) -> None:
    import ferrylink
    from distributed.comm import connect

    import ferrylink.dask._comm  # noqa: F401  (the torch "cuda" serializers)

    proc, addresses = start_server(scheme, args.rmm_pool)
    context = ferrylink.Context()
    try:
        comm = await connect(addresses["comm"], timeout=60)
        endpoint = await context.connect_async(addresses["api"])
        for kind in args.objects.split(","):
            if kind == "device" and scheme == "tcp":
                continue
            for size in args.sizes.split(","):
                nbytes = parse_size(size)
                iters = args.iters or default_iters(nbytes)
                try:
                    obj = make_object(kind, nbytes, device)
                except ImportError as e:
                    print(f"{scheme}://: {kind} objects skipped ({e})", flush=True)
                    break
                times, ok = await comm_round_trips(comm, obj, iters, args.warmup)
                api = await api_round_trips(endpoint, await message_frames(obj), iters, args.warmup)
                serialization = await serialization_times(obj, min(iters, 50))
                object_name = kind if kind == "host" else f"device ({device}{', pool' if args.rmm_pool else ''})"
                emit(record(scheme, object_name, nbytes, times, api, ok, args.rmm_pool, serialization))
                del obj
        await comm.write("stop")
        await endpoint.send_async(b"stop", [])
        await comm.close()
        endpoint.close()
    finally:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def fmt_seconds(s: float) -> str:
    from ferrylink import _ferrylink

    return str(_ferrylink.format_seconds(s))


def fmt_bytes(n: int) -> str:
    from ferrylink import _ferrylink

    return str(_ferrylink.format_bytes(n))


def print_row(r: Dict[str, Any]) -> None:
    api = r.get("api_median_s")
    beside = (
        f"  Python API {fmt_seconds(api):>10}  comm adds {fmt_seconds(r['added_s']):>10} ({r['ratio']:.2f}x)"
        if api is not None
        else ""
    )
    if "floor_s" in r:
        beside += f"  floor {fmt_seconds(r['floor_s']):>10} ({r['floor_ratio']:.2f}x)"
    check = "" if r["checked"] else "  ECHO MISMATCH"
    print(
        f"{r['scheme'] + '://':<13}{r['object']:<20}{fmt_bytes(r['bytes']):>10}  median {fmt_seconds(r['median_s']):>10}"
        f"  min {fmt_seconds(r['min_s']):>10}{beside}{check}",
        flush=True,
    )


def main(argv: Optional[List[str]] = None) -> int:
    # UCX (ferrylink's UCX lane, and UCXX behind ucx://) prints its log on stdout unless
    # told otherwise: into the table, the JSON records, or the server's address line the
    # client reads (a log line's "[1765...]" stamp even parses as JSON). Before UCX
    # loads; the server inherits it.
    os.environ.setdefault("UCX_LOG_FILE", "stderr")
    args = parse_args(argv)
    use_rmm_pool(args.rmm_pool)
    if args.serve:
        asyncio.run(serve(args.serve))
        return 0
    device = device_kind(args.device_object)
    rows: List[Dict[str, Any]] = []

    def emit(r: Dict[str, Any]) -> None:
        rows.append(r)
        print(json.dumps(r), flush=True) if args.json else print_row(r)

    for scheme in args.schemes.split(","):
        if scheme == "ucx":
            try:
                import distributed_ucxx  # type: ignore[import-not-found]  # noqa: F401
            except ImportError as e:
                print(f"ucx://: skipped, distributed-ucxx is not importable ({e})", flush=True)
                continue
        try:
            asyncio.run(bench_scheme(scheme, args, device, emit))
        except Exception as e:  # one scheme's failure does not hide the others' figures
            print(f"{scheme}://: failed: {type(e).__name__}: {e}", flush=True)
    return 0 if rows and all(r["checked"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
