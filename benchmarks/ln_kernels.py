"""GPU sweep for normkit's layer/RMS norm kernels: correctness on large shapes, then timing over the
suite's layer_norm / rms_norm rows, side by side with ATen eager, with the copy bandwidth measured in
the same run. Optional ``--sweep`` compares tunable variants (``layer_norm._CFG``) on chosen rows.

    PYTHONPATH=src python benchmarks/ln_kernels.py [--out DIR] [--sweep [--groups g1,g2]] [--quick]
        [--budget SECONDS] [--sweep-budget SECONDS]

Bytes: forward = read x + write y; backward = read x + read dy + write dx (dw/db and the partials
are not counted: they are overhead). SOL fraction = (bytes / time) / copy bandwidth.
Writes ``ln_bench.json`` and ``ln_bench.log`` under ``--out`` (default ``$OUT`` or ``.``); the short
table is printed last.
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
import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from normkit.bench.timing import Timer  # noqa: E402
from normkit.kernels import layer_norm as L  # noqa: E402

SHAPES = [
    (1048576, 64), (262144, 256), (32768, 768), (16384, 1024), (16384, 4096),
    (8192, 8192), (4096, 16384), (2048, 65536), (512, 262144),
]
DT = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
LOG = []
DEV = "cuda"
TIMER = None  # normkit.bench.timing.Timer, set in main()


def log(*a):
    line = " ".join(str(v) for v in a)
    LOG.append(line)
    print(line, flush=True)


L2_BYTES = 50 << 20  # H200 L2; every timing rotates input sets whose bytes add up to >= 4x this


def bench(fns):
    """Median ms per call. ``fns``: one zero-argument callable per input set; the calls rotate over
    them (>= 4x L2 of inputs) inside one CUDA graph, exactly as ``python -m normkit bench`` times."""
    if DEV == "cpu":  # --dry: one call, host clock (checks the script, not the kernels' speed)
        t = time.perf_counter()
        fns[0]()
        return (time.perf_counter() - t) * 1e3
    return TIMER.time(fns)[0]


def copy_bw():
    n = (1 << 30) // 4 if DEV == "cuda" else 1 << 20
    a = torch.randn(n, device=DEV)
    b = torch.empty_like(a)
    # eager, never graph-replayed: a captured copy_ becomes a memcpy node on the copy engines
    # (~2.77 TB/s on the H200 against ~4.25 TB/s for the copy kernel)
    if DEV == "cpu":
        ms = bench([lambda: b.copy_(a)])
    else:
        ms = do_bench(lambda: b.copy_(a), warmup=25, rep=100, return_mode="median")
    del a, b
    return 2 * n * 4 / (ms * 1e-3) / 1e9


def rel(a, ref):
    return ((a.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def make(op, M, N, dt, pdt):
    x = torch.randn(M, N, device=DEV, dtype=dt)
    dy = torch.randn(M, N, device=DEV, dtype=dt)
    w = (torch.rand(N, device=DEV) + 0.5).to(pdt)
    b = torch.randn(N, device=DEV).to(pdt) if op == "ln" else None
    return x, dy, w, b


def check(op, M, N, dt, pdt):
    """Errors of normkit and of ATen against an fp64 computation on the same inputs (rows subset)."""
    x, dy, w, b = make(op, M, N, dt, pdt)
    rows = slice(0, M)
    xs, dys = x[rows], dy[rows]
    xd = xs.double().requires_grad_()
    wd = w.double().requires_grad_()
    bd = b.double().requires_grad_() if b is not None else None
    if op == "ln":
        yr = torch.nn.functional.layer_norm(xd, (N,), wd, bd, 1e-5)
        y, mean, rstd = L.ln_forward(x, w, b, 1e-5)
        dx, dw, db = L.ln_backward(dy, x, mean, rstd, w, (True, True, True))
        try:  # ATen CUDA refuses half input with fp32 weight ("expected scalar type")
            ya = torch.ops.aten.native_layer_norm(x, [N], w, b, 1e-5)[0]
        except RuntimeError:
            ya = None
    else:
        yr = torch.nn.functional.rms_norm(xd, (N,), wd, 1e-6)
        y, rstd = L.rms_forward(x, w, 1e-6)
        dx, dw = L.rms_backward(dy, x, rstd, w, (True, True))
        db = None
        ya = torch.nn.functional.rms_norm(x, (N,), w, 1e-6)
    yr.backward(dys.double())
    out = {"y": rel(y[rows], yr), "aten_y": rel(ya[rows], yr) if ya is not None else float("nan"),
           "dx": rel(dx[rows], xd.grad)}
    out["dw"] = rel(dw, wd.grad)
    if db is not None:
        out["db"] = rel(db, bd.grad)
    out["finite"] = bool(torch.isfinite(y).all() and torch.isfinite(dx).all() and torch.isfinite(dw).all())
    return out


def time_row(op, M, N, dt, pdt, sol_bw, with_aten=True, which=None):
    """Times forward and backward (``which``: only "fwd" or only "bwd", for the sweep), rotating over
    enough input sets that no call finds its inputs in L2."""
    esz = torch.empty((), dtype=dt).element_size()
    fb, bb = 2 * M * N * esz, 3 * M * N * esz
    k = 1 if DEV == "cpu" else max(1, min(16, math.ceil(4 * L2_BYTES / (2 * M * N * esz))))
    sets = [make(op, M, N, dt, pdt) for _ in range(k)]
    r = {"op": op, "M": M, "N": N, "dtype": str(dt).split(".")[-1], "params": str(pdt).split(".")[-1],
         "input_sets": k}
    if op == "ln":
        fwd = [lambda x=x, w=w, b=b: L.ln_forward(x, w, b, 1e-5) for x, _, w, b in sets]
        saved = [L.ln_forward(x, w, b, 1e-5) for x, _, w, b in sets]
        bwd = [lambda dy=dy, x=x, w=w, s=s: L.ln_backward(dy, x, s[1], s[2], w, (True, True, True))
               for (x, dy, w, _), s in zip(sets, saved)]
    else:
        fwd = [lambda x=x, w=w: L.rms_forward(x, w, 1e-6) for x, _, w, _ in sets]
        saved = [L.rms_forward(x, w, 1e-6) for x, _, w, _ in sets]
        bwd = [lambda dy=dy, x=x, w=w, s=s: L.rms_backward(dy, x, s[1], w, (True, True))
               for (x, dy, w, _), s in zip(sets, saved)]
    if which != "bwd":
        r["nk_fwd"] = bench(fwd)
    if which != "fwd":
        r["nk_bwd"] = bench(bwd)
    if with_aten:
        try:
            if op == "ln":
                stats = [torch.ops.aten.native_layer_norm(x, [N], w, b, 1e-5) for x, _, w, b in sets]
                r["aten_fwd"] = bench([lambda x=x, w=w, b=b: torch.ops.aten.native_layer_norm(x, [N], w, b, 1e-5)
                                       for x, _, w, b in sets])
                r["aten_bwd"] = bench([lambda dy=dy, x=x, w=w, b=b, s=s: torch.ops.aten.native_layer_norm_backward(
                    dy, x, [N], s[1], s[2], w, b, [True, True, True]) for (x, dy, w, b), s in zip(sets, stats)])
            else:
                stats = [torch.ops.aten._fused_rms_norm(x, [N], w, 1e-6) for x, _, w, _ in sets]
                r["aten_fwd"] = bench([lambda x=x, w=w: torch.ops.aten._fused_rms_norm(x, [N], w, 1e-6)
                                       for x, _, w, _ in sets])
                r["aten_bwd"] = bench([lambda dy=dy, x=x, w=w, s=s: torch.ops.aten._fused_rms_norm_backward(
                    dy, x, [N], s[1], w, [True, True]) for (x, dy, w, _), s in zip(sets, stats)])
        except Exception as e:  # pragma: no cover (ATen CUDA refuses half input with fp32 weight)
            r["aten_err"] = repr(e)[:200]
    for key in ("nk_fwd", "aten_fwd"):
        if key in r:
            r[key + "_sol"] = fb / (r[key] * 1e-3) / 1e9 / sol_bw
    for key in ("nk_bwd", "aten_bwd"):
        if key in r:
            r[key + "_sol"] = bb / (r[key] * 1e-3) / 1e9 / sol_bw
    del sets, saved
    return r


def _dump(out, meta, checks, sw, rows):
    with open(os.path.join(out, "ln_bench.json"), "w") as f:
        json.dump({"meta": meta, "checks": checks, "sweep": sw, "rows": rows}, f, indent=1)
    with open(os.path.join(out, "ln_bench.log"), "w") as f:
        f.write("\n".join(LOG) + "\n")


def _empty_cache():
    if DEV == "cuda":
        torch.cuda.empty_cache()


def sweep(sol_bw, deadline, only=None, jsonl=None):
    """Variants of the tunables, grouped; each group's fastest variant (geomean over its rows) is kept
    in ``L._CFG`` for the timed rows that follow. Returns (results, chosen overrides)."""
    base = dict(L._CFG)
    groups = {}

    def add(group, label, cfg, op, M, N, which, pdt=torch.bfloat16, dt=torch.bfloat16):
        groups.setdefault(group, []).append((label, cfg, op, M, N, which, pdt, dt))

    # 2026-11-30, H200, --graph: reduce/bwdpf/lnbwdpf/fwdpersist/fwdsplit/fwdnarrow measured; won (now _CFG): red 32x128, pf bwd t1024_e8_p4_d2 at 1024, wide pf e8_p1_d2 to 8192, persistent+prefetch fwd at 16384, two-launch split >= 32768; coop split and fwdnarrow lost (deleted)
    def persist(lo, hi, p):
        return {"fwd_persist_min_block": lo, "fwd_persist_max_block": hi, "fwd_persist_progs_per_sm": p}

    # persistent forward (w/b held, next tile's x prefetched). Registers (sm_90, bf16 LN, plain /
    # persistent+prefetch): 4096 w8 40 / 79 (6 / 3 CTAs/SM); 8192 w8 63 / 161 (4 / 1); 16384 w16 72 / 128
    # + 32 B spill (1 / 1).
    for M, N in ((16384, 4096), (4096, 16384)):
        for pdt in (torch.bfloat16, torch.float32):
            for lab, cfg in (("off", persist(1 << 30, 0, 1)), ("p1_pf_16k", persist(16384, 16384, 1)),
                             ("p1_pf_2k", persist(2048, 16384, 1))):
                add("fwdpersist", lab, cfg, "ln", M, N, "fwd", pdt)
    # split-row forward for 65536 / 262144 (fwd_split_*): (row, chunk) programs, chunk in registers, two
    # launches, 3 passes (the second walks last-first for L2 hits). Registers (bf16 LN, pass 2): c4096 w4
    # 43 (6 CTAs/SM), c8192 w8 60 (2), c16384 w16 57 (1).
    def split(ch, w):
        return {"fwd_split_min_block": 32768, "fwd_split_chunk": ch, "fwd_split_warps": w}

    for op in ("ln", "rms"):  # one group (shared knobs)
        for M, N in ((2048, 65536), (512, 262144)):
            for lab, cfg in (("loop", {"fwd_split_min_block": 1 << 30}), ("two_c8192_w8", split(8192, 8))):
                add("fwdsplit", lab, cfg, op, M, N, "fwd")
    # one-launch split forward (the row's last program to arrive writes all of y, so x is read once from
    # HBM) at every width (one_c<chunk>_w<warps>_f<step of that program's pass>), two launches at every
    # width (two_*), and one launch up to 65536 with two beyond (mix_64k, the 2026-12-01 default). LN and
    # RMS share the knobs: one group, one choice.
    def fused(ch, w, fb, upto=1 << 30):
        return {"fwd_split_min_block": 32768, "fwd_split_fused_max_block": upto, "fwd_split_fused_chunk": ch,
                "fwd_split_fused_warps": w, "fwd_split_fin_block": fb}

    wide = [("two_c4096_w4", dict(split(4096, 4), fwd_split_fused_max_block=0)),
            ("two_c8192_w8", dict(split(8192, 8), fwd_split_fused_max_block=0)),
            ("mix_64k", dict(fused(16384, 16, 8192, 65536), **split(4096, 4)))]
    wide += [(f"one_c{ch}_w{w}_f{fb}", fused(ch, w, fb)) for ch, w, fb in
             ((4096, 4, 4096), (8192, 8, 4096), (16384, 16, 8192), (16384, 16, 16384))]
    for M, N in ((4096, 32768), (2048, 65536), (256, 131072), (512, 262144)):
        for dt in (torch.bfloat16, torch.float32):
            for op in ("ln", "rms"):
                for lab, cfg in wide:
                    add("fwdwide", lab, cfg, op, M, N, "fwd", dt, dt)

    for lab, cfg in (("rows", {"fwd_max_block": 16384}), ("loop", {"fwd_max_block": 8192})):
        add("fwd16k", lab, cfg, "ln", 4096, 16384, "fwd")
    for lab, cfg in (("rows", {"bwd_max_block": 16384}), ("cols", {"bwd_max_block": 8192})):
        add("rmsbwd16k", lab, cfg, "rms", 4096, 16384, "bwd")
    for lab, cfg in (("rows", {"bwd_max_block_ln": 16384}), ("cols", {"bwd_max_block_ln": 8192})):
        add("lnbwd16k", lab, cfg, "ln", 4096, 16384, "bwd")
    for lab, cfg in (("rows", {"bwd_max_block_ln": 8192}), ("cols", {"bwd_max_block_ln": 4096})):
        add("lnbwd8k", lab, cfg, "ln", 8192, 8192, "bwd")
    # the looped forward now serves only fused-residual rows past fwd_max_block; timed here without a
    # residual, so its variants turn the split forward off (the fwdsplit group, run after, decides that)
    for M, N in ((2048, 65536), (512, 262144)):
        for warps, chunk in ((8, 4096), (16, 8192), (4, 2048)):
            for budget, pps in ((32 << 20, 4), (0, 4), (0, 1)):
                add("fwdloop", f"w{warps}_c{chunk}_b{budget >> 20}_p{pps}",
                    {"fwd_loop_warps": warps, "fwd_chunk": chunk, "l2_budget": budget, "loop_progs_per_sm": pps,
                     "fwd_split_min_block": 1 << 30}, "ln", M, N, "fwd")
        for cb, cr in ((1024, 4), (2048, 2), (512, 8), (256, 16)):
            add("bwdcols", f"b{cb}_r{cr}", {"bwd_col_block": cb, "bwd_col_rows": cr}, "ln", M, N, "bwd")
    for M, N in ((1048576, 64), (262144, 256), (32768, 768)):
        for te, ept in ((4096, 16), (8192, 16), (16384, 16), (8192, 8)):
            add("fwdtile", f"t{te}_e{ept}", {"tile_elems": te, "fwd_ept": ept}, "ln", M, N, "fwd")
        for te, ept in ((2048, 8), (4096, 8), (8192, 8), (4096, 16), (8192, 16)):
            if N > 256:  # 768: the prefetching kernel (bwd_pf_*), not these knobs
                continue
            add("bwdtile", f"t{te}_e{ept}", {"bwd_tile_elems": te, "bwd_ept": ept}, "ln", M, N, "bwd")
    for M, N in ((16384, 4096), (8192, 8192)):
        for ept in (8, 16, 32):
            add("fwdept", f"e{ept}", {"fwd_ept_mid": ept, "fwd_ept_wide": ept}, "ln", M, N, "fwd")
    # 2026-12-01: small forward tiles, as Liger's (16 x 64 rows at 4 warps; one 1024 row at 4 warps), which
    # beat normkit's 4096-element tiles by 4-13 % on every narrow RMS row of the full run. LN and RMS share
    # the knobs: one group, one choice.
    for M, N in ((1048576, 64), (262144, 256), (32768, 768), (16384, 1024)):
        for te in (1024, 2048, 4096):
            for ept in (4, 8, 16):
                for op in ("ln", "rms"):
                    add("fwdsmall", f"t{te}_e{ept}", {"tile_elems": te, "fwd_ept": ept}, op, M, N, "fwd")
    # session 28: the same knobs for fp32 rows alone (fwdsmall swept bf16; fp32 LN 16384x1024 trailed Liger's 4-warp
    # programs by 3.4 %, 32768x768 by 0.9 %, RMS 1048576x64 by 0.6 % in session 19's bench)
    for M, N in ((16384, 1024), (32768, 768), (1048576, 64), (262144, 256)):
        for te, ept in ((1024, 16), (1024, 8), (2048, 8), (1024, 4)):
            for op in ("ln", "rms"):
                add("fwdsmall32", f"t{te}_e{ept}", {"tile_elems": te, "fwd_ept": ept}, op, M, N, "fwd",
                    torch.float32, torch.float32)
    # one-row programs at 4096 / 8192: elements per thread (-> warps), bf16 and fp32 input (fp32 LN at
    # these widths was 0.69-0.75x FlagGems in the full run)
    for M, N in ((16384, 4096), (8192, 8192)):
        for ept in (8, 16, 32):
            for op in ("ln", "rms"):
                for dt in (torch.bfloat16, torch.float32):
                    add("fwdmid", f"e{ept}", {"fwd_ept_mid": ept, "fwd_ept_wide": ept}, op, M, N, "fwd", dt, dt)
    # session 29: the 16384-wide one-row forward (Liger's 16 warps, as ours) with and without the 64-register cap
    # that gives it 2 programs a SM (Liger 1.03-1.04x faster on RMS bf16 / LN fp32 here in s29 call 2's bench)
    for op in ("ln", "rms"):
        for dt in (torch.bfloat16, torch.float32):
            for lab, cfg in (("cap64", {}), ("nocap", {"fwd_maxnreg_min_block": 1 << 30})):
                add("fwdmid16k", lab, cfg, op, 4096, 16384, "fwd", dt, dt)
    # session 29: w/b loaded with x (Liger's order; fwd_wb_early_min_block) in one-row programs at 4096 / 8192.
    # Offline sm_90: LN fp32 4096 40 -> 64 registers, 8192 80 -> 127; bf16 40 -> 48, 63 -> 80; RMS 32-42 -> 37-40
    # (fp32 16384 spills with its register cap: not swept)
    for M, N in ((16384, 4096), (8192, 8192)):
        for op in ("ln", "rms"):
            for dt in (torch.bfloat16, torch.float32):
                for lab, cfg in (("late", {}), ("early", {"fwd_wb_early_min_block": 4096})):
                    add("fwdwbearly", lab, cfg, op, M, N, "fwd", dt, dt)
    # session 37 (prepared): rows and strides told their power-of-two factor (row_align), widths of a multiple of 8 but
    # not 16 (offline sm_90: the bf16 rows forward at 3000 49 scalar loads -> 6 16-byte ones, 70 -> 40 registers);
    # 3072 as the control (already aligned: the same kernel either way)
    for M, N in ((32768, 1000), (16384, 3000), (8192, 5000), (1024, 20008), (16384, 3072)):
        for op in ("ln", "rms"):
            for which in ("fwd", "bwd"):
                for dt in (torch.bfloat16, torch.float32):
                    for lab, cfg in (("off", {}), ("on", {"row_align": 1})):
                        add("rowalign", lab, cfg, op, M, N, which, dt, dt)
    # session 43 (prepared) "fwdloopvec": the wide forward as the looped kernel again, against today's split forward
    # ("split"), for the H100's RMS bf16 2048x65536 row (FlagGems' per-row loop 10 % ahead there, 2 % on the H200):
    # RMS's per-lane sums (fwd_loop_vec_acc), evict-first re-reads (fwd_loop_evict_first), and a program a row
    # (progs per SM 16, no L2 cap: M <= 2112 rows run as one grid, as FlagGems' does) at FlagGems' tile range
    def loop(w, c, p, vec, ev):
        return {"fwd_split_min_block": 1 << 30, "fwd_loop_warps": w, "fwd_chunk": c, "loop_progs_per_sm": p,
                "l2_budget": 0, "fwd_loop_vec_acc": vec, "fwd_loop_evict_first": ev}

    loopvec = [("split", {}), ("loop_w16_c8192_p4", loop(16, 8192, 4, 0, 0)),
               ("loop_w16_c8192_p4_vec", loop(16, 8192, 4, 1, 0)), ("loop_w16_c8192_p4_vec_ev", loop(16, 8192, 4, 1, 1))]
    loopvec += [(f"row_w{w}_c{c}_vec_ev", loop(w, c, 16, 1, 1)) for w, c in ((4, 2048), (8, 2048), (8, 4096),
                                                                            (16, 4096), (16, 8192))]
    for op, M, N, dt in (("rms", 2048, 65536, torch.bfloat16), ("rms", 2048, 65536, torch.float32),
                         ("rms", 4096, 32768, torch.bfloat16), ("rms", 512, 262144, torch.bfloat16),
                         ("ln", 2048, 65536, torch.bfloat16)):
        for lab, cfg in loopvec:
            add("fwdloopvec", lab, cfg, op, M, N, "fwd", dt, dt)
    # session 30 (prepared) "fwdloopst": the wide forward as the looped kernel with both loops pipelined through shared
    # memory (fwd_loop_stages) lost to the split forward on every row on the H200 in session 32, knob deleted
    # 2026-12-01 (session 4) "fwdwb" / "fwdwbnarrow": w/b loaded together with x instead of after the
    # statistics lost at every width (LN 8192x8192 bf16 0.0693 -> 0.0966 ms), knob deleted
    # backward at 4096 / 8192 (0.65 SOL): more, smaller persistent programs per SM (more loads in flight);
    # 2026-12-01: e16_p2 won at 4096 (-15..-19 %), lost 5 % at 8192: now bwd_pf_mid_* at 4096 only
    for M, N in ((16384, 4096), (8192, 8192)):
        for e, p in ((8, 1), (16, 1), (16, 2), (32, 2), (32, 4)):
            for op in ("ln", "rms"):
                add("bwdmid", f"pf_e{e}_p{p}", {"bwd_pf_wide_max_block": 8192, "bwd_pf_wide_ept": e,
                                                "bwd_pf_wide_progs_per_sm": p, "bwd_pf_mid_block": 0},
                    op, M, N, "bwd")
    # prefetching backward rows kernel (bwd_pf_*) at BLOCK_N 1024 (bwd_pf_min_block; at 64 / 256 the plain
    # kernel won on 2026-11-30: 1048576x64 0.1107 vs 0.1371 ms). Variants t<tile>_e<ept>_p<progs/SM>_d2
    # (two row blocks loaded ahead, the only depth left). Programs per SM kept <= the CTAs that fit in
    # registers on sm_90 (triton 3.9 + ptxas, N divisible by 16; LN bf16 / fp32 regs): the plain kernel
    # t4096_e8 (16 warps) has 81 regs at 768/1024 (1 CTA/SM, so its 2/SM programs run as 2 waves);
    # t1024_e8 4 warps 72-128: >= 4/SM; t1024_e4 8 warps 40-75: >= 3/SM; t2048_e8 8 warps 66-109: >= 2/SM.
    # A persistent program past the resident ones costs a second wave.
    def pf(t, e, p):
        return {"bwd_pf_max_block": 1024, "bwd_pf_tile_elems": t, "bwd_pf_ept": e, "bwd_pf_progs_per_sm": p,
                "bwd_pf_tile_elems_16bit": t, "bwd_pf_ept_16bit": e, "bwd_pf_progs_per_sm_16bit": p,
                "bwd_pf_progs_per_sm_16bit_512": p}

    narrow_pf = (("plain", {"bwd_pf_max_block": 0}), ("pf_t1024_e8_p4_d2", pf(1024, 8, 4)),
                 ("pf_t1024_e4_p3_d2", pf(1024, 4, 3)), ("pf_t2048_e8_p2_d2", pf(2048, 8, 2)))
    for M, N in ((32768, 768), (16384, 1024)):
        for lab, cfg in narrow_pf:  # LN and RMS share the knobs: one group, one choice
            add("bwdpf", lab, cfg, "ln", M, N, "bwd")
            add("bwdpf", lab, cfg, "rms", M, N, "bwd")
    # dw/db reduction launch (K x P x N fp32 partials, K = 2 for LN): the default 256-column blocks
    # give N=768 only 3 x 2 = 6 programs, each a chain of P / 16 dependent loads; narrower blocks, more
    # programs and fewer steps. Timed with the backward as configured (prefetching at 768/1024).
    for M, N in ((32768, 768), (16384, 1024)):
        for lab, cfg in (("n256_p32", {"red_block_n": 256, "red_block_p": 32}),
                         ("n64_p64", {"red_block_n": 64, "red_block_p": 64}),
                         ("n32_p128", {"red_block_n": 32, "red_block_p": 128})):
            add("reduce", lab, cfg, "ln", M, N, "bwd")
    # prefetching kernel at 2048-8192 (one row per block; 1 CTA of 16 warps per SM: 96-128 regs, d2 at
    # 8192 fp32 spills 176 B). e16 gives 4096 8 warps, e8 16 warps; both 16 warps at 8192.
    def pfw(e):
        return {"bwd_pf_wide_max_block": 8192, "bwd_pf_wide_ept": e, "bwd_pf_wide_progs_per_sm": 1}

    for M, N in ((16384, 4096), (8192, 8192)):
        for pdt in (torch.bfloat16, torch.float32):
            for lab, cfg in (("plain", {"bwd_pf_wide_max_block": 0}), ("pf_e16_p1_d2", pfw(16)),
                             ("pf_e8_p1_d2", pfw(8))):
                add("lnbwdpf", lab, cfg, "ln", M, N, "bwd", pdt)
    # 2026-12-01 (session 5) headline: bf16 x with fp32 w/b, LN forward at 4096 / 8192 ran 0.80 / 0.85x
    # Liger; a persistent program loads w/b once instead of once per row
    for M, N in ((16384, 4096), (8192, 8192)):
        for lab, lo in (("off", 16384), ("from8k", 8192), ("from4k", 4096), ("from2k", 2048)):
            add("fwdmixpersist", lab, {"fwd_persist_min_block_wide_params": lo}, "ln", M, N, "fwd",
                torch.float32, torch.bfloat16)
    # fp32 LN backward at 8192 ran 0.70x Liger (0.60 SOL): the prefetching kernel's two blocks ahead
    # spill there; the plain rows kernel (row-bytes cap) or the column path instead
    for op in ("ln", "rms"):
        for lab, cfg in (("pf", {"bwd_pf_wide_max_row_bytes": 0}), ("plain32k", {"bwd_pf_wide_max_row_bytes": 16384}),
                         ("cols", {"bwd_max_block_ln": 4096, "bwd_pf_wide_max_row_bytes": 0})):
            add("bwd8k32", lab, cfg, op, 8192, 8192, "bwd", torch.float32, torch.float32)
    # session 5 headline: fp32 LN / RMS forward at 16384 ran 0.84 / 0.95x Liger (one 16-warp persistent
    # program per SM); more programs per SM, or none persistent
    for op in ("ln", "rms"):
        for dt in (torch.bfloat16, torch.float32):
            for lab, cfg in (("p1", {}), ("p2", {"fwd_persist_progs_per_sm": 2}),
                             ("off", {"fwd_persist_min_block": 1 << 30, "fwd_persist_min_block_wide_params": 1 << 30})):
                add("fwd16kp", lab, cfg, op, 4096, 16384, "fwd", dt, dt)
    # bf16 x / fp32 w,b LN forward at 4096 ran 0.80x Liger: elements per thread (-> warps) of the one-row program
    for dt, pdt in ((torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16)):
        for e in (4, 8, 16, 32):
            add("fwdmix4k", f"e{e}", {"fwd_ept_mid": e}, "ln", 16384, 4096, "fwd", pdt, dt)
    # the mixed 4096 forward (0.80x Liger): several rows per program, w/b read once per program
    for lab, r in (("r1", 1), ("r2", 2), ("r4", 4)):
        add("fwdmixrows", lab, {"fwd_rows_wide_params": r}, "ln", 16384, 4096, "fwd", torch.float32, torch.bfloat16)
    # fp32 LN backward at 8192 (0.81x Liger, plain kernel at 16 warps): one program per SM as Liger, or 2
    for op in ("ln", "rms"):
        for lab, p in (("p0", 0), ("p1", 1), ("p2", 2)):
            add("bwdplainpps", lab, {"bwd_plain_wide_progs_per_sm": p}, op, 8192, 8192, "bwd",
                torch.float32, torch.float32)
    # 2026-12-01 (session 6): the last-program one-launch wide backward (bwdwide) ran 3-90x slower than
    # row sums + columns (512x262144 bf16 LN 0.398 -> 19-36 ms): one program walked each row's whole dx
    # at L2 latency while its group waited; deleted. Cooperative kernels instead: every program of a row
    # waits for the row's chunk sums (ticket order, acquire/release) and writes its own slice.
    # fwdcoop (the cooperative forward, PHASE 3: every program of a row waited for the row's chunk
    # statistics, then wrote its slice) lost to the shipped split paths: geomean 0.2664-0.3403 vs 0.2593 ms
    # (won only RMS 512x262144: bf16 0.1968 -> 0.1747, fp32 0.3881 -> 0.3332); deleted.
    # bwdcoop: the wide backward (3 passes) against row sums + column kernel (5). Prediction: LN 16384 /
    # 65536 / 262144 and RMS 65536 / 262144, bf16 0.44-0.54 -> 0.65-0.75 SOL, fp32 0.50-0.56 -> 0.70-0.80.
    # Registers (LN bf16 / fp32): c4096 e16 (8 warps) 121 / 128 (2 CTAs per SM), c2048 e16 (4 warps)
    # 121 / 127 (4), c2048 e8 (8 warps) 74 / 69 (3). 2026-12-01: c2048_e16_p4 won (geomean 0.4632 vs off
    # 0.4679): fp32 up to 65536 and bf16 16384 faster by 14-26 %, bf16 65536 / 262144 slower; adopted there.
    def bcoop(ch, e, p):
        return {"bwd_coop_max_block": 1 << 30, "bwd_coop_chunk": ch, "bwd_coop_ept": e, "bwd_coop_progs_per_sm": p}

    for op, shapes in (("ln", ((4096, 16384), (2048, 65536), (512, 262144))),
                       ("rms", ((2048, 65536), (512, 262144)))):
        for M, N in shapes:
            for dt in (torch.bfloat16, torch.float32):
                for lab, cfg in (("off", {"bwd_coop_max_block": 0}), ("c4096_e16_p2", bcoop(4096, 16, 2)),
                                 ("c2048_e16_p4", bcoop(2048, 16, 4)), ("c2048_e8_p3", bcoop(2048, 8, 3)),
                                 ("c4096_e16_p1", bcoop(4096, 16, 1))):
                    add("bwdcoop", lab, cfg, op, M, N, "bwd", dt, dt)
    # bwdmix: one-row backward where w is wider than x (bf16 x, fp32 w/b). The prefetching kernel needs
    # 181 registers with fp32 w at 4096 (128 with bf16 w): 1 CTA per SM; profile 2026-12-01: LN 16384x4096
    # backward kernel 0.206 ms vs 0.112 with bf16 w. The plain kernel (123 registers: 2 CTAs per SM) with
    # 1, 2 or 4 programs per SM. Prediction: 0.206 -> 0.12-0.14 ms at 4096, 8192 0.164 -> 0.12-0.13.
    # 2026-12-01: plain_p2 won by 3 % (LN 4096 0.2274 -> 0.2125): missed, adopted.
    for M, N in ((16384, 4096), (8192, 8192)):
        for op in ("ln", "rms"):
            for lab, cfg in (("pf", {"bwd_pf_wide_params": 1}),
                             ("plain_p1", {"bwd_pf_wide_params": 0, "bwd_plain_progs_per_sm_wide_params": 1}),
                             ("plain_p2", {"bwd_pf_wide_params": 0, "bwd_plain_progs_per_sm_wide_params": 2}),
                             ("plain_p4", {"bwd_pf_wide_params": 0, "bwd_plain_progs_per_sm_wide_params": 4})):
                add("bwdmix", lab, cfg, op, M, N, "bwd", torch.float32, torch.bfloat16)
    # bwdholdw: the plain rows backward on one-row blocks holding w in registers (loaded once per
    # persistent program) instead of reloading it per row, as Liger does. Rows where the plain kernel
    # runs: fp32 8192 (0.87x Liger), bf16 x / fp32 w at 4096 / 8192 (0.92-0.94x Liger), RMS 16384.
    # Registers (sm_90, LN / RMS): fp32 8192 115 / 114 -> 128 / 124; bf16 x fp32 w 4096 123 / 80 ->
    # 124 / 119, 8192 126 / 89 -> 111 / 120: no spills. Prediction: -5..-12 % where w is re-read from L2
    # as many bytes as x (fp32 w). 2026-12-01: hold won every row (LN fp32 8192 0.2684 -> 0.2130, mixed 4096
    # 0.2102 -> 0.1420), adopted.
    for op in ("ln", "rms"):
        for M, N, dt, pdt in ((8192, 8192, torch.float32, torch.float32), (16384, 4096, torch.bfloat16, torch.float32),
                              (8192, 8192, torch.bfloat16, torch.float32), (4096, 16384, torch.bfloat16, torch.bfloat16),
                              (4096, 16384, torch.float32, torch.float32)):
            if op == "ln" and N == 16384:
                continue  # the cooperative kernel there
            for lab, h in (("reload", 0), ("hold", 1)):
                add("bwdholdw", lab, {"bwd_hold_w": h}, op, M, N, "bwd", pdt, dt)
    # bwdpdl (session 8): the dw/db reduction launched with programmatic dependent launch (its launch
    # latency overlaps the backward kernel's tail). Prediction: -2..-4 us per backward, i.e. -4..-8 % on
    # the narrow rows (16384x1024 / 32768x768 bf16, 0.045 / 0.074 ms), within noise at >= 0.2 ms.
    # Measured: -2.5..-7 % up to 1024 wide (adopted there, pdl_max_block), +0.4..+2.2 % at 4096-16384.
    for op in ("ln", "rms"):
        for M, N, dt in ((32768, 768, torch.bfloat16), (16384, 1024, torch.bfloat16), (16384, 1024, torch.float32),
                         (16384, 4096, torch.bfloat16), (8192, 8192, torch.bfloat16), (4096, 16384, torch.bfloat16),
                         (2048, 65536, torch.bfloat16)):
            for lab, v in (("off", 0), ("pdl", 1 << 30)):
                add("bwdpdl", lab, {"pdl_max_block": v}, op, M, N, "bwd", dt, dt)
    # bwdcooprows (session 8; H200 session 10): the cooperative backward exchanging once per BLOCK_R rows lost
    # on every row (RMS bf16 2048x65536 0.3844 ms on the 5-pass path against 0.4240 with one row per
    # exchange and 0.71-1.53 with 2 or 4; LN bf16 512x262144 1.23-3.89 ms with 2-4 rows); kernel deleted
    # bwdmixnarrow (session 8; adopted in session 10, hold): narrow rows with bf16 x and fp32 w/b, prefetching kernel, w held
    # per program instead of reloaded per 1024-wide row (4 KB of fp32 w per 4 KB of x + dy). sm_90 registers
    # (reload): 80 with fp32 w, 72 with bf16 w: occupancy is not the difference. Prediction: LN / RMS
    # 32768x768 and 16384x1024 backward 0.41-0.48 -> 0.52-0.60 SOL (bf16-w rows: 0.55-0.63).
    for op in ("ln", "rms"):
        for M, N in ((32768, 768), (16384, 1024)):
            for lab, v in (("reload", 0), ("hold", 1)):
                add("bwdmixnarrow", lab, {"bwd_pf_hold_w_wide_params": v}, op, M, N, "bwd", torch.float32,
                    torch.bfloat16)
    # fwdmixnarrow (session 8; session 10 adopted 2048): the narrow forward with bf16 x and fp32 w/b runs 4-row tiles of 8 warps
    # (tile_elems_wide_params 4096, chosen where w/b re-reads mattered at 4096 wide) against one-row tiles of
    # 2 warps with bf16 w/b; call 4: 32768x768 / 16384x1024 at 0.63 / 0.70 SOL against 0.72 / 0.77.
    # Prediction: 1024 (one row, 2 warps) -> 0.68-0.75.
    for op in ("ln", "rms"):
        for M, N in ((32768, 768), (16384, 1024)):
            for lab, v in (("t4096", 4096), ("t2048", 2048), ("t1024", 1024)):
                add("fwdmixnarrow", lab, {"tile_elems_wide_params": v}, op, M, N, "fwd", torch.float32,
                    torch.bfloat16)
    # 2026-12-01 (session 6) "bwdpfhold": the prefetching one-row backward holding w (loaded once per
    # program) lost: LN bf16 / fp16 8192x8192 0.1281 / 0.1189 -> 0.1383 / 0.1396 ms, 2048-4096 slower
    # still (registers 128 -> 156-169); RMS 8192 2-3 % faster. Code removed.
    # session 11: widths outside the suite (bench of call 1): forward rows that are not a power of two wide
    # held as two power-of-two column parts (fwd_two_part_max; 5120 = 4096 + 1024 lanes instead of 8192)
    # against one next_pow2(N) tile ("one"). Prediction: bf16 3072 / 5120 / 6144 / 12288 fwd 0.77-0.81 ->
    # 0.86-0.92 SOL (the pow2 widths' level), 20480 (split kernel today, 0.48) -> ~0.85; 320 / 768 / 1536
    # +5-10 %; fp32 within +-3 % (0.93-0.96 already at 1600-6144)
    twopart = (("one", {"fwd_two_part_max": 0}), ("two", {"fwd_two_part_max": 24576}))
    for M, N in ((131072, 320), (32768, 768), (32768, 1536), (16384, 3072), (16384, 5120), (8192, 6144),
                 (8192, 12288), (4096, 20480)):
        for op in ("ln", "rms"):
            for dt, pdt in ((torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)):
                for lab, cfg in twopart:
                    add("fwdtwopart", lab, cfg, op, M, N, "fwd", pdt, dt)
        if N >= 3072:
            for lab, cfg in twopart:
                add("fwdtwopart", lab, cfg, "ln", M, N, "fwd", torch.float32, torch.bfloat16)
    # session 11: the prefetching backward at 1025-2048 wide (bwd_pf_2k_*), one 8-warp program per SM
    # today (LN bf16 32768x2048 / 32768x1600 bwd 0.49 / 0.40 SOL). Prediction: 2-4 programs per SM ->
    # 0.60-0.70
    for M, N in ((32768, 2048), (32768, 1600), (65536, 1536)):
        for op, dt in (("ln", torch.bfloat16), ("rms", torch.bfloat16), ("ln", torch.float32)):
            for ept, pps in ((8, 1), (8, 2), (8, 4), (16, 2), (16, 4), (4, 4)):
                add("bwd2k", f"e{ept}_p{pps}", {"bwd_pf_2k_ept": ept, "bwd_pf_2k_progs_per_sm": pps}, op, M, N,
                    "bwd", dt, dt)
    # session 11: LN bf16 131072x320 bwd at 0.31 SOL (RMS 0.54, LN 262144x256 0.75): the plain kernel's
    # tile at 512 wide, or the prefetching kernel there. Prediction: the prefetching kernel -> 0.50-0.60
    for M, N in ((131072, 320), (65536, 512), (131072, 384)):
        for op, dt in (("ln", torch.bfloat16), ("rms", torch.bfloat16), ("ln", torch.float32)):
            for lab, cfg in (("plain_t4096", {}), ("plain_t2048", {"bwd_tile_elems": 2048}),
                             ("plain_t8192_e16", {"bwd_tile_elems": 8192, "bwd_ept": 16}),
                             ("pf_t1024", {"bwd_pf_min_block": 512}),
                             ("pf_t2048", {"bwd_pf_min_block": 512, "bwd_pf_tile_elems": 2048})):
                add("bwd512", lab, cfg, op, M, N, "bwd", dt, dt)
    # session 11: the looped forward (persistent programs, a row read in chunks twice, the second pass from
    # L1 / L2) against the in-register rows kernel where normkit trails FlagGems: 16-bit rows of 1600-6144
    # (0.77-0.81 SOL, FlagGems 2-10 % faster) and 4096x20480 bf16 (two-part rows 0.50, FlagGems 0.76).
    # Prediction: 20480 bf16 -> 0.65-0.75 with 4 programs per SM (the rows kernel runs one 16-warp program
    # per SM there, one row at a time); 1600-6144 within +-5 %
    def loop(ch, w, pps, two=0):
        return {"fwd_max_block": 1024 if not two else 16384, "fwd_two_part_max": two, "fwd_split_min_block": 1 << 30,
                "fwd_chunk": ch, "fwd_loop_warps": w, "loop_progs_per_sm": pps}
    for M, N in ((32768, 1600), (16384, 3072), (16384, 5120), (8192, 6144)):
        for op in ("ln", "rms"):
            for lab, cfg in (("rows", {}), ("loop_c1024_w4_p4", loop(1024, 4, 4)),
                             ("loop_c2048_w8_p4", loop(2048, 8, 4))):
                add("fwdloopmid", lab, cfg, op, M, N, "fwd")
    for M, N in ((4096, 20480), (8192, 12288)):
        for op in ("ln", "rms"):
            for dt in (torch.bfloat16, torch.float32):
                for lab, cfg in (("rows", {}), ("loop_c4096_w8_p4", dict(loop(4096, 8, 4), fwd_max_block=8192)),
                                 ("loop_c2048_w4_p8", dict(loop(2048, 4, 8), fwd_max_block=8192))):
                    add("fwdloopwide", lab, cfg, op, M, N, "fwd", dt, dt)
    # session 11: the prefetching backward with rows held as two power-of-two column parts (measured in
    # session 12, h200-2026-12-02-s12/call1: slower on 16 of 18 rows, e.g. LN bf16 16384x5120 0.1863 ->
    # 0.2429 ms; kernel deleted; NOTES-layer_norm.md)
    # session 11 (for the next session): the persistent rows forward (w/b held, the next row prefetched in both
    # column parts) at the two-part widths of the 16384 class, where one 16-warp program per SM works a row
    # at a time (LN bf16 4096x20480 0.50 SOL; the looped kernel's 4 programs per SM: 0.1585 -> 0.1268 ms).
    # Offline sm_90 (bf16 LN): 20480 two-part 96 registers at 16 warps (1 program per SM), 16384 and 12288 64
    # (2 per SM), persistent 127-128. So also: 32 warps (20 elements a thread) at 20480.
    # Prediction: bf16 20480 0.50 -> 0.60-0.70, 12288 within +-5 %
    for M, N in ((4096, 20480), (8192, 12288)):
        for op in ("ln", "rms"):
            for lab, cfg in (("rows", {"fwd_persist_two_part": 0}), ("persist", {"fwd_persist_min_block": 16384}),
                             ("w32", {"max_warps": 32, "fwd_persist_two_part": 0})):
                add("fwdpersist2p", lab, cfg, op, M, N, "fwd")
    # session 12: fwdpersist2p won at bf16 20480 (h200-2026-12-02-s12/call1: LN 0.1566 -> 0.1238 ms, RMS 0.1022
    # -> 0.0920; 12288 equal): adopted for the two-part widths (fwd_persist_two_part). Persistent programs at
    # every width of the 16384 class and dtype (fwd_persist_min_block 16384) against one-row programs: the
    # suite's 4096x16384 (fp32 LN 7 % behind Liger there), fp32 20480, 10240 = 8192 + 2048, 1024 rows.
    # Prediction: 16-bit 16384 within +-3 %, fp32 16384 -3..-10 % (session 5's "fwd16kp": LN 0.1692 -> 0.1534),
    # two-part widths: persistent ahead or equal (fp32 20480 within +-5 %)
    for M, N, dts in ((4096, 16384, (torch.bfloat16, torch.float32)), (4096, 20480, (torch.float32,)),
                      (8192, 10240, (torch.bfloat16, torch.float32)), (1024, 16384, (torch.bfloat16,))):
        for dt in dts:
            for op in ("ln", "rms"):
                for lab, cfg in (("rows", {"fwd_persist_two_part": 0}),
                                 ("persist", {"fwd_persist_min_block": 16384})):
                    add("fwdpersist16k", lab, cfg, op, M, N, "fwd", dt, dt)
    # session 12: LN bf16 8192x10240 forward at 0.51 SOL (FlagGems 0.79; RMS 0.89, fp32 0.96): offline sm_90
    # (Triton 3.6) the two-part rows kernel at 16 warps holds the 2048-wide second part at 4 elements a thread
    # and the first at 8, and Triton converts the first part's whole tile between the two layouts, twice a
    # row (the row's shift / mean tie the parts together; RMS has no such conversion). Capped warps
    # (fwd_two_part_cap_warps: 16 bytes of the second part a thread; 16-bit 10240 / 9216 / 18432 at 8 / 4 / 8
    # warps, fp32 9216 at 8)
    # remove both conversions (80 registers at 10240, 145 at 18432, 167 at 9216; persistent: 195 / 255+spill /
    # 255+spill), so capped rows are not persistent. Variants: the new default (cap; persistent where not
    # capped: 20480), never persistent (cap_rows: equal to cap where capped, a noise check), uncapped with and
    # without persistent programs (nocap_rows: session 11's kernel), one next_pow2 tile (fwd_two_part_max 0).
    # Prediction: LN bf16 10240 0.51 -> 0.75-0.85 SOL (12288 runs 0.80), 9216 / 18432 the same kind of gain,
    # RMS (no conversion there) and 20480 (second part 16 bytes a thread already) unchanged
    for M, N, dt in ((8192, 9216, torch.bfloat16), (8192, 10240, torch.bfloat16), (4096, 18432, torch.bfloat16),
                     (4096, 20480, torch.bfloat16), (8192, 9216, torch.float32)):
        for op in ("ln", "rms"):
            for lab, cfg in (("cap", {}), ("cap_rows", {"fwd_persist_two_part": 0}),
                             ("nocap", {"fwd_two_part_cap_warps": 0}),
                             ("nocap_rows", {"fwd_two_part_cap_warps": 0, "fwd_persist_two_part": 0}),
                             ("one", {"fwd_two_part_max": 0})):
                add("fwd2pwarps", lab, cfg, op, M, N, "fwd", dt, dt)
    # session 12 (call 3's bench after fwd2pwarps): bf16 x / fp32 w at 9216 fell to 0.36 SOL (0.1955 ms, Liger
    # 0.1692): its persistent program at the capped 4 warps took 255 registers and a 240-byte stack (offline);
    # now capped only while the first part keeps <= 32 elements a thread (9216, 18432: 16 warps again; 10240: 8
    # warps, 193 registers). Against: uncapped everywhere, and capped one-row programs, not persistent (219 /
    # 124 / 221 registers). Prediction: 9216 back to the uncapped kernel's speed (~0.45-0.5 SOL, ~0.15 ms), 10240
    # cap ahead (0.76 SOL in call 3's bench against 0.49 before), rows1 within +-10 % of the default
    for M, N in ((8192, 9216), (8192, 10240), (4096, 18432)):
        for op in ("ln", "rms"):
            for lab, cfg in (("default", {}), ("nocap", {"fwd_two_part_cap_warps": 0}),
                             ("rows1", {"fwd_persist_min_block_wide_params": 1 << 30, "fwd_rows_wide_params": 1})):
                add("fwd2pmix", lab, cfg, op, M, N, "fwd", torch.float32, torch.bfloat16)
    # session 14 (h200-2026-12-02-s14, calls 2-3): the cooperative backward with the next row's loads issued
    # before the wait for this row's siblings (bwdcooppipe), two orders of the dx store, chunks 2048-8192, 4 / 8
    # programs per SM, against the 5-pass path and the unpipelined kernel, 16-bit included. Predicted bf16 65536
    # 0.44 -> 0.55-0.65 SOL; measured slower at chunk 2048 (LN bf16 4096x16384 0.2024 -> 0.3120 ms, fp32 2048x65536
    # 0.5742 -> 0.7912), faster only at fp32 262144 (RMS 0.681 -> 0.568-0.594, LN 0.752 -> 0.653-0.727), bf16 262144
    # still behind the 5-pass path (LN 0.40 vs 0.49-0.54). Deleted (kernel branch, knob, group); NOTES-layer_norm.md.
    # session 14: layer norm's 16-bit backward at the 16384 class (LN bf16 4096x16384 0.47 SOL on the
    # cooperative kernel, RMS 0.78 on the plain rows kernel): the rows kernel without its db accumulator (what
    # spills: offline sm_90 stack 224 -> 72 bytes at 16384, bf16 w held) and db summed by _bwd_db_rows_kernel
    # (dy read again: 4 passes). Predicted bf16 4096x16384 0.2024 -> ~0.16 ms. Measured (s14 call4): 0.2062 ->
    # 0.1783 (fp16 0.1983 -> 0.1787), 12288 -3 %, 9216 +6 %, bf16 x / fp32 w +8 % (16384) and +58 % (10240):
    # adopted for 16-bit w/b from 12288 wide (bwd_db_split_min_width); "coop" here is the split turned off.
    for M, N, dt, pdt in ((4096, 16384, torch.bfloat16, torch.bfloat16), (4096, 16384, torch.float16, torch.float16),
                          (4096, 16384, torch.bfloat16, torch.float32), (8192, 12288, torch.bfloat16, torch.bfloat16),
                          (8192, 9216, torch.bfloat16, torch.bfloat16), (8192, 10240, torch.bfloat16, torch.float32)):
        for lab, cfg in (("coop", {"bwd_db_split_min_width": 1 << 30}), ("split", {"bwd_db_split_min_width": 9216}),
                         ("split_nohold", {"bwd_db_split_min_width": 9216, "bwd_hold_w": 0})):
            add("lnbwddbsplit", lab, cfg, "ln", M, N, "bwd", pdt, dt)
    # session 15 (h200-2026-12-02-s15, calls 2-4): the wide backward in L2-resident row blocks (bwdl2: phase 1 row
    # sums of a 8-32 MB block of rows, phase 2 its dx re-read from L2 by one program per SM owning a column strip,
    # dw/db in registers, no partials; 3 passes of HBM) against the 5-pass path / the cooperative kernel. Predicted
    # bf16 LN 2048x65536 0.43 -> ~0.27-0.30 ms. Measured: plain loops 0.49-0.73 (latency-bound: one program per SM,
    # ~12 dependent round trips a block); software-pipelined (tl.range num_stages=3, 32 MB blocks) 0.406 against
    # 0.43-0.48 on three leases, LN fp32 512x262144 0.660 against 0.753, but RMS bf16 65536 / 262144 +1.5 / +11 %,
    # LN bf16 262144 +2 %, fp32 65536 +20 % against the cooperative kernel; both phases fused into one loop (per
    # strip sums, P merged per row) 0.67. Deleted (kernel, knobs, tests, group); NOTES-layer_norm.md, session 15.
    # session 15 (prepared, not measured): the 5-pass path's row-sum and column kernels software-pipelined by
    # Triton (tl.range num_stages; offline sm_90: cp.async, 24-98 KB of shared memory, the row-sum kernel 58 -> 80-92
    # registers, so 4 -> 2 programs of 8 warps per SM). Predicted: bf16 2048x65536 / 512x262144 -5..-15 %.
    for op, M, N, dt, pdt in (("ln", 2048, 65536, torch.bfloat16, torch.bfloat16),
                              ("rms", 2048, 65536, torch.bfloat16, torch.bfloat16),
                              ("ln", 512, 262144, torch.bfloat16, torch.bfloat16),
                              ("rms", 512, 262144, torch.bfloat16, torch.bfloat16),
                              ("ln", 4096, 32768, torch.bfloat16, torch.bfloat16),
                              ("ln", 2048, 65536, torch.bfloat16, torch.float32),
                              ("ln", 512, 262144, torch.float32, torch.float32)):
        for lab, cfg in (("base", {}), ("rs2", {"bwd_rowsum_stages": 2}), ("rs3", {"bwd_rowsum_stages": 3}),
                         ("cols2", {"bwd_cols_stages": 2}), ("cols3", {"bwd_cols_stages": 3}),
                         ("both2", {"bwd_rowsum_stages": 2, "bwd_cols_stages": 2}),
                         ("both3", {"bwd_rowsum_stages": 3, "bwd_cols_stages": 3})):
            add("bwdst", lab, cfg, op, M, N, "bwd", pdt, dt)
    # session 16: bwdst measured, (3, 3) adopted (geomean -13 %). Around it: 2 / 4 stages, and the tiles the
    # pipelined loops may now prefer (row-sum chunk, column block, rows per step; shared memory per program,
    # bf16: chunk 4096 8 KB a stage, col block 1024 x 4 rows 16 KB a stage)
    bf, f16, f32 = torch.bfloat16, torch.float16, torch.float32
    for op, M, N, dt, pdt in (("ln", 2048, 65536, bf, bf), ("rms", 2048, 65536, bf, bf), ("rms", 512, 262144, bf, bf),
                              ("ln", 512, 262144, f32, f32), ("ln", 2048, 65536, bf, f32)):
        for lab, cfg in (("base", {}), ("rs2", {"bwd_rowsum_stages": 2}), ("rs4", {"bwd_rowsum_stages": 4}),
                         ("cols4", {"bwd_cols_stages": 4}), ("both4", {"bwd_rowsum_stages": 4, "bwd_cols_stages": 4}),
                         ("chunk8k", {"bwd_chunk": 8192}), ("chunk2k", {"bwd_chunk": 2048}),
                         ("cb2k", {"bwd_col_block": 2048}), ("cr8", {"bwd_col_rows": 8}), ("cr2", {"bwd_col_rows": 2})):
            add("bwdst4", lab, cfg, op, M, N, "bwd", pdt, dt)
    # ... and where the other paths run now (db split, rows, cooperative): the 5-pass path, pipelined, instead.
    # Per row, not a geomean: the choice is a width / dtype rule
    five = {"bwd_max_block": 8192, "bwd_max_block_ln": 8192, "bwd_coop_max_block": 0, "bwd_coop_max_block_16bit": 0}
    for op, M, N, dt, pdt in (("ln", 4096, 16384, bf, bf), ("ln", 8192, 12288, bf, bf), ("rms", 4096, 16384, bf, bf),
                              ("ln", 4096, 16384, bf, f32), ("ln", 4096, 16384, f32, f32), ("ln", 4096, 32768, f32, f32),
                              ("ln", 2048, 65536, f32, f32), ("rms", 2048, 65536, f32, f32)):
        for lab, cfg in (("base", {}), ("5pass", five)):
            add("bwd5route", lab, cfg, op, M, N, "bwd", pdt, dt)
    # session 16 (prepared, not measured): the plain rows kernel's walk over one-row blocks pipelined by Triton
    # (bwd_rows_stages, capped at 160 KB of blocks in flight; offline sm_90: 8192 no stack, 16384 184-240 B).
    # Predicted: LN bf16 4096x16384 (db split) and 8192x12288 -5..-15 %, RMS bf16 16384 (0.77 SOL) -0..-5 %,
    # fp32 8192 and bf16 x / fp32 w rows -3..-10 %; the 16384 rows' extra stack may eat it
    for op, M, N, dt, pdt in (("ln", 4096, 16384, bf, bf), ("ln", 8192, 12288, bf, bf), ("rms", 4096, 16384, bf, bf),
                              ("rms", 4096, 16384, f32, f32), ("ln", 8192, 8192, f32, f32), ("rms", 8192, 8192, f32, f32),
                              ("ln", 8192, 8192, bf, f32), ("rms", 4096, 16384, bf, f32)):
        for lab, cfg in (("base", {}), ("st2", {"bwd_rows_stages": 2}), ("st3", {"bwd_rows_stages": 3}),
                         ("st4", {"bwd_rows_stages": 4})):
            add("bwdrowsst", lab, cfg, op, M, N, "bwd", pdt, dt)
    # session 17: bwdrowsst (H200, 2026-12-02) lost on every 16384-wide row (-20..-50 %) and won on LN bf16 x /
    # fp32 w 8192x8192 (0.1570 -> 0.1190 ms at 3 stages). Predicted here, stages on the 8192 block only: the
    # 16-bit and mixed 4097-8192-wide rows -5..-25 %, fp32 8192 within 3 %
    for op, M, N, dt, pdt in (("ln", 8192, 8192, bf, f32), ("rms", 8192, 8192, bf, f32), ("ln", 8192, 8192, bf, bf),
                              ("rms", 8192, 8192, bf, bf), ("ln", 8192, 8192, f16, f16), ("ln", 12288, 5120, bf, bf),
                              ("ln", 12288, 5120, bf, f32), ("ln", 8192, 6144, f32, f32), ("ln", 8192, 8192, f32, f32)):
        for lab, stages in (("base", 1), ("st2", 2), ("st3", 3), ("st4", 4)):
            add("bwdrowsst8k", lab, {"bwd_rows_stages": stages, "bwd_rows_stages_max_block": 8192}, op, M, N, "bwd",
                pdt, dt)
    # session 18: the two-launch split forward's second launch with several rows per program (w/b chunk loaded
    # once for them), and two launches at 65536 too. Predicted: 512x262144 bf16 x / fp32 w LN 0.240 -> ~0.21 ms,
    # bf16 0.222 -> ~0.20, fp32 within 3 % (w/b re-read from L2 per row: ~12 % in session 4); 2048x65536 bf16 x /
    # fp32 w LN 0.290 -> ~0.22 with two launches (the one launch's last program re-reads 640 KB of x, w, b alone)
    def rows_cfg(r, two):
        c = {"fwd_split_apply_rows": r}
        if two:
            c.update(fwd_split_fused_max_block=0, fwd_split_fused_max_block_wide_params=0)
        return c

    for op in ("ln", "rms"):
        for M, N in ((2048, 65536), (512, 262144)):
            for dt, pdt in ((bf, bf), (bf, f32), (f32, f32)):
                for lab, cfg in (("base", {}), ("r2", rows_cfg(2, False)), ("r4", rows_cfg(4, False)),
                                 ("r8", rows_cfg(8, False)), ("two_r1", rows_cfg(1, True)),
                                 ("two_r4", rows_cfg(4, True)), ("two_r8", rows_cfg(8, True))):
                    if N == 262144 and lab.startswith("two"):
                        continue  # two launches there already: r* are those
                    add("fwdsplitrows", lab, cfg, op, M, N, "fwd", pdt, dt)
    # session 18: the one-row forward's registers capped (maxnreg). Offline sm_90: fp32 LN 16384 92 -> 64 registers
    # without a spill (2 programs of 16 warps a SM instead of 1), fp32 RMS 16384 74 -> 64 with 24 B of stack, fp32
    # 8192 (8 warps) 74-78 -> 64 with 8-16 B. Predicted: LN fp32 4096x16384 0.153 -> ~0.140 ms (Liger 0.142), RMS fp32
    # 16384 -0..-4 %, 8192 +-3 %, 16-bit rows unchanged (64 registers already)
    for op in ("ln", "rms"):
        for M, N in ((4096, 16384), (8192, 8192)):
            for dt in (f32, bf):
                for lab, cfg in (("base", {}), ("r64", {"fwd_maxnreg": 64}), ("r72", {"fwd_maxnreg": 72}),
                                 ("r80", {"fwd_maxnreg": 80})):
                    add("fwdmaxnreg", lab, cfg, op, M, N, "fwd", dt, dt)
    # session 19 (H200, call 1): "fwdlag", the split forward in one launch with a lag (_fwd_split_lag_kernel: program
    # t wrote y of item t - LAG, x re-read from L2, and the statistics of item t; no wait on a row in flight)
    # against today's routing, chunks 2048-8192, lags 8-64 items per SM. Predicted 0.78-0.85 SOL at 32768-262144.
    # Lost on all 15 rows: geomean 0.2474 -> 0.3147 ms at best (c4096_w4_i16); LN bf16 2048x65536 0.1953 -> 0.2518,
    # 512x262144 0.2019 -> 0.2623; RMS fp32 512x262144 0.3851 -> 0.3877 (the closest). Every variant stayed at
    # or under 0.66 SOL, the 3-pass ceiling: the L2 re-read missed. Deleted (NOTES-layer_norm.md, session 19)
    # session 19: the narrow plain backward. LN fp32 262144x256 runs at 0.54 SOL (0.350 ms; bf16 0.75, RMS fp32
    # 0.73, LN fp32 768 0.77): 83 registers (offline sm_90) leave one 16-warp program per SM, two waves of
    # them. Variants: tiles / warps, programs per SM, the prefetching kernel from 64 / 256 wide. Prediction:
    # LN fp32 256 0.350 -> 0.26-0.28 ms (as RMS), the other rows within +-5 %. Measured (call 1): the
    # prefetching kernel (t1024_e8_p4) LN fp32 0.3688 -> 0.2062 ms, RMS fp32 0.2603 -> 0.2033; 16-bit x lost
    # with it (LN bf16 0.1276 -> 0.1403) and kept the plain kernel's default; 64 wide within 1-3 %. Adopted for
    # fp32 x from 256 wide (bwd_pf_min_block_32bit): fp32 "base" rows take the prefetching kernel since. One
    # 16-warp program per SM instead of two (t4096_e8_p1, a knob deleted since) lost on 8 of 10 rows
    def pfn(lo, t, e, p):
        return {"bwd_pf_min_block": lo, "bwd_pf_min_block_32bit": lo, "bwd_pf_tile_elems": t, "bwd_pf_ept": e,
                "bwd_pf_progs_per_sm": p, "bwd_pf_tile_elems_16bit": t, "bwd_pf_ept_16bit": e,
                "bwd_pf_progs_per_sm_16bit": p, "bwd_pf_progs_per_sm_16bit_512": p}

    for M, N in ((262144, 256), (1048576, 64)):
        for op, dt, pdt in (("ln", f32, f32), ("rms", f32, f32), ("ln", bf, bf), ("rms", bf, bf), ("ln", bf, f32)):
            for lab, cfg in (("base", {}), ("t2048_e8", {"bwd_tile_elems": 2048}), ("t1024_e8", {"bwd_tile_elems": 1024}),
                             ("t4096_e16", {"bwd_ept": 16}), ("t2048_e4", {"bwd_tile_elems": 2048, "bwd_ept": 4}),
                             ("pf_t1024_e8_p4", pfn(N, 1024, 8, 4)), ("pf_t2048_e8_p2", pfn(N, 2048, 8, 2)),
                             ("pf_t4096_e8_p1", pfn(N, 4096, 8, 1))):
                add("bwdnarrow", lab, cfg, op, M, N, "bwd", pdt, dt)
    # session 19: the 16-bit narrow backward (prefetching kernel, 768 / 1024 wide) at 0.55-0.61 SOL against fp32's
    # 0.77-0.81: each program keeps two rows of x and dy ahead, 6-8 KB in 16-bit, so 4 programs per SM hold ~24-32 KB
    # in flight where ~48 KB would cover HBM latency. Variants: 5-7 programs per SM (72-80 registers fit 6-7), two
    # rows a block at 4 warps (t2048_e16, 128 registers: 4 per SM). Prediction: 768 0.56 -> 0.65-0.70 SOL, 1024 0.61
    # -> 0.68; bf16 x / fp32 w alike. Measured (call 3, ms, "base" then t1024_e8_p4): t2048_e16_p4 won at 768 / 1024
    # (LN bf16 32768x768 0.0667 -> 0.0558, 16384x1024 0.0395 -> 0.0356; RMS 0.0644 -> 0.0521, 0.0402 -> 0.0332;
    # bf16 x / fp32 w 0.0652 -> 0.0559, 0.0408 -> 0.0354) but lost at 512 (0.0745 -> 0.0831: 159-168 registers
    # there, 3 programs a SM), where t2048_e16_p3 won (0.0672); p5-p7 of the 1-row tile gained less (p6 768 0.0581).
    # Adopted: t2048_e16, 4 programs per SM at 1024 wide, 3 at 512 (bwd_pf_*_16bit; "base" is that since)
    def pf16(t, e, p):
        return {"bwd_pf_tile_elems_16bit": t, "bwd_pf_ept_16bit": e, "bwd_pf_progs_per_sm_16bit": p,
                "bwd_pf_progs_per_sm_16bit_512": p}

    for M, N in ((32768, 768), (16384, 1024), (65536, 512)):
        for op, dt, pdt in (("ln", bf, bf), ("rms", bf, bf), ("ln", bf, f32)):
            for lab, cfg in (("base", {}), ("p5", pf16(1024, 8, 5)), ("p6", pf16(1024, 8, 6)), ("p7", pf16(1024, 8, 7)),
                             ("t2048_e16_p4", pf16(2048, 16, 4)), ("t2048_e16_p3", pf16(2048, 16, 3))):
                add("bwdpf16", lab, cfg, op, M, N, "bwd", pdt, dt)
    out, chosen = [], {}
    if only:
        order = [g for g in only if g in groups]
    else:
        order = ["reduce", "bwdpf", "lnbwdpf", "fwdpersist", "fwdloop", "fwdsplit", "fwdwide",
                 "fwdtile", "bwdtile", "bwdcols", "rmsbwd16k",
                 "lnbwd16k", "lnbwd8k", "fwd16k", "fwdept", "fwdsmall", "fwdmid", "bwdmid"]
    for g in order:
        cases = groups[g]
        if DEV == "cpu":  # --dry: each variant once, on its first row, shrunk
            seen = set()
            cases = [(c[0], c[1], c[2], min(c[3], 8), min(c[4], 2048), c[5], c[6], c[7]) for c in cases
                     if not (c[0] in seen or seen.add(c[0]))]
        totals = {}
        for label, cfg, op, M, N, which, pdt, dt in cases:
            if time.time() > deadline:
                log(f"sweep {g}: out of time")
                break
            L._CFG.clear()
            L._CFG.update(base)
            L._CFG.update(chosen)
            L._CFG.update(cfg)
            try:
                r = time_row(op, M, N, dt, pdt, sol_bw, with_aten=False, which=which)
            except Exception as e:
                log(f"sweep {g} {op} {M}x{N} {which} {label} FAILED {repr(e)[:200]}")
                totals[label] = float("inf")
                continue
            v, sv = r["nk_" + which], r["nk_" + which + "_sol"]
            err = None
            if g in ("fwdsplit", "fwdwide", "fwdcoop", "fwdtwopart", "fwdloopmid", "fwdloopwide",
                     "fwdpersist2p", "fwdpersist16k", "fwd2pwarps",
                     "fwd2pmix", "fwdsplitrows", "fwdmaxnreg", "fwdwbearly"):  # new kernels: check y on a row subset against fp64 (same width)
                try:
                    xs, _, ws, bs = make(op, min(M, 64), N, torch.bfloat16, pdt)
                    if op == "ln":
                        yk = L.ln_forward(xs, ws, bs, 1e-5)[0]
                        yr = torch.nn.functional.layer_norm(xs.double(), (N,), ws.double(), bs.double(), 1e-5)
                    else:
                        yk = L.rms_forward(xs, ws, 1e-6)[0]
                        yr = torch.nn.functional.rms_norm(xs.double(), (N,), ws.double(), 1e-6)
                    err = rel(yk, yr)
                except Exception as e:
                    log(f"sweep {g} {label} check FAILED {repr(e)[:200]}")
                    err = float("nan")
            elif g in ("bwdcoop", "lnbwddbsplit", "bwdst", "bwdst4", "bwd5route", "bwdrowsst", "bwdrowsst8k", "bwdmix", "bwdholdw", "bwd2k", "bwd512", "bwdnarrow", "bwdpf16"):  # backward kernels new to these rows: dx, dw (, db) on a row subset against fp64
                try:
                    c = check(op, min(M, 64), N, dt, pdt)
                    err = max(c[k] for k in ("dx", "dw", "db") if k in c)
                except Exception as e:
                    log(f"sweep {g} {label} check FAILED {repr(e)[:200]}")
                    err = float("nan")
            if err is not None and not err <= 1e-2:  # bf16 output rounding is ~2e-3
                v = float("inf")
            totals[label] = totals.get(label, 0.0) + math.log(v)  # geomean over the group's rows
            out.append({"group": g, "label": label, "op": op, "M": M, "N": N, "dir": which, "ms": v, "sol": sv,
                        "cfg": cfg, "params": str(pdt), "dtype": str(dt), "err": err})
            if jsonl:  # one line per timing as it comes, so that a cut-off run still leaves its data
                with open(jsonl, "a") as f:
                    f.write(json.dumps(out[-1]) + "\n")
            log(f"sweep {g:8s} {op:3s} {M}x{N} {which} {str(dt)[6:]}/{str(pdt)[6:]:8s} {label:22s} {v:8.4f} ms  SOL {sv:.3f}"
                + (f"  err {err:.2e}" if err is not None else ""))
        complete = {lab for lab in totals if sum(1 for c in cases if c[0] == lab) ==
                    sum(1 for o in out if o["group"] == g and o["label"] == lab)}
        if complete:
            best = min(complete, key=lambda k: totals[k])
            chosen.update(next(c[1] for c in cases if c[0] == best))
            nrows = sum(1 for c in cases if c[0] == best)
            log(f"sweep {g}: chose {best}, geomean {math.exp(totals[best] / nrows):.4f} ms; " +
                ", ".join(f"{k} {math.exp(totals[k] / nrows):.4f}" for k in sorted(complete)))
            if jsonl:
                with open(jsonl, "a") as f:
                    f.write(json.dumps({"group": g, "chose": best, "geomean_ms": math.exp(totals[best] / nrows),
                                        "cfg": next(c[1] for c in cases if c[0] == best)}) + "\n")
    L._CFG.clear()
    L._CFG.update(base)
    L._CFG.update(chosen)
    log(f"chosen cfg: {chosen}")
    return out, chosen


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--quick", action="store_true", help="bf16 only")
    ap.add_argument("--no-rows", action="store_true")
    ap.add_argument("--budget", type=float, default=1e9, help="seconds: sweep stops at half, rows at the end")
    ap.add_argument("--sweep-budget", type=float, default=None, help="seconds for the sweep (default: budget / 2)")
    ap.add_argument("--groups", default="", help="comma-separated sweep groups (default: all), in this order")
    ap.add_argument("--dry", action="store_true", help="CPU + TRITON_INTERPRET=1, tiny shapes: checks the script")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    global DEV, SHAPES, TIMER
    if args.dry:
        DEV = "cpu"
        SHAPES = [(64, 64), (16, 1000), (4, 20000)]
    TIMER = Timer(DEV)
    t0 = time.time()
    props = torch.cuda.get_device_properties(0) if DEV == "cuda" else None
    meta = {"device": props.name if props else "cpu", "sms": props.multi_processor_count if props else 0,
            "torch": torch.__version__,
            "triton": triton.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            "cfg": dict(L._CFG), "timer": "cuda-graph, rotated inputs >= 4x L2", "argv": sys.argv[1:]}
    bw = copy_bw()
    meta["copy_GBps"] = bw
    log(f"# {meta}")
    log(f"copy bandwidth {bw:.0f} GB/s")
    only = [g for g in args.groups.split(",") if g] or None
    sb = args.sweep_budget if args.sweep_budget is not None else args.budget * 0.5
    sw, chosen = (sweep(bw, t0 + sb, only, os.path.join(args.out, "ln_sweep.jsonl"))
                  if args.sweep else ([], {}))
    meta["chosen"] = chosen
    meta["cfg_rows"] = dict(L._CFG)
    checks = []
    for op in ("ln", "rms"):
        for (M, N) in ([(262144, 256), (32768, 768), (16384, 4096), (8192, 8192), (4096, 16384), (2048, 65536),
                        (512, 262144)]
                       if DEV == "cuda" else SHAPES):
            combos = [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)]
            if op == "ln":
                combos.append((torch.bfloat16, torch.float32))
            for dt, pdt in combos:
                try:
                    c = check(op, M, N, dt, pdt)
                except Exception as e:
                    log("check", op, M, N, dt, pdt, "FAILED", repr(e)[:300])
                    continue
                c.update(op=op, M=M, N=N, dtype=str(dt), params=str(pdt))
                checks.append(c)
                log("check", op, M, N, dt, pdt, {k: (f"{v:.2e}" if isinstance(v, float) else v) for k, v in c.items()
                                                   if k in ("y", "aten_y", "dx", "dw", "db", "finite")})
    _empty_cache()
    log(f"checks done {time.time() - t0:.0f}s")
    _dump(args.out, meta, checks, sw, [])
    rows = []
    if not args.no_rows:
        combos = {"ln": [("bfloat16", "bfloat16"), ("float32", "float32"), ("bfloat16", "float32")],
                  "rms": [("bfloat16", "bfloat16"), ("float32", "float32")]}
        if args.quick:
            combos = {"ln": [("bfloat16", "bfloat16")], "rms": [("bfloat16", "bfloat16")]}
        plan = [(op, dts, pds) for i in range(3) for op in ("ln", "rms") for (dts, pds) in combos[op][i:i + 1]]
        for op, dts, pds in plan:
            for M, N in SHAPES:
                if time.time() > t0 + args.budget:
                    log(f"row {op} {M}x{N} {dts}: out of time")
                    continue
                try:
                    r = time_row(op, M, N, DT[dts], DT[pds], bw)
                except Exception as e:
                    log(f"row {op} {M}x{N} {dts} FAILED {repr(e)[:300]}")
                    continue
                rows.append(r)
                _empty_cache()
            _dump(args.out, meta, checks, sw, rows)
    with open(os.path.join(args.out, "ln_bench.json"), "w") as f:
        json.dump({"meta": meta, "checks": checks, "sweep": sw, "rows": rows}, f, indent=1)
    log(f"total {time.time() - t0:.0f}s")
    log("")
    log(f"{'op':3s} {'shape':>14s} {'dtype':>9s} {'par':>5s} | {'nk fwd ms':>9s} {'SOL':>5s} {'aten':>5s} {'x':>5s} |"
        f" {'nk bwd ms':>9s} {'SOL':>5s} {'aten':>5s} {'x':>5s}")
    for r in rows:
        sh = f"{r['M']}x{r['N']}"
        fa = r.get("aten_fwd_sol", float("nan"))
        ba = r.get("aten_bwd_sol", float("nan"))
        fx = r.get("aten_fwd", float("nan")) / r["nk_fwd"]
        bx = r.get("aten_bwd", float("nan")) / r["nk_bwd"]
        log(f"{r['op']:3s} {sh:>14s} {r['dtype']:>9s} {r['params'][:5]:>5s} | {r['nk_fwd']:9.4f} {r['nk_fwd_sol']:5.2f}"
            f" {fa:5.2f} {fx:5.2f} | {r['nk_bwd']:9.4f} {r['nk_bwd_sol']:5.2f} {ba:5.2f} {bx:5.2f}")
    with open(os.path.join(args.out, "ln_bench.log"), "w") as f:
        f.write("\n".join(LOG) + "\n")


if __name__ == "__main__":
    sys.exit(main())
