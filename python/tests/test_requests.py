"""Requests without their wait: ``isend``, ``irecv``, ``irecv_into`` and ``Request``."""

from __future__ import annotations

import asyncio
import gc

import pytest

import ferrylink

from conftest import run, wait_until_done


def pair(ctx):
    """Two endpoints of one connection, both in this process."""
    listener = ctx.listen()

    async def both():
        return await asyncio.gather(listener.accept_async(), ctx.connect_async(listener.path))

    accepted, connected = asyncio.run(both())
    return accepted, connected


def test_a_receive_posted_before_the_send_gets_it(ctx):
    a, b = pair(ctx)
    request = a.irecv()
    assert isinstance(request, ferrylink.Request)
    assert not request.done()
    sent = b.isend(b"first", [b"payload" * 1000])
    assert sent.wait() is None
    header, frames = request.wait()
    assert header == b"first" and bytes(frames[0]) == b"payload" * 1000
    assert request.done() and sent.done()


def test_posted_receives_complete_in_the_order_they_were_posted(ctx):
    a, b = pair(ctx)
    receives = [a.irecv() for _ in range(10)]
    sends = [b.isend(str(i).encode(), [bytes([i]) * (i * 1000)]) for i in range(10)]
    for s in sends:
        s.wait()
    for i, r in enumerate(receives):
        header, frames = r.wait()
        assert header == str(i).encode() and bytes(frames[0]) == bytes([i]) * (i * 1000)


def test_irecv_into_fills_the_given_buffers(ctx):
    a, b = pair(ctx)
    target = bytearray(5)
    request = a.irecv_into([target])
    b.send(b"into", [b"hello"])
    header, frames = request.wait()
    assert header == b"into" and frames[0] is target and target == b"hello"


def test_done_turns_true_without_waiting(ctx):
    a, b = pair(ctx)
    request = a.irecv()
    b.send(b"x", [])
    wait_until_done(request, "the receive never completed")
    assert request.wait().header == b"x"


def test_a_request_is_waited_for_once(ctx):
    a, b = pair(ctx)
    request = a.irecv()
    b.send(b"once", [])
    request.wait()
    with pytest.raises(ferrylink.FerrylinkError, match="already waited for"):
        request.wait()


def test_a_cancelled_or_dropped_receive_loses_no_message(ctx):
    a, b = pair(ctx)
    cancelled = a.irecv()
    cancelled.cancel()
    cancelled.cancel()  # idempotent
    assert cancelled.done()
    dropped = a.irecv()
    del dropped
    gc.collect()
    b.send(b"kept", [b"data"])
    header, frames = a.recv()
    assert header == b"kept" and bytes(frames[0]) == b"data"


def test_a_receive_whose_message_arrived_and_was_dropped_gives_it_to_the_next(ctx):
    a, b = pair(ctx)
    request = a.irecv()
    b.send(b"landed", [b"1"])
    wait_until_done(request, "the message never landed")
    request.cancel()
    assert a.recv().header == b"landed"


def test_requests_can_be_awaited(ctx):
    a, b = pair(ctx)

    async def main():
        request = a.irecv()
        await b.isend(b"awaited", [b"z" * 100])
        header, frames = await request
        assert header == b"awaited" and bytes(frames[0]) == b"z" * 100

    run(main())


def test_a_send_error_is_raised_by_wait(ctx):
    a, b = pair(ctx)
    a.close()
    with pytest.raises(ferrylink.EndpointClosedError):
        a.isend(b"", [])
    request = b.irecv()
    with pytest.raises(ferrylink.PeerClosedError):
        request.wait()


def test_repr_says_what_and_whether_done(ctx):
    a, b = pair(ctx)
    request = a.irecv()
    assert repr(request) == "<ferrylink.Request receive pending>"
    b.send(b"", [])
    request.wait()
    assert repr(request) == "<ferrylink.Request receive done>"


def test_an_awaited_request_that_times_out_loses_no_message(ctx):
    a, b = pair(ctx)

    async def main():
        request = a.irecv()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(request, 0.05)
        assert request.done()  # cancelled with its task
        await b.isend(b"after the timeout", [b"kept"])
        header, frames = await a.irecv()
        assert header == b"after the timeout" and bytes(frames[0]) == b"kept"

    run(main())
