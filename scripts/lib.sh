# Shared by the scripts that run the tunnel tool (gomux-tunnel) against real programs (sourced, not run):
# the tool check, a work directory cleaned up on exit with the processes started, free
# loopback ports, and waiting for a log line.

# require_tools HINT TOOL...: exits with HINT unless every TOOL is on PATH.
require_tools() {
    local hint=$1 missing=() tool
    shift
    for tool in "$@"; do
        command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
    done
    if ((${#missing[@]})); then
        echo "error: not found on PATH: ${missing[*]}" >&2
        echo "$hint" >&2
        echo "and cargo with rustup (https://rustup.rs)." >&2
        exit 1
    fi
}

work=$(mktemp -d)
# Processes the script starts; each is stopped on exit (see also $work/pids in cleanup).
pids=()

# On every exit: stop what we started, and on failure show the end of each log first.
cleanup() {
    local status=$?
    if ((status != 0)); then
        for log in "$work"/*.log; do
            [ -s "$log" ] || continue
            echo "--- last lines of $(basename "$log")" >&2
            tail -n 20 "$log" >&2
        done
    fi
    # A process started in a subshell (a command substitution) cannot add itself to $pids:
    # its pid is in $work/pids instead.
    if [ -f "$work/pids" ]; then
        while read -r pid; do
            pids+=("$pid")
        done <"$work/pids"
    fi
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT

# A loopback port nothing listens on, below Linux's ephemeral range (32768 and up) so that
# outgoing connections do not take it meanwhile, and different from the ports already chosen.
chosen=" "
free_port() {
    local port
    for _ in $(seq 200); do
        port=$((20000 + RANDOM % 12000))
        [[ $chosen == *" $port "* ]] && continue
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            chosen+="$port "
            echo "$port"
            return 0
        fi
    done
    echo "error: found no free loopback port" >&2
    return 1
}

# await_log LOG TEXT [COUNT]: waits until LOG has at least COUNT (default 1) lines containing
# TEXT.
await_log() {
    local log=$1 text=$2 count=${3:-1}
    for _ in $(seq 200); do
        if (($(grep -cF "$text" "$log" 2>/dev/null || true) >= count)); then
            return 0
        fi
        sleep 0.05
    done
    echo "error: no \"$text\" (x$count) in $(basename "$log")" >&2
    return 1
}

# The tunnel tool, built in release mode: sets $tunnel to its path.
build_tunnel() {
    echo "==> cargo build --release -p gomux-tunnel"
    cargo build --release -p gomux-tunnel
    tunnel="${CARGO_TARGET_DIR:-target}/release/gomux-tunnel"
}

# make_keys: a key pair for each end in $work/keys/{entry,exit}, and the options each end
# runs with to pin the other: $entry_security and $exit_security (arrays).
make_keys() {
    local entry_fp exit_fp
    entry_fp=$("$tunnel" keygen --out "$work/keys/entry")
    exit_fp=$("$tunnel" keygen --out "$work/keys/exit")
    entry_security=(--key "$work/keys/entry" --peer-fingerprint "$exit_fp")
    exit_security=(--key "$work/keys/exit" --peer-fingerprint "$entry_fp")
}
