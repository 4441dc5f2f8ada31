"""Batch norm's split reductions (per-(program, channel) partial sums of x, or of dy and dy * (x - mean)) and the
combine kernels that turn the partials into statistics, coefficients and weight / bias gradients."""

import triton
import triton.language as tl

from normkit.kernels._jit import known_multiple, load_three, median3, median_of_three
from normkit.kernels._launch import gdc_launch_dependents, gdc_wait


@triton.jit
def _bn_load_raw(x_ptr, g_ptr, offs, mask, BWD: tl.constexpr):
    # x (and g) in the input dtype, converted where summed: a prefetched step then holds half the
    # registers of fp32 for 16-bit inputs
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if BWD:
        g = tl.load(g_ptr + offs, mask=mask, other=0.0)
    else:
        g = x
    return x, g


@triton.jit
def _bn_acc_loaded(acc1, acc2, x, g, mask, ref, BWD: tl.constexpr):
    if BWD:
        acc1 += g
        acc2 += g * (x - ref)
    else:
        d = tl.where(mask, x - ref, 0.0)
        acc1 += d
        acc2 += d * d
    return acc1, acc2


@triton.jit
def _bn_accumulate(acc1, acc2, x_ptr, g_ptr, offs, mask, ref, BWD: tl.constexpr, ACC: tl.constexpr):
    x, g = _bn_load_raw(x_ptr, g_ptr, offs, mask, BWD)
    return _bn_acc_loaded(acc1, acc2, x.to(ACC), g.to(ACC), mask, ref, BWD)


@triton.jit
def _bn_shift(x_ptr, ch, cmask, CS, o_mid, o_last, ACC: tl.constexpr):
    """The forward's shift of channels ch, the same value in every program, the combine and the one-launch kernel:
    the median of three of each channel's elements, its first at x_ptr + ch * CS and the others o_mid and o_last
    past it (``_shift_samples``). Sums about a lone outlier lose the digits its distance puts at stake (session 34:
    invstd 3e-3 off with an outlier first element); the median of three is never one. The reductions load the
    three before their first step's loads and take the median after those are out (session 13: a shift formed
    before the loop's loads cost the forward 3-13 %)."""
    return median_of_three(x_ptr + ch.to(tl.int64) * CS, o_mid, o_last, cmask, ACC)


@triton.jit
def _bn_rows_masks(p, i, P, M, rr, cmask, BM: tl.constexpr, UNROLL: tl.constexpr):
    """Offsets' rows and masks of loop step i of the rows reduction: row chunks p + (UNROLL*i + j)*P,
    j < UNROLL (a step past the last one is masked off entirely). Unused entries repeat the first."""
    chunk = (p + (UNROLL * i) * P).to(tl.int64)
    rows0 = chunk * BM + rr
    rows1 = rows0 + P * BM
    m0 = (rows0 < M)[:, None] & cmask[None, :]
    m1 = (rows1 < M)[:, None] & cmask[None, :]
    if UNROLL == 4:
        rows2 = rows1 + P * BM
        rows3 = rows2 + P * BM
        m2 = (rows2 < M)[:, None] & cmask[None, :]
        m3 = (rows3 < M)[:, None] & cmask[None, :]
    else:
        rows2, rows3, m2, m3 = rows0, rows0, m0, m0
    return rows0, rows1, rows2, rows3, m0, m1, m2, m3


@triton.jit
def _bn_rows_load_step(x_ptr, g_ptr, p, i, P, M, C, rr, cols, cmask,
                       BM: tl.constexpr, UNROLL: tl.constexpr, BWD: tl.constexpr):
    """Every load of loop step i, issued before any is used: x (and g) of UNROLL row chunks."""
    rows0, rows1, rows2, rows3, m0, m1, m2, m3 = _bn_rows_masks(p, i, P, M, rr, cmask, BM, UNROLL)
    x0, g0 = _bn_load_raw(x_ptr, g_ptr, rows0[:, None] * C + cols[None, :], m0, BWD)
    x1, g1 = _bn_load_raw(x_ptr, g_ptr, rows1[:, None] * C + cols[None, :], m1, BWD)
    if UNROLL == 4:
        x2, g2 = _bn_load_raw(x_ptr, g_ptr, rows2[:, None] * C + cols[None, :], m2, BWD)
        x3, g3 = _bn_load_raw(x_ptr, g_ptr, rows3[:, None] * C + cols[None, :], m3, BWD)
    else:
        x2, g2, x3, g3 = x0, g0, x0, g0
    return x0, g0, x1, g1, x2, g2, x3, g3


@triton.jit
def _bn_rows_acc_step(acc1, acc2, x0, g0, x1, g1, x2, g2, x3, g3, p, i, P, M, rr, cmask, ref2,
                      BM: tl.constexpr, UNROLL: tl.constexpr, BWD: tl.constexpr, ACC: tl.constexpr):
    _, _, _, _, m0, m1, m2, m3 = _bn_rows_masks(p, i, P, M, rr, cmask, BM, UNROLL)
    acc1, acc2 = _bn_acc_loaded(acc1, acc2, x0.to(ACC), g0.to(ACC), m0, ref2, BWD)
    acc1, acc2 = _bn_acc_loaded(acc1, acc2, x1.to(ACC), g1.to(ACC), m1, ref2, BWD)
    if UNROLL == 4:
        acc1, acc2 = _bn_acc_loaded(acc1, acc2, x2.to(ACC), g2.to(ACC), m2, ref2, BWD)
        acc1, acc2 = _bn_acc_loaded(acc1, acc2, x3.to(ACC), g3.to(ACC), m3, ref2, BWD)
    return acc1, acc2


@triton.jit
def _bn_rows_two_steps(acc1, acc2, a0, ag0, a1, ag1, a2, ag2, a3, ag3, b0, bg0, b1, bg1, b2, bg2, b3, bg3,
                       x_ptr, g_ptr, p, i, P, M, C, rr, cols, cmask, ref2,
                       BM: tl.constexpr, UNROLL: tl.constexpr, BWD: tl.constexpr, ACC: tl.constexpr):
    """Two steps of the two-register-set loop: set a (step i) summed and reloaded with step i + 2, then set b
    (step i + 1) summed and reloaded with step i + 3."""
    acc1, acc2 = _bn_rows_acc_step(acc1, acc2, a0, ag0, a1, ag1, a2, ag2, a3, ag3, p, i, P, M, rr, cmask, ref2,
                                   BM, UNROLL, BWD, ACC)
    a0, ag0, a1, ag1, a2, ag2, a3, ag3 = _bn_rows_load_step(x_ptr, g_ptr, p, i + 2, P, M, C, rr, cols, cmask,
                                                            BM, UNROLL, BWD)
    acc1, acc2 = _bn_rows_acc_step(acc1, acc2, b0, bg0, b1, bg1, b2, bg2, b3, bg3, p, i + 1, P, M, rr, cmask, ref2,
                                   BM, UNROLL, BWD, ACC)
    b0, bg0, b1, bg1, b2, bg2, b3, bg3 = _bn_rows_load_step(x_ptr, g_ptr, p, i + 3, P, M, C, rr, cols, cmask,
                                                            BM, UNROLL, BWD)
    return acc1, acc2, a0, ag0, a1, ag1, a2, ag2, a3, ag3, b0, bg0, b1, bg1, b2, bg2, b3, bg3


@triton.jit
def _bn_reduce_rows_kernel(
    x_ptr, g_ptr, ref_ptr, part_ptr,
    M, C, P, NCB, n_iter, CCH, o_mid, o_last,
    BM: tl.constexpr, BC: tl.constexpr, BWD: tl.constexpr, ACC: tl.constexpr,
    UNROLL: tl.constexpr, SMAP: tl.constexpr = 0, PDL: tl.constexpr = False, TWO_BUF: tl.constexpr = False,
    C_ALIGN: tl.constexpr = 1, FOLD: tl.constexpr = 0, FOLD_SUM: tl.constexpr = 0,
):
    """Split reduction over a row-major (M, C) view. Program (p, cb) sums columns cb*BC.. over
    row chunks p, p+P, p+2P, ... (UNROLL = 2 or 4 chunks per loop step, all loads issued before
    any is used, and the next step's loads issued before this step's sums). Forward: sum(x-shift),
    sum((x-shift)^2), shift = ``_bn_shift`` (o_mid, o_last: its samples' offsets), its samples loaded first and
    their median taken once the loop's loads are out: step 0 is peeled (with one set and with two alike, so their
    sums see the same code: a peeled step's accumulators are a known 0, which changes how its products contract
    into FMAs, and one set and two gave different bits when only one set peeled, H100, session 36).
    Backward: sum(g), sum(g*(x-mean)). Writes part[0, p, c] and part[1, p, c]. PDL: the combine may launch once
    every program has started (it waits for the sums).
    SMAP > 0: the (N, C*S) rows view of short ncs planes (S = SMAP, CCH channels): column j is element
    j % S of channel j // S, and its sums go to part[0 / 1, p*S + j % S, j // S] (S partials a program and
    channel, so the combine sees P*S partials per channel in the usual [P, C] layout).
    TWO_BUF (``red_two_buf_spread``, ``red_two_buf_rows_max_blocks``): two steps' loads held in two sets of
    registers, each set reloaded right after its own sums, so one step stays in flight while the other is summed
    (with one set, ptxas reloads it only after its sums: sm_90 SASS). The same steps summed in the same order: the
    same bits. C_ALIGN: rows of C elements are a multiple of it (``known_multiple``).
    FOLD > 0 (``fold_max_c``): the (M / K, K * C) rows of a small C (FOLD = C, CCH channels): column j is channel
    j % FOLD; the program sums its columns of each channel (FOLD_SUM: a power of two >= FOLD) and writes
    part[0 / 1, p*NCB + cb, c] (NCB partials a program and channel)."""
    if PDL:
        gdc_launch_dependents()
    C = known_multiple(C, C_ALIGN)
    pid = tl.program_id(0)
    cb = pid % NCB
    p = pid // NCB
    cols = cb * BC + tl.arange(0, BC)
    cmask = cols < C
    if SMAP:  # each column's channel, and that channel's first element
        ch = cols // SMAP
        firsts = x_ptr + ch.to(tl.int64) * SMAP
    elif FOLD:
        ch = cols % FOLD
        firsts = x_ptr + ch
    else:
        ch = cols
        firsts = x_ptr + cols
    if BWD:
        ref2 = tl.load(ref_ptr + ch, mask=cmask, other=0.0).to(ACC)[None, :]
    else:  # the shift's samples (_bn_shift), loaded first
        sa, sb, sc = load_three(firsts, o_mid, o_last, cmask, ACC)
    acc1 = tl.zeros([BM, BC], dtype=ACC)
    acc2 = tl.zeros([BM, BC], dtype=ACC)
    rr = tl.arange(0, BM)
    x0, g0, x1, g1, x2, g2, x3, g3 = _bn_rows_load_step(x_ptr, g_ptr, p, 0, P, M, C, rr, cols, cmask, BM, UNROLL, BWD)
    if TWO_BUF:
        # (a step past the program's n_iter reads row chunks past the last: masked off by their row limit)
        y0, k0, y1, k1, y2, k2, y3, k3 = _bn_rows_load_step(x_ptr, g_ptr, p, 1, P, M, C, rr, cols, cmask,
                                                            BM, UNROLL, BWD)
        if BWD:
            for i in range(0, n_iter, 2):
                (acc1, acc2, x0, g0, x1, g1, x2, g2, x3, g3, y0, k0, y1, k1, y2, k2, y3, k3) = _bn_rows_two_steps(
                    acc1, acc2, x0, g0, x1, g1, x2, g2, x3, g3, y0, k0, y1, k1, y2, k2, y3, k3,
                    x_ptr, g_ptr, p, i, P, M, C, rr, cols, cmask, ref2, BM, UNROLL, BWD, ACC)
        else:  # step 0 peeled; then the sets' roles swap: y holds the odd steps, x the even ones
            ref2 = median3(sa, sb, sc)[None, :]
            acc1, acc2 = _bn_rows_acc_step(acc1, acc2, x0, g0, x1, g1, x2, g2, x3, g3, p, 0, P, M, rr, cmask,
                                           ref2, BM, UNROLL, BWD, ACC)
            x0, g0, x1, g1, x2, g2, x3, g3 = _bn_rows_load_step(x_ptr, g_ptr, p, 2, P, M, C, rr, cols, cmask,
                                                                BM, UNROLL, BWD)
            for i in range(1, n_iter, 2):
                (acc1, acc2, y0, k0, y1, k1, y2, k2, y3, k3, x0, g0, x1, g1, x2, g2, x3, g3) = _bn_rows_two_steps(
                    acc1, acc2, y0, k0, y1, k1, y2, k2, y3, k3, x0, g0, x1, g1, x2, g2, x3, g3,
                    x_ptr, g_ptr, p, i, P, M, C, rr, cols, cmask, ref2, BM, UNROLL, BWD, ACC)
    else:
        first = 0
        if not BWD:  # step 0 peeled: the median taken once step 1's loads are out
            c0, h0, c1, h1, c2, h2, c3, h3 = x0, g0, x1, g1, x2, g2, x3, g3
            x0, g0, x1, g1, x2, g2, x3, g3 = _bn_rows_load_step(x_ptr, g_ptr, p, 1, P, M, C, rr, cols, cmask,
                                                                BM, UNROLL, BWD)
            ref2 = median3(sa, sb, sc)[None, :]
            acc1, acc2 = _bn_rows_acc_step(acc1, acc2, c0, h0, c1, h1, c2, h2, c3, h3, p, 0, P, M, rr, cmask,
                                           ref2, BM, UNROLL, BWD, ACC)
            first = 1
        for i in range(first, n_iter):
            c0, h0, c1, h1, c2, h2, c3, h3 = x0, g0, x1, g1, x2, g2, x3, g3
            x0, g0, x1, g1, x2, g2, x3, g3 = _bn_rows_load_step(x_ptr, g_ptr, p, i + 1, P, M, C, rr, cols, cmask,
                                                                BM, UNROLL, BWD)
            acc1, acc2 = _bn_rows_acc_step(acc1, acc2, c0, h0, c1, h1, c2, h2, c3, h3, p, i, P, M, rr, cmask,
                                           ref2, BM, UNROLL, BWD, ACC)
    s1 = tl.sum(acc1, axis=0)
    s2 = tl.sum(acc2, axis=0)
    if SMAP:
        dst = (p * SMAP + cols % SMAP).to(tl.int64) * CCH + ch
        tl.store(part_ptr + dst, s1, mask=cmask)
        tl.store(part_ptr + tl.cast(P, tl.int64) * SMAP * CCH + dst, s2, mask=cmask)
    elif FOLD:
        # [channel, column] one-hot: one reduction along the columns gives every channel's sum
        chans = tl.arange(0, FOLD_SUM)
        hit = (chans[:, None] == ch[None, :]) & cmask[None, :]
        t1 = tl.sum(tl.where(hit, s1[None, :], 0.0), axis=1)
        t2 = tl.sum(tl.where(hit, s2[None, :], 0.0), axis=1)
        dst = (p * NCB + cb).to(tl.int64) * CCH + chans
        tl.store(part_ptr + dst, t1, mask=chans < FOLD)
        tl.store(part_ptr + tl.cast(P, tl.int64) * NCB * CCH + dst, t2, mask=chans < FOLD)
    else:
        tl.store(part_ptr + p * C + cols, s1, mask=cmask)
        tl.store(part_ptr + (P + p) * C + cols, s2, mask=cmask)


@triton.jit
def _bn_ncs_step(p, i, P, C, S, NC, NSC, ch, cmask, sr, BS: tl.constexpr):
    """Offsets and masks of loop step i of the ncs reduction: work units u0 = p + 2*i*P and u0 + P
    (a step past the last one is masked off entirely)."""
    u0 = (p + (2 * i) * P).to(tl.int64)
    u1 = u0 + P
    n0 = u0 // NSC
    n1 = u1 // NSC
    s0 = (u0 - n0 * NSC) * BS + sr
    s1 = (u1 - n1 * NSC) * BS + sr
    plane0 = n0 * C + ch  # u < U  <=>  n < N  <=>  plane < N*C (for ch < C)
    plane1 = n1 * C + ch
    m0 = (cmask & (plane0 < NC))[:, None] & (s0 < S)[None, :]
    m1 = (cmask & (plane1 < NC))[:, None] & (s1 < S)[None, :]
    o0 = plane0[:, None] * S + s0[None, :]
    o1 = plane1[:, None] * S + s1[None, :]
    return o0, o1, m0, m1


@triton.jit
def _bn_reduce_ncs(
    x_ptr, g_ptr, ref_ptr, part_ptr,
    C, S, NC, NSC, P, NCB, n_iter, o_mid, o_last,
    CB: tl.constexpr, BS: tl.constexpr, BWD: tl.constexpr, ACC: tl.constexpr, PDL: tl.constexpr,
):
    """Split reduction over a contiguous (N, C, S) view. Work units u = n*NSC + s_chunk; program
    (p, cb) takes channels cb*CB.. and units p, p+P, ... (two per loop step). Same sums as the rows
    kernel."""
    if PDL:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    cb = pid % NCB
    p = pid // NCB
    ch = cb * CB + tl.arange(0, CB)
    cmask = ch < C
    acc1 = tl.zeros([CB, BS], dtype=ACC)
    acc2 = tl.zeros([CB, BS], dtype=ACC)
    sr = tl.arange(0, BS)
    # step 0 peeled. Backward: its loads issued before the saved mean's (H200: NCHW bf16 backward 3-4.5 % faster,
    # NOTES-batch_norm.md, session 13). Forward: the shift's samples (_bn_shift) loaded first, their median taken
    # once step 0's loads are out
    if not BWD:
        sa, sb, sc = load_three(x_ptr + ch.to(tl.int64) * S, o_mid, o_last, cmask, ACC)
    o0, o1, m0, m1 = _bn_ncs_step(p, 0, P, C, S, NC, NSC, ch, cmask, sr, BS)
    xa, ga = _bn_load_raw(x_ptr, g_ptr, o0, m0, BWD)
    xb, gb = _bn_load_raw(x_ptr, g_ptr, o1, m1, BWD)
    if BWD:
        ref2 = tl.load(ref_ptr + ch, mask=cmask, other=0.0).to(ACC)[:, None]
    else:
        ref2 = median3(sa, sb, sc)[:, None]
    acc1, acc2 = _bn_acc_loaded(acc1, acc2, xa.to(ACC), ga.to(ACC), m0, ref2, BWD)
    acc1, acc2 = _bn_acc_loaded(acc1, acc2, xb.to(ACC), gb.to(ACC), m1, ref2, BWD)
    for i in range(1, n_iter):
        o0, o1, m0, m1 = _bn_ncs_step(p, i, P, C, S, NC, NSC, ch, cmask, sr, BS)
        acc1, acc2 = _bn_accumulate(acc1, acc2, x_ptr, g_ptr, o0, m0, ref2, BWD, ACC)
        acc1, acc2 = _bn_accumulate(acc1, acc2, x_ptr, g_ptr, o1, m1, ref2, BWD, ACC)
    r1 = tl.sum(acc1, axis=1)
    r2 = tl.sum(acc2, axis=1)
    tl.store(part_ptr + p * C + ch, r1, mask=cmask)
    tl.store(part_ptr + (P + p) * C + ch, r2, mask=cmask)


@triton.jit
def _bn_reduce_ncs_kernel(
    x_ptr, g_ptr, ref_ptr, part_ptr,
    C, S, NC, NSC, P, NCB, n_iter, o_mid, o_last,
    CB: tl.constexpr, BS: tl.constexpr, BWD: tl.constexpr, ACC: tl.constexpr, PDL: tl.constexpr = False,
    S_ALIGN: tl.constexpr = 1,
):
    """ncs split reduction, plane length S at run time (S a multiple of 16, or large). S_ALIGN: S's power-of-two
    factor below 16 (``known_multiple``; knob ``plane_align``), else 1."""
    S = known_multiple(S, S_ALIGN)
    _bn_reduce_ncs(x_ptr, g_ptr, ref_ptr, part_ptr, C, S, NC, NSC, P, NCB, n_iter, o_mid, o_last, CB, BS, BWD, ACC,
                   PDL)


@triton.jit
def _bn_reduce_ncs_kernel_cs(
    x_ptr, g_ptr, ref_ptr, part_ptr,
    C, S: tl.constexpr, NC, NSC, P, NCB, n_iter, o_mid, o_last,
    CB: tl.constexpr, BS: tl.constexpr, BWD: tl.constexpr, ACC: tl.constexpr, PDL: tl.constexpr = False,
):
    """ncs split reduction with S a compile-time constant (short planes not a multiple of 16:
    the compiler then knows every alignment S has, e.g. 4 for 14x14)."""
    _bn_reduce_ncs(x_ptr, g_ptr, ref_ptr, part_ptr, C, S, NC, NSC, P, NCB, n_iter, o_mid, o_last, CB, BS, BWD, ACC,
                   PDL)


@triton.jit
def _bn_sum_partials(part_ptr, ch, cmask, C, P, BP: tl.constexpr, BCC: tl.constexpr):
    """Fixed-order fp64 sum of the (P, C) partials part[0] and part[1] for channels ch."""
    a1 = tl.zeros([BP, BCC], dtype=tl.float64)
    a2 = tl.zeros([BP, BCC], dtype=tl.float64)
    pr0 = tl.arange(0, BP)
    for p0 in range(0, P, BP):
        pr = p0 + pr0
        m = (pr < P)[:, None] & cmask[None, :]
        off = pr[:, None] * C + ch[None, :]
        a1 += tl.load(part_ptr + off, mask=m, other=0.0).to(tl.float64)
        a2 += tl.load(part_ptr + P * C + off, mask=m, other=0.0).to(tl.float64)
    return tl.sum(a1, axis=0), tl.sum(a2, axis=0)


@triton.jit
def _bn_combine_fwd_kernel(
    part_ptr, x_ptr, shift_stride, o_mid, o_last, coef_ptr, mean_ptr, invstd_ptr,
    w_ptr, b_ptr, rm_ptr, rv_ptr,
    C, P, n0, n1, e0, e1, e2, m0, m1, m2,
    BP: tl.constexpr, BCC: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_RS: tl.constexpr, F64: tl.constexpr,
    ACC: tl.constexpr, PDL: tl.constexpr = False,
):
    """Per channel: mean, invstd = rsqrt(biased var + eps), running-stat update, and the
    normalisation coefficients coef = [shift, mean - shift, w*invstd, b - (mean - shift)*w*invstd]
    (ACC dtype): y = (x - shift) * a + c keeps every digit of x - shift. PDL: launched while the
    reduction runs; the per-channel loads (none of them its output) go first, the sums after the wait."""
    if PDL:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    ch = pid * BCC + tl.arange(0, BCC)
    cmask = ch < C
    # every per-channel load is issued before the partial sums: their latencies overlap
    shift = _bn_shift(x_ptr, ch, cmask, shift_stride, o_mid, o_last, tl.float64)  # the reduction's, exactly
    if HAS_W:
        w = tl.load(w_ptr + ch, mask=cmask, other=1.0).to(tl.float64)
    if HAS_B:
        b = tl.load(b_ptr + ch, mask=cmask, other=0.0).to(tl.float64)
    else:
        b = tl.zeros([BCC], dtype=tl.float64)
    if HAS_RS:
        rm = tl.load(rm_ptr + ch, mask=cmask, other=0.0).to(ACC)
        rv = tl.load(rv_ptr + ch, mask=cmask, other=0.0).to(ACC)
    if PDL:
        gdc_wait()
    s1, s2 = _bn_sum_partials(part_ptr, ch, cmask, C, P, BP, BCC)
    dmean, invstd, mean, var, nf = _bn_finish_stats(s1, s2, shift, ch, cmask, n0, n1, e0, e1, e2, mean_ptr,
                                                    invstd_ptr, ACC)
    if HAS_W:
        a = w * invstd
    else:
        a = invstd
    tl.store(coef_ptr + ch, shift.to(ACC), mask=cmask)
    tl.store(coef_ptr + C + ch, dmean.to(ACC), mask=cmask)
    tl.store(coef_ptr + 2 * C + ch, a.to(ACC), mask=cmask)
    tl.store(coef_ptr + 3 * C + ch, (b - dmean * a).to(ACC), mask=cmask)
    if HAS_RS:
        _bn_update_running(rm, rv, mean, var, nf, ch, cmask, m0, m1, m2, rm_ptr, rv_ptr, F64, ACC)


@triton.jit
def _bn_finish_stats(s1, s2, shift, ch, cmask, n0, n1, e0, e1, e2, mean_ptr, invstd_ptr, ACC: tl.constexpr):
    """From a channel's fp64 sums about its shift: mean and invstd = rsqrt(biased var + eps) stored; returns
    (mean - shift, invstd, mean, biased var, n) in fp64."""
    nf = tl.cast(n0, tl.float64) + tl.cast(n1, tl.float64)
    dmean = s1 / nf
    var = (s2 - s1 * dmean) / nf
    var = tl.where(var < 0.0, 0.0, var)
    mean = shift + dmean
    eps = tl.cast(e0, tl.float64) + tl.cast(e1, tl.float64) + tl.cast(e2, tl.float64)
    # ATen's InvStd: 0 (not inf) when var == 0 and eps == 0 (a constant channel), so y = bias
    invstd = 1.0 / tl.sqrt(var + eps)
    invstd = tl.where(var == 0.0, tl.where(eps == 0.0, 0.0, invstd), invstd)
    tl.store(mean_ptr + ch, mean.to(ACC), mask=cmask)
    tl.store(invstd_ptr + ch, invstd.to(ACC), mask=cmask)
    return dmean, invstd, mean, var, nf


@triton.jit
def _bn_update_running(rm, rv, mean, var, nf, ch, cmask, m0, m1, m2, rm_ptr, rv_ptr, F64: tl.constexpr,
                       ACC: tl.constexpr):
    """Running statistics (loaded rm, rv) updated with momentum m0 (+ m1 + m2 in fp64) and the unbiased variance."""
    if F64:
        mom = tl.cast(m0, tl.float64) + tl.cast(m1, tl.float64) + tl.cast(m2, tl.float64)
    else:
        mom = m0
    unbiased = (var * nf / (nf - 1.0)).to(ACC)
    rm_new = (1.0 - mom) * rm + mom * mean.to(ACC)
    rv_new = (1.0 - mom) * rv + mom * unbiased
    tl.store(rm_ptr + ch, rm_new.to(rm_ptr.dtype.element_ty), mask=cmask)
    tl.store(rv_ptr + ch, rv_new.to(rv_ptr.dtype.element_ty), mask=cmask)


@triton.jit
def _bn_from_f64(v, dt: tl.constexpr):
    """fp64 -> dt; 16-bit types go through fp32 (one rounding step that matters)."""
    if dt == tl.float64:
        out = v
    else:
        out = v.to(tl.float32).to(dt)
    return out


@triton.jit
def _bn_combine_bwd_kernel(
    part_ptr, mean_ptr, invstd_ptr, w_ptr, coef_ptr, gw_ptr, gb_ptr,
    C, P, n0, n1,
    BP: tl.constexpr, BCC: tl.constexpr, HAS_W: tl.constexpr,
    NEED_DX: tl.constexpr, NEED_GW: tl.constexpr, NEED_GB: tl.constexpr, ACC: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Per channel: grad_weight = s2*invstd, grad_bias = s1, and (training grad_input) the
    coefficients coef = [s1/n, s2/n*invstd^2, invstd*w, mean] (ACC dtype). PDL: as the forward's."""
    if PDL:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    ch = pid * BCC + tl.arange(0, BCC)
    cmask = ch < C
    # per-channel loads first: their latencies overlap the partial sums
    invstd = tl.load(invstd_ptr + ch, mask=cmask, other=0.0).to(tl.float64)
    if NEED_DX:
        if HAS_W:
            w = tl.load(w_ptr + ch, mask=cmask, other=1.0).to(tl.float64)
        mean = tl.load(mean_ptr + ch, mask=cmask, other=0.0).to(ACC)
    if PDL:
        gdc_wait()
    s1, s2 = _bn_sum_partials(part_ptr, ch, cmask, C, P, BP, BCC)
    if NEED_GW:
        tl.store(gw_ptr + ch, _bn_from_f64(s2 * invstd, gw_ptr.dtype.element_ty), mask=cmask)
    if NEED_GB:
        tl.store(gb_ptr + ch, _bn_from_f64(s1, gb_ptr.dtype.element_ty), mask=cmask)
    if NEED_DX:
        nf = tl.cast(n0, tl.float64) + tl.cast(n1, tl.float64)
        if HAS_W:
            gs = invstd * w
        else:
            gs = invstd
        gm = s1 / nf
        proj = s2 / nf * invstd * invstd
        tl.store(coef_ptr + ch, gm.to(ACC), mask=cmask)
        tl.store(coef_ptr + C + ch, proj.to(ACC), mask=cmask)
        tl.store(coef_ptr + 2 * C + ch, gs.to(ACC), mask=cmask)
        tl.store(coef_ptr + 3 * C + ch, mean, mask=cmask)
