"""Group norm kernels: statistics over each (n, group) block of C/G·HxW elements, weight and bias per channel.

Every kernel sees the input as an (N, HxW, C) index space with strides (sN, sS, sC), so one kernel serves
both layouts: a contiguous input has sS = 1 (a channel's plane is contiguous), a channels_last(_3d) input
sC = 1 (a position's channels are contiguous). Triton specializes the stride that is 1, so the tile
[BLOCK_S, BLOCK_C] is loaded with vector accesses along whichever axis is contiguous. Outputs keep the
input's layout (its suggested memory format), as `normkit.reference` does.

Forward of a contiguous input whose groups are small enough (`whole_max` padded elements): one launch, a
program per (n, g) holding the group in registers (x read once). Otherwise (3 launches, no atomics,
fixed grids: the same bits on every run):
  1. partials: a program reduces (sample n, a block of whole groups or a slice of one group's channels,
     a range of positions) to per-group (count, mean, M2). Sums run per channel about a per-channel shift
     (the channel's mean over the program's first tile), so channels with different means cost no
     precision; the channels of a group are merged with Chan's formula once per program. channels_last
     inputs with one channel per group (instance norm) shift by the median of three of each channel's
     elements in the range instead (no reduction before the loop) and skip the merge (`_one_channel_cl`).
  2. combine: per (n, g), Chan's merge of the chunk partials in a fixed order; mean, rstd = 1/sqrt(var+eps)
     (fp32, plus the contract's dtype when that is 16-bit).
  3. apply: y = (x - mean) * (rstd * w) + b.
Backward of a contiguous input whose groups are small enough (`bwd_whole_max` padded elements): 2
launches, a program per (n, g) holding its x and dy in registers (dx and the per-(n, c) sums), then
dw / db as in 3. below. Otherwise 4 launches:
  1. partials: per (n, position range, channel): Σ dy and Σ dy·(x - mean).
  2. per (n, g): the per-(n, c) sums over position ranges, and A = Σ w·Σdy, B = Σ w·Σdy(x - mean):
     dx = rstd·w·dy - rstd·A/K - (x - mean)·rstd³·B/K.
  3. per channel: dw = Σ_n rstd·Σdy(x - mean), db = Σ_n Σdy (fixed order over n).
  4. apply dx.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from normkit.kernels import _plan, cdiv, dense_param, layout, next_pow2
from normkit.kernels._launch import alloc, gdc_launch_dependents, gdc_wait, launch, pdl_follow, pdl_on, pdl_trigger
from normkit.kernels._jit import median_of_three
from normkit.reference._common import suggest_memory_format

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_I32_MAX = (1 << 31) - 1

_CFG = {
    # contiguous inputs (a channel's plane contiguous)
    "tile": 4096,             # elements per program step (one [BLOCK_S, BLOCK_C] tile)
    "warps": 8,
    "target_programs": 1024,  # reduction programs per launch (fixed, so the bits do not depend on the GPU)
    "max_block_s": 4096,      # positions per tile at most (below the tile: several channels a tile and program)
    # channels_last inputs (a position's channels contiguous)
    "cl_tile": 4096,
    "cl_warps": 4,            # at 128 channels per tile; 8 below (2026-12-01 sweep: 4 won at C >= 128, lost at 64)
    "cl_max_block_c": 128,    # channels per tile at most (2026-12-01 sweep: 128 beat 256 on 4 of 5 bf16 rows)
    "cl_target_programs": 1024,
    "whole_max": 32768,       # contiguous groups of at most this many (padded) elements: one program each
    "whole_min_groups": 264,  # ... when there are at least this many groups (2 per SM), else the split path
    # backward of contiguous groups of <= this many padded elements in one program (also >= whole_min_groups;
    # 2026-12-01 H200 s8: -15..-38 % on such rows, within 0.5 % elsewhere; 32768 spills in fp32)
    "bwd_whole_max": 16384,
    "combine_rows": 16,       # (n, g) rows per combine program
    "combine_block": 64,      # chunk partials per combine step
    # programmatic dependent launch (sm_90+): each kernel after a call's first is launched while its
    # predecessor runs and waits for it (griddepcontrol) before reading its output. H200 2026-12-01
    # (session 8), 24 rows: forward -1.8 %, backward -1.7 % (geomean; worst +1.0 / +3.0 %)
    "pdl": 1,
    # launch plans (normkit.kernels._plan: a call's launches recorded once per signature, replayed after; the
    # host time of small layers). H200 2026-12-04 (session 26), 16x64x8x8 bf16: gn_forward 159 -> 43 µs a call,
    # F.group_norm forward + backward under enable() 342 -> 167 µs (eager 166)
    "plans": 1,
    # instance norm's channels_last input made contiguous (and its gradient turned back), and the backward's
    # incoming gradient put in x's layout (`_dense`), by normkit.kernels.layout's tile transpose instead of torch's
    # strided copy. H100 2026-12-06 (session 42, benchmarks/tile_transpose_ab.py, now layout_ab.py), forward /
    # forward + backward ms: bf16 16x64x128x128 0.148 / 0.266 -> 0.048 / 0.114 (predicted ~0.055 fwd),
    # fp32 0.182 / 0.330 -> 0.094 / 0.215, bf16 2x32x128^3 3.17 / 4.17 -> 0.47 / 1.09. 0 = torch's copy
    "tile_transpose": 1,
}


# ------------------------------------------------------------------------------------------------ kernels

@triton.jit
def _split_pid(pid, n_s, n_c, CL: tl.constexpr):
    """(n, s block, c block) of a flat program id: consecutive programs cover consecutive memory (channel
    blocks fastest in channels_last, position blocks fastest otherwise)."""
    if CL:
        inner = n_c
    else:
        inner = n_s
    outer_n = pid // (n_s * n_c)
    rest = pid - outer_n * (n_s * n_c)
    o = rest // inner
    i = rest - o * inner
    if CL:
        sb = o
        cb = i
    else:
        sb = i
        cb = o
    return outer_n, sb, cb


@triton.jit
def _offsets(offs_s, offs_c, sS, sC, I64: tl.constexpr):
    if I64:
        return offs_s.to(tl.int64)[:, None] * sS + offs_c.to(tl.int64)[None, :] * sC
    return offs_s[:, None] * sS + offs_c[None, :] * sC


@triton.jit
def _median_of_range(first, lo, hi, sS, mask):
    """``median_of_three`` of the elements at positions lo, (lo + hi - 1) // 2 and hi - 1 (positions lo..hi - 1
    nonempty, stride sS) past the pointers ``first``, fp32 (session 35: instance norm's rstd was 1.5e-4 off with an
    outlier first element)."""
    lo = tl.cast(lo, tl.int64)
    span = tl.cast(hi - 1, tl.int64) - lo
    return median_of_three(first + lo * sS, (span // 2) * sS, span * sS, mask, tl.float32)


@triton.jit
def _fwd_partials_kernel(X, PART, TOT, HW, C, G, Cg, n_sch, n_cb, n_cc, SCH, BC, GB, sN, sS, sC,
                         BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr, GBP: tl.constexpr,
                         SPLIT: tl.constexpr, CL: tl.constexpr, I64: tl.constexpr,
                         SHIFT_ELEM: tl.constexpr = False, CG1: tl.constexpr = False, ALIGN: tl.constexpr = 1,
                         PDL: tl.constexpr = False):
    if PDL:  # the combine may launch once every program has started (it waits for the partials)
        gdc_launch_dependents()
    n, sch, cb = _split_pid(tl.program_id(0), n_sch, n_cb, CL)
    if SPLIT:  # a slice of one group's channels
        g0 = cb // n_cc
        cc = cb - g0 * n_cc
        c_start = g0 * Cg + cc * BC
        c_end = g0 * Cg + Cg
    else:  # GB whole groups
        g0 = cb * GB
        cc = 0
        if ALIGN > 1:  # the same value; as cb * BC Triton sees its divisibility when BC % 16 == 0
            c_start = cb * BC
        else:
            c_start = g0 * Cg
        c_end = tl.minimum(C, c_start + BC)
    if ALIGN > 1:
        # the host proved both multiples of ALIGN: channels_last tiles then load ALIGN-element vectors
        # (as g0 * Cg Triton sees an unknown channel offset and loads element by element)
        c_start = tl.multiple_of(c_start, ALIGN)
        c_end = tl.multiple_of(c_end, ALIGN)
    offs_c = c_start + tl.arange(0, BLOCK_C)
    c_ok = offs_c < c_end
    s_lo = sch * SCH
    s_hi = tl.minimum(HW, s_lo + SCH)
    base = X + n.to(tl.int64) * sN

    if SHIFT_ELEM:
        # each channel's shift is the median of three of its elements in the range (the first, middle and last):
        # no reduction before the loop, so the program goes straight into its loads (channels_last, one channel a
        # group: `_one_channel_cl`), and, unlike the first element alone (session 34: an outlier there left rstd
        # 1.5e-4 off), never a lone outlier
        shift = _median_of_range(base + offs_c.to(tl.int64) * sC, s_lo, s_hi, sS, c_ok)
        s1 = tl.zeros([BLOCK_S, BLOCK_C], tl.float32)
        s2 = tl.zeros([BLOCK_S, BLOCK_C], tl.float32)
        s_next = s_lo
    else:
        # the first tile sets each channel's shift (its mean there); it is summed like every other tile
        offs_s = s_lo + tl.arange(0, BLOCK_S)
        m = (offs_s < s_hi)[:, None] & c_ok[None, :]
        x = tl.load(base + _offsets(offs_s, offs_c, sS, sC, I64), mask=m, other=0.0).to(tl.float32)
        n_first = tl.minimum(s_hi - s_lo, BLOCK_S).to(tl.float32)
        shift = tl.sum(x, 0) / n_first
        d = tl.where(m, x - shift[None, :], 0.0)
        s1 = d
        s2 = d * d
        s_next = s_lo + BLOCK_S
    for s0 in range(s_next, s_hi, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        m = (offs_s < s_hi)[:, None] & c_ok[None, :]
        x = tl.load(base + _offsets(offs_s, offs_c, sS, sC, I64), mask=m, other=0.0).to(tl.float32)
        d = tl.where(m, x - shift[None, :], 0.0)
        s1 += d
        s2 += d * d
    cnt_c = (s_hi - s_lo).to(tl.float32)  # positions per channel
    sum1 = tl.sum(s1, 0)
    m2_c = tl.sum(s2, 0) - sum1 * (sum1 / cnt_c)
    # clamp rounding below 0, but keep a NaN (inf - inf once the fp32 squares overflow): tl.maximum drops it,
    # and var = 0 gave rstd = 1/sqrt(eps) and outputs ~1e22 for |x| ~ 1e20
    m2_c = tl.where(m2_c < 0.0, 0.0, m2_c)

    # channels -> groups (Chan's merge; channels of equal count). Means are kept relative to the group's reference
    # (`_median_of_range` of its first channel: an exact fp32 value every program and the combine read): at an offset
    # of 1000 an absolute fp32 mean carries 3e-5 of rounding, which the merges would turn into variance error.
    if CG1:  # one channel per group (instance norm): the channel statistics are the group's, same values
        g = offs_c
        g_ok = c_ok
        ref_g = _median_of_range(base + offs_c.to(tl.int64) * sC, 0, HW, sS, c_ok)
        cnt_g = tl.where(c_ok, cnt_c, 0.0)
        mean_g = (shift - ref_g) + sum1 / cnt_c
        m2_g = m2_c
    else:
        lg = (offs_c - g0 * Cg) // Cg
        gl = tl.arange(0, GBP)
        g = g0 + gl
        onehot = (lg[None, :] == gl[:, None]) & c_ok[None, :]
        nch = tl.sum(onehot.to(tl.float32), 1)
        g_ok = (nch > 0) & (g < G)
        ref_g = _median_of_range(base + g.to(tl.int64) * Cg * sC, 0, HW, sS, g_ok)
        ref_c = tl.sum(tl.where(onehot, ref_g[:, None], 0.0), 0)
        mean_c = (shift - ref_c) + sum1 / cnt_c
        cnt_g = nch * cnt_c
        mean_g = tl.sum(tl.where(onehot, mean_c[None, :], 0.0), 1) / tl.maximum(nch, 1.0)
        dev = mean_c[None, :] - mean_g[:, None]
        m2_g = tl.sum(tl.where(onehot, m2_c[None, :] + cnt_c * dev * dev, 0.0), 1)

    idx = ((n * G + g) * n_cc + cc) * n_sch + sch
    tl.store(PART + idx, cnt_g, mask=g_ok)
    tl.store(PART + TOT + idx, mean_g, mask=g_ok)
    tl.store(PART + 2 * TOT + idx, m2_g, mask=g_ok)


@triton.jit
def _round_to(v, DT: tl.constexpr):
    """fp32 -> DT rounded to nearest even. For bf16 done on the bits: Triton's interpreter (CPU CI)
    truncates fp32 -> bf16 casts, and a saved bf16 mean 1 ulp off (4.0 at 1000) ruins the backward."""
    if DT == tl.bfloat16:
        bits = v.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        # a NaN stays NaN: the rounding carry turns NaNs with low mantissa bits (the GPU's canonical 0x7FFFFFFF)
        # into -0.0, 0.0 or inf
        bits = tl.where(v != v, 0x7FC00000, bits)
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return v.to(DT)


@triton.jit
def _chunk_partials(PART, TOT, rows, r_ok, k0, NCH, BLOCK_K: tl.constexpr, WITH_M2: tl.constexpr):
    """(count, mean, M2 or 0) of chunks k0 .. k0 + BLOCK_K of each row: [BLOCK_R, BLOCK_K] each."""
    ks = k0 + tl.arange(0, BLOCK_K)
    m = r_ok[:, None] & (ks < NCH)[None, :]
    idx = rows[:, None] * NCH + ks[None, :]
    ci = tl.load(PART + idx, mask=m, other=0.0)
    mi = tl.load(PART + TOT + idx, mask=m, other=0.0)
    qi = tl.zeros_like(ci)
    if WITH_M2:
        qi = tl.load(PART + 2 * TOT + idx, mask=m, other=0.0)
    return ci, mi, qi


@triton.jit
def _fwd_combine_kernel(PART, TOT, X, MEAN32, RSTD32, MEAN_OUT, RSTD_OUT, R, NCH, G, Cg, HW, sN, sS, sC, eps,
                        BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, WRITE_OUT: tl.constexpr,
                        PDL: tl.constexpr = False):
    if PDL:
        gdc_launch_dependents()
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = rows < R
    n = rows // G
    ref = _median_of_range(X + n.to(tl.int64) * sN + (rows - n * G).to(tl.int64) * Cg * sC, 0, HW, sS, r_ok)
    if PDL:  # x is the call's input; the partials are the previous kernel's output
        gdc_wait()
    cnt = tl.zeros([BLOCK_R], tl.float32)
    tot = tl.zeros([BLOCK_R], tl.float32)
    for k0 in range(0, NCH, BLOCK_K):
        ci, mi, _ = _chunk_partials(PART, TOT, rows, r_ok, k0, NCH, BLOCK_K, False)
        cnt += tl.sum(ci, 1)
        tot += tl.sum(ci * mi, 1)
    mean = tot / tl.maximum(cnt, 1.0)
    m2 = tl.zeros([BLOCK_R], tl.float32)
    for k0 in range(0, NCH, BLOCK_K):
        ci, mi, qi = _chunk_partials(PART, TOT, rows, r_ok, k0, NCH, BLOCK_K, True)
        dm = mi - mean[:, None]
        m2 += tl.sum(qi + ci * dm * dm, 1)
    rstd = 1.0 / tl.sqrt_rn(m2 / tl.maximum(cnt, 1.0) + eps)
    mean = ref.to(tl.float32) + mean
    tl.store(MEAN32 + rows, mean, mask=r_ok)
    tl.store(RSTD32 + rows, rstd, mask=r_ok)
    if WRITE_OUT:  # the contract's 16-bit statistics (the output itself uses the fp32 ones)
        tl.store(MEAN_OUT + rows, _round_to(mean, MEAN_OUT.dtype.element_ty), mask=r_ok)
        tl.store(RSTD_OUT + rows, _round_to(rstd, RSTD_OUT.dtype.element_ty), mask=r_ok)


@triton.jit
def _fwd_apply_kernel(X, Y, W, B, MEAN32, RSTD32, HW, C, G, Cg, n_sb, n_cb, sN, sS, sC,
                      HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
                      CL: tl.constexpr, I64: tl.constexpr, PDL: tl.constexpr = False):
    n, sb, cb = _split_pid(tl.program_id(0), n_sb, n_cb, CL)
    offs_c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = offs_c < C
    stat = n * G + offs_c // Cg
    offs_s = sb * BLOCK_S + tl.arange(0, BLOCK_S)
    m = (offs_s < HW)[:, None] & c_ok[None, :]
    off = n.to(tl.int64) * sN + _offsets(offs_s, offs_c, sS, sC, I64)
    if PDL:  # launched while the combine runs: the x tile first, the statistics after the wait
        x = tl.load(X + off, mask=m, other=0.0).to(tl.float32)
        gdc_wait()
    mean = tl.load(MEAN32 + stat, mask=c_ok, other=0.0)
    a = tl.load(RSTD32 + stat, mask=c_ok, other=0.0)
    if HAS_W:
        a = a * tl.load(W + offs_c, mask=c_ok, other=0.0).to(tl.float32)
    if not PDL:
        x = tl.load(X + off, mask=m, other=0.0).to(tl.float32)
    y = (x - mean[None, :]) * a[None, :]
    if HAS_B:
        y += tl.load(B + offs_c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + off, y.to(Y.dtype.element_ty), mask=m)


@triton.jit
def _fwd_whole_kernel(X, Y, W, B, MEAN_OUT, RSTD_OUT, HW, Cg, G, eps,
                      HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK_CG: tl.constexpr, BLOCK_S: tl.constexpr):
    """Contiguous input, one program per (n, g) holding the whole group in registers: x is read once
    (2 passes over memory instead of 3). Mean about the group's first element, variance two-pass."""
    r = tl.program_id(0)
    K = Cg * HW
    base = r.to(tl.int64) * K
    cs = tl.arange(0, BLOCK_CG)
    ss = tl.arange(0, BLOCK_S)
    m = (cs < Cg)[:, None] & (ss < HW)[None, :]
    off = base + cs[:, None] * HW + ss[None, :]
    x = tl.load(X + off, mask=m, other=0.0).to(tl.float32)
    ref = tl.load(X + base).to(tl.float32)
    d = tl.where(m, x - ref, 0.0)
    mean_d = tl.sum(tl.sum(d, 1), 0) / K
    d = tl.where(m, d - mean_d, 0.0)
    rstd = 1.0 / tl.sqrt_rn(tl.sum(tl.sum(d * d, 1), 0) / K + eps)
    tl.store(MEAN_OUT + r, _round_to(ref + mean_d, MEAN_OUT.dtype.element_ty))
    tl.store(RSTD_OUT + r, _round_to(rstd, RSTD_OUT.dtype.element_ty))
    c = (r % G) * Cg + cs
    a = tl.full([BLOCK_CG], 1.0, tl.float32) * rstd
    if HAS_W:
        a = a * tl.load(W + c, mask=cs < Cg, other=0.0).to(tl.float32)
    y = d * a[:, None]
    if HAS_B:
        y += tl.load(B + c, mask=cs < Cg, other=0.0).to(tl.float32)[:, None]
    tl.store(Y + off, y.to(Y.dtype.element_ty), mask=m)


@triton.jit
def _bwd_whole_kernel(DY, X, DX, W, MEAN, RSTD, RB, N, C, HW, Cg, G,
                      HAS_W: tl.constexpr, BLOCK_CG: tl.constexpr, BLOCK_S: tl.constexpr,
                      PDL: tl.constexpr = False):
    """Contiguous input, one program per (n, g) holding the group's x and dy in registers: dx, and the
    per-(n, c) sums RB[n, c] = (Σdy, Σdy(x - mean)) for dw / db (x and dy read once: 3 passes, not 5)."""
    if PDL:
        gdc_launch_dependents()
    r = tl.program_id(0)
    n = r // G
    g = r - n * G
    K = Cg * HW
    base = r.to(tl.int64) * K
    cs = tl.arange(0, BLOCK_CG)
    ss = tl.arange(0, BLOCK_S)
    c_ok = cs < Cg
    m = c_ok[:, None] & (ss < HW)[None, :]
    off = base + cs[:, None] * HW + ss[None, :]
    x = tl.load(X + off, mask=m, other=0.0).to(tl.float32)
    dy = tl.load(DY + off, mask=m, other=0.0).to(tl.float32)
    mean = tl.load(MEAN + r).to(tl.float32)
    rstd = tl.load(RSTD + r).to(tl.float32)
    xc = tl.where(m, x - mean, 0.0)
    sdy = tl.sum(dy, 1)
    sdyx = tl.sum(dy * xc, 1)
    c = g * Cg + cs
    tl.store(RB + n * C + c, sdy, mask=c_ok)
    tl.store(RB + N * C + n * C + c, sdyx, mask=c_ok)
    if HAS_W:
        w = tl.load(W + c, mask=c_ok, other=0.0).to(tl.float32)
    else:
        w = tl.where(c_ok, 1.0, 0.0)
    p = tl.sum(w * sdyx, 0) / K * rstd * rstd * rstd  # the sum first: rstd**3 alone overflows fp32 past rstd 7e12
    q = rstd * tl.sum(w * sdy, 0) / K
    dx = (rstd * w)[:, None] * dy - xc * p - q
    tl.store(DX + off, dx.to(DX.dtype.element_ty), mask=m)


@triton.jit
def _bwd_partials_kernel(DY, X, MEAN, PB, TOT, HW, C, G, Cg, n_sch, n_cb, SCH, sN, sS, sC,
                         BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr, CL: tl.constexpr, I64: tl.constexpr,
                         PDL: tl.constexpr = False):
    if PDL:
        gdc_launch_dependents()
    n, sch, cb = _split_pid(tl.program_id(0), n_sch, n_cb, CL)
    offs_c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = offs_c < C
    mean = tl.load(MEAN + n * G + offs_c // Cg, mask=c_ok, other=0.0).to(tl.float32)
    s_lo = sch * SCH
    s_hi = tl.minimum(HW, s_lo + SCH)
    base = n.to(tl.int64) * sN
    acc_dy = tl.zeros([BLOCK_S, BLOCK_C], tl.float32)
    acc_dyx = tl.zeros([BLOCK_S, BLOCK_C], tl.float32)
    for s0 in range(s_lo, s_hi, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        m = (offs_s < s_hi)[:, None] & c_ok[None, :]
        off = base + _offsets(offs_s, offs_c, sS, sC, I64)
        dy = tl.load(DY + off, mask=m, other=0.0).to(tl.float32)
        x = tl.load(X + off, mask=m, other=0.0).to(tl.float32)
        acc_dy += dy
        acc_dyx += dy * tl.where(m, x - mean[None, :], 0.0)
    out = (n * n_sch + sch) * C + offs_c
    tl.store(PB + out, tl.sum(acc_dy, 0), mask=c_ok)
    tl.store(PB + TOT + out, tl.sum(acc_dyx, 0), mask=c_ok)


@triton.jit
def _bwd_group_kernel(PB, TOT, W, RSTD, PQ, RB, R, N, G, Cg, C, n_sch, K,
                      HAS_W: tl.constexpr, BLOCK_SCH: tl.constexpr, BLOCK_CG: tl.constexpr,
                      PDL: tl.constexpr = False):
    """Per (n, g): the channel sums over the position ranges, RB[n, c] = (Σdy, Σdy(x-mean)), and
    P = rstd³·Σw·Σdy(x-mean)/K, Q = rstd·Σw·Σdy/K (dx = rstd·w·dy - Q - (x-mean)·P)."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    r = tl.program_id(0)
    n = r // G
    g = r - n * G
    a = tl.zeros([BLOCK_CG], tl.float32)
    b = tl.zeros([BLOCK_CG], tl.float32)
    for c0 in range(0, Cg, BLOCK_CG):
        cs = g * Cg + c0 + tl.arange(0, BLOCK_CG)
        c_ok = (c0 + tl.arange(0, BLOCK_CG)) < Cg
        sdy = tl.zeros([BLOCK_SCH, BLOCK_CG], tl.float32)
        sdyx = tl.zeros([BLOCK_SCH, BLOCK_CG], tl.float32)
        for s0 in range(0, n_sch, BLOCK_SCH):
            ss = s0 + tl.arange(0, BLOCK_SCH)
            m = (ss < n_sch)[:, None] & c_ok[None, :]
            idx = (n * n_sch + ss)[:, None] * C + cs[None, :]
            sdy += tl.load(PB + idx, mask=m, other=0.0)
            sdyx += tl.load(PB + TOT + idx, mask=m, other=0.0)
        cdy = tl.sum(sdy, 0)
        cdyx = tl.sum(sdyx, 0)
        tl.store(RB + n * C + cs, cdy, mask=c_ok)
        tl.store(RB + N * C + n * C + cs, cdyx, mask=c_ok)
        if HAS_W:
            w = tl.load(W + cs, mask=c_ok, other=0.0).to(tl.float32)
            a += cdy * w
            b += cdyx * w
        else:
            a += cdy
            b += cdyx
    rstd = tl.load(RSTD + r).to(tl.float32)
    tl.store(PQ + r, tl.sum(b, 0) / K * rstd * rstd * rstd)  # (the sum first, as in _bwd_whole_kernel)
    tl.store(PQ + R + r, rstd * tl.sum(a, 0) / K)


@triton.jit
def _bwd_params_kernel(RB, RSTD, DW, DB, N, C, G, Cg,
                       NEED_DW: tl.constexpr, NEED_DB: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
                       PDL: tl.constexpr = False):
    """dw[c] = Σ_n rstd[n, g(c)]·Σdy(x-mean), db[c] = Σ_n Σdy, in a fixed order over n."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    offs_c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = offs_c < C
    gc = offs_c // Cg
    acc_w = tl.zeros([BLOCK_N, BLOCK_C], tl.float32)
    acc_b = tl.zeros([BLOCK_N, BLOCK_C], tl.float32)
    for n0 in range(0, N, BLOCK_N):
        ns = n0 + tl.arange(0, BLOCK_N)
        m = (ns < N)[:, None] & c_ok[None, :]
        idx = ns[:, None] * C + offs_c[None, :]
        if NEED_DW:
            rstd = tl.load(RSTD + ns[:, None] * G + gc[None, :], mask=m, other=0.0).to(tl.float32)
            acc_w += tl.load(RB + N * C + idx, mask=m, other=0.0) * rstd
        if NEED_DB:
            acc_b += tl.load(RB + idx, mask=m, other=0.0)
    if NEED_DW:
        tl.store(DW + offs_c, tl.sum(acc_w, 0).to(DW.dtype.element_ty), mask=c_ok)
    if NEED_DB:
        tl.store(DB + offs_c, tl.sum(acc_b, 0).to(DB.dtype.element_ty), mask=c_ok)


@triton.jit
def _bwd_apply_kernel(DY, X, DX, W, MEAN, RSTD, PQ, R, HW, C, G, Cg, n_sb, n_cb, sN, sS, sC,
                      HAS_W: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
                      CL: tl.constexpr, I64: tl.constexpr, PDL: tl.constexpr = False):
    n, sb, cb = _split_pid(tl.program_id(0), n_sb, n_cb, CL)
    offs_c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = offs_c < C
    stat = n * G + offs_c // Cg
    mean = tl.load(MEAN + stat, mask=c_ok, other=0.0).to(tl.float32)
    alpha = tl.load(RSTD + stat, mask=c_ok, other=0.0).to(tl.float32)
    if HAS_W:
        alpha = alpha * tl.load(W + offs_c, mask=c_ok, other=0.0).to(tl.float32)
    offs_s = sb * BLOCK_S + tl.arange(0, BLOCK_S)
    m = (offs_s < HW)[:, None] & c_ok[None, :]
    off = n.to(tl.int64) * sN + _offsets(offs_s, offs_c, sS, sC, I64)
    if PDL:  # launched while the previous kernel runs: only P, Q are its output
        dy = tl.load(DY + off, mask=m, other=0.0).to(tl.float32)
        x = tl.load(X + off, mask=m, other=0.0).to(tl.float32)
        gdc_wait()
    p = tl.load(PQ + stat, mask=c_ok, other=0.0)
    q = tl.load(PQ + R + stat, mask=c_ok, other=0.0)
    if not PDL:
        dy = tl.load(DY + off, mask=m, other=0.0).to(tl.float32)
        x = tl.load(X + off, mask=m, other=0.0).to(tl.float32)
    dx = alpha[None, :] * dy - (x - mean[None, :]) * p[None, :] - q[None, :]
    tl.store(DX + off, dx.to(DX.dtype.element_ty), mask=m)


# ------------------------------------------------------------------------------------------------ host side

def supports(x, *params) -> bool:
    """Whether these kernels handle this input: fp16/bf16/fp32 with at least one element, on CUDA (or on CPU
    under TRITON_INTERPRET=1); weight/bias (None allowed) 1-D of C elements, in the input dtype or fp32."""
    from normkit.kernels import runs_kernels_on

    if not isinstance(x, torch.Tensor) or x.dim() < 2 or x.dtype not in _DTYPES or x.numel() == 0:
        return False
    if not runs_kernels_on(x):
        return False
    for p in params:
        if p is None:
            continue
        if p.device != x.device or p.dtype not in (x.dtype, torch.float32) or p.dim() != 1 or p.numel() != x.shape[1]:
            return False
    return True


def memory_format(x: torch.Tensor):
    """The layout group norm's output and grad_input keep: the input's suggested memory format (C++
    ``suggest_memory_format``, which also calls a strided view with channels-last stride order channels_last)."""
    return suggest_memory_format(x)


def _dense(t: torch.Tensor, fmt) -> torch.Tensor:
    """``t`` dense in ``fmt``; between contiguous and channels_last through the tile transpose (knob on), where
    torch's strided copy runs at a fraction of copy speed (a channels_last gradient of a contiguous input)."""
    return layout.in_format(t, fmt, bool(_CFG["tile_transpose"]))


class _Geometry:
    """The (N, HxW, C) view of a dense tensor in layout ``fmt`` and the tile shape for it."""

    def __init__(self, x: torch.Tensor, fmt, G: int):
        N, C = x.shape[0], x.shape[1]
        HW = x.numel() // (N * C)
        self.N, self.C, self.HW, self.G, self.Cg = N, C, HW, G, C // G
        # channels_last (or HxW = 1: a (N, C) matrix) -> channels contiguous; otherwise planes contiguous
        self.cl = fmt != torch.contiguous_format or HW == 1
        if self.cl:
            self.sN, self.sS, self.sC = HW * C, C, 1
        else:
            self.sN, self.sS, self.sC = C * HW, 1, HW
        self.i64 = C * HW > _I32_MAX
        pre = "cl_" if self.cl else ""
        tile = _CFG[pre + "tile"]
        self.warps = _CFG[pre + "warps"]
        self.target_programs = _CFG[pre + "target_programs"]
        if self.cl:
            self.block_c = min(next_pow2(C), _CFG["cl_max_block_c"])
            self.block_s = max(1, min(tile // self.block_c, next_pow2(HW)))
            if self.block_c < 128:
                self.warps = 8
        else:
            self.block_s = min(next_pow2(HW), tile, _CFG["max_block_s"])
            self.block_c = max(1, min(tile // self.block_s, next_pow2(C)))

    def chunks(self, programs_per_position_range: int):
        """Position ranges (count, length) so that a reduction launch has ~target_programs programs."""
        want = cdiv(self.target_programs, max(1, programs_per_position_range))
        n = max(1, min(want, cdiv(self.HW, self.block_s)))
        length = cdiv(cdiv(self.HW, n), self.block_s) * self.block_s
        return cdiv(self.HW, length), length


def _group_blocks(geo: _Geometry):
    """Channel blocks of the forward statistics: whole groups (GB per block) or slices of one group."""
    Cg, block_c = geo.Cg, geo.block_c
    if Cg >= block_c:
        n_cc = cdiv(Cg, block_c)
        return dict(SPLIT=True, BC=block_c, GB=1, GBP=1, n_cc=n_cc, n_cb=geo.G * n_cc, BLOCK_C=block_c)
    gb = min(geo.G, block_c // Cg)
    return dict(SPLIT=False, BC=gb * Cg, GB=gb, GBP=next_pow2(gb), n_cc=1, n_cb=cdiv(geo.G, gb),
                BLOCK_C=next_pow2(gb * Cg))


def _whole_group_warps(geo: _Geometry, max_elems: int) -> int:
    """Warps of the one-program-per-group kernels for this input, or 0 where they do not apply: contiguous
    planes, groups of at most ``max_elems`` padded elements, and enough groups to fill the GPU."""
    padded = next_pow2(geo.Cg) * next_pow2(geo.HW)
    if geo.cl or padded > max_elems or geo.N * geo.G < _CFG["whole_min_groups"]:
        return 0
    return 16 if padded >= 16384 else 8 if padded >= 4096 else 4


def _pow2_factor(v: int, cap: int = 16) -> int:
    """The largest power of two dividing v, at most cap."""
    f = 1
    while f < cap and v % (2 * f) == 0:
        f *= 2
    return f


def _partials_align(geo: _Geometry, blk: dict) -> int:
    """A power of two that divides every channel-block start and end of the forward partials (1: no
    hint). Only channels_last needs it (its channels are the contiguous axis), and only where Triton
    already knows the row stride C is a multiple of 16."""
    if not (geo.cl and geo.C % 16 == 0):
        return 1
    if blk["SPLIT"]:  # starts g * Cg + cc * BLOCK_C, ends g * Cg + Cg
        return min(_pow2_factor(geo.Cg), blk["BLOCK_C"])
    return _pow2_factor(blk["BC"])  # starts cb * BC, ends min(C, start + BC)


def _one_channel_cl(geo: _Geometry, blk: dict) -> bool:
    """Whether the forward partials shift by a median of three of each channel's elements, skip the channel ->
    group merge and take the alignment hint: channels_last (channels contiguous) with one channel per group only."""
    # 2026-12-01 H200 (s8, clalignall): 16x64x128x128 g64 NHWC fwd bf16 -30 %, fp32 -17 %; +14..34 % bf16 at Cg 4..40
    return geo.cl and geo.Cg == 1 and blk["GBP"] == blk["BLOCK_C"]


def _plans_on(x) -> bool:
    return bool(_CFG["plans"]) and _plan.enabled() and x.is_cuda


def gn_forward(x: torch.Tensor, weight, bias, G: int, eps: float, stat_dtype: torch.dtype):
    """`native_group_norm` on the kernels: (y in x's suggested layout, mean (N, G), rstd (N, G))."""
    if _plans_on(x):
        return _plan.planned(_forward_key(G, eps, stat_dtype), (x, weight, bias),
                             lambda: _forward(x, weight, bias, G, eps, stat_dtype))
    return _forward(x, weight, bias, G, eps, stat_dtype)


def _forward_key(G, eps, stat_dtype):
    return ("gn_forward", G, float(eps), stat_dtype, tuple(_CFG.values()))


def _backward_key(G, mask, param_dtype):
    return ("gn_backward", G, mask, param_dtype, tuple(_CFG.values()))


# Replays without a launcher call behind them, for normkit.ops' fast routes (as batch norm's): ``sig`` is
# ``_plan.signature`` of the same inputs; the plan an earlier call recorded, or None where there is none

def gn_forward_replay(x, weight, bias, G, eps, stat_dtype, sig):
    return _plan.replay_only(_forward_key(G, eps, stat_dtype), (x, weight, bias), sig)


def gn_forward_planned(G, eps, stat_dtype, sig) -> bool:
    return _plan.recorded(_forward_key(G, eps, stat_dtype), sig)


def gn_backward_replay(dy, x, mean, rstd, weight, G, mask, param_dtype, sig):
    return _plan.replay_only(_backward_key(G, mask, param_dtype), (dy, x, mean, rstd, weight), sig)


def gn_backward_planned(G, mask, param_dtype, sig) -> bool:
    return _plan.recorded(_backward_key(G, mask, param_dtype), sig)


def _forward(x, weight, bias, G, eps, stat_dtype):
    """``gn_forward``'s work, without a plan (what a plan records: every new tensor through ``alloc``)."""
    fmt = memory_format(x)
    x = _dense(x, fmt)
    weight, bias = dense_param(weight), dense_param(bias)
    geo = _Geometry(x, fmt, G)
    N, C, HW = geo.N, geo.C, geo.HW
    dev = x.device
    whole_warps = _whole_group_warps(geo, _CFG["whole_max"])
    if whole_warps:
        y = alloc(torch.empty_like(x))
        mean = alloc(torch.empty((N, G), dtype=stat_dtype, device=dev))
        rstd = alloc(torch.empty((N, G), dtype=stat_dtype, device=dev))
        launch(_fwd_whole_kernel, (N * G,), x, y, _arg(weight, x), _arg(bias, x), mean, rstd, HW, geo.Cg, G,
               float(eps), HAS_W=weight is not None, HAS_B=bias is not None, BLOCK_CG=next_pow2(geo.Cg),
               BLOCK_S=next_pow2(HW), num_warps=whole_warps)
        return y, mean, rstd
    blk = _group_blocks(geo)
    n_sch, sch = geo.chunks(N * blk["n_cb"])
    nch = blk["n_cc"] * n_sch
    R = N * G
    tot = R * nch
    part = alloc(torch.empty(3 * tot, dtype=torch.float32, device=dev))
    warps = geo.warps
    one = _one_channel_cl(geo, blk)
    pdl = pdl_on(x, _CFG["pdl"])
    launch(_fwd_partials_kernel, (N * n_sch * blk["n_cb"],), x, part, tot, HW, C, G, geo.Cg, n_sch, blk["n_cb"],
           blk["n_cc"], sch, blk["BC"], blk["GB"], geo.sN, geo.sS, geo.sC,
           BLOCK_S=geo.block_s, BLOCK_C=blk["BLOCK_C"], GBP=blk["GBP"], SPLIT=blk["SPLIT"], CL=geo.cl,
           I64=geo.i64, SHIFT_ELEM=one, CG1=one, ALIGN=_partials_align(geo, blk) if one else 1,
           num_warps=warps, **pdl_trigger(pdl))

    mean32 = alloc(torch.empty((N, G), dtype=torch.float32, device=dev))
    rstd32 = alloc(torch.empty((N, G), dtype=torch.float32, device=dev))
    low = stat_dtype != torch.float32
    mean = alloc(torch.empty((N, G), dtype=stat_dtype, device=dev)) if low else mean32
    rstd = alloc(torch.empty((N, G), dtype=stat_dtype, device=dev)) if low else rstd32
    rows = _CFG["combine_rows"]
    launch(_fwd_combine_kernel, (cdiv(R, rows),), part, tot, x, mean32, rstd32, mean, rstd, R, nch, G, geo.Cg,
           HW, geo.sN, geo.sS, geo.sC, float(eps),
           BLOCK_R=rows, BLOCK_K=min(_CFG["combine_block"], next_pow2(nch)), WRITE_OUT=low, num_warps=4,
           **pdl_follow(pdl))

    y = alloc(torch.empty_like(x))
    n_sb, n_cb = cdiv(HW, geo.block_s), cdiv(C, geo.block_c)
    launch(_fwd_apply_kernel, (N * n_sb * n_cb,), x, y, _arg(weight, x), _arg(bias, x), mean32, rstd32,
           HW, C, G, geo.Cg, n_sb, n_cb, geo.sN, geo.sS, geo.sC, HAS_W=weight is not None,
           HAS_B=bias is not None, BLOCK_S=geo.block_s, BLOCK_C=geo.block_c, CL=geo.cl, I64=geo.i64,
           num_warps=warps, **pdl_follow(pdl))
    return y, mean, rstd


def _arg(p, x):
    """A pointer argument for an absent parameter (never read: HAS_W / HAS_B are constexpr False)."""
    return x if p is None else p


def _param_grads(rb, rstd, N, C, G, Cg, need_dw, need_db, param_dtype, dev, pdl):
    """dw, db (None where not asked for) from the per-(n, c) sums RB; pdl: launched with programmatic
    dependent launch after the kernel that wrote RB."""
    if not (need_dw or need_db):
        return None, None
    dw = alloc(torch.empty(C, dtype=param_dtype, device=dev)) if need_dw else None
    db = alloc(torch.empty(C, dtype=param_dtype, device=dev)) if need_db else None
    block_c = min(next_pow2(C), 64)
    launch(_bwd_params_kernel, (cdiv(C, block_c),), rb, rstd, _arg(dw, rb), _arg(db, rb), N, C, G, Cg,
           NEED_DW=need_dw, NEED_DB=need_db, BLOCK_N=max(1, min(16, next_pow2(N))), BLOCK_C=block_c, num_warps=4,
           **pdl_follow(pdl))
    return dw, db


def gn_backward(dy: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor, weight, G: int,
                output_mask, param_dtype: torch.dtype):
    """`native_group_norm_backward` on the kernels: (dx in x's suggested layout, dw, db); masked -> None."""
    mask = tuple(bool(m) for m in output_mask)
    if _plans_on(x):
        return _plan.planned(_backward_key(G, mask, param_dtype), (dy, x, mean, rstd, weight),
                             lambda: _backward(dy, x, mean, rstd, weight, G, mask, param_dtype))
    return _backward(dy, x, mean, rstd, weight, G, mask, param_dtype)


def _backward(dy, x, mean, rstd, weight, G, output_mask, param_dtype):
    """``gn_backward``'s work, without a plan."""
    need_dx, need_dw, need_db = (bool(m) for m in output_mask)
    fmt = memory_format(x)
    x = _dense(x, fmt)
    dy = _dense(dy, fmt)  # the kernels index dy with x's (N, HxW, C) strides
    weight = dense_param(weight)
    geo = _Geometry(x, fmt, G)
    N, C, HW = geo.N, geo.C, geo.HW
    dev = x.device
    mean = mean.reshape(N, G).contiguous()
    rstd = rstd.reshape(N, G).contiguous()
    whole_warps = _whole_group_warps(geo, _CFG["bwd_whole_max"]) if need_dx else 0
    pdl = pdl_on(x, _CFG["pdl"])
    if whole_warps:
        rb = alloc(torch.empty(2 * N * C, dtype=torch.float32, device=dev))
        dx = alloc(torch.empty_like(x))
        launch(_bwd_whole_kernel, (N * G,), dy, x, dx, _arg(weight, x), mean, rstd, rb, N, C, HW, geo.Cg, G,
               HAS_W=weight is not None, BLOCK_CG=next_pow2(geo.Cg), BLOCK_S=next_pow2(HW), num_warps=whole_warps,
               **pdl_trigger(pdl))
        dw, db = _param_grads(rb, rstd, N, C, G, geo.Cg, need_dw, need_db, param_dtype, dev, pdl)
        return dx, dw, db
    n_cb = cdiv(C, geo.block_c)
    n_sch, sch = geo.chunks(N * n_cb)
    tot = N * n_sch * C
    pb = alloc(torch.empty(2 * tot, dtype=torch.float32, device=dev))
    warps = geo.warps
    launch(_bwd_partials_kernel, (N * n_sch * n_cb,), dy, x, mean, pb, tot, HW, C, G, geo.Cg, n_sch, n_cb, sch,
           geo.sN, geo.sS, geo.sC, BLOCK_S=geo.block_s, BLOCK_C=geo.block_c, CL=geo.cl, I64=geo.i64,
           num_warps=warps, **pdl_trigger(pdl))

    R = N * G
    pq = alloc(torch.empty(2 * R, dtype=torch.float32, device=dev))
    rb = alloc(torch.empty(2 * N * C, dtype=torch.float32, device=dev))
    block_cg = min(next_pow2(geo.Cg), 64)
    block_sch = max(1, min(next_pow2(n_sch), 2048 // block_cg))
    launch(_bwd_group_kernel, (R,), pb, tot, _arg(weight, pb), rstd, pq, rb, R, N, G, geo.Cg, C, n_sch,
           float(geo.Cg * HW), HAS_W=weight is not None, BLOCK_SCH=block_sch, BLOCK_CG=block_cg, num_warps=4,
           **pdl_follow(pdl))
    dx = None
    dw, db = _param_grads(rb, rstd, N, C, G, geo.Cg, need_dw, need_db, param_dtype, dev, pdl)
    if need_dx:
        dx = alloc(torch.empty_like(x))
        n_sb = cdiv(HW, geo.block_s)
        launch(_bwd_apply_kernel, (N * n_sb * n_cb,), dy, x, dx, _arg(weight, x), mean, rstd, pq, R, HW, C, G,
               geo.Cg, n_sb, n_cb, geo.sN, geo.sS, geo.sC, HAS_W=weight is not None, BLOCK_S=geo.block_s,
               BLOCK_C=geo.block_c, CL=geo.cl, I64=geo.i64, num_warps=warps, **pdl_follow(pdl))
    return dx, dw, db
