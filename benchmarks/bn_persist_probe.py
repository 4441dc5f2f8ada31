"""Can batch norm's training forward read x from HBM once? A persistent, grid-synchronised forward (probe).

    PYTHONPATH=src python benchmarks/bn_persist_probe.py --out DIR [--budget SECONDS] [--shapes 0,1] [--variants ...]
    python benchmarks/bn_persist_probe.py --plot DIR/bn_persist_probe.jsonl --variants p2w8u4,tma2s4
    TRITON_INTERPRET=1 PYTHONPATH=src python benchmarks/bn_persist_probe.py --dry --out DIR   # CPU check

normkit's training forward is three kernels (split reduction, combine, elementwise): x crosses HBM twice, so its
ceiling under the 2-pass byte count is 0.67 of SOL, and the suite's 51-103 MB rows sit at 0.41-0.59. Here one
kernel of G resident programs (2-8 a SM) does it all:

1. each program sums its units (tiles of one channel block; units q, q + Q, ..., U loads in flight a step, all
   programs advancing through memory together) about the channel's first element; writes its partial sums;
2. grid barrier (an int32 counter, integer atomics only), then program g finalises channels g*FB.. (fixed-order
   fp64 sum of the partials, mean / invstd / running statistics, coefficients), as the combine kernel does;
3. grid barrier, then every program writes y, re-reading its units in reverse order: the last read first, so
   the re-read hits the 60 MB L2 where it can (a 51 MB tensor may be read from HBM only once).

No launch gaps, no separate combine; x crosses HBM once plus what L2 no longer holds. The sums are fixed-order
(same bits every run). Programs must all be resident at once: G <= SMs x programs a SM that fit (checked from the
compiled kernel's registers before any launch), and the barrier gives up after a spin limit and raises a flag
instead of hanging. Under the interpreter G = 1. (Holding part of x in registers across the barrier was tried
offline first: 32 KB a program at 8 warps took 178-198 registers, 64 KB 255 with spills, i.e. ~4 MB held on the
whole GPU: not worth it.)

Times, per shape (bf16, CUDA graphs, inputs rotated past L2): normkit's training forward (``nk``), the eval
forward (one read + one write: what a 2-pass kernel can reach), and the persistent kernel's variants; every
persistent result is checked against normkit's forward (y, mean, invstd, running statistics) first.
"""

import argparse
import json
import os
import sys
import time

if "--dry" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import triton
import triton.language as tl

from normkit.bench.runner import Context, copy_bandwidth
from normkit.bench.report import save_png
from normkit.bench.timing import Timer
from normkit.kernels import batch_norm as B
from normkit.kernels.batch_norm import _fused_kernels as BF
from normkit.kernels.batch_norm import _reduce_kernels as BR
from normkit.kernels import cdiv, next_pow2

SHAPES = [((256, 2048, 7, 7), "cl"), ((256, 64, 56, 56), "cl"), ((256, 1024, 14, 14), "cl"),
          ((65536, 1024), "cl"), ((256, 512, 28, 28), "cl"), ((256, 64, 56, 56), "nchw"),
          ((256, 512, 28, 28), "nchw"), ((16, 64, 32, 64, 64), "cl"), ((256, 256, 56, 56), "cl")]
# name: (programs a SM, warps, tile bytes, units a loop step, barrier polls: 0 atomic / 1 volatile loads, TMA stages
# (0: plain loads)): every plain-load variant keeps 32-64 KB of loads in flight a SM, a TMA one stages x tile a program
VARIANTS = {
    "p4w4u4": (4, 4, 4096, 4, 0, 0),
    "p2w8u4": (2, 8, 8192, 4, 0, 0),
    "p4w4u2": (4, 4, 8192, 2, 0, 0),
    "p3w4u4": (3, 4, 4096, 4, 0, 0),
    "p2w4u4": (2, 4, 4096, 4, 0, 0),
    "p4w4u4v": (4, 4, 4096, 4, 1, 0),
    "tma2s4": (2, 4, 16384, 1, 0, 4),
    "tma3s3": (3, 4, 16384, 1, 0, 3),
    "tma2s3w8": (2, 8, 16384, 1, 0, 3),
    "tma4s3t8k": (4, 4, 8192, 1, 0, 3),
}
SPIN_LIMIT = 1 << 24
DEV = "cuda"


@triton.jit
def _unit(u, cb, UT, M, C, S, NSC, ROWS: tl.constexpr, B0: tl.constexpr, B1: tl.constexpr):
    """Offsets and mask of work unit u of channel block cb (all masked off when u >= UT). ROWS: [B0 rows,
    B1 channels] of the (M, C) view; else [B0 channels, B1 plane elements] of sample u // NSC of (N, C, S)."""
    if ROWS:
        rows = u.to(tl.int64) * B0 + tl.arange(0, B0)
        cols = cb * B1 + tl.arange(0, B1)
        offs = rows[:, None] * C + cols[None, :]
        mask = (rows < M)[:, None] & (cols < C)[None, :]
    else:
        n = u // NSC
        s = (u - n * NSC) * B1 + tl.arange(0, B1)
        ch = cb * B0 + tl.arange(0, B0)
        offs = (n.to(tl.int64) * C + ch)[:, None] * S + s[None, :]
        mask = (ch < tl.where(u < UT, C, 0))[:, None] & (s < S)[None, :]  # (the interpreter: no bool & scalar)
    return offs, mask


@triton.jit
def _fold(acc, ROWS: tl.constexpr):
    """Per-channel sums of a [B0, B1] tile: over rows (rows view) or over plane elements (ncs)."""
    if ROWS:
        out = tl.sum(acc, axis=0)
    else:
        out = tl.sum(acc, axis=1)
    return out


@triton.jit
def _step(x_ptr, q, Q, k, cb, UT, M, C, S, NSC, ROWS: tl.constexpr, B0: tl.constexpr, B1: tl.constexpr,
          U: tl.constexpr):
    """Loads of streaming step k: units q + (U*k + j)*Q, j < U (2 or 4), all issued before any is used."""
    u0 = q + (U * k) * Q
    o0, m0 = _unit(u0, cb, UT, M, C, S, NSC, ROWS, B0, B1)
    o1, m1 = _unit(u0 + Q, cb, UT, M, C, S, NSC, ROWS, B0, B1)
    x0 = tl.load(x_ptr + o0, mask=m0, other=0.0)
    x1 = tl.load(x_ptr + o1, mask=m1, other=0.0)
    if U == 4:
        o2, m2 = _unit(u0 + 2 * Q, cb, UT, M, C, S, NSC, ROWS, B0, B1)
        o3, m3 = _unit(u0 + 3 * Q, cb, UT, M, C, S, NSC, ROWS, B0, B1)
        x2 = tl.load(x_ptr + o2, mask=m2, other=0.0)
        x3 = tl.load(x_ptr + o3, mask=m3, other=0.0)
    else:
        o2, m2, x2, o3, m3, x3 = o0, m0, x0, o0, m0, x0
    return o0, m0, x0, o1, m1, x1, o2, m2, x2, o3, m3, x3


@triton.jit
def _grid_sync(cnt_ptr, target, flag_ptr, LIMIT: tl.constexpr, POLL: tl.constexpr):
    """Count in on cnt (release: this program's stores first), wait until target programs have (acquire).
    POLL 0: polls are atomic reads; 1: volatile loads, one acquiring atomic after. Gives up after LIMIT polls
    and raises flag (a probe must not hang the GPU)."""
    tl.debug_barrier()
    tl.atomic_add(cnt_ptr, 1, sem="release", scope="gpu")
    arrived = tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
    it = 0
    while (arrived < target) & (it < LIMIT):
        if POLL == 0:
            arrived = tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
        else:
            arrived = tl.load(cnt_ptr, volatile=True)
        it += 1
    if POLL == 1:
        arrived = tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
    if arrived < target:
        tl.atomic_add(flag_ptr, 1)


@triton.jit
def _stamp(times_ptr, g, i, TIMED: tl.constexpr):
    """With TIMED: the GPU's global timer (ns) at this point of program g, slot i of 5."""
    if TIMED:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
        tl.store(times_ptr + g * 5 + i, t)


@triton.jit
def _persist_fwd_kernel(
    x_ptr, y_ptr, xd, yd, part_ptr, coef_ptr, mean_ptr, invstd_ptr, w_ptr, b_ptr, rm_ptr, rv_ptr, cnt_ptr,
    flag_ptr, times_ptr, M, C, S, NSC, UT, G, NCB, Q, NB, n0, n1, e0, e1, e2, m0, m1, m2,
    ROWS: tl.constexpr, B0: tl.constexpr, B1: tl.constexpr, U: tl.constexpr, FB: tl.constexpr,
    BP: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_RS: tl.constexpr,
    ACC: tl.constexpr, LIMIT: tl.constexpr, POLL: tl.constexpr, TIMED: tl.constexpr, TMA: tl.constexpr,
    STAGES: tl.constexpr,
):
    """The whole training forward in one launch of G resident programs (the module docstring's phases 1-3).
    TMA (rows view only): x tiles by the tensor-memory accelerator (xd: the (M, C) view, block [B0, B1]),
    STAGES deep through shared memory (few registers whatever the bytes in flight); y stored through yd."""
    g = tl.program_id(0)
    _stamp(times_ptr, g, 0, TIMED)
    cb = g % NCB
    q = g // NCB
    if ROWS:
        ch = cb * B1 + tl.arange(0, B1)
        shift = tl.load(x_ptr + ch, mask=ch < C, other=0.0).to(ACC)
    else:
        ch = cb * B0 + tl.arange(0, B0)
        shift = tl.load(x_ptr + ch.to(tl.int64) * S, mask=ch < C, other=0.0).to(ACC)
    cmask = ch < C
    shift2 = BF._bn_fused_spread(shift, ROWS)
    # the finaliser's per-channel inputs (none written by this kernel before it reads them) loaded up front
    fch = g * FB + tl.arange(0, FB)
    fmask = fch < C
    if ROWS:
        fshift = tl.load(x_ptr + fch, mask=fmask, other=0.0).to(tl.float64)
    else:
        fshift = tl.load(x_ptr + fch.to(tl.int64) * S, mask=fmask, other=0.0).to(tl.float64)
    fw = tl.load(w_ptr + fch, mask=fmask, other=1.0).to(tl.float64)
    fb = tl.load(b_ptr + fch, mask=fmask, other=0.0).to(tl.float64)
    frm = tl.load(rm_ptr + fch, mask=fmask, other=0.0).to(ACC)
    frv = tl.load(rv_ptr + fch, mask=fmask, other=0.0).to(ACC)
    # 1. shifted sums over the program's units q, q + Q, ...
    acc1 = tl.zeros([B0, B1], dtype=ACC)
    acc2 = tl.zeros([B0, B1], dtype=ACC)
    nj = (UT - q + Q - 1) // Q
    if TMA:
        rr = tl.arange(0, B0)
        for k in tl.range(0, nj, num_stages=STAGES):
            u = q + k * Q
            xt = xd.load([u * B0, cb * B1])
            d = tl.where(((u * B0 + rr) < M)[:, None] & cmask[None, :], xt.to(ACC) - shift2, 0.0)
            acc1 += d
            acc2 += d * d
    else:
        for k in range(0, NB):
            o0, m0_, x0, o1, m1_, x1, o2, m2_, x2, o3, m3_, x3 = _step(x_ptr, q, Q, k, cb, UT, M, C, S, NSC, ROWS,
                                                                      B0, B1, U)
            d0 = tl.where(m0_, x0.to(ACC) - shift2, 0.0)
            d1 = tl.where(m1_, x1.to(ACC) - shift2, 0.0)
            acc1 += d0 + d1
            acc2 += d0 * d0 + d1 * d1
            if U == 4:
                d2 = tl.where(m2_, x2.to(ACC) - shift2, 0.0)
                d3 = tl.where(m3_, x3.to(ACC) - shift2, 0.0)
                acc1 += d2 + d3
                acc2 += d2 * d2 + d3 * d3
    tl.store(part_ptr + q * C + ch, _fold(acc1, ROWS), mask=cmask)
    tl.store(part_ptr + (Q + q) * C + ch, _fold(acc2, ROWS), mask=cmask)
    _stamp(times_ptr, g, 1, TIMED)
    _grid_sync(cnt_ptr, G, flag_ptr, LIMIT, POLL)
    _stamp(times_ptr, g, 2, TIMED)
    # 2. program g finalises channels g*FB.. (as _bn_combine_fwd_kernel): one round of partial loads
    if g * FB < C:
        a1 = tl.zeros([BP, FB], dtype=tl.float64)
        a2 = tl.zeros([BP, FB], dtype=tl.float64)
        pr0 = tl.arange(0, BP)
        for p0 in range(0, Q, BP):
            pr = p0 + pr0
            pm = (pr < Q)[:, None] & fmask[None, :]
            po = pr[:, None] * C + fch[None, :]
            a1 += tl.load(part_ptr + po, mask=pm, other=0.0, cache_modifier=".cg").to(tl.float64)
            a2 += tl.load(part_ptr + Q * C + po, mask=pm, other=0.0, cache_modifier=".cg").to(tl.float64)
        f1 = tl.sum(a1, axis=0)
        f2 = tl.sum(a2, axis=0)
        dmean, invstd, mean, var, nf = BR._bn_finish_stats(f1, f2, fshift, fch, fmask, n0, n1, e0, e1, e2,
                                                          mean_ptr, invstd_ptr, ACC)
        a = invstd
        if HAS_W:
            a = a * fw
        if HAS_B:
            c = fb - dmean * a
        else:
            c = -dmean * a
        tl.store(coef_ptr + fch, a.to(ACC), mask=fmask)
        tl.store(coef_ptr + C + fch, c.to(ACC), mask=fmask)
        if HAS_RS:
            BR._bn_update_running(frm, frv, mean, var, nf, fch, fmask, m0, m1, m2, rm_ptr, rv_ptr, False, ACC)
    _grid_sync(cnt_ptr, 2 * G, flag_ptr, LIMIT, POLL)
    _stamp(times_ptr, g, 3, TIMED)
    # every program is past the last wait: the last one out resets the counters for the next launch
    left = tl.atomic_add(cnt_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if left == G - 1:
        tl.atomic_xchg(cnt_ptr, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(cnt_ptr + 1, 0, sem="relaxed", scope="gpu")
    # 3. y = (x - shift) * a + c, the steps in reverse order (the last read first: L2)
    ka = BF._bn_fused_spread(tl.load(coef_ptr + ch, mask=cmask, other=0.0, cache_modifier=".cg"), ROWS)
    kc = BF._bn_fused_spread(tl.load(coef_ptr + C + ch, mask=cmask, other=0.0, cache_modifier=".cg"), ROWS)
    if TMA:
        for k in tl.range(0, nj, num_stages=STAGES):
            u = q + (nj - 1 - k) * Q
            xt = xd.load([u * B0, cb * B1])
            yd.store([u * B0, cb * B1], ((xt.to(ACC) - shift2) * ka + kc).to(y_ptr.dtype.element_ty))
    else:
        for k in range(0, NB):
            o0, m0_, x0, o1, m1_, x1, o2, m2_, x2, o3, m3_, x3 = _step(x_ptr, q, Q, NB - 1 - k, cb, UT, M, C, S,
                                                                      NSC, ROWS, B0, B1, U)
            yt = y_ptr.dtype.element_ty
            if U == 4:
                tl.store(y_ptr + o3, ((x3.to(ACC) - shift2) * ka + kc).to(yt), mask=m3_)
                tl.store(y_ptr + o2, ((x2.to(ACC) - shift2) * ka + kc).to(yt), mask=m2_)
            tl.store(y_ptr + o1, ((x1.to(ACC) - shift2) * ka + kc).to(yt), mask=m1_)
            tl.store(y_ptr + o0, ((x0.to(ACC) - shift2) * ka + kc).to(yt), mask=m0_)
    _stamp(times_ptr, g, 4, TIMED)


class Persist:
    """Launcher of the probe kernel for one input shape / layout and variant."""

    def __init__(self, x, pps, nw, tile_bytes, U, poll, stages, nsm):
        v = B._View(x)
        tile = tile_bytes // x.element_size()
        if v.kind == "rows":
            self.rows = True
            B1 = min(next_pow2(v.C), 256, tile)
            B0 = max(1, tile // B1)
            if stages:
                B0 = min(B0, 256)  # a TMA box is at most 256 elements a dimension
            NCB = cdiv(v.C, B1)
            UT = cdiv(v.M, B0)
            NSC = 1
        else:
            if stages:
                raise ValueError("TMA: rows view only")
            self.rows = False
            B1 = min(next_pow2(v.S), tile)
            B0 = max(1, min(next_pow2(v.C), tile // B1))
            NCB = cdiv(v.C, B0)
            NSC = cdiv(v.S, B1)
            UT = v.N * NSC
        # the interpreter runs programs one after another: one program, which never waits for another
        interpreted = os.environ.get("TRITON_INTERPRET") == "1"
        G = NCB if interpreted else (nsm * pps // NCB) * NCB
        if G == 0 or (interpreted and NCB > 1):
            raise ValueError(f"{NCB} channel blocks: {G} programs ({nsm * pps} slots; the interpreter takes one block)")
        Q = G // NCB
        self.v, self.x = v, x
        self.B0, self.B1, self.NCB, self.UT, self.NSC, self.G, self.Q, self.U = B0, B1, NCB, UT, NSC, G, Q, U
        self.NB = cdiv(cdiv(UT, Q), U)
        self.FB = next_pow2(cdiv(v.C, G))
        self.BP = min(next_pow2(Q), max(1, 2048 // self.FB))
        self.nw, self.pps, self.poll, self.stages = nw, pps, poll, stages
        if stages and (v.C * x.element_size()) % 16:
            raise ValueError("TMA: rows of C elements must be 16-byte multiples")
        dev = x.device
        self.part = torch.empty((2, Q, v.C), device=dev, dtype=torch.float32)
        self.coef = torch.empty((2, v.C), device=dev, dtype=torch.float32)
        self.cnt = torch.zeros(2, device=dev, dtype=torch.int32)
        self.flag = torch.zeros(1, device=dev, dtype=torch.int32)
        self.times = torch.zeros((G, 5), device=dev, dtype=torch.int64)
        self.timed = False

    def args(self, x, y, mean, invstd, w, b, rm, rv, momentum, eps):
        v = self.v
        n0, n1 = B._split_count(v.M)
        e = B._split3(eps)
        m = B._momentum_parts(momentum)
        xd = yd = x
        if self.stages:
            from triton.tools.tensor_descriptor import TensorDescriptor

            xd, yd = (TensorDescriptor(t.as_strided((v.M, v.C), (v.C, 1)), [v.M, v.C], [v.C, 1], [self.B0, self.B1])
                      for t in (x, y))
        args = (x, y, xd, yd, self.part, self.coef, mean, invstd, w, b, rm, rv, self.cnt, self.flag, self.times,
                v.M, v.C, v.S, self.NSC, self.UT, self.G, self.NCB, self.Q, self.NB, n0, n1, e[0], e[1], e[2],
                m[0], m[1], m[2])
        kw = dict(ROWS=self.rows, B0=self.B0, B1=self.B1, U=self.U, FB=self.FB, BP=self.BP, HAS_W=True,
                  HAS_B=True, HAS_RS=True, ACC=tl.float32, LIMIT=SPIN_LIMIT, POLL=self.poll, TIMED=self.timed,
                  TMA=self.stages > 0, STAGES=max(self.stages, 1), num_warps=self.nw)
        return args, kw

    def cfg(self):
        return dict(B0=self.B0, B1=self.B1, NCB=self.NCB, G=self.G, Q=self.Q, U=self.U, NB=self.NB, FB=self.FB,
                    nw=self.nw, pps=self.pps, poll=self.poll, stages=self.stages)

    def compile(self, w):
        """The compiled kernel, without launching it (a launch of fewer than G programs would wait forever)."""
        args, kw = self.args(self.x, self.x, w, w, w, w, w, w, 0.1, 1e-5)
        return _persist_fwd_kernel.warmup(*args, grid=(1,), **kw)

    def __call__(self, x, w, b, rm, rv, momentum, eps):
        y = torch.empty_like(x)
        mean = torch.empty(self.v.C, device=x.device, dtype=torch.float32)
        invstd = torch.empty_like(mean)
        args, kw = self.args(x, y, mean, invstd, w, b, rm, rv, momentum, eps)
        _persist_fwd_kernel[(self.G,)](*args, **kw)
        return y, mean, invstd


def phases(p, xs, w, b, rm, rv, nsm):
    """One eager call a input set with the global-timer stamps on; the last set's phases (µs): launch skew, the
    sums (last program's end), barrier 1 (last arrival to last departure), finalise + barrier 2, the y pass.
    Empty where the stamped kernel (more registers) would not have all G programs resident."""
    p.timed = True
    if not fits(p.compile(w), p, nsm)[0]:
        p.timed = False
        return {}
    for x in xs:
        p(x, w, b, rm, rv, 0.1, 1e-5)
    torch.cuda.synchronize()
    p.timed = False
    t = p.times.double() / 1e3
    t0 = t[:, 0].min()
    return dict(skew=float(t[:, 0].max() - t0), sums=float(t[:, 1].max() - t0),
                sums_median=float((t[:, 1] - t[:, 0]).median()), barrier1=float(t[:, 2].max() - t[:, 1].max()),
                finalise=float(t[:, 3].max() - t[:, 2].max()), y_pass=float(t[:, 4].max() - t[:, 3].min()),
                total=float(t[:, 4].max() - t0))


def plot(path, variants):
    """Per shape: normkit's forward and the eval forward (µs), and each variant's phases stacked (sums, barrier,
    finalise, y pass), from a run's jsonl; written next to it as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in open(path) if "ms" in line]
    cases = list(dict.fromkeys(("x".join(map(str, r["shape"])), r["layout"]) for r in rows))
    val = {(("x".join(map(str, r["shape"])), r["layout"]), r["impl"]): r for r in rows}
    impls = ["nk", "eval"] + variants
    fig, ax = plt.subplots(figsize=(10, 0.6 + 0.32 * len(cases) * len(impls)))
    h = 0.8 / len(impls)
    colors = {"sums": "tab:blue", "barrier1": "tab:gray", "finalise": "tab:orange", "y_pass": "tab:green"}
    for j, impl in enumerate(impls):
        for i, c in enumerate(cases):
            r = val.get((c, impl))
            if r is None:
                continue
            y = i + j * h
            ph = r.get("phases_us") or {}
            if ph:
                left = 0.0
                for k in ("sums", "barrier1", "finalise", "y_pass"):
                    ax.barh(y, ph[k], left=left, height=h, color=colors[k], label=k if (i, j) == (0, 2) else None)
                    left += ph[k]
            else:
                ax.barh(y, r["ms"] * 1e3, height=h, color="tab:red" if impl == "nk" else "tab:purple",
                        label=impl if i == 0 else None)
            ax.text(r["ms"] * 1e3, y, f" {impl} {r['ms'] * 1e3:.0f} µs ({r['sol']:.2f} SOL)", va="center", fontsize=6)
    ax.set_yticks([i + 0.4 - h / 2 for i in range(len(cases))], [f"{s} {l}" for s, l in cases])
    ax.invert_yaxis()
    ax.set_xlabel("µs (graph replay; stacked: the phases of one stamped eager call)")
    ax.set_title("batch norm training forward, bf16, H200: 3 kernels (nk) against one persistent kernel")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    out = os.path.splitext(path)[0] + ".png"
    save_png(fig, out, dpi=110)
    print("wrote", out)


def make_inputs(shape, layout, n_sets):
    xs = []
    for _ in range(n_sets):
        x = torch.randn(shape, device=DEV, dtype=torch.bfloat16) * 2 + 0.5
        if layout == "cl" and x.dim() in (4, 5):
            fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
            x = x.contiguous(memory_format=fmt)
        xs.append(x)
    return xs


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def check(p, x, w, b):
    """The persistent forward against normkit's (y, mean, invstd, running statistics, float64 view)."""
    C = x.shape[1]
    rm1, rv1 = torch.randn(C, device=DEV), torch.rand(C, device=DEV) + 0.5
    rm2, rv2 = rm1.clone(), rv1.clone()
    y1, m1, i1 = B.bn_forward_train(x, w, b, rm1, rv1, 0.1, 1e-5)
    y2, m2, i2 = p(x, w, b, rm2, rv2, 0.1, 1e-5)
    if x.is_cuda:
        torch.cuda.synchronize()
    errs = dict(y=rel(y2, y1), mean=rel(m2, m1), invstd=rel(i2, i1), rm=rel(rm2, rm1), rv=rel(rv2, rv1),
                layout_same=y2.stride() == y1.stride(), flag=int(p.flag.item()), cnt=p.cnt.tolist())
    ok = (errs["y"] < 1e-2 and errs["mean"] < 1e-5 and errs["invstd"] < 1e-5 and errs["rm"] < 1e-5
          and errs["rv"] < 1e-5 and errs["layout_same"] and errs["flag"] == 0 and errs["cnt"] == [0, 0])
    return ok, errs


def fits(k, p, nsm):
    """Whether G programs of compiled kernel k are resident at once (registers, threads, shared memory)."""
    if getattr(k, "n_regs", None) is None:
        k._init_handles()  # (Triton 3.6: registers known once the module is loaded)
    regs = k.n_regs * 32 * p.nw
    smem = k.metadata.shared
    per_sm = min(65536 // max(regs, 1), 2048 // (32 * p.nw), (227 * 1024) // max(smem, 1))
    return p.G <= per_sm * nsm, dict(n_regs=k.n_regs, n_spills=getattr(k, "n_spills", None), shared=smem,
                                     per_sm=per_sm)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plot", default=None, metavar="JSONL", help="plot a run's results instead of running")
    ap.add_argument("--out")
    ap.add_argument("--budget", type=float, default=200.0)
    ap.add_argument("--dry", action="store_true", help="CPU, Triton interpreter, tiny shapes, G = 1")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--shapes", default="", help="indices into SHAPES, comma-separated (default: all)")
    a = ap.parse_args()
    if a.plot:
        return plot(a.plot, [v for v in a.variants.split(",") if v])
    if not a.out:
        ap.error("--out is required to run the probe")
    global SHAPES, DEV
    if a.dry:
        SHAPES = [((6, 8, 3, 5), "cl"), ((4, 8, 3, 5), "nchw"), ((40, 24), "cl"), ((3, 4, 2, 3, 5), "cl")]
        DEV = "cpu"
    if a.shapes:
        SHAPES = [SHAPES[int(i)] for i in a.shapes.split(",")]
    nsm = 1 if a.dry else torch.cuda.get_device_properties(0).multi_processor_count
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "bn_persist_probe.jsonl")
    timer = Timer(DEV)
    t0 = time.time()
    copy_gbps = copy_bandwidth(Context(device=DEV, timer=timer), 1 << 28)
    print(f"copy {copy_gbps:.0f} GB/s, {nsm} SMs", flush=True)
    names = [n for n in a.variants.split(",") if n]
    with open(path, "a") as f:
        for shape, layout in SHAPES:
            if time.time() - t0 > a.budget:
                print("budget reached", flush=True)
                break
            nbytes = 2 * int(torch.Size(shape).numel())
            n_sets = 1 if a.dry else min(8, max(1, -(-4 * 60 * 2 ** 20 // nbytes)))
            xs = make_inputs(shape, layout, n_sets)
            C = shape[1]
            w = torch.rand(C, device=DEV) + 0.5
            b = torch.randn(C, device=DEV)
            rm, rv = torch.zeros(C, device=DEV), torch.ones(C, device=DEV)
            label = f"{'x'.join(map(str, shape))} {layout}"

            def record(name, fns, **extra):
                t_ms, timer_name = timer.time(fns)
                gbps = 2 * nbytes / (t_ms * 1e-3) / 1e9
                row = dict(shape=list(shape), layout=layout, impl=name, ms=t_ms, gbps=gbps, sol=gbps / copy_gbps,
                           copy_gbps=copy_gbps, timer=timer_name, **extra)
                f.write(json.dumps(row) + "\n")
                f.flush()
                print(f"{label:>24} {name:>10} {t_ms * 1e3:8.1f} us {gbps / copy_gbps:5.2f} SOL "
                      f"{ {k: v for k, v in extra.items() if k != 'errs'} or ''}", flush=True)

            record("nk", [lambda x=x: B.bn_forward_train(x, w, b, rm, rv, 0.1, 1e-5) for x in xs])
            record("eval", [lambda x=x: B.bn_forward_eval(x, w, b, rm, rv, 1e-5) for x in xs])
            for name in names:
                try:
                    p = Persist(xs[0], *VARIANTS[name], nsm)
                except ValueError as e:
                    print(f"{label:>24} {name:>10} skipped: {e}", flush=True)
                    continue
                occ = {}
                if not a.dry:
                    try:
                        k = p.compile(w)
                    except Exception as e:  # (a variant the compiler refuses: reported, the others still run)
                        print(f"{label:>24} {name:>10} compile failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
                        continue
                    ok_fit, occ = fits(k, p, nsm)
                    if not ok_fit:
                        print(f"{label:>24} {name:>10} skipped: not resident {occ} G={p.G}", flush=True)
                        continue
                ok, errs = check(p, xs[0], w, b)
                if not ok:
                    print(f"{label:>24} {name:>10} WRONG {errs} {p.cfg()}", flush=True)
                    f.write(json.dumps(dict(shape=list(shape), layout=layout, impl=name, wrong=True, errs=errs,
                                            cfg=p.cfg(), occ=occ)) + "\n")
                    if errs["flag"]:
                        print("barrier gave up: stopping", flush=True)
                        return 1
                    continue
                ph = {} if a.dry else phases(p, xs, w, b, rm, rv, nsm)
                record(name, [lambda x=x, p=p: p(x, w, b, rm, rv, 0.1, 1e-5) for x in xs], cfg=p.cfg(), occ=occ,
                       errs=errs, phases_us={k: round(v, 1) for k, v in ph.items()})
            del xs
            if DEV == "cuda":
                torch.cuda.empty_cache()
    print(f"total {time.time() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
