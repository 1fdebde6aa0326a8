"""ferrylink: move GPU and host buffers between processes.

Blocking and asyncio APIs in the spirit of ucx-py/UCXX over the ferrylink Rust library:
two processes on one machine use the native lane (control messages through shared-memory
rings, device frames as CUDA IPC handles, host frames as memfds); processes on other
machines use UCX.

>>> import ferrylink, torch                                     # doctest: +SKIP
>>> ctx = ferrylink.Context()                                  # doctest: +SKIP
>>> ep = ctx.connect(path_from_the_listener)                   # doctest: +SKIP
>>> ep.send(b"weights", [torch.ones(1 << 20, device="cuda")])  # doctest: +SKIP

Frames are device memory (``__dlpack__`` / ``__cuda_array_interface__``: torch, CuPy,
Numba) or host memory (bytes, bytearray, memoryview, NumPy). Received device frames are
:class:`DeviceFrame` objects: ``torch.from_dlpack(frame)`` takes them without a copy.
"""

from . import _errors, _ferrylink
from ._core import Context, Endpoint, Listener, Message, Request, _host_view
from ._onesided import PreparedTransfer, Registration, RemoteRegion
from ._errors import *  # every exception, listed once in _errors.__all__
from ._ferrylink import DeviceFrame

__version__: str = _ferrylink.__version__

__all__ = [
    "Context",
    "Listener",
    "Endpoint",
    "Message",
    "Request",
    "PreparedTransfer",
    "Registration",
    "RemoteRegion",
    "DeviceFrame",
    "config_keys",
    "device_count",
    "alloc_device",
    "host_buffer",
]
__all__ += _errors.__all__


def config_keys() -> dict[str, tuple[str, str, str]]:
    """The keywords :class:`Context` takes: ``{keyword: (variable, default, accepts)}``,
    one per ``FERRYLINK_*`` variable of the library."""
    return _ferrylink.config_keys()


def device_count() -> int:
    """CUDA devices this process sees (0 without a driver or a GPU). Loads the CUDA
    driver: in a process that will fork, call it after forking, or use ``spawn``."""
    return _ferrylink.device_count()


def alloc_device(nbytes: int, device: int = 0) -> DeviceFrame:
    """``nbytes`` of ferrylink's exportable device memory on ``device`` (contents
    undefined), for programs without another GPU library. :class:`UnsupportedError`
    without a GPU."""
    return _ferrylink.alloc_device(nbytes, device)


def host_buffer(nbytes: int) -> memoryview:
    """``nbytes`` of zeroed host memory in shared memory (a sealed memfd of its own), as
    a writable ``memoryview``. The native lane sends it, and received host frames, by
    passing the fd once and no bytes, where other host memory is copied once into
    staging: use it for large host frames you send repeatedly (``np.frombuffer(view,
    dtype)`` gives an array over it that is sent the same way)."""
    return _host_view(_ferrylink.shared_host_buffer(nbytes))
