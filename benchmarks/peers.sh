#!/usr/bin/env bash
# peers.sh: ucx_perftest beside ferrylink's local-send-recv, at the same sizes.
#
#   benchmarks/peers.sh [-o host|device] [--sizes "1MB 100MB 1GB"] [--n-iter 10] [--bin PATH]
#
# - ours: `local-send-recv --json` (lane from FERRYLINK_TRANSPORT), round-trip bandwidth
#   2·n/t as ucx-py reports it;
# - UCX: `ucx_perftest -t tag_bw` over loopback (server + client on this machine):
#   host: UCX_TLS=tcp (override with UCX_TLS=...), memory -m host;
#   device: UCX_TLS=cuda_copy,cuda_ipc,tcp, memory -m cuda (needs a CUDA-aware UCX:
#   ../shared/gpu/bundle.sh --cuda-ucx --ucx-perftest).
#   ucx_perftest reports one-way bandwidth (its "MB/s" columns are MiB/s); this script
#   converts to GB/s (10^9 B/s).
# ucx_perftest is taken from PATH, else from .gpu-bundle/ (via run.sh, which sets the
# library path). Without it, only ours is printed.
set -euo pipefail

object=host
sizes="1MB 10MB 100MB"
n_iter=10
bin=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        -o|--object-type) object="$2"; shift 2 ;;
        --sizes) sizes="$2"; shift 2 ;;
        --n-iter) n_iter="$2"; shift 2 ;;
        --bin) bin="$2"; shift 2 ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "peers.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

root="$(cd "$(dirname "$0")/.." && pwd)"
if [[ -z "$bin" ]]; then
    for candidate in "$root/target/release/local-send-recv" "$root/.gpu-bundle/bin/local-send-recv"; do
        if [[ -x "$candidate" ]]; then bin="$candidate"; break; fi
    done
fi
if [[ -z "$bin" || ! -x "$bin" ]]; then
    echo "peers.sh: no local-send-recv binary (cargo build --release -p ferrylink-benchmarks, or --bin PATH)" >&2
    exit 2
fi

perftest=()
if command -v ucx_perftest >/dev/null 2>&1; then
    perftest=(ucx_perftest)
elif [[ -x "$root/.gpu-bundle/run.sh" ]] && [[ -e "$root/.gpu-bundle/ucx/bin/ucx_perftest" ]]; then
    perftest=(bash "$root/.gpu-bundle/run.sh" ucx_perftest)
fi

bytes_of() { # size string -> bytes, the same units as local-send-recv
    python3 - "$1" <<'PY'
import re, sys
s = sys.argv[1].strip()
m = re.fullmatch(r"([0-9.]+)\s*([A-Za-z]*)", s)
units = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
         "kib": 2**10, "mib": 2**20, "gib": 2**30}
print(int(float(m.group(1)) * units[m.group(2).lower()]))
PY
}

perftest_gbps() { # bytes -> one-way GB/s from ucx_perftest tag_bw, or "n/a"
    local n="$1" port=$((13000 + RANDOM % 2000)) mem=host tls="${UCX_TLS:-tcp}"
    if [[ "$object" == device ]]; then mem=cuda; tls="${UCX_TLS:-cuda_copy,cuda_ipc,tcp}"; fi
    local iters=$n_iter
    UCX_TLS="$tls" timeout 120 "${perftest[@]}" -p "$port" -m "$mem" >/dev/null 2>&1 &
    local server=$!
    sleep 1
    local out
    out=$(UCX_TLS="$tls" timeout 120 "${perftest[@]}" 127.0.0.1 -p "$port" -t tag_bw -m "$mem" -s "$n" \
        -n "$iters" -w 1 -f 2>/dev/null || true)
    wait "$server" 2>/dev/null || true
    # -f: the final line holds 8 numbers: iterations, latency 50%ile / average / overall,
    # bandwidth average / overall (UCX's "MB/s" are MiB/s), message rate average / overall.
    local mibs
    mibs=$(echo "$out" | awk 'NF == 8 && $1 ~ /^[0-9]+$/ { bw = $5 } END { print bw }')
    if [[ -z "$mibs" ]]; then echo "n/a"; else python3 -c "print(f'{$mibs * 2**20 / 1e9:.2f}')"; fi
}

printf "%-10s | %-8s | %-22s | %-10s | %-22s\n" "n_bytes" "lane" "ferrylink GB/s (2n/t)" "efficiency" "ucx_perftest GB/s (n/t)"
printf -- "-----------+----------+------------------------+------------+------------------------\n"
for size in $sizes; do
    n=$(bytes_of "$size")
    line=$("$bin" -o "$object" -n "$n" --n-iter "$n_iter" --json | tail -1)
    read -r lane gbps eff < <(python3 -c "
import json, sys
r = json.loads(sys.argv[1])
eff = r['efficiency']
print(r['lane'], f\"{r['bandwidth_avg_gbps']:.2f}\", 'n/a' if eff is None else f'{eff*100:.1f}%')" "$line")
    ucx="not found"
    if [[ ${#perftest[@]} -gt 0 ]]; then ucx=$(perftest_gbps "$n"); fi
    printf "%-10s | %-8s | %-22s | %-10s | %-22s\n" "$size" "$lane" "$gbps" "$eff" "$ucx"
done
if [[ ${#perftest[@]} -eq 0 ]]; then
    echo "(ucx_perftest not found on PATH or in .gpu-bundle/: UCX column empty)" >&2
fi
