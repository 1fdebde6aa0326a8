#!/usr/bin/env bash
# Runs, on the GPU machine, the Python package's tests with the GPU required, then the
# Python benchmark and the Rust local-send-recv at 1 MB and 1 GB of device memory, one
# after the other in the same run. Reads nothing outside the repository and DEST (made
# here by python/tools/gpu_wheels.sh DEST); installs into /tmp/site.
# usage (from the repository root, or anywhere in it): python/tools/run_gpu_tests.sh DEST
set -uo pipefail
dest=${1:?usage: run_gpu_tests.sh DEST}
root=$(cd "$(dirname "$0")/../.." && pwd)
dest=$(cd "$dest" && pwd)
site=/tmp/site
rm -rf "$site"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$dest"/*.whl || exit 1
cd "$root"
status=0

echo "== pytest (FERRYLINK_REQUIRE_GPU=1)"
PYTHONPATH=$site FERRYLINK_REQUIRE_GPU=1 python3 -m pytest -q -p no:cacheprovider python/tests || status=1

bench() { # label, then the command
  echo "== $1"
  shift
  "$@" || status=1
}
py_bench() { # label, then the Python benchmark's arguments
  bench "$1" env PYTHONPATH=$site python3 -m ferrylink.benchmarks.send_recv "${@:2}" --no-detailed-report
}
for size in 1MB 1GB; do
  if [ "$size" = 1MB ]; then iters=3000; else iters=30; fi
  common=(-n $size --n-iter $iters --n-warmup-iter 10)
  py_bench "Python benchmark, $size device (torch tensors)" -o torch "${common[@]}"
  py_bench "Python benchmark, $size device (torch tensors), --reuse-alloc" -o torch "${common[@]}" --reuse-alloc
  if [ "$size" = 1MB ]; then
    # ucx-py's order (blocking send, then receive), the asyncio API, and ferrylink's own
    # pool memory (what the Rust benchmark sends), to tell where a difference comes from.
    py_bench "Python benchmark, $size device (torch tensors), --reuse-alloc --sequential" \
      -o torch "${common[@]}" --reuse-alloc --sequential
    py_bench "Python benchmark, $size device (torch tensors), --sequential" -o torch "${common[@]}" --sequential
    py_bench "Python benchmark, $size device (torch tensors), asyncio" -o torch "${common[@]}" --api asyncio
    py_bench "Python benchmark, $size device (ferrylink pool)" -o ferrylink "${common[@]}"
    py_bench "Python benchmark, $size device (ferrylink pool), --reuse-alloc" -o ferrylink "${common[@]}" --reuse-alloc
    # One-sided from Python (register, import, put/get with notifications), beside Rust's.
    for op in put get; do
      py_bench "Python benchmark, $size device (torch tensors), --op $op" -o torch "${common[@]}" --op $op
      echo "== Rust local-send-recv, $size device --op $op"
      "$dest/local-send-recv" -o device -n $size --n-iter $iters --n-warmup-iter 10 --op $op --no-detailed-report || status=1
    done
  fi
  # The Rust table without its per-iteration rows (thousands at 1 MB).
  for reuse in "" --reuse-alloc; do
    echo "== Rust local-send-recv, $size device $reuse"
    "$dest/local-send-recv" -o device -n $size --n-iter $iters --n-warmup-iter 10 $reuse --no-detailed-report
    [ "$?" = 0 ] || status=1
  done
done
exit $status
