#!/usr/bin/env bash
# two-host.sh: local-send-recv between two hosts on this machine, beside ucx_perftest
# between the same hosts.
#
#   benchmarks/two-host.sh [--sizes "8B 64KB 1MB 100MB"] [--n-iter 50] [--bin PATH] [--helper PATH]
#
# The hosts are network namespaces joined by a veth pair (198.18.0.1 and 198.18.0.2),
# made and removed for every measurement by the kit's `two-host` binary (needs root). The
# server runs on the second host, the client on the first; UCX over TCP on the link
# (UCX_TLS=tcp UCX_NET_DEVICES=fl0, set by `two-host`). Columns, per size (medians over
# the round trips; GB/s = 10^9 B/s; ucx_perftest's "MB/s" are MiB/s and are converted):
# - ferrylink: `local-send-recv --server-only` / `--client-only -s 198.18.0.2 -p PORT`,
#   the round trip and 2·n/t as ucx-py reports it (lane: ucx, the hosts differ);
# - tag_lat: `ucx_perftest -t tag_lat`, the round trip (twice its half-round-trip
#   latency) and 2·n/t; `tag_lat -e`: with peer-failure handling and ferrylink's TCP
#   receive segments (UCX_TCP_RX_SEG_SIZE=512K), like ferrylink's lane (see peers.sh);
# - tag_bw: `ucx_perftest -t tag_bw`, one way, n/t, several sends in flight (its average).
# Sizes up to 64 KB run at least 2000 round trips (--n-iter for the larger ones).
# The binaries default to target/release/ (cargo build --release -p ferrylink-benchmarks
# --bin local-send-recv; cargo build --release -p ferrylink-testkit --bin two-host), or
# $CARGO_TARGET_DIR/release/ when that is set.
set -euo pipefail

sizes="8B 64KB 1MB 100MB"
n_iter=50
bin=""
helper=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --sizes) sizes="$2"; shift 2 ;;
        --n-iter) n_iter="$2"; shift 2 ;;
        --bin) bin="$2"; shift 2 ;;
        --helper) helper="$2"; shift 2 ;;
        -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
        *) echo "two-host.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

root="$(cd "$(dirname "$0")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
bin="${bin:-$target/release/local-send-recv}"
helper="${helper:-$target/release/two-host}"
for tool in "$bin" "$helper"; do
    if [[ ! -x "$tool" ]]; then
        echo "two-host.sh: $tool missing (see --help for the builds)" >&2
        exit 2
    fi
done
command -v ucx_perftest >/dev/null || { echo "two-host.sh: ucx_perftest not on PATH (ucx-utils)" >&2; exit 2; }
port=13337

bytes_of() { # size string -> bytes, the same units as local-send-recv
    python3 - "$1" <<'PY'
import re, sys
m = re.fullmatch(r"([0-9.]+)\s*([A-Za-z]*)", sys.argv[1].strip())
units = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}
print(int(float(m.group(1)) * units[m.group(2).lower()]))
PY
}

# SERVER_LINE CLIENT_LINE -> the client's output. The server runs on the second host, the
# client on the first, retried while the server is not listening yet (bounded).
across() {
    local server="$1" client="$2"
    "$helper" --keep "$(dirname "$bin")" --timeout 300 --grace 10 --second "$server" -- \
        bash -c "for try in \$(seq 50); do sleep 0.2; if out=\$($client 2>&1); then echo \"\$out\"; exit 0; fi; done
                 echo \"\$out\" >&2; exit 1"
}

ours() { # bytes -> "lane rtt_us gbps"
    local n="$1"
    local line
    line=$(across "exec $bin --server-only -p $port -o host -n $n --n-iter $iters 2>/dev/null" \
        "$bin --client-only -s \$FERRYLINK_SECOND_HOST -p $port -o host -n $n --n-iter $iters --json" | tail -1)
    echo "$line" | python3 -c "
import json, sys
r = json.loads(sys.stdin.read())
print(r['lane'], f\"{r['latency_median_us']:.1f}\", f\"{r['bandwidth_median_gbps']:.3f}\")"
}

perftest() { # bytes test [flags...] -> "rtt_us gbps" (rtt: tag_lat only)
    local n="$1" test="$2"; shift 2
    local out
    out=$(across "exec ucx_perftest -p $port $* >/dev/null 2>&1" \
        "ucx_perftest \$FERRYLINK_SECOND_HOST -p $port -t $test -s $n -n $iters -w 10 -f $*")
    # -f: the final line holds 8 numbers: iterations, latency 50%ile / average / overall
    # (µs), bandwidth average / overall (MiB/s), message rate average / overall. tag_lat:
    # the round trip is twice the median latency (half a round trip), 2·n/t is n over
    # it; tag_bw: its average bandwidth (the latency of one message in a stream of
    # several in flight says nothing of the bandwidth).
    echo "$out" | awk -v test="$test" -v n="$n" 'NF == 8 && $1 ~ /^[0-9]+$/ { lat = $2; bw = $5 }
        END { if (lat == "") { print "n/a n/a"; exit }
              if (test == "tag_lat") printf "%.1f %.3f\n", 2 * lat, n / (lat * 1000)
              else printf "- %.3f\n", bw * 1048576 / 1e9 }'
}

printf "%-7s | %-4s | %-15s | %-15s | %-15s | %-10s\n" "n_bytes" "lane" "ferrylink µs GB/s" "tag_lat µs GB/s" "tag_lat -e µs GB/s" "tag_bw GB/s"
printf -- "--------+------+-------------------+-----------------+--------------------+------------\n"
for size in $sizes; do
    n=$(bytes_of "$size")
    # Small messages: enough round trips for a median that the 2-core noise leaves alone.
    iters=$n_iter
    if (( n <= 65536 && iters < 2000 )); then iters=2000; fi
    read -r lane our_rtt our_bw < <(ours "$n")
    read -r lat_rtt lat_bw < <(perftest "$n" tag_lat)
    read -r like_rtt like_bw < <(UCX_TCP_RX_SEG_SIZE="${UCX_TCP_RX_SEG_SIZE:-512K}" perftest "$n" tag_lat -e)
    read -r _ bw < <(perftest "$n" tag_bw)
    printf "%-7s | %-4s | %8s %8s | %7s %7s | %9s %8s | %-10s\n" "$size" "$lane" "$our_rtt" "$our_bw" \
        "$lat_rtt" "$lat_bw" "$like_rtt" "$like_bw" "$bw"
done
