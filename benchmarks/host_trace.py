"""Which aten ops and kernels a batch-norm forward + backward runs, and their host time, per path.

``host_overhead.py`` (session 11, one H200 lease) measured ``F.batch_norm`` forward + backward under
``normkit.enable()`` at 490 µs of host time per call for a channels_last bf16 input against 297 µs for a
contiguous one, while ``normkit.batch_norm`` (the same kernels, autograd on the calling thread) took 350 /
329 µs. This traces each path with the profiler (CPU ops and CUDA kernels) and lists, per path, the ops
called per forward + backward with their self host time, and the kernels launched, so the extra work
shows by name. Writes ``DIR/host_trace.json`` and prints the tables.

    PYTHONPATH=src python benchmarks/host_trace.py --out DIR
"""

import argparse
import json
import os
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import normkit
from host_overhead import per_call_us


def paths(layout):
    x = torch.randn(32, 64, 8, 8, device="cuda", dtype=torch.bfloat16)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    xg = x.detach().clone().requires_grad_(True)
    wg = (torch.rand(64, device="cuda") + 0.5).requires_grad_(True)
    bg = torch.randn(64, device="cuda").requires_grad_(True)
    rm, rv = torch.zeros(64, device="cuda"), torch.ones(64, device="cuda")
    g = torch.randn_like(x)

    def fwd_bwd(f):
        return lambda: f(xg, rm, rv, wg, bg, True).backward(g)

    return {
        "eager F.batch_norm (calling thread)": (None, fwd_bwd(F.batch_norm)),
        "F.batch_norm under enable()": ("enable", fwd_bwd(F.batch_norm)),
        "normkit.batch_norm (calling thread)": (None, fwd_bwd(normkit.batch_norm)),
    }


def trace(fn, calls):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    ops, kernels = defaultdict(lambda: [0, 0.0]), defaultdict(int)
    for e in prof.events():
        dev = str(getattr(e, "device_type", "")).endswith("CUDA")
        if dev:
            kernels[e.name] += 1
        else:
            ops[e.name][0] += 1
            ops[e.name][1] += e.self_cpu_time_total
    per = lambda v: round(v / calls, 2)  # noqa: E731
    return ({k: {"calls": per(n), "self_us": per(t)} for k, (n, t) in
             sorted(ops.items(), key=lambda kv: -kv[1][1])},
            {k: per(n) for k, n in sorted(kernels.items(), key=lambda kv: -kv[1])})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "paths": {}}
    prev = torch._C._is_multithreading_enabled()
    for layout in ("contiguous", "channels_last"):
        for name, (mode, fn) in paths(layout).items():
            if mode == "enable":
                normkit.enable()
            else:
                torch._C._set_multithreading_enabled(False)
            try:
                wall = per_call_us(fn, 200, repeats=3)
                ops, kernels = trace(fn, args.calls)
            finally:
                if mode == "enable":
                    normkit.disable()
                torch._C._set_multithreading_enabled(prev)
            key = f"{layout}: {name}"
            res["paths"][key] = {"wall_us": wall, "ops": ops, "kernels": kernels}
            print(f"== {key}: {wall:.1f} us per call\n  kernels per call: {kernels}")
            for op, v in list(ops.items())[:28]:
                print(f"  {v['calls']:5.1f} x {op[:70]:70s} {v['self_us']:8.1f} us self")
    with open(os.path.join(args.out, "host_trace.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
