"""Device → host spilling for Dask: ``python -m ferrylink.benchmarks.dask_spill``.

Measured in one run on one GPU, beside the ceiling:

1. **ceiling**: one pinned device → host copy of ``--n-bytes`` (``cudaMemcpyAsync``
   from a torch CUDA tensor into page-locked ``cudaHostAlloc`` memory);
2. **eviction through the mapping**: a :class:`ferrylink.dask.DeviceHostFile` whose
   device tier holds ``--n-bytes`` of torch CUDA tensors (``--pieces`` of them) is
   given one more tensor as large as the tier, which moves every one of them to the
   host tier (copies into the pinned pool); the rate is the bytes moved over the time
   of that one assignment, and its efficiency is against the ceiling;
3. **serializers**: the same tensor through ``serialize(x,
   serializers=["ferrylink"])`` (device → pinned pool frames) and through Dask's
   ``"pickle"`` family (a fresh host copy: Dask's default list ``("dask", "pickle")``
   stops at ``"dask"``, whose torch serializer fails on a CUDA tensor), and an RMM
   ``DeviceBuffer`` of the same bytes through ``"ferrylink"`` and Dask's ``"dask"``
   family (a fresh NumPy array per frame) where ``rmm`` and ``numba`` are installed;
   beside them, a plain fresh host copy of the tensor (``.cpu()``), what that family
   does for each frame.

Every timed run is checked afterwards (sampled bytes of evicted entries read back,
serialized frames deserialized and compared). ``--json PATH`` writes the figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

from ferrylink import _ferrylink

EVICTION_TARGET = 0.90
SERIALIZER_TARGET = 20.0


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ferrylink.benchmarks.dask_spill", description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--n-bytes", default="1GiB", type=_ferrylink.parse_size, help="bytes evicted (default 1GiB)")
    p.add_argument("--pieces", default=16, type=int, help="tensors the evicted bytes are cut into (default 16)")
    p.add_argument("--n-iter", default=5, type=int, help="timed runs of each measurement (default 5)")
    p.add_argument("--n-warmup-iter", default=1, type=int, help="untimed runs first (default 1)")
    p.add_argument("--device", default=0, type=int, help="CUDA device (default 0)")
    p.add_argument("--json", default=None, help="write the figures to this file")
    return p.parse_args(argv)


def timed(run: Callable[[], Any], check: Callable[[Any], None], iters: int, warmup: int, nbytes: int) -> List[float]:
    """Rates in bytes/s of ``iters`` runs after ``warmup`` untimed ones; ``check`` sees
    each run's result after its timing."""
    rates = []
    for i in range(warmup + iters):
        gc.collect()
        start = time.perf_counter()
        result = run()
        elapsed = time.perf_counter() - start
        check(result)
        del result
        if i >= warmup:
            rates.append(nbytes / elapsed)
    return rates


def summary(rates: List[float]) -> Dict[str, float]:
    return {"best": max(rates), "median": statistics.median(rates), "worst": min(rates)}


def line(label: str, rates: Dict[str, float], extra: str = "") -> None:
    fmt = _ferrylink.format_rate
    print(f"{label:<58} {fmt(rates['median']):>12}  (best {fmt(rates['best'])}, worst {fmt(rates['worst'])}){extra}")


def pinned_ceiling(torch: Any, source: Any, args: argparse.Namespace) -> List[float]:
    host = torch.empty(source.numel(), dtype=source.dtype, pin_memory=True)
    stream = torch.cuda.current_stream(source.device)

    def run() -> None:
        host.copy_(source, non_blocking=True)
        stream.synchronize()

    def check(_: None) -> None:
        assert bool(host[-1] == source[-1].cpu()), "the pinned copy differs"

    return timed(run, check, args.n_iter, args.n_warmup_iter, source.nbytes)


def eviction(torch: Any, args: argparse.Namespace) -> List[float]:
    from ferrylink.dask import DeviceHostFile

    n, pieces = args.n_bytes, args.pieces
    piece = n // pieces // 4 * 4
    evicted_bytes = piece * pieces
    # Room for the evicted pieces, the trigger (moved down by the check's read) and a copy.
    pool_bytes = 3 * n
    pool = _ferrylink.PinnedPool(pool_bytes, region_bytes=pool_bytes)
    tensors = [torch.full((piece // 4,), float(i), device=f"cuda:{args.device}") for i in range(pieces)]
    trigger = torch.zeros(evicted_bytes // 4, device=f"cuda:{args.device}")
    torch.cuda.synchronize(args.device)
    directory = tempfile.mkdtemp(prefix="ferrylink-dask-spill-")
    state: Dict[str, Any] = {}

    def run() -> Any:
        dhf = state["dhf"]
        dhf["trigger"] = trigger
        return dhf

    def check(dhf: Any) -> None:
        assert len(dhf.device) == 1 and len(dhf.host) == pieces, dhf
        got = dhf[pieces - 1]  # read back to the device, untimed
        assert float(got[0]) == float(pieces - 1) == float(got[-1]), "an evicted piece came back wrong"

    rates = []
    for i in range(args.n_warmup_iter + args.n_iter):
        dhf = DeviceHostFile(directory, device_memory_limit=evicted_bytes, memory_limit=4 * n, pinned_pool=pool)
        for k, t in enumerate(tensors):
            dhf[k] = t
        assert len(dhf.device) == pieces, "every piece fits the device tier"
        state["dhf"] = dhf
        rate = timed(run, check, 1, 0, evicted_bytes)
        if i >= args.n_warmup_iter:
            rates += rate
        state.clear()
        del dhf
    return rates


def serializers(torch: Any, source: Any, args: argparse.Namespace) -> Dict[str, List[float]]:
    """Rates of the ``"ferrylink"`` family and of Dask's own ways for the same object:
    the torch tensor through ``"pickle"`` (Dask's default list fails on it), and an RMM
    ``DeviceBuffer`` through ``"dask"`` where rmm and numba are installed."""
    from distributed.protocol import deserialize, serialize

    from ferrylink.dask import register_serializers
    from ferrylink.dask._serializers import shared_pinned_pool

    register_serializers()
    shared_pinned_pool(2 * source.nbytes + (256 << 20))
    expected_last = source[-1].item()
    out: Dict[str, List[float]] = {}

    def check_tensor(result: Any) -> None:
        header, frames = result
        back = deserialize(header, frames)
        assert back.shape == source.shape and back[-1].item() == expected_last, "the round trip differs"

    try:
        serialize(source[:1], on_error="raise")
        print("Dask's default families ('dask', 'pickle') serialize a torch CUDA tensor")
    except TypeError as e:
        print(f"Dask's default families ('dask', 'pickle') fail on a torch CUDA tensor ({e.__cause__!r}): "
              "its 'pickle' family is timed")
    for label, families in (("ferrylink, torch", ["ferrylink"]), ("pickle, torch", ["pickle"])):
        out[label] = timed(
            lambda: serialize(source, serializers=families, on_error="raise"),
            check_tensor,
            args.n_iter,
            args.n_warmup_iter,
            source.nbytes,
        )

    def check_copy(host: Any) -> None:
        assert host[-1].item() == expected_last, "the host copy differs"

    # What Dask's "dask" family does for CuPy and RMM objects: one fresh host array each.
    out["fresh host copy, torch .cpu()"] = timed(
        lambda: source.cpu(), check_copy, args.n_iter, args.n_warmup_iter, source.nbytes
    )
    try:
        import numba.cuda  # noqa: F401  (Dask's RMM serializer copies through Numba)
        import rmm
    except Exception as e:  # not installed, or no CUDA for numba
        print(f"RMM DeviceBuffer through Dask's 'dask' family: skipped ({type(e).__name__}: {e})")
        return out
    buf = rmm.DeviceBuffer.to_device(source.cpu().numpy().view("u1"))
    expected = source[-1:].cpu().numpy().tobytes()

    def check_buffer(result: Any) -> None:
        header, frames = result
        back = deserialize(header, frames)
        assert bytes(back.copy_to_host()[-4:]) == expected, "the RMM round trip differs"

    for label, families in (("ferrylink, rmm", ["ferrylink"]), ("dask, rmm", ["dask"])):
        out[label] = timed(
            lambda: serialize(buf, serializers=families, on_error="raise"),
            check_buffer,
            args.n_iter,
            args.n_warmup_iter,
            source.nbytes,
        )
    return out


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("needs torch (with CUDA)", file=sys.stderr)
        return 2

    if not torch.cuda.is_available() or _ferrylink.device_count() == 0:
        print("needs a CUDA device and torch", file=sys.stderr)
        return 2
    torch.cuda.set_device(args.device)
    n = args.n_bytes
    print(f"ferrylink.dask spill benchmark on {torch.cuda.get_device_name(args.device)}, {_ferrylink.format_bytes(n)}")
    source = torch.arange(n // 4, dtype=torch.float32, device=f"cuda:{args.device}")
    figures: Dict[str, Any] = {"n_bytes": n, "pieces": args.pieces, "device": torch.cuda.get_device_name(args.device)}

    ceiling = summary(pinned_ceiling(torch, source, args))
    line("pinned device -> host copy (ceiling)", ceiling)
    evict = summary(eviction(torch, args))
    efficiency = evict["median"] / ceiling["median"]
    met = "met" if efficiency >= EVICTION_TARGET else "NOT met"
    line(f"DeviceHostFile eviction, {args.pieces} tensors -> host", evict, f"  {efficiency:.1%} of the ceiling")
    print(f"  target >= {EVICTION_TARGET:.0%} of the ceiling: {met}")
    figures.update(ceiling=ceiling, eviction=evict, eviction_efficiency=efficiency)

    rates = {label: summary(r) for label, r in serializers(torch, source, args).items()}
    for label, r in rates.items():
        line(f"serialize ({label})", r)
    ferrylink_rate = rates["ferrylink, torch"]["median"]
    ratios = {
        "torch: ferrylink / pickle": ferrylink_rate / rates["pickle, torch"]["median"],
        "torch: ferrylink / fresh host copy": ferrylink_rate / rates["fresh host copy, torch .cpu()"]["median"],
    }
    if "dask, rmm" in rates:
        ratios["rmm: ferrylink / dask"] = rates["ferrylink, rmm"]["median"] / rates["dask, rmm"]["median"]
    for label, ratio in ratios.items():
        met = "met" if ratio >= SERIALIZER_TARGET else "NOT met"
        print(f"  {label}: {ratio:.1f}x (target >= {SERIALIZER_TARGET:.0f}x: {met})")
    figures.update(serializers=rates, serializer_ratios=ratios)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
