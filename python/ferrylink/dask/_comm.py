"""The ``ferrylink://`` comm backend for dask.distributed.

:class:`FerrylinkBackend` is registered under the ``distributed.comm.backends`` entry
point as ``ferrylink``. A comm is one ferrylink endpoint; each Dask message is carried
as described in :mod:`ferrylink.dask._frames`. Every process makes its ferrylink context
when it first needs one (:func:`process_context`), so Nannies may spawn workers freely.

Connecting: a peer on the listener's host connects to the listener's native socket
(:func:`ferrylink.dask._addresses.socket_path`) and gets the native lane; any other peer,
or one whose ``FERRYLINK_TRANSPORT`` is ``ucx``, connects to its TCP address and gets the
UCX lane. The connecting side then sends one hello naming its own address and the one it
dialled, so each side's ``peer_address`` is the other's ``local_address``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import weakref
from typing import Any, Dict, List, Optional, Set

import dask
from dask.utils import parse_timedelta
from distributed.comm.addressing import unparse_host_port
from distributed.comm.core import BaseListener, Comm, CommClosedError, Connector
from distributed.comm.registry import Backend
from distributed.comm.utils import ensure_concrete_host, from_frames, to_frames
from distributed.utils import ensure_ip, ensure_memoryview, get_ip

import ferrylink
from ferrylink import Endpoint, FerrylinkError, TimedOutError

from . import _addresses, _cuda_serializers, _frames, _offload
from ._addresses import PREFIX, host_port

logger = logging.getLogger(__name__)
_cuda_serializers.register()

#: The serializers a write uses when Dask names none: device objects first, as frames
#: that stay on the device (the order distributed-ucxx uses).
DEFAULT_SERIALIZERS = ("cuda", "dask", "pickle", "error")
#: At most this many parts make one message (far beyond any Dask message).
MAX_PARTS = 1 << 16
#: Frames are not split into shards (distributed's default shard is 64 MiB, for sockets):
#: a received frame is one buffer, which ferrylink may hand over without a copy, and
#: distributed then has no shards to join (joining shards that arrive as separate
#: buffers copies the whole frame).
FRAME_SPLIT_SIZE = 1 << 62
_HELLO = b"ferrylink-dask-hello/1 "

_context_lock = threading.Lock()
_context_state: Dict[str, Any] = {"pid": None, "context": None}


def process_context() -> ferrylink.Context:
    """This process's ferrylink context, made on first use (and again in a forked child),
    configured by the ``FERRYLINK_*`` environment."""
    pid = os.getpid()
    with _context_lock:
        if _context_state["pid"] != pid or _context_state["context"] is None:
            _context_state["context"] = ferrylink.Context()
            _context_state["pid"] = pid
        return _context_state["context"]


def _transport_policy(context: ferrylink.Context) -> str:
    return context.settings.get("transport", "auto")


_rmm_module: Dict[str, Any] = {}


def _device_targets(lengths: List[int]) -> Optional[List[Any]]:
    """Device buffers to receive ``lengths`` into: ``rmm.DeviceBuffer``s where RMM is
    installed (distributed's ``"cuda"`` deserializers of RMM objects want them), else
    ``None`` (ferrylink allocates; its frames have ``__cuda_array_interface__``)."""
    if "rmm" not in _rmm_module:
        try:
            import rmm  # type: ignore[import-not-found]

            _rmm_module["rmm"] = rmm
        except ImportError:
            _rmm_module["rmm"] = None
    rmm = _rmm_module["rmm"]
    if rmm is None:
        return None
    return [rmm.DeviceBuffer(size=n) for n in lengths]


def _close_quietly(endpoint: Endpoint, holder: Any) -> None:
    endpoint.close()
    if holder is not None:
        holder.close()


class FerrylinkComm(Comm):
    """One established ``ferrylink://`` connection (a ferrylink endpoint)."""

    def __init__(
        self,
        endpoint: Endpoint,
        local_addr: str,
        peer_addr: str,
        deserialize: bool = True,
        address_holder: Any = None,
    ) -> None:
        super().__init__(deserialize=deserialize)
        self._ep: Optional[Endpoint] = endpoint
        self._local_addr = local_addr
        self._peer_addr = peer_addr
        self._lane = endpoint.lane
        self._peer = endpoint.peer
        # The sends of earlier writes still under way: a write returns once its message
        # is handed to ferrylink, so these hold its frames until the peer has them.
        self._sending: List[ferrylink.Request] = []
        # A comm dropped without close() still lets go of its connection.
        self._finalizer = weakref.finalize(self, _close_quietly, endpoint, address_holder)
        self._finalizer.atexit = False

    @property
    def local_address(self) -> str:
        return self._local_addr

    @property
    def peer_address(self) -> str:
        return self._peer_addr

    @property
    def extra_info(self) -> Dict[str, Any]:
        return {"lane": self._lane, "peer": self._peer}

    def handshake_info(self) -> Dict[str, Any]:
        info = super().handshake_info()
        info["ferrylink"] = {"version": ferrylink.__version__, "lane": self._lane}
        return info

    def _endpoint(self) -> Endpoint:
        if self._ep is None:
            raise CommClosedError(f"in {self}: the comm is closed")
        return self._ep

    def _fail(self, error: BaseException) -> CommClosedError:
        self.abort()
        return CommClosedError(f"in {self}: {type(error).__name__}: {error}")

    async def _recv(self, targets: Optional[List[Any]] = None) -> ferrylink.Message:
        # A receive waits as long as it takes: the transport's timeout only ends the wait
        # for the next message (nothing is lost), and it is posted again.
        while True:
            endpoint = self._endpoint()
            try:
                if targets is None:
                    return await endpoint.recv_async()
                return await endpoint.recv_into_async(targets)
            except TimedOutError:
                continue

    async def _recv_frames(self) -> List[Any]:
        frames: List[Any] = []
        for _ in range(MAX_PARTS):
            part = await self._recv()
            if not frames and _frames.host_only_part(part.header) == len(part.frames):
                return part.frames
            kinds, lengths, is_last = _frames.unpack_part_header(part.header)
            device = None
            if lengths:
                device = (await self._recv(_device_targets(lengths))).frames
            frames.extend(_frames.merge_part(kinds, part.frames, device))
            if is_last:
                return frames
        raise _frames.FramingError(f"a message of more than {MAX_PARTS} parts")

    async def read(self, deserializers: Any = None) -> Any:
        self._endpoint()
        try:
            frames = await self._recv_frames()
            # Writes that finished meanwhile let go of their frames (an answer read means
            # the peer had what was written before it).
            self._check_sent()
        except (FerrylinkError, _frames.FramingError) as e:
            raise self._fail(e) from e
        except BaseException:
            # Cancelled between the parts of a message: the next read would start in its
            # middle, so the comm cannot be used again.
            self.abort()
            raise
        try:
            return await from_frames(
                frames,
                deserialize=self.deserialize,
                deserializers=deserializers,
                allow_offload=self.allow_offload and _offload.host_bytes_over_threshold(frames),
            )
        except EOFError:
            self.abort()
            raise CommClosedError(f"in {self}: aborted on truncated data") from None

    async def write(self, msg: Any, serializers: Any = None, on_error: Optional[str] = "message") -> int:
        self._endpoint()
        serializers = DEFAULT_SERIALIZERS if serializers is None else serializers
        frames = await to_frames(
            msg,
            allow_offload=self.allow_offload and _offload.serializing_is_heavy(msg, serializers),
            serializers=serializers,
            on_error=on_error,
            frame_split_size=FRAME_SPLIT_SIZE,
            context={"sender": self.local_info, "recipient": self.remote_info, **self.handshake_options},
        )
        parts = _frames.split_parts(frames, ensure_memoryview)
        nbytes = sum(len(h) for p in parts for h in p.host)
        nbytes += sum(_frames.device_nbytes(d) for p in parts for d in p.device)
        # No await from here on: the parts go to ferrylink in order, together, and the
        # write returns without waiting for the peer (as a TCP comm's does).
        endpoint = self._endpoint()
        try:
            self._check_sent()
            for part in parts:
                self._sending.append(endpoint.isend(part.header, part.host))
                if part.device:
                    self._sending.append(endpoint.isend(b"", part.device))
        except FerrylinkError as e:
            raise self._fail(e) from e
        except BaseException:
            # Part of the message may be on its way: the peer cannot read on.
            self.abort()
            raise
        return nbytes

    def _check_sent(self) -> None:
        """Lets go of the sends that finished, raising the error of one that failed."""
        still = []
        for request in self._sending:
            if request.done():
                request.wait()
            else:
                still.append(request)
        self._sending = still

    async def close(self) -> None:
        # What was written reaches the peer before the connection goes (bounded by the
        # connect timeout, as a flush would be); errors only end the wait.
        sending, self._sending = self._sending, []
        if sending and self._ep is not None:
            try:
                await asyncio.wait_for(asyncio.gather(*sending), _connect_timeout())
            except (FerrylinkError, asyncio.TimeoutError):
                pass
        self.abort()

    def abort(self) -> None:
        self._ep = None
        self._sending = []
        self._finalizer()

    def closed(self) -> bool:
        return self._ep is None


def _connect_timeout() -> float:
    return float(parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"), default="seconds"))


async def _open_endpoint(context: ferrylink.Context, ip: str, port: int) -> Endpoint:
    """An endpoint to the listener at ``ip:port``: through its native socket when it is
    on this host (unless ``FERRYLINK_TRANSPORT=ucx``), else through TCP."""
    policy = _transport_policy(context)
    if policy != "ucx" and _addresses.is_local_ip(ip):
        for path in _addresses.socket_candidates(ip, port):
            if os.path.exists(path):
                try:
                    return await context.connect_async(path)
                except ferrylink.ConnectError:
                    continue
        if policy == "native":
            raise ferrylink.ConnectError(f"no ferrylink listener at {ip}:{port} on this host")
    elif policy == "native":
        raise ferrylink.ConnectError(f"FERRYLINK_TRANSPORT=native, but {ip} is not an address of this host")
    return await context.connect_tcp_async(ip, port)


class FerrylinkConnector(Connector):
    """Connects to ``ferrylink://`` listeners."""

    prefix = PREFIX
    comm_class = FerrylinkComm
    encrypted = False

    async def connect(self, address: str, deserialize: bool = True, **connection_args: Any) -> FerrylinkComm:
        host, port = host_port(address)
        ip = ensure_ip(host)
        endpoint = await _open_endpoint(process_context(), ip, port)
        try:
            holder, local = _addresses.reserve_local_address(ip if _addresses.is_local_ip(ip) else get_ip(ip))
        except OSError:
            endpoint.close()
            raise
        comm = FerrylinkComm(endpoint, PREFIX + local, PREFIX + address, deserialize, address_holder=holder)
        hello = json.dumps({"local": comm.local_address, "peer": comm.peer_address}).encode()
        try:
            await endpoint.send_async(_HELLO + hello)
        except FerrylinkError as e:
            raise comm._fail(e) from e
        return comm


def _parse_hello(header: bytes) -> Dict[str, str]:
    if not header.startswith(_HELLO):
        raise ValueError("the peer did not open with a ferrylink-dask hello")
    hello = json.loads(header[len(_HELLO) :])
    if not isinstance(hello, dict) or not all(str(hello.get(k, "")).startswith(PREFIX) for k in ("local", "peer")):
        raise ValueError(f"a malformed hello: {hello!r}")
    return {"local": hello["local"], "peer": hello["peer"]}


class FerrylinkListener(BaseListener):
    """Listens on ``ferrylink://host:port``: a TCP listener there and a native socket
    for peers on this host."""

    prefix = PREFIX
    comm_class = FerrylinkComm
    encrypted = False

    def __init__(
        self,
        address: str,
        comm_handler: Any,
        deserialize: bool = True,
        allow_offload: bool = True,
        default_host: Optional[str] = None,
        default_port: int = 0,
        **connection_args: Any,
    ) -> None:
        super().__init__()
        from distributed.comm.addressing import parse_host_port

        self.ip, self.port = parse_host_port(address, default_port)
        self.default_host = default_host
        self.comm_handler = comm_handler
        self.deserialize = deserialize
        self.allow_offload = allow_offload
        self._listeners: List[ferrylink.Listener] = []
        self._tasks: Set["asyncio.Task[None]"] = set()
        self._accepting: Set["asyncio.Task[None]"] = set()
        self._bound: Optional[tuple] = None
        self._stopped = False

    async def start(self) -> None:
        context = process_context()
        host = self.ip or "0.0.0.0"
        tcp = context.listen_tcp(self.port, host)
        self._listeners.append(tcp)
        address = tcp.tcp_address
        assert address is not None
        self._bound = (host if host in ("0.0.0.0", "::") else address[0], address[1])
        try:
            self._listeners.append(context.listen(_addresses.socket_path(address[1], host)))
        except FerrylinkError as e:
            logger.warning("ferrylink listener %s: no native socket (%s); peers come over TCP", self.contact_address, e)
        for listener in self._listeners:
            self._accepting.add(self._spawn(self._accept_loop(listener)))

    def _spawn(self, coro: Any) -> "asyncio.Task[None]":
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _accept_loop(self, listener: ferrylink.Listener) -> None:
        while not self._stopped:
            try:
                endpoint = await listener.accept_async()
            except TimedOutError:
                continue
            except FerrylinkError:
                return  # the listener was closed
            self._spawn(self._serve(endpoint))

    async def _serve(self, endpoint: Endpoint) -> None:
        try:
            message = await asyncio.wait_for(endpoint.recv_async(), _connect_timeout())
            hello = _parse_hello(message.header)
        except (FerrylinkError, ValueError, asyncio.TimeoutError) as e:
            logger.info("ferrylink listener %s: a peer left before its hello: %s", self.contact_address, e)
            endpoint.close()
            return
        comm = FerrylinkComm(endpoint, hello["peer"], hello["local"], self.deserialize)
        comm.allow_offload = self.allow_offload
        if self._stopped:
            comm.abort()
            return
        try:
            await self.on_connection(comm)
        except CommClosedError:
            logger.info("Connection from %s closed before handshake completed", comm.peer_address)
            return
        await self.comm_handler(comm)

    def stop(self) -> None:
        self._stopped = True
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener.close()
        # Only the accepts end: a comm in its handshake goes on, as a TCP listener's does.
        accepting, self._accepting = self._accepting, set()
        for task in accepting:
            task.cancel()

    def _check_started(self) -> tuple:
        if self._bound is None:
            raise ValueError("invalid operation on a ferrylink listener that was not started")
        return self._bound

    def get_host_port(self) -> tuple:
        """The bound ``(host, port)``."""
        return self._check_started()

    @property
    def listen_address(self) -> str:
        return self.prefix + unparse_host_port(*self._check_started())

    @property
    def contact_address(self) -> str:
        host, port = self._check_started()
        return self.prefix + unparse_host_port(ensure_concrete_host(host, default_host=self.default_host), port)


class FerrylinkBackend(Backend):
    """The ``ferrylink`` scheme of dask.distributed."""

    def get_connector(self) -> FerrylinkConnector:
        return FerrylinkConnector()

    def get_listener(self, loc: str, handle_comm: Any, deserialize: bool, **connection_args: Any) -> FerrylinkListener:
        return FerrylinkListener(loc, handle_comm, deserialize, **connection_args)

    def get_address_host(self, loc: str) -> str:
        return host_port(loc, 0)[0]

    def get_address_host_port(self, loc: str) -> tuple:
        return host_port(loc)

    def resolve_address(self, loc: str) -> str:
        host, port = host_port(loc)
        return unparse_host_port(ensure_ip(host), port)

    def get_local_address_for(self, loc: str) -> str:
        host = ensure_ip(host_port(loc, 0)[0])
        local = host if _addresses.is_local_ip(host) else get_ip(host)
        return unparse_host_port(local, None)
