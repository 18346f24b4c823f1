"""Redis through the tunnel tool, and the tunnel with pinned TLS: what scripts/redis-tunnel.sh and
scripts/tunnel-security.sh printed during a run of scripts/benchmarks.sh, as BENCHMARKS.md's
targets and sections.
"""

import re
import statistics

from benchmark_run import geometric_mean, median_range, out, r2, ratio_range, section, table

# The targets: the tunnel, keep-alive connections over one gomux connection, at least this many
# times as fast as the two relays, and as a Go gomux tunnel.
TARGET_REDIS = 1.0
TARGET_REDIS_GO = 1.5

# The plain tunnel's targets: (name, bound, the ratio of a run's (direct, relays, tunnel, Go
# tunnel) figures the bound holds for).
PLAIN_TARGETS = (
    (f"Redis through the tunnel in its plain mode (1 connection, -k 1) ≥ {TARGET_REDIS:.1f} × the two relays",
     TARGET_REDIS, lambda d, r, t, g: t / r),
    (f"Redis through the tunnel in its plain mode (1 connection, -k 1) ≥ {TARGET_REDIS_GO:.1f} × a Go gomux tunnel",
     TARGET_REDIS_GO, lambda d, r, t, g: t / g),
)
TLS_TARGET = f"Redis through the tunnel with pinned TLS (1 connection, -k 1) ≥ {TARGET_REDIS:.1f} × the two relays"


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


class Redis:
    """The Redis runs of one benchmark run: each run's tables per number K of gomux connections,
    and the runs of the plain tunnel beside a Go gomux tunnel; for each run that has none, why."""

    def __init__(self, run):
        self.run = run
        meta = run.meta
        self.measured = meta.get("redis") == "true"
        self.runs = int(meta.get("redis-runs", "1"))
        self.results = {}  # K -> the tables of every run that has them, or why none has
        if self.measured:
            for k in meta.get("redis-connections", "").split():
                runs, failures = [], []
                for r in range(1, self.runs + 1):
                    failed = run.file(f"redis-{k}-{r}.failed")
                    if failed:
                        failures.append(f"run {r}: {failed.strip()}")
                    else:
                        runs.append(redis_tables(run.file(f"redis-{k}-{r}.txt") or ""))
                # A run that failed leaves the figures of the others standing, but no range that
                # hides it: the failure is shown beside them.
                self.results[k] = (runs, failures)

        # The plain tunnel beside a Go gomux tunnel: the output of every run that has one, and
        # why the others have none.
        self.plain_measured = self.measured and "command-redis-plain" in meta
        self.plain_runs, self.plain_failures = [], []
        if self.plain_measured:
            for r in range(1, self.runs + 1):
                failed = run.file(f"redis-plain-{r}.failed")
                if failed:
                    self.plain_failures.append(f"run {r}: {failed.strip()}")
                else:
                    self.plain_runs.append(run.file(f"redis-plain-{r}.txt") or "")
        self.plain_rows = redis_plain_summary(self.plain_runs)
        # Per plain target, the geometric mean over the commands of the median ratio over the runs.
        self.plain_means = [
            geometric_mean([statistics.median([ratio(*v) for v in values]) for _, values in self.plain_rows])
            if self.plain_rows else None
            for _, _, ratio in PLAIN_TARGETS
        ]

    def add_targets(self, targets, target):
        """Appends the Redis targets to `targets`, through `target(name, value, bound, at_least,
        text)` where there is a figure."""
        for (name, bound, _), value in zip(PLAIN_TARGETS, self.plain_means):
            if self.plain_failures:
                targets.append((name, "failed: " + "; ".join(self.plain_failures), "**failed**"))
            elif value is not None:
                n = len(self.plain_runs)
                target(name, value, bound, True,
                       f"{r2(value)} (geometric mean over the commands of the median over {n} run{'s' if n > 1 else ''})")
            else:
                targets.append((name, self.not_measured(), "–"))
        runs_one, failures_one = self.results.get("1", ([], []))
        rows_one = redis_summary(runs_one, "-k 1")
        if failures_one:
            targets.append((TLS_TARGET, "failed: " + "; ".join(failures_one), "**failed**"))
        elif rows_one:
            # Per command, the median over the runs of tunnel ÷ relays within each run.
            value = geometric_mean([statistics.median([t / r for _, r, t in runs]) for _, runs in rows_one])
            target(
                TLS_TARGET, value, TARGET_REDIS, True,
                f"{r2(value)} (geometric mean over the commands of the median over"
                f" {len(runs_one)} run{'s' if len(runs_one) > 1 else ''})",
            )
        else:
            targets.append((TLS_TARGET, self.not_measured(), "–"))

    def not_measured(self):
        return "not measured (--no-redis)" if not self.measured else "no figures"

    def sections(self):
        """Redis through the tunnel at each K, then the plain tunnel beside a Go gomux tunnel."""
        run, redis_runs = self.run, self.runs
        if not self.measured:
            out("## Redis through the tunnel", "", "Not measured: the run was made with `--no-redis`.", "")
            return
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
            for k, (runs, failures) in self.results.items():
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

        # --- Redis, the plain tunnel beside Go gomux's -----------------------------------------
        if not self.plain_measured:
            return
        n = len(self.plain_runs) + len(self.plain_failures)
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
        rows = [[failure, "", "", "", "", "", ""] for failure in self.plain_failures]
        for command, values in self.plain_rows:
            rows.append([command] + [median_range([v[i] for v in values], ".0f") for i in range(4)]
                        + [ratio_range([ratio(*v) for v in values]) for _, _, ratio in PLAIN_TARGETS])
        out(
            table(["command", "direct", "relays", "tunnel", "Go gomux tunnel", "tunnel ÷ relays",
                   "tunnel ÷ Go gomux tunnel"],
                  rows, ["---", "--:", "--:", "--:", "--:", "--:", "--:"]),
            "",
        )
        if self.plain_rows:
            out(f"Geometric mean over the commands of the median tunnel ÷ relays: {r2(self.plain_means[0])};"
                f" tunnel ÷ Go gomux tunnel: {r2(self.plain_means[1])}.", "")


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
