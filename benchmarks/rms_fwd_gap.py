"""Why normkit's RMS forward reads ~0.075 ms in the bench but ~0.068 ms in ln_kernels.py on 16384x4096 bf16
(Liger: 0.067 in both): the same kernel timed by the bench's Timer through each call path and rotation
count, and the GPU kernels each path launches per call (profiler).

    PYTHONPATH=src python benchmarks/rms_fwd_gap.py [--out DIR]
"""

import argparse
import json
import os

import torch

import normkit.functional as NF
from normkit.bench.timing import Timer
from normkit.kernels import layer_norm as L


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
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
            res[f"{name}, {k} sets"] = timer.time(fns)[0]
        with torch.enable_grad():
            fns = [lambda x=x, w=w: NF.rms_norm(x, (N,), w, 1e-6) for x, w in leaves[:k]]
            res[f"functional, grad leaves, {k} sets"] = timer.time(fns)[0]
            if LigerRMSNormFunction is not None:
                fns = [lambda x=x, w=w: LigerRMSNormFunction.apply(x, w, 1e-6) for x, w in leaves[:k]]
                res[f"liger, grad leaves, {k} sets"] = timer.time(fns)[0]
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
    for k, v in res.items():
        print(f"{k:40s} {v:.4f} ms", flush=True)
    for k, v in kernels.items():
        print(k, v)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "rms_fwd_gap.json"), "w") as f:
        json.dump({"ms": res, "kernels": kernels, "torch": torch.__version__}, f, indent=1)


if __name__ == "__main__":
    main()
