"""The asyncio forms: round trips, accept and connect, and cancellation that loses no
message."""

from __future__ import annotations

import asyncio
import random

import pytest

import ferrylink

from conftest import TIMEOUT_MS, no_ucx_here, run


def test_async_round_trip_with_the_echo_peer(echo_ep):
    async def main():
        await echo_ep.send_async(b"async", [b"one", bytearray(b"two" * 100_000)])
        header, frames = await echo_ep.recv_async()
        assert header == b"async" and bytes(frames[0]) == b"one" and len(frames[1]) == 300_000
        await echo_ep.send_async(b"into", [b"abcd"])
        target = bytearray(4)
        header, frames = await echo_ep.recv_into_async([target])
        assert header == b"into" and frames[0] is target and target == b"abcd"

    run(main())


def test_async_accept_and_connect_in_one_loop(ctx):
    async def main():
        listener = ctx.listen()
        accepted, connected = await asyncio.gather(listener.accept_async(), ctx.connect_async(listener.path))
        sends = [connected.send_async(str(i).encode(), [bytes([i]) * 1000]) for i in range(20)]
        receives = [accepted.recv_async() for _ in range(20)]
        await asyncio.gather(*sends)
        messages = await asyncio.gather(*receives)
        assert [m.header for m in messages] == [str(i).encode() for i in range(20)]
        assert [bytes(m.frames[0][:1]) for m in messages] == [bytes([i]) for i in range(20)]

    run(main())


def test_an_awaited_receive_does_not_block_the_loop(ctx):
    async def main():
        listener = ctx.listen()
        a, b = await asyncio.gather(listener.accept_async(), ctx.connect_async(listener.path))
        receive = asyncio.ensure_future(a.recv_async())
        ticks = 0
        for _ in range(20):
            await asyncio.sleep(0.001)
            ticks += 1
        assert not receive.done() and ticks == 20
        await b.send_async(b"now", [])
        assert (await receive).header == b"now"

    run(main())


def test_a_cancelled_receive_loses_no_message(ctx):
    async def main():
        listener = ctx.listen()
        a, b = await asyncio.gather(listener.accept_async(), ctx.connect_async(listener.path))
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(a.recv_async(), 0.05)
        await b.send_async(b"after the cancel", [])
        assert (await a.recv_async()).header == b"after the cancel"

    run(main())


def test_receives_cancelled_at_random_moments_lose_no_message(ctx):
    """A sender streams numbered messages while the receiver keeps giving up on its
    receives at random moments, some of them just as a message arrives: every message
    still arrives, once, in order."""
    count = 300

    async def main():
        listener = ctx.listen()
        a, b = await asyncio.gather(listener.accept_async(), ctx.connect_async(listener.path))
        rng = random.Random(17)

        async def send_all():
            for i in range(count):
                await b.send_async(i.to_bytes(4, "little"), [bytes(rng.randrange(0, 20_000))])
                if rng.random() < 0.3:
                    await asyncio.sleep(rng.random() * 0.002)

        sender = asyncio.ensure_future(send_all())
        received = []
        cancelled = 0
        while len(received) < count:
            try:
                message = await asyncio.wait_for(a.recv_async(), rng.random() * 0.003)
            except asyncio.TimeoutError:
                cancelled += 1
                continue
            received.append(int.from_bytes(message.header, "little"))
        await sender
        assert received == list(range(count))
        assert cancelled > 0

    run(main())


def test_a_cancelled_accept_accepts_nothing(ctx):
    async def main():
        listener = ctx.listen()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(listener.accept_async(), 0.05)
        b = await ctx.connect_async(listener.path)
        a = await listener.accept_async()
        await b.send_async(b"hello", [])
        assert (await a.recv_async()).header == b"hello"

    run(main())


def test_async_errors_are_raised_in_the_coroutine(ctx, tmp_path):
    async def main():
        with pytest.raises(ferrylink.ConnectError):
            await ctx.connect_async(tmp_path / "nobody.sock")
        listener = ctx.listen()
        a, b = await asyncio.gather(listener.accept_async(), ctx.connect_async(listener.path))
        b.close()
        with pytest.raises(ConnectionError):
            await a.recv_async()

    run(main())


def test_a_short_timeout_ends_an_awaited_receive():
    async def main():
        with ferrylink.Context(timeout_ms=200) as c:
            listener = c.listen()
            a, b = await asyncio.gather(listener.accept_async(), c.connect_async(listener.path))
            with pytest.raises(ferrylink.TimedOutError):
                await a.recv_async()
            await b.send_async(b"kept", [])
            assert (await a.recv_async()).header == b"kept"

    run(main())


def test_many_concurrent_awaited_requests_all_complete(ctx):
    """Hundreds of requests in flight at once, woken in bursts from the progress thread:
    a wake-up lost between the loop's reader and the progress thread would leave one
    waiting until its timeout."""
    pairs, count = 4, 150

    async def main():
        listener = ctx.listen()
        ends = []
        for _ in range(pairs):
            ends.append(await asyncio.gather(listener.accept_async(), ctx.connect_async(listener.path)))

        async def stream(a, b):
            receives = [asyncio.ensure_future(a.recv_async()) for _ in range(count)]
            await asyncio.gather(*(b.send_async(i.to_bytes(2, "little"), []) for i in range(count)))
            return [int.from_bytes(m.header, "little") for m in await asyncio.gather(*receives)]

        results = await asyncio.gather(*(stream(a, b) for a, b in ends))
        assert all(r == list(range(count)) for r in results)

    run(main())


def test_async_connect_over_tcp(ctx):
    async def main():
        listener = ctx.listen_tcp(0, "127.0.0.1")
        host, port = listener.tcp_address
        with ferrylink.Context(timeout_ms=TIMEOUT_MS) as other:
            a, b = await asyncio.gather(listener.accept_async(), other.connect_tcp_async(host, port))
            assert a.lane == b.lane == "ucx"
            await b.send_async(b"tcp", [b"payload" * 1000])
            header, (frame,) = await a.recv_async()
            assert header == b"tcp" and bytes(frame) == b"payload" * 1000

    try:
        run(main())
    except ferrylink.ConnectError as e:
        no_ucx_here(e, f"no UCX lane here: {e}")
