"""Where a host-bound model's step spends its host time with and without ``normkit.enable()``.

The zoo's small models are host-bound (GPU busy well under the step time) and under ``enable()`` their steps issue
slower than eager's although normkit's kernels are faster; the per-call microbenchmark (host_overhead.py) shows a
far smaller gap. This splits a bf16 training step's host time into the forward and the backward issue, for eager and
normkit; eager with the backward on the calling thread too (``torch.autograd.set_multithreading_enabled(False)``,
what ``enable()`` sets by default) and normkit with it on autograd's device thread
(``enable(backward_on_calling_thread=False)``); and normkit with Python's cyclic garbage collector off
(normkit's Python kernels allocate containers each call, eager's C++ ones none: more collections, each
traversing every live object of the model); the settings interleave round by round in one process, and each reports
its collections per step. Then
the time spent inside normkit's aten kernels per call in the model (each registered implementation wrapped with a
clock: whatever of the per-layer gap is not in there is the dispatcher's and autograd's), and a cProfile of
normkit's steps (the backward runs on the calling thread, so it is seen too): the functions with the most own time,
and normkit's functions by cumulative time.

    python benchmarks/model_host_profile.py --models tv_resnet18,mlp_bn1d --out DIR [--rounds 8] [--steps 10]
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import json
import os
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_zoo as Z  # noqa: E402

import normkit  # noqa: E402

# normkit: enable()'s default, the backward on the calling thread; eager: autograd's default, its device thread
SETTINGS = ("eager", "normkit", "eager_1thread", "normkit_worker", "normkit_nogc")


@contextlib.contextmanager
def _setting(name):
    gc_was = gc.isenabled()
    if name.endswith("_nogc"):
        gc.disable()
    try:
        with torch.autograd.set_multithreading_enabled(not name.endswith("_1thread")):
            if name.startswith("normkit"):
                with normkit.enabled(backward_on_calling_thread=not name.endswith("_worker")):
                    yield
            else:
                yield
    finally:
        if gc_was:
            gc.enable()


def _collections() -> int:
    return sum(s["collections"] for s in gc.get_stats())


def _model_step(name, layout, seed):
    model, x = Z.timing_model(name, Z.MODELS[name], layout, "cuda", seed)

    def step(times=None):
        t0 = time.perf_counter()
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            y = Z._output(model(x))
        loss = y.float().square().mean()
        t1 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        loss.backward()
        if times is not None:
            times.append(((t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3))

    return step


def measure(step, rounds, steps):
    """{setting: {"fwd": ms, "bwd": ms, "step": ms, "gc": collections a step}}: medians over rounds of the host
    issue time per step; the garbage collector's collections (any generation) per step."""
    for s in SETTINGS:
        with _setting(s):
            for _ in range(3):
                step()
    per = {s: [] for s in SETTINGS}
    n = len(SETTINGS)
    for r in range(rounds):
        for s in SETTINGS[r % n:] + SETTINGS[:r % n]:
            with _setting(s):
                torch.cuda.synchronize()
                times = []
                c0 = _collections()
                for _ in range(steps):
                    step(times)
                collected = (_collections() - c0) / steps
                torch.cuda.synchronize()
                per[s].append((statistics.mean(t[0] for t in times), statistics.mean(t[1] for t in times),
                               collected))
    out = {}
    for s, values in per.items():
        fwd = statistics.median(v[0] for v in values)
        bwd = statistics.median(v[1] for v in values)
        out[s] = {"fwd": fwd, "bwd": bwd, "step": fwd + bwd, "gc": statistics.mean(v[2] for v in values)}
    return out


def inside_kernels(step, steps):
    """{aten op: µs a call inside normkit's implementation}, over ``steps`` steps: enable() with every
    implementation wrapped in a clock (aten._make_kernel patched for the time of this call)."""
    from normkit import aten

    spent, calls = {}, {}
    real = aten._make_kernel

    def timed(name, impl, takes, original):
        def clocked(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return impl(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0
                calls[name] = calls.get(name, 0) + 1

        return real(name, clocked, takes, original)

    aten._make_kernel = timed
    try:
        with normkit.enabled():
            step()
            torch.cuda.synchronize()
            spent.clear()
            calls.clear()
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
    finally:
        aten._make_kernel = real
    return {name: {"calls_a_step": calls[name] / steps, "us_a_call": spent[name] / calls[name] * 1e6}
            for name in calls}


def profile(step, steps):
    """cProfile text of ``steps`` normkit steps (the backward on the calling thread: cProfile sees it)."""
    with _setting("normkit"):
        step()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        prof.disable()
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    buf.write(f"# {steps} steps; times are totals over them\n## own time\n")
    st.sort_stats("tottime").print_stats(30)
    buf.write("## normkit's functions, cumulative\n")
    st.sort_stats("cumulative").print_stats("normkit", 40)
    return buf.getvalue()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    Z.add_model_args(ap)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args(argv)
    meta, cases = Z.cuda_run(args, "model_host_profile.py", rounds=args.rounds, steps=args.steps)
    rows = []
    for i, (name, layout) in enumerate(cases, 1):
        t0 = time.time()
        step = _model_step(name, layout, args.seed)
        row = {"model": name, "layout": layout, **measure(step, args.rounds, args.steps),
               "inside_normkit": inside_kernels(step, args.steps)}
        with open(os.path.join(args.out, f"profile-{name}-{layout}.txt"), "w") as f:
            f.write(profile(step, args.steps))
        rows.append(row)
        e, n, e1, nw, ng = (row[s] for s in SETTINGS)
        print(f"[{i}/{len(cases)}] {name} {layout}: host ms fwd / bwd  eager {e['fwd']:.2f} / {e['bwd']:.2f}  normkit "
              f"{n['fwd']:.2f} / {n['bwd']:.2f}  eager on one thread {e1['fwd']:.2f} / {e1['bwd']:.2f}  normkit on the "
              f"worker thread {nw['fwd']:.2f} / {nw['bwd']:.2f}  normkit, gc off {ng['fwd']:.2f} / {ng['bwd']:.2f}  collections a "
              f"step eager {e['gc']:.2f} normkit {n['gc']:.2f}  ({time.time() - t0:.0f} s)", flush=True)
        print("    inside normkit's kernels: " + ", ".join(
            f"{op} {v['us_a_call']:.1f} us x {v['calls_a_step']:.0f}" for op, v in row["inside_normkit"].items()))
    with open(os.path.join(args.out, "model_host_profile.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
