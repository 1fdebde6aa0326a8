"""The exceptions ferrylink raises.

Every error of the Rust library reaches Python as a subclass of :class:`FerrylinkError`
whose message is the Rust error's own. Where a built-in exception means the same, the
class derives from it too (a timeout is also a :class:`TimeoutError`, a peer that went
away also a :class:`ConnectionError`), so existing ``except`` clauses keep working.
Wrong argument types raise plain :class:`TypeError`.
"""

from __future__ import annotations

__all__ = [
    "FerrylinkError",
    "ConfigError",
    "ContextError",
    "ListenError",
    "ConnectError",
    "TimedOutError",
    "PeerClosedError",
    "PeerFailedError",
    "RefusedError",
    "InvalidMessageError",
    "BufferMismatchError",
    "EndpointClosedError",
    "ContextClosedError",
    "UnsupportedError",
    "RevokedError",
    "FrameError",
]


class FerrylinkError(Exception):
    """Base class of every error ferrylink raises (its message is the Rust error's)."""


class ConfigError(FerrylinkError, ValueError):
    """A setting (a ``Context`` keyword or a ``FERRYLINK_*`` variable) holds a value it
    does not accept; the message names the variable and what it accepts."""


class ContextError(FerrylinkError):
    """A context could not start (its progress thread, or UCX when
    ``FERRYLINK_TRANSPORT=ucx`` is forced and UCX cannot be used)."""


class ListenError(FerrylinkError, OSError):
    """A listener could not be set up (the socket path, or a directory other users can
    enter)."""


class ConnectError(FerrylinkError, ConnectionError):
    """A connection could not be made: nobody listens at the path, the listener refused,
    the sides share no lane, or the handshake broke."""


class TimedOutError(FerrylinkError, TimeoutError):
    """A request, accept or connect did not complete within ``FERRYLINK_TIMEOUT_MS``
    (connects: the connect timeout)."""


class PeerClosedError(FerrylinkError, ConnectionError):
    """The peer closed the connection, or its process ended."""


class PeerFailedError(FerrylinkError, ConnectionError):
    """The connection to the peer broke, or the peer broke the protocol."""


class RefusedError(FerrylinkError):
    """The peer did not take the message (too large, no memory to land it...)."""


class InvalidMessageError(FerrylinkError, ValueError):
    """The message cannot be sent as it is."""


class RevokedError(FerrylinkError):
    """A one-sided transfer named memory its owner revoked (or dropped) before the
    transfer began."""


class BufferMismatchError(FerrylinkError, ValueError):
    """``recv_into``'s frames do not match the message that arrived (count, kind or
    length)."""


class EndpointClosedError(FerrylinkError):
    """This side closed the endpoint."""


class ContextClosedError(FerrylinkError):
    """The context's progress thread has stopped."""


class UnsupportedError(FerrylinkError):
    """Something this machine or build cannot do, such as device frames without a GPU."""


class FrameError(FerrylinkError, ValueError):
    """An object of a kind ferrylink takes that cannot be sent or received into as it
    is: a non-contiguous tensor or array (make it contiguous first), a read-only buffer
    as a receive target, or a DLPack device ferrylink does not move."""
