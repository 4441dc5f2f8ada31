"""Host (CPU) cost per call of normkit's batch/layer norm against eager PyTorch, on tiny CUDA tensors
where the GPU work is negligible, so the wall time per call is the Python + launch cost. Every path is
measured in four launch modes (``MODES``): Triton's ``kernel[grid](...)``, normkit's direct launch through
Triton's Python launcher wrapper, the direct launch calling Triton's C launcher itself (the default on
Triton 3.6; ``normkit.kernels._launch``), and the launchers replayed from recorded plans
(``normkit.kernels._plan``) in Python and by the compiled extension (``normkit.kernels._native``, the default),
alternating within each round.

    PYTHONPATH=src python benchmarks/host_overhead.py --out DIR

For each path it issues ``--calls`` calls back to back (no synchronisation inside the loop; one at the
end) after a warm-up and reports microseconds per call (median of 3 repeats, fastest of the rounds), and the GPU kernel time per
call from the profiler (a path whose GPU time is close to its wall time is GPU-bound, not host-bound). Paths: eager ATen, the
normkit functional API, ``F.*`` under ``normkit.enable()``, and the kernel launchers alone; forward
and forward + backward. A cProfile of the functional batch-norm forward (top functions by own time)
shows where the Python time goes. Writes ``DIR/host_overhead.json`` and ``DIR/host_overhead_profile.txt``.
"""

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import time

import torch
import torch.nn.functional as F

import normkit
from normkit.bench.report import save_png
from normkit.kernels import _launch, _native, _plan
from normkit.kernels import batch_norm as KB
from normkit.kernels import group_norm as KG
from normkit.kernels import layer_norm as KL
from normkit.ops import batch_norm as _obn
from normkit.ops import group_norm as _ogn


def per_call_us(fn, calls, repeats=5):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def gpu_us(fn, calls=20):
    """GPU kernel time per call (profiler), to tell a host-bound path from a GPU-bound one."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total = 0.0
    for e in prof.key_averages():
        total += getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
    return total / calls


def on_calling_thread(f):
    """f with autograd's backward on this thread instead of the CUDA worker thread."""
    def run():
        with torch.autograd.set_multithreading_enabled(False):
            f()
    return run


def bn_paths(layout):
    dev = "cuda"
    x = torch.randn(32, 64, 8, 8, device=dev, dtype=torch.bfloat16)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    xg = x.detach().clone().requires_grad_(True)
    w = torch.rand(64, device=dev) + 0.5
    b = torch.randn(64, device=dev)
    wg, bg = w.clone().requires_grad_(True), b.clone().requires_grad_(True)
    rm, rv = torch.zeros(64, device=dev), torch.ones(64, device=dev)
    g = torch.randn_like(x)

    def fwd_bwd(f):
        def run():
            f(xg, rm, rv, wg, bg, True).backward(g)
        return run

    y, m, r = KB.bn_forward_train(x, w, b, None, None, 0.1, 1e-5)
    from normkit.ops import batch_norm as OB

    return {
        "bwd launcher bn_backward": lambda: KB.bn_backward(g, x, w, m, r, True, (True, True, True)),
        "bwd ops native_batch_norm_backward": lambda: OB.native_batch_norm_backward(
            g, x, w, rm, rv, m, r, True, 1e-5, [True, True, True]),
        "bwd eager native_batch_norm_backward": lambda: torch.ops.aten.native_batch_norm_backward(
            g, x, w, rm, rv, m, r, True, 1e-5, [True, True, True]),
        "fwd+bwd normkit.batch_norm, autograd on the calling thread": on_calling_thread(fwd_bwd(normkit.batch_norm)),
        "fwd eager": lambda: F.batch_norm(x, rm, rv, w, b, True),
        "eval eager": lambda: F.batch_norm(x, rm, rv, w, b, False),
        "fwd normkit.batch_norm": lambda: normkit.batch_norm(x, rm, rv, w, b, True),
        "fwd F.batch_norm under enable()": ("enable", lambda: F.batch_norm(x, rm, rv, w, b, True)),
        "eval F.batch_norm under enable()": ("enable", lambda: F.batch_norm(x, rm, rv, w, b, False)),
        "fwd launcher bn_forward_train": lambda: KB.bn_forward_train(x, w, b, rm, rv, 0.1, 1e-5),
        "fwd+bwd eager": fwd_bwd(F.batch_norm),
        "fwd+bwd normkit.batch_norm": fwd_bwd(normkit.batch_norm),
        "fwd+bwd F.batch_norm under enable()": ("enable", fwd_bwd(F.batch_norm)),
    }


def ln_paths():
    dev = "cuda"
    x = torch.randn(64, 1024, device=dev, dtype=torch.bfloat16)
    w = torch.rand(1024, device=dev, dtype=torch.bfloat16)
    b = torch.randn(1024, device=dev, dtype=torch.bfloat16)
    xg = x.detach().clone().requires_grad_(True)
    wg, bg = w.clone().requires_grad_(True), b.clone().requires_grad_(True)
    g = torch.randn_like(x)
    _, mean, rstd = KL.ln_forward(x, w, b, 1e-5)

    return {
        "bwd launcher ln_backward": lambda: KL.ln_backward(g, x, mean, rstd, w, (True, True, True)),
        "fwd+bwd normkit.layer_norm, autograd on the calling thread": on_calling_thread(
            lambda: normkit.layer_norm(xg, (1024,), wg, bg).backward(g)),
        "fwd eager": lambda: F.layer_norm(x, (1024,), w, b),
        "fwd normkit.layer_norm": lambda: normkit.layer_norm(x, (1024,), w, b),
        "fwd F.layer_norm under enable()": ("enable", lambda: F.layer_norm(x, (1024,), w, b)),
        "fwd launcher ln_forward": lambda: KL.ln_forward(x, w, b, 1e-5),
        "fwd+bwd eager": lambda: F.layer_norm(xg, (1024,), wg, bg).backward(g),
        "fwd+bwd normkit.layer_norm": lambda: normkit.layer_norm(xg, (1024,), wg, bg).backward(g),
        "fwd+bwd F.layer_norm under enable()": ("enable", lambda: F.layer_norm(xg, (1024,), wg, bg).backward(g)),
    }


def gn_paths():
    """Group norm (16x64x8x8 bf16, 8 groups: the split path, three launches a direction)."""
    dev = "cuda"
    x = torch.randn(16, 64, 8, 8, device=dev, dtype=torch.bfloat16)
    w, b = torch.rand(64, device=dev, dtype=torch.bfloat16) + 0.5, torch.randn(64, device=dev, dtype=torch.bfloat16)
    xg = x.detach().clone().requires_grad_(True)
    g = torch.randn_like(x)
    _, mean, rstd = KG.gn_forward(x, w, b, 8, 1e-5, torch.bfloat16)
    return {
        "fwd launcher gn_forward": lambda: KG.gn_forward(x, w, b, 8, 1e-5, torch.bfloat16),
        "bwd launcher gn_backward": lambda: KG.gn_backward(g, x, mean, rstd, w, 8, (True, True, True), torch.bfloat16),
        "fwd eager": lambda: F.group_norm(x, 8, w, b),
        "fwd F.group_norm under enable()": ("enable", lambda: F.group_norm(x, 8, w, b)),
        "fwd+bwd eager": on_calling_thread(lambda: F.group_norm(xg, 8, w, b).backward(g)),
        "fwd+bwd F.group_norm under enable()": ("enable", lambda: F.group_norm(xg, 8, w, b).backward(g)),
    }


# launch modes: Triton's kernel[grid]; normkit's direct launch through Triton's Python launcher wrapper;
# the direct launch calling the C launcher itself; the launchers' calls replayed from recorded plans in Python;
# the same replayed by the compiled extension (normkit.kernels._native: the default once it has been built)
MODES = {"triton": (False, False, False, False), "direct": (True, False, False, False),
         "raw": (True, True, False, False), "plan": (True, True, True, False), "native": (True, True, True, True)}


def routes_ab(paths, calls, rounds):
    """The ``enable()`` paths with the fast routes off and on (``normkit.ops.batch_norm.set_fast_routes``: batch,
    layer and RMS norm; batch norm's eval routes and group norm's, ``EVAL_ROUTES`` / ``ROUTES_ON``, with them),
    native replay, the two settings alternating in every round in a rotated order (rows
    measured one after another see the leased host drift by up to 2x; within a round they see the same host).
    Per path: each setting's fastest round and the median of the per-round ratios on / off."""
    out = {}
    was, was_eval, was_gn = _obn.fast_routes_enabled(), _obn.EVAL_ROUTES, _ogn.ROUTES_ON
    for name, fn in paths.items():
        if not isinstance(fn, tuple):
            continue
        walls = {"off": [], "on": []}
        try:
            for r in range(rounds):
                for setting in (("off", "on") if r % 2 == 0 else ("on", "off")):
                    _obn.set_fast_routes(setting == "on")  # enable() reads it
                    _obn.EVAL_ROUTES = _ogn.ROUTES_ON = setting == "on"
                    normkit.enable()
                    try:
                        walls[setting].append(per_call_us(fn[1], calls, repeats=3))
                    finally:
                        normkit.disable()
        finally:
            _obn.set_fast_routes(was)
            _obn.EVAL_ROUTES, _ogn.ROUTES_ON = was_eval, was_gn
        ratio = statistics.median(b / a for a, b in zip(walls["off"], walls["on"]))
        out[name] = {"off_us": min(walls["off"]), "on_us": min(walls["on"]), "on_over_off": ratio, "rounds": walls}
        print(f"  {name:58s} routes off {min(walls['off']):7.1f}  on {min(walls['on']):7.1f} us/call wall, "
              f"on / off {ratio:.3f} (median of {rounds} rounds)", flush=True)
    return out


def measure(paths, calls, rounds):
    """Every path in every launch mode, the modes alternating within each of ``rounds`` rounds (the
    leased host's speed drifts); per mode the fastest round."""
    out = {}
    plans_default = _plan.enabled()
    for name, fn in paths.items():
        enable = isinstance(fn, tuple)
        if enable:
            fn = fn[1]
            normkit.enable()
        try:
            walls = {m: [] for m in MODES}
            for _ in range(rounds):
                for mode, (direct, raw, plans, native) in MODES.items():
                    _launch.set_direct(direct, raw)
                    _plan.set_plans(plans)
                    _native.set_native(native)
                    walls[mode].append(per_call_us(fn, calls, repeats=3))
            gpu = gpu_us(fn)
        finally:
            _launch.set_direct(True)
            _plan.set_plans(plans_default)
            _native.set_native(True)
            if enable:
                normkit.disable()
        out[name] = {"wall_us": {m: min(w) for m, w in walls.items()}, "wall_us_rounds": walls, "gpu_us": gpu}
        cols = "  ".join(f"{m} {min(w):7.1f}" for m, w in walls.items())
        print(f"  {name:58s} {cols} us/call wall, {gpu:6.1f} us GPU", flush=True)
    return out


def worker_thread_diagnosis(calls):
    """Where the autograd worker thread's extra time goes: the time spent inside normkit's batch-norm
    backward implementation, per call, when autograd runs it on its CUDA worker thread (the default)
    and on the calling thread, against the whole fwd+bwd call."""
    import threading

    from normkit.ops import custom

    inner = custom._bn_backward_impl
    acc = {"s": 0.0, "n": 0, "threads": set()}

    def timed(*a):
        t0 = time.perf_counter()
        try:
            return inner(*a)
        finally:
            acc["s"] += time.perf_counter() - t0
            acc["n"] += 1
            acc["threads"].add(threading.get_ident())

    custom._bn_backward_impl = timed
    try:
        run = bn_paths("contiguous")["fwd+bwd normkit.batch_norm"]
        out = {}
        for name, multi in (("worker thread", True), ("calling thread", False)):
            with torch.autograd.set_multithreading_enabled(multi):
                per_call_us(run, 20, repeats=1)
                acc.update(s=0.0, n=0, threads=set())
                whole = per_call_us(run, calls, repeats=1)
            inside = acc["s"] / max(acc["n"], 1) * 1e6
            out[name] = {"whole_fwd_bwd_us": whole, "inside_backward_impl_us": inside,
                         "backward_on_main_thread": acc["threads"] == {threading.get_ident()}}
            print(f"  autograd on the {name}: fwd+bwd {whole:.1f} us/call, {inside:.1f} us of it inside "
                  f"the backward implementation", flush=True)
        return out
    finally:
        custom._bn_backward_impl = inner


def plot(res, path):
    """Horizontal bars: µs per call of every normkit path in each launch mode, eager's beside them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(f"{section}: {name}", r["wall_us"]) for section, paths in res["us_per_call"].items()
            for name, r in paths.items()]
    modes = [m for m in MODES if m in rows[0][1]]  # (older JSONs hold fewer modes)
    fig, ax = plt.subplots(figsize=(11, 0.42 * len(rows) + 1.5))
    h = 0.8 / len(modes)
    for j, mode in enumerate(modes):
        ax.barh([i + j * h for i in range(len(rows))], [w[mode] for _, w in rows], height=h, label=mode)
    ax.set_yticks([i + h for i in range(len(rows))], [n for n, _ in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("host µs per call (tiny tensors; eager rows: launch mode irrelevant, shows the host's noise)")
    ax.set_title(f"{res['device']}, torch {res['torch']}, triton {res['triton']}: host cost per call")
    ax.legend(title="normkit launch")
    fig.tight_layout()
    save_png(fig, path, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ab-rounds", type=int, default=8, help="rounds of the fast routes' off / on comparison")
    ap.add_argument("--replot", default=None, help="only redraw host_overhead.png from this host_overhead.json")
    ap.add_argument("--diagnose-worker-thread", action="store_true",
                    help="only the autograd worker-thread diagnosis (batch norm, contiguous)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KNOB=INT",
                    help="kernel heuristic knobs for this run (normkit.kernels.set_knobs), e.g. fused_max_rows=8192")
    args = ap.parse_args()
    from normkit.kernels import set_knobs

    set_knobs(args.set)
    os.makedirs(args.out, exist_ok=True)
    if args.replot:
        with open(args.replot) as f:
            plot(json.load(f), os.path.join(args.out, "host_overhead.png"))
        return
    if args.diagnose_worker_thread:
        res = worker_thread_diagnosis(args.calls)
        with open(os.path.join(args.out, "host_worker_thread.json"), "w") as f:
            json.dump(res, f, indent=1)
        return
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "calls": args.calls, "knobs": args.set, "us_per_call": {}}
    t0 = time.time()
    _native.start()
    _native.wait(600)
    res["native_replay"] = _native.status()
    print(f"native replay: {_native.status()} ({time.time() - t0:.1f} s)", flush=True)
    print("launch modes: " + ", ".join(MODES), flush=True)
    for layout in ("contiguous", "channels_last"):
        print(f"batch_norm 32x64x8x8 bf16 {layout}", flush=True)
        res["us_per_call"][f"batch_norm {layout}"] = measure(bn_paths(layout), args.calls, args.rounds)
    print("layer_norm 64x1024 bf16", flush=True)
    res["us_per_call"]["layer_norm"] = measure(ln_paths(), args.calls, args.rounds)
    print("group_norm 16x64x8x8 bf16, 8 groups (launch plans on for it: _CFG['plans'])", flush=True)
    KG._CFG["plans"] = 1
    res["us_per_call"]["group_norm"] = measure(gn_paths(), args.calls, args.rounds)
    print(f"fast routes off against on, alternating within each of {args.ab_rounds} rounds (native replay)", flush=True)
    res["routes_ab"] = {}
    for family, paths in (("batch_norm contiguous", bn_paths("contiguous")),
                          ("batch_norm channels_last", bn_paths("channels_last")), ("layer_norm", ln_paths()),
                          ("group_norm", gn_paths())):
        res["routes_ab"][family] = routes_ab(paths, args.calls, args.ab_rounds)
    res["raw_launcher"] = _launch.raw_summary()  # compiled kernels by launch path (and why not raw)
    print(f"raw C-launcher calls: {res['raw_launcher']}", flush=True)

    # where the functional batch-norm forward + backward spends its Python time (autograd on this
    # thread, so that the profiler sees the backward too)
    p = bn_paths("channels_last")["fwd+bwd normkit.batch_norm, autograd on the calling thread"]
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.calls):
        p()
    torch.cuda.synchronize()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(45)
    with open(os.path.join(args.out, "host_overhead_profile.txt"), "w") as f:
        f.write(s.getvalue())
    with open(os.path.join(args.out, "host_overhead.json"), "w") as f:
        json.dump(res, f, indent=1)
    plot(res, os.path.join(args.out, "host_overhead.png"))


if __name__ == "__main__":
    main()
