"""ferrylink for Dask: a ``ferrylink://`` comm backend for dask.distributed.

Installed with ``pip install "ferrylink[dask]"``, the backend is registered through the
``distributed.comm.backends`` entry point under the scheme ``ferrylink``, so::

    from distributed import Client, LocalCluster
    cluster = LocalCluster(protocol="ferrylink")
    client = Client(cluster)

or ``dask scheduler --protocol ferrylink`` and ``dask worker ferrylink://host:port``.
Workers on the scheduler's host reach each other through the native lane, others
through TCP and the UCX lane.

Importing this package is cheap and does not need ``distributed``; the comm backend
(:class:`FerrylinkBackend`, in ``ferrylink.dask._comm``) imports it when first used.
"""

from __future__ import annotations

from typing import Any, List

from ._device_host_file import DeviceHostFile
from ._serializers import register_serializers
from ._spill_errors import CorruptSpillFileError, SpillDiskError, SpillError, SpillNoRoomError

__all__: List[str] = ["FerrylinkBackend"]
__all__ += ["DeviceHostFile", "register_serializers"]
__all__ += ["SpillError", "SpillDiskError", "CorruptSpillFileError", "SpillNoRoomError"]


def __getattr__(name: str) -> Any:
    # The backend needs distributed; import it only when asked for.
    if name == "FerrylinkBackend":
        from ._comm import FerrylinkBackend

        return FerrylinkBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
