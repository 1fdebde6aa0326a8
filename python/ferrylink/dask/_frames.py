"""How the frames of one Dask message travel as ferrylink messages.

A Dask message is the list of frames ``distributed.comm.utils.to_frames`` makes: host
frames (bytes-like) and, with the ``"cuda"`` serializers, device frames (objects with
``__cuda_array_interface__`` or a CUDA ``__dlpack__``). They go in order, in parts of at
most :data:`PART_FRAMES` frames (the transport takes at most 4096 frames and 1 MiB of
header per message, so any message fits). Each part is one ferrylink message holding its
host frames, whose header (:func:`pack_part_header`) lists every frame of the part as
host or device and the lengths of its device frames; when the part has device frames,
they follow as the next ferrylink message, so the receiver can post a receive into
device buffers of its own (``rmm.DeviceBuffer`` where RMM is installed) before they
come. The last part says so.

A part whose host frames hold at least :data:`CONTIGUOUS_HOST_BYTES` sends them as a
message of their own after the header, which then lists their lengths too: the receiver
posts one buffer for all of them, sliced frame by frame. distributed splits a large frame
into shards and joins the shards it receives without a copy only when they are adjacent
views of one buffer (``merge_memoryviews``); shards landing in separate buffers cost a
second copy of the whole frame.
"""

from __future__ import annotations

import struct
from typing import Any, Callable, List, Optional, Sequence, Tuple

#: Frames per part: well under the transport's limit of frames per message.
PART_FRAMES = 1024
#: A part with at least this many bytes of host frames sends them after its header, into
#: one buffer the receiver posts.
CONTIGUOUS_HOST_BYTES = 1 << 20
#: Header layout version.
VERSION = 2
_HEAD = struct.Struct("<BBI")  # version, flags, frame count
_LAST = 1
_HOST_FOLLOWS = 2
_HOST = ord("h")
_DEVICE = ord("d")


class FramingError(ValueError):
    """A part's header is not one this module writes (a peer speaking another layout)."""


def is_device(frame: Any) -> bool:
    """Whether ``frame`` is device memory: it has ``__cuda_array_interface__``, or
    ``__dlpack_device__`` names a CUDA device."""
    if hasattr(frame, "__cuda_array_interface__"):
        return True
    dlpack_device = getattr(frame, "__dlpack_device__", None)
    if dlpack_device is None:
        return False
    try:
        kind, _ = dlpack_device()
    except Exception:
        return False
    return int(kind) in (2, 13)  # kDLCUDA, kDLCUDAManaged


def device_nbytes(frame: Any) -> int:
    """The length in bytes of a device frame."""
    nbytes = getattr(frame, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    cai = frame.__cuda_array_interface__
    count = 1
    for extent in cai["shape"]:
        count *= int(extent)
    return count * int(cai["typestr"][2:])


def pack_part_header(
    kinds: bytes, device_lengths: Sequence[int], is_last: bool, host_lengths: Optional[Sequence[int]] = None
) -> bytes:
    """The header of one part: its frames' kinds (``h``/``d`` each), its device frames'
    lengths and, when its host frames follow as a message of their own, theirs."""
    flags = (_LAST if is_last else 0) | (0 if host_lengths is None else _HOST_FOLLOWS)
    lengths = list(device_lengths) + list(host_lengths or ())
    return _HEAD.pack(VERSION, flags, len(kinds)) + kinds + struct.pack(f"<{len(lengths)}Q", *lengths)


class PartHeader:
    """A received part's header: see :func:`pack_part_header`."""

    __slots__ = ("kinds", "device_lengths", "host_lengths", "is_last")

    def __init__(
        self, kinds: bytes, device_lengths: List[int], host_lengths: Optional[List[int]], is_last: bool
    ) -> None:
        self.kinds = kinds
        self.device_lengths = device_lengths
        #: The lengths of the host frames when they follow as a message of their own.
        self.host_lengths = host_lengths
        self.is_last = is_last


def unpack_part_header(header: bytes) -> PartHeader:
    """The :class:`PartHeader` in a part's header bytes."""
    if len(header) < _HEAD.size:
        raise FramingError(f"a part header of {len(header)} bytes")
    version, flags, count = _HEAD.unpack_from(header)
    if version != VERSION:
        raise FramingError(f"part header version {version} (this side speaks {VERSION})")
    if flags & ~(_LAST | _HOST_FOLLOWS):
        raise FramingError(f"a part header with unknown flags {flags:#x}")
    kinds = bytes(header[_HEAD.size : _HEAD.size + count])
    if len(kinds) != count or any(k not in (_HOST, _DEVICE) for k in kinds):
        raise FramingError("a part header with unknown frame kinds")
    n_device = kinds.count(_DEVICE)
    n_host = kinds.count(_HOST) if flags & _HOST_FOLLOWS else 0
    lengths_at = _HEAD.size + count
    if len(header) != lengths_at + 8 * (n_device + n_host):
        raise FramingError("a part header whose lengths do not match its kinds")
    lengths = list(struct.unpack_from(f"<{n_device + n_host}Q", header, lengths_at))
    host_lengths = lengths[n_device:] if flags & _HOST_FOLLOWS else None
    return PartHeader(kinds, lengths[:n_device], host_lengths, bool(flags & _LAST))


class Part:
    """One part of a message to send: the header, its host frames, its device frames,
    and whether the host frames go as a message of their own after the header."""

    __slots__ = ("header", "host", "device", "host_follows")

    def __init__(self, header: bytes, host: List[Any], device: List[Any], host_follows: bool = False) -> None:
        self.header = header
        self.host = host
        self.device = device
        self.host_follows = host_follows


def split_parts(frames: Sequence[Any], host_view: Callable[[Any], Any]) -> List[Part]:
    """The parts of a message of ``frames``; ``host_view`` makes a host frame sendable (a
    1-D contiguous byte view)."""
    parts: List[Part] = []
    for start in range(0, max(len(frames), 1), PART_FRAMES):
        chunk = frames[start : start + PART_FRAMES]
        kinds = bytearray()
        host: List[Any] = []
        device: List[Any] = []
        for frame in chunk:
            if is_device(frame):
                kinds.append(_DEVICE)
                device.append(frame)
            else:
                kinds.append(_HOST)
                host.append(host_view(frame))
        is_last = start + PART_FRAMES >= len(frames)
        host_lengths = [h.nbytes for h in host]
        host_follows = sum(host_lengths) >= CONTIGUOUS_HOST_BYTES
        device_lengths = [device_nbytes(f) for f in device]
        header = pack_part_header(bytes(kinds), device_lengths, is_last, host_lengths if host_follows else None)
        parts.append(Part(header, host, device, host_follows))
    return parts


def host_targets(lengths: Sequence[int], allocate: Callable[[int], memoryview]) -> List[memoryview]:
    """Adjacent slices of one buffer of ``allocate(sum(lengths))``, one per length: the
    receive buffers of a part's host frames."""
    whole = allocate(sum(lengths))
    targets: List[memoryview] = []
    at = 0
    for n in lengths:
        targets.append(whole[at : at + n])
        at += n
    return targets


def merge_part(kinds: bytes, host: Sequence[Any], device: Optional[Sequence[Any]]) -> List[Any]:
    """The frames of one received part, in order, from its host and device frames."""
    device = device or ()
    if len(host) != kinds.count(_HOST) or len(device) != kinds.count(_DEVICE):
        raise FramingError("a part whose frames do not match its header")
    out: List[Any] = []
    hosts = iter(host)
    devices = iter(device)
    for kind in kinds:
        out.append(next(hosts) if kind == _HOST else next(devices))
    return out
