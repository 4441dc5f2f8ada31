"""Why normkit's RMS forward reads ~0.075 ms in the bench but ~0.068 ms in ln_kernels.py on 16384x4096 bf16
(Liger: 0.067 in both): the same kernel timed by the bench's Timer through each call path and rotation
count, and the GPU kernels each path launches per call (profiler). ``--bisect`` then rebuilds the bench's
context one step at a time (its inputs, its float64 oracle kept alive, its whole ``run_case`` with the
implementations in either order), recording per step the ms, calls per graph replay and the estimate.

    PYTHONPATH=src python benchmarks/rms_fwd_gap.py [--out DIR] [--bisect]
"""

import argparse
import json
import os
import sys

if "--dry" in sys.argv:  # CPU + the interpreter, tiny shape: checks the script, times nothing real
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

import normkit.functional as NF  # noqa: E402
from normkit.bench.timing import Timer  # noqa: E402
from normkit.kernels import layer_norm as L  # noqa: E402


def bisect(M, N, dev="cuda"):
    """The bench's context around a row, step by step: {step: {impl: (ms, calls per replay, estimate ms)}}."""
    from normkit.bench import cases as C
    from normkit.bench import runner as R
    from normkit.bench.impls import LigerImpl, NormkitImpl
    from normkit.bench.oracle import oracle

    case = C.Case("rms_norm", (M, N), "bfloat16", "bfloat16")
    out = {}

    def timed(step, impl, inp):
        timer = Timer(dev, warmup_ms=5.0, rep_ms=25.0)  # the bench's settings
        fn = impl.build(case)
        x, w, b, rm, rv = R._leaves(inp, True, fresh_stats=True)
        with torch.enable_grad(), timer.stream_ctx():
            ms = timer.time([lambda: fn(x, w, b, rm, rv)])[0]
        out.setdefault(step, {})[impl.name] = (ms, timer.last_calls, timer.last_estimate_ms)

    impls = [NormkitImpl(), LigerImpl()]
    impls = [i for i in impls if i.unavailable() is None and i.supports(case, dev) is None]
    inp = C.make_inputs(case, dev, seed=0)
    for impl in impls:
        timed("bench inputs", impl, inp)
    ref, _ = oracle(case, inp, want_bwd=True)  # kept alive from here on, as in run_case
    for impl in impls:
        timed("bench inputs + float64 oracle alive", impl, inp)
    del ref
    l2 = (getattr(torch.cuda.get_device_properties(0), "L2_cache_size", None) or (60 << 20)) if dev == "cuda" else None
    for name, order in (("run_case, normkit first", impls), ("run_case, normkit last", impls[::-1])):
        ctx = R.Context(device=dev, timer=Timer(dev, warmup_ms=5.0, rep_ms=25.0), copy_gbps=1.0, l2_bytes=l2)
        for r in R.run_case(case, order, ctx):
            if r["direction"] == "fwd":
                out.setdefault(name, {})[r["impl"]] = (r["ms"], r.get("calls_per_timing"), r.get("estimate_ms"))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--bisect", action="store_true")
    ap.add_argument("--dry", action="store_true", help="CPU, interpreter, a tiny shape: checks the script")
    args = ap.parse_args()
    if args.dry:
        steps = bisect(8, 64, "cpu")
        print(json.dumps(steps, indent=1))
        return
    M, N = 16384, 4096
    timer = Timer("cuda")
    res = {}
    sets = [(torch.randn(M, N, device="cuda", dtype=torch.bfloat16),
             (torch.rand(N, device="cuda") + 0.5).to(torch.bfloat16)) for _ in range(4)]
    leaves = [(x.clone().requires_grad_(), w.clone().requires_grad_()) for x, w in sets]
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except Exception:  # the wheel not installed
        LigerRMSNormFunction = None
    paths = {
        "kernel launcher": lambda x, w: L.rms_forward(x, w, 1e-6),
        "functional, no grad": lambda x, w: NF.rms_norm(x, (N,), w, 1e-6),
    }
    for k in (1, 2, 4):
        for name, f in paths.items():
            fns = [lambda x=x, w=w, f=f: f(x, w) for x, w in sets[:k]]
            res[f"{name}, {k} sets"] = [timer.time(fns)[0], timer.last_calls, timer.last_estimate_ms]
        with torch.enable_grad():
            fns = [lambda x=x, w=w: NF.rms_norm(x, (N,), w, 1e-6) for x, w in leaves[:k]]
            res[f"functional, grad leaves, {k} sets"] = [timer.time(fns)[0], timer.last_calls, timer.last_estimate_ms]
            if LigerRMSNormFunction is not None:
                fns = [lambda x=x, w=w: LigerRMSNormFunction.apply(x, w, 1e-6) for x, w in leaves[:k]]
                res[f"liger, grad leaves, {k} sets"] = [timer.time(fns)[0], timer.last_calls, timer.last_estimate_ms]
    kernels = {}
    for name, f in (("kernel launcher", paths["kernel launcher"]),
                    ("functional, grad leaves", lambda x, w: NF.rms_norm(x, (N,), w, 1e-6))):
        x, w = leaves[0]
        with torch.enable_grad():
            f(x, w)
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
                f(x, w)
                torch.cuda.synchronize()
        kernels[name] = [(e.name, round(e.device_time, 2)) for e in p.events()
                         if e.device_type == torch.autograd.DeviceType.CUDA]
    for k, (ms, calls, est) in res.items():
        print(f"{k:40s} {ms:.4f} ms  calls/replay {calls}  estimate {est:.4f} ms", flush=True)
    for k, v in kernels.items():
        print(k, v)
    steps = bisect(M, N) if args.bisect else {}
    for step, by_impl in steps.items():
        for impl, (ms, calls, est) in by_impl.items():
            print(f"{step:40s} {impl:8s} {ms:.4f} ms  calls/replay {calls}  estimate {est:.4f} ms", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "rms_fwd_gap.json"), "w") as f:
        json.dump({"ms": res, "kernels": kernels, "bisect": steps, "torch": torch.__version__}, f, indent=1)


if __name__ == "__main__":
    main()
