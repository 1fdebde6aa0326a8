"""Device objects as host frames through ferrylink's pinned pool, and back.

Objects with ``__cuda_array_interface__`` of the libraries listed in :data:`KINDS`
(torch CUDA tensors, CuPy arrays, Numba device arrays, RMM ``DeviceBuffer``\\ s,
ferrylink ``DeviceFrame``\\ s) are copied device → host into a process-wide pinned pool
(:func:`shared_pinned_pool`) in pipelined chunks, and back host → device into memory
their own library allocates, so the result is an object of the same type, dtype and
shape, byte for byte equal.

Two users:

- the ``"ferrylink"`` Dask serialization family (:func:`register_serializers`):
  ``serialize(x, serializers=["ferrylink", "dask", "pickle"])`` gives one header and
  one host frame per device object, where Dask's ``"dask"`` family copies into freshly
  allocated host memory;
- :class:`~ferrylink.dask.DeviceHostFile`, which stores whole values as entries of the
  spill store (:func:`encode_entry`, :func:`decode_entry`): pickle protocol 5 with
  buffers out of band, device objects anywhere in the value (a tuple of tensors, a dict
  of arrays) as device frames the store copies to host only when it evicts them.

No GPU library is imported here: a kind is looked for only among the modules already
imported.
"""

from __future__ import annotations

import io
import pickle
import struct
import sys
import threading
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from .. import _ferrylink
from .._core import _host_view

__all__ = [
    "DeviceKind",
    "KINDS",
    "device_kind",
    "is_device_object",
    "shared_pinned_pool",
    "device_to_host",
    "host_to_device",
    "ferrylink_dumps",
    "ferrylink_loads",
    "register_serializers",
    "encode_entry",
    "decode_entry",
]

Meta = Dict[str, Any]


class DeviceKind(NamedTuple):
    """How one library's device objects become bytes and come back."""

    name: str
    #: Whether an object is one of this kind's (only asked once its module is imported).
    owns: Callable[[Any], bool]
    #: ``(meta, contiguous object)``: what ``empty`` needs (msgpack-able) and an object
    #: over the bytes to copy (the object itself when it is contiguous).
    export: Callable[[Any], Tuple[Meta, Any]]
    #: ``(new object, target)`` for ``meta`` and ``nbytes``: the target is device memory
    #: of the new object that the bytes are copied into.
    empty: Callable[[Meta, int], Tuple[Any, Any]]
    #: The module that must already be imported for the kind to be asked.
    module: str


def _torch_owns(obj: Any) -> bool:
    torch = sys.modules["torch"]
    return type(obj) is torch.Tensor and bool(obj.is_cuda)


def _torch_export(t: Any) -> Tuple[Meta, Any]:
    data = t.detach()
    if not data.is_contiguous():
        data = data.contiguous()
    meta = {
        "dtype": str(data.dtype).rsplit(".", 1)[-1],
        "shape": list(data.shape),
        "device": data.device.index,
        "requires_grad": bool(t.requires_grad),
    }
    return meta, data


def _torch_empty(meta: Meta, nbytes: int) -> Tuple[Any, Any]:
    torch = sys.modules.get("torch") or __import__("torch")
    device = torch.device("cuda", meta["device"])
    t = torch.empty(tuple(meta["shape"]), dtype=getattr(torch, meta["dtype"]), device=device)
    return t, t


def _cupy_owns(obj: Any) -> bool:
    return isinstance(obj, sys.modules["cupy"].ndarray)


def _cupy_export(a: Any) -> Tuple[Meta, Any]:
    cupy = sys.modules["cupy"]
    data = cupy.ascontiguousarray(a)
    return {"dtype": data.dtype.str, "shape": list(data.shape), "device": data.device.id}, data


def _cupy_empty(meta: Meta, nbytes: int) -> Tuple[Any, Any]:
    cupy = sys.modules.get("cupy") or __import__("cupy")
    with cupy.cuda.Device(meta["device"]):
        a = cupy.empty(tuple(meta["shape"]), dtype=meta["dtype"])
    return a, a


def _numba_owns(obj: Any) -> bool:
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    return isinstance(obj, DeviceNDArray)


def _numba_export(a: Any) -> Tuple[Meta, Any]:
    if not a.is_c_contiguous():
        a = _numba_contiguous(a)
    return {"dtype": a.dtype.str, "shape": list(a.shape)}, a


def _numba_contiguous(a: Any) -> Any:
    import numba.cuda

    out = numba.cuda.device_array(a.shape, dtype=a.dtype)
    out[...] = a
    return out


def _numba_empty(meta: Meta, nbytes: int) -> Tuple[Any, Any]:
    import numba.cuda

    a = numba.cuda.device_array(tuple(meta["shape"]), dtype=meta["dtype"])
    return a, a


def _rmm_owns(obj: Any) -> bool:
    return isinstance(obj, sys.modules["rmm"].DeviceBuffer)


def _rmm_export(b: Any) -> Tuple[Meta, Any]:
    return {"size": int(b.size)}, b


def _rmm_empty(meta: Meta, nbytes: int) -> Tuple[Any, Any]:
    rmm = sys.modules.get("rmm") or __import__("rmm")
    b = rmm.DeviceBuffer(size=meta["size"])
    return b, b


def _frame_owns(obj: Any) -> bool:
    return isinstance(obj, _ferrylink.DeviceFrame)


def _frame_export(f: Any) -> Tuple[Meta, Any]:
    return {"device": f.device}, f


def _frame_empty(meta: Meta, nbytes: int) -> Tuple[Any, Any]:
    f = _ferrylink.alloc_device(nbytes, meta["device"])
    return f, f


#: The device kinds, by name, in the order they are asked.
KINDS: Dict[str, DeviceKind] = {
    k.name: k
    for k in (
        DeviceKind("torch", _torch_owns, _torch_export, _torch_empty, "torch"),
        DeviceKind("cupy", _cupy_owns, _cupy_export, _cupy_empty, "cupy"),
        DeviceKind("numba", _numba_owns, _numba_export, _numba_empty, "numba.cuda"),
        DeviceKind("rmm", _rmm_owns, _rmm_export, _rmm_empty, "rmm"),
        DeviceKind("ferrylink", _frame_owns, _frame_export, _frame_empty, "ferrylink"),
    )
}


def device_kind(obj: Any) -> Optional[DeviceKind]:
    """The kind of a device object ferrylink can copy and rebuild, or ``None``."""
    for kind in KINDS.values():
        if kind.module in sys.modules and kind.owns(obj):
            return kind
    return None


def is_device_object(obj: Any) -> bool:
    """Whether ``obj`` is, or a list, tuple, set or dict holds, an object with
    ``__cuda_array_interface__`` (dask-cuda's rule), or a device object of a kind
    ferrylink knows whose interface is refused (PyTorch raises it for a tensor that
    requires grad)."""
    if isinstance(obj, (list, tuple, set, frozenset)):
        return any(is_device_object(o) for o in obj)
    if isinstance(obj, dict):
        return any(is_device_object(v) for v in obj.values())
    if device_kind(obj) is not None:
        return True
    try:
        return hasattr(obj, "__cuda_array_interface__")
    except Exception:  # a property that raises: not an interface this can use
        return False


_pool_lock = threading.Lock()
_pool: Optional[_ferrylink.PinnedPool] = None
#: The most the shared pool reserves (it starts with one region and grows to this).
DEFAULT_POOL_BYTES = 4 << 30


def shared_pinned_pool(max_bytes: Optional[int] = None) -> _ferrylink.PinnedPool:
    """The process's pinned pool for device → host copies, made on first use with
    ``max_bytes`` (default :data:`DEFAULT_POOL_BYTES`); later calls return the same
    pool whatever they pass."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = _ferrylink.PinnedPool(max_bytes or DEFAULT_POOL_BYTES)
        return _pool


def device_to_host(objects: Sequence[Any], pool: Optional[_ferrylink.PinnedPool] = None) -> List[memoryview]:
    """The bytes of contiguous device objects, copied into ``pool`` (the shared pool by
    default), as writable memoryviews that keep their pool memory until they go."""
    frames = _ferrylink.device_to_host(list(objects), pool or shared_pinned_pool())
    return [_host_view(f) for f in frames]


def host_to_device(sources: Sequence[Any], targets: Sequence[Any]) -> None:
    """Copies each bytes-like source into the device object at its place in
    ``targets`` (equal lengths); returns once the bytes are on the device."""
    _ferrylink.host_to_device(list(sources), list(targets))


def _finish(obj: Any, kind: DeviceKind, meta: Meta) -> Any:
    if kind.name == "torch" and meta.get("requires_grad"):
        obj.requires_grad_(True)
    return obj


def ferrylink_dumps(obj: Any) -> Tuple[Dict[str, Any], List[memoryview]]:
    """The ``"ferrylink"`` family's serializer: a device object as a header and one
    host frame in pinned memory. Raises ``NotImplementedError`` for anything else, so
    Dask tries the next family."""
    kind = device_kind(obj)
    if kind is None:
        raise NotImplementedError(f"the ferrylink serializer takes CUDA objects ({', '.join(KINDS)}), not {type(obj)}")
    meta, contiguous = kind.export(obj)
    return {"ferrylink-kind": kind.name, "ferrylink-meta": meta}, device_to_host([contiguous])


def ferrylink_loads(header: Dict[str, Any], frames: Sequence[Any]) -> Any:
    """The ``"ferrylink"`` family's deserializer: a new device object of the kind,
    dtype and shape in ``header`` holding the bytes of the one frame."""
    kind = KINDS[header["ferrylink-kind"]]
    meta = header["ferrylink-meta"]
    (frame,) = frames
    obj, target = kind.empty(meta, memoryview(frame).nbytes)
    host_to_device([frame], [target])
    return _finish(obj, kind, meta)


_registered = False


def register_serializers() -> None:
    """Registers the ``"ferrylink"`` serialization family with ``distributed`` (once
    per process; every process that deserializes needs it). Use it by name:
    ``serialize(x, serializers=["ferrylink", "dask", "pickle"])``, or a client's and
    workers' ``serializers``/``deserializers`` lists."""
    global _registered
    if _registered:
        return
    from distributed.protocol.serialize import register_serialization_family

    register_serialization_family("ferrylink", ferrylink_dumps, ferrylink_loads)
    _registered = True


# An entry of the spill store: header b"FLE1", the count of host frames (the in-band
# pickle first, then the out-of-band buffers) and of device frames after them.
_ENTRY = struct.Struct("<4sII")
_ENTRY_MAGIC = b"FLE1"


class _DevicePickler(pickle.Pickler):
    """Pickle protocol 5 that takes device objects out as device frames."""

    def __init__(self, file: io.BytesIO, buffers: List[Any]) -> None:
        super().__init__(file, protocol=5, buffer_callback=buffers.append)
        self.device: List[Any] = []

    def persistent_id(self, obj: Any) -> Any:
        kind = device_kind(obj)
        if kind is None:
            return None
        meta, contiguous = kind.export(obj)
        self.device.append(contiguous)
        return (kind.name, meta, len(self.device) - 1)


class _DeviceUnpickler(pickle.Unpickler):
    """The other way: device frames (host copies) become new device objects, whose
    bytes are copied in all at once after loading (:meth:`copy_in`)."""

    def __init__(self, file: io.BytesIO, buffers: Sequence[Any], device: Sequence[Any]) -> None:
        super().__init__(file, buffers=buffers)
        self.device = device
        self.sources: List[Any] = []
        self.targets: List[Any] = []
        self.made: List[Tuple[Any, DeviceKind, Meta]] = []

    def persistent_load(self, pid: Any) -> Any:
        name, meta, index = pid
        kind = KINDS[name]
        frame = self.device[index]
        obj, target = kind.empty(meta, memoryview(frame).nbytes)
        self.sources.append(frame)
        self.targets.append(target)
        self.made.append((obj, kind, meta))
        return obj

    def copy_in(self) -> None:
        host_to_device(self.sources, self.targets)
        for obj, kind, meta in self.made:
            _finish(obj, kind, meta)


def _out_of_band(buffers: Sequence[pickle.PickleBuffer]) -> List[Any]:
    out: List[Any] = []
    for b in buffers:
        try:
            out.append(b.raw())
        except BufferError:  # not contiguous: its bytes, copied
            out.append(memoryview(b).tobytes())
    return out


def encode_entry(obj: Any) -> Tuple[bytes, List[Any], bool]:
    """``obj`` as a spill store entry: ``(header, frames, has device frames)``. Host
    buffers are taken without a copy; device objects anywhere in ``obj`` become device
    frames when :func:`is_device_object` says it holds some. Raises what pickling
    raises for objects that cannot be stored."""
    buffers: List[pickle.PickleBuffer] = []
    device: List[Any] = []
    if is_device_object(obj):
        file = io.BytesIO()
        pickler = _DevicePickler(file, buffers)
        pickler.dump(obj)
        inband: Any = file.getbuffer()
        device = pickler.device
    else:
        inband = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    host = [inband, *_out_of_band(buffers)]
    header = _ENTRY.pack(_ENTRY_MAGIC, len(host), len(device))
    return header, host + device, bool(device)


def decode_entry(header: bytes, frames: Sequence[Any]) -> Any:
    """The object an entry holds (``frames`` as the store gives them back: host
    memory, device frames as their host copies)."""
    magic, n_host, n_device = _ENTRY.unpack(header)
    if magic != _ENTRY_MAGIC or n_host < 1 or n_host + n_device != len(frames):
        raise ValueError(f"not a ferrylink spill entry ({len(frames)} frames, header {header!r})")
    inband, buffers, device = frames[0], frames[1:n_host], frames[n_host:]
    if not device:
        return pickle.loads(inband, buffers=buffers)
    unpickler = _DeviceUnpickler(io.BytesIO(inband), buffers, device)
    obj = unpickler.load()
    unpickler.copy_in()
    return obj
