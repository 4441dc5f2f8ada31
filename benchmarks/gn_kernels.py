"""GPU sweep for normkit's group norm kernels: float64 check, then CUDA-graph timing (inputs rotated past
L2) of the suite's group_norm rows in both layouts, for `group_norm._CFG` variants, side by side with ATen
eager, with the copy bandwidth measured in the same run.

    PYTHONPATH=src python benchmarks/gn_kernels.py [--out DIR] [--variants base,tile8k] [--budget S] [--dry]
        [--profile]

Bytes: forward = read x + write y; backward = read x + read dy + write dx. SOL = (bytes / time) / copy
bandwidth. ATen's forward is `F.group_norm` (which copies a channels_last input to contiguous first); its
backward is `native_group_norm_backward` on contiguous dy and x, as ATen's autograd calls it on CUDA (the
copies of a channels_last pair counted). ``--profile`` adds, per row, the GPU µs of every kernel of one
forward + backward (base settings, torch.profiler). Writes gn_kernels.json under --out.
"""

import argparse
import json
import math
import os
import sys
import time

if "--dry" in sys.argv:  # the interpreter is chosen when triton decorates the kernels: before the imports
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from normkit.bench.timing import Timer  # noqa: E402
from normkit.kernels import group_norm as K  # noqa: E402

SHAPES = [((32, 256, 64, 64), 32), ((16, 512, 64, 64), 32), ((8, 128, 256, 256), 32), ((64, 1280, 16, 16), 32),
          ((4, 64, 32, 128, 128), 8), ((16, 64, 128, 128), 64)]
DRY_SHAPES = [((2, 8, 6, 6), 4), ((2, 8, 3, 4, 4), 2)]
VARIANTS = {  # names starting with "cl" ("nc") change channels_last (contiguous) settings only
    "base": {},
    "tile2k": {"tile": 2048},
    "tile8k": {"tile": 8192},
    "w4": {"warps": 4},
    "p4k": {"target_programs": 4096},
    "clw4": {"cl_warps": 4},
    "cl64": {"cl_max_block_c": 64},
    "cl64w4": {"cl_max_block_c": 64, "cl_warps": 4},
    "cl256": {"cl_max_block_c": 256},
    "clp512": {"cl_target_programs": 512},
    "cl8k": {"cl_tile": 8192},
    "ncnowhole": {"whole_max": 0},
    "ncwhole16k": {"whole_max": 16384},
    # 2026-12-01 H200 session 8 (NOTES-group_norm.md): bwd_whole_max 16384 (was variant ncbwdwhole) adopted;
    # clalignall adopted for one channel a group on channels_last only (no knob); unroll2 and the other
    # forward-partials variants deleted with their knobs
    "ncnobwdwhole": {"bwd_whole_max": 0},  # the 4-launch backward everywhere (the default before session 8)
    # contiguous planes of 4096+ positions: tiles of [1024 x 4] instead of [4096 x 1], so a statistics
    # program covers 4 channels (4 tiles) where it covered one tile (16x512x64x64: 8192 -> 2048 programs)
    "ncbs1k": {"max_block_s": 1024},
    # programmatic dependent launch between a call's kernels (session 8; batch norm measured -3 %)
    "pdl": {"pdl": 1},
}
DT = {"bfloat16": torch.bfloat16, "float32": torch.float32}
L2_BYTES = 50 << 20


def rel(a, ref):
    return ((a.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def ref64(x, w, b, G, dy, eps=1e-5):
    xd = x.double().requires_grad_()
    wd, bd = w.double().requires_grad_(), b.double().requires_grad_()
    y = F.group_norm(xd, G, wd, bd, eps)
    y.backward(dy.double())
    return y.detach(), xd.grad, wd.grad, bd.grad


def layout(t, cl):
    if not cl:
        return t.contiguous()
    return t.contiguous(memory_format=torch.channels_last if t.dim() == 4 else torch.channels_last_3d)


def profile_row(xs, dys, w, b, G, dt, iters=10):
    """GPU µs per forward + backward of each kernel (rotating the row's input sets)."""
    from collections import defaultdict

    from bn_breakdown import cuda_kernel_events  # same folder: run as `python benchmarks/gn_kernels.py`

    def step(i):
        x, dy = xs[i % len(xs)], dys[i % len(xs)]
        _, mean, rstd = K.gn_forward(x, w, b, G, 1e-5, dt)
        K.gn_backward(dy, x, mean, rstd, w, G, [True, True, True], dt)

    per = defaultdict(float)
    for name, _, dur in cuda_kernel_events(step, iters):
        per[name] += dur / iters
    return dict(per)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--variants", default="base")
    ap.add_argument("--budget", type=float, default=240.0)
    ap.add_argument("--dry", action="store_true", help="CPU interpreter, tiny shapes: checks the script")
    ap.add_argument("--profile", action="store_true", help="per-kernel GPU time of each row (CUDA only)")
    args = ap.parse_args()
    dev = "cpu" if args.dry else "cuda"
    t_end = time.time() + args.budget
    timer = Timer(dev) if dev == "cuda" else None

    def ms(fns):
        if dev == "cpu":
            t = time.perf_counter()
            fns[0]()
            return (time.perf_counter() - t) * 1e3
        return timer.time(fns)[0]

    if dev == "cuda":
        n = (1 << 30) // 4
        a = torch.randn(n, device=dev)
        bb = torch.empty_like(a)
        from triton.testing import do_bench

        copy_ms = do_bench(lambda: bb.copy_(a), warmup=25, rep=100, return_mode="median")
        bw = 2 * n * 4 / (copy_ms * 1e-3) / 1e9
        del a, bb
    else:
        bw = 1.0
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    names = [v for v in args.variants.split(",") if v]
    base_cfg = dict(K._CFG)
    rows = []
    for shape, G in (DRY_SHAPES if args.dry else SHAPES):
        for dname, dt in DT.items():
            for cl in (False, True):
                if time.time() > t_end:
                    print("budget spent", flush=True)
                    break
                numel = math.prod(shape)
                nbytes = numel * dt.itemsize
                nbuf = 1 if dev == "cpu" else max(2, math.ceil(4 * L2_BYTES / (3 * nbytes)))
                torch.manual_seed(0)
                C = shape[1]
                xs = [layout(torch.randn(shape, device=dev, dtype=dt) * 2 + 1, cl) for _ in range(nbuf)]
                dys = [layout(torch.randn(shape, device=dev, dtype=dt), cl) for _ in range(nbuf)]
                w = torch.randn(C, device=dev, dtype=dt)
                b = torch.randn(C, device=dev, dtype=dt)
                y0, dx0, dw0, db0 = ref64(xs[0], w, b, G, dys[0])
                row = dict(shape=list(shape), groups=G, dtype=dname, layout="channels_last" if cl else "contiguous",
                           fwd_bytes=2 * nbytes, bwd_bytes=3 * nbytes)
                xcs = [t.contiguous() for t in xs]
                dycs = [t.contiguous() for t in dys]
                st = [torch.ops.aten.native_group_norm(t, w, b, shape[0], C, numel // (shape[0] * C), G, 1e-5)
                      for t in xcs]
                hw = numel // (shape[0] * C)
                row["aten_fwd_ms"] = ms([lambda i=i: F.group_norm(xs[i], G, w, b, 1e-5) for i in range(nbuf)])
                row["aten_bwd_ms"] = ms([lambda i=i: torch.ops.aten.native_group_norm_backward(
                    dys[i].contiguous(), xs[i].contiguous(), st[i][1], st[i][2], w, shape[0], C, hw, G,
                    [True, True, True]) for i in range(nbuf)])
                del st, xcs, dycs
                for v in names:
                    if (v.startswith("cl") and not cl) or (v.startswith("nc") and cl):
                        continue
                    K._CFG.clear()
                    K._CFG.update(base_cfg, **VARIANTS[v])
                    y, mean, rstd = K.gn_forward(xs[0], w, b, G, 1e-5, dt)
                    dx, dw, db = K.gn_backward(dys[0], xs[0], mean, rstd, w, G, [True, True, True], dt)
                    errs = dict(y=rel(y, y0), dx=rel(dx, dx0), dw=rel(dw, dw0), db=rel(db, db0))
                    sts = [K.gn_forward(t, w, b, G, 1e-5, dt) for t in xs]
                    f_ms = ms([lambda i=i: K.gn_forward(xs[i], w, b, G, 1e-5, dt) for i in range(nbuf)])
                    b_ms = ms([lambda i=i: K.gn_backward(dys[i], xs[i], sts[i][1], sts[i][2], w, G,
                                                         [True, True, True], dt) for i in range(nbuf)])
                    del sts
                    row[v] = dict(fwd_ms=f_ms, bwd_ms=b_ms, fwd_sol=2 * nbytes / (f_ms * 1e-3) / 1e9 / bw,
                                  bwd_sol=3 * nbytes / (b_ms * 1e-3) / 1e9 / bw, errs=errs)
                    print(f"{'x'.join(map(str, shape))}/g{G} {dname} {row['layout']:<13} {v:<7} "
                          f"fwd {f_ms:.4f} ms ({row[v]['fwd_sol']:.2f} SOL, aten {row['aten_fwd_ms']:.4f}) "
                          f"bwd {b_ms:.4f} ms ({row[v]['bwd_sol']:.2f} SOL, aten {row['aten_bwd_ms']:.4f}) "
                          f"err y {errs['y']:.1e} dx {errs['dx']:.1e} dw {errs['dw']:.1e} db {errs['db']:.1e}",
                          flush=True)
                K._CFG.clear()
                K._CFG.update(base_cfg)
                if args.profile and dev == "cuda":
                    row["profile_us"] = profile_row(xs, dys, w, b, G, dt)
                    print("   ", "  ".join(f"{k} {v:.1f}" for k, v in row["profile_us"].items()), flush=True)
                rows.append(row)
                del xs, dys
                if dev == "cuda":
                    torch.cuda.empty_cache()
    meta = dict(copy_gbps=bw, torch=torch.__version__, device=torch.cuda.get_device_name() if dev == "cuda" else "cpu",
                date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), variants={v: VARIANTS[v] for v in names})
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gn_kernels.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
