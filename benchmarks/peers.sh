#!/usr/bin/env bash
# peers.sh: ucx_perftest beside ferrylink's local-send-recv, at the same sizes.
#
#   benchmarks/peers.sh [-o host|device] [--sizes "1MB 100MB 1GB"] [--n-iter 10] [--repeat 1] [--bin PATH]
#
# Columns (GB/s = 10^9 B/s; ucx_perftest's "MB/s" are MiB/s and are converted):
# - ferrylink: `local-send-recv --json` (lane from FERRYLINK_TRANSPORT), round trips,
#   2·n/t as ucx-py reports it;
# - tag_bw: `ucx_perftest -t tag_bw`, one way, n/t, several sends in flight, UCX's own
#   settings (endpoints without error handling);
# - tag_lat: `ucx_perftest -t tag_lat`, ping-pong, 2·n/t (n over half the round trip);
# - tag_lat -e*: like ferrylink's UCX lane: endpoints with peer-failure handling (`-e`; the
#   lane needs it, and with it UCX 1.13 has no RMA over TCP, so payloads land through
#   receive segments) and ferrylink's TCP receive segments (UCX_TCP_RX_SEG_SIZE=512K, see
#   TCP_RX_SEG_SIZE in transport/src/ucx/context.rs; a UCX_TCP_RX_SEG_SIZE of yours wins).
#   This is the like-for-like ping-pong.
# - %: ferrylink against tag_bw and against tag_lat -e*.
# All over loopback (server + client on this machine): host: UCX_TLS=tcp (override with
# UCX_TLS=...), memory -m host; device: UCX_TLS=cuda_copy,cuda_ipc,tcp, memory -m cuda
# (needs a CUDA-aware UCX and its ucx_perftest built with CUDA support).
# --repeat N runs every measurement N times, interleaved, and prints medians (small machines
# are noisy: use 5 or more there).
# ucx_perftest is taken from PATH, else from .gpu-bundle/ (via run.sh, which sets the
# library path). Without it, only ours is printed.
set -euo pipefail

object=host
sizes="1MB 10MB 100MB"
n_iter=10
repeat=1
bin=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        -o|--object-type) object="$2"; shift 2 ;;
        --sizes) sizes="$2"; shift 2 ;;
        --n-iter) n_iter="$2"; shift 2 ;;
        --repeat) repeat="$2"; shift 2 ;;
        --bin) bin="$2"; shift 2 ;;
        -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
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

mem=host
tls="${UCX_TLS:-tcp}"
if [[ "$object" == device ]]; then mem=cuda; tls="${UCX_TLS:-cuda_copy,cuda_ipc,tcp}"; fi

# bytes, test, extra flags... -> GB/s from ucx_perftest's bandwidth column, or "n/a".
# Run with whatever UCX_* variables the caller put in the environment.
perftest_gbps() {
    local n="$1" test="$2"; shift 2
    local port=$((13000 + RANDOM % 20000))
    UCX_TLS="$tls" timeout 120 "${perftest[@]}" -p "$port" -m "$mem" "$@" >/dev/null 2>&1 &
    local server=$!
    sleep 1
    local out
    out=$(UCX_TLS="$tls" timeout 120 "${perftest[@]}" 127.0.0.1 -p "$port" -t "$test" -m "$mem" -s "$n" \
        -n "$n_iter" -w 1 -f "$@" 2>/dev/null || true)
    wait "$server" 2>/dev/null || true
    # -f: the final line holds 8 numbers: iterations, latency 50%ile / average / overall,
    # bandwidth average / overall (UCX's "MB/s" are MiB/s), message rate average / overall.
    local mibs
    mibs=$(echo "$out" | awk 'NF == 8 && $1 ~ /^[0-9]+$/ { bw = $5 } END { print bw }')
    if [[ -z "$mibs" ]]; then echo "n/a"; else python3 -c "print(f'{$mibs * 2**20 / 1e9:.2f}')"; fi
}

median() { # numbers (n/a skipped) -> median with 2 decimals, or n/a
    python3 -c "
import statistics, sys
v = [float(x) for x in sys.argv[1:] if x != 'n/a']
print(f'{statistics.median(v):.2f}' if v else 'n/a')" "$@"
}

percent() { # a b -> a/b in %, or n/a
    python3 -c "
import sys
a, b = sys.argv[1:]
print('n/a' if 'n/a' in (a, b) or float(b) == 0 else f'{100 * float(a) / float(b):.0f}%')" "$1" "$2"
}

seg="${UCX_TCP_RX_SEG_SIZE:-512K}"
printf "%-8s | %-5s | %-15s | %-10s | %-11s | %-12s | %-12s | %-13s\n" "n_bytes" "lane" "ferrylink 2n/t" "efficiency" "tag_bw n/t" "tag_lat 2n/t" "tag_lat -e*" "% of bw / -e*"
printf -- "---------+-------+-----------------+------------+-------------+--------------+--------------+--------------\n"
for size in $sizes; do
    n=$(bytes_of "$size")
    ours=() effs=() bw=() lat=() like=() lane=""
    for _ in $(seq "$repeat"); do
        line=$("$bin" -o "$object" -n "$n" --n-iter "$n_iter" --json | tail -1)
        read -r lane gbps eff < <(python3 -c "
import json, sys
r = json.loads(sys.argv[1])
eff = r['efficiency']
print(r['lane'], f\"{r['bandwidth_avg_gbps']:.2f}\", 'n/a' if eff is None else f'{eff*100:.1f}')" "$line")
        ours+=("$gbps") effs+=("$eff")
        if [[ ${#perftest[@]} -gt 0 ]]; then
            bw+=("$(perftest_gbps "$n" tag_bw)")
            lat+=("$(perftest_gbps "$n" tag_lat)")
            like+=("$(UCX_TCP_RX_SEG_SIZE="$seg" perftest_gbps "$n" tag_lat -e)")
        else
            bw+=(n/a) lat+=(n/a) like+=(n/a)
        fi
    done
    o=$(median "${ours[@]}") e=$(median "${effs[@]}") b=$(median "${bw[@]}") l=$(median "${lat[@]}") k=$(median "${like[@]}")
    [[ "$e" != n/a ]] && e="$e%"
    printf "%-8s | %-5s | %-15s | %-10s | %-11s | %-12s | %-12s | %-13s\n" "$size" "$lane" "$o" "$e" "$b" "$l" "$k" \
        "$(percent "$o" "$b") / $(percent "$o" "$k")"
done
if [[ ${#perftest[@]} -eq 0 ]]; then
    echo "(ucx_perftest not found on PATH or in .gpu-bundle/: UCX columns empty)" >&2
fi
