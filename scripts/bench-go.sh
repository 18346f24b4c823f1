#!/usr/bin/env bash
# This crate and Go gomux measured in one run, on the same machine, interleaved.
#
# Each round measures, one right after the other so that the machine's drift hits them alike:
#
# - throughput at 1, 10, 100, 500 and 1000 streams with 64 KiB writes, through the speed tool
#   (examples/speed.rs): `tcp` (raw loopback TCP, one connection per stream), `mux-tcp` (this
#   crate, both ends in one process) and `go` (Go gomux, sender and receiver in two Go
#   processes), each checksumming every stream at both ends; and Go gomux with both ends in one
#   process (`gomux-go-peer bench receive -pair`), as the Rust mode runs;
# - the 64-byte round trip: `cargo bench --bench latency` (its raw TCP and gomux rows) against
#   `gomux-go-peer bench rtt -pair` over gomux and over the raw TCP connection;
# - 8192 idle streams, then 8192 streams each echoing 1 KiB: examples/many_streams.rs against
#   `gomux-go-peer bench many -pair`, which does the same work.
#
# The order of the rows turns from round to round. At the end it prints Markdown tables: the
# median of each figure over the rounds and the median of the ratios taken within each round
# (with their range), then every round's figures.
#
# usage: scripts/bench-go.sh [--rounds N] [--bytes SIZE] [--streams "K ..."] [--quick]
#   --rounds N        rounds (default 5; at least 2 to see how much the machine moves)
#   --bytes SIZE      bytes per throughput row, any size the speed tool takes (default 1G)
#   --streams "K ..." stream counts of the throughput rows (default "1 10 100 500 1000")
#   --quick           2 rounds of 256M, for a check that everything runs
#
# Needs cargo and Go (the `go` command, or /usr/local/go/bin/go) with the Go gomux source beside
# the clone in ../shared/gomux-go; downloads nothing. Takes about 35 s per round after the
# builds (the latency bench's first build takes a few minutes more).
set -euo pipefail
# A failure inside $(...) fails the script too, not only the last command of the substitution.
shopt -s inherit_errexit

cd "$(dirname "${BASH_SOURCE[0]}")/.."

rounds=5
bytes=1G
stream_counts="1 10 100 500 1000"
rtt_count=100000
many_streams=8192

usage() {
    sed -n '/^# usage:/,/^#   --quick/s/^# \{0,1\}//p' "$0"
}

while (($#)); do
    case "$1" in
    --quick)
        rounds=2
        bytes=256M
        ;;
    --rounds | --bytes | --streams)
        if (($# < 2)); then
            echo "bench-go: $1 needs a value" >&2
            usage >&2
            exit 2
        fi
        case "$1" in
        --rounds) rounds=$2 ;;
        --bytes) bytes=$2 ;;
        --streams) stream_counts=$2 ;;
        esac
        shift
        ;;
    -h | --help)
        usage
        exit 0
        ;;
    *)
        echo "bench-go: unknown argument $1" >&2
        usage >&2
        exit 2
        ;;
    esac
    shift
done
if ! [[ $rounds =~ ^[1-9][0-9]*$ ]]; then
    echo "bench-go: --rounds takes a positive whole number, not $rounds" >&2
    exit 2
fi

target=${CARGO_TARGET_DIR:-target}
go=$(command -v go || true)
if [ -z "$go" ] && [ -x /usr/local/go/bin/go ]; then
    go=/usr/local/go/bin/go
fi
if [ -z "$go" ]; then
    echo "bench-go: no go command on the PATH or in /usr/local/go/bin" >&2
    exit 1
fi
if [ ! -f ../shared/gomux-go/mux.go ]; then
    echo "bench-go: the Go gomux source is not beside the clone (../shared/gomux-go)" >&2
    exit 1
fi

echo "building (release)..." >&2
mkdir -p "$target/gomux-go-peer"
peer=$(cd "$target/gomux-go-peer" && pwd)/gomux-go-peer
(cd tests/interop/go && GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local "$go" build -o "$peer" .)
cargo build --release --example speed --example many_streams >&2
cargo bench --bench latency --no-run >&2
speed="$target/release/examples/speed"
many="$target/release/examples/many_streams"

# Every figure goes into this file as "round key value", one per line.
results=$(mktemp)
# What the last measurement printed on stderr, shown if it fails.
errors=$(mktemp)
trap 'rm -f "$results" "$errors"' EXIT
record() {
    echo "$1 $2 $3" >>"$results"
}

# Runs a measurement with its stderr (progress lines) kept aside, and shows the end of it if
# the measurement fails.
quietly() {
    if ! "$@" 2>"$errors"; then
        echo "bench-go: failed: $*" >&2
        tr '\r' '\n' <"$errors" | grep -v "^ *$" | tail -12 >&2
        return 1
    fi
}

# The row of the speed tool's output for one mode: its MiB/s.
speed_rate() {
    local mode=$1 streams=$2 out
    out=$(quietly "$speed" --mode "$mode" --streams "$streams" --bytes "$bytes")
    if grep -q '^# go: skipped' <<<"$out"; then
        echo "bench-go: $(grep '^# go: skipped' <<<"$out")" >&2
        exit 1
    fi
    awk -v mode="$mode" '$1 == mode { print $5 }' <<<"$out"
}

# Go gomux with both ends in one process: MiB/s, once the digests of both ends agree.
go_pair_rate() {
    local streams=$1 out sent received
    out=$(quietly "$peer" bench receive -pair -progress 0 -streams "$streams" -bytes "$bytes")
    sent=$(awk '/^sent / { for (i = 2; i <= NF; i++) if ($i ~ /^digest=/) print $i }' <<<"$out")
    received=$(awk '/^received / { for (i = 2; i <= NF; i++) if ($i ~ /^digest=/) print $i }' <<<"$out")
    if [ -z "$sent" ] || [ "$sent" != "$received" ]; then
        echo "bench-go: Go transfer with $streams streams: sent $sent, received $received" >&2
        exit 1
    fi
    awk '/^received / {
        for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        printf "%.1f\n", v["bytes"] / 1048576 / v["seconds"]
    }' <<<"$out"
}

# The Rust round trips: criterion's estimate for its raw TCP and gomux rows, in µs, as
# "tcp X" and "gomux Y" lines. The "time:" under "change:" is the change from the last run.
rust_rtt() {
    quietly cargo bench --bench latency -- 'latency/(tcp|gomux-tcp)$' | awk '
        /^latency\// { name = $1 }
        /change:/ { name = "" }
        /time:/ && name != "" {
            for (i = 1; i <= NF; i++) if ($i == "time:") break
            value = $(i + 3); unit = $(i + 4)
            if (unit == "ns") value /= 1000
            else if (unit == "ms") value *= 1000
            sub(/^latency\//, "", name); sub(/-tcp$/, "", name)
            print name, value
            name = ""
        }'
}

# The Go round trip in µs, over gomux or (with -raw) over the TCP connection itself.
go_rtt() {
    quietly "$peer" bench rtt -pair -count "$rtt_count" -warmup 5000 "$@" | awk '/^rtt:/ { print $8 }'
}

# "echo MS" and "idle BYTES" from many_streams' last lines, and the Go peer's (with "resident").
rust_many() {
    quietly "$many" --streams "$many_streams" | awk '
        /^echo: .* in [0-9]+ ms$/ { print "echo", $(NF - 1) }
        /^idle:/ { print "idle", $4 }'
}
go_many() {
    quietly "$peer" bench many -pair -streams "$many_streams" | awk '
        /^echo:/ { print "echo", $(NF - 1) }
        /^idle:/ { r = $NF; sub(/\)$/, "", r); print "idle", $4; print "resident", r }'
}

# Runs "$@" for each word of the list given first, starting from the round's turn, so that
# every row is measured first in some round and last in another.
rotated() {
    local round=$1 list=($2) n i
    shift 2
    n=${#list[@]}
    for ((i = 0; i < n; i++)); do
        "$@" "${list[$(((i + round) % n))]}"
    done
}

throughput_row() {
    local round=$1 streams=$2 what=$3 rate
    case $what in
    go-pair) rate=$(go_pair_rate "$streams") ;;
    *) rate=$(speed_rate "$what" "$streams") ;;
    esac
    need "$what with $streams streams" "$rate"
    echo "  $streams streams, $what: $rate MiB/s" >&2
    record "$round" "tp-$streams-$what" "$rate"
}

# Fails the script when a measurement printed nothing it could read.
need() {
    if [ -z "$2" ]; then
        echo "bench-go: no figure from $1" >&2
        exit 1
    fi
}

rtt_row() {
    local round=$1 what=$2 key value out
    case $what in
    rust)
        out=$(rust_rtt)
        need "cargo bench --bench latency" "$out"
        while read -r key value; do
            record "$round" "rtt-rust-$key" "$value"
            echo "  round trip, Rust $key: $value µs" >&2
        done <<<"$out"
        ;;
    go)
        value=$(go_rtt)
        need "gomux-go-peer bench rtt" "$value"
        record "$round" rtt-go-gomux "$value"
        echo "  round trip, Go gomux: $value µs" >&2
        value=$(go_rtt -raw)
        need "gomux-go-peer bench rtt -raw" "$value"
        record "$round" rtt-go-tcp "$value"
        echo "  round trip, Go raw TCP: $value µs" >&2
        ;;
    esac
}

many_row() {
    local round=$1 what=$2 key value out
    out=$("${what}_many")
    need "the $what many-streams run" "$out"
    while read -r key value; do
        record "$round" "many-$what-$key" "$value"
        echo "  $many_streams streams, $what $key: $value" >&2
    done <<<"$out"
}

started=$(date -u '+%Y-%m-%d %H:%M')
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
for ((round = 1; round <= rounds; round++)); do
    echo "round $round of $rounds ($(date -u +%H:%M:%S))" >&2
    for streams in $stream_counts; do
        rotated "$round" "tcp mux-tcp go go-pair" throughput_row "$round" "$streams"
    done
    rotated "$round" "rust go" rtt_row "$round"
    rotated "$round" "rust go" many_row "$round"
done
finished=$(date -u '+%H:%M')
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------------------------------------
# Tables

cpu=$(lscpu 2>/dev/null | awk -F: '/^Model name/ { sub(/^ +/, "", $2); print $2; exit }')
echo "## gomux (Rust) and Go gomux, measured in the same run"
echo
echo "- \`scripts/bench-go.sh --rounds $rounds --bytes $bytes\`, $started–$finished UTC;" \
    "load average $load_start at the start, $load_end at the end."
echo "- ${cpu:-unknown CPU}, $(nproc) cores; Linux $(uname -r); $(rustc --version | cut -d' ' -f1-2);" \
    "$("$go" version | cut -d' ' -f3); Go gomux from ../shared/gomux-go."
echo "- Medians over the rounds; a ratio is taken within each round (rows measured one after" \
    "the other) and its median given, with its range over the rounds in brackets."
echo

awk -v rounds="$rounds" -v counts="$stream_counts" '
    function sort(a, n,    i, j, t) {
        for (i = 2; i <= n; i++) {
            t = a[i]
            for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]
            a[j + 1] = t
        }
    }
    # The median of the values of key over the rounds ("-" when there are none).
    function median(key,    a, n, r) {
        n = 0
        for (r = 1; r <= rounds; r++) if ((r, key) in v) a[++n] = v[r, key]
        if (n == 0) return "-"
        sort(a, n)
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    # The ratio top / bottom within each round: "median (min–max)".
    function ratio(top, bottom,    a, n, r, m) {
        n = 0
        for (r = 1; r <= rounds; r++)
            if ((r, top) in v && (r, bottom) in v && v[r, bottom] > 0)
                a[++n] = v[r, top] / v[r, bottom]
        if (n == 0) return "-"
        sort(a, n)
        m = n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
        if (n == 1) return r2(m)
        return r2(m) " (" r2(a[1]) "–" r2(a[n]) ")"
    }
    # Two decimals, or two significant digits for a ratio far below 1.
    function r2(x) { return x >= 0.1 ? sprintf("%.2f", x) : sprintf("%.2g", x) }
    function f(x, fmt) { return x == "-" ? x : sprintf(fmt, x) }
    { v[$1, $2] = $3 }
    END {
        n = split(counts, k, " ")
        for (i = 1; i <= n; i++) {
            keys[++nkeys] = "tp-" k[i] "-tcp"
            keys[++nkeys] = "tp-" k[i] "-mux-tcp"
            keys[++nkeys] = "tp-" k[i] "-go"
            keys[++nkeys] = "tp-" k[i] "-go-pair"
        }
        split("rtt-rust-tcp rtt-rust-gomux rtt-go-tcp rtt-go-gomux many-rust-echo many-go-echo many-rust-idle many-go-idle many-go-resident", more, " ")
        for (i = 1; i in more; i++) keys[++nkeys] = more[i]

        print "Throughput, MiB/s (2^20 bytes per second), 64 KiB writes, every byte checksummed at both ends:"
        print ""
        print "| streams | raw TCP | gomux (Rust) | Go gomux, 2 processes | Go gomux, 1 process | Rust ÷ TCP | Go (2 proc.) ÷ TCP | Rust ÷ Go (2 proc.) | Rust ÷ Go (1 proc.) |"
        print "|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
        for (i = 1; i <= n; i++) {
            p = "tp-" k[i] "-"
            printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", k[i],
                f(median(p "tcp"), "%.0f"), f(median(p "mux-tcp"), "%.0f"),
                f(median(p "go"), "%.0f"), f(median(p "go-pair"), "%.0f"),
                ratio(p "mux-tcp", p "tcp"), ratio(p "go", p "tcp"),
                ratio(p "mux-tcp", p "go"), ratio(p "mux-tcp", p "go-pair")
        }
        print ""
        print "64-byte round trip on one stream, µs (both ends in one process; Rust: criterion estimate):"
        print ""
        print "| | raw TCP | gomux | gomux ÷ its raw TCP |"
        print "|---|--:|--:|--:|"
        printf "| Rust (`cargo bench --bench latency`) | %s | %s | %s |\n",
            f(median("rtt-rust-tcp"), "%.1f"), f(median("rtt-rust-gomux"), "%.1f"),
            ratio("rtt-rust-gomux", "rtt-rust-tcp")
        printf "| Go (`gomux-go-peer bench rtt -pair`) | %s | %s | %s |\n",
            f(median("rtt-go-tcp"), "%.1f"), f(median("rtt-go-gomux"), "%.1f"),
            ratio("rtt-go-gomux", "rtt-go-tcp")
        printf "| Rust ÷ Go | %s | %s | |\n",
            ratio("rtt-rust-tcp", "rtt-go-tcp"), ratio("rtt-rust-gomux", "rtt-go-gomux")
        print ""
        print "Many streams (both ends in one process, one loopback TCP connection):"
        print ""
        print "| | Rust (`many_streams`) | Go (`gomux-go-peer bench many -pair`) | Rust ÷ Go |"
        print "|---|--:|--:|--:|"
        printf "| %s streams × 1 KiB echo, beside as many idle ones | %s ms | %s ms | %s |\n", N,
            f(median("many-rust-echo"), "%.0f"), f(median("many-go-echo"), "%.0f"),
            ratio("many-rust-echo", "many-go-echo")
        printf "| idle stream end: Rust resident-set growth, Go heap in use | %s bytes | %s bytes | %s |\n",
            f(median("many-rust-idle"), "%.0f"), f(median("many-go-idle"), "%.0f"),
            ratio("many-rust-idle", "many-go-idle")
        printf "| idle stream end: resident-set growth | %s bytes | %s bytes | %s |\n",
            f(median("many-rust-idle"), "%.0f"), f(median("many-go-resident"), "%.0f"),
            ratio("many-rust-idle", "many-go-resident")
        print ""
        print "Every round (throughput in MiB/s; rounds ran one after the other):"
        print ""
        printf "| figure |"
        for (r = 1; r <= rounds; r++) printf " round %d |", r
        print ""
        printf "|---|"
        for (r = 1; r <= rounds; r++) printf "--:|"
        print ""
        for (i = 1; i <= nkeys; i++) {
            printf "| %s |", keys[i]
            for (r = 1; r <= rounds; r++) printf " %s |", ((r, keys[i]) in v) ? v[r, keys[i]] : "-"
            print ""
        }
    }
' N="$many_streams" "$results"
