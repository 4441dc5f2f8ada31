"""What batch norm's median-of-three shift costs the training forward, shape by shape: the landed kernels against the
same kernels given both extra samples at offset 0 (the median of the first element thrice: one sample line, as the
first-element shift before session 36). CUDA graphs of the forward over rotating inputs (>= 4x L2), the two settings
alternating round by round in one process.

    PYTHONPATH=src python benchmarks/bn_shift_probe.py [--out DIR] [--shapes 64x3x224x224,...]

Session 37 measured the forward at C = 3 / 4 contiguous 8-9 % slower than before the shift (H200, two rounds);
this separates the samples' loads from the rest of session 36's change (the peeled first step, registers).
Writes shift_probe.json.
"""
import argparse
import json
import os
import statistics

import torch

from normkit.kernels import _plan, batch_norm as B

SHAPES = ["64x3x224x224:fp32", "64x3x224x224:bf16", "256x4x112x112:bf16", "256x4x112x112:fp32",
          "4096x3x32x32:fp32", "256x1024x14x14:fp32", "256x64x56x56:bf16"]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def graph_of(xs, w, b, rm, rv, reps):
    for x in xs:  # compile and warm outside the capture
        B.bn_forward_train(x, w, b, rm, rv, 0.1, 1e-5)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            for x in xs:
                B.bn_forward_train(x, w, b, rm, rv, 0.1, 1e-5)
    return g


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma list of NxCxHxW:dtype")
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    _plan.set_plans(False)  # a replayed plan would keep the first setting's sample offsets
    real = B._shift_samples
    rows = []
    for item in a.shapes.split(","):
        dims, dt = item.split(":")
        shape, dtype = tuple(int(d) for d in dims.split("x")), DTYPES[dt]
        nbytes = torch.Size(shape).numel() * dtype.itemsize
        xs = [torch.randn(shape, device="cuda", dtype=dtype) for _ in range(max(2, 4 * 60 * 2**20 // nbytes + 1))]
        C, reps = shape[1], 3
        w, b = torch.rand(C, device="cuda") + 0.5, torch.randn(C, device="cuda")
        rm, rv = torch.zeros(C, device="cuda"), torch.ones(C, device="cuda")
        graphs = {}
        for name, samples in (("median3", real), ("first", lambda v: (0, 0))):
            B._shift_samples = samples
            try:
                graphs[name] = graph_of(xs, w, b, rm, rv, reps)
            finally:
                B._shift_samples = real
        times = {k: [] for k in graphs}
        for r in range(a.rounds):
            for k in list(graphs)[:: 1 if r % 2 == 0 else -1]:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                graphs[k].replay()
                e.record()
                e.synchronize()
                times[k].append(s.elapsed_time(e) / (reps * len(xs)))
        med = {k: statistics.median(v) for k, v in times.items()}
        row = {"shape": list(shape), "dtype": dt, "median3_ms": round(med["median3"], 5),
               "first_ms": round(med["first"], 5), "median3_over_first": round(med["median3"] / med["first"], 4)}
        print(json.dumps(row), flush=True)
        rows.append(row)
        del xs, graphs
        torch.cuda.empty_cache()
    os.makedirs(a.out, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    with open(os.path.join(a.out, "shift_probe.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
