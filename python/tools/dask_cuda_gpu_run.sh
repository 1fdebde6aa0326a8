#!/usr/bin/env bash
# Runs, on the GPU machine, dask-cuda's own tests of DeviceHostFile
# (dask_cuda/tests/test_device_host_file.py: the placement of every key after each step,
# and random mixes of host and CuPy arrays) against ferrylink.dask.DeviceHostFile, with
# CuPy arrays as the device objects. dask-cuda's tests of its device_to_host and
# host_to_device helpers (test_serialize_cupy_collection) test dask-cuda's code, not the
# mapping, and are left out.
#
# BUNDLE (default: .gpu-wheels, git-ignored) holds dask-site.tar.xz
# (python/tools/dask_gpu_bundle.sh) and cupy-site.tar.xz
# (python/tools/dask_cuda_gpu_bundle.sh). This checkout's ferrylink.dask files are laid
# over the bundle's. Installs into /tmp/dask-cuda-site.
# usage (from the repository root): python/tools/dask_cuda_gpu_run.sh [BUNDLE]
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bundle=$(cd "${1:-$root/.gpu-wheels}" && pwd) || exit 1
site=/tmp/dask-cuda-site
rm -rf "$site"
mkdir -p "$site"
tar -C "$site" -xJf "$bundle/dask-site.tar.xz" || exit 1
tar -C "$site" -xJf "$bundle/cupy-site.tar.xz" || exit 1
cp "$root"/python/ferrylink/dask/*.py "$site/ferrylink/dask/" || exit 1
export PYTHONPATH=$site:$root/python/tools
cd "$root"
python3 - <<'PY' || exit 1
import cupy, dask_cuda
import dask_cuda_with_ferrylink  # noqa: F401  (puts ferrylink's class in place)
import dask_cuda.device_host_file as tested
print("cupy", cupy.__version__, "dask-cuda", dask_cuda.__version__, "device sum", float(cupy.arange(4).sum()))
print("DeviceHostFile under test:", tested.DeviceHostFile.__module__ + "." + tested.DeviceHostFile.__qualname__)
PY
FERRYLINK_REQUIRE_GPU=1 timeout 300 python3 -m pytest -q -p no:cacheprovider -p dask_cuda_with_ferrylink -rs \
  "$site/dask_cuda/tests/test_device_host_file.py" -k "test_device_host_file_short or test_device_host_file_step_by_step"
