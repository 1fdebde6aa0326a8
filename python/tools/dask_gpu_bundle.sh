#!/usr/bin/env bash
# Builds, here, what python/tools/dask_gpu_run.sh needs on the GPU machine (CPython 3.12,
# torch and numpy, no network): DEST/dask-site.tar.xz, an unpacked site directory of
#   - the release abi3 wheel of ferrylink, built from a clean checkout of HEAD;
#   - distributed and dask 2026.7.1 (what distributed-ucxx 0.52 requires) and their
#     pure-Python dependencies; distributed-ucxx-cu13 0.52, ucxx-cu13 and libucxx-cu13
#     0.52, libucx-cu13 1.21, rmm-cu13 and librmm-cu13 26.10, cuda-bindings, cuda-core,
#     cuda-pathfinder, rapids-logger, nvidia-ml-py; pytest;
# with headers, static libraries and UCX's programs left out and each shared library
# kept once (its other names as symlinks): about 22 MB.
# usage (from the repository root): python/tools/dask_gpu_bundle.sh [DEST]
# DEST defaults to .gpu-wheels (git-ignored): carry that path.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dest=${1:-$root/.gpu-wheels}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/src" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

requirements=(
  distributed==2026.7.1 dask==2026.7.1 click==8.5.1 cloudpickle==3.1.3 fsspec==2026.9.0 jinja2==3.1.6
  markupsafe==3.0.4 locket==1.0.0 msgpack==1.2.4 packaging==26.4 partd==1.4.2 psutil==7.2.2 pyyaml==6.0.4
  sortedcontainers==2.4.0 tblib==3.2.2 toolz==1.2.0 tornado==6.6.1 urllib3==2.8.0 zict==3.0.0
  distributed-ucxx-cu13==0.52.0 ucxx-cu13==0.52.0 libucxx-cu13==0.52.0 libucx-cu13==1.21.0
  rmm-cu13==26.10.0 librmm-cu13==26.10.0 rapids-logger==0.3.0 rapids-dask-dependency==26.10.0
  cuda-bindings==13.5.0 cuda-core==1.2.2 cuda-pathfinder==1.9.1 nvidia-ml-py==13.615.71
  pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pygments==2.20.0
)
mkdir "$work/wheels" "$work/site"
for requirement in "${requirements[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "$work/wheels" "$requirement"
done

if ! command -v maturin >/dev/null 2>&1; then python3 -m pip install -q "maturin>=1.9.4,<2"; fi
git -C "$root" worktree add -q --detach "$work/src" HEAD
(cd "$work/src/python" && CARGO_TARGET_DIR="$root/target" maturin build --release --strip -q -i python3 -o "$work/wheels")

for wheel in "$work"/wheels/*.whl; do unzip -q -o "$wheel" -d "$work/site"; done
cd "$work/site"
find . -name include -type d -prune -exec rm -rf {} +
find . \( -name '*.a' -o -name '*.la' \) -delete
find . -name __pycache__ -type d -prune -exec rm -rf {} +
rm -rf libucx/bin
python3 - <<'PY'
# Wheels hold a library's symlinked names as copies: keep the longest name, link the rest.
import collections, hashlib, os
groups = collections.defaultdict(list)
for d, _, files in os.walk("."):
    for f in files:
        p = os.path.join(d, f)
        if ".so" in f and not os.path.islink(p) and os.path.getsize(p) > 65536:
            with open(p, "rb") as fh:
                groups[(d, hashlib.sha1(fh.read()).hexdigest())].append(f)
for (d, _), names in groups.items():
    keep = max(names, key=len)
    for n in names:
        if n != keep:
            os.remove(os.path.join(d, n))
            os.symlink(keep, os.path.join(d, n))
PY
tar -cf - . | xz -T2 -6 > "$dest/dask-site.tar.xz"
ls -l "$dest/dask-site.tar.xz"
