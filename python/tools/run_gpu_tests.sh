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
for size in 1MB 1GB; do
  if [ "$size" = 1MB ]; then iters=3000; else iters=30; fi
  bench "Python benchmark, $size device (torch tensors)" \
    env PYTHONPATH=$site python3 -m ferrylink.benchmarks.send_recv -o torch -n $size --n-iter $iters --n-warmup-iter 10 --no-detailed-report
  if [ "$size" = 1MB ]; then
    bench "Python benchmark, $size device (torch tensors), asyncio" \
      env PYTHONPATH=$site python3 -m ferrylink.benchmarks.send_recv -o torch -n $size --n-iter $iters --n-warmup-iter 10 --api asyncio --no-detailed-report
  fi
  bench "Python benchmark, $size device (torch tensors), --reuse-alloc" \
    env PYTHONPATH=$site python3 -m ferrylink.benchmarks.send_recv -o torch -n $size --n-iter $iters --n-warmup-iter 10 --reuse-alloc --no-detailed-report
  # The Rust table without its per-iteration rows (thousands at 1 MB).
  echo "== Rust local-send-recv, $size device"
  "$dest/local-send-recv" -o device -n $size --n-iter $iters --n-warmup-iter 10 | sed '/^Iterations$/,$d'
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
done
exit $status
