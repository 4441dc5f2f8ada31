"""Training steps of host-bound models captured in one CUDA graph, with and without ``normkit.enable()``.

The zoo's small models are host-bound: their steps take longer than the GPU's work, and under ``enable()`` longer
still (each normkit call costs more host time than ATen's C++ kernel: NOTES-host-overhead.md). A captured step pays
no host time per kernel, so what is left is the GPU's work, where normkit's kernels are the faster ones. This
captures a whole bf16 training step (forward, loss, backward into the parameters' ``.grad``; no optimizer) per the
PyTorch whole-network recipe (warm-up on a side stream, then ``torch.cuda.graph``), replays it, and reports ms per
step for eager and normkit, graphed and not; it also checks that normkit's replayed gradients have the bits of
normkit's uncaptured step (batch statistics in training: the gradients do not depend on the running statistics
the steps advance).

    python benchmarks/graphed_steps.py --models tv_resnet18,tv_mobilenet_v3_small --out DIR [--steps 20]
    python benchmarks/graphed_steps.py --plot DIR/graphed_steps.json     # the plot again, no GPU
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_zoo as Z  # noqa: E402

import normkit  # noqa: E402
from normkit.bench.report import save_png  # noqa: E402


def _step_fn(name, layout, seed):
    """(model, step): a bf16 training step whose autocast keeps no cast cache (required inside a capture)."""
    model, x = Z.timing_model(name, Z.MODELS[name], layout, "cuda", seed)

    def step():
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, cache_enabled=False):
            y = Z._output(model(x))
        y.float().square().mean().backward()

    return model, step


def _grads(model):
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _capture(model, step):
    """A CUDAGraph of one step (warmed up on a side stream first, as capture requires)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    model.zero_grad(set_to_none=True)  # the captured backward allocates the .grad tensors it writes
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def _ms(fn, steps, rounds=5):
    """Median over rounds of ms per call (CUDA events)."""
    out = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(steps):
            fn()
        e1.record()
        e1.synchronize()
        out.append(e0.elapsed_time(e1) / steps)
    return statistics.median(out)


def _not_capturable(model):
    """Why a model's training step cannot be captured whatever runs its kernels, else None: a momentum=None batch
    norm (torch.nn's module reads num_batches_tracked on the host each step: a sync, which a capture forbids)."""
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training and m.momentum is None:
            return (f"not capturable, eager or normkit: {name} has momentum=None (torch.nn reads "
                    "num_batches_tracked on the host)")
    return None


def run(name, layout, steps, seed):
    row = {"model": name, "layout": layout}
    for setting in ("eager", "normkit"):
        model, step = _step_fn(name, layout, seed)
        why = _not_capturable(model)
        if why:
            raise ValueError(why)

        def plain():
            model.zero_grad(set_to_none=True)
            step()

        with normkit.enabled() if setting == "normkit" else contextlib.nullcontext():
            for _ in range(3):
                plain()
            row[setting] = _ms(plain, steps)
            plain()
            torch.cuda.synchronize()
            uncaptured = _grads(model)
            graph = _capture(model, step)
            graph.replay()
            torch.cuda.synchronize()
            replayed = _grads(model)
            row[setting + "_graphed"] = _ms(graph.replay, steps)
        row[setting + "_graph_same_bits"] = (len(uncaptured) == len(replayed)
                                             and all(torch.equal(a, b) for a, b in zip(uncaptured, replayed)))
        del graph
    row["speedup"] = row["eager"] / row["normkit"]
    row["speedup_graphed"] = row["eager_graphed"] / row["normkit_graphed"]
    return row


def plot(path):
    """graphed_steps.png beside the JSON: ms a step per model and layout, eager / normkit, uncaptured and graphed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(path) as f:
        rows = [r for r in json.load(f)["rows"] if "error" not in r]
    labels = [f"{r['model']}\n{r['layout']}" for r in rows]
    series = (("eager", "eager", "tab:gray"), ("normkit", "normkit", "tab:blue"),
              ("eager_graphed", "eager, graphed", "silver"), ("normkit_graphed", "normkit, graphed", "tab:green"))
    fig, ax = plt.subplots(figsize=(2.2 + 1.9 * len(rows), 4))
    width = 0.2
    for k, (key, label, color) in enumerate(series):
        xs = [i + (k - 1.5) * width for i in range(len(rows))]
        ax.bar(xs, [r[key] for r in rows], width, label=label, color=color)
    for i, r in enumerate(rows):
        ax.annotate(f"{r['speedup_graphed']:.2f}x", (i + 1.5 * width, r["normkit_graphed"]), ha="center",
                    va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel("ms a bf16 training step (lower is better)")
    ax.set_title("whole steps: uncaptured vs one CUDA graph (label: normkit graphed over eager graphed)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = os.path.join(os.path.dirname(path), "graphed_steps.png")
    save_png(fig, out, dpi=110)
    print(f"wrote {out}")


def main(argv=None):
    only_plot = argparse.ArgumentParser(add_help=False)
    only_plot.add_argument("--plot", metavar="JSON", help="only draw graphed_steps.png from a run's JSON")
    known, _ = only_plot.parse_known_args(argv)
    if known.plot:
        plot(known.plot)
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 parents=[only_plot])
    Z.add_model_args(ap)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args(argv)
    meta, cases = Z.cuda_run(args, "graphed_steps.py", steps=args.steps)
    rows = []
    for i, (name, layout) in enumerate(cases, 1):
        t0 = time.time()
        try:
            row = run(name, layout, args.steps, args.seed)
        except Exception as e:  # one model's failure (a capture error) is reported, the others still run
            row = {"model": name, "layout": layout, "error": f"{type(e).__name__}: {e}"[:300]}
            print(f"[{i}/{len(cases)}] {name} {layout}: {row['error']}", flush=True)
        else:
            print(f"[{i}/{len(cases)}] {name} {layout}: ms a step eager {row['eager']:.2f} normkit {row['normkit']:.2f}"
                  f" | graphed eager {row['eager_graphed']:.2f} normkit {row['normkit_graphed']:.2f} "
                  f"({row['speedup_graphed']:.2f}x; normkit's replay same bits: {row['normkit_graph_same_bits']})"
                  f"  ({time.time() - t0:.0f} s)", flush=True)
        rows.append(row)
    path = os.path.join(args.out, "graphed_steps.json")
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    plot(path)
    print("\n| model | layout | eager | normkit | speedup | eager graphed | normkit graphed | speedup graphed | "
          "replay same bits |\n|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | {r['layout']} | {r['error']} |")
            continue
        print(f"| {r['model']} | {r['layout']} | {r['eager']:.2f} | {r['normkit']:.2f} | {r['speedup']:.2f}x | "
              f"{r['eager_graphed']:.2f} | {r['normkit_graphed']:.2f} | {r['speedup_graphed']:.2f}x | "
              f"{r['normkit_graph_same_bits']} |")


if __name__ == "__main__":
    main()
