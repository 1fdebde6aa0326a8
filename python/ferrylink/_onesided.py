"""One-sided transfers: registered memory, remote regions and the spans of a transfer.

The owner registers memory (:meth:`Context.register`) and ships the registration's
:attr:`~Registration.key` (plain bytes) to a peer any way it likes; the peer imports it
on its endpoint to the owner (:meth:`Endpoint.import_region`) and then writes into it
(:meth:`Endpoint.put`) or reads from it (:meth:`Endpoint.get`), with a notification the
owner receives after the data is in place (:meth:`Endpoint.recv_notification`).
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional, Sequence, Tuple

from ._ferrylink import _PreparedTransfer, _Registration, _RemoteRegion

Span = Tuple[int, int, int]


class Registration:
    """This side's memory, registered for one-sided transfers by
    :meth:`Context.register`. Peers that import its :attr:`key` may read it (``get``),
    write it (``put``) or both, as its :attr:`access` says. :meth:`revoke` (or dropping
    the object, or leaving a ``with`` block) revokes it: peers are told, transfers not
    yet started fail with :class:`RevokedError`, and the memory is let go once every
    peer that imported it confirmed. Registering the same memory with the same access
    again gives the same key.
    """

    __slots__ = ("_reg", "__weakref__")

    def __init__(self, registration: _Registration) -> None:
        self._reg = registration

    @property
    def key(self) -> bytes:
        """What a peer passes to :meth:`Endpoint.import_region`: bytes to ship any way
        (in a message header, a file, a key-value store)."""
        return self._reg.key

    @property
    def nbytes(self) -> int:
        """Bytes registered."""
        return self._reg.nbytes

    @property
    def access(self) -> str:
        """``"r"``, ``"w"`` or ``"rw"``: what peers may do."""
        return self._reg.access

    @property
    def frame(self) -> Any:
        """The object that was registered (read what a peer wrote into it once its
        notification came; fill it before a peer reads it)."""
        return self._reg.frame

    @property
    def revoked(self) -> bool:
        """Whether :meth:`revoke` was called."""
        return self._reg.revoked

    def revoke(self) -> None:
        """Revokes the registration. Idempotent."""
        self._reg.revoke()

    def __enter__(self) -> "Registration":
        return self

    def __exit__(self, *exc: object) -> None:
        self.revoke()

    def __repr__(self) -> str:
        if self.revoked:
            return "<ferrylink.Registration revoked>"
        return f"<ferrylink.Registration nbytes={self.nbytes} access={self.access}>"


class RemoteRegion:
    """A peer's registration, imported on one endpoint to that peer
    (:meth:`Endpoint.import_region`); usable only on that endpoint."""

    __slots__ = ("_region", "__weakref__")

    def __init__(self, region: _RemoteRegion) -> None:
        self._region = region

    @property
    def nbytes(self) -> int:
        """Bytes in the region."""
        return self._region.nbytes

    @property
    def access(self) -> str:
        """``"r"``, ``"w"`` or ``"rw"``: what the owner allows."""
        return self._region.access

    @property
    def is_device(self) -> bool:
        """Whether the region is device memory."""
        return self._region.is_device

    def __repr__(self) -> str:
        kind = "device" if self.is_device else "host"
        return f"<ferrylink.RemoteRegion {kind} nbytes={self.nbytes} access={self.access}>"


class PreparedTransfer:
    """A put or get whose spans were checked once (:meth:`Endpoint.prepare_put`,
    :meth:`Endpoint.prepare_get`), run by :meth:`Endpoint.post` any number of times on
    the endpoint that prepared it. On the native lane the side that copies keeps its
    span table, so a post carries no spans. It keeps the local registration's memory;
    dropping it (or :meth:`close`) lets both sides forget it. A post after the remote
    region was revoked or dropped fails with :class:`RevokedError`."""

    __slots__ = ("_prepared", "__weakref__")

    def __init__(self, prepared: _PreparedTransfer) -> None:
        self._prepared: Optional[_PreparedTransfer] = prepared

    def _get(self) -> _PreparedTransfer:
        if self._prepared is None:
            raise ValueError("the prepared transfer was closed")
        return self._prepared

    @property
    def is_put(self) -> bool:
        """Whether it writes the remote region (else it reads it)."""
        return self._get().is_put

    @property
    def span_count(self) -> int:
        """How many spans each post moves."""
        return self._get().span_count

    @property
    def nbytes(self) -> int:
        """Bytes each post moves."""
        return self._get().nbytes

    def close(self) -> None:
        """Lets both sides forget the transfer, as dropping it does; it cannot be
        posted again."""
        self._prepared = None

    def __enter__(self) -> "PreparedTransfer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._prepared is None:
            return "<ferrylink.PreparedTransfer closed>"
        op = "put" if self.is_put else "get"
        return f"<ferrylink.PreparedTransfer {op} spans={self.span_count} nbytes={self.nbytes}>"


def spans_of(
    local: Registration,
    local_offset: int,
    remote_offset: int,
    nbytes: Optional[int],
    spans: Optional[Iterable[Sequence[int]]],
) -> List[Span]:
    """The spans of a transfer: ``spans`` as given, or the one span the offsets and
    ``nbytes`` (default: the rest of the local registration) describe."""
    if spans is not None:
        if nbytes is not None or local_offset or remote_offset:
            raise TypeError("pass either spans or local_offset/remote_offset/nbytes, not both")
        out = []
        for span in spans:
            lo, ro, n = span
            out.append((int(lo), int(ro), int(n)))
        return out
    if nbytes is None:
        nbytes = local.nbytes - local_offset
    return [(int(local_offset), int(remote_offset), int(nbytes))]
