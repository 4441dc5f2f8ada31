"""Per-kernel GPU time of normkit's layer / RMS norm through ``normkit.functional`` (what the bench times),
from the profiler: which launches a forward + backward makes and what each costs.

    PYTHONPATH=src python benchmarks/ln_profile.py [--shapes 16384x4096 ...] [--iters 20] [--out DIR]

Each case (op, shape, x dtype, param dtype) runs ``--iters`` forward + backward steps under
torch.profiler, rotating among input sets that together exceed 4x L2 (cold inputs, as in the bench).
Prints µs per step for every CUDA kernel and writes ``ln_profile.json``. Made to explain rows where the
param dtype alone changes the bench's time (bf16 x with fp32 w/b: LN 16384x4096 backward 0.219 ms
against 0.122 with bf16 w/b, 2026-12-01).
"""

import argparse
import json
import os
from collections import defaultdict

import torch

import normkit.functional as F
from bn_breakdown import cuda_kernel_events  # same folder: run as `python benchmarks/ln_profile.py`

DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def profile_case(op, M, N, dt, pdt, iters):
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    sets = max(2, -(-4 * l2 // (M * N * dt.itemsize)))
    inputs = []
    for _ in range(sets):
        x = torch.randn(M, N, device="cuda", dtype=dt, requires_grad=True)
        w = torch.randn(N, device="cuda", dtype=pdt, requires_grad=True)
        b = torch.randn(N, device="cuda", dtype=pdt, requires_grad=True) if op == "layer_norm" else None
        inputs.append((x, w, b, torch.randn(M, N, device="cuda", dtype=dt)))

    def step(i):
        x, w, b, dy = inputs[i % sets]
        y = F.layer_norm(x, (N,), w, b, 1e-5) if op == "layer_norm" else F.rms_norm(x, (N,), w, 1e-6)
        torch.autograd.grad(y, [t for t in (x, w, b) if t is not None], dy)

    per = defaultdict(float)
    for name, _, dur in cuda_kernel_events(step, iters):
        per[name[:90]] += dur / iters
    return dict(sorted(per.items(), key=lambda kv: -kv[1]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["16384x4096", "8192x8192"])
    ap.add_argument("--ops", nargs="+", default=["layer_norm"], choices=["layer_norm", "rms_norm"])
    ap.add_argument("--cases", nargs="+", default=["bf16/bf16", "bf16/fp32", "fp32/fp32"],
                    help="x dtype / param dtype")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    results = []
    for op in args.ops:
        for shape in args.shapes:
            M, N = (int(v) for v in shape.split("x"))
            for case in args.cases:
                dts, pdts = case.split("/")
                per = profile_case(op, M, N, DT[dts], DT[pdts], args.iters)
                total = sum(per.values())
                print(f"{op} {M}x{N} x {dts} params {pdts}: {total:.1f} us per forward + backward")
                for name, us in per.items():
                    print(f"    {us:8.1f} us  {name}")
                results.append({"op": op, "M": M, "N": N, "dtype": dts, "params": pdts, "kernels_us": per,
                                "total_us": total, "device": torch.cuda.get_device_name()})
    with open(os.path.join(args.out, "ln_profile.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
