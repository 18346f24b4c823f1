#!/usr/bin/env bash
# A real workload through the gomux tunnel tool (tunnel/, gomux-tunnel): Redis.
#
# Starts a redis-server on a free loopback port, the tunnel's exit (in front of it) and entry,
# (with pinned TLS between them, the tool's default, or plain TCP with --insecure) and, as a
# baseline, two plain TCP relays in a row (`gomux-tunnel relay`: the same two hops and the
# same copying, one TCP connection per client instead of one gomux connection for all). Then it
# runs redis-benchmark against Redis directly, through the relays and through the tunnel: with
# keep-alive connections (-k 1), and with a new connection for every request (-k 0, so each
# request also opens and closes a gomux stream and a TCP connection at each end). It prints the
# requests per second side by side with the ratios tunnel/direct and tunnel/relay for every
# command, and checks that a value of several MiB, stored and read back through the tunnel with
# redis-cli, comes back byte for byte. With --go, the same runs go through a tunnel of Go gomux
# too (`gomux-go-peer tunnel entry|exit`, tests/interop/go/tunnel.go: one Go gomux session from
# its entry to its exit, every client a stream), and a table sets it beside the Rust tunnel.
#
# usage: scripts/redis-tunnel.sh [--quick] [--requests N] [--clients N] [--connections K]
#                                [--tests LIST] [--order LIST] [--go] [--insecure]
#   --quick          10000 requests per command instead of 100000 (for CI)
#   --requests N     requests per command (redis-benchmark -n)
#   --clients N      parallel connections (redis-benchmark -c), default 50
#   --connections K  gomux connections from the tunnel's entry to its exit, default 1
#   --tests LIST     only these commands (redis-benchmark -t), e.g. set,get
#   --order LIST     the order in which direct, relay and tunnel (and go, with --go) are
#                    measured, default direct,relay,tunnel (with --go and no go in the list,
#                    go comes last; scripts/benchmarks.sh turns the order from run to run)
#   --go             also through a Go gomux tunnel (needs Go and ../shared/gomux-go)
#   --insecure       the tunnel's ends over plain TCP instead of pinned TLS
#
# Needs redis-server, redis-cli and redis-benchmark (Debian: apt-get install -y redis-server
# redis-tools) and cargo; installs nothing. Every process it starts is stopped when it exits.
# The tunnel logs at RUST_LOG (default info); they are shown if something fails.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

requests=100000
clients=50
connections=1
tests=""
go_tunnel=false
order=direct,relay,tunnel
value_bytes=$((8 * 1024 * 1024))
insecure=false

usage() {
    sed -n '/^# usage:/,/^#   --insecure/s/^# \{0,1\}//p' "$0"
}

while (($#)); do
    case "$1" in
    --quick) requests=10000 ;;
    --go) go_tunnel=true ;;
    --insecure) insecure=true ;;
    --requests | --clients | --connections | --tests | --order)
        if (($# < 2)); then
            echo "error: $1 needs a value" >&2
            exit 2
        fi
        case "$1" in
        --requests) requests=$2 ;;
        --clients) clients=$2 ;;
        --connections) connections=$2 ;;
        --tests) tests=$2 ;;
        --order) order=$2 ;;
        esac
        shift
        ;;
    -h | --help)
        usage
        exit 0
        ;;
    *)
        echo "error: unknown argument $1" >&2
        usage >&2
        exit 2
        ;;
    esac
    shift
done
# Each of the three once, in any order: compare() needs all three. With --go, the Go tunnel
# is measured among them where the list puts it, or last.
if $go_tunnel && ! grep -qw go <<<"${order//,/ }"; then
    order=$order,go
fi
expected="direct relay tunnel "
if $go_tunnel; then
    expected="direct go relay tunnel "
fi
if [ "$(tr ',' '\n' <<<"$order" | sort | tr '\n' ' ')" != "$expected" ]; then
    echo "error: --order lists ${expected% } once each (go only with --go), not $order" >&2
    exit 2
fi

# ---------------------------------------------------------------------------------------------
# What is needed, and where things go
# ---------------------------------------------------------------------------------------------

# shellcheck source=scripts/lib.sh
source scripts/lib.sh # the working directory is the repository's root
require_tools "Redis and its tools install on Debian/Ubuntu with:
    apt-get install -y redis-server redis-tools" redis-server redis-cli redis-benchmark cargo

# Waits until whatever listens on a port answers a Redis PING (through the tunnel too).
await_pong() {
    local port=$1 what=$2
    for _ in $(seq 200); do
        if [ "$(redis-cli -h 127.0.0.1 -p "$port" PING 2>/dev/null)" = PONG ]; then
            return 0
        fi
        sleep 0.05
    done
    echo "error: $what on port $port does not answer PING" >&2
    return 1
}

# ---------------------------------------------------------------------------------------------
# Start Redis and the tunnel
# ---------------------------------------------------------------------------------------------

build_tunnel
if $insecure; then
    entry_security=(--insecure)
    exit_security=(--insecure)
else
    make_keys
fi

redis_port=$(free_port)
exit_port=$(free_port)
entry_port=$(free_port)
relay_far_port=$(free_port)
relay_near_port=$(free_port)

# No persistence: the benchmark's keys are throwaway, and a background save would disturb
# the measurement.
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
    --logfile "$work/redis.log" &
pids+=($!)
redis_pid=$!
await_pong "$redis_port" redis-server

export RUST_LOG="${RUST_LOG:-info}"
"$tunnel" exit --listen "127.0.0.1:$exit_port" --target "127.0.0.1:$redis_port" \
    "${exit_security[@]}" >/dev/null 2>"$work/exit.log" &
pids+=($!)
exit_pid=$!
# The exit first, so that the entry's first dial finds it.
await_log "$work/exit.log" "exit listening"
"$tunnel" entry --listen "127.0.0.1:$entry_port" --exit "127.0.0.1:$exit_port" \
    --connections "$connections" "${entry_security[@]}" >/dev/null 2>"$work/entry.log" &
pids+=($!)
entry_pid=$!
await_pong "$entry_port" "the tunnel's entry"

# The baseline: client -> near relay -> far relay -> Redis, plain TCP all the way.
"$tunnel" relay --listen "127.0.0.1:$relay_far_port" --target "127.0.0.1:$redis_port" \
    >/dev/null 2>"$work/relay-far.log" &
pids+=($!)
await_log "$work/relay-far.log" "relay listening"
"$tunnel" relay --listen "127.0.0.1:$relay_near_port" --target "127.0.0.1:$relay_far_port" \
    >/dev/null 2>"$work/relay-near.log" &
pids+=($!)
await_pong "$relay_near_port" "the relays"

# The Go gomux tunnel, the same shape: client -> Go entry -> one Go gomux session -> Go exit.
if $go_tunnel; then
    go=$(command -v go || true)
    if [ -z "$go" ] && [ -x /usr/local/go/bin/go ]; then
        go=/usr/local/go/bin/go
    fi
    [ -n "$go" ] || { echo "error: --go needs the go command" >&2; exit 1; }
    [ -f ../shared/gomux-go/mux.go ] ||
        { echo "error: --go needs the Go gomux source in ../shared/gomux-go" >&2; exit 1; }
    mkdir -p "${CARGO_TARGET_DIR:-target}/gomux-go-peer"
    go_peer=$(cd "${CARGO_TARGET_DIR:-target}/gomux-go-peer" && pwd)/gomux-go-peer
    echo "==> go build -o $go_peer (tests/interop/go)"
    (cd tests/interop/go && GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local "$go" build -o "$go_peer" .)
    go_exit_port=$(free_port)
    go_entry_port=$(free_port)
    "$go_peer" tunnel exit -listen "127.0.0.1:$go_exit_port" -target "127.0.0.1:$redis_port" \
        >"$work/go-exit.log" 2>&1 &
    pids+=($!)
    go_exit_pid=$!
    await_log "$work/go-exit.log" "tunnel exit listening"
    "$go_peer" tunnel entry -listen "127.0.0.1:$go_entry_port" -exit "127.0.0.1:$go_exit_port" \
        >"$work/go-entry.log" 2>&1 &
    pids+=($!)
    go_entry_pid=$!
    await_pong "$go_entry_port" "the Go tunnel's entry"
fi

echo
echo "machine:  $(lscpu | sed -n 's/^Model name: *//p' | head -n 1), $(nproc) cores"
echo "redis:    $(redis-server --version)"
echo "load:     $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min averages, at the start)"
echo "tunnel:   entry --connections $connections (gomux connections to the exit), $(
    $insecure && echo "plain TCP (--insecure)" || echo "pinned TLS")"
echo "ports:    redis-server $redis_port, tunnel exit $exit_port, tunnel entry $entry_port," \
    "relays $relay_near_port -> $relay_far_port"

# ---------------------------------------------------------------------------------------------
# The benchmarks
# ---------------------------------------------------------------------------------------------

# bench NAME PORT KEEPALIVE: one redis-benchmark run; its result lines go to $work/NAME.txt
# and to the terminal. The carriage-return progress lines of -q are dropped.
bench() {
    local name=$1 port=$2 keepalive=$3
    local command=(redis-benchmark -h 127.0.0.1 -p "$port" -q -n "$requests" -c "$clients"
        -k "$keepalive")
    if [ -n "$tests" ]; then
        command+=(-t "$tests")
    fi
    echo
    echo "==> $name: ${command[*]}"
    "${command[@]}" | tr '\r' '\n' | grep 'requests per second' | tee "$work/$name.txt"
}

# compare TITLE DIRECT RELAY TUNNEL: the three result files side by side, with the ratios
# tunnel/direct and tunnel/relay.
compare() {
    echo
    echo "$1"
    awk -F': ' '
        # "SET: 87719.30 requests per second, p50=0.287 msec"
        function rate(text) { split(text, words, " "); return words[1] }
        function p50(text) {
            return match(text, /p50=[0-9.]+/) ? substr(text, RSTART + 4, RLENGTH - 4) : "-"
        }
        FILENAME == ARGV[1] { order[++n] = $1; direct[$1] = rate($2); direct_p50[$1] = p50($2) }
        FILENAME == ARGV[2] { relay[$1] = rate($2) }
        FILENAME == ARGV[3] { tunnel[$1] = rate($2); tunnel_p50[$1] = p50($2) }
        END {
            printf "| %-36s | %11s | %11s | %11s | %7s | %7s | %10s | %10s |\n", "command",
                "direct rps", "relay rps", "tunnel rps", "÷direct", "÷relay", "direct p50",
                "tunnel p50"
            printf "|%s|%s|%s|%s|%s|%s|%s|%s|\n", "--------------------------------------",
                "------------:", "------------:", "------------:", "--------:", "--------:",
                "-----------:", "-----------:"
            logs = 0; logs_relay = 0; counted = 0
            for (i = 1; i <= n; i++) {
                c = order[i]
                if (!(c in tunnel) || !(c in relay) || direct[c] <= 0 || relay[c] <= 0) continue
                ratio = tunnel[c] / direct[c]; ratio_relay = tunnel[c] / relay[c]
                logs += log(ratio); logs_relay += log(ratio_relay); counted++
                printf "| %-36s | %11.0f | %11.0f | %11.0f | %7.2f | %7.2f | %7s ms | %7s ms |\n",
                    c, direct[c], relay[c], tunnel[c], ratio, ratio_relay, direct_p50[c],
                    tunnel_p50[c]
            }
            if (counted) printf "geometric mean of the ratios: %.2f of direct, %.2f of the relay\n",
                exp(logs / counted), exp(logs_relay / counted)
        }' "$work/$2.txt" "$work/$3.txt" "$work/$4.txt"
}

echo "order:    $order"
for keepalive in 1 0; do
    for target in ${order//,/ }; do
        case $target in
        direct) bench "direct-k$keepalive" "$redis_port" "$keepalive" ;;
        relay) bench "relay-k$keepalive" "$relay_near_port" "$keepalive" ;;
        tunnel) bench "tunnel-k$keepalive" "$entry_port" "$keepalive" ;;
        go) bench "go-k$keepalive" "$go_entry_port" "$keepalive" ;;
        esac
    done
done

echo
echo "==> results: -n $requests -c $clients${tests:+ -t $tests}, requests per second"
compare "keep-alive connections (-k 1):" direct-k1 relay-k1 tunnel-k1
compare "a new connection per request (-k 0):" direct-k0 relay-k0 tunnel-k0

# compare_go TITLE RELAY TUNNEL GO: the Rust tunnel beside the Go gomux one, and the relays.
compare_go() {
    echo
    echo "$1"
    awk -F': ' '
        function rate(text) { split(text, words, " "); return words[1] }
        FILENAME == ARGV[1] { relay[$1] = rate($2) }
        FILENAME == ARGV[2] { tunnel[$1] = rate($2) }
        FILENAME == ARGV[3] { order[++n] = $1; go[$1] = rate($2) }
        END {
            printf "| %-36s | %11s | %11s | %11s | %9s |\n", "command", "relay rps",
                "rust rps", "go rps", "rust÷go"
            printf "|%s|%s|%s|%s|%s|\n", "--------------------------------------",
                "------------:", "------------:", "------------:", "----------:"
            for (i = 1; i <= n; i++) {
                c = order[i]
                if (!(c in tunnel) || !(c in relay) || go[c] <= 0) continue
                printf "| %-36s | %11.0f | %11.0f | %11.0f | %9.2f |\n", c, relay[c], tunnel[c],
                    go[c], tunnel[c] / go[c]
            }
        }' "$work/$2.txt" "$work/$3.txt" "$work/$4.txt"
}
if $go_tunnel; then
    compare_go "the Rust tunnel and a Go gomux tunnel, keep-alive connections (-k 1):" \
        relay-k1 tunnel-k1 go-k1
    compare_go "the Rust tunnel and a Go gomux tunnel, a new connection per request (-k 0):" \
        relay-k0 tunnel-k0 go-k0
fi
# All the processes share the machine's cores: where the time went.
cpu_seconds() {
    awk -v tick="$(getconf CLK_TCK)" '{ printf "%.1f s", ($14 + $15) / tick }' "/proc/$1/stat"
}
echo
echo "CPU time used: redis-server $(cpu_seconds "$redis_pid"), tunnel entry" \
    "$(cpu_seconds "$entry_pid"), tunnel exit $(cpu_seconds "$exit_pid")"
if $go_tunnel; then
    echo "CPU time used by the Go tunnel: entry $(cpu_seconds "$go_entry_pid"), exit" \
        "$(cpu_seconds "$go_exit_pid")"
fi
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"

# ---------------------------------------------------------------------------------------------
# A large value, byte for byte
# ---------------------------------------------------------------------------------------------

echo
echo "==> SET and GET of $value_bytes random bytes through the tunnel"
head -c "$value_bytes" /dev/urandom >"$work/value"
stored=$(redis-cli -h 127.0.0.1 -p "$entry_port" -x SET gomux:tunnel:value <"$work/value")
if [ "$stored" != OK ]; then
    echo "error: SET through the tunnel answered: $stored" >&2
    exit 1
fi
# redis-cli writes a value to a pipe as it is, followed by a newline.
redis-cli -h 127.0.0.1 -p "$entry_port" GET gomux:tunnel:value >"$work/read"
if ! cmp <(cat "$work/value" && printf '\n') "$work/read"; then
    echo "error: the value read back through the tunnel differs from the one stored" >&2
    exit 1
fi
echo "identical: $(sha256sum <"$work/value" | cut -d' ' -f1)"

# The tunnel must have run on the gomux connections asked for, and logged no warning.
made=$(grep -c 'connected to the exit' "$work/entry.log" || true)
if [ "$made" != "$connections" ]; then
    echo "error: the entry made $made connections to the exit, not $connections" >&2
    exit 1
fi
if grep -q WARN "$work/entry.log" "$work/exit.log"; then
    echo "error: the tunnel logged warnings:" >&2
    grep WARN "$work/entry.log" "$work/exit.log" >&2
    exit 1
fi
echo
echo "redis-tunnel: all checks passed"
