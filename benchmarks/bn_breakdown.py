"""Per-kernel GPU time of normkit's batch norm on ResNet-50's layers (batch 256, bf16, fp32 params), from
the profiler: which kernel of which layer is far from the copy bandwidth, weighted by how often the
model runs it.

    PYTHONPATH=src python benchmarks/bn_breakdown.py [--layout channels_last|contiguous] [--out DIR]
        [--shapes 64x3x224x224,256x4x112x112 --dtype fp32]   # other shapes (each counted once) and input dtype

For each distinct (C, H) of torchvision's resnet50 (53 batch norms), a training forward and a backward
run ``--iters`` times under torch.profiler, rotating among input sets that together exceed 4x L2 (a
layer's input is cold when its reduction starts, as after a convolution that wrote more than L2 holds).
Reported per kernel: µs per call and GB/s of the HBM bytes it must move (reduction: x, or x and dy;
elementwise: x (+ dy) read and y written; combine: not counted), and the fraction of the copy bandwidth
measured in the same run. Writes ``bn_breakdown.json`` and prints a table whose total is comparable with
the model's "norm kernel ms" per step. Programmatic dependent launch is off while profiling (`pdl_off`):
with it a kernel's interval would include its wait for the previous one.
"""

import argparse
import contextlib
import json
import math
import os
from collections import Counter, defaultdict

import torch

from normkit.kernels import batch_norm as KB

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def resnet50_bn_shapes():
    """(C, H) of every batch norm in torchvision's resnet50 (v1.5: stride on the 3x3 conv), with counts."""
    shapes = [(64, 112)]
    in_h = 56
    for width, blocks, h in ((64, 3, 56), (128, 4, 28), (256, 6, 14), (512, 3, 7)):
        for i in range(blocks):
            shapes += [(width, in_h if i == 0 else h), (width, h), (4 * width, h)]
            if i == 0:
                shapes.append((4 * width, h))  # downsample
        in_h = h
    return Counter(shapes)


def copy_bandwidth():
    """The bench's SOL ceiling (eager 1 GiB device copy, bytes read + written), measured in this run."""
    from normkit.bench.runner import Context, copy_bandwidth as bench_copy
    from normkit.bench.timing import Timer

    return bench_copy(Context(device="cuda", timer=Timer("cuda")), 1 << 30)


@contextlib.contextmanager
def pdl_off():
    """Programmatic dependent launch off in every kernel family for the block: with it a dependent
    kernel's profiler interval starts while it still waits for its predecessor, so per-kernel durations
    would include that wait (the call as a whole is 1-3 µs slower without it)."""
    from normkit.kernels import group_norm as KG
    from normkit.kernels import layer_norm as KL

    saved = KB._TUNE["pdl"], KG._CFG["pdl"], KL._CFG["pdl_max_block"]
    KB._TUNE["pdl"] = KG._CFG["pdl"] = KL._CFG["pdl_max_block"] = 0
    try:
        yield
    finally:
        KB._TUNE["pdl"], KG._CFG["pdl"], KL._CFG["pdl_max_block"] = saved


def cuda_kernel_events(step, iters):
    """``step(i)`` 3 times untimed, then ``iters`` times under torch.profiler, programmatic dependent
    launch off (``pdl_off``): every CUDA kernel it ran, as (name, start, device µs). Shared with
    ln_profile.py and gn_kernels.py."""
    from torch.profiler import ProfilerActivity, profile

    with pdl_off():
        for i in range(3):
            step(i)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for i in range(iters):
                step(i)
            torch.cuda.synchronize()
    out = []
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            dur = getattr(evt, "device_time_total", None)
            if dur is None:
                dur = evt.cuda_time_total
            out.append((evt.name, evt.time_range.start, dur))
    return out


def profile_layer(shape, layout, iters, l2_bytes, dtype=torch.bfloat16):
    C = shape[1]
    nbytes = math.prod(shape) * dtype.itemsize
    sets = max(1, min(8, -(-4 * l2_bytes // nbytes)))
    fmt = torch.contiguous_format
    if layout == "channels_last" and len(shape) in (4, 5):
        fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    data = []
    for _ in range(sets):
        x = torch.randn(shape, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
        data.append((x, torch.randn_like(x)))
    w, b = torch.rand(C, device="cuda") + 0.5, torch.randn(C, device="cuda")
    rm, rv = torch.zeros(C, device="cuda"), torch.ones(C, device="cuda")

    def step(i):
        x, dy = data[i % sets]
        y, m, s = KB.bn_forward_train(x, w, b, rm, rv, 0.1, 1e-5)
        KB.bn_backward(dy, x, w, m, s, True, (True, True, True))

    per = defaultdict(list)
    for name, start, dur in cuda_kernel_events(step, iters):
        per[name].append((start, dur))
    per = {k: [d for _, d in sorted(v)] for k, v in per.items()}  # launch order: fwd before bwd
    del data
    torch.cuda.empty_cache()
    return per, nbytes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layout", default="channels_last", choices=["channels_last", "contiguous"])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--shapes", default="", help="comma list of shapes (e.g. 64x3x224x224,4096x3); default resnet50's")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    args = ap.parse_args()
    dtype = DTYPES[args.dtype]
    os.makedirs(args.out, exist_ok=True)
    bw = copy_bandwidth()
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 60 << 20)
    print(f"copy bandwidth {bw:.0f} GB/s; layout {args.layout}; {args.dtype}")
    if args.shapes:
        layers = [(tuple(int(d) for d in s.split("x")), 1) for s in args.shapes.split(",")]
    else:
        layers = [((256, C, H, H), n) for (C, H), n in sorted(resnet50_bn_shapes().items(),
                                                               key=lambda kv: (-kv[0][1], kv[0][0]))]
    rows, total_us = [], 0.0
    for shape, count in layers:
        C, H = shape[1], shape[2] if len(shape) > 2 else 1
        per, nbytes = profile_layer(shape, args.layout, args.iters, l2, dtype)
        # the forward and backward each run one reduction and one elementwise kernel (in this order)
        layer_us = 0.0
        for name, times in sorted(per.items()):
            calls = len(times) // args.iters or 1
            for j in range(calls):
                ts = times[j::calls]
                us = sum(ts) / len(ts)
                kind = ("fwd" if j == 0 else "bwd") if calls == 2 else "all"
                moved = None
                if "reduce" in name:
                    moved = nbytes * (1 if kind == "fwd" else 2)
                elif "_ew_" in name:
                    moved = nbytes * (2 if kind == "fwd" else 3)
                gbps = moved / (us * 1e-6) / 1e9 if moved else None
                rows.append({"shape": list(shape), "C": C, "H": H, "count": count, "kernel": name, "pass": kind,
                             "us": us, "bytes": moved, "gbps": gbps, "frac_copy": gbps / bw if gbps else None})
                layer_us += us
                print(f"  {'x'.join(map(str, shape)):>16s} (x{count})  {name[:28]:28s} {kind}  {us:8.1f} us"
                      + (f"  {gbps:6.0f} GB/s  {gbps / bw:.2f} of copy" if gbps else ""), flush=True)
        total_us += layer_us * count
    print(f"total over {'the shapes' if args.shapes else 'resnet50' + chr(39) + 's 53 batch norms'} (fwd + bwd): "
          f"{total_us / 1e3:.2f} ms{'' if args.shapes else ' per step'}")
    with open(os.path.join(args.out, f"bn_breakdown_{args.layout}{'_' + args.dtype if args.shapes else ''}.json"),
              "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "triton": __import__("triton").__version__, "copy_gbps": bw, "layout": args.layout,
                   "total_ms_per_step": total_us / 1e3, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
