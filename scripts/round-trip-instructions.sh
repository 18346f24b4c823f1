#!/usr/bin/env bash
# Instructions executed in user space per round trip of a 64-byte message, raw loopback TCP and
# one gomux stream, counted by callgrind: a figure that does not move with the machine's load,
# for comparing two builds where timing cannot tell a few per cent apart.
#
#   scripts/round-trip-instructions.sh [--size BYTES]
#
# Runs examples/round_trips.rs under `valgrind --tool=callgrind` at two counts (2,000 and 6,000
# round trips) and divides the difference by 4,000, which leaves out the setup. The kernel's
# work (the system calls, the loopback stack) is not counted: the two modes make about as many
# system calls per message (BENCHMARK-HISTORY.md). Callgrind counts each iteration of a
# `rep`-prefixed string instruction (memset, memcpy of some sizes) as one instruction, so a
# large clear or copy weighs more here than on the CPU.
#
# Needs valgrind (Debian: apt-get install valgrind). Prints one line per mode, then the ratio.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

size=64
while (($#)); do
    case $1 in
        --size) size=$2; shift 2 ;;
        *) echo "usage: $0 [--size BYTES]" >&2; exit 2 ;;
    esac
done

command -v valgrind >/dev/null || { echo "error: valgrind not found (apt-get install valgrind)" >&2; exit 1; }

cargo build --release --example round_trips >&2
program=${CARGO_TARGET_DIR:-target}/release/examples/round_trips
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# collected MODE COUNT: the instructions callgrind counted for the whole run (the "totals:"
# line of its output file); fails, showing the end of valgrind's log, without one.
collected() {
    local file=$out/$1.$2 total
    if ! valgrind --tool=callgrind --callgrind-out-file="$file" --log-file="$file.log" \
        "$program" "$1" --count "$2" --size "$size" >/dev/null; then
        echo "error: valgrind $program $1 --count $2 failed:" >&2
        tail -n 5 "$file.log" >&2
        exit 1
    fi
    total=$(sed -n 's/^totals: *\([0-9][0-9]*\)$/\1/p' "$file")
    if ! [[ $total =~ ^[0-9]+$ ]]; then
        echo "error: no instruction count in $file" >&2
        exit 1
    fi
    echo "$total"
}

declare -A per_trip
for mode in tcp gomux; do
    low=$(collected "$mode" 2000)
    high=$(collected "$mode" 6000)
    per_trip[$mode]=$(((high - low) / 4000))
    printf '%-6s %8d instructions per round trip of %d bytes\n' "$mode" "${per_trip[$mode]}" "$size"
done
awk -v g="${per_trip[gomux]}" -v t="${per_trip[tcp]}" \
    'BEGIN { printf "gomux / tcp: %.2f\n", g / t }'
