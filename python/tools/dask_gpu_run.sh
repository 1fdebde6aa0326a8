#!/usr/bin/env bash
# Runs, on the GPU machine, the Dask comm backend's tests with the GPU required, then the
# Dask comm benchmark (ferrylink://, ucx:// and tcp://, host and device objects, each
# beside the Python API's round trip of the same frames).
#
# BUNDLE (default: .gpu-wheels at the repository root, git-ignored) holds
# dask-site.tar.xz: an unpacked site directory for CPython 3.12 made by
# python/tools/dask_gpu_bundle.sh (the ferrylink wheel, distributed and dask 2026.7.1
# with their pure-Python dependencies, distributed-ucxx-cu13 0.52 with UCXX and UCX
# 1.21, rmm-cu13 26.10, cuda-bindings, pytest). The machine needs only CPython 3.12,
# torch and numpy. This checkout's comm files are laid over the wheel's, so the run
# tests the sources it was carried with. Installs into /tmp/dask-site.
# usage (from the repository root): python/tools/dask_gpu_run.sh [BUNDLE]
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bundle=$(cd "${1:-$root/.gpu-wheels}" && pwd)
site=/tmp/dask-site
rm -rf "$site"
mkdir -p "$site"
tar -C "$site" -xJf "$bundle/dask-site.tar.xz" || exit 1
cp "$root"/python/ferrylink/dask/*.py "$site/ferrylink/dask/" || exit 1
cp "$root/python/ferrylink/benchmarks/dask_comm.py" "$site/ferrylink/benchmarks/dask_comm.py" || exit 1
export PYTHONPATH=$site
# One UCX in every process: ferrylink's UCX lane loads the library UCXX carries.
export FERRYLINK_UCX_LIB=$site/libucx/lib/libucp.so.0
cd "$root"
status=0

echo "== versions"
python3 - <<'EOF' || status=1
import importlib, platform
print("python", platform.python_version())
for name in ("ferrylink", "distributed", "dask", "torch", "numpy", "rmm", "ucxx", "distributed_ucxx"):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", "?"))
    except Exception as e:  # the run goes on; the tests and benchmark say what is missing
        print(name, "not importable:", type(e).__name__, e)
EOF
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

echo "== pytest: the Dask comm backend (FERRYLINK_REQUIRE_GPU=1)"
FERRYLINK_REQUIRE_GPU=1 timeout 240 python3 -m pytest -q -p no:cacheprovider -rs \
  python/tests/test_dask_comm_gpu.py python/tests/test_dask_comm.py python/tests/test_dask_comm_cluster.py || status=1

echo "== Dask comm benchmark: host and device (RMM) objects, 8 B to 1 GB"
timeout 200 python3 -m ferrylink.benchmarks.dask_comm --schemes ferrylink,ucx,tcp --objects host,device \
  --sizes 8B,1MB,100MB,1GB || status=1
echo "== Dask comm benchmark: device objects from an RMM pool in both processes"
timeout 120 python3 -m ferrylink.benchmarks.dask_comm --schemes ferrylink,ucx --objects device \
  --sizes 8B,1MB,100MB,1GB --rmm-pool 8GB || status=1
echo "== Dask comm benchmark: device objects as PyTorch CUDA tensors"
timeout 120 python3 -m ferrylink.benchmarks.dask_comm --schemes ferrylink,ucx --objects device \
  --device-object torch --sizes 8B,1MB,100MB,1GB || status=1
exit $status
