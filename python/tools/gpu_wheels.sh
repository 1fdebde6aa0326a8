#!/usr/bin/env bash
# Builds, here, everything the GPU machine needs to test the Python package and run its
# benchmark beside the Rust one (the GPU machine has no Rust toolchain and no network):
#   - the release abi3 wheel of ferrylink (maturin);
#   - the pure-Python wheels pytest needs, for CPython 3.12;
#   - the Rust benchmark local-send-recv (release, stripped), to print its figures in the
#     same run as the Python benchmark's.
# usage (from anywhere in the repository): python/tools/gpu_wheels.sh DEST
# then carry DEST (with the repository) and run there: python/tools/run_gpu_tests.sh DEST
# DEST=python/.gpu-wheels is git-ignored: carry that path (about 7 MB).
set -euo pipefail
dest=${1:?usage: gpu_wheels.sh DEST}
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
rm -f "$dest"/*.whl "$dest"/local-send-recv

if ! command -v maturin >/dev/null 2>&1; then python3 -m pip install -q "maturin>=1.9.4,<2"; fi
(cd "$root/python" && maturin build --release --strip -q -o "$dest")

# pytest 9.2.0 and what it requires on CPython 3.12 (no exceptiongroup or tomli there).
for requirement in pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 packaging==26.4 pygments==2.20.0; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform any -d "$dest" "$requirement"
done

cargo build --release --manifest-path "$root/Cargo.toml" -p ferrylink-benchmarks --bin local-send-recv
cp "$root/target/release/local-send-recv" "$dest/"
strip "$dest/local-send-recv" 2>/dev/null || true
ls -l "$dest"
