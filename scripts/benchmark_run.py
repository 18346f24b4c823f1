"""What one run of scripts/benchmarks.sh measured, and the Markdown BENCHMARKS.md is written in.

`Run` reads the work directory (see scripts/benchmarks.py for what it holds); the functions below
it format figures and print the document's pieces on stdout.
"""

import math
import os
import statistics


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



def geometric_mean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None



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
