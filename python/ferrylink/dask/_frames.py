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
"""

from __future__ import annotations

import functools
import struct
from typing import Any, Callable, List, Optional, Sequence, Tuple

#: Frames per part: well under the transport's limit of frames per message.
PART_FRAMES = 1024
#: Header layout version.
VERSION = 1
_HEAD = struct.Struct("<BBI")  # version, is_last, frame count
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


def pack_part_header(kinds: bytes, device_lengths: Sequence[int], is_last: bool) -> bytes:
    """The header of one part: its frames' kinds (``h``/``d`` each) and its device
    frames' lengths."""
    head = _HEAD.pack(VERSION, 1 if is_last else 0, len(kinds))
    return head + kinds + struct.pack(f"<{len(device_lengths)}Q", *device_lengths)


def unpack_part_header(header: bytes) -> Tuple[bytes, List[int], bool]:
    """``(kinds, device_lengths, is_last)`` of a part's header."""
    if len(header) < _HEAD.size:
        raise FramingError(f"a part header of {len(header)} bytes")
    version, is_last, count = _HEAD.unpack_from(header)
    if version != VERSION:
        raise FramingError(f"part header version {version} (this side speaks {VERSION})")
    kinds = bytes(header[_HEAD.size : _HEAD.size + count])
    if len(kinds) != count or any(k not in (_HOST, _DEVICE) for k in kinds):
        raise FramingError("a part header with unknown frame kinds")
    n_device = kinds.count(_DEVICE)
    lengths_at = _HEAD.size + count
    if len(header) != lengths_at + 8 * n_device:
        raise FramingError("a part header whose device lengths do not match its kinds")
    lengths = list(struct.unpack_from(f"<{n_device}Q", header, lengths_at))
    return kinds, lengths, bool(is_last)


class Part:
    """One part of a message to send: the header, its host frames, its device frames."""

    __slots__ = ("header", "host", "device")

    def __init__(self, header: bytes, host: List[Any], device: List[Any]) -> None:
        self.header = header
        self.host = host
        self.device = device


#: Frames sendable as they are: ``bytes`` and ``bytearray`` are 1-D, contiguous and
#: never device memory (most of what ``to_frames`` makes).
_PLAIN_HOST = (bytes, bytearray)


@functools.lru_cache(maxsize=256)
def _host_only_header(count: int, is_last: bool) -> bytes:
    return pack_part_header(bytes([_HOST]) * count, (), is_last)


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
            if type(frame) in _PLAIN_HOST:
                kinds.append(_HOST)
                host.append(frame)
            elif is_device(frame):
                kinds.append(_DEVICE)
                device.append(frame)
            else:
                kinds.append(_HOST)
                host.append(host_view(frame))
        is_last = start + PART_FRAMES >= len(frames)
        if device:
            header = pack_part_header(bytes(kinds), [device_nbytes(f) for f in device], is_last)
        else:
            header = _host_only_header(len(kinds), is_last)
        parts.append(Part(header, host, device))
    return parts


def host_only_part(header: bytes) -> Optional[int]:
    """The frame count of a part whose header says it holds host frames only and is the
    message's last (the common case, recognised without parsing), else ``None``."""
    return _HOST_ONLY_LAST.get(header)


_HOST_ONLY_LAST = {_host_only_header(n, True): n for n in range(17)}


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
