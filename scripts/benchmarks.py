"""Writes BENCHMARKS.md (on stdout) from the figures scripts/benchmarks.sh collected.

usage: python3 scripts/benchmarks.py WORK_DIR NOTES_FILE

WORK_DIR holds what the measuring script wrote:

- results: "round key value" lines, one per figure and round;
- meta: "key<TAB>value" lines: the machine, the time, the commit and the commands run;
- redis-K-R.txt: scripts/redis-tunnel.sh's output with K gomux connections, run R (or
  redis-K-R.failed: why there is none);
- security.txt: scripts/tunnel-security.sh's output (or security.failed: why there is none);
- order: "round<TAB>command<TAB>rows in order" lines, the order the rows of a round ran in;
- perf-NAME.txt: the top of a perf report (or perf-NAME.failed), perf-NAME.samples;
- alloc.txt: the output of the allocation test (alloc.failed if it failed);
- loaded.txt: the table of benches/latency_under_load.rs (loaded.failed if it failed).
- shares.txt: the table of benches/shares.rs (shares.failed if it failed).
- idle-sessions.txt: the output of benches/idle_sessions.rs (idle-sessions.failed if it failed).

NOTES_FILE (may be empty: no notes) is Markdown included as it is. Every figure printed comes
from these files; the text around them holds none of its own.
"""

import math
import os
import re
import statistics
import sys

# The targets the figures are held against: (bound, direction), read "at least" for ">=".
TARGET_LIMIT = 0.90
TARGET_GO = 2.0
TARGET_YAMUX = 3.0
# Go's xtaci/smux and hashicorp/yamux, every byte hashed, like Go gomux's rows.
TARGET_SMUX = 1.5
TARGET_GO_YAMUX = 1.5
TARGET_RTT = 1.05
TARGET_ECHO = 4.0
TARGET_REDIS = 1.0
TARGET_REDIS_GO = 1.5
TARGET_IDLE = 256
TARGET_ALLOC = 0.0
TARGET_IDLE_SESSION = 2048
TARGET_IDLE_SESSION_GO = 10.0


# The Go multiplexers beside Go gomux: (key of their rows, name, target ratio).
GO_MUXES = (("go-smux", "Go smux", TARGET_SMUX), ("go-yamux", "hashicorp/yamux", TARGET_GO_YAMUX))


class Run:
    """Everything one run measured."""

    def __init__(self, work):
        self.work = work
        self.values = {}  # (round, key) -> float
        with open(os.path.join(work, "results")) as results:
            for line in results:
                round_, key, value = line.split()
                self.values[int(round_), key] = float(value)
        self.meta = {}
        with open(os.path.join(work, "meta")) as meta:
            for line in meta:
                key, _, value = line.rstrip("\n").partition("\t")
                self.meta[key] = value
        self.rounds = int(self.meta["rounds"])
        self.streams = self.meta["streams"].split()
        # The limit beside each stream count's rows: the better of iperf3 and the speed tool's
        # tcp mode, measured with them.
        for r in range(1, self.rounds + 1):
            for k in self.streams:
                limits = [self.values[r, f"tp-{k}-{w}"] for w in ("iperf3", "tcp") if (r, f"tp-{k}-{w}") in self.values]
                if limits:
                    self.values[r, f"tp-{k}-limit"] = max(limits)

    def file(self, name):
        """The content of a file of the work directory, or None."""
        path = os.path.join(self.work, name)
        if not os.path.exists(path):
            return None
        with open(path, errors="replace") as f:
            return f.read()

    def per_round(self, key):
        return [self.values[r, key] for r in range(1, self.rounds + 1) if (r, key) in self.values]

    def median(self, key):
        values = self.per_round(key)
        return statistics.median(values) if values else None

    def ratios(self, top, bottom):
        """top / bottom within each round."""
        return [
            self.values[r, top] / self.values[r, bottom]
            for r in range(1, self.rounds + 1)
            if (r, top) in self.values and (r, bottom) in self.values and self.values[r, bottom] > 0
        ]

    def ratio(self, top, bottom):
        """The median of the ratios within each round, or None."""
        values = self.ratios(top, bottom)
        return statistics.median(values) if values else None

    def ratio_text(self, top, bottom):
        """"median (min–max)" of the ratios within each round."""
        values = self.ratios(top, bottom)
        if not values:
            return "–"
        text = r2(statistics.median(values))
        if len(values) > 1:
            text += f" ({r2(min(values))}–{r2(max(values))})"
        return text

    def row(self, label, keys, spec, ratios=()):
        """A table row: the label, the medians of keys formatted with spec, then the ratios
        (top, bottom) within each round."""
        return [label] + [fmt(self.median(k), spec) for k in keys] + [self.ratio_text(*r) for r in ratios]

    def command(self, key):
        return self.meta.get("command-" + key, "")


def r2(x):
    """Two decimals, or two significant digits for a ratio far below 1."""
    return f"{x:.2f}" if x >= 0.1 else f"{x:.2g}"


def streams(k):
    return f"{k} stream" if k == "1" else f"{k} streams"


def fmt(x, spec):
    return "–" if x is None else format(x, spec)


def table(header, rows, align=None):
    """A Markdown table; numbers are right-aligned unless align says otherwise."""
    align = align or ["---"] + ["--:"] * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def code_block(text):
    return "```sh\n" + text + "\n```"


def out(*parts):
    print(*parts, sep="\n")


def section(run, title, prose, commands, *tables):
    """A measurement's section: its title, what it measures, the commands that measured it (keys
    of run's commands), then its tables."""
    out(f"## {title}", "", *prose, "", code_block("\n".join(run.command(c) for c in commands)), "")
    for t in tables:
        out(t, "")


# ---------------------------------------------------------------------------------------------
# The instructions a round trip executes: scripts/round-trip-instructions.sh's lines.

def instructions_paragraph(run):
    """The instructions a round trip executes in user space (scripts/round-trip-instructions.sh's
    "MODE N instructions per round trip…" lines), counted once: they do not move with the load."""
    failed = run.file("instructions.failed")
    if failed:
        out("Instructions per round trip not counted: " + failed.strip().replace("\n", "; "), "")
        return
    counts = {}
    for line in (run.file("instructions.txt") or "").splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[2] == "instructions":
            counts[parts[0]] = int(parts[1])
    tcp, gomux = counts.get("tcp"), counts.get("gomux")
    if not tcp or not gomux:
        return
    out("What a round trip executes in user space, counted by callgrind (the last command above,",
        "once: the count does not move with the machine's load): "
        f"raw TCP {tcp:,}, gomux {gomux:,} instructions ({gomux / tcp:.2f} ×).", "")


# ---------------------------------------------------------------------------------------------
# The tunnel with pinned TLS: scripts/tunnel-security.sh's "NAME relays=X plain=Y tls=Z" lines.

def security_section(run):
    section(
        run, "The tunnel with pinned TLS",
        ["The tunnel tool with mutual TLS 1.3 between its ends (its default), against the same",
         "tunnel over plain TCP (`--insecure`) and two plain TCP relays in a row, all three started",
         "side by side in one run: `redis-benchmark -k 1 -c 50` (requests per second) and one",
         "iperf3 stream (Mbit/s received):"],
        ["security"],
    )
    failed = run.file("security.failed")
    if failed:
        out("Not measured: " + failed.strip().replace("\n", "; "), "")
        return
    rows = []
    for line in (run.file("security.txt") or "").splitlines():
        fields = line.split()
        if not fields or "=" not in line or ":" in fields[0]:
            continue
        try:
            values = dict((k, float(v)) for k, v in (f.split("=", 1) for f in fields[1:]))
        except ValueError:
            continue
        relays, plain, tls = values.get("relays", 0), values.get("plain", 0), values.get("tls", 0)
        if relays > 0 and plain > 0:
            rows.append([fields[0], f"{relays:.0f}", f"{plain:.0f}", f"{tls:.0f}", r2(tls / plain), r2(tls / relays)])
    out(table(["measure", "relays", "plain tunnel", "TLS tunnel", "TLS ÷ plain", "TLS ÷ relays"],
              rows, ["---", "--:", "--:", "--:", "--:", "--:"]), "")


# ---------------------------------------------------------------------------------------------
# Redis: scripts/redis-tunnel.sh's tables.


def redis_tables(text):
    """{"-k 1": [(command, direct, relay, tunnel, tunnel p50)], "-k 0": [...]} from its output."""
    tables = {}
    current = None
    for line in text.splitlines():
        if line.startswith("keep-alive connections"):
            current = tables.setdefault("-k 1", [])
        elif line.startswith("a new connection per request"):
            current = tables.setdefault("-k 0", [])
        elif current is not None and line.startswith("|"):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            if len(cells) >= 8 and re.fullmatch(r"[0-9.]+", cells[1]):
                current.append((cells[0], float(cells[1]), float(cells[2]), float(cells[3]), cells[7]))
        elif not line.strip():
            current = None
    return tables


def redis_go_table(text):
    """[(command, relays, tunnel, Go tunnel)] of the keep-alive table that sets the tunnel beside
    a Go gomux tunnel (redis-tunnel.sh --go)."""
    rows = []
    current = False
    for line in text.splitlines():
        if line.startswith("the Rust tunnel and a Go gomux tunnel, keep-alive"):
            current = True
        elif current and line.startswith("|"):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            if len(cells) >= 5 and re.fullmatch(r"[0-9.]+", cells[1]):
                rows.append((cells[0], float(cells[1]), float(cells[2]), float(cells[3])))
        elif not line.strip():
            current = False
    return rows


def redis_plain_summary(runs):
    """The plain runs' rows: [(command, [(direct, relays, tunnel, Go tunnel)])], one tuple per
    run that measured the command all four ways, in the order of the first such run."""
    commands = {}
    for text in runs:
        direct = {c: d for c, d, _, _, _ in redis_tables(text).get("-k 1", [])}
        for command, relay, tunnel, go in redis_go_table(text):
            if command in direct and direct[command] > 0 and relay > 0 and go > 0:
                commands.setdefault(command, []).append((direct[command], relay, tunnel, go))
    return list(commands.items())


def redis_summary(runs, mode):
    """The rows of one -k mode over the runs of one K: [(command, [(direct, relay, tunnel)])],
    in the order of the first run that has the command."""
    commands = {}
    for run_tables in runs:
        for command, direct, relay, tunnel, _ in run_tables.get(mode, []):
            if direct > 0 and relay > 0:
                commands.setdefault(command, []).append((direct, relay, tunnel))
    return list(commands.items())


def median_range(values, spec):
    """"median (min–max)" of values formatted with spec, or the one value."""
    text = format(statistics.median(values), spec)
    if len(values) > 1:
        text += f" ({format(min(values), spec)}–{format(max(values), spec)})"
    return text


def ratio_range(values):
    text = r2(statistics.median(values))
    if len(values) > 1:
        text += f" ({r2(min(values))}–{r2(max(values))})"
    return text


def perf_row(line, cells):
    """A perf report line ("12.34%  object  [.] symbol") as table cells, code-formatted."""
    parts = line.split(None, cells - 1)
    if len(parts) < cells:
        return None
    text = [p.strip() for p in parts[1:]]
    if len(text[-1]) > 110:
        text[-1] = text[-1][:109] + "…"
    return [parts[0]] + ["`" + t.replace("|", "\\|") + "`" for t in text]


def geometric_mean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


# ---------------------------------------------------------------------------------------------
# The document.


def bench_table(run, key, header, align, text, row, remarked):
    """A bench's own table: `row(cells)` turns each line that is not a comment into a row (or
    None), comments for which `remarked(line)` holds become remarks, and a failed bench says so."""
    rows, remarks = [], []
    for line in text.splitlines():
        if line.startswith("#"):
            if remarked(line):
                remarks.append(line.lstrip("# "))
            continue
        cells = row(line.split())
        if cells is not None:
            rows.append(cells)
    out(table(header, rows, align), "")
    failed = run.file(f"{key}.failed")
    if failed is not None:
        remarks.append("the bench failed: " + " ".join(failed.split()))
    for remark in remarks:
        out(f"- {remark}")
    if remarks:
        out("")


def loaded_section(run):
    """Latency under load over the emulated link: the bench's rows, as it printed them."""
    text = run.file("loaded.txt")
    if text is None:
        return
    section(
        run, "Latency under load over an emulated link",
        ["A 64-byte ping every 10 ms on one stream, echoed, while another stream of the same",
         "session sends 64 KiB writes as fast as it can, through a relay that emulates a shared",
         "serial link (R Mbit/s, D ms each way). The relay is `queue` (a 16 KiB queue in front",
         "of the line, 8 KiB receive buffers) or `reads` (16 KiB receive buffers, reads of up to",
         "16 KiB put on the line one at a time per connection, no other queue). `idle` is the",
         "pings alone on plain TCP; `tcp` is two plain TCP connections; `lowat` is the client's",
         "`TCP_NOTSENT_LOWAT` (`off`: the kernel's default; `conf`: `gomux::tcp::configure`).",
         "Round trips in ms, the bulk rate the receiver saw in MiB/s, and each multiplexer's",
         "figures as ratios to `tcp`'s of the same run:"],
        ["loaded"],
    )
    bench_table(run, "loaded",
                ["link", "relay", "mode", "lowat", "pings", "p50", "p99", "bulk MiB/s"],
                ["---", "---", "---", "--:", "--:", "--:", "--:", "--:"], text,
                lambda cells: cells if len(cells) == 8 else None,
                lambda line: ("skipped" in line or "failed" in line or "ratio" in line
                              or "NOTSENT_LOWAT" in line))


def shares_section(run):
    """How one session's bulk streams share the emulated link: the bench's rows."""
    text = run.file("shares.txt")
    if text is None:
        return
    section(
        run, "Bulk streams sharing an emulated link",
        ["One gomux session through the same emulated link (both sockets set up with",
         "`gomux::tcp::configure`), each stream writing 64 KiB at a time as fast as it can: eight",
         "streams at one priority, then a stream at priority 10 beside one at 0. Per-stream rates",
         "in MiB/s over the window, the largest and smallest over their mean, and the total:"],
        ["shares"],
    )
    bench_table(run, "shares",
                ["link", "streams", "rates MiB/s", "max/mean", "min/mean", "total MiB/s"],
                ["---", "---", "---", "--:", "--:", "--:"], text,
                lambda cells: ([cells[0], cells[1], " ".join(cells[2:-3])] + cells[-3:]
                               if len(cells) >= 6 else None),
                lambda line: "failed" in line or "priority-10" in line)


# Sections measured in sittings of their own (scripts/rathole-compare.sh, hand-run
# comparisons) sit between these markers in BENCHMARKS.md: a new run keeps them as they are,
# since it does not measure them.
KEPT_START = "<!-- kept: measured apart from this script's run -->"
KEPT_END = "<!-- end of kept -->"


def kept_sections(path):
    """The kept sections of the document at `path` (if there is one), markers included."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return []
    blocks, at = [], 0
    while (start := text.find(KEPT_START, at)) >= 0:
        end = text.find(KEPT_END, start)
        if end < 0:
            break
        blocks.append(text[start:end + len(KEPT_END)])
        at = end + len(KEPT_END)
    return blocks


def main():
    work, notes = sys.argv[1], sys.argv[2]
    previous = sys.argv[3] if len(sys.argv) > 3 else None
    run = Run(work)
    meta = run.meta
    counts = run.streams

    redis_results = {}  # K -> the tables of every run that has them, or why none has
    redis_runs = int(meta.get("redis-runs", "1"))
    if meta.get("redis") == "true":
        for k in meta.get("redis-connections", "").split():
            runs, failures = [], []
            for r in range(1, redis_runs + 1):
                failed = run.file(f"redis-{k}-{r}.failed")
                if failed:
                    failures.append(f"run {r}: {failed.strip()}")
                else:
                    runs.append(redis_tables(run.file(f"redis-{k}-{r}.txt") or ""))
            # A run that failed leaves the figures of the others standing, but no range that
            # hides it: the failure is shown beside them.
            redis_results[k] = (runs, failures)

    # The plain tunnel beside a Go gomux tunnel: the output of every run that has one, and why
    # the others have none.
    redis_plain_runs, redis_plain_failures = [], []
    if meta.get("redis") == "true" and "command-redis-plain" in meta:
        for r in range(1, redis_runs + 1):
            failed = run.file(f"redis-plain-{r}.failed")
            if failed:
                redis_plain_failures.append(f"run {r}: {failed.strip()}")
            else:
                redis_plain_runs.append(run.file(f"redis-plain-{r}.txt") or "")
    redis_plain_rows = redis_plain_summary(redis_plain_runs)

    allocs = []  # (case, units, what, calls, per unit, bytes)
    alloc_text = run.file("alloc.txt") or ""
    for line in alloc_text.splitlines():
        m = re.fullmatch(
            r"(.+): (\d+) (.+?), (\d+) allocations \(([0-9.]+) each\), (\d+) bytes allocated", line
        )
        if m:
            allocs.append((m[1], int(m[2]), m[3], int(m[4]), float(m[5]), int(m[6])))
    allocs.sort()
    idle_sessions = []  # (implementation, sessions, resident per end, heap per end or None)
    for line in (run.file("idle-sessions.txt") or "").splitlines():
        m = re.match(r"idle: (\w+) (\d+) sessions, ([0-9.]+) bytes resident per session end"
                     r"(?: \(heap in use ([0-9.]+)\))?", line)
        if m:
            idle_sessions.append((m[1], int(m[2]), float(m[3]), None if m[4] is None else float(m[4])))
    idle_by = {w: r for w, _, r, _ in idle_sessions}

    out(
        "# Benchmarks",
        "",
        "This file is written by `scripts/benchmarks.sh` from one run on one machine: every figure",
        "in it was measured in that run, with the commands given beside it. The machine is shared",
        "and noisy, so absolute figures move from run to run. What matters are the ratios: each is",
        "taken between rows measured one right after the other in the same round, the order of",
        "the rows turning from round to round; the tables give the median over the rounds, with",
        "the range in brackets. Throughput is in MiB/s (2^20 bytes per second).",
        "",
        "Earlier measurements, each with the command and the date it was made, are kept in",
        "[BENCHMARK-HISTORY.md](BENCHMARK-HISTORY.md). Sections measured in a sitting of their own",
        "(each says so, with its command and machine) are carried over from the previous version of",
        "this file by the run that writes it, which does not measure them.",
        "",
        "## The run",
        "",
        code_block(meta["command"]),
        "",
    )
    dirty = meta.get("dirty", "").split()
    state = "with uncommitted changes to " + ", ".join(f"`{d}`" for d in dirty[:4]) if dirty else "clean"
    if len(dirty) > 4:
        state += f" and {len(dirty) - 4} more files"
    out(
        f"- Measured {meta['started']}–{meta['finished']} UTC, commit {meta['commit']} ({state});"
        f" {run.rounds} round{'s' if run.rounds > 1 else ''}"
        f"{' (--quick)' if meta.get('quick') == 'true' else ''}, the rounds ending at"
        f" {meta['rounds-finished']}.",
        f"- Machine: {meta['cpu'] or 'unknown CPU'}, {meta['cores']} cores (`nproc`),"
        f" {meta['memory']} of memory; Linux {meta['kernel']}.",
        f"- {meta['rustc']}; {meta['go']}; {meta['iperf3']}"
        + (f"; {meta['redis-version']}" if "redis-version" in meta else "")
        + ".",
        f"- Load average (1, 5 and 15 minutes): {meta['load-start']} at the start,"
        f" {meta['load-end']} at the end.",
        "- Both ends of every transfer run in one process unless said otherwise, over loopback TCP.",
    )
    if meta.get("throughput-only") == "true":
        out("- Only the throughput rows were measured (`--throughput-only`): the sections of the other"
            " measurements are empty, and their targets read as not measured.")
    out("")

    # --- The targets -----------------------------------------------------------------------
    targets = []

    def target(name, value, bound, at_least, text=None):
        if value is None:
            targets.append((name, text or "not measured", "–"))
            return
        met = value >= bound if at_least else value <= bound
        targets.append((name, text or r2(value), "met" if met else "**missed**"))

    def ratio_target(name, top, bottom, bound, at_least=True):
        target(name, run.ratio(top, bottom), bound, at_least, run.ratio_text(top, bottom))

    for k in counts:
        ratio_target(f"gomux ≥ {TARGET_LIMIT:.2f} × the limit, {streams(k)}", f"tp-{k}-mux-nv",
                     f"tp-{k}-limit", TARGET_LIMIT)
    for k in counts:
        for what, name in (("go", "2 processes"), ("go-pair", "1 process")):
            ratio_target(f"gomux ≥ {TARGET_GO:.0f} × Go gomux ({name}), {streams(k)}", f"tp-{k}-mux",
                         f"tp-{k}-{what}", TARGET_GO)
    for k in counts:
        ratio_target(f"gomux ≥ {TARGET_YAMUX:.0f} × yamux, {streams(k)}", f"tp-{k}-mux-nv",
                     f"tp-{k}-yamux-nv", TARGET_YAMUX)
    for key, name, bound in GO_MUXES:
        for k in counts:
            for suffix, processes in (("", "2 processes"), ("-pair", "1 process")):
                ratio_target(f"gomux ≥ {bound:.1f} × {name} ({processes}), {streams(k)}", f"tp-{k}-mux",
                             f"tp-{k}-{key}{suffix}", bound)
    ratio_target(f"64-byte round trip ≤ {TARGET_RTT:.2f} × raw TCP's", "rtt-rust-gomux", "rtt-rust-tcp",
                 TARGET_RTT, at_least=False)
    ratio_target(f"{meta['many-streams']} × 1 KiB echo ≥ {TARGET_ECHO:.0f} × as fast as Go gomux's",
                 "many-go-echo", "many-rust-echo", TARGET_ECHO)
    plain_targets = (
        (f"Redis through the tunnel in its plain mode (1 connection, -k 1) ≥ {TARGET_REDIS:.1f} × the two relays",
         TARGET_REDIS, lambda d, r, t, g: t / r),
        (f"Redis through the tunnel in its plain mode (1 connection, -k 1) ≥ {TARGET_REDIS_GO:.1f} × a Go gomux tunnel",
         TARGET_REDIS_GO, lambda d, r, t, g: t / g),
    )
    # Per target, the geometric mean over the commands of the median ratio over the runs.
    plain_means = [
        geometric_mean([statistics.median([ratio(*v) for v in values]) for _, values in redis_plain_rows])
        if redis_plain_rows else None
        for _, _, ratio in plain_targets
    ]
    for (name, bound, _), value in zip(plain_targets, plain_means):
        if redis_plain_failures:
            targets.append((name, "failed: " + "; ".join(redis_plain_failures), "**failed**"))
        elif value is not None:
            n = len(redis_plain_runs)
            target(name, value, bound, True,
                   f"{r2(value)} (geometric mean over the commands of the median over {n} run{'s' if n > 1 else ''})")
        else:
            reason = "not measured (--no-redis)" if meta.get("redis") != "true" else "no figures"
            targets.append((name, reason, "–"))
    redis_name = f"Redis through the tunnel with pinned TLS (1 connection, -k 1) ≥ {TARGET_REDIS:.1f} × the two relays"
    redis_runs_one, redis_failures_one = redis_results.get("1", ([], []))
    redis_rows_one = redis_summary(redis_runs_one, "-k 1")
    if redis_failures_one:
        targets.append((redis_name, "failed: " + "; ".join(redis_failures_one), "**failed**"))
    elif redis_rows_one:
        # Per command, the median over the runs of tunnel ÷ relays within each run.
        value = geometric_mean([statistics.median([t / r for _, r, t in runs]) for _, runs in redis_rows_one])
        target(
            redis_name, value, TARGET_REDIS, True,
            f"{r2(value)} (geometric mean over the commands of the median over"
            f" {len(redis_runs_one)} run{'s' if len(redis_runs_one) > 1 else ''})",
        )
    else:
        reason = "not measured (--no-redis)" if meta.get("redis") != "true" else "no figures"
        targets.append((redis_name, reason, "–"))
    idle = run.median("many-rust-idle")
    target(
        f"≤ {TARGET_IDLE} bytes per idle stream end", idle, TARGET_IDLE, False,
        None if idle is None else f"{idle:.0f} bytes",
    )
    rust_idle, go_idle = idle_by.get("rust"), idle_by.get("go")
    target(
        f"≤ {TARGET_IDLE_SESSION} bytes resident per idle session end", rust_idle, TARGET_IDLE_SESSION, False,
        None if rust_idle is None else f"{rust_idle:.0f} bytes",
    )
    idle_ratio = go_idle / rust_idle if rust_idle and go_idle is not None else None
    target(
        f"idle session end ≥ {TARGET_IDLE_SESSION_GO:.0f} × smaller than Go gomux's (resident)", idle_ratio,
        TARGET_IDLE_SESSION_GO, True, None if idle_ratio is None else f"{idle_ratio:.1f} ×",
    )
    frames = [a for a in allocs if "frames" in a[2]]
    if run.file("alloc.failed") is not None:
        # A failed test measured nothing reliable, whatever it printed before failing.
        targets.append(("0 allocations per Data frame in steady state", "the test failed", "**failed**"))
    elif frames:
        worst = max(a[4] for a in frames)
        target(
            "0 allocations per Data frame in steady state", worst, TARGET_ALLOC, False,
            f"{worst:g} (the most of {len(frames)} cases)",
        )
    else:
        targets.append(("0 allocations per Data frame in steady state", "not measured", "–"))

    out(
        "## Against the targets",
        "",
        "A ratio is the median over the rounds of the ratio taken within each round, with its range"
        " in brackets; the limit is the better of `iperf3` and the speed tool's `tcp` mode, measured"
        " beside the rows of each stream count in each round.",
        "",
        table(["target", "measured", ""], targets, ["---", "--:", ":-:"]),
        "",
    )

    # --- The limit ---------------------------------------------------------------------------
    section(
        run, "The transport's limit",
        ["One loopback TCP connection, reads and writes of 1 MiB, nothing hashed: `iperf3` (its two",
         "ends pinned to two cores), and the speed tool's `tcp` mode (its two ends on one thread).",
         "A multiplexer carries all its streams over one such connection,",
         "so the limit of every row below is this one-connection figure, whatever the stream count.",
         "Both are measured beside the rows of each stream count, in the same round and in turn with",
         "them; the better of the two is the limit those rows are held against. MiB/s:"],
        ["tp-iperf3", "tp-tcp"],
        table(["beside the rows of", "iperf3", "speed `tcp --no-verify`", "limit"],
              [run.row(streams(k), [f"tp-{k}-{w}" for w in ("iperf3", "tcp", "limit")], ".0f") for k in counts]),
    )

    # --- Throughput --------------------------------------------------------------------------
    rows = []
    for k in counts:
        limit, mux, yamux = f"tp-{k}-limit", f"tp-{k}-mux-nv", f"tp-{k}-yamux-nv"
        rows.append(run.row(k, (limit, mux, yamux), ".0f", ((mux, limit), (yamux, limit), (mux, yamux))))
    section(
        run, "Throughput against the limit and yamux",
        ["64 KiB writes, the bytes counted but not hashed (`--no-verify`, as `iperf3` does), all",
         "streams over one loopback TCP connection (for K in " + ", ".join(counts) + "):"],
        ["tp-mux-nv", "tp-yamux-nv"],
        table(["streams", "limit", "gomux", "yamux", "gomux ÷ limit", "yamux ÷ limit", "gomux ÷ yamux"], rows),
    )
    rows = []
    for k in counts:
        mux, go, pair = f"tp-{k}-mux", f"tp-{k}-go", f"tp-{k}-go-pair"
        rows.append(run.row(k, (mux, go, pair), ".0f", ((mux, go), (mux, pair))))
    section(
        run, "Throughput against Go gomux",
        ["64 KiB writes, every byte hashed at both ends, as Go gomux's `bench send` and `bench receive`",
         "do: the same work on both sides. Go gomux runs as two processes (sender and receiver, the",
         "speed tool's `go` mode) and as one (`-pair`, both ends in one process, as the Rust rows):"],
        ["tp-mux", "tp-go", "tp-go-pair"],
        table(["streams", "gomux", "Go gomux, 2 processes", "Go gomux, 1 process",
               "gomux ÷ Go (2 proc.)", "gomux ÷ Go (1 proc.)"], rows),
    )
    rows = []
    for k in counts:
        mux = f"tp-{k}-mux"
        others = [f"tp-{k}-{key}{suffix}" for key, _, _ in GO_MUXES for suffix in ("", "-pair")]
        rows.append(run.row(k, [mux] + others, ".0f", [(mux, other) for other in others]))
    section(
        run, "Throughput against Go smux and hashicorp/yamux",
        ["The same transfer as against Go gomux, every byte hashed at both ends, through the Go",
         "multiplexers most often picked, each with its default configuration: xtaci/smux and",
         "hashicorp/yamux (" + (meta.get("go-compare") or "the versions of benches/go-compare/go.mod")
         + "), run by benches/go-compare as two processes (the speed tool's `go-smux` and",
         "`go-yamux` modes) and as one (`-pair`). The gomux column is the one above:"],
        ["tp-mux", "tp-go-smux", "tp-go-smux-pair", "tp-go-yamux", "tp-go-yamux-pair"],
        table(["streams", "gomux", "smux, 2 proc.", "smux, 1 proc.", "yamux, 2 proc.", "yamux, 1 proc.",
               "gomux ÷ smux (2)", "gomux ÷ smux (1)", "gomux ÷ yamux (2)", "gomux ÷ yamux (1)"], rows),
    )
    rows = []
    for k in counts:
        limit, tls, mux = f"tp-{k}-limit", f"tp-{k}-tls", f"tp-{k}-mux-tls-nv"
        rows.append(run.row(k, (limit, tls, mux), ".0f", ((mux, tls), (tls, limit))))
    section(
        run, "Throughput over TLS",
        ["rustls (TLS 1.3, the `ring` provider) over loopback TCP, nothing hashed: one TLS",
         "connection carrying raw bytes in 1 MiB writes and reads (`tls`, the limit under TLS,",
         "measured beside the rows of each stream count like the TCP limit) and gomux over one TLS",
         "connection with 64 KiB writes (`mux-tls`); the TCP limit from above beside them:"],
        ["tp-tls", "tp-mux-tls-nv"],
        table(["streams", "TCP limit", "TLS limit", "gomux over TLS", "gomux ÷ TLS limit",
               "TLS limit ÷ TCP limit"], rows),
    )

    # --- Round trip --------------------------------------------------------------------------
    section(
        run, "Round trip of 64 bytes",
        ["A 64-byte message and its echo on one stream, one at a time, both ends in one process; in",
         "µs (Rust: criterion's estimate)."],
        ["rtt-rust", "rtt-go", "rtt-instructions"],
        table(
            ["", "raw TCP", "gomux", "gomux ÷ raw TCP"],
            [
                run.row("Rust (`cargo bench --bench latency`)", ("rtt-rust-tcp", "rtt-rust-gomux"), ".1f",
                        [("rtt-rust-gomux", "rtt-rust-tcp")]),
                run.row("Go (`gomux-go-peer bench rtt -pair`)", ("rtt-go-tcp", "rtt-go-gomux"), ".1f",
                        [("rtt-go-gomux", "rtt-go-tcp")]),
                run.row("Rust ÷ Go", (), "", [("rtt-rust-tcp", "rtt-go-tcp"), ("rtt-rust-gomux", "rtt-go-gomux")])
                + [""],
            ],
        ),
    )

    instructions_paragraph(run)

    # --- Many streams ------------------------------------------------------------------------
    n = meta["many-streams"]
    section(
        run, "Many streams",
        [f"{n} idle streams (the memory each stream end takes), then {n} streams each echoing 1 KiB",
         "beside them; both ends in one process, one loopback TCP connection."],
        ["many-rust", "many-go"],
        table(
            ["", "gomux (`many_streams`)", "Go gomux (`bench many -pair`)", "Go ÷ gomux"],
            [
                run.row(f"{n} × 1 KiB echo, ms", ("many-rust-echo", "many-go-echo"), ".0f",
                        [("many-go-echo", "many-rust-echo")]),
                run.row("idle stream end, bytes: gomux resident-set growth, Go heap in use",
                        ("many-rust-idle", "many-go-idle"), ".0f", [("many-go-idle", "many-rust-idle")]),
                run.row("idle stream end, bytes: resident-set growth", ("many-rust-idle", "many-go-resident"),
                        ".0f", [("many-go-resident", "many-rust-idle")]),
            ],
        ),
    )

    # --- Redis -------------------------------------------------------------------------------
    if meta.get("redis") != "true":
        out("## Redis through the tunnel", "", "Not measured: the run was made with `--no-redis`.", "")
    else:
        section(
            run, "Redis through the tunnel",
            ["`redis-benchmark` against Redis directly, through two plain TCP relays in a row (the",
             "same two hops and copying as the tunnel, one TCP connection per client) and through",
             "the tunnel tool (pinned TLS between its ends), whose entry carries the clients over K gomux connections; each K",
             f"is its own run of the script, {'once' if redis_runs == 1 else f'{redis_runs} times'} after the rounds"
             + (", the order of direct, relays and tunnel turning from run to run (each first in one"
                " run and last in another)" if redis_runs > 1 else "")
             + ". Requests per second, the median over the runs with the range in brackets; a ratio is"
             " the median of the ratios within each run:"],
            ["redis"],
        )
        for mode, title in (("-k 1", "Keep-alive connections (`-k 1`)"),
                            ("-k 0", "A new connection per request (`-k 0`)")):
            rows = []
            means = []
            for k, (runs, failures) in redis_results.items():
                for failure in failures:
                    rows.append([k, failure, "", "", "", "", ""])
                lines = redis_summary(runs, mode)
                for command, values in lines:
                    rows.append([k, command] + [median_range([v[i] for v in values], ".0f") for i in range(3)]
                                + [ratio_range([t / r for _, r, t in values]),
                                   ratio_range([t / d for d, _, t in values])])
                if lines:
                    value = geometric_mean([statistics.median([t / r for _, r, t in v]) for _, v in lines])
                    means.append(f"K = {k}: {r2(value)}")
            out(
                f"{title}:",
                "",
                table(["K", "command", "direct", "relays", "tunnel", "tunnel ÷ relays", "tunnel ÷ direct"],
                      rows, ["--:", "---", "--:", "--:", "--:", "--:", "--:"]),
                "",
            )
            if means:
                out("Geometric mean over the commands of the median tunnel ÷ relays: " + "; ".join(means) + ".", "")

    # --- Redis, the plain tunnel beside Go gomux's ---------------------------------------------
    if meta.get("redis") == "true" and "command-redis-plain" in meta:
        n = len(redis_plain_runs) + len(redis_plain_failures)
        section(
            run, "Redis through the plain tunnel beside a Go gomux tunnel",
            ["`redis-benchmark -k 1` against Redis directly, through the two plain TCP relays, through",
             "the tunnel tool over plain TCP (`--insecure`, one gomux connection) and through a Go gomux",
             "tunnel of the same shape (the Go peer's `tunnel entry` and `tunnel exit`: one Go gomux",
             f"session, every client a stream), all four started side by side; {'one run' if n == 1 else f'{n} runs'}"
             + (", the order of the four turning from run to run" if n > 1 else "")
             + ". Requests per second, the median over the runs with the range in brackets; a ratio is"
             " the median of the ratios within each run:"],
            ["redis-plain"],
        )
        rows = [[failure, "", "", "", "", "", ""] for failure in redis_plain_failures]
        for command, values in redis_plain_rows:
            rows.append([command] + [median_range([v[i] for v in values], ".0f") for i in range(4)]
                        + [ratio_range([ratio(*v) for v in values]) for _, _, ratio in plain_targets])
        out(
            table(["command", "direct", "relays", "tunnel", "Go gomux tunnel", "tunnel ÷ relays",
                   "tunnel ÷ Go gomux tunnel"],
                  rows, ["---", "--:", "--:", "--:", "--:", "--:", "--:"]),
            "",
        )
        if redis_plain_rows:
            out(f"Geometric mean over the commands of the median tunnel ÷ relays: {r2(plain_means[0])};"
                f" tunnel ÷ Go gomux tunnel: {r2(plain_means[1])}.", "")

    # --- Latency under load ------------------------------------------------------------------
    loaded_section(run)
    shares_section(run)
    # --- The tunnel with pinned TLS ------------------------------------------------------------
    if meta.get("redis") == "true":
        security_section(run)

    # --- Allocations -------------------------------------------------------------------------
    section(run, "Allocations", ["Allocations while full Data frames and messages move in steady state:"], ["alloc"])
    if run.file("alloc.failed") is not None:
        out("**The test failed**: the figures below, if any, are what it printed before it failed,"
            " and the target above reads as failed.", "")
    if allocs:
        out(
            table(["case", "moved", "allocations", "per unit", "bytes allocated"],
                  [[c, f"{u} {w}", str(a), f"{p:g}", str(b)] for c, u, w, a, p, b in allocs]),
            "",
        )
    else:
        out("It printed no figures.", "")

    # --- Idle sessions -----------------------------------------------------------------------
    section(run, "Idle sessions",
            ["Sessions, one loopback connection each, with one stream that moved a 16-byte message, left",
             "idle for 3 s; resident memory per session end after each runtime gave its free memory back",
             "(glibc `malloc_trim(0)`, Go's `debug.FreeOSMemory()`). The bench runs the Go peer's",
             "`bench idle` in the same setup (one process, or two when the open-files limit is short):"],
            ["idle-sessions"])
    if run.file("idle-sessions.failed") is not None:
        out("The bench failed; what it printed:", "")
    if idle_sessions:
        out(table(["implementation", "sessions", "bytes resident per session end", "heap in use per session end"],
                  [[w, str(n), f"{r:.0f}", "–" if h is None else f"{h:.0f}"] for w, n, r, h in idle_sessions]), "")
        comments = [line[2:] for line in (run.file("idle-sessions.txt") or "").splitlines() if line.startswith("# ")]
        if comments:
            out(code_block("\n".join(comments)), "")
    else:
        out("It printed no figures.", "")

    # --- Profiles ----------------------------------------------------------------------------
    out(
        "## What the profiles showed",
        "",
        "`mux-tcp --no-verify` under `perf record`; both ends are in the one process, so one profile",
        "covers both. For each: the share of the samples in each object, the symbols that took the",
        "most samples themselves (kernel `[k]` and user space `[.]`), and those of the program itself",
        "(gomux, tokio and the speed tool, inlined into one binary), all as shares of every sample.",
        "",
    )
    for name, title in (("one", "One stream"), ("many", "1000 streams")):
        commands = [run.command(c) for c in ("perf-" + name, "perf-dso", "perf-all", "perf-own")]
        out(f"### {title}", "", code_block("\n".join(commands)), "")
        failed = run.file(f"perf-{name}.failed")
        if failed is not None or not run.file(f"perf-{name}.all"):
            out("No profile: " + (failed or "perf printed nothing").strip().replace("\n", " "), "")
            continue
        samples = " ".join((run.file(f"perf-{name}.samples") or "").split())
        if samples:
            out(samples + ":", "")
        for suffix, header in (("dso", ["samples", "object"]), ("all", ["self", "object", "symbol"]),
                               ("own", ["self", "symbol"])):
            rows = [perf_row(line, len(header)) for line in (run.file(f"perf-{name}.{suffix}") or "").splitlines()]
            out(table(header, [r for r in rows if r], ["--:"] + ["---"] * (len(header) - 1)), "")

    # --- Notes -------------------------------------------------------------------------------
    if notes:
        with open(notes) as f:
            out("## Notes", "", f.read().rstrip(), "")

    # --- Every round -------------------------------------------------------------------------
    keys = []
    for k in counts:
        keys += [f"tp-{k}-{w}" for w in ("iperf3", "tcp", "limit", "mux-nv", "yamux-nv", "mux", "go", "go-pair",
                                         "go-smux", "go-smux-pair", "go-yamux", "go-yamux-pair", "tls",
                                         "mux-tls-nv")]
    keys += ["rtt-rust-tcp", "rtt-rust-gomux", "rtt-go-tcp", "rtt-go-gomux", "many-rust-echo",
             "many-go-echo", "many-rust-idle", "many-go-idle", "many-go-resident"]
    rows = []
    for key in keys:
        rows.append([f"`{key}`"] + [
            f"{run.values[r, key]:g}" if (r, key) in run.values else "–" for r in range(1, run.rounds + 1)
        ])
    # The order each round measured its rows in, as scripts/benchmarks.sh recorded it.
    orders = []  # (round, the row function and its arguments but the round, the rows in order)
    for line in (run.file("order") or "").splitlines():
        fields = line.split("\t")
        if len(fields) == 3 and fields[1].split():
            words = fields[1].split()
            orders.append((fields[0], " ".join([words[0]] + words[2:]), fields[2]))
    if orders:
        labels = {"throughput_row": "throughput, {}", "rtt_row": "round trip", "many_row": "many streams"}
        groups = []
        for _, command, _ in orders:
            if command not in groups:
                groups.append(command)
        order_rows = []
        for command in groups:
            words = command.split()
            label = labels.get(words[0], words[0])
            label = label.format(streams(words[1])) if "{}" in label and len(words) > 1 else label
            order_rows.append([label] + [
                next((", ".join(f"`{w}`" for w in o.split()) for r_, c, o in orders if c == command and int(r_) == r), "–")
                for r in range(1, run.rounds + 1)
            ])
    for block in kept_sections(previous) if previous else []:
        out(block, "")
    out(
        "## Every round",
        "",
        "<details>",
        "<summary>The figures of each round (throughput in MiB/s, round trips in µs, echo in ms,",
        "memory in bytes per stream end); keys: <code>tp-K-…</code> is K streams; <code>-nv</code>",
        "counted without hashing; <code>go</code> two Go processes, <code>go-pair</code> one (the same for",
        "<code>go-smux</code> and <code>go-yamux</code>); <code>tls</code> one TLS connection.</summary>",
        "",
        table(["figure"] + [f"round {r}" for r in range(1, run.rounds + 1)], rows),
        "",
    )
    if orders:
        out(
            "The order in which each round measured its rows (each round starts one row later than"
            " the one before; with fewer rounds than rows, not every row takes every place):",
            "",
            table(["rows"] + [f"round {r}" for r in range(1, run.rounds + 1)], order_rows,
                  ["---"] * (run.rounds + 1)),
            "",
        )
    out("</details>")


if __name__ == "__main__":
    main()
