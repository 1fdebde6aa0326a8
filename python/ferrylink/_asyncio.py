"""Awaiting ferrylink requests on an asyncio event loop.

Each event loop gets one :class:`~ferrylink._ferrylink.Wakeup`: a socket pair the loop
watches (``add_reader``). A request polled from a coroutine hands ferrylink a waker with
a token; ferrylink's progress thread wakes it without touching the GIL (the token joins a
ready list, a byte goes down the socket), and the loop's reader callback resolves the
future that coroutine awaits. The coroutine then polls the request itself, so a result
is taken out of ferrylink only inside the coroutine: cancelling it between the wake-up
and the result drops the request, and a message it would have delivered goes back to
the endpoint for the next receive.
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from typing import Any, Dict

from ._ferrylink import Op, Wakeup

_tokens = itertools.count(1)


class _LoopWakeup:
    """The wake-up channel of one event loop and the futures waiting on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.wakeup = Wakeup()
        self.waiting: Dict[int, "asyncio.Future[None]"] = {}
        loop.add_reader(self.wakeup.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        for token in self.wakeup.take_ready():
            future = self.waiting.pop(token, None)
            if future is not None and not future.done():
                future.set_result(None)


_loops: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWakeup]" = weakref.WeakKeyDictionary()


def _loop_wakeup(loop: asyncio.AbstractEventLoop) -> _LoopWakeup:
    wakeup = _loops.get(loop)
    if wakeup is None:
        wakeup = _LoopWakeup(loop)
        _loops[loop] = wakeup
    return wakeup


async def complete(op: Op) -> Any:
    """Awaits ``op`` and returns its result (raising its error). Cancelling the awaiting
    task drops the request (see the module documentation)."""
    loop = asyncio.get_running_loop()
    wakeup = _loop_wakeup(loop)
    token = next(_tokens)
    try:
        while True:
            # The future goes in before the poll, so a wake-up between the two finds it.
            future = loop.create_future()
            wakeup.waiting[token] = future
            done, value = op.poll(wakeup.wakeup, token)
            if done:
                return value
            await future
    except BaseException:
        op.cancel()
        raise
    finally:
        wakeup.waiting.pop(token, None)
