#!/usr/bin/env bash
# Runs, on the GPU machine, the tests of ferrylink.dask's DeviceHostFile and "ferrylink"
# serializers with the GPU required, then the spill benchmark
# (python -m ferrylink.benchmarks.dask_spill: eviction of 1 GiB of torch CUDA tensors
# through the mapping beside the pinned device -> host copy, and the "ferrylink"
# serializer beside Dask's own serialization of the same tensor, and of an RMM
# DeviceBuffer where rmm and numba are installed), in one run.
#
# BUNDLE (default: .gpu-wheels at the repository root, git-ignored) holds
# dask-site.tar.xz, the site directory python/tools/dask_gpu_bundle.sh makes (the
# ferrylink wheel of HEAD, distributed, dask, rmm, pytest); without it, the wheels in
# BUNDLE (*.whl) are installed instead. The machine needs CPython 3.12, torch and numpy.
# This checkout's ferrylink.dask spill files and benchmark are laid over the bundle's;
# the extension module must have the spill store (a bundle built after it was added).
# Installs into /tmp/dask-spill-site; the benchmark's figures go to
# ${OUT:-/tmp}/dask_spill.json. Bounded to fit 10 minutes: pytest 360 s, the benchmark
# 200 s.
# usage (from the repository root): python/tools/dask_spill_gpu_run.sh [BUNDLE]
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bundle=$(cd "${1:-$root/.gpu-wheels}" && pwd) || exit 1
site=/tmp/dask-spill-site
out=${OUT:-/tmp}
rm -rf "$site"
mkdir -p "$site"
if [ -f "$bundle/dask-site.tar.xz" ]; then
  tar -C "$site" -xJf "$bundle/dask-site.tar.xz" || exit 1
else
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$bundle"/*.whl || exit 1
fi
for f in __init__.py _device_host_file.py _serializers.py _spill_errors.py; do
  cp "$root/python/ferrylink/dask/$f" "$site/ferrylink/dask/$f" || exit 1
done
cp "$root/python/ferrylink/benchmarks/dask_spill.py" "$site/ferrylink/benchmarks/dask_spill.py" || exit 1
export PYTHONPATH=$site
# One UCX in every process, as python/tools/dask_gpu_run.sh has it, where the bundle has one.
if [ -e "$site/libucx/lib/libucp.so.0" ]; then export FERRYLINK_UCX_LIB=$site/libucx/lib/libucp.so.0; fi
cd "$root"
status=0

echo "== versions"
python3 - <<'EOF' || exit 1
import importlib, platform
print("python", platform.python_version())
for name in ("ferrylink", "distributed", "dask", "torch", "numpy", "rmm", "numba"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as e:  # the tests and the benchmark say what they miss
        print(name, "not importable:", type(e).__name__, e)
import ferrylink._ferrylink as ext
if not hasattr(ext, "SpillStore"):
    raise SystemExit("the bundle's ferrylink extension has no SpillStore: rebuild the bundle from this checkout")
EOF
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

echo "== pytest: ferrylink.dask spill and serializers (FERRYLINK_REQUIRE_GPU=1)"
FERRYLINK_REQUIRE_GPU=1 timeout 360 python3 -m pytest -q -p no:cacheprovider -rs \
  python/tests/test_dask_device_host_file_gpu.py python/tests/test_dask_device_host_file.py \
  python/tests/test_dask_device_host_file_cluster.py python/tests/test_dask_serializers.py || status=1

echo "== benchmark: python -m ferrylink.benchmarks.dask_spill -n 1GiB"
timeout 200 python3 -m ferrylink.benchmarks.dask_spill -n 1GiB --pieces 16 --n-iter 5 --json "$out/dask_spill.json" \
  || status=1
exit $status
