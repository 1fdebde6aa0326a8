"""A pytest plugin that runs dask-cuda's tests of its ``DeviceHostFile`` against
:class:`ferrylink.dask.DeviceHostFile` (``-p dask_cuda_with_ferrylink``, this folder on
``PYTHONPATH``; used by python/tools/dask_cuda_gpu_run.sh).

dask-cuda's test module takes the class by name from ``dask_cuda.device_host_file`` when
it is imported; the plugin puts ferrylink's there before collection, and each collected
test checks that it is ferrylink's mapping it is testing.
"""

import dask_cuda.device_host_file as dask_cuda_dhf
import pytest

from ferrylink.dask import DeviceHostFile

dask_cuda_dhf.DeviceHostFile = DeviceHostFile


def pytest_collection_modifyitems(items):
    for item in items:
        tested = getattr(item.module, "DeviceHostFile", None)
        if tested is not None and tested is not DeviceHostFile:
            item.add_marker(pytest.mark.xfail(reason=f"{tested!r} is not ferrylink's", strict=True, run=False))


def pytest_report_header(config):
    return f"DeviceHostFile under test: {DeviceHostFile.__module__}.{DeviceHostFile.__qualname__}"
