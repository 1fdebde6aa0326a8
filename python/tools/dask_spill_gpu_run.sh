#!/usr/bin/env bash
# Runs, on the GPU machine, the tests of ferrylink.dask's DeviceHostFile and "ferrylink"
# serializers with the GPU required, then the spill benchmark
# (python -m ferrylink.benchmarks.dask_spill: eviction of 1 GiB of torch CUDA tensors
# through the mapping beside the pinned device -> host copy, and the "ferrylink"
# serializer beside Dask's own serialization of the same tensor, and of an RMM
# DeviceBuffer where rmm is installed), in one run.
#
# DEST holds the wheels to install (no network there): the ferrylink wheel built from
# this checkout (python/tools/gpu_wheels.sh DEST builds it and pytest's), distributed,
# dask and the pure-Python wheels they need, and optionally rmm (with numba for Dask's
# RMM serializer). torch and numpy come from the machine. Installs into /tmp/site-dask.
# The benchmark's figures go to ${OUT:-/tmp}/dask_spill.json. Bounded to fit 10 minutes:
# pytest 360 s, the benchmark 200 s.
# usage (from anywhere in the repository): python/tools/dask_spill_gpu_run.sh DEST
set -uo pipefail
dest=${1:?usage: dask_spill_gpu_run.sh DEST}
root=$(cd "$(dirname "$0")/../.." && pwd)
dest=$(cd "$dest" && pwd)
site=/tmp/site-dask
out=${OUT:-/tmp}
rm -rf "$site"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$dest"/*.whl || exit 1
cd "$root"
export PYTHONPATH=$site
status=0
python3 -c "import ferrylink.dask, distributed, dask, torch; print('ferrylink', ferrylink.__version__, \
'distributed', distributed.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())" || exit 1

echo "== pytest: ferrylink.dask spill and serializers (FERRYLINK_REQUIRE_GPU=1)"
FERRYLINK_REQUIRE_GPU=1 timeout 360 python3 -m pytest -q -p no:cacheprovider -rs \
  python/tests/test_dask_device_host_file_gpu.py python/tests/test_dask_device_host_file.py \
  python/tests/test_dask_device_host_file_cluster.py python/tests/test_dask_serializers.py || status=1

echo "== benchmark: python -m ferrylink.benchmarks.dask_spill -n 1GiB"
timeout 200 python3 -m ferrylink.benchmarks.dask_spill -n 1GiB --pieces 16 --n-iter 5 --json "$out/dask_spill.json" \
  || status=1
exit $status
