"""Addresses of the ``ferrylink://`` scheme, and where a listener's native socket lies.

One address form serves both lanes: ``ferrylink://host:port``. A listener listens on
that TCP address (peers on other hosts meet it there and move data over the UCX lane)
and on a Unix socket in this user's private runtime directory named after its port and
bound host (:func:`socket_path`); a peer on the same host that finds that socket
connects through it and gets the native lane.
"""

from __future__ import annotations

import os
import socket
import tempfile
from typing import List, Optional, Tuple

from distributed.comm.addressing import parse_host_port, unparse_host_port

SCHEME = "ferrylink"
PREFIX = SCHEME + "://"
_WILDCARDS = ("", "0.0.0.0", "::")


def host_port(loc: str, default_port: Optional[int] = None) -> Tuple[str, int]:
    """``(host, port)`` of a scheme-less address; ``ValueError`` when it names no host
    (or no port and ``default_port`` is ``None``)."""
    host, port = parse_host_port(loc, default_port)
    if not host:
        raise ValueError(f"the address {loc!r} names no host ({PREFIX}host:port)")
    return host, port


def runtime_dir() -> str:
    """This user's private directory for ferrylink's sockets (where ferrylink's own
    listeners go too): ``$XDG_RUNTIME_DIR/ferrylink``, else ``$TMPDIR/ferrylink-<uid>``."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return os.path.join(xdg, "ferrylink")
    tmp = os.environ.get("TMPDIR") or tempfile.gettempdir()
    return os.path.join(tmp, f"ferrylink-{os.geteuid()}")


def _host_key(host: str) -> str:
    if host in _WILDCARDS:
        return "any"
    return host.replace(":", "_").replace("%", "_")


def socket_path(port: int, bound_host: str) -> str:
    """The native socket of the listener on TCP ``port`` of ``bound_host`` (a wildcard
    host: every address of this host)."""
    return os.path.join(runtime_dir(), "dask", f"{port}-{_host_key(bound_host)}.sock")


def socket_candidates(ip: str, port: int) -> List[str]:
    """The native sockets a listener reachable at ``ip:port`` on this host may have: one
    bound to ``ip`` itself, or one bound to every address."""
    return [socket_path(port, ip), socket_path(port, "0.0.0.0")]


def is_local_ip(ip: str) -> bool:
    """Whether ``ip`` is an address of this host (a socket can be bound to it)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((ip, 0))
    except OSError:
        return False
    return True


def reserve_local_address(local_ip: str) -> Tuple[socket.socket, str]:
    """A socket holding a free port of ``local_ip`` (bound, never listening) and the
    address ``local_ip:port``: a connecting comm's own address, unique on this host for as
    long as the comm holds the socket, as a TCP client's is."""
    family = socket.AF_INET6 if ":" in local_ip else socket.AF_INET
    holder = socket.socket(family, socket.SOCK_STREAM)
    try:
        holder.bind((local_ip, 0))
    except OSError:
        holder.close()
        raise
    return holder, unparse_host_port(local_ip, holder.getsockname()[1])
