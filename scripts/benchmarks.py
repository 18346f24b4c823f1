"""Writes BENCHMARKS.md (on stdout) from the figures scripts/benchmarks.sh collected.

usage: python3 scripts/benchmarks.py WORK_DIR NOTES_FILE [PREVIOUS]

WORK_DIR holds what the measuring script wrote:

- results: "round key value" lines, one per figure and round;
- meta: "key<TAB>value" lines: the machine, the time, the commit and the commands run;
- redis-K-R.txt: scripts/redis-tunnel.sh's output with K gomux connections, run R (or
  redis-K-R.failed: why there is none);
- security.txt: scripts/tunnel-security.sh's output (or security.failed: why there is none);
- order: "round<TAB>command<TAB>rows in order" lines, the order the rows of a round ran in;
- perf-NAME.txt: the top of a perf report (or perf-NAME.failed), perf-NAME.samples;
- alloc.txt: the output of the allocation test (alloc.failed if it failed);
- loaded.txt: the table of benches/latency_under_load.rs (loaded.failed if it failed);
- shares.txt: the table of benches/shares.rs (shares.failed if it failed);
- idle-sessions.txt: the output of benches/idle_sessions.rs (idle-sessions.failed if it failed).

NOTES_FILE (may be empty: no notes) is Markdown included as it is. Every figure printed comes
from these files; the text around them holds none of its own. PREVIOUS is the document this one
replaces: its sections measured apart from the run are carried over.

This file holds the targets and the document's order; benchmark_run.py reads the work directory
and holds the Markdown helpers, benchmark_redis.py the sections of the tunnel's Redis runs.
"""

import re
import sys

from benchmark_redis import Redis, security_section
from benchmark_run import Run, bench_table, code_block, out, r2, section, streams, table

# The targets the figures are held against: (bound, direction), read "at least" for ">=".
TARGET_LIMIT = 0.90
# The zero-copy API (`Stream::write_chunk`, `read_chunk`), which copies no byte in user space.
TARGET_ZERO_COPY = 1.0
TARGET_GO = 2.0
TARGET_YAMUX = 3.0
# Go's xtaci/smux and hashicorp/yamux, every byte hashed, like Go gomux's rows.
TARGET_SMUX = 1.5
TARGET_GO_YAMUX = 1.5
TARGET_RTT = 1.05
TARGET_ECHO = 4.0
TARGET_IDLE = 256
TARGET_ALLOC = 0.0
TARGET_IDLE_SESSION = 2048
TARGET_IDLE_SESSION_GO = 10.0


# The Go multiplexers beside Go gomux: (key of their rows, name, target ratio).
GO_MUXES = (("go-smux", "Go smux", TARGET_SMUX), ("go-yamux", "hashicorp/yamux", TARGET_GO_YAMUX))


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

def perf_row(line, cells):
    """A perf report line ("12.34%  object  [.] symbol") as table cells, code-formatted."""
    parts = line.split(None, cells - 1)
    if len(parts) < cells:
        return None
    text = [p.strip() for p in parts[1:]]
    if len(text[-1]) > 110:
        text[-1] = text[-1][:109] + "…"
    return [parts[0]] + ["`" + t.replace("|", "\\|") + "`" for t in text]


# ---------------------------------------------------------------------------------------------
# The document.


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

    redis = Redis(run)

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
        value, text = run.ratio(top, bottom), run.ratio_text(top, bottom)
        if value is not None and value != bound and r2(value) == r2(bound):
            # A median that rounds to the bound shows on which side of it it is.
            text = f"{value:.3f}" + text[len(r2(value)):]
        target(name, value, bound, at_least, text)

    for k in counts:
        ratio_target(f"gomux ≥ {TARGET_LIMIT:.2f} × the limit, {streams(k)}", f"tp-{k}-mux-nv",
                     f"tp-{k}-limit", TARGET_LIMIT)
    for k in counts:
        ratio_target(f"gomux zero-copy ≥ {TARGET_ZERO_COPY:.1f} × the limit, {streams(k)}", f"tp-{k}-zc-nv",
                     f"tp-{k}-limit", TARGET_ZERO_COPY)
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
    redis.add_targets(targets, target)
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
        limit, mux, zc, yamux = f"tp-{k}-limit", f"tp-{k}-mux-nv", f"tp-{k}-zc-nv", f"tp-{k}-yamux-nv"
        rows.append(run.row(k, (limit, mux, zc, yamux), ".0f",
                            ((mux, limit), (zc, limit), (yamux, limit), (mux, yamux))))
    section(
        run, "Throughput against the limit and yamux",
        ["64 KiB writes, the bytes counted but not hashed (`--no-verify`, as `iperf3` does), all",
         "streams over one loopback TCP connection (for K in " + ", ".join(counts) + "). `gomux` writes",
         "and reads through `AsyncWrite` and `AsyncRead`; `zero-copy` through `Stream::write_chunk`",
         "and `Stream::read_chunk`, which hand over `Bytes` instead of copying (`mux-tcp-zc`):"],
        ["tp-mux-nv", "tp-zc-nv", "tp-yamux-nv"],
        table(["streams", "limit", "gomux", "zero-copy", "yamux", "gomux ÷ limit", "zero-copy ÷ limit",
               "yamux ÷ limit", "gomux ÷ yamux"], rows),
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

    redis.sections()

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
        keys += [f"tp-{k}-{w}" for w in ("iperf3", "tcp", "limit", "mux-nv", "zc-nv", "yamux-nv", "mux", "go", "go-pair",
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
        "counted without hashing; <code>zc</code> the zero-copy API; <code>go</code> two Go processes,",
        "<code>go-pair</code> one (the same for <code>go-smux</code> and <code>go-yamux</code>);",
        "<code>tls</code> one TLS connection.</summary>",
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
