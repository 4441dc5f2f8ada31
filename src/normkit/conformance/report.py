"""Progress bar, summary table, failure list with repro lines, and the JSON report."""

from __future__ import annotations

import json
import shlex
import sys
import time

from normkit.bench.report import clean_floats
from normkit.conformance.cases import FAMILIES


class Progress:
    """A small progress bar on stderr (redrawn at most ~10 times a second)."""

    def __init__(self, total: int, stream=None, width: int = 30):
        self.total = max(total, 1)
        self.stream = stream or sys.stderr
        self.width = width
        self.done = 0
        self.failed = 0
        self._last = 0.0
        self._tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._start = time.monotonic()

    def step(self, label: str = "", failed: bool = False):
        self.done += 1
        self.failed += bool(failed)
        now = time.monotonic()
        if self.done == self.total or now - self._last > (0.1 if self._tty else 2.0):
            self._last = now
            self._draw(label)

    def _draw(self, label):
        frac = self.done / self.total
        fill = int(frac * self.width)
        bar = "#" * fill + "." * (self.width - fill)
        text = (f"[{bar}] {self.done}/{self.total} {frac:4.0%} failed {self.failed} "
                f"{time.monotonic() - self._start:5.1f}s {label[:40]:<40}")
        self.stream.write(("\r" if self._tty else "") + text + ("" if self._tty else "\n"))
        self.stream.flush()

    def close(self):
        if self._tty:
            self.stream.write("\n")
            self.stream.flush()


def summarize(outcomes) -> dict:
    """Per-family counts and the worst error as a fraction of its tolerance."""
    table = {}
    for o in outcomes:
        row = table.setdefault(o.family, {"cases": 0, "passed": 0, "failed": 0, "worst_err_over_tol": 0.0,
                                          "worst_case": ""})
        row["cases"] += 1
        if o.passed:
            row["passed"] += 1
        else:
            row["failed"] += 1
        for r in o.results:
            if r.ratio > row["worst_err_over_tol"] and r.ratio != float("inf"):
                row["worst_err_over_tol"], row["worst_case"] = r.ratio, f"{r.case} [{r.rule}]"
            elif r.ratio == float("inf"):
                row["worst_err_over_tol"], row["worst_case"] = float("inf"), f"{r.case} [{r.rule}]"
    return table


def format_table(table: dict) -> str:
    lines = [f"{'op family':<15}{'cases':>7}{'passed':>8}{'failed':>8}{'worst err/tol':>15}  worst case",
             "-" * 100]
    tot = [0, 0, 0]
    for fam in list(FAMILIES) + sorted(set(table) - set(FAMILIES)):
        if fam not in table:
            continue
        row = table[fam]
        worst = f"{row['worst_err_over_tol']:.3g}"  # compact at every scale: 0.465, 5.12e+07, inf
        lines.append(f"{fam:<15}{row['cases']:>7}{row['passed']:>8}{row['failed']:>8}{worst:>15}  "
                     f"{row['worst_case']}")
        tot[0] += row["cases"]
        tot[1] += row["passed"]
        tot[2] += row["failed"]
    lines.append("-" * 100)
    lines.append(f"{'total':<15}{tot[0]:>7}{tot[1]:>8}{tot[2]:>8}")
    return "\n".join(lines)


def repro(impl: str, device: str, family: str, case: str, within: str | None = None) -> str:
    parts = ["python", "-m", "normkit", "check", "--impl", impl] + (["--within", within] if within else []) + [
        "--device", device, "--ops", family, "--case", case, "--exact"]
    return " ".join(shlex.quote(p) for p in parts)


def format_failures(outcomes, impl: str, device: str, limit: int = 200, within: str | None = None,
                    json_path: str | None = None) -> str:
    """The failed rules, the first ``limit`` in full under a "failures:" header, then how many are not shown
    and where they are (the --json report, or the flag that writes one)."""
    lines = []
    n = 0
    for o in outcomes:
        if o.passed:
            continue
        for r in o.results:
            if r.passed:
                continue
            n += 1
            if n <= limit:
                lines.append(f"FAIL {r.case}  [{r.rule}] ({r.op})\n     {r.detail}\n"
                             f"     repro: {repro(impl, device, o.family, o.case, within)}")
    if lines:
        lines.insert(0, "failures:")
    if n > limit:
        where = f"all are in {json_path}" if json_path else "--json FILE lists them all"
        more = f"... and {n - limit} more" if lines else f"{n}"
        lines.append(f"{more} failed rule(s) not shown ({where})")
    return "\n".join(lines)


def to_json(outcomes, not_present: dict, meta: dict) -> dict:
    results = [r.as_json() for o in outcomes for r in o.results]
    passed = sum(1 for o in outcomes if o.passed)
    return {
        "cases": len(outcomes),
        "passed": passed,
        "failed": len(outcomes) - passed,
        "families": clean_floats(summarize(outcomes)),  # the printed table's rows
        "results": results,
        "not_present": [{"op": k, "why": v} for k, v in sorted(not_present.items())],
        "meta": meta,
    }


def write_json(path: str, data: dict):
    with open(path, "w") as f:
        json.dump(data, f, separators=(",", ":"), default=str)
