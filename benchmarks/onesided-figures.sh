#!/usr/bin/env bash
# onesided-figures.sh: issue 15's one-sided figures beside the two-sided ones, in one run
# on one GPU: `local-send-recv -o device --memory pool` (server and client on GPU 0) with
# --op send, put and get at 8 B, 1 MB and 1 GB; then the batch of 1000 blocks of 64 KiB
# in one request each way (--blocks 1000 -n 64000KiB, put and get), and the same bytes as
# one span. Each run measures its own ceiling right after its round trips.
#
#   benchmarks/onesided-figures.sh [--bin CMD] [--out DIR] [--device N] [-o device|host]
#
# --bin: how to run local-send-recv (default: `bash .gpu-bundle/run.sh bin local-send-recv`
#   when .gpu-bundle/ is here, else target/release/local-send-recv);
# --out: where each run's JSON record goes (default: a new temporary directory);
# --device: the GPU of both sides (default 0);
# -o host: the same runs on host memory (a machine without a GPU; --memory pool then
#   means shared host memory).
# Prints one line per run (op, blocks, bytes, iterations, latency median / p99 / p99.9,
# average bandwidth 2·n/t, ceiling and efficiency), then where the records are. A run
# that fails is reported with its error and the others still run; the exit status is 1
# if any failed.
set -euo pipefail

bin=""
out=""
device=0
object=device
while [[ $# -gt 0 ]]; do
    case "$1" in
        --bin) bin="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --device) device="$2"; shift 2 ;;
        -o|--object-type) object="$2"; shift 2 ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "onesided-figures.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
if [[ -z "$bin" ]]; then
    if [[ -d .gpu-bundle ]]; then bin="bash .gpu-bundle/run.sh bin local-send-recv"; else bin=target/release/local-send-recv; fi
fi
[[ -n "$out" ]] || out=$(mktemp -d)
mkdir -p "$out"

failed=0
# run NAME ARGS...: one run's record into $out/NAME.json, or its error on stderr.
run() {
    local name=$1
    shift
    if ! $bin -o "$object" --memory pool -d "$device" -e "$device" --json "$@" >"$out/$name.json" 2>"$out/$name.err"; then
        echo "$name: FAILED: $(head -n 3 "$out/$name.err")" >&2
        rm -f "$out/$name.json"
        failed=1
    fi
}

i=0
for size in "8B 10000 100" "1MB 3000 10" "1GB 30 3"; do
    read -r n iters warm <<<"$size"
    for op in send put get; do
        i=$((i + 1))
        run "$(printf %02d $i)-$op-$n" --op "$op" -n "$n" --n-iter "$iters" --n-warmup-iter "$warm"
    done
done
run 10-put-1000x64KiB --op put --blocks 1000 -n 64000KiB --n-iter 200 --n-warmup-iter 10
run 11-get-1000x64KiB --op get --blocks 1000 -n 64000KiB --n-iter 200 --n-warmup-iter 10
run 12-put-64000KiB --op put -n 64000KiB --n-iter 200 --n-warmup-iter 10
run 13-send-64000KiB --op send -n 64000KiB --n-iter 200 --n-warmup-iter 10

python3 - "$out" <<'EOF'
import glob, json, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    v = json.load(open(path))
    ceiling = "ceiling n/a" if v["ceiling_gbps"] is None else \
        f'ceiling {v["ceiling_gbps"]:.2f} GB/s ({v["ceiling_method"]}), {100 * v["efficiency"]:.1f} %'
    print(f'{v["op"]:4} blocks {v["blocks"] or 1:4} n {v["n_bytes"]:>10} x{v["n_iter"]:<5} '
          f'median {v["latency_median_us"]:9.2f} us p99 {v["latency_p99_us"]:9.2f} p99.9 {v["latency_p999_us"]:9.2f} '
          f'| avg {v["bandwidth_avg_gbps"]:8.2f} GB/s | {ceiling} | {v["lane"]} lane')
EOF
echo "records: $out"
exit "$failed"
