#!/usr/bin/env bash
# onesided-figures.sh: the one-sided figures beside the two-sided ones, in one run
# on one GPU: `local-send-recv -o device --memory pool` (server and client on GPU 0) with
# --op send, put and get at 8 B, 1 MB, 100 MB and 1 GB; then the batch of 1000 blocks of
# 64 KiB in one request each way (--blocks 1000 -n 64000KiB, put and get), and the same
# bytes as one span. Each run measures its own ceiling right after its round trips.
#
#   benchmarks/onesided-figures.sh [--bin CMD] [--out DIR] [--device N] [-o device|host]
#                                  [--lane native|ucx] [--sizes "8B 1MB ..."]
#                                  [--ops "send put get"] [--iters N] [--no-batch]
#
# --bin: how to run local-send-recv (default: `bash .gpu-bundle/run.sh bin local-send-recv`
#   when .gpu-bundle/ is here, else target/release/local-send-recv);
# --out: where each run's JSON record goes (default: a new temporary directory);
# --device: the GPU of both sides (default 0);
# -o host: the same runs on host memory (a machine without a GPU; --memory pool then
#   means shared host memory);
# --lane ucx: every run over the UCX lane with RMA on (FERRYLINK_TRANSPORT=ucx and
#   FERRYLINK_UCX_RMA=1 for both processes; other UCX_* variables pass through, e.g.
#   UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y); default native;
# --sizes: the sizes of the send/put/get runs (default "8B 1MB 100MB 1GB"; iterations
#   10000 up to 64 KB, 3000 up to 16 MB, 300 up to 256 MB, 30 above);
# --ops: the ops of those runs (default "send put get");
# --iters N: N round trips (and N/10 warm-ups, at least 1) for every run instead, to bound
#   the time of a slow lane (a UCX whose CUDA get falls back to a slow protocol takes
#   about 3.8 ms per MB: the default counts then run for many minutes);
# --no-batch: leave out the four 64000 KiB runs (the batches and the same bytes as one).
# Prints one line per run as it ends (op, blocks, bytes, iterations, latency median / p99
# / p99.9, average bandwidth 2·n/t, ceiling and efficiency), then where the records are.
# A run that fails is reported with its error and the others still run; the exit status
# is 1 if any failed.
set -euo pipefail

bin=""
out=""
device=0
object=device
lane=native
sizes="8B 1MB 100MB 1GB"
ops="send put get"
iters_all=""
batch=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --bin|--out|--device|-o|--object-type|--lane|--sizes|--ops|--iters)
            [[ $# -ge 2 ]] || { echo "onesided-figures.sh: $1 needs a value" >&2; exit 2; } ;;&
        --bin) bin="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --device) device="$2"; shift 2 ;;
        -o|--object-type) object="$2"; shift 2 ;;
        --lane) lane="$2"; shift 2 ;;
        --sizes) sizes="$2"; shift 2 ;;
        --ops) ops="$2"; shift 2 ;;
        --iters) iters_all="$2"; shift 2 ;;
        --no-batch) batch=0; shift ;;
        -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
        *) echo "onesided-figures.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
if [[ -z "$bin" ]]; then
    if [[ -d .gpu-bundle ]]; then bin="bash .gpu-bundle/run.sh bin local-send-recv"; else bin=target/release/local-send-recv; fi
fi
case "$lane" in
    native) export FERRYLINK_TRANSPORT=native ;;
    ucx) export FERRYLINK_TRANSPORT=ucx FERRYLINK_UCX_RMA=1 ;;
    *) echo "onesided-figures.sh: --lane is native or ucx, not $lane" >&2; exit 2 ;;
esac
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
        return 0
    fi
    summarize "$out/$name.json"
}

# summarize RECORD: the run's line.
summarize() {
    python3 - "$1" <<'EOF'
import json, sys
v = json.load(open(sys.argv[1]))
ceiling = "ceiling n/a" if v["ceiling_gbps"] is None else \
    f'ceiling {v["ceiling_gbps"]:.2f} GB/s ({v["ceiling_method"]}), {100 * v["efficiency"]:.1f} %'
print(f'{v["op"]:4} blocks {v["blocks"] or 1:4} n {v["n_bytes"]:>10} x{v["n_iter"]:<5} '
      f'median {v["latency_median_us"]:9.2f} us p99 {v["latency_p99_us"]:9.2f} p99.9 {v["latency_p999_us"]:9.2f} '
      f'| avg {v["bandwidth_avg_gbps"]:8.2f} GB/s | {ceiling} | {v["lane"]} lane', flush=True)
EOF
}

# iterations N: round trips and warm-up ones for a size like 8B, 1MB, 64KiB, 1GB.
iterations() {
    if [[ -n "$iters_all" ]]; then
        local warm=$((iters_all / 10))
        echo "$iters_all $((warm > 0 ? warm : 1))"
        return 0
    fi
    local bytes
    bytes=$(python3 -c 'import re,sys
m = re.fullmatch(r"(\d+)\s*([KMG]?)(i?)B", sys.argv[1], re.I)
if not m: sys.exit(f"onesided-figures.sh: cannot read the size {sys.argv[1]}")
base = 1024 if m[3] else 1000
print(int(m[1]) * base ** " KMG".index((m[2] or " ").upper()))' "$1") || return 1
    if ((bytes <= 65536)); then echo "10000 100"
    elif ((bytes <= 16 << 20)); then echo "3000 10"
    elif ((bytes <= 256 << 20)); then echo "300 10"
    else echo "30 3"; fi
}

i=0
# next NAME ARGS...: run with the next number in front of its name.
next() {
    i=$((i + 1))
    local name=$1
    shift
    run "$(printf %02d $i)-$name" "$@"
}
for n in $sizes; do
    spec=$(iterations "$n") || exit 2
    read -r iters warm <<<"$spec"
    for op in $ops; do
        next "$op-$n" --op "$op" -n "$n" --n-iter "$iters" --n-warmup-iter "$warm"
    done
done
if ((batch)); then
    # 200 round trips (10 warm-ups) each, unless --iters says otherwise.
    iters=200 warm=10
    [[ -z "$iters_all" ]] || read -r iters warm <<<"$(iterations 64000KiB)"
    next put-1000x64KiB --op put --blocks 1000 -n 64000KiB --n-iter "$iters" --n-warmup-iter "$warm"
    next get-1000x64KiB --op get --blocks 1000 -n 64000KiB --n-iter "$iters" --n-warmup-iter "$warm"
    next put-64000KiB --op put -n 64000KiB --n-iter "$iters" --n-warmup-iter "$warm"
    next send-64000KiB --op send -n 64000KiB --n-iter "$iters" --n-warmup-iter "$warm"
fi

echo "records: $out"
exit "$failed"
