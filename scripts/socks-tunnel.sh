#!/usr/bin/env bash
# The SOCKS5 mode of the gomux tunnel tool (tunnel/, gomux-tunnel), as its command line runs
# it in its default, pinned TLS between the ends, with curl in front and a real HTTP server
# behind.
#
# Builds the tunnel, serves a directory of files with `python3 -m http.server` on loopback, and
# fetches every file with `curl --socks5-hostname`, all at once, checking each byte for byte:
#
#   1. reverse: the exit dials the entry (`exit --entry ADDR --socks`, the agent behind NAT)
#      and the entry listens for SOCKS clients (`entry --listen ADDR --accept-exit ADDR`);
#   2. the same after the exit is stopped and started again: it dials in anew;
#   3. forward: the entry dials the exit (`entry --exit ADDR`, `exit --listen ADDR --socks`).
#
# usage: scripts/socks-tunnel.sh [--requests N]
#   --requests N   curl requests at once in each round (default 24)
#
# Needs curl and python3 (Debian: apt-get install -y curl python3) and cargo; installs
# nothing. Every process it starts is stopped when it exits. The tunnel logs at RUST_LOG
# (default info); they are shown if something fails.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

requests=24

usage() {
    sed -n '/^# usage:/,/^#   --requests/s/^# \{0,1\}//p' "$0"
}

while (($#)); do
    case "$1" in
    --requests)
        if (($# < 2)) || ! [[ $2 =~ ^[1-9][0-9]*$ ]]; then
            echo "error: --requests needs a positive number" >&2
            exit 2
        fi
        requests=$2
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
require_tools "curl and python3 install on Debian/Ubuntu with:
    apt-get install -y curl python3" curl python3 cargo

# Waits until something accepts connections on a loopback port.
await_port() {
    local port=$1 what=$2
    for _ in $(seq 200); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            return 0
        fi
        sleep 0.05
    done
    echo "error: $what does not listen on port $port" >&2
    return 1
}

# ---------------------------------------------------------------------------------------------
# The HTTP server and its files
# ---------------------------------------------------------------------------------------------

build_tunnel
make_keys

mkdir "$work/www"
echo "hello through the tunnel" >"$work/www/hello.txt"
head -c 1000 /dev/urandom >"$work/www/small.bin"
head -c $((1024 * 1024)) /dev/urandom >"$work/www/medium.bin"
head -c $((8 * 1024 * 1024)) /dev/urandom >"$work/www/large.bin"
files=(hello.txt small.bin medium.bin large.bin)

http_port=$(free_port)
python3 -m http.server "$http_port" --bind 127.0.0.1 --directory "$work/www" \
    >"$work/http.log" 2>&1 &
pids+=($!)
await_port "$http_port" "the HTTP server"

export RUST_LOG="${RUST_LOG:-info}"

# fetch_all NAME SOCKS_PORT: $requests curl requests at once through the SOCKS5 proxy on
# SOCKS_PORT, the files in turn, every other one by host name (resolved by the exit) and the
# rest by IPv4 address; each body is compared with its file.
fetch_all() {
    local name=$1 socks_port=$2 failed=0 i file host
    local curls=()
    mkdir -p "$work/$name"
    for ((i = 0; i < requests; i++)); do
        file=${files[i % ${#files[@]}]}
        if ((i % 2 == 0)); then host=localhost; else host=127.0.0.1; fi
        # -q skips any ~/.curlrc; without the proxy variables, a NO_PROXY cannot route the
        # request around the tunnel.
        env -u no_proxy -u NO_PROXY -u all_proxy -u ALL_PROXY -u http_proxy \
            curl -q --silent --show-error --fail --max-time 120 \
            --socks5-hostname "127.0.0.1:$socks_port" \
            --output "$work/$name/$i" "http://$host:$http_port/$file" &
        curls+=($!)
    done
    for pid in "${curls[@]}"; do
        wait "$pid" || failed=$((failed + 1))
    done
    if ((failed)); then
        echo "error: $name: $failed of $requests curl requests failed" >&2
        return 1
    fi
    for ((i = 0; i < requests; i++)); do
        file=${files[i % ${#files[@]}]}
        if ! cmp -s "$work/www/$file" "$work/$name/$i"; then
            echo "error: $name: request $i ($file) came back different" >&2
            return 1
        fi
    done
    local bytes
    bytes=$(cat "$work/$name"/* | wc -c)
    echo "$name: $requests curl requests at once, $bytes bytes, every body identical"
}

# ---------------------------------------------------------------------------------------------
# 1 and 2: reverse, the exit dialling the entry
# ---------------------------------------------------------------------------------------------

socks_port=$(free_port)
exits_port=$(free_port)
echo
echo "==> tunnel entry --listen 127.0.0.1:$socks_port --accept-exit 127.0.0.1:$exits_port"
echo "==> tunnel exit --entry 127.0.0.1:$exits_port --socks"
"$tunnel" entry --listen "127.0.0.1:$socks_port" --accept-exit "127.0.0.1:$exits_port" \
    "${entry_security[@]}" >/dev/null 2>"$work/reverse-entry.log" &
pids+=($!)
await_log "$work/reverse-entry.log" "entry listening"
"$tunnel" exit --entry "127.0.0.1:$exits_port" --socks "${exit_security[@]}" 2>"$work/reverse-exit.log" &
pids+=($!)
exit_pid=$!
await_log "$work/reverse-entry.log" "exit connected"
fetch_all reverse "$socks_port"

# The agent goes away and comes back: the entry turns to its new connection.
kill "$exit_pid"
wait "$exit_pid" 2>/dev/null || true
await_log "$work/reverse-entry.log" "exit disconnected"
"$tunnel" exit --entry "127.0.0.1:$exits_port" --socks "${exit_security[@]}" 2>>"$work/reverse-exit.log" &
pids+=($!)
await_log "$work/reverse-entry.log" "exit connected" 2
fetch_all reverse-again "$socks_port"

# ---------------------------------------------------------------------------------------------
# 3: forward, the entry dialling the exit
# ---------------------------------------------------------------------------------------------

socks_port=$(free_port)
exit_port=$(free_port)
echo
echo "==> tunnel exit --listen 127.0.0.1:$exit_port --socks"
echo "==> tunnel entry --listen 127.0.0.1:$socks_port --exit 127.0.0.1:$exit_port"
"$tunnel" exit --listen "127.0.0.1:$exit_port" --socks "${exit_security[@]}" >/dev/null 2>"$work/forward-exit.log" &
pids+=($!)
await_log "$work/forward-exit.log" "exit listening"
"$tunnel" entry --listen "127.0.0.1:$socks_port" --exit "127.0.0.1:$exit_port" \
    "${entry_security[@]}" >/dev/null 2>"$work/forward-entry.log" &
pids+=($!)
await_log "$work/forward-entry.log" "connected to the exit"
fetch_all forward "$socks_port"

# Each run on one gomux connection, and no warnings but the one the restart caused.
connections=$(grep -c 'connected to the exit' "$work/forward-entry.log" || true)
if [ "$connections" != 1 ]; then
    echo "error: the forward entry made $connections connections to the exit, not 1" >&2
    exit 1
fi
if grep WARN "$work"/*.log | grep -v 'reverse-entry.log.*exit disconnected'; then
    echo "error: the tunnel logged the warnings above" >&2
    exit 1
fi
echo
echo "socks-tunnel: all checks passed"
