"""Contexts, listeners and endpoints: the blocking API and its asyncio forms."""

from __future__ import annotations

import asyncio
import ctypes
import os
from typing import Any, Dict, Generator, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

from . import _asyncio
from ._ferrylink import HostFrame, Op, _Context, _Endpoint, _Listener
from ._onesided import PreparedTransfer, Registration, RemoteRegion, spans_of

PathLike = Union[str, "os.PathLike[str]"]


class Message(NamedTuple):
    """A received message.

    ``header`` is the sender's header bytes. ``frames`` are, for :meth:`Endpoint.recv`,
    the frames as they landed: a :class:`DeviceFrame` for each device frame (use
    ``torch.from_dlpack(frame)``) and a writable :class:`memoryview` for each host frame;
    for :meth:`Endpoint.recv_into`, the objects you passed, now holding the data.
    """

    header: bytes
    frames: List[Any]


def _host_view(frame: HostFrame) -> memoryview:
    """A writable ``memoryview`` over a received host frame, keeping it alive."""
    address, length = frame._address()
    array = (ctypes.c_char * length).from_address(address)
    # The view's exporter is `array`; the frame (and its memory) lives as long as it.
    array._ferrylink_frame = frame  # type: ignore[attr-defined]
    return memoryview(array).cast("B")


def _bytes(data: Optional[bytes]) -> Optional[bytes]:
    return None if data is None else bytes(data)


class Request:
    """A request in flight, from :meth:`Endpoint.isend`, :meth:`Endpoint.irecv`,
    :meth:`Endpoint.irecv_into`, :meth:`Endpoint.iput`, :meth:`Endpoint.iget` or
    :meth:`Endpoint.irecv_notification`: the blocking call's work without its wait, so a
    receive can be posted before the send it answers (the transport then offers its
    buffers to the peer ahead of the message), or transfers overlap.

    :meth:`wait` returns what the blocking call would; ``await request`` does the same
    on asyncio. Dropping a request that was not waited for (or calling :meth:`cancel`)
    withdraws it as a cancelled blocking call would be: no message or notification is
    lost, a send not yet started is not sent; a put or get is not recalled (only the
    wait ends).
    """

    __slots__ = ("_op", "_kind")

    def __init__(self, op: Op, kind: str) -> None:
        self._op = op
        self._kind = kind

    def wait(self) -> Any:
        """Waits for the request (GIL released, Ctrl-C honoured, at most
        ``FERRYLINK_TIMEOUT_MS``) and returns its result (a :class:`Message` for a
        receive, the notification's bytes for :meth:`Endpoint.irecv_notification`,
        ``None`` for a send, a put or a get), raising its error. A request can be waited
        for (or awaited) once."""
        return self._op.wait()

    def done(self) -> bool:
        """Whether the request finished, so :meth:`wait` returns at once (or it was
        already waited for or cancelled)."""
        return self._op.finished or self._op.ready

    def cancel(self) -> None:
        """Withdraws the request: a receive's message goes to the next receive, a send
        not yet started is not sent (one under way still reaches the peer). Idempotent."""
        self._op.cancel()

    def __await__(self) -> Generator[Any, None, Any]:
        return self._await().__await__()

    async def _await(self) -> Any:
        return await _asyncio.complete(self._op)

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<ferrylink.Request {self._kind} {state}>"


class Endpoint:
    """A connection to one peer. Sends and receives are each ordered; any number may be
    in flight (from several threads, or as asyncio tasks).

    Blocking calls release the GIL while they wait and can be interrupted with Ctrl-C
    (``KeyboardInterrupt``): an interrupted receive is withdrawn, and no message is lost
    (one that arrives later goes to the next receive). Every wait is bounded by
    ``FERRYLINK_TIMEOUT_MS`` (:class:`TimedOutError`).
    """

    __slots__ = ("_ep", "__weakref__")

    def __init__(self, endpoint: _Endpoint) -> None:
        self._ep = endpoint

    def send(self, header: Any = b"", frames: Iterable[Any] = ()) -> None:
        """Sends ``header`` (bytes-like, copied) and ``frames`` and returns once the peer
        has them; the frames are yours again then.

        A frame is device memory (anything with ``__dlpack__`` or
        ``__cuda_array_interface__``: a CUDA ``torch.Tensor``, a CuPy or Numba array, a
        received :class:`DeviceFrame`) or host memory (``bytes``, ``bytearray``,
        ``memoryview``, a NumPy array, a CPU tensor). It must be contiguous
        (:class:`FrameError` otherwise: pass ``t.contiguous()``). Device memory is sent as
        it lies, ordered after the work queued on PyTorch's current stream (other
        objects: the legacy default stream, or the stream their CUDA Array Interface
        names); PyTorch's caching-allocator memory needs no copy. Do not modify the
        frames until ``send`` returns.
        """
        self._ep.send(header, frames)

    def recv(self) -> Message:
        """Receives the next message, into memory ferrylink allocates (device frames on
        the device they came from, or ``FERRYLINK_RECV_DEVICE``)."""
        return self._ep.recv()

    def recv_into(self, frames: Iterable[Any]) -> Message:
        """Receives the next message into ``frames`` (writable objects of the kinds
        :meth:`send` takes), which must match its frames one for one: same kind (host or
        device) and same length in bytes, else :class:`BufferMismatchError`. A device
        frame is written only after the work queued before the call on the stream it
        names (a CUDA tensor: PyTorch's current stream, the default one included).
        Returns the header and ``frames``."""
        frames = list(frames)
        return self._ep.recv_into(frames)

    def isend(self, header: Any = b"", frames: Iterable[Any] = ()) -> Request:
        """Starts :meth:`send` and returns at once: ``request.wait()`` (or ``await
        request``) returns once the peer has the frames. Do not modify them until then."""
        return Request(self._ep.send_op(header, frames), "send")

    def irecv(self) -> Request:
        """Posts a receive and returns at once: ``request.wait()`` gives the next
        :class:`Message` not taken by an earlier receive, as :meth:`recv` would."""
        return Request(self._ep.recv_op(), "receive")

    def irecv_into(self, frames: Iterable[Any]) -> Request:
        """Posts a receive into ``frames`` (as :meth:`recv_into`) and returns at once.
        Posted before the message comes, its device frames are offered to the peer, which
        then copies straight into them."""
        return Request(self._ep.recv_op(list(frames)), "receive")

    async def send_async(self, header: Any = b"", frames: Iterable[Any] = ()) -> None:
        """:meth:`send` for asyncio: never blocks the event loop. Cancelling it before the
        send started withdraws it (it is not sent); a send already under way still
        reaches the peer."""
        await _asyncio.complete(self._ep.send_op(header, frames))

    async def recv_async(self) -> Message:
        """:meth:`recv` for asyncio. Cancelling it (``asyncio.wait_for``, a task's
        ``cancel()``) loses no message: one that arrives later, or was arriving as it was
        cancelled, goes to the next receive."""
        return await _asyncio.complete(self._ep.recv_op())

    async def recv_into_async(self, frames: Iterable[Any]) -> Message:
        """:meth:`recv_into` for asyncio (cancelling it loses no message)."""
        frames = list(frames)
        return await _asyncio.complete(self._ep.recv_op(frames))

    def import_region(self, key: bytes) -> RemoteRegion:
        """Imports the peer's registration whose :attr:`Registration.key` is ``key``: the
        peer checks the key is its own and still live (:class:`RevokedError`,
        :class:`RefusedError` otherwise). The region is usable on this endpoint only."""
        return RemoteRegion(self._ep.import_op(bytes(key)).wait())

    async def import_region_async(self, key: bytes) -> RemoteRegion:
        """:meth:`import_region` for asyncio."""
        return RemoteRegion(await _asyncio.complete(self._ep.import_op(bytes(key))))

    def iput(
        self,
        local: Registration,
        remote: RemoteRegion,
        *,
        local_offset: int = 0,
        remote_offset: int = 0,
        nbytes: Optional[int] = None,
        spans: Optional[Iterable[Sequence[int]]] = None,
        notify: Optional[bytes] = None,
    ) -> Request:
        """Starts writing ``local`` into ``remote`` and returns at once; the request
        completes when the bytes are in place. One span (``nbytes`` at ``local_offset``
        into ``remote_offset``; ``nbytes`` defaults to the rest of ``local``) or many
        (``spans``: ``(local_offset, remote_offset, nbytes)`` triples whose destinations
        do not overlap, one request). ``notify`` (at most 64 KiB) reaches the owner's
        :meth:`recv_notification` after the data is visible there."""
        chosen = spans_of(local, local_offset, remote_offset, nbytes, spans)
        return Request(self._ep.transfer_op(True, local._reg, remote._region, chosen, _bytes(notify)), "put")

    def iget(
        self,
        local: Registration,
        remote: RemoteRegion,
        *,
        local_offset: int = 0,
        remote_offset: int = 0,
        nbytes: Optional[int] = None,
        spans: Optional[Iterable[Sequence[int]]] = None,
        notify: Optional[bytes] = None,
    ) -> Request:
        """Starts reading ``remote`` into ``local`` (the spans as :meth:`iput`'s, with
        the local destinations not overlapping) and returns at once; the request
        completes when the bytes are here. ``notify`` tells the owner the bytes were
        taken."""
        chosen = spans_of(local, local_offset, remote_offset, nbytes, spans)
        return Request(self._ep.transfer_op(False, local._reg, remote._region, chosen, _bytes(notify)), "get")

    def put(self, local: Registration, remote: RemoteRegion, **span: Any) -> None:
        """:meth:`iput`, waited for: returns once the bytes are in ``remote``."""
        self.iput(local, remote, **span).wait()

    def get(self, local: Registration, remote: RemoteRegion, **span: Any) -> None:
        """:meth:`iget`, waited for: returns once the bytes are in ``local``."""
        self.iget(local, remote, **span).wait()

    async def put_async(self, local: Registration, remote: RemoteRegion, **span: Any) -> None:
        """:meth:`put` for asyncio (cancelling it stops the wait, not the transfer)."""
        await self.iput(local, remote, **span)

    async def get_async(self, local: Registration, remote: RemoteRegion, **span: Any) -> None:
        """:meth:`get` for asyncio (cancelling it stops the wait, not the transfer)."""
        await self.iget(local, remote, **span)

    def prepare_put(
        self,
        local: Registration,
        remote: RemoteRegion,
        *,
        local_offset: int = 0,
        remote_offset: int = 0,
        nbytes: Optional[int] = None,
        spans: Optional[Iterable[Sequence[int]]] = None,
    ) -> PreparedTransfer:
        """Checks a put once (the spans as :meth:`iput`'s; its errors are raised here)
        for :meth:`post` to run again and again: the same blocks moved round after round
        (a KV cache's layout)."""
        chosen = spans_of(local, local_offset, remote_offset, nbytes, spans)
        return PreparedTransfer(self._ep.prepare(True, local._reg, remote._region, chosen))

    def prepare_get(
        self,
        local: Registration,
        remote: RemoteRegion,
        *,
        local_offset: int = 0,
        remote_offset: int = 0,
        nbytes: Optional[int] = None,
        spans: Optional[Iterable[Sequence[int]]] = None,
    ) -> PreparedTransfer:
        """:meth:`prepare_put` for a get (the local destinations not overlapping)."""
        chosen = spans_of(local, local_offset, remote_offset, nbytes, spans)
        return PreparedTransfer(self._ep.prepare(False, local._reg, remote._region, chosen))

    def ipost(self, prepared: PreparedTransfer, *, notify: Optional[bytes] = None) -> Request:
        """Starts a run of ``prepared`` and returns at once; the request completes as
        :meth:`iput`'s or :meth:`iget`'s does. ``notify`` as theirs."""
        op = "put" if prepared.is_put else "get"
        return Request(self._ep.post_op(prepared._get(), _bytes(notify)), op)

    def post(self, prepared: PreparedTransfer, *, notify: Optional[bytes] = None) -> None:
        """:meth:`ipost`, waited for."""
        self.ipost(prepared, notify=notify).wait()

    async def post_async(self, prepared: PreparedTransfer, *, notify: Optional[bytes] = None) -> None:
        """:meth:`post` for asyncio (cancelling it stops the wait, not the transfer)."""
        await self.ipost(prepared, notify=notify)

    def irecv_notification(self) -> Request:
        """Starts waiting for the next notification a peer's put (or get) into this
        side's registrations delivered; the request gives its bytes. Dropping it loses
        nothing: a notification that came for it goes to the next one."""
        return Request(self._ep.notification_op(), "notification")

    def recv_notification(self) -> bytes:
        """The next notification's bytes, in the order they came (after the data they
        announce is visible here)."""
        return self.irecv_notification().wait()

    async def recv_notification_async(self) -> bytes:
        """:meth:`recv_notification` for asyncio (cancelling it loses no notification)."""
        return await self.irecv_notification()

    @property
    def lane(self) -> str:
        """The lane this endpoint uses: ``"native"`` or ``"ucx"``."""
        return self._ep.lane

    @property
    def uses_control_ring(self) -> bool:
        """Whether control messages travel through shared-memory rings."""
        return self._ep.uses_control_ring

    @property
    def peer(self) -> str:
        """Who the peer is (host, pid)."""
        return self._ep.peer

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._ep.closed

    def stats(self) -> Dict[str, int]:
        """The endpoint's counters: messages and payload bytes sent and received, bytes
        staged, ``bounced_bytes`` (device bytes that had to be copied because nothing
        could export their memory), fds passed..."""
        return self._ep.stats()

    def close(self) -> None:
        """Closes the endpoint; pending requests end with :class:`EndpointClosedError`
        and the peer sees :class:`PeerClosedError`. Idempotent."""
        self._ep.close()

    def __enter__(self) -> "Endpoint":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.closed:
            return "<ferrylink.Endpoint closed>"
        return f"<ferrylink.Endpoint lane={self.lane} peer={self.peer}>"


class Listener:
    """Accepts peers on a Unix socket in a directory only this user can enter. Peers of
    another user are refused; the socket file goes when the listener is closed."""

    __slots__ = ("_listener", "__weakref__")

    def __init__(self, listener: _Listener) -> None:
        self._listener = listener

    @property
    def path(self) -> str:
        """The socket path peers pass to :meth:`Context.connect` (empty for a TCP
        listener)."""
        path = self._listener.path
        return "" if path is None else os.fspath(path)

    @property
    def tcp_address(self) -> Optional[Tuple[str, int]]:
        """``(host, port)`` of a listener made with :meth:`Context.listen_tcp` (peers
        pass them to :meth:`Context.connect_tcp`), else ``None``."""
        return self._listener.tcp_address

    def accept(self) -> Endpoint:
        """Waits for the next peer, at most ``FERRYLINK_TIMEOUT_MS``
        (:class:`TimedOutError`); Ctrl-C interrupts it."""
        return Endpoint(self._listener.accept())

    async def accept_async(self) -> Endpoint:
        """:meth:`accept` for asyncio. Cancelling it accepts nothing: a peer that
        arrives later waits for the next accept."""
        return Endpoint(await _asyncio.complete(self._listener.accept_op()))

    def close(self) -> None:
        """Stops listening. Idempotent."""
        self._listener.close()

    def __enter__(self) -> "Listener":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ferrylink.Listener {self.path or self.tcp_address}>"


class Context:
    """A ferrylink context: one progress thread serving any number of endpoints and
    listeners.

    Settings are the library's environment variables, as keywords without the
    ``FERRYLINK_`` prefix in lower case, on top of the environment::

        ctx = ferrylink.Context(transport="native", timeout_ms=5000)

    (:func:`config_keys` lists them). A value a variable does not accept raises
    :class:`ConfigError` naming it; an unknown keyword raises :class:`TypeError`.
    """

    __slots__ = ("_ctx", "__weakref__")

    def __init__(self, **settings: Union[str, int, bool, PathLike]) -> None:
        self._ctx = _Context(**settings)

    @property
    def settings(self) -> Dict[str, str]:
        """The settings in force, each spelt as its variable would be."""
        return self._ctx.settings

    def listen(self, path: Optional[PathLike] = None) -> Listener:
        """A listener at ``path`` (its directory is made private, mode 0700), or by
        default at a fresh socket in this user's private runtime directory."""
        return Listener(self._ctx.listen(None if path is None else os.fspath(path)))

    def listen_tcp(self, port: int = 0, host: str = "0.0.0.0") -> Listener:
        """A listener on a TCP address, for peers on other machines: the UCX lane (only
        control messages travel on the TCP connection, the data over UCX). Port 0 picks a
        free port: see :attr:`Listener.tcp_address`."""
        return Listener(self._ctx.listen_tcp(host, port))

    def connect_tcp(self, host: str, port: int) -> Endpoint:
        """Connects to a TCP listener (:meth:`listen_tcp`) and negotiates a lane,
        bounded by the connect timeout (10 s)."""
        return Endpoint(self._ctx.connect_tcp(host, port))

    async def connect_tcp_async(self, host: str, port: int) -> Endpoint:
        """:meth:`connect_tcp` for asyncio (run on the loop's default executor)."""
        loop = asyncio.get_running_loop()
        return Endpoint(await loop.run_in_executor(None, self._ctx.connect_tcp, host, port))

    def connect(self, path: PathLike) -> Endpoint:
        """Connects to the listener at ``path`` and negotiates a lane (bounded by the
        connect timeout; Ctrl-C interrupts it)."""
        return Endpoint(self._ctx.connect(os.fspath(path)))

    async def connect_async(self, path: PathLike) -> Endpoint:
        """:meth:`connect` for asyncio."""
        return Endpoint(await _asyncio.complete(self._ctx.connect_op(os.fspath(path))))

    def register(self, frame: Any, access: str = "rw") -> Registration:
        """Registers ``frame`` for one-sided transfers: device memory as :meth:`Endpoint.send`
        takes it (a CUDA tensor from PyTorch's caching allocator, a :class:`DeviceFrame`,
        VMM memory) or host memory in a shared buffer (:func:`host_buffer`, or a NumPy
        array over one); other memory is refused (:class:`UnsupportedError`) rather than
        copied. ``access``: ``"r"`` (peers may get), ``"w"`` (put) or ``"rw"``. The frame
        is used as it lies; keep it alive and unchanged while peers use it. This side's
        ``put``/``get`` of it wait for the work queued on the stream it named here (a
        CUDA tensor: PyTorch's current stream, the default one included)."""
        return Registration(self._ctx.register(frame, access))

    def stats(self) -> Dict[str, int]:
        """What the context holds now (endpoints, listeners, mapped regions, posted
        receives...), as its progress thread counts it."""
        return self._ctx.stats()

    def close(self) -> None:
        """Lets go of the context (its progress thread ends once its endpoints and
        listeners are gone too). Idempotent."""
        self._ctx.close()

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
