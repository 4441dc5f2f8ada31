"""SyncBatchNorm's per-rank work, normkit against torch, on one GPU: the primitives a SyncBatchNorm step runs
on each rank, without the collectives (which are the same for both and depend on the interconnect).

    PYTHONPATH=src python benchmarks/sync_bn_bench.py --out DIR [--budget S] [--dtypes bf16 fp32]

forward = batch_norm_stats -> batch_norm_gather_stats_with_counts (one row) -> batch_norm_elemt;
backward = batch_norm_backward_reduce -> batch_norm_backward_elemt. normkit's are ``normkit.ops``' (batch norm's
kernels composed per primitive), torch's ``torch.batch_norm_*`` (ATen's CUDA kernels, what
``torch.nn.SyncBatchNorm`` runs). Each chain is first checked against float64 (relative L2 error of y and dx),
then timed as CUDA-graph replays over input sets rotated past L2 (``normkit.bench.timing.Timer``). SOL: the
minimal bytes (forward: read x, write y; backward: read x and dy, write dx) over the copy bandwidth measured in
the same run. Writes ``DIR/sync_bn.json``, ``DIR/sync_bn.md`` and ``DIR/sync_bn.png``.
"""

import argparse
import json
import math
import os
import time

import torch

import normkit
from normkit.bench.report import save_png
from normkit import ops, reference
from normkit.bench.runner import device_info, git_sha
from normkit.bench.timing import Timer

DTYPES = {"bf16": (torch.bfloat16, torch.float32), "fp32": (torch.float32, torch.float32),
          "fp16": (torch.float16, torch.float32)}
L2_BYTES = 60 << 20
EPS = 1e-5


def _suite_shapes():
    path = os.path.join(os.path.dirname(normkit.__file__), "bench", "suite.json")
    return [tuple(s) for s in json.load(open(path))["batch_norm"]["shapes"]]


def _layouts(shape):
    return ["contiguous", "channels_last"] if len(shape) in (4, 5) else ["contiguous"]


def _make(shape, dtype, pdt, layout, gen):
    x = (torch.randn(shape, device="cuda", dtype=torch.float32, generator=gen) * 1.5 + 0.5).to(dtype)
    dy = torch.randn(shape, device="cuda", dtype=torch.float32, generator=gen).to(dtype)
    if layout == "channels_last":
        fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
        x, dy = x.contiguous(memory_format=fmt), dy.contiguous(memory_format=fmt)
    C = shape[1]
    w = (torch.rand(C, device="cuda", generator=gen) + 0.5).to(pdt)
    b = torch.randn(C, device="cuda", generator=gen).to(pdt)
    return x, dy, w, b


def _chains(lib, x, dy, w, b, n):
    """(forward, backward) closures of one library's primitives on one input set."""
    C = x.shape[1]
    rm, rv = torch.zeros(C, device=x.device), torch.ones(C, device=x.device)
    counts = torch.full((1,), float(n), device=x.device)
    counts_i = counts.to(torch.int32)
    st = {}

    def fwd():
        mean, invstd = lib.batch_norm_stats(x, EPS)
        gm, gi = lib.batch_norm_gather_stats_with_counts(x, mean[None], invstd[None], rm, rv, 0.1, EPS, counts)
        st["m"], st["i"] = gm, gi
        return lib.batch_norm_elemt(x, w, b, gm, gi, EPS)

    fwd()  # the backward's statistics

    def bwd():
        s1, s2, gw, gb = lib.batch_norm_backward_reduce(dy, x, st["m"], st["i"], w, True, True, True)
        return lib.batch_norm_backward_elemt(dy, x, st["m"], st["i"], w, s1, s2, counts_i)

    return fwd, bwd


def _relerr(a, ref):
    return float((a.double() - ref).norm() / ref.norm().clamp_min(1e-300))


def _check(lib, x, dy, w, b, n):
    fwd, bwd = _chains(lib, x, dy, w, b, n)
    y, dx = fwd(), bwd()
    R = reference
    xd, dyd, wd, bd = x.double(), dy.double(), w.double(), b.double()
    m, i = R.batch_norm_stats(xd, EPS)
    y_ref = R.batch_norm_elemt(xd, wd, bd, m, i, EPS)
    s1, s2, _, _ = R.batch_norm_backward_reduce(dyd, xd, m, i, wd, True, True, True)
    dx_ref = R.batch_norm_backward_elemt(dyd, xd, m, i, wd, s1, s2, torch.full((1,), n, dtype=torch.float64,
                                                                                 device=x.device))
    same_layout = y.stride() == x.stride() and dx.stride() == x.stride()
    return _relerr(y, y_ref), _relerr(dx, dx_ref), same_layout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"], choices=sorted(DTYPES))
    ap.add_argument("--shapes", nargs="*", default=None, help="like 256x64x56x56 (default: the suite's)")
    ap.add_argument("--budget", type=float, default=1e9, help="seconds; rows past it are not run")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    shapes = ([tuple(int(v) for v in s.split("x")) for s in args.shapes] if args.shapes else _suite_shapes())
    timer = Timer("cuda", warmup_ms=5.0, rep_ms=25.0)
    src = torch.randn(256 << 20 >> 2, device="cuda")
    dst = torch.empty_like(src)
    copy_ms, _ = timer.time([lambda: dst.copy_(src)], graph=False)
    copy_gbps = 2 * src.numel() * 4 / (copy_ms * 1e-3) / 1e9
    del src, dst
    rows, t0 = [], time.time()
    gen = torch.Generator(device="cuda").manual_seed(0)
    libs = {"normkit": ops, "torch": torch}
    for shape in shapes:
        for dname in args.dtypes:
            dtype, pdt = DTYPES[dname]
            for layout in _layouts(shape):
                if time.time() - t0 > args.budget:
                    print(f"budget reached: {shape} {dname} {layout} and later rows not run", flush=True)
                    break
                numel = math.prod(shape)
                n = numel // shape[1]
                k = max(2, min(8, math.ceil(4 * L2_BYTES / (2 * numel * dtype.itemsize))))
                sets = [_make(shape, dtype, pdt, layout, gen) for _ in range(k)]
                row = {"shape": list(shape), "dtype": dname, "layout": layout}
                for lib_name, lib in libs.items():
                    ey, edx, same = _check(lib, *sets[0], n)
                    chains = [_chains(lib, *s, n) for s in sets]
                    f_ms, timer_name = timer.time([c[0] for c in chains])
                    b_ms, _ = timer.time([c[1] for c in chains])
                    nbytes = numel * dtype.itemsize
                    row[lib_name] = {"fwd_ms": f_ms, "bwd_ms": b_ms, "err_y": ey, "err_dx": edx, "keeps_layout": same,
                                     "fwd_sol": 2 * nbytes / (f_ms * 1e-3) / 1e9 / copy_gbps,
                                     "bwd_sol": 3 * nbytes / (b_ms * 1e-3) / 1e9 / copy_gbps, "timer": timer_name}
                rows.append(row)
                nk, th = row["normkit"], row["torch"]
                print(f"{'x'.join(map(str, shape)):>16} {dname} {layout:>13} | fwd {nk['fwd_ms']:.4f} vs "
                      f"{th['fwd_ms']:.4f} ms ({th['fwd_ms'] / nk['fwd_ms']:.2f}x, SOL {nk['fwd_sol']:.2f}) | bwd "
                      f"{nk['bwd_ms']:.4f} vs {th['bwd_ms']:.4f} ({th['bwd_ms'] / nk['bwd_ms']:.2f}x, SOL "
                      f"{nk['bwd_sol']:.2f}) | err y {nk['err_y']:.1e} / {th['err_y']:.1e}, dx {nk['err_dx']:.1e} / "
                      f"{th['err_dx']:.1e}", flush=True)
                del sets, chains
                torch.cuda.empty_cache()
    meta = dict(device_info("cuda"), git=git_sha(), date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                copy_gbps=copy_gbps, normkit=normkit.__version__)
    with open(os.path.join(args.out, "sync_bn.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    _report(rows, meta, args.out)


def _report(rows, meta, out):
    lines = [f"# SyncBatchNorm per-rank work: normkit vs torch ({meta['gpu_name']}, torch {meta['torch']}, "
             f"triton {meta['triton']}, {meta['date']}, git {meta['git']}, copy {meta['copy_gbps']:.0f} GB/s)", "",
             "| shape | dtype | layout | fwd ms normkit / torch | speedup | fwd SOL | bwd ms normkit / torch | speedup "
             "| bwd SOL | rel. err y, dx (normkit; torch) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        nk, th = r["normkit"], r["torch"]
        lines.append(f"| {'x'.join(map(str, r['shape']))} | {r['dtype']} | {r['layout']} | {nk['fwd_ms']:.4f} / "
                     f"{th['fwd_ms']:.4f} | {th['fwd_ms'] / nk['fwd_ms']:.2f}x | {nk['fwd_sol']:.2f} | "
                     f"{nk['bwd_ms']:.4f} / {th['bwd_ms']:.4f} | {th['bwd_ms'] / nk['bwd_ms']:.2f}x | "
                     f"{nk['bwd_sol']:.2f} | {nk['err_y']:.1e}, {nk['err_dx']:.1e}; {th['err_y']:.1e}, "
                     f"{th['err_dx']:.1e} |")
    with open(os.path.join(out, "sync_bn.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    labels = [f"{'x'.join(map(str, r['shape']))}\n{r['dtype']} {r['layout'][:6]}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(rows)), 4))
    xs = range(len(rows))
    for j, d in enumerate(("fwd", "bwd")):
        ax.bar([i + 0.4 * j for i in xs], [r["torch"][f"{d}_ms"] / r["normkit"][f"{d}_ms"] for r in rows], 0.4,
               label=d)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([i + 0.2 for i in xs])
    ax.set_xticklabels(labels, rotation=90, fontsize=6)
    ax.set_ylabel("speedup over torch (x)")
    ax.set_title("SyncBatchNorm per-rank primitives, normkit vs torch")
    ax.legend()
    fig.tight_layout()
    save_png(fig, os.path.join(out, "sync_bn.png"), dpi=120)


if __name__ == "__main__":
    main()
