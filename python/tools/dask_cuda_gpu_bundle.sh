#!/usr/bin/env bash
# Builds, here, what python/tools/dask_cuda_gpu_run.sh needs on the GPU machine besides
# the bundle of python/tools/dask_gpu_bundle.sh: DEST/cupy-site.tar.xz, an unpacked site
# directory for CPython 3.12 holding CuPy (cupy-cuda13x 14.2, whose CUDA libraries come
# from the machine's PyTorch) and dask-cuda 26.10 with its tests, the extension modules
# stripped of their symbol tables (which are two thirds of the wheel): about 32 MB.
# usage (from the repository root): python/tools/dask_cuda_gpu_bundle.sh [DEST]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dest=${1:-$root/.gpu-wheels}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/wheels" "$work/site"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$work/wheels" \
  cupy-cuda13x==14.2.0 dask-cuda==26.10.0
for wheel in "$work"/wheels/*.whl; do unzip -q -o "$wheel" -d "$work/site"; done
cd "$work/site"
find . -name '*.so' -exec strip --strip-unneeded {} +
find . -name __pycache__ -type d -prune -exec rm -rf {} +
tar -cJf "$dest/cupy-site.tar.xz" .
ls -l "$dest/cupy-site.tar.xz"
