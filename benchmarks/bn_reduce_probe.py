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
  forward's statistics (read x) and the backward's sums (read x and dy);
* ``tma:<fwd|bwd>:<variant>`` (channels_last / 2-D rows only): the same split reduction with its tiles brought in
  by the tensor-memory accelerator, pipelined through shared memory (``_tma_reduce_rows_kernel``; checked against
  float64 before it is timed).

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
from normkit.bench.report import save_png
from normkit.bench.timing import Timer
from normkit.kernels import batch_norm as B

SHAPES = [((256, 64, 56, 56), "cl"), ((256, 1024, 14, 14), "cl"), ((256, 2048, 7, 7), "cl"),
          ((256, 512, 28, 28), "cl"), ((65536, 1024), "cl"), ((256, 64, 56, 56), "nchw"),
          ((256, 1024, 14, 14), "nchw"), ((256, 2048, 7, 7), "nchw"), ((256, 512, 7, 7), "nchw")]

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
    # rows view: wider channel blocks (512-byte row segments instead of 128 at 2048 channels) with the partials cap
    # raised so the program count stays (session 27)
    "pfr02m64": ({"partial_frac_rows": 0.02, "min_rows": 64}, ("fwd", "bwd")),
    "pfr05m64": ({"partial_frac_rows": 0.05, "min_rows": 64}, ("fwd", "bwd")),
    # NCHW short planes: the ncs reduction instead of the (N, C*S) rows view (session 28), and the view with more
    # programs (two row ranges a column block)
    "nospread": ({"spread_max_plane": 0}, ("fwd", "bwd")),
    "sptp1k": ({"target_programs_spread": 1024}, ("fwd", "bwd")),
    # session 29: wider column blocks (1-4 KB row segments), P > 1 programs a block, ~392 programs (one wave)
    "spc512": ({"spread_red_min_cols": 512, "target_programs_spread": 400, "partial_frac_spread": 0.25},
               ("fwd", "bwd")),
    "spc1k": ({"spread_red_min_cols": 1024, "target_programs_spread": 400, "partial_frac_spread": 0.25},
              ("fwd", "bwd")),
    "spc2k": ({"spread_red_min_cols": 2048, "target_programs_spread": 400, "partial_frac_spread": 0.5}, ("fwd", "bwd")),
    # the spread reduction before red_two_buf_spread (session 30): one register set, 512 programs
    "onebuf": ({"red_two_buf_spread": 0, "target_programs_spread": 512}, ("fwd", "bwd")),
}


@triton.jit
def _stream_read_kernel(x_ptr, out_ptr, numel, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < numel, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(x, axis=0))


@triton.jit
def _tma_reduce_rows_kernel(xd, gd, ref_ptr, part_ptr, M, C, P, NCB, NCH,
                            BM: tl.constexpr, BC: tl.constexpr, BWD: tl.constexpr, STAGES: tl.constexpr):
    """The rows view's split reduction with [BM, BC] tiles brought in by the tensor-memory accelerator, STAGES
    deep through shared memory (Triton's pipeliner): program (p, cb) sums row chunks p, p + P, ... of column
    block cb as _bn_reduce_rows_kernel does (forward: about row 0; backward: sum(g), sum(g (x - ref)))."""
    pid = tl.program_id(0)
    cb = pid % NCB
    p = pid // NCB
    cols = cb * BC + tl.arange(0, BC)
    cmask = cols < C
    rr = tl.arange(0, BM)
    acc1 = tl.zeros([BM, BC], dtype=tl.float32)
    acc2 = tl.zeros([BM, BC], dtype=tl.float32)
    if BWD:
        ref = tl.load(ref_ptr + cols, mask=cmask, other=0.0)[None, :]
    else:
        ref = xd.load([0, cb * BC]).to(tl.float32)
        ref = tl.sum(tl.where((rr == 0)[:, None], ref, 0.0), axis=0)[None, :]
    for i in tl.range(0, tl.cdiv(NCH - p, P), num_stages=STAGES):
        ch = p + i * P
        x = xd.load([ch * BM, cb * BC]).to(tl.float32)
        if BWD:  # (TMA fills rows past M with zeros: g = 0 adds nothing)
            g = gd.load([ch * BM, cb * BC]).to(tl.float32)
            acc1 += g
            acc2 += g * (x - ref)
        else:
            d = tl.where(((ch * BM + rr) < M)[:, None] & cmask[None, :], x - ref, 0.0)
            acc1 += d
            acc2 += d * d
    tl.store(part_ptr + p * C + cols, tl.sum(acc1, axis=0), mask=cmask)
    tl.store(part_ptr + (P + p) * C + cols, tl.sum(acc2, axis=0), mask=cmask)


TMA_VARIANTS = {  # name: (tile bytes, stages, warps, programs)
    "tma16k_s3": (16384, 3, 4, 512),
    "tma16k_s4": (16384, 4, 4, 512),
    "tma8k_s4": (8192, 4, 4, 1024),
    "tma16k_s3p1k": (16384, 3, 4, 1024),
    "tma16k_s4p264": (16384, 4, 4, 264),  # one wave: 2 programs a SM (64 KB of stages each)
    "tma16k_s3p396": (16384, 3, 4, 396),  # one wave: 3 a SM
}


def tma_reduce(x, g, ref, bwd, tile_bytes, stages, warps, programs):
    """Launch _tma_reduce_rows_kernel on a channels_last / 2-D x; returns the partials (2, P, C)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    C = x.shape[1]
    M = x.numel() // C
    BC = min(triton.next_power_of_2(C), 256)
    BM = min(256, max(1, tile_bytes // x.element_size() // BC))
    ncb = triton.cdiv(C, BC)
    nch = triton.cdiv(M, BM)
    P = max(1, min(nch, programs // ncb))
    xd = TensorDescriptor(x.as_strided((M, C), (C, 1)), [M, C], [C, 1], [BM, BC])
    gd = TensorDescriptor(g.as_strided((M, C), (C, 1)), [M, C], [C, 1], [BM, BC]) if bwd else xd
    part = torch.empty((2, P, C), device=x.device, dtype=torch.float32)
    _tma_reduce_rows_kernel[(P * ncb,)](xd, gd, ref, part, M, C, P, ncb, nch, BM=BM, BC=BC, BWD=bwd,
                                        STAGES=stages, num_warps=warps)
    return part


def _rows64(t):
    """t as float64 (M, C) rows: channels last."""
    return t.double().movedim(1, -1).reshape(-1, t.shape[1])


def tma_check(x, g, ref, bwd, part):
    """The partials' per-channel totals against float64 (relative to the largest)."""
    xf = _rows64(x)
    if bwd:
        gf = _rows64(g)
        want = torch.stack([gf.sum(0), (gf * (xf - ref.double())).sum(0)])
    else:
        d = xf - xf[0]
        want = torch.stack([d.sum(0), (d * d).sum(0)])
    got = part.double().sum(1)
    return float(((got - want).abs().max() / want.abs().max().clamp_min(1e-30)))


DEV = "cuda"


def make_inputs(shape, layout, n_sets):
    xs = []
    for _ in range(n_sets):
        x = torch.randn(shape, device=DEV, dtype=torch.bfloat16) + 0.5
        if layout == "cl" and x.dim() in (4, 5):
            x = x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
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
    colors = plt.get_cmap("tab20" if len(impls) > 10 else "tab10").colors  # one color an implementation
    for j, impl in enumerate(impls):
        ys = [i + j * h for i in range(len(cases))]
        ax.barh(ys, [val.get((c, impl), 0.0) for c in cases], height=h, label=impl, color=colors[j % len(colors)])
    ax.set_yticks([i + 0.4 - h / 2 for i in range(len(cases))], [f"{s} {l}" for s, l in cases])
    ax.invert_yaxis()
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel("read GB/s / copy GB/s (same run)")
    ax.set_title("batch norm's split reduction alone against a streaming read (bf16, H200)")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    out = os.path.splitext(path)[0] + ".png"
    save_png(fig, out, dpi=110)
    print("wrote", out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plot", default=None, metavar="JSONL", help="plot a probe's results instead of running it")
    ap.add_argument("--impls", default="", help="with --plot: comma list of implementations to show")
    ap.add_argument("--out")
    ap.add_argument("--budget", type=float, default=150.0)
    ap.add_argument("--dry", action="store_true", help="CPU, Triton interpreter, tiny shapes")
    ap.add_argument("--nk-variants", default=",".join(VARIANTS), help="the _TUNE variants of normkit's reduction to time")
    ap.add_argument("--big", action="store_true", help="also the 268-411 MB channels_last rows")
    ap.add_argument("--shapes", default="", help="comma list of SHAPE:LAYOUT to keep (e.g. 256x2048x7x7:nchw)")
    a = ap.parse_args()
    if a.plot:
        return plot(a.plot, [i for i in a.impls.split(",") if i])
    if not a.out:
        ap.error("--out is required to run the probe")
    global SHAPES, DEV
    if a.big:
        SHAPES = SHAPES + [((256, 256, 56, 56), "cl"), ((16, 64, 32, 64, 64), "cl")]
    if a.shapes:
        keep = set(a.shapes.split(","))
        SHAPES = [(s, lay) for s, lay in SHAPES if f"{'x'.join(map(str, s))}:{lay}" in keep]
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
                    if direction not in dirs or vname not in a.nk_variants.split(","):
                        continue
                    B._TUNE.clear()
                    B._TUNE.update(base)
                    B._TUNE.update(over)
                    views = [B._View(x) for x in xs]
                    bwd = direction == "bwd"
                    v0 = views[0]
                    cfg = B._reduce_cfg(B._SpreadView(v0) if B._spread(v0) else v0, 2, bwd)
                    fns = [lambda v=v, g=g: B._reduce(v, g if bwd else None, mean if bwd else None, bwd,
                                                      tl.float32, torch.float32) for v, g in zip(views, gs)]
                    record(f"nk:{direction}:{vname}", fns, read_bytes=nbytes * (2 if bwd else 1),
                           cfg={k: cfg[k] for k in sorted(cfg)})
            B._TUNE.clear()
            B._TUNE.update(base)
            if layout == "cl" and (shape[1] * 2) % 16 == 0:
                for direction in ("fwd", "bwd"):
                    bwd = direction == "bwd"
                    for vname, knobs in TMA_VARIANTS.items():
                        err = tma_check(xs[0], gs[0], mean, bwd, tma_reduce(xs[0], gs[0], mean, bwd, *knobs))
                        if err > 1e-4:
                            print(f"{vname} {direction} WRONG: {err:.1e}", flush=True)
                            continue
                        record(f"tma:{direction}:{vname}",
                               [lambda x=x, g=g: tma_reduce(x, g, mean, bwd, *knobs) for x, g in zip(xs, gs)],
                               read_bytes=nbytes * (2 if bwd else 1), err=err)
            del xs, outs, gs
            torch.cuda.empty_cache()
    print(f"total {time.time() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
