"""A/B of kernel knobs inside real models: bf16 training steps under ``normkit.enable()`` with knob setting A and
setting B (and eager as a yardstick) interleaved round by round in one process, so that a drifting host weighs on
every setting alike. The zoo's own timing (two rounds a setting, settings in separate processes) cannot separate a
10 % host-time change from a lease's drift; this can.

    python benchmarks/knob_ab.py --models tv_resnet18,tv_mobilenet_v3_small --a fused_max_rows=0 --b "" \
        --rounds 12 --steps 10 --out results/ab

Each round runs ``--steps`` steps per setting, the settings in a rotated order; the table gives each setting's
median ms per step (CUDA events), its median host issue time, and B's median over A's with the spread of the
per-round ratios (interquartile range).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_zoo as Z  # noqa: E402

import normkit  # noqa: E402
from normkit.kernels import knob_items, set_knobs  # noqa: E402
from normkit.ops import batch_norm as _obn  # noqa: E402

# besides the kernels' knobs: the fast routes under enable() (batch, layer, RMS norm: set_fast_routes), 0 or 1
ROUTES = "fast_routes"


def _split(items):
    """(the kernel knobs, the fast-routes flag or None) of a setting's KNOB=INT items."""
    flags = [bool(int(i.partition("=")[2])) for i in items if i.partition("=")[0] == ROUTES]
    return [i for i in items if i.partition("=")[0] != ROUTES], (flags[-1] if flags else None)


def apply(items):
    knobs, routes = _split(items)
    set_knobs(knobs)
    if routes is not None:
        _obn.set_fast_routes(routes)  # enable() reads it


def _quartiles(values):
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return q[0], q[2]


def run_model(name, layout, knobs, rounds, steps, seed, device="cuda"):
    """{setting: [(ms per step, host issue ms per step), ...] a round} for eager, A and B."""
    step = Z.train_step(name, Z.MODELS[name], layout, device, seed)

    def measure():
        return Z.cuda_ms_per_step(step, steps)

    def under(setting, fn):
        if setting == "eager":
            return fn()
        apply(knobs[setting])
        try:
            with normkit.enabled():
                return fn()
        finally:
            apply(knobs["defaults"])

    order = ["eager", "A", "B"]
    for setting in order:  # compile, record launch plans, warm the allocator
        under(setting, lambda: [step() for _ in range(3)])
    out = {s: [] for s in order}
    for r in range(rounds):
        for setting in order[r % 3:] + order[:r % 3]:
            out[setting].append(under(setting, measure))
    return out


def summarize(rounds):
    row = {}
    for setting, values in rounds.items():
        row[setting] = statistics.median(v[0] for v in values)
        row[setting + "_issue"] = statistics.median(v[1] for v in values)
    ratios = [b[0] / a[0] for a, b in zip(rounds["A"], rounds["B"])]
    row["b_over_a"] = statistics.median(ratios)
    row["b_over_a_iqr"] = _quartiles(ratios)
    row["b_over_eager"] = row["B"] / row["eager"]
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    Z.add_model_args(ap)
    ap.add_argument("--a", default="", help="setting A: space-separated KNOB=INT (empty: the defaults; "
                    f"{ROUTES}=0|1: the fast routes)")
    ap.add_argument("--b", default="", help="setting B, likewise")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args(argv)
    a, b = args.a.split(), args.b.split()
    names = sorted({item.partition("=")[0] for item in _split(a + b)[0]})
    defaults = knob_items(names) + [f"{ROUTES}={int(_obn.fast_routes_enabled())}"]
    knobs = {"defaults": defaults, "A": a, "B": b}
    apply(a + b)  # every item validated before anything runs
    apply(knobs["defaults"])
    meta, cases = Z.cuda_run(args, "knob_ab.py", A=a, B=b, defaults=knobs["defaults"], rounds=args.rounds,
                             steps=args.steps)
    rows = []
    for i, (name, layout) in enumerate(cases, 1):
        t0 = time.time()
        rounds = run_model(name, layout, knobs, args.rounds, args.steps, args.seed)
        row = {"model": name, "layout": layout, **summarize(rounds), "rounds_ms": rounds}
        rows.append(row)
        print(f"[{i}/{len(cases)}] {name} {layout}: eager {row['eager']:.2f}  A {row['A']:.2f}  B {row['B']:.2f} ms"
              f"  B/A {row['b_over_a']:.3f} (IQR {row['b_over_a_iqr'][0]:.3f}-{row['b_over_a_iqr'][1]:.3f})"
              f"  ({time.time() - t0:.0f} s)", flush=True)
    with open(os.path.join(args.out, "knob_ab.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"\nA = {' '.join(a) or 'defaults'}; B = {' '.join(b) or 'defaults'}; median of {args.rounds} rounds of "
          f"{args.steps} bf16 steps, ms per step (host issue ms)\n")
    print("| model | layout | eager | A | B | B / A (IQR) | B / eager |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['layout']} | {r['eager']:.2f} ({r['eager_issue']:.2f}) | {r['A']:.2f} "
              f"({r['A_issue']:.2f}) | {r['B']:.2f} ({r['B_issue']:.2f}) | {r['b_over_a']:.3f} "
              f"({r['b_over_a_iqr'][0]:.3f}-{r['b_over_a_iqr'][1]:.3f}) | {r['b_over_eager']:.3f} |")


if __name__ == "__main__":
    main()
