"""Why a normkit batch-norm call costs 2-3x more host time inside a model than in a loop of itself.

model_host_profile.py (session 24) clocked 84-143 µs a call inside normkit's aten kernels in resnet18 /
mobilenet_v3_small / mlp steps, against ~40-50 µs a call in host_overhead.py's loop of one tiny call. Either the call
does more in a model (other shapes and paths: three launches, more allocations), or the same work runs slower there
because what ran between two calls (convolutions, autograd, the allocator) evicted the CPU caches that normkit's
Python path lives in. This clocks the pieces of each call -- normkit's implementation (``impl``), ``_plan.planned``
(plan key + replay), the replay, the replay's allocations, the implementation's other allocations -- in:

- a loop of one training forward + backward alone (32x64x8x8 bf16, NCHW: one launch a direction; channels_last: three),
- the same loop with an eager 3x3 convolution before each call (C++ host work between calls, as in a model),
- ... with 8 MB of CPU memory copied before each call (the data caches evicted; no Python objects touched),
- ... with 100k Python objects read before each call (the interpreter's objects evicted),
- whole resnet18 / mobilenet_v3_small bf16 steps (``--models``).

If the polluted loops reach the models' µs a call, the gap is the caches and the remedy is less work a call; if they
stay at the loop's, the models' calls do more. Prints a table (µs a call per piece) and writes JSON.

    python benchmarks/host_cache_probe.py --out DIR [--calls 200] [--models tv_resnet18,tv_mobilenet_v3_small]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_host_profile as P  # noqa: E402
import model_zoo as Z  # noqa: E402


def loop_steps(layout):
    """{setting: step}: one tiny bf16 batch-norm forward + backward, alone or after work that evicts caches."""
    x = torch.randn(32, 64, 8, 8, device="cuda", dtype=torch.bfloat16)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_(True)
    w = torch.rand(64, device="cuda", requires_grad=True)
    b = torch.randn(64, device="cuda", requires_grad=True)
    rm, rv = torch.zeros(64, device="cuda"), torch.ones(64, device="cuda")
    g = torch.randn_like(x)
    conv_w = torch.randn(64, 64, 3, 3, device="cuda", dtype=torch.bfloat16)
    src, dst = bytearray(8 << 20), bytearray(8 << 20)  # one thread's memcpy (torch's fill_ would split it)
    objects = [{"k": i} for i in range(100_000)]

    def bn():
        y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5)
        y.backward(g)

    def after_conv():
        with torch.no_grad():
            F.conv2d(x, conv_w, padding=1)
        bn()

    def after_memory():
        dst[:] = src
        bn()

    def after_objects():
        sum(o["k"] for o in objects)
        bn()

    return {"alone": bn, "after_conv": after_conv, "after_8MB_copied": after_memory,
            "after_100k_objects": after_objects}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    Z.add_model_args(ap)
    ap.add_argument("--calls", type=int, default=200, help="calls a loop setting (model steps: calls // 20)")
    args = ap.parse_args(argv)
    meta, cases = Z.cuda_run(args, "host_cache_probe.py", calls=args.calls)
    rows = []
    for layout in ("contiguous", "channels_last"):
        for setting, step in loop_steps(layout).items():
            r = P.inside_kernels(step, args.calls)
            rows.append({"case": "loop 32x64x8x8", "layout": layout, "setting": setting, "inside_normkit": r})
            print(f"loop {layout} {setting}: {P.format_inside(r)}", flush=True)
    for name, layout in cases:
        r = P.inside_kernels(P._model_step(name, layout, args.seed), max(2, args.calls // 20))
        rows.append({"case": name, "layout": layout, "setting": "model step", "inside_normkit": r})
        print(f"{name} {layout}: {P.format_inside(r)}", flush=True)
    with open(os.path.join(args.out, "host_cache_probe.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
