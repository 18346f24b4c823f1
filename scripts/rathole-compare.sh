#!/usr/bin/env bash
# gomux-tunnel beside rathole 0.5.0, in the same run, on loopback: Redis through each tunnel
# (and directly), one bulk download through each, and the resident memory both ends of each
# tunnel spend per idle client. Plain transports (gomux-tunnel --insecure, rathole "tcp") and
# encrypted ones (gomux-tunnel's pinned TLS, rathole's "noise").
#
# Each round measures every tool, in an order that turns from round to round (direct Redis,
# gomux-tunnel, rathole), each time on a freshly started pair of ends:
#   - idle: COUNT clients connect through the tunnel, each sends a Redis PING, reads the PONG
#     and stays connected; the growth of VmRSS (/proc/PID/status) of the two ends, divided by
#     COUNT, is the memory per idle client (the ends first carry 50 such clients and let them
#     go, so that what every client shares is already there);
#   - redis: redis-benchmark -q -n N -c 50 -t ping,set,get, with -k 1 (keep-alive) and -k 0 (a
#     connection per request);
#   - bulk: one download of SIZE MiB from a TCP source behind the tunnel, read to the end.
# Then it prints, per figure, the median over the rounds and the ratio gomux/rathole.
#
# usage: scripts/rathole-compare.sh [--rounds N] [--requests N] [--idle COUNT] [--bulk-mib SIZE]
#   --rounds N       rounds (default 3)
#   --requests N     requests per redis-benchmark command (default 40000)
#   --idle COUNT     idle clients held at once (default 2000)
#   --bulk-mib SIZE  size of the download in MiB (default 1024)
#
# Installs rathole 0.5.0 with `cargo install --locked` into target/rathole (once; see below for
# the one crate its lock file needs moved), builds
# gomux-tunnel in release mode; needs redis-server, redis-cli, redis-benchmark (Debian:
# apt-get install -y redis-server redis-tools), python3 and cargo. Writes the rathole configs
# itself. Every process it starts is stopped when it exits.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

rounds=3
requests=40000
idle=2000
bulk_mib=1024

usage() {
    sed -n '/^# usage:/,/^#   --bulk-mib/s/^# \{0,1\}//p' "$0"
}

while (($#)); do
    case "$1" in
    --rounds | --requests | --idle | --bulk-mib)
        if (($# < 2)); then
            echo "error: $1 needs a value" >&2
            exit 2
        fi
        case "$1" in
        --rounds) rounds=$2 ;;
        --requests) requests=$2 ;;
        --idle) idle=$2 ;;
        --bulk-mib) bulk_mib=$2 ;;
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

# shellcheck source=scripts/lib.sh
source scripts/lib.sh # the working directory is the repository's root
require_tools "Redis and its tools install on Debian/Ubuntu with:
    apt-get install -y redis-server redis-tools" \
    redis-server redis-cli redis-benchmark python3 cargo

# Every idle client is a socket in the client, in each end (two in rathole's server and in
# each gomux-tunnel end's side that faces a TCP peer) and in Redis.
needed=$((2 * idle + 1024))
if (($(ulimit -n) < needed)); then
    ulimit -n "$needed" 2>/dev/null || ulimit -n "$(ulimit -Hn)"
fi
if (($(ulimit -n) < needed)); then
    echo "error: $idle idle clients need $needed open files; the hard limit is $(ulimit -Hn)" >&2
    exit 1
fi

# ---------------------------------------------------------------------------------------------
# The tools
# ---------------------------------------------------------------------------------------------

rathole_root="${CARGO_TARGET_DIR:-target}/rathole"
rathole="$rathole_root/bin/rathole"
# rathole's published lock file pins time 0.3.29, which current rustc no longer compiles (a
# type annotations error in time's format_description): its source is installed with that one
# crate moved to 0.3.36 and everything else as locked.
if ! [ -x "$rathole" ]; then
    registry="${CARGO_HOME:-$HOME/.cargo}/registry/src"
    found=$(find "$registry" -maxdepth 2 -type d -name rathole-0.5.0 2>/dev/null | head -n 1)
    if [ -z "$found" ]; then
        # A manifest of its own that depends on it, so that cargo downloads and unpacks it.
        mkdir -p "$rathole_root/fetch/src"
        printf '[package]\nname = "fetch"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\nrathole = "=0.5.0"\n[workspace]\n' \
            >"$rathole_root/fetch/Cargo.toml"
        touch "$rathole_root/fetch/src/lib.rs"
        cargo fetch --manifest-path "$rathole_root/fetch/Cargo.toml"
        found=$(find "$registry" -maxdepth 2 -type d -name rathole-0.5.0 | head -n 1)
    fi
    rm -rf "$rathole_root/rathole-0.5.0"
    # (Made here too: with the source already unpacked, the fetch above did not make it, and a
    # copy into a folder that does not exist would become that folder.)
    mkdir -p "$rathole_root"
    cp -r "$found" "$rathole_root/"
    # Out of this repository's workspace.
    printf '\n[workspace]\n' >>"$rathole_root/rathole-0.5.0/Cargo.toml"
    (cd "$rathole_root/rathole-0.5.0" && cargo update -p time --precise 0.3.36)
    echo "==> cargo install --locked --path $rathole_root/rathole-0.5.0 --root $rathole_root"
    cargo install --locked --path "$rathole_root/rathole-0.5.0" --root "$rathole_root"
fi
build_tunnel
make_keys

# rathole's noise keys: the server's private key, and its public key for the client.
"$rathole" --genkey >"$work/noise.txt"
noise_private=$(awk '/Private Key/ { getline; print; exit }' "$work/noise.txt")
noise_public=$(awk '/Public Key/ { getline; print; exit }' "$work/noise.txt")

# The clients, the download source and the memory reading, in Python.
cat >"$work/helper.py" <<'PYTHON'
import socket, sys, time

def source(port):
    """Serves downloads: reads a byte count on a line, sends that many bytes, closes."""
    listener = socket.create_server(("127.0.0.1", port))
    block = bytes(1 << 20)
    while True:
        conn, _ = listener.accept()
        with conn:
            line = b""
            while not line.endswith(b"\n"):
                part = conn.recv(64)
                if not part:
                    break
                line += part
            left = int(line or b"0")
            try:
                while left > 0:
                    sent = conn.send(block[: min(left, len(block))])
                    left -= sent
            except OSError:
                pass

def download(port, size):
    """One download of `size` bytes; prints MiB/s."""
    started = time.monotonic()
    conn = socket.create_connection(("127.0.0.1", port))
    conn.sendall(b"%d\n" % size)
    buffer, got = bytearray(1 << 20), 0
    while True:
        n = conn.recv_into(buffer)
        if n == 0:
            break
        got += n
    elapsed = time.monotonic() - started
    if got != size:
        sys.exit(f"error: downloaded {got} bytes of {size}")
    print(f"{size / elapsed / (1 << 20):.1f}")

def rss(pids):
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total

def ping_clients(port, count):
    clients = []
    for _ in range(count):
        conn = socket.create_connection(("127.0.0.1", port))
        conn.sendall(b"PING\r\n")
        answer = b""
        while not answer.endswith(b"\r\n"):
            part = conn.recv(64)
            if not part:
                sys.exit("error: a client was closed before its PONG")
            answer += part
        if answer != b"+PONG\r\n":
            sys.exit(f"error: answered {answer!r}")
        clients.append(conn)
    return clients

def idle(port, count, pids):
    """Prints the ends' growth in resident bytes per idle client."""
    for conn in ping_clients(port, 50):
        conn.close()
    time.sleep(1)
    before = rss(pids)
    clients = ping_clients(port, count)
    time.sleep(1)
    after = rss(pids)
    print((after - before) // count)
    for conn in clients:
        conn.close()

command = sys.argv[1]
if command == "source":
    source(int(sys.argv[2]))
elif command == "download":
    download(int(sys.argv[2]), int(sys.argv[3]))
elif command == "idle":
    idle(int(sys.argv[2]), int(sys.argv[3]), [int(p) for p in sys.argv[4:]])
PYTHON

# ---------------------------------------------------------------------------------------------
# Redis, the download source, and the tunnels in front of them
# ---------------------------------------------------------------------------------------------

redis_port=$(free_port)
source_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
    --maxclients $((idle + 1000)) --logfile "$work/redis.log" &
pids+=($!)
python3 "$work/helper.py" source "$source_port" &
pids+=($!)

# await_ready PORT TARGET_PORT: waits until a connection to PORT reaches the target (a PING
# answered for Redis, a one-byte download for the source).
await_ready() {
    local port=$1 target=$2
    for _ in $(seq 200); do
        if [ "$target" = "$redis_port" ]; then
            [ "$(redis-cli -h 127.0.0.1 -p "$port" PING 2>/dev/null)" = PONG ] && return 0
        else
            python3 "$work/helper.py" download "$port" 1 >/dev/null 2>&1 && return 0
        fi
        sleep 0.05
    done
    echo "error: nothing answers through port $port" >&2
    return 1
}

# start_pair TOOL TRANSPORT TARGET_PORT: starts the two ends of TOOL (gomux or rathole) with
# TRANSPORT (plain or encrypted) in front of the target; sets $port (where clients connect)
# and $pair (the two ends' process ids). `direct` is the target itself.
start_pair() {
    local tool=$1 transport=$2 target=$3 middle
    pair=()
    if [ "$tool" = direct ]; then
        port=$target
        return 0
    fi
    port=$(free_port)
    middle=$(free_port)
    if [ "$tool" = gomux ]; then
        local entry_options=("${entry_security[@]}") exit_options=("${exit_security[@]}")
        if [ "$transport" = plain ]; then
            entry_options=(--insecure)
            exit_options=(--insecure)
        fi
        # The exit serves 1024 streams at once by default; rathole has no such cap, and the
        # idle figure holds $idle clients at once.
        RUST_LOG=warn "$tunnel" exit --listen "127.0.0.1:$middle" --target "127.0.0.1:$target" \
            --max-streams $((idle + 1000)) "${exit_options[@]}" >/dev/null 2>>"$work/gomux-exit.log" &
        pair+=($!)
        RUST_LOG=warn "$tunnel" entry --listen "127.0.0.1:$port" --exit "127.0.0.1:$middle" \
            "${entry_options[@]}" >/dev/null 2>>"$work/gomux-entry.log" &
        pair+=($!)
    else
        local type=tcp server_noise="" client_noise=""
        if [ "$transport" = encrypted ]; then
            type=noise
            server_noise=$'[server.transport.noise]\nlocal_private_key = "'$noise_private'"'
            client_noise=$'[client.transport.noise]\nremote_public_key = "'$noise_public'"'
        fi
        cat >"$work/rathole-server.toml" <<TOML
[server]
bind_addr = "127.0.0.1:$middle"
[server.transport]
type = "$type"
[server.transport.tcp]
nodelay = true
$server_noise
[server.services.bench]
token = "a token for the benchmark"
bind_addr = "127.0.0.1:$port"
TOML
        cat >"$work/rathole-client.toml" <<TOML
[client]
remote_addr = "127.0.0.1:$middle"
[client.transport]
type = "$type"
[client.transport.tcp]
nodelay = true
$client_noise
[client.services.bench]
token = "a token for the benchmark"
local_addr = "127.0.0.1:$target"
TOML
        RUST_LOG=warn "$rathole" --server "$work/rathole-server.toml" \
            >>"$work/rathole-server.log" 2>&1 &
        pair+=($!)
        RUST_LOG=warn "$rathole" --client "$work/rathole-client.toml" \
            >>"$work/rathole-client.log" 2>&1 &
        pair+=($!)
    fi
    pids+=("${pair[@]}")
    await_ready "$port" "$target"
}

stop_pair() {
    local pid
    for pid in "${pair[@]}"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    pair=()
}

echo
echo "machine:  $(lscpu | sed -n 's/^Model name: *//p' | head -n 1), $(nproc) cores"
echo "load:     $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min averages, at the start)"
echo "tools:    $("$rathole" --version | head -n 1), gomux-tunnel (release), $(redis-server --version | cut -d' ' -f1-3)"
echo "sizes:    $rounds rounds, redis-benchmark -n $requests -c 50, $idle idle clients, download $bulk_mib MiB"

# ---------------------------------------------------------------------------------------------
# The rounds
# ---------------------------------------------------------------------------------------------

results="$work/results.tsv"
: >"$results"

# record ROUND TOOL TRANSPORT FIGURE VALUE
record() {
    printf '%s\t%s\t%s\t%s\t%s\n' "$@" >>"$results"
    printf '  %-8s %-10s %-16s %s\n' "$2" "$3" "$4" "$5"
}

# measure ROUND TOOL TRANSPORT: every figure of one tool, each on fresh ends.
measure() {
    local round=$1 tool=$2 transport=$3 keepalive line
    if [ "$tool" != direct ]; then
        start_pair "$tool" "$transport" "$redis_port"
        record "$round" "$tool" "$transport" idle-bytes \
            "$(python3 "$work/helper.py" idle "$port" "$idle" "${pair[@]}")"
        stop_pair
    fi
    start_pair "$tool" "$transport" "$redis_port"
    for keepalive in 1 0; do
        while read -r line; do
            # "SET: 87719.30 requests per second, p50=0.287 msec"
            record "$round" "$tool" "$transport" "redis-k$keepalive-${line%%:*}" \
                "$(awk '{ print $2 }' <<<"$line")"
        done < <(redis-benchmark -h 127.0.0.1 -p "$port" -q -n "$requests" -c 50 \
            -t ping,set,get -k "$keepalive" 2>/dev/null | tr '\r' '\n' | grep 'requests per second')
    done
    stop_pair
    start_pair "$tool" "$transport" "$source_port"
    record "$round" "$tool" "$transport" bulk-MiB/s \
        "$(python3 "$work/helper.py" download "$port" $((bulk_mib << 20)))"
    stop_pair
}

tools=(direct gomux rathole)
for round in $(seq "$rounds"); do
    echo
    echo "==> round $round of $rounds"
    for i in 0 1 2; do
        tool=${tools[$(((i + round) % 3))]}
        if [ "$tool" = direct ]; then
            measure "$round" direct none
        else
            measure "$round" "$tool" plain
            measure "$round" "$tool" encrypted
        fi
    done
done

# ---------------------------------------------------------------------------------------------
# Medians and ratios
# ---------------------------------------------------------------------------------------------

echo
python3 - "$results" <<'PYTHON'
import statistics, sys
from collections import defaultdict

values = defaultdict(list)
figures = []
for line in open(sys.argv[1]):
    _, tool, transport, figure, value = line.rstrip("\n").split("\t")
    values[tool, transport, figure].append(float(value))
    if figure not in figures:
        figures.append(figure)

def median(tool, transport, figure):
    found = values.get((tool, transport, figure))
    return statistics.median(found) if found else None

def show(value, figure):
    if value is None:
        return "-"
    return f"{value:,.0f}" if figure != "bulk-MiB/s" else f"{value:,.1f}"

print("| figure (median of the rounds) | transport | direct | gomux-tunnel | rathole | gomux/rathole |")
print("|---|---|---:|---:|---:|---:|")
for figure in figures:
    for transport in ("plain", "encrypted"):
        gomux = median("gomux", transport, figure)
        rathole = median("rathole", transport, figure)
        direct = median("direct", "none", figure)
        ratio = f"{gomux / rathole:.2f}" if gomux is not None and rathole else "-"
        print(f"| {figure} | {transport} | {show(direct, figure)} | {show(gomux, figure)} "
              f"| {show(rathole, figure)} | {ratio} |")
PYTHON
echo
echo "idle-bytes: growth of the two ends' resident memory per idle client (lower is better);"
echo "redis-*: requests per second; bulk: MiB/s of one download."
