#!/usr/bin/env bash
# Every figure of BENCHMARKS.md, measured in one run on this machine, and the file written from
# them (by scripts/benchmarks.py): nothing in it is copied from an earlier run.
#
# Each round measures, one right after the other so that the machine's drift hits them alike:
#
# - throughput at each stream count: the transport's limit, `iperf3 -l 1M -A 0,1` over loopback
#   and the speed tool's `tcp` mode without hashing (examples/speed.rs: one connection, reads and
#   writes of 1 MiB, both ends on one thread), the better of the two being the limit for that stream count in that
#   round; then, with 64 KiB writes, through the speed tool: this crate
#   without hashing (`mux-tcp --no-verify`, against the limit; and `mux-tcp-zc --no-verify`,
#   its zero-copy API, `Stream::write_chunk` and `read_chunk`) and with every byte hashed at
#   both ends (`mux-tcp`, against Go gomux doing the same: `--mode go`, sender and receiver in
#   two Go processes, and `gomux-go-peer bench receive -pair`, both ends in one process, as
#   the Rust modes run; and against xtaci/smux and hashicorp/yamux the same two ways:
#   `--mode go-smux` and `--mode go-yamux`, and `gomux-go-compare smux|yamux receive -pair`,
#   from benches/go-compare), and yamux without hashing (`yamux-tcp --no-verify`); and over
#   TLS, without hashing: one TLS connection (`tls --no-verify`, the limit under TLS) and gomux
#   over one (`mux-tls --no-verify`);
# - the 64-byte round trip: `cargo bench --bench latency` (its raw TCP and gomux rows) against
#   `gomux-go-peer bench rtt -pair` over gomux and over the raw TCP connection;
# - 8192 idle streams, then 8192 streams each echoing 1 KiB: examples/many_streams.rs against
#   `gomux-go-peer bench many -pair`, which does the same work.
#
# The order of the rows turns from round to round: each round starts one row later than the one
# before. Only with at least as many rounds as rows does every row take every place; so the order
# each round used is recorded and shown in the document. After the rounds: Redis through the
# tunnel tool with 1, 2 and 4 gomux connections (scripts/redis-tunnel.sh), three runs of each
# (one with --quick) with the order of direct, relays and tunnel turning from run to run, so that
# each comes first in one run and last in another; as many runs of the tunnel in its plain mode
# (--insecure, one gomux connection) beside a Go gomux tunnel, the order of the four turning
# likewise; then, once each: Redis with pinned TLS against
# plain TCP (scripts/tunnel-security.sh), perf profiles of the 1-stream and the 1000-stream
# transfer, the instructions a round trip executes (scripts/round-trip-instructions.sh, under
# callgrind), the allocation counts of tests/alloc.rs, latency under load over an emulated link
# (benches/latency_under_load.rs: a ping every 10 ms beside a bulk stream of the same session,
# gomux, two TCP connections, Go gomux and yamux), how eight bulk streams of one session share that
# link and what priority 10 beside 0 takes (benches/shares.rs), and the memory of 10,000 idle sessions beside
# Go gomux's (benches/idle_sessions.rs).
#
# usage: scripts/benchmarks.sh [--quick] [--rounds N] [--bytes SIZE] [--streams LIST]
#                              [--throughput-only] [--output FILE] [--notes FILE] [--no-redis]
#   --quick        1 round of 64M per row at 1 and 100 streams, shorter round trips, one run of
#                  Redis with fewer requests, the allocation test's debug build: a check that
#                  everything runs (for CI), still a complete document
#   --rounds N     rounds (default 3, about 60 s each here; at least 2 to see the machine move)
#   --bytes SIZE   bytes per throughput row (default 2G; 64M with --quick)
#   --streams LIST the stream counts of the throughput rows, comma-separated (default
#                  1,10,100,500,1000; 1,100 with --quick)
#   --throughput-only
#                  measure the throughput rows only: no round trips, many streams, Redis,
#                  profiles, allocations, latency under load, shares or idle sessions (the
#                  document's sections for those stay empty)
#   --output FILE  where to write the document (default BENCHMARKS.md at the repository root)
#   --notes FILE   Markdown included as it is under "Notes" (default
#                  scripts/benchmarks-notes.md; an empty name leaves the section out)
#   --no-redis     leave out Redis through the tunnel (the document says so)
#
# Needs cargo, Go (the `go` command, or /usr/local/go/bin/go) with the Go gomux source beside
# the clone in ../shared/gomux-go, python3 and iperf3; unless --no-redis, redis-server,
# redis-cli and redis-benchmark; perf for the profiles and valgrind for the instructions per
# round trip (each left out, with the reason, when missing or not permitted). Installs
# nothing; downloads only the Go modules of benches/go-compare (smux and yamux, pinned by its
# go.sum) through the Go module proxy, the first time it builds it. On the 2-core development
# machine the default run took about 7 minutes after the builds when Redis ran once per K (3
# of them for Redis; three runs now make that about 9), --quick under a minute; the latency
# bench's first build takes a few minutes more.
set -euo pipefail
# A failure inside $(...) fails the script too, not only the last command of the substitution.
shopt -s inherit_errexit

caller=$PWD
invocation=""
if (($#)); then
    invocation=$(printf ' %q' "$@")
fi
cd "$(dirname "${BASH_SOURCE[0]}")/.."

quick=false
rounds=3
bytes=2G
stream_counts="1 10 100 500 1000"
iperf_seconds=3
rtt_count=100000
rtt_criterion=()
many_streams=8192
idle_sessions=10000
redis=true
throughput_only=false
redis_connections="1 2 4"
# Runs of scripts/redis-tunnel.sh per K, the order of its three targets turning from run to run.
redis_runs=3
redis_requests=50000
redis_clients=50
redis_tests=ping,set,get
profile_bytes_one=8G
profile_bytes_many=4G
# The latency-under-load bench's options: 10 s per row, or 3 s with --quick.
loaded_options=()
# The shares bench's options: 10 s per row, or 2 s with --quick.
shares_options=()
# The allocation test's build: release, or (--quick) the debug build the tests already made.
alloc_build=(--release)
output=$PWD/BENCHMARKS.md
notes=$PWD/scripts/benchmarks-notes.md

usage() {
    sed -n '/^# usage:/,/^#   --no-redis/s/^# \{0,1\}//p' "$0"
}

fail() {
    echo "benchmarks: $*" >&2
    exit 1
}

while (($#)); do
    case "$1" in
    --quick)
        quick=true
        rounds=1
        bytes=64M
        stream_counts="1 100"
        iperf_seconds=1
        rtt_count=20000
        rtt_criterion=(--warm-up-time 1 --measurement-time 1)
        redis_requests=5000
        redis_runs=1
        profile_bytes_one=1G
        profile_bytes_many=512M
        alloc_build=()
        loaded_options=(--quick)
        shares_options=(--seconds 2)
        idle_sessions=1000
        ;;
    --no-redis) redis=false ;;
    --throughput-only) throughput_only=true ;;
    --rounds | --bytes | --streams | --output | --notes)
        if (($# < 2)); then
            echo "benchmarks: $1 needs a value" >&2
            usage >&2
            exit 2
        fi
        # Names given on the command line are relative to where it was typed.
        case "$1" in
        --rounds) rounds=$2 ;;
        --bytes) bytes=$2 ;;
        --streams) stream_counts=${2//,/ } ;;
        --output) output=$(cd "$caller" && realpath -m -- "$2") ;;
        --notes) notes=${2:+$(cd "$caller" && realpath -m -- "$2")} ;;
        esac
        shift
        ;;
    -h | --help)
        usage
        exit 0
        ;;
    *)
        echo "benchmarks: unknown argument $1" >&2
        usage >&2
        exit 2
        ;;
    esac
    shift
done
if ! [[ $rounds =~ ^[1-9][0-9]*$ ]]; then
    echo "benchmarks: --rounds takes a positive whole number, not $rounds" >&2
    exit 2
fi
if ! [[ $stream_counts =~ ^\ *[1-9][0-9]*(\ +[1-9][0-9]*)*\ *$ ]]; then
    echo "benchmarks: --streams takes positive whole numbers separated by commas, not $stream_counts" >&2
    exit 2
fi
if $throughput_only; then
    redis=false
fi
if [ -n "$notes" ] && [ ! -f "$notes" ]; then
    fail "no notes file $notes"
fi

# ---------------------------------------------------------------------------------------------
# What is needed, and the builds
# ---------------------------------------------------------------------------------------------

# shellcheck source=scripts/lib.sh
source scripts/lib.sh # the working directory is the repository's root
require_tools "iperf3 (the transport's limit) and python3 install on Debian/Ubuntu with:
    apt-get install -y iperf3 python3" cargo python3 iperf3
if $redis; then
    require_tools "Redis and its tools install on Debian/Ubuntu with:
    apt-get install -y redis-server redis-tools
or leave Redis out with --no-redis" redis-server redis-cli redis-benchmark
fi
go=$(command -v go || true)
if [ -z "$go" ] && [ -x /usr/local/go/bin/go ]; then
    go=/usr/local/go/bin/go
fi
[ -n "$go" ] || fail "no go command on the PATH or in /usr/local/go/bin"
[ -f ../shared/gomux-go/mux.go ] || fail "the Go gomux source is not beside the clone (../shared/gomux-go)"

target=${CARGO_TARGET_DIR:-target}
echo "building (release)..." >&2
mkdir -p "$target/gomux-go-peer"
peer=$(cd "$target/gomux-go-peer" && pwd)/gomux-go-peer
(cd tests/interop/go && GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local "$go" build -o "$peer" .)
# The Go multiplexers compared, a module of its own whose modules come from the Go module proxy
# (an environment that turns the proxy off, as the peer's build above does, is overridden here).
mkdir -p "$target/gomux-go-compare"
compare=$(cd "$target/gomux-go-compare" && pwd)/gomux-go-compare
go_proxy=${GOPROXY:-}
if [ -z "$go_proxy" ] || [[ $go_proxy =~ (^|[,|])off($|[,|]) ]]; then
    go_proxy=https://proxy.golang.org,direct
fi
(cd benches/go-compare && GOFLAGS=-mod=readonly GOPROXY=$go_proxy GOTOOLCHAIN=local "$go" build -o "$compare" .) ||
    fail "cannot build benches/go-compare (its modules come from the Go module proxy: GOPROXY=$go_proxy)"
cargo build --release --example speed --example many_streams --example round_trips >&2
if ! $throughput_only; then
    cargo bench --bench latency --no-run >&2
    cargo bench --features tcp --bench latency_under_load --no-run >&2
    cargo bench --features tcp --bench shares --no-run >&2
    cargo bench --bench idle_sessions --no-run >&2
fi
speed="$target/release/examples/speed"
many="$target/release/examples/many_streams"
# grep reads the whole help, not up to the first match (as -q does): a closed pipe would make
# the speed tool fail writing the rest, and the pipeline with it.
"$speed" --help | grep -- --no-verify >/dev/null || fail "$speed has no --no-verify option"

# Every figure goes into this file as "round key value", one per line; facts about the run
# (the machine, the commands) into meta as "key<TAB>value"; longer output into files beside.
results=$work/results
meta_file=$work/meta
: >"$results"
: >"$meta_file"
record() {
    echo "$1 $2 $3" >>"$results"
}
meta() {
    local key=$1
    shift
    printf '%s\t%s\n' "$key" "$*" >>"$meta_file"
}
# The command a measurement runs, as the document shows it (K standing for the stream count).
shown() {
    local key=$1 text
    shift
    text=$*
    meta "command-$key" "${text//$PWD\//}"
}

# What the last measurement printed on stderr, shown if it fails.
errors=$work/stderr.txt

# Runs a measurement with its stderr (progress lines) kept aside, and shows the end of it if
# the measurement fails.
quietly() {
    if ! "$@" 2>"$errors"; then
        echo "benchmarks: failed: $*" >&2
        tr '\r' '\n' <"$errors" | grep -v "^ *$" | tail -12 >&2
        return 1
    fi
}

# Fails the script when a measurement printed nothing it could read.
need() {
    [ -n "$2" ] || fail "no figure from $1"
}

# ---------------------------------------------------------------------------------------------
# The measurements
# ---------------------------------------------------------------------------------------------

# The row of the speed tool's output for one mode: its MiB/s.
speed_rate() {
    local mode=$1 streams=$2 out
    shift 2
    out=$(quietly "$speed" --mode "$mode" --streams "$streams" --bytes "$bytes" "$@")
    if grep -q '^# [a-z-]*: skipped' <<<"$out"; then
        fail "$(grep '^# [a-z-]*: skipped' <<<"$out")"
    fi
    awk -v mode="$mode" '$1 == mode { print $5 }' <<<"$out"
}
shown tp-mux-nv "$speed --mode mux-tcp --no-verify --streams K --bytes $bytes"
shown tp-zc-nv "$speed --mode mux-tcp-zc --no-verify --streams K --bytes $bytes"
shown tp-mux "$speed --mode mux-tcp --streams K --bytes $bytes"
shown tp-go "$speed --mode go --streams K --bytes $bytes"
shown tp-yamux-nv "$speed --mode yamux-tcp --no-verify --streams K --bytes $bytes"
shown tp-go-smux "$speed --mode go-smux --streams K --bytes $bytes"
shown tp-go-yamux "$speed --mode go-yamux --streams K --bytes $bytes"
shown tp-tls "$speed --mode tls --no-verify --streams 1 --bytes $bytes"
shown tp-mux-tls-nv "$speed --mode mux-tls --no-verify --streams K --bytes $bytes"

# A Go multiplexer with both ends in one process: MiB/s, once the digests of both ends agree.
# The program and the words before its role: "$peer" bench (Go gomux), "$compare" smux or
# "$compare" yamux.
go_pair_rate() {
    local streams=$1 out sent received
    shift
    out=$(quietly "$@" receive -pair -progress 0 -streams "$streams" -bytes "$bytes")
    sent=$(awk '/^sent / { for (i = 2; i <= NF; i++) if ($i ~ /^digest=/) print $i }' <<<"$out")
    received=$(awk '/^received / { for (i = 2; i <= NF; i++) if ($i ~ /^digest=/) print $i }' <<<"$out")
    if [ -z "$sent" ] || [ "$sent" != "$received" ]; then
        fail "Go transfer ($*) with $streams streams: sent $sent, received $received"
    fi
    awk '/^received / {
        for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        printf "%.1f\n", v["bytes"] / 1048576 / v["seconds"]
    }' <<<"$out"
}
shown tp-go-pair "$peer bench receive -pair -progress 0 -streams K -bytes $bytes"
shown tp-go-smux-pair "$compare smux receive -pair -progress 0 -streams K -bytes $bytes"
shown tp-go-yamux-pair "$compare yamux receive -pair -progress 0 -streams K -bytes $bytes"

# The transport's limit as iperf3 measures it: MiB/s received, over one loopback connection
# with 1 MiB writes, against the server started below. With two cores or more, the client and
# the server are pinned to cores 0 and 1 (-A), among the fastest settings tried on the
# development machine (see scripts/benchmarks-notes.md).
iperf_affinity=()
if (($(nproc) >= 2)); then
    iperf_affinity=(-A '0,1')
fi
iperf_rate() {
    quietly iperf3 -c 127.0.0.1 -p "$iperf_port" -l 1M "${iperf_affinity[@]}" -t "$iperf_seconds" -J |
        python3 -c '
import json, sys
print("%.1f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 8 / 2**20))'
}
shown tp-iperf3 "iperf3 -c 127.0.0.1 -p PORT -l 1M ${iperf_affinity[*]} -t $iperf_seconds -J (against iperf3 -s -p PORT)"
shown tp-tcp "$speed --mode tcp --no-verify --streams 1 --bytes $bytes"

# The Rust round trips: criterion's estimate for its raw TCP and gomux rows, in µs, as
# "tcp X" and "gomux Y" lines. The "time:" under "change:" is the change from the last run.
rust_rtt() {
    quietly cargo bench --bench latency -- "${rtt_criterion[@]}" 'latency/(tcp|gomux-tcp)$' | awk '
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
shown rtt-rust "cargo bench --bench latency -- ${rtt_criterion[*]}${rtt_criterion[*]:+ }'latency/(tcp|gomux-tcp)\$'"

# The Go round trip in µs, over gomux or (with -raw) over the TCP connection itself.
go_rtt() {
    quietly "$peer" bench rtt -pair -count "$rtt_count" -warmup 5000 "$@" | awk '/^rtt:/ { print $8 }'
}
shown rtt-go "$peer bench rtt -pair -count $rtt_count -warmup 5000 [-raw]"

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
shown many-rust "$many --streams $many_streams"
shown many-go "$peer bench many -pair -streams $many_streams"

# Runs "$@" for each word of the list given first, starting one word later each round: with as
# many rounds as words every word takes every place, with fewer not. The order used goes into
# the file order as "round<TAB>the command and its arguments<TAB>the words in order", and from
# there into the document.
rotated() {
    local round=$1 list n i order=()
    read -r -a list <<<"$2"
    shift 2
    n=${#list[@]}
    for ((i = 0; i < n; i++)); do
        order+=("${list[$(((i + round) % n))]}")
    done
    printf '%s\t%s\t%s\n' "$round" "$*" "${order[*]}" >>"$work/order"
    for what in "${order[@]}"; do
        "$@" "$what"
    done
}

throughput_row() {
    local round=$1 streams=$2 what=$3 rate
    case $what in
    # The limit, beside the rows of every stream count: always one connection.
    iperf3) rate=$(iperf_rate) ;;
    tcp) rate=$(speed_rate tcp 1 --no-verify) ;;
    mux-nv) rate=$(speed_rate mux-tcp "$streams" --no-verify) ;;
    zc-nv) rate=$(speed_rate mux-tcp-zc "$streams" --no-verify) ;;
    mux) rate=$(speed_rate mux-tcp "$streams") ;;
    go) rate=$(speed_rate go "$streams") ;;
    go-pair) rate=$(go_pair_rate "$streams" "$peer" bench) ;;
    yamux-nv) rate=$(speed_rate yamux-tcp "$streams" --no-verify) ;;
    go-smux) rate=$(speed_rate go-smux "$streams") ;;
    go-smux-pair) rate=$(go_pair_rate "$streams" "$compare" smux) ;;
    go-yamux) rate=$(speed_rate go-yamux "$streams") ;;
    go-yamux-pair) rate=$(go_pair_rate "$streams" "$compare" yamux) ;;
    # The limit under TLS, beside the rows of every stream count: always one connection.
    tls) rate=$(speed_rate tls 1 --no-verify) ;;
    mux-tls-nv) rate=$(speed_rate mux-tls "$streams" --no-verify) ;;
    esac
    need "$what with $streams streams" "$rate"
    echo "  $streams streams, $what: $rate MiB/s" >&2
    record "$round" "tp-$streams-$what" "$rate"
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

# Redis through the tunnel with K gomux connections, run R (from 1): redis-tunnel.sh's whole
# output, or why there is none, in redis-K-R.txt (read by the renderer). Run R measures direct,
# relays and tunnel starting R - 1 places into that list.
redis_run() {
    local k=$1 r=$2 targets=(direct relay tunnel) order=() i
    for ((i = 0; i < 3; i++)); do
        order+=("${targets[$(((i + r - 1) % 3))]}")
    done
    local command=(scripts/redis-tunnel.sh --requests "$redis_requests"
        --clients "$redis_clients" --tests "$redis_tests")
    if ((k > 1)); then
        command+=(--connections "$k")
    fi
    if ((redis_runs > 1)); then
        command+=(--order "$(tr ' ' ',' <<<"${order[*]}")")
    fi
    echo "Redis through the tunnel, $k connection(s), run $r ($(date -u +%H:%M:%S))" >&2
    local out=$work/redis-$k-$r
    if ((k > 1)) && ! grep -q -- --connections <<<"$redis_help"; then
        echo "not measured: scripts/redis-tunnel.sh needs a --connections option" \
            "for more than one gomux connection" >"$out.failed"
        return 0
    fi
    if ! "${command[@]}" >"$out.txt" 2>"$out.err"; then
        {
            echo "failed: ${command[*]}"
            tr '\r' '\n' <"$out.err" | grep -v '^ *$' | tail -5
        } >"$out.failed"
        cat "$out.failed" >&2
    fi
}

# Redis through the tunnel in its plain mode (--insecure, one gomux connection) beside a Go
# gomux tunnel, run R (from 1), in the order plain_orders gives it (each run starts one place
# later than the one before): redis-tunnel.sh's whole output in redis-plain-R.txt, or why there
# is none in redis-plain-R.failed.
plain_orders=(direct,relay,tunnel,go relay,tunnel,go,direct tunnel,go,direct,relay go,direct,relay,tunnel)
redis_plain_run() {
    local r=$1
    local command=(scripts/redis-tunnel.sh --requests "$redis_requests" --clients "$redis_clients"
        --tests "$redis_tests" --insecure --go --order "${plain_orders[$(((r - 1) % 4))]}")
    echo "Redis through the plain tunnel and a Go gomux tunnel, run $r ($(date -u +%H:%M:%S))" >&2
    local out=$work/redis-plain-$r
    if ! "${command[@]}" >"$out.txt" 2>"$out.err"; then
        {
            echo "failed: ${command[*]}"
            tr '\r' '\n' <"$out.err" | grep -v '^ *$' | tail -5
        } >"$out.failed"
        cat "$out.failed" >&2
    fi
}

# perf record of one transfer, and three reports of it: the share of each object (perf-NAME.dso),
# the symbols that took the most samples themselves (perf-NAME.all) and those of the program
# itself (perf-NAME.own), each "percent object-or-symbol" lines; or why there is no profile,
# in perf-NAME.failed.
profile() {
    local name=$1 streams=$2 size=$3 data=$work/perf-$1.data
    local run=("$speed" --mode mux-tcp --no-verify --streams "$streams" --bytes "$size")
    local report=(perf report -i "$data" --no-children --stdio -g none)
    echo "profile: $streams stream(s) ($(date -u +%H:%M:%S))" >&2
    shown "perf-$name" "perf record -g -o perf.data -- ${run[*]}"
    shown perf-dso "${report[*]/#$data/perf.data} -F overhead,dso"
    shown perf-all "${report[*]/#$data/perf.data} -F overhead,dso,sym --percent-limit 0.5"
    shown perf-own "${report[*]/#$data/perf.data} -F overhead,sym --dsos ${speed##*/} --percent-limit 0.1"
    if ! command -v perf >/dev/null; then
        echo "perf is not installed (Debian: apt-get install -y linux-perf)" >"$work/perf-$name.failed"
        return 0
    fi
    if ! perf record -g -o "$data" -- "${run[@]}" >/dev/null 2>"$work/perf-$name.err"; then
        {
            echo "perf record failed (kernel.perf_event_paranoid is" \
                "$(cat /proc/sys/kernel/perf_event_paranoid 2>/dev/null || echo unknown)):"
            tr '\r' '\n' <"$work/perf-$name.err" | grep -v '^ *$' | grep -v 'MiB/s' | head -5
        } >"$work/perf-$name.failed"
        cat "$work/perf-$name.failed" >&2
        return 0
    fi
    "${report[@]}" -F overhead,dso >"$work/perf-$name.report" 2>/dev/null
    sed -n 's/^# \(Samples: .*\)/\1/p' "$work/perf-$name.report" >"$work/perf-$name.samples"
    top 6 <"$work/perf-$name.report" >"$work/perf-$name.dso"
    "${report[@]}" -F overhead,dso,sym --percent-limit 0.5 2>/dev/null | top 12 >"$work/perf-$name.all"
    "${report[@]}" -F overhead,sym --dsos "${speed##*/}" --percent-limit 0.1 2>/dev/null |
        top 8 >"$work/perf-$name.own"
}

# The first N rows of a perf report, without its comments and blank lines.
top() {
    grep -v '^#' | grep -v '^ *$' | head -n "$1" || true
}

# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------

iperf_port=$(free_port)
iperf3 -s -p "$iperf_port" --forceflush >"$work/iperf3-server.log" 2>&1 &
pids+=($!)
await_log "$work/iperf3-server.log" "Server listening"

meta started "$(date -u '+%Y-%m-%d %H:%M:%S')"
meta load-start "$(cut -d' ' -f1-3 /proc/loadavg)"
meta command "scripts/benchmarks.sh$invocation"
meta quick "$quick"
meta throughput-only "$throughput_only"
meta rounds "$rounds"
meta bytes "$bytes"
meta streams "$stream_counts"
meta many-streams "$many_streams"
meta commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
# Uncommitted changes to tracked files, the document being written aside.
dirty=$(git status --porcelain --untracked-files=no 2>/dev/null | awk '{ print $NF }' |
    grep -vxF "$(realpath --relative-to=. "$output")" || true)
meta dirty "$(tr '\n' ' ' <<<"$dirty")"
meta cpu "$(lscpu 2>/dev/null | awk -F: '/^Model name/ { sub(/^ +/, "", $2); print $2; exit }')"
meta cores "$(nproc)"
meta memory "$(awk '/^MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)"
meta kernel "$(uname -r)"
meta rustc "$(rustc --version)"
meta go "$("$go" version)"
meta go-compare "$(cd benches/go-compare && awk '$1 ~ /^github.com\// { printf "%s%s %s", sep, $1, $2; sep = ", " }' go.mod)"
meta iperf3 "$(iperf3 --version | head -n 1)"

throughput_rows="iperf3 tcp mux-nv zc-nv mux go go-pair yamux-nv go-smux go-smux-pair go-yamux go-yamux-pair tls mux-tls-nv"
for ((round = 1; round <= rounds; round++)); do
    echo "round $round of $rounds ($(date -u +%H:%M:%S))" >&2
    for streams in $stream_counts; do
        rotated "$round" "$throughput_rows" throughput_row "$round" "$streams"
    done
    if ! $throughput_only; then
        rotated "$round" "rust go" rtt_row "$round"
        rotated "$round" "rust go" many_row "$round"
    fi
done
meta rounds-finished "$(date -u '+%H:%M:%S')"

meta redis "$redis"
if $redis; then
    meta redis-version "$(redis-server --version)"
    meta redis-connections "$redis_connections"
    meta redis-runs "$redis_runs"
    order_option=""
    if ((redis_runs > 1)); then
        order_option=" [--order direct,relay,tunnel | relay,tunnel,direct | tunnel,direct,relay]"
    fi
    meta command-redis "scripts/redis-tunnel.sh --requests $redis_requests --clients $redis_clients --tests $redis_tests [--connections K]$order_option"
    redis_help=$(scripts/redis-tunnel.sh --help)
    for ((r = 1; r <= redis_runs; r++)); do
        for k in $redis_connections; do
            redis_run "$k" "$r"
        done
    done
    plain_orders_used=$(printf ' | %s' "${plain_orders[@]:0:$((redis_runs < 4 ? redis_runs : 4))}")
    meta command-redis-plain "scripts/redis-tunnel.sh --requests $redis_requests --clients $redis_clients --tests $redis_tests --insecure --go --order ${plain_orders_used:3}"
    for ((r = 1; r <= redis_runs; r++)); do
        redis_plain_run "$r"
    done
    # The tunnel with pinned TLS between its ends against the plain tunnel and two relays:
    # Redis (-k 1, 50 clients) and a bulk transfer, in one run of the script (security.txt).
    security_command=(scripts/tunnel-security.sh)
    if $quick; then
        security_command+=(--quick)
    fi
    meta command-security "${security_command[*]}"
    echo "the tunnel with pinned TLS: ${security_command[*]} ($(date -u +%H:%M:%S))" >&2
    if ! "${security_command[@]}" >"$work/security.txt" 2>"$work/security.err"; then
        {
            echo "failed: ${security_command[*]}"
            grep -v '^ *$' "$work/security.err" | tail -5
        } >"$work/security.failed"
        cat "$work/security.failed" >&2
    fi
fi

if ! $throughput_only; then
    profile one 1 "$profile_bytes_one"
    profile many 1000 "$profile_bytes_many"

    # What a 64-byte round trip executes in user space, raw TCP and gomux, counted by callgrind:
    # once, as the count does not move with the load (instructions.txt), or why it is missing
    # (instructions.failed).
    instructions=(scripts/round-trip-instructions.sh)
    echo "instructions per round trip: ${instructions[*]} ($(date -u +%H:%M:%S))" >&2
    shown rtt-instructions "${instructions[*]}"
    if ! command -v valgrind >/dev/null; then
        echo "valgrind not found (Debian: apt-get install valgrind)" >"$work/instructions.failed"
    elif ! "${instructions[@]}" >"$work/instructions.txt" 2>"$work/instructions.err"; then
        { grep '^error' "$work/instructions.err" || echo "failed: ${instructions[*]}"; } |
            tail -n 1 >"$work/instructions.failed"
        cat "$work/instructions.failed" >&2
    fi

    alloc_test=(cargo test "${alloc_build[@]}" --test alloc -- --nocapture)
    echo "allocations: ${alloc_test[*]} ($(date -u +%H:%M:%S))" >&2
    shown alloc "${alloc_test[*]}"
    if ! "${alloc_test[@]}" >"$work/alloc.txt" 2>"$work/alloc.err"; then
        echo "failed" >"$work/alloc.failed"
    fi

    # Latency under load, once: the bench prints its own table, which goes into the document.
    loaded=(cargo bench --features tcp --bench latency_under_load -- "${loaded_options[@]}")
    echo "latency under load: ${loaded[*]} ($(date -u +%H:%M:%S))" >&2
    shown loaded "${loaded[*]}"
    if ! "${loaded[@]}" >"$work/loaded.txt" 2>"$work/loaded.err"; then
        tail -5 "$work/loaded.err" >"$work/loaded.failed"
    fi

    # How one session's bulk streams share the emulated link, once: eight at one priority, then
    # priority 10 beside 0. The bench prints its own table.
    shares=(cargo bench --features tcp --bench shares -- "${shares_options[@]}")
    echo "shares: ${shares[*]} ($(date -u +%H:%M:%S))" >&2
    shown shares "${shares[*]}"
    if ! "${shares[@]}" >"$work/shares.txt" 2>"$work/shares.err"; then
        tail -5 "$work/shares.err" >"$work/shares.failed"
    fi

    # Idle sessions, one connection each: resident bytes per session end, this crate's and Go
    # gomux's (the bench runs the Go peer itself), in idle-sessions.txt.
    idle_bench=(cargo bench --bench idle_sessions -- --sessions "$idle_sessions")
    echo "idle sessions: ${idle_bench[*]} ($(date -u +%H:%M:%S))" >&2
    shown idle-sessions "${idle_bench[*]}"
    if ! GOMUX_REQUIRE_GO=1 "${idle_bench[@]}" >"$work/idle-sessions.txt" 2>"$work/idle-sessions.err"; then
        echo "failed" >"$work/idle-sessions.failed"
        tail -5 "$work/idle-sessions.err" >&2
    fi
fi

meta finished "$(date -u '+%H:%M:%S')"
meta load-end "$(cut -d' ' -f1-3 /proc/loadavg)"

python3 scripts/benchmarks.py "$work" "$notes" "$output" >"$output.tmp"
mv "$output.tmp" "$output"
echo "benchmarks: wrote $output" >&2
