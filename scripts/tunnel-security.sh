#!/usr/bin/env bash
# What the tunnel tool's pinned TLS costs: the same workloads through two plain TCP relays in a
# row (`gomux-tunnel relay`), through the tunnel over plain TCP (`--insecure`) and through the
# tunnel with pinned TLS between its ends (the default), all started side by side in this run:
#
#   - Redis: redis-benchmark with keep-alive connections (-k 1), 50 clients, PING, SET and GET;
#   - a bulk transfer: iperf3, one TCP stream for a few seconds, through each.
#
# It prints one line per measurement, `NAME relays=X plain=Y tls=Z` (requests per second, or
# Mbit/s for the bulk transfer), which scripts/benchmarks.sh renders, then the ratios
# tls/plain and tls/relays of each.
#
# usage: scripts/tunnel-security.sh [--quick]
#   --quick   10000 requests per command and 2 s of bulk transfer (instead of 100000 and 5 s)
#
# Needs redis-server, redis-benchmark, iperf3 and cargo; installs nothing. Every process it
# starts is stopped when it exits.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

requests=100000
seconds=5

while (($#)); do
    case "$1" in
    --quick)
        requests=10000
        seconds=2
        ;;
    -h | --help)
        sed -n '/^# usage:/,/^#   --quick/s/^# \{0,1\}//p' "$0"
        exit 0
        ;;
    *)
        echo "error: unknown argument $1" >&2
        exit 2
        ;;
    esac
    shift
done

source scripts/lib.sh # the working directory is the repository's root
require_tools "Debian/Ubuntu: apt-get install -y redis-server redis-tools iperf3" \
    redis-server redis-benchmark iperf3 cargo

build_tunnel >&2
make_keys

# start NAME LISTENER ARGS...: runs the tool with ARGS, its logs in $work/NAME.log, and prints
# the address it bound for LISTENER (the tool prints `listening LISTENER ADDR`).
start() {
    local name=$1 listener=$2
    shift 2
    RUST_LOG=warn "$tunnel" "$@" >"$work/$name.out" 2>"$work/$name.log" &
    # Run in a command substitution, so $pids would not outlive it: cleanup reads this file.
    echo $! >>"$work/pids"
    for _ in $(seq 200); do
        if grep -q "^listening $listener " "$work/$name.out" 2>/dev/null; then
            awk -v l="$listener" '$1 == "listening" && $2 == l { print $3 }' "$work/$name.out"
            return 0
        fi
        sleep 0.05
    done
    echo "error: $name printed no $listener address" >&2
    return 1
}

# front TARGET: the three ways to TARGET; sets $relays, $plain and $tls to their front ports.
front() {
    local target=$1 far exit
    far=$(start "relay-far-$target" relay relay --listen 127.0.0.1:0 --target "$target")
    relays=$(start "relay-near-$target" relay relay --listen 127.0.0.1:0 --target "$far")
    exit=$(start "plain-exit-$target" entries exit --listen 127.0.0.1:0 --target "$target" --insecure)
    plain=$(start "plain-entry-$target" clients entry --listen 127.0.0.1:0 --exit "$exit" --insecure)
    exit=$(start "tls-exit-$target" entries exit --listen 127.0.0.1:0 --target "$target" \
        "${exit_security[@]}")
    tls=$(start "tls-entry-$target" clients entry --listen 127.0.0.1:0 --exit "$exit" \
        "${entry_security[@]}")
}

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
    --logfile "$work/redis.log" &
pids+=($!)
iperf_port=$(free_port)
iperf3 --server --bind 127.0.0.1 --port "$iperf_port" >"$work/iperf3.log" 2>&1 &
pids+=($!)
sleep 0.5

front "127.0.0.1:$redis_port"
redis_front=("$relays" "$plain" "$tls")
front "127.0.0.1:$iperf_port"
iperf_front=("$relays" "$plain" "$tls")
modes=(relays plain tls)

# Redis, each command through each front in turn.
for command in ping_mbulk set get; do
    line="redis-$command"
    for i in 0 1 2; do
        port=${redis_front[i]##*:}
        rps=$(redis-benchmark -h 127.0.0.1 -p "$port" -q -n "$requests" -c 50 -k 1 -t "$command" |
            tr '\r' '\n' | awk -F': ' '/requests per second/ { split($2, w, " "); print w[1] }' |
            tail -n 1)
        line+=" ${modes[i]}=$rps"
    done
    echo "$line" | tee -a "$work/results.txt"
done

# The bulk transfer: one iperf3 stream, what the receiver got.
line="bulk-mbit"
for i in 0 1 2; do
    port=${iperf_front[i]##*:}
    mbit=$(iperf3 --client 127.0.0.1 --port "$port" --time "$seconds" --json |
        python3 -c 'import json, sys; print(round(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e6))')
    line+=" ${modes[i]}=$mbit"
done
echo "$line" | tee -a "$work/results.txt"

echo
awk '{
    for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    printf "%s: tls/plain %.2f, tls/relays %.2f\n", $1, v["tls"] / v["plain"], v["tls"] / v["relays"]
}' "$work/results.txt"
