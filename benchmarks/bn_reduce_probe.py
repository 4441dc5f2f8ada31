"""How fast can one read pass of batch norm's statistics go? The split reduction alone, against read-only
references, on the suite's 51-103 MB rows (where the training forward sits at 0.54-0.57 SOL).

    PYTHONPATH=src python benchmarks/bn_reduce_probe.py --out DIR [--budget SECONDS]
    python benchmarks/bn_reduce_probe.py --plot DIR/bn_reduce_probe.jsonl [--impls stream,nk:fwd:default,...]

Per shape (bf16, channels_last and NCHW) it times, in CUDA graphs over inputs rotated past L2:

* ``copy``: x -> y (eager), the SOL ceiling (GB/s counting read + write);
* ``stream``: a one-tile-per-program read kernel (16 KB tiles, 8 warps, one float written per program):
  what a read pass can do when the hardware keeps every SM full of short programs;
* ``torch_sum``: ``x.sum(reduce dims, dtype=float32)``, PyTorch's own reduction;
* ``nk:<fwd|bwd>:<variant>``: normkit's split reduction (``batch_norm._reduce``) with ``_TUNE`` overrides, the
  forward's statistics (read x) and the backward's sums (read x and dy).

Each line of ``DIR/bn_reduce_probe.jsonl`` has the read GB/s and its fraction of copy (copy GB/s counts
both directions, so a read pass at "1.0 of copy" moves as many bytes a second as the copy does).
"""

import argparse
import json
import os
import sys
import time

if "--dry" in sys.argv:  # CPU check of the script: the Triton interpreter, tiny shapes
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import triton
import triton.language as tl

from normkit.bench.runner import Context, copy_bandwidth
from normkit.bench.timing import Timer
from normkit.kernels import batch_norm as B

SHAPES = [((256, 64, 56, 56), "cl"), ((256, 1024, 14, 14), "cl"), ((256, 2048, 7, 7), "cl"),
          ((256, 512, 28, 28), "cl"), ((65536, 1024), "cl"), ((256, 64, 56, 56), "nchw"),
          ((256, 1024, 14, 14), "nchw"), ((256, 2048, 7, 7), "nchw")]

# _TUNE overrides and the directions they touch (the forward's statistics, the backward's sums over x and dy);
# the partial cap is lifted where the program count is what a variant changes
VARIANTS = {
    "default": ({}, ("fwd", "bwd")),
    "p1k": ({"target_programs_rows_fwd": 1024, "target_programs_ncs_fwd_16bit": 2048, "partial_frac_rows": 0.05},
            ("fwd",)),
    "t2k": ({"red_tile_bytes": 2048, "red_tile_bytes_ncs_fwd": 8192}, ("fwd", "bwd")),
    "w8": ({"red_warps_rows_wide": 8}, ("fwd", "bwd")),
    "w4": ({"red_warps_rows_min_bytes": 0, "red_warps": 4}, ("fwd", "bwd")),
    "ncs1k": ({"target_programs_ncs_fwd_16bit": 1024}, ("fwd",)),
    "tpb330": ({"target_programs_rows_bwd": 330, "target_programs": 512}, ("bwd",)),
}


@triton.jit
def _stream_read_kernel(x_ptr, out_ptr, numel, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < numel, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(x, axis=0))


DEV = "cuda"


def make_inputs(shape, layout, n_sets):
    xs = []
    for _ in range(n_sets):
        x = torch.randn(shape, device=DEV, dtype=torch.bfloat16) + 0.5
        if layout == "cl" and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        xs.append(x)
    return xs


def plot(path, impls):
    """Fraction of copy per shape (rows) and implementation (bars), next to the jsonl as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in open(path)]
    cases = list(dict.fromkeys(("x".join(map(str, r["shape"])), r["layout"]) for r in rows))
    impls = impls or list(dict.fromkeys(r["impl"] for r in rows))
    val = {(("x".join(map(str, r["shape"])), r["layout"]), r["impl"]): r["of_copy"] for r in rows}
    fig, ax = plt.subplots(figsize=(9, 0.5 + 0.3 * len(cases) * len(impls) / 2))
    h = 0.8 / len(impls)
    for j, impl in enumerate(impls):
        ys = [i + j * h for i in range(len(cases))]
        ax.barh(ys, [val.get((c, impl), 0.0) for c in cases], height=h, label=impl)
    ax.set_yticks([i + 0.4 - h / 2 for i in range(len(cases))], [f"{s} {l}" for s, l in cases])
    ax.invert_yaxis()
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel("read GB/s / copy GB/s (same run)")
    ax.set_title("batch norm's split reduction alone against a streaming read (bf16, H200)")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    out = os.path.splitext(path)[0] + ".png"
    fig.savefig(out, dpi=110)
    print("wrote", out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plot", default=None, metavar="JSONL", help="plot a probe's results instead of running it")
    ap.add_argument("--impls", default="", help="with --plot: comma list of implementations to show")
    ap.add_argument("--out")
    ap.add_argument("--budget", type=float, default=150.0)
    ap.add_argument("--dry", action="store_true", help="CPU, Triton interpreter, tiny shapes")
    a = ap.parse_args()
    if a.plot:
        return plot(a.plot, [i for i in a.impls.split(",") if i])
    if not a.out:
        ap.error("--out is required to run the probe")
    global SHAPES, DEV
    if a.dry:
        SHAPES = [((4, 8, 4, 4), "cl"), ((4, 8, 4, 4), "nchw")]
        DEV = "cpu"
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "bn_reduce_probe.jsonl")
    timer = Timer(DEV)
    t0 = time.time()

    copy_gbps = copy_bandwidth(Context(device=DEV, timer=timer), 1 << 28)
    print(f"copy {copy_gbps:.0f} GB/s", flush=True)
    base = dict(B._TUNE)
    with open(path, "a") as f:
        for shape, layout in SHAPES:
            if time.time() - t0 > a.budget:
                print("budget reached", flush=True)
                break
            nbytes = 2 * int(torch.Size(shape).numel())
            n_sets = 1 if a.dry else min(8, max(1, -(-4 * 60 * 2 ** 20 // nbytes)))
            xs = make_inputs(shape, layout, n_sets)
            numel = xs[0].numel()

            def record(name, fns, read_bytes=nbytes, **extra):
                t_ms, timer_name = timer.time(fns)
                gbps = read_bytes / (t_ms * 1e-3) / 1e9
                row = dict(shape=list(shape), layout=layout, impl=name, ms=t_ms, read_gbps=gbps,
                           of_copy=gbps / copy_gbps, copy_gbps=copy_gbps, timer=timer_name, **extra)
                f.write(json.dumps(row) + "\n")
                f.flush()
                print(f"{'x'.join(map(str, shape)):>16} {layout:>4} {name:>16} {t_ms * 1e3:8.1f} us "
                      f"{gbps:6.0f} GB/s {gbps / copy_gbps:5.2f} of copy {extra or ''}", flush=True)

            BLOCK = 8192
            outs = [torch.empty(-(-numel // BLOCK), device=DEV) for _ in xs]
            record("stream", [lambda x=x, o=o: _stream_read_kernel[(o.numel(),)](x, o, numel, BLOCK=BLOCK,
                                                                                num_warps=8)
                              for x, o in zip(xs, outs)])
            dims = [0] + list(range(2, len(shape)))
            record("torch_sum", [lambda x=x: x.sum(dims, dtype=torch.float32) for x in xs])
            gs = [torch.randn_like(x) for x in xs]
            mean = torch.full((shape[1],), 0.5, device=DEV)
            for direction in ("fwd", "bwd"):
                for vname, (over, dirs) in VARIANTS.items():
                    if direction not in dirs:
                        continue
                    B._TUNE.clear()
                    B._TUNE.update(base)
                    B._TUNE.update(over)
                    views = [B._View(x) for x in xs]
                    bwd = direction == "bwd"
                    cfg = B._reduce_cfg(views[0], 2, bwd)
                    fns = [lambda v=v, g=g: B._reduce(v, g if bwd else None, mean if bwd else None, bwd,
                                                      tl.float32, torch.float32) for v, g in zip(views, gs)]
                    record(f"nk:{direction}:{vname}", fns, read_bytes=nbytes * (2 if bwd else 1),
                           cfg={k: cfg[k] for k in sorted(cfg)})
            B._TUNE.clear()
            B._TUNE.update(base)
            del xs, outs, gs
            torch.cuda.empty_cache()
    print(f"total {time.time() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
