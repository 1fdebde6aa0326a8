"""``--op put|get`` of ``python -m ferrylink.benchmarks.send_recv``: the round trip
one-sided, as the Rust ``local-send-recv --op put|get`` runs it.

Each side registers its memory once, before the round trips, and the keys go over the
endpoint as message headers. ``put``: the client puts n bytes into the server's region
with a notification; on it the server puts them back into the client's landing region,
with a notification that ends the round trip. ``get``: the client gets the server's
region into its landing region with a notification (delivered after the read); on it the
server gets the client's source into its region, with a notification that ends the
round trip. Bandwidth is 2·n/t, as for sends.

Checked outside the timing, after the last round trip: the client's landing region
starts empty and must then hold the source's bytes (for get, from two round trips on:
the first reads the server's region before anything was written into it).
"""

from __future__ import annotations

import time
from typing import Any, List

import ferrylink

OPS = ("put", "get")


def serve(ctx: ferrylink.Context, ep: ferrylink.Endpoint, region: Any, op: str, total: int) -> None:
    """The server's side: registers ``region``, trades keys, answers ``total`` round
    trips, then waits for the client's last message (its registrations stay until then)."""
    mine = ctx.register(region, "rw")
    ep.send(mine.key, [])
    key, _ = ep.recv()
    theirs = ep.import_region(key)
    move = ep.put if op == "put" else ep.get
    for _ in range(total):
        ep.recv_notification()
        move(mine, theirs, notify=b"")
    ep.recv()
    mine.revoke()


def client_round_trips(
    ctx: ferrylink.Context, ep: ferrylink.Endpoint, source: Any, landing: Any, op: str, total: int
) -> List[float]:
    """The client's side: returns each round trip's seconds."""
    source_reg = ctx.register(source, "r")
    landing_reg = ctx.register(landing, "w")
    key, _ = ep.recv()
    server = ep.import_region(key)
    # The server writes into the landing region (put) or reads the source (get).
    ep.send(landing_reg.key if op == "put" else source_reg.key, [])
    times: List[float] = []
    for _ in range(total):
        t0 = time.perf_counter()
        if op == "put":
            ep.put(source_reg, server, notify=b"")
        else:
            ep.get(landing_reg, server, notify=b"")
        ep.recv_notification()
        times.append(time.perf_counter() - t0)
    ep.send(b"done", [])
    source_reg.revoke()
    landing_reg.revoke()
    return times


def checkable(op: str, total: int) -> bool:
    """Whether the landing region must equal the source after ``total`` round trips."""
    return op == "put" or total >= 2
