"""One-sided transfers from Python on host memory: register, import, put and get with
notifications, batches, and what is refused."""

from __future__ import annotations

import asyncio

import pytest

import ferrylink

from conftest import TIMEOUT_MS, no_ucx_here, run, wait_until_done
from test_requests import pair


def pattern(n: int, seed: int) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(n))


def owner_and_peer(ctx, nbytes=4096, access="rw"):
    """`a` owns a registered shared buffer; `b` imported it. Returns (a, b, buffer,
    registration, region)."""
    a, b = pair(ctx)
    buf = ferrylink.host_buffer(nbytes)
    reg = ctx.register(buf, access)
    region = b.import_region(reg.key)
    return a, b, buf, reg, region


def test_a_put_lands_in_the_owners_memory_and_its_notification_follows(ctx):
    a, b, buf, reg, region = owner_and_peer(ctx)
    assert len(reg.key) == 48 and reg.nbytes == 4096 and reg.access == "rw"
    assert region.nbytes == 4096 and region.access == "rw" and not region.is_device
    src = ferrylink.host_buffer(1000)
    src[:] = pattern(1000, 1)
    local = ctx.register(src, "r")
    note = a.irecv_notification()
    assert not note.done()
    b.put(local, region, remote_offset=3000, notify=b"block 7")
    wait_until_done(note, "the notification never came")
    assert note.wait() == b"block 7"
    assert bytes(buf[3000:4000]) == pattern(1000, 1)
    assert bytes(buf[:3000]) == bytes(3000)


def test_a_get_reads_the_owners_memory(ctx):
    a, b, buf, reg, region = owner_and_peer(ctx)
    buf[:] = pattern(4096, 2)
    dst = ferrylink.host_buffer(4096)
    local = ctx.register(dst, "w")
    b.get(local, region, local_offset=96, remote_offset=100, nbytes=3996, notify=b"taken")
    assert bytes(dst[96:4092]) == pattern(4096, 2)[100:4096]
    assert bytes(dst[:96]) == bytes(96) and bytes(dst[4092:]) == bytes(4)
    assert a.recv_notification() == b"taken"


def test_a_batch_moves_every_span_in_one_request(ctx):
    a, b, buf, reg, region = owner_and_peer(ctx, nbytes=64 * 100)
    src = ferrylink.host_buffer(64 * 100)
    src[:] = pattern(64 * 100, 3)
    local = ctx.register(src, "r")
    # Block i of the source goes to slot 99 - i of the owner's buffer.
    spans = [(i * 64, (99 - i) * 64, 64) for i in range(100)]
    request = b.iput(local, region, spans=spans, notify=b"all")
    assert isinstance(request, ferrylink.Request)
    assert request.wait() is None
    assert a.recv_notification() == b"all"
    for i in range(100):
        assert bytes(buf[(99 - i) * 64 : (100 - i) * 64]) == pattern(64 * 100, 3)[i * 64 : (i + 1) * 64]


def test_numpy_arrays_over_a_shared_buffer_register_too(ctx):
    np = pytest.importorskip("numpy")
    a, b = pair(ctx)
    array = np.frombuffer(ferrylink.host_buffer(800), dtype=np.float64)
    array[:] = np.arange(100)
    reg = ctx.register(array, "r")
    region = b.import_region(reg.key)
    out = np.frombuffer(ferrylink.host_buffer(800), dtype=np.float64)
    b.get(ctx.register(out, "w"), region)
    assert (out == np.arange(100)).all()


def test_access_bounds_and_overlaps_are_refused_and_nothing_moves(ctx):
    a, b, buf, reg, region = owner_and_peer(ctx, access="r")
    src = ferrylink.host_buffer(100)
    src[:] = pattern(100, 4)
    local = ctx.register(src, "rw")
    with pytest.raises(ferrylink.FerrylinkError, match="(?i)access|write"):
        b.put(local, region)
    assert bytes(buf) == bytes(4096)
    with pytest.raises(ferrylink.FerrylinkError):
        b.get(local, region, remote_offset=4090, nbytes=10)
    with pytest.raises(ferrylink.FerrylinkError):
        b.get(local, region, spans=[(0, 0, 60), (50, 100, 20)])  # local destinations overlap
    with pytest.raises(TypeError):
        b.get(local, region, spans=[(0, 0, 1)], nbytes=1)


def test_memory_a_peer_cannot_map_is_refused_not_copied(ctx):
    with pytest.raises(ferrylink.UnsupportedError, match=r"shared buffer.*ferrylink\.host_buffer"):
        ctx.register(bytearray(100), "rw")
    with pytest.raises(ferrylink.ConfigError, match="access"):
        ctx.register(ferrylink.host_buffer(10), "x")


def test_bad_keys_and_revoked_registrations_are_refused(ctx):
    a, b, buf, reg, region = owner_and_peer(ctx)
    with pytest.raises(ferrylink.InvalidMessageError, match="remote key"):
        b.import_region(b"not a key")
    key = reg.key
    reg.revoke()
    reg.revoke()  # idempotent
    assert reg.revoked and repr(reg) == "<ferrylink.Registration revoked>"
    with pytest.raises(ferrylink.RevokedError):
        reg.key
    with pytest.raises(ferrylink.FerrylinkError):
        b.import_region(key)
    src = ferrylink.host_buffer(10)
    with pytest.raises(ferrylink.FerrylinkError):
        b.put(ctx.register(src, "r"), region, nbytes=10)


def test_a_registration_used_as_a_context_manager_is_revoked_after(ctx):
    a, b = pair(ctx)
    with ctx.register(ferrylink.host_buffer(64), "rw") as reg:
        key = reg.key
        b.import_region(key)
    assert reg.revoked
    with pytest.raises(ferrylink.FerrylinkError):
        b.import_region(key)


def test_one_sided_calls_work_on_asyncio(ctx):
    a, b, buf, reg, region = owner_and_peer(ctx)
    src = ferrylink.host_buffer(256)
    src[:] = pattern(256, 5)
    local = ctx.register(src, "r")

    async def main():
        region2 = await b.import_region_async(reg.key)
        note = asyncio.ensure_future(a.recv_notification_async())
        await b.put_async(local, region2, remote_offset=512, notify=b"async")
        assert await note == b"async"
        dst = ctx.register(ferrylink.host_buffer(256), "w")
        await b.get_async(dst, region2, remote_offset=512)
        assert bytes(dst.frame) == pattern(256, 5)

    run(main())


def test_a_dropped_notification_wait_loses_no_notification(ctx):
    a, b, buf, reg, region = owner_and_peer(ctx)
    waiting = a.irecv_notification()
    waiting.cancel()
    local = ctx.register(ferrylink.host_buffer(8), "r")
    b.put(local, region, notify=b"kept")
    assert a.recv_notification() == b"kept"


def run_over_ucx_rma(body):
    """Runs ``await body(owner_ctx, peer_ctx, a, b)``: two contexts with UCX's RMA on
    (FERRYLINK_UCX_RMA), ``a`` accepted by the owner's TCP listener from ``b``, both on
    the UCX lane. Where no UCX lane can be had, skips (fails with FERRYLINK_REQUIRE_UCX=1)."""

    async def main():
        with ferrylink.Context(timeout_ms=TIMEOUT_MS, ucx_rma=True) as owner_ctx, ferrylink.Context(
            timeout_ms=TIMEOUT_MS, ucx_rma=True
        ) as peer_ctx:
            listener = owner_ctx.listen_tcp(0, "127.0.0.1")
            host, port = listener.tcp_address
            a, b = await asyncio.gather(listener.accept_async(), peer_ctx.connect_tcp_async(host, port))
            assert a.lane == b.lane == "ucx"
            await body(owner_ctx, peer_ctx, a, b)

    try:
        run(main())
    except ferrylink.ConnectError as e:
        no_ucx_here(e, f"no UCX lane here: {e}")


def test_put_and_get_over_the_ucx_lane():
    """Both sides with UCX's RMA on (FERRYLINK_UCX_RMA), meeting over TCP: the same calls
    move host memory through UCX."""

    async def body(owner_ctx, peer_ctx, a, b):
        buf = ferrylink.host_buffer(8192)
        reg = owner_ctx.register(buf, "rw")
        region = await b.import_region_async(reg.key)
        src = ferrylink.host_buffer(4096)
        src[:] = pattern(4096, 9)
        local = peer_ctx.register(src, "rw")
        await b.put_async(local, region, remote_offset=4096, notify=b"over ucx")
        assert await a.recv_notification_async() == b"over ucx"
        assert bytes(buf[4096:]) == pattern(4096, 9) and bytes(buf[:4096]) == bytes(4096)
        buf[:4096] = pattern(4096, 10)
        await b.get_async(local, region)
        assert bytes(src) == pattern(4096, 10)

    run_over_ucx_rma(body)
