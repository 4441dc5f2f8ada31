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
from collections import Counter

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_zoo as Z  # noqa: E402

import normkit  # noqa: E402
from normkit.kernels import _native  # noqa: E402
from normkit.ops import batch_norm as _obn  # noqa: E402

# normkit: enable()'s default, the backward on the calling thread; eager: autograd's default, its device thread
# normkit_python: launch plans replayed in Python rather than by the compiled extension (normkit.kernels._native)
# normkit_noroutes: without the fast routes (batch, layer, RMS norm; enable() wires them in by default)
SETTINGS = ("eager", "normkit", "eager_1thread", "normkit_worker", "normkit_nogc", "normkit_python",
            "normkit_noroutes")


@contextlib.contextmanager
def _setting(name):
    gc_was = gc.isenabled()
    if name.endswith("_nogc"):
        gc.disable()
    _native.set_native(not name.endswith("_python"))
    routes_were = _obn.fast_routes_enabled()
    _obn.set_fast_routes(not name.endswith("_noroutes"))
    try:
        with torch.autograd.set_multithreading_enabled(not name.endswith("_1thread")):
            if name.startswith("normkit"):
                with normkit.enabled(backward_on_calling_thread=not name.endswith("_worker")):
                    yield
            else:
                yield
    finally:
        _obn.set_fast_routes(routes_were)
        _native.set_native(True)
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


class Clocks:
    """Seconds and counts per (aten op, piece) while normkit's implementations run: ``impl`` (the registered
    implementation: whatever of a layer's gap is not in there is the dispatcher's and autograd's), ``planned``
    (``_plan.planned``: the plan key and the replay), ``replay``, and the allocations inside the replay and elsewhere
    in the implementation."""

    def __init__(self):
        self.spent, self.calls = Counter(), Counter()
        self.op = None  # the aten op whose implementation is running
        self.in_replay = False

    def _clock(self, piece, fn, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.spent[(self.op, piece)] += time.perf_counter() - t0
            self.calls[(self.op, piece)] += 1

    @contextlib.contextmanager
    def installed(self):
        """normkit enabled with its implementations, plans and allocations clocked (patched for the time of it)."""
        from normkit import aten
        from normkit.kernels import _plan

        real_make, real_planned, real_replay = aten._make_kernel, _plan.planned, _plan._Plan.replay
        real_empty, real_strided = torch.empty, torch.empty_strided
        clocks = self

        def make(name, impl, takes, original):
            def clocked(*args, **kwargs):
                clocks.op = name
                try:
                    return clocks._clock("impl", impl, *args, **kwargs)
                finally:
                    clocks.op = None

            return real_make(name, clocked, takes, original)

        def planned(*args, **kwargs):
            return clocks._clock("planned", real_planned, *args, **kwargs)

        def replay(plan, *args):
            clocks.in_replay = True
            try:
                return clocks._clock("replay", real_replay, plan, *args)
            finally:
                clocks.in_replay = False

        def alloc(real):
            def clocked(*args, **kwargs):
                if clocks.op is None:
                    return real(*args, **kwargs)
                return clocks._clock("alloc_replay" if clocks.in_replay else "alloc_other", real, *args, **kwargs)

            return clocked

        aten._make_kernel, _plan.planned, _plan._Plan.replay = make, planned, replay
        torch.empty, torch.empty_strided = alloc(real_empty), alloc(real_strided)
        try:
            with normkit.enabled():
                yield
        finally:
            aten._make_kernel, _plan.planned, _plan._Plan.replay = real_make, real_planned, real_replay
            torch.empty, torch.empty_strided = real_empty, real_strided

    def per_call(self, steps) -> dict:
        """{op: {"calls_a_step", "us_a_call" (impl), piece: µs a call of the op}} over ``steps`` steps."""
        out = {}
        for (op, piece), s in self.spent.items():
            if op is None:
                continue
            n = self.calls[(op, "impl")]
            row = out.setdefault(op, {"calls_a_step": n / steps})
            row["us_a_call" if piece == "impl" else piece] = s / max(1, n) * 1e6
        return out


def inside_kernels(step, steps):
    """Clocks.per_call of ``steps`` steps under enable(), after one step that records the plans; with the native
    replay loaded, also its own clocks: µs a replay in allocations, in launches (cuLaunchKernelEx) and in all."""
    clocks = Clocks()
    mod = _native.module()
    with clocks.installed():
        step()
        torch.cuda.synchronize()
        clocks.spent.clear()
        clocks.calls.clear()
        if mod is not None:
            mod.set_timing(True)
        try:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
        finally:
            t = mod.timings() if mod is not None else None
            if mod is not None:
                mod.set_timing(False)
    out = clocks.per_call(steps)
    if t and t["replays"]:
        n = t["replays"]
        out["native replay"] = {"calls_a_step": n / steps, "us_a_call": t["total_ns"] / n / 1e3,
                                "alloc": t["alloc_ns"] / n / 1e3, "launch": t["launch_ns"] / n / 1e3}
    return out


def format_inside(inside) -> str:
    pieces = ("planned", "replay", "alloc_replay", "alloc_other", "alloc", "launch")
    return ", ".join(f"{op} {v['us_a_call']:.1f} us x {v['calls_a_step']:.0f} ("
                     + " ".join(f"{p} {v[p]:.1f}" for p in pieces if p in v) + ")" for op, v in inside.items())


def routed_share(step, steps) -> dict:
    """Per op normkit handled under enable(): calls a step, and how many of them a fast route answered."""
    with _setting("normkit"):
        step()
        torch.cuda.synchronize()
        normkit.aten.reset_counts()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        calls, routed = normkit.aten.call_counts(), normkit.aten.routed_counts()
    return {op: {"calls_a_step": n / steps, "routed_a_step": routed.get(op, 0) / steps}
            for op, n in calls.items()}


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
    _native.start()  # (normkit's plans replay natively once the extension is built: wait for it)
    _native.wait(600)
    meta["native_replay"] = _native.status()
    print(f"native replay: {_native.status()}", flush=True)
    rows = []
    for i, (name, layout) in enumerate(cases, 1):
        t0 = time.time()
        step = _model_step(name, layout, args.seed)
        row = {"model": name, "layout": layout, **measure(step, args.rounds, args.steps),
               "inside_normkit": inside_kernels(step, args.steps), "routed": routed_share(step, args.steps)}
        with open(os.path.join(args.out, f"profile-{name}-{layout}.txt"), "w") as f:
            f.write(profile(step, args.steps))
        rows.append(row)
        labels = {"eager_1thread": "eager on one thread", "normkit_worker": "normkit on the worker thread",
                  "normkit_nogc": "normkit, gc off", "normkit_python": "normkit, Python replay",
                  "normkit_noroutes": "normkit, no fast routes"}
        times = "  ".join(f"{labels.get(s, s)} {row[s]['fwd']:.2f} / {row[s]['bwd']:.2f}" for s in SETTINGS)
        print(f"[{i}/{len(cases)}] {name} {layout}: host ms fwd / bwd  {times}  collections a step eager "
              f"{row['eager']['gc']:.2f} normkit {row['normkit']['gc']:.2f}  ({time.time() - t0:.0f} s)", flush=True)
        print("    inside normkit's kernels: " + format_inside(row["inside_normkit"]))
        print("    fast routes taken a step: " + ", ".join(f"{op} {v['routed_a_step']:.0f} of {v['calls_a_step']:.0f}"
                                                        for op, v in row["routed"].items()))
    with open(os.path.join(args.out, "model_host_profile.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
