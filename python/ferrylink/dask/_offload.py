"""Whether a comm hands Dask's (de)serialization of a message to a thread.

distributed (de)serializes a message in its offload thread when the message is larger
than ``distributed.comm.offload`` (10 MiB by default), so that a long serialization does
not stall the event loop: ``to_frames`` judges by ``safe_sizeof(msg)``, ``from_frames``
by the frames' total length. Both count device memory, which the ``"cuda"`` serializers
do not work on: they pass a device object through as a frame beside a small header. So
this comm counts the bytes Dask works on: the host bytes. A message whose volume is on
the device is (de)serialized in place, and each of the four thread hand-offs of a round
trip (100 µs for an empty one on the H100 machine) goes. Host messages are judged as
distributed judges them.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional

import distributed.comm.utils
from distributed.protocol.cuda import cuda_serialize
from distributed.protocol.serialize import Serialize, Serialized, ToPickle
from distributed.sizeof import safe_sizeof

from ._frames import is_device

#: Containers longer than this are sized by Dask's own (sampling) estimate, not walked.
WALKED_LENGTH_MAX = 64
#: At most this many objects are looked at; past it, Dask's estimate of the whole.
WALKED_OBJECTS_MAX = 1024
_SCALARS = (int, float, bool, type(None))
_SEQUENCES = (list, tuple, set, frozenset)


def _threshold() -> int:
    # Read on each use: distributed sets it from its configuration when imported.
    return int(distributed.comm.utils.OFFLOAD_THRESHOLD or 0)


def host_bytes_over_threshold(frames: Iterable[Any]) -> bool:
    """Whether the host frames of a received message (``memoryview``s; device frames are
    other objects) hold more than the offload threshold."""
    threshold = _threshold()
    if not threshold:
        return False
    total = 0
    for frame in frames:
        if type(frame) is memoryview:
            total += frame.nbytes
    return total > threshold


def serializing_is_heavy(msg: Any, serializers: Optional[Iterable[str]]) -> bool:
    """Whether serializing ``msg`` with ``serializers`` works on more host bytes than the
    offload threshold (distributed's own rule when the ``"cuda"`` family is not used)."""
    threshold = _threshold()
    if not threshold:
        return False
    if serializers is None or "cuda" not in serializers:
        size = safe_sizeof(msg, default_size=-1)
    else:
        size = _host_size(msg, threshold)
    return size == -1 or size > threshold


def _passes_through(obj: Any) -> bool:
    """Whether the ``"cuda"`` family serializes ``obj`` without touching its bytes."""
    if not is_device(obj):
        return False
    try:
        cuda_serialize.dispatch(type(obj))
    except TypeError:
        return False
    return True


def _host_size(msg: Any, limit: int) -> int:
    """The host bytes serializing ``msg`` works on, device objects the ``"cuda"`` family
    passes through counted as none; stops once over ``limit``; -1 where Dask's estimate
    says so (a message too deep for it)."""
    total = 0
    pending: List[Any] = [msg]
    for _ in range(WALKED_OBJECTS_MAX):
        if not pending:
            return total
        obj = pending.pop()
        kind = type(obj)
        if kind in _SCALARS:
            total += 8
        elif kind in (str, bytes, bytearray):
            total += len(obj)
        elif kind is dict and len(obj) <= WALKED_LENGTH_MAX:
            pending.extend(obj.keys())
            pending.extend(obj.values())
        elif kind in _SEQUENCES and len(obj) <= WALKED_LENGTH_MAX:
            pending.extend(obj)
        elif kind is Serialize:
            pending.append(obj.data)
        elif kind is Serialized:
            # Already serialized: its frames go out as they are (device ones too).
            pending.extend(f for f in obj.frames if not is_device(f))
        elif kind is not ToPickle and _passes_through(obj):
            continue  # pickled, a device object is copied: sized below
        elif type(getattr(obj, "nbytes", None)) is int:
            total += obj.nbytes  # NumPy arrays, memoryviews: what sizeof would say
        else:
            size = safe_sizeof(obj, default_size=-1)
            if size == -1:
                return -1
            total += size
        if total > limit:
            return total
    return safe_sizeof(msg, default_size=-1) if pending else total
