"""Where a host-bound model's step spends its host time with and without ``normkit.enable()``.

The zoo's small models are host-bound (GPU busy well under the step time) and under ``enable()`` their steps issue
slower than eager's although normkit's kernels are faster; the per-call microbenchmark (host_overhead.py) shows a
far smaller gap. This splits a bf16 training step's host time into the forward and the backward issue, for eager and
normkit, with the autograd engine on its device thread (the default) and on the calling thread
(``torch.autograd.set_multithreading_enabled(False)``); the settings interleave round by round in one process. Then
a cProfile of normkit's steps on the calling thread (so that the backward's Python is seen too): the functions with
the most own time, and normkit's functions by cumulative time.

    python benchmarks/model_host_profile.py --models tv_resnet18,mlp_bn1d --out DIR [--rounds 8] [--steps 10]
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
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

SETTINGS = ("eager", "normkit", "eager_1thread", "normkit_1thread")


@contextlib.contextmanager
def _setting(name):
    threads = not name.endswith("_1thread")
    with torch.autograd.set_multithreading_enabled(threads):
        with normkit.enabled() if name.startswith("normkit") else contextlib.nullcontext():
            yield


def _model_step(name, layout, seed):
    spec = Z.MODELS[name]
    model, make_input = Z.build(name, spec, seed)
    x = make_input(spec["time_batch"], torch.Generator(device="cpu").manual_seed(seed + 1))
    model, x = Z._prep(model, x, torch.float32, layout, "cuda")
    model.train()

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
    """{setting: {"fwd": ms, "bwd": ms, "step": ms}}: medians over rounds of the host issue time per step."""
    for s in SETTINGS:
        with _setting(s):
            for _ in range(3):
                step()
    per = {s: [] for s in SETTINGS}
    for r in range(rounds):
        for s in SETTINGS[r % 4:] + SETTINGS[:r % 4]:
            with _setting(s):
                torch.cuda.synchronize()
                times = []
                for _ in range(steps):
                    step(times)
                torch.cuda.synchronize()
                per[s].append((statistics.mean(t[0] for t in times), statistics.mean(t[1] for t in times)))
    out = {}
    for s, values in per.items():
        fwd = statistics.median(v[0] for v in values)
        bwd = statistics.median(v[1] for v in values)
        out[s] = {"fwd": fwd, "bwd": bwd, "step": fwd + bwd}
    return out


def profile(step, steps):
    """cProfile text of ``steps`` normkit steps with the backward on the calling thread."""
    with _setting("normkit_1thread"):
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
    ap.add_argument("--models", required=True, help="comma-separated model_zoo names")
    ap.add_argument("--layouts", default="contiguous,channels_last")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=237)
    ap.add_argument("--out", default=".")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("model_host_profile.py times CUDA steps: no GPU here")
    os.makedirs(args.out, exist_ok=True)
    meta = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
            "git_sha": os.environ.get("NORMKIT_GIT_SHA", "unknown"), "rounds": args.rounds, "steps": args.steps}
    rows = []
    cases = [(m, lay) for m in args.models.split(",") for lay in args.layouts.split(",")
             if lay in Z.MODELS[m]["layouts"]]
    for i, (name, layout) in enumerate(cases, 1):
        t0 = time.time()
        step = _model_step(name, layout, args.seed)
        row = {"model": name, "layout": layout, **measure(step, args.rounds, args.steps)}
        with open(os.path.join(args.out, f"profile-{name}-{layout}.txt"), "w") as f:
            f.write(profile(step, args.steps))
        rows.append(row)
        e, n, e1, n1 = (row[s] for s in SETTINGS)
        print(f"[{i}/{len(cases)}] {name} {layout}: host ms fwd / bwd  eager {e['fwd']:.2f} / {e['bwd']:.2f}  normkit "
              f"{n['fwd']:.2f} / {n['bwd']:.2f}  one thread: eager {e1['fwd']:.2f} / {e1['bwd']:.2f}  normkit "
              f"{n1['fwd']:.2f} / {n1['bwd']:.2f}  ({time.time() - t0:.0f} s)", flush=True)
    with open(os.path.join(args.out, "model_host_profile.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
