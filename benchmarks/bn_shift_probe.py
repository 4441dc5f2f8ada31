"""What batch norm's median-of-three shift costs the training forward, shape by shape: the landed kernels against the
same kernels given both extra samples at offset 0 (the median of the first element thrice: one sample line, as the
first-element shift before session 36). CUDA graphs of the forward over rotating inputs (>= 4x L2), the two settings
alternating round by round in one process.

    PYTHONPATH=src python benchmarks/bn_shift_probe.py [--out DIR] [--shapes 64x3x224x224:fp32,...] [--dry]

``--dry``: tiny shapes on the CPU under TRITON_INTERPRET=1, timed without graphs (checks this script only).

Session 37 measured the forward at C = 3 / 4 contiguous 8-9 % slower than before the shift (H200, two rounds);
this separates the samples' loads from the rest of session 36's change (the peeled first step, registers).
Writes shift_probe.json.
"""
import argparse
import json
import os
import statistics
import time

import torch

from normkit.kernels import _plan, batch_norm as B

SHAPES = ["64x3x224x224:fp32", "64x3x224x224:bf16", "256x4x112x112:bf16", "256x4x112x112:fp32",
          "4096x3x32x32:fp32", "256x1024x14x14:fp32", "256x64x56x56:bf16"]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _forwards(xs, w, b, rm, rv, reps, samples):
    """reps rounds of the forward over xs, with ``samples`` as batch norm's ``_shift_samples``."""
    real = B._shift_samples
    B._shift_samples = samples
    try:
        for _ in range(reps):
            for x in xs:
                B.bn_forward_train(x, w, b, rm, rv, 0.1, 1e-5)
    finally:
        B._shift_samples = real


def timed_call(xs, w, b, rm, rv, reps, samples):
    """--dry: a callable that runs the forwards (no CUDA graphs on the CPU)."""
    run = lambda: _forwards(xs, w, b, rm, rv, reps, samples)  # noqa: E731
    run()
    return run


def graph_of(xs, w, b, rm, rv, reps, samples):
    """A CUDA graph of the forwards (compiled and warmed outside the capture)."""
    _forwards(xs, w, b, rm, rv, 1, samples)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        _forwards(xs, w, b, rm, rv, reps, samples)
    return g


def _time_ms(g, dry):
    if dry:
        t0 = time.perf_counter()
        g()
        return (time.perf_counter() - t0) * 1e3
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    g.replay()
    e.record()
    e.synchronize()
    return s.elapsed_time(e)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma list of NxCxHxW:dtype")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--dry", action="store_true")
    a = ap.parse_args()
    dev = "cpu" if a.dry else "cuda"
    if a.dry:
        a.shapes, a.rounds = "4x3x5x6:fp32,2x4x3x3:bf16", 2
    _plan.set_plans(False)  # a replayed plan would keep the first setting's sample offsets
    rows = []
    for item in a.shapes.split(","):
        dims, dt = item.split(":")
        shape, dtype = tuple(int(d) for d in dims.split("x")), DTYPES[dt]
        nbytes = torch.Size(shape).numel() * dtype.itemsize
        n_sets = 2 if a.dry else max(2, 4 * 60 * 2**20 // nbytes + 1)
        xs = [torch.randn(shape, device=dev, dtype=dtype) for _ in range(n_sets)]
        C, reps = shape[1], 3
        w, b = torch.rand(C, device=dev) + 0.5, torch.randn(C, device=dev)
        rm, rv = torch.zeros(C, device=dev), torch.ones(C, device=dev)
        graphs = {}
        for name, samples in (("median3", B._shift_samples), ("first", lambda v: (0, 0))):
            graphs[name] = (timed_call if a.dry else graph_of)(xs, w, b, rm, rv, reps, samples)
        times = {k: [] for k in graphs}
        for r in range(a.rounds):
            for k in list(graphs)[:: 1 if r % 2 == 0 else -1]:
                times[k].append(_time_ms(graphs[k], a.dry) / (reps * len(xs)))
        med = {k: statistics.median(v) for k, v in times.items()}
        row = {"shape": list(shape), "dtype": dt, "median3_ms": round(med["median3"], 5),
               "first_ms": round(med["first"], 5), "median3_over_first": round(med["median3"] / med["first"], 4)}
        print(json.dumps(row), flush=True)
        rows.append(row)
        del xs, graphs
        if not a.dry:
            torch.cuda.empty_cache()
    os.makedirs(a.out, exist_ok=True)
    meta = {"device": "cpu (dry)" if a.dry else torch.cuda.get_device_name(), "torch": torch.__version__}
    with open(os.path.join(a.out, "shift_probe.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
