"""Prepared one-sided transfers from Python on host memory: checked once, posted again
and again, by either side of a connection, and what is refused."""

from __future__ import annotations

import pytest

import ferrylink

from conftest import run
from test_onesided import owner_and_peer, pattern, run_over_ucx_rma
from test_requests import pair

BLOCK = 64
BLOCKS = 100


def reversed_blocks():
    """Block i of the local memory goes to slot BLOCKS - 1 - i of the remote one."""
    return [(i * BLOCK, (BLOCKS - 1 - i) * BLOCK, BLOCK) for i in range(BLOCKS)]


def expect_reversed(data: bytes) -> bytes:
    return b"".join(data[(BLOCKS - 1 - i) * BLOCK : (BLOCKS - i) * BLOCK] for i in range(BLOCKS))


@pytest.mark.parametrize("initiator", ["connector", "listener"])
def test_a_prepared_put_moves_the_sources_bytes_at_every_post(ctx, initiator):
    a, b = pair(ctx)
    # The side that initiates writes into the other side's registration; from the
    # listener, the connector (the owner) runs each post from its kept description.
    owner, peer = (a, b) if initiator == "connector" else (b, a)
    buf = ferrylink.host_buffer(BLOCK * BLOCKS)
    reg = ctx.register(buf, "rw")
    region = peer.import_region(reg.key)
    src = ferrylink.host_buffer(BLOCK * BLOCKS)
    local = ctx.register(src, "r")
    prepared = peer.prepare_put(local, region, spans=reversed_blocks())
    assert isinstance(prepared, ferrylink.PreparedTransfer)
    assert prepared.is_put and prepared.span_count == BLOCKS and prepared.nbytes == BLOCK * BLOCKS
    assert repr(prepared) == f"<ferrylink.PreparedTransfer put spans={BLOCKS} nbytes={BLOCK * BLOCKS}>"
    for seed in range(3):
        src[:] = pattern(BLOCK * BLOCKS, seed)
        peer.post(prepared, notify=b"round %d" % seed)
        assert owner.recv_notification() == b"round %d" % seed
        assert bytes(buf) == expect_reversed(pattern(BLOCK * BLOCKS, seed)), f"round {seed}"


def test_a_prepared_get_reads_what_the_owner_holds_at_each_post(ctx):
    a, b, buf, reg, region = owner_and_peer(ctx, nbytes=BLOCK * BLOCKS)
    dst = ferrylink.host_buffer(BLOCK * BLOCKS)
    prepared = b.prepare_get(ctx.register(dst, "w"), region, local_offset=64, remote_offset=128, nbytes=1000)
    assert not prepared.is_put and prepared.span_count == 1 and prepared.nbytes == 1000
    for seed in (7, 8):
        buf[:] = pattern(BLOCK * BLOCKS, seed)
        request = b.ipost(prepared, notify=b"taken")
        assert isinstance(request, ferrylink.Request)
        assert request.wait() is None
        assert a.recv_notification() == b"taken"
        assert bytes(dst[64:1064]) == pattern(BLOCK * BLOCKS, seed)[128:1128]
        assert bytes(dst[:64]) == bytes(64) and bytes(dst[1064:]) == bytes(BLOCK * BLOCKS - 1064)


def test_what_a_transfer_refuses_is_refused_when_it_is_prepared(ctx):
    a, b, buf, reg, region = owner_and_peer(ctx, access="r")
    local = ctx.register(ferrylink.host_buffer(100), "rw")
    with pytest.raises(ferrylink.FerrylinkError, match="(?i)access|write"):
        b.prepare_put(local, region)
    with pytest.raises(ferrylink.FerrylinkError):
        b.prepare_get(local, region, remote_offset=4090, nbytes=10)
    with pytest.raises(ferrylink.FerrylinkError):
        b.prepare_get(local, region, spans=[(0, 0, 60), (50, 100, 20)])  # local destinations overlap
    with pytest.raises(TypeError):
        b.prepare_get(local, region, spans=[(0, 0, 1)], nbytes=1)
    assert bytes(buf) == bytes(4096)


def test_posts_after_a_revocation_a_close_or_on_another_endpoint_are_refused(ctx):
    a, b, buf, reg, region = owner_and_peer(ctx)
    local = ctx.register(ferrylink.host_buffer(16), "r")
    prepared = b.prepare_put(local, region, nbytes=16)
    b.post(prepared)
    with pytest.raises(ferrylink.InvalidMessageError, match="another endpoint"):
        a.post(prepared)
    reg.revoke()
    # A round trip after the revocation: the owner's word of it has reached `b`.
    other = ctx.register(ferrylink.host_buffer(8), "r")
    b.import_region(other.key)
    with pytest.raises(ferrylink.RevokedError):
        b.post(prepared)
    with prepared:
        pass
    assert repr(prepared) == "<ferrylink.PreparedTransfer closed>"
    with pytest.raises(ValueError, match="closed"):
        b.post(prepared)


def test_a_prepared_transfer_is_posted_on_asyncio(ctx):
    a, b, buf, reg, region = owner_and_peer(ctx)
    src = ferrylink.host_buffer(256)
    src[:] = pattern(256, 9)
    prepared = b.prepare_put(ctx.register(src, "r"), region, remote_offset=1024)

    async def main():
        await b.post_async(prepared, notify=b"async")
        assert await a.recv_notification_async() == b"async"

    run(main())
    assert bytes(buf[1024:1280]) == pattern(256, 9)


def test_prepared_transfers_over_the_ucx_lane():
    """Over UCX (which keeps nothing prepared: each post is a batch without the check),
    the same calls move fresh bytes at every post, both ways."""

    async def body(owner_ctx, peer_ctx, a, b):
        buf = ferrylink.host_buffer(BLOCK * BLOCKS)
        reg = owner_ctx.register(buf, "rw")
        region = await b.import_region_async(reg.key)
        src = ferrylink.host_buffer(BLOCK * BLOCKS)
        local = peer_ctx.register(src, "rw")
        put = b.prepare_put(local, region, spans=reversed_blocks())
        for seed in (11, 12):
            src[:] = pattern(BLOCK * BLOCKS, seed)
            await b.post_async(put, notify=b"%d" % seed)
            assert await a.recv_notification_async() == b"%d" % seed
            assert bytes(buf) == expect_reversed(pattern(BLOCK * BLOCKS, seed))
        get = b.prepare_get(local, region, nbytes=BLOCK)
        buf[:BLOCK] = pattern(BLOCK, 13)
        await b.post_async(get)
        assert bytes(src[:BLOCK]) == pattern(BLOCK, 13)

    run_over_ucx_rma(body)
