"""Compare two bn_kernels.py runs (before / after a change) row by row: graph ms and the ratio.

    python benchmarks/ab_compare.py BEFORE/bn_kernels.jsonl AFTER/bn_kernels.jsonl [--json OUT]
"""

import argparse
import json
import math


def rows(path):
    out = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if "meta" in r or r.get("variant") != "default":
                continue
            key = ("x".join(map(str, r["shape"])), r["layout"], r["dtype"], r["mode"])
            out[key] = r["nk_graph_ms"]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    before, after = rows(a.before), rows(a.after)
    keys = sorted(set(before) & set(after))
    table = [dict(row=" ".join(k), before_ms=before[k], after_ms=after[k], ratio=after[k] / before[k]) for k in keys]
    for t in table:
        print(f"{t['row']:<40} {t['before_ms']:.4f} -> {t['after_ms']:.4f} ms  {100 * (t['ratio'] - 1):+.1f} %")
    if table:
        geo = math.exp(sum(math.log(t["ratio"]) for t in table) / len(table))
        print(f"geomean after/before over {len(table)} rows: {geo:.4f}; worst {max(t['ratio'] for t in table):.4f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    main()
