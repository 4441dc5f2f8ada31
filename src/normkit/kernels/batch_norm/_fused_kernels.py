"""Batch norm in one launch per direction for small tensors (``fused_max_rows``): a program owns a block of channels
and sweeps all of their elements twice (sums, then the elementwise pass; the second sweep reads from L2), so a
direction is one launch with no partials, instead of reduction + combine + elementwise."""

import triton
import triton.language as tl

from normkit.kernels._jit import known_multiple
from normkit.kernels.batch_norm._reduce_kernels import _bn_finish_stats, _bn_from_f64, _bn_shift, _bn_update_running


@triton.jit
def _bn_fused_tile(i, cb, M, C, S, NSC, ROWS: tl.constexpr, B0: tl.constexpr, B1: tl.constexpr):
    """Offsets and mask of tile i of channel block cb. ROWS: [B0 rows, B1 channels] of the (M, C) view;
    else channel cb of the (N, C, S) view, [B0 samples, B1 elements of their planes]: tile i = sample block
    i // NSC, plane chunk i % NSC (M = N here)."""
    if ROWS:
        rows = (i * B0 + tl.arange(0, B0)).to(tl.int64)  # i * B0 < M: small (fused_max_rows)
        cols = cb * B1 + tl.arange(0, B1)
        offs = rows[:, None] * C + cols[None, :]
        mask = (rows < M)[:, None] & (cols < C)[None, :]
    else:
        nb = i // NSC
        n = nb * B0 + tl.arange(0, B0)
        s = (i - nb * NSC) * B1 + tl.arange(0, B1)
        offs = (n * C + cb).to(tl.int64)[:, None] * S + s[None, :]
        mask = (n < M)[:, None] & (s < S)[None, :]
    return offs, mask


@triton.jit
def _bn_fused_channels(cb, C, ROWS: tl.constexpr, B1: tl.constexpr):
    """The program's channels: B1 columns of the rows view, or the one channel cb (a 1-vector)."""
    if ROWS:
        ch = cb * B1 + tl.arange(0, B1)
    else:
        ch = cb + tl.arange(0, 1)
    return ch, ch < C


@triton.jit
def _bn_fused_spread(v, ROWS: tl.constexpr):
    """A per-channel vector broadcast over the tile."""
    if ROWS:
        out = v[None, :]
    else:
        out = v[:, None]  # [1, 1]
    return out


@triton.jit
def _bn_fused_sums(x_ptr, g_ptr, ref2, cb, M, C, S, NSC, NT, ROWS: tl.constexpr, B0: tl.constexpr,
                   B1: tl.constexpr, BWD: tl.constexpr, ACC: tl.constexpr):
    """Per-channel sums over every tile of channel block cb, terms in ACC summed in fp64 (a lane may sum many
    tiles): forward sum(x - ref), sum((x - ref)^2) (ref: the shift); backward sum(g), sum(g * (x - ref)) (ref:
    the mean). A 1-vector for a plane tile's one channel."""
    acc1 = tl.zeros([B0, B1], dtype=tl.float64)
    acc2 = tl.zeros([B0, B1], dtype=tl.float64)
    for i in range(0, NT):
        offs, mask = _bn_fused_tile(i, cb, M, C, S, NSC, ROWS, B0, B1)
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(ACC)
        if BWD:
            # every term in fp64, exact for fp32 inputs: g (x - mean) rounded in fp32 cost a relative 6e-8 a term
            # (H200 check, session 23: eval grad_weight of x ~ 1000 with a running mean far from it 1.2x the
            # tolerance; a 2-sample training grad_input, all cancellation, 1.03x)
            g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(ACC).to(tl.float64)
            acc1 += g
            acc2 += g * (x.to(tl.float64) - ref2.to(tl.float64))
        else:
            d = tl.where(mask, x - ref2, 0.0).to(tl.float64)
            acc1 += d
            acc2 += d * d
    if ROWS:
        s1 = tl.sum(acc1, axis=0)
        s2 = tl.sum(acc2, axis=0)
    else:
        s1 = tl.zeros([1], dtype=tl.float64) + tl.sum(tl.sum(acc1, axis=1), axis=0)
        s2 = tl.zeros([1], dtype=tl.float64) + tl.sum(tl.sum(acc2, axis=1), axis=0)
    return s1, s2


@triton.jit
def _bn_fused_fwd_kernel(
    x_ptr, y_ptr, mean_ptr, invstd_ptr, w_ptr, b_ptr, rm_ptr, rv_ptr,
    M, C, S, NSC, NT, n0, n1, e0, e1, e2, m0, m1, m2, o_mid, o_last,
    ROWS: tl.constexpr, B0: tl.constexpr, B1: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_RS: tl.constexpr, F64: tl.constexpr, ACC: tl.constexpr,
    S_CONST: tl.constexpr = 0, C_ALIGN: tl.constexpr = 1,
):
    """Training forward of channel block program_id(0) in one program: shifted sums (shift = ``_bn_shift``,
    o_mid / o_last its samples' offsets; differences in ACC, summed in fp64: a lane sums many tiles); mean, invstd
    and running statistics as _bn_combine_fwd_kernel; then y = (x - shift) * a + c as the elementwise pass, tiles in
    reverse order. S_CONST: the plane length compiled in (short unaligned planes, as _const_s), else 0. C_ALIGN:
    as the rows reduction's."""
    if S_CONST > 0:
        S = S_CONST
    C = known_multiple(C, C_ALIGN)
    cb = tl.program_id(0)
    ch, cmask = _bn_fused_channels(cb, C, ROWS, B1)
    if ROWS:
        shift = _bn_shift(x_ptr, ch, cmask, 1, o_mid, o_last, ACC)
    else:
        shift = _bn_shift(x_ptr, ch, cmask, S, o_mid, o_last, ACC)
    shift2 = _bn_fused_spread(shift, ROWS)
    s1, s2 = _bn_fused_sums(x_ptr, x_ptr, shift2, cb, M, C, S, NSC, NT, ROWS, B0, B1, False, ACC)
    dmean, invstd, mean, var, nf = _bn_finish_stats(s1, s2, shift.to(tl.float64), ch, cmask, n0, n1, e0, e1, e2,
                                                    mean_ptr, invstd_ptr, ACC)
    a = invstd
    if HAS_W:
        a = a * tl.load(w_ptr + ch, mask=cmask, other=1.0).to(tl.float64)
    if HAS_B:
        c = tl.load(b_ptr + ch, mask=cmask, other=0.0).to(tl.float64) - dmean * a
    else:
        c = -dmean * a
    if HAS_RS:
        rm = tl.load(rm_ptr + ch, mask=cmask, other=0.0).to(ACC)
        rv = tl.load(rv_ptr + ch, mask=cmask, other=0.0).to(ACC)
        _bn_update_running(rm, rv, mean, var, nf, ch, cmask, m0, m1, m2, rm_ptr, rv_ptr, F64, ACC)
    a2 = _bn_fused_spread(a.to(ACC), ROWS)
    c2 = _bn_fused_spread(c.to(ACC), ROWS)
    for j in range(0, NT):
        offs, mask = _bn_fused_tile(NT - 1 - j, cb, M, C, S, NSC, ROWS, B0, B1)
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(ACC)
        tl.store(y_ptr + offs, ((x - shift2) * a2 + c2).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bn_fused_bwd_kernel(
    g_ptr, x_ptr, dx_ptr, mean_ptr, invstd_ptr, w_ptr, gw_ptr, gb_ptr,
    M, C, S, NSC, NT, n0, n1,
    ROWS: tl.constexpr, B0: tl.constexpr, B1: tl.constexpr, TRAIN: tl.constexpr, HAS_W: tl.constexpr,
    NEED_DX: tl.constexpr, NEED_GW: tl.constexpr, NEED_GB: tl.constexpr, ACC: tl.constexpr,
    S_CONST: tl.constexpr = 0, C_ALIGN: tl.constexpr = 1,
):
    """Backward of channel block program_id(0) in one program: sum(dy), sum(dy * (x - mean)) (products in ACC,
    summed in fp64), grad_weight / grad_bias as _bn_combine_bwd_kernel, then grad_input as the elementwise
    pass (training: dy - mean(dy) - (x - mean) invstd^2 mean(dy (x - mean)), times invstd w; eval: dy invstd w).
    mean / invstd: the saved statistics (training) or running mean and rsqrt(running var + eps) (eval).
    S_CONST, C_ALIGN: as the forward's."""
    if S_CONST > 0:
        S = S_CONST
    C = known_multiple(C, C_ALIGN)
    cb = tl.program_id(0)
    ch, cmask = _bn_fused_channels(cb, C, ROWS, B1)
    mean = tl.load(mean_ptr + ch, mask=cmask, other=0.0).to(ACC)
    invstd = tl.load(invstd_ptr + ch, mask=cmask, other=0.0).to(tl.float64)
    mean2 = _bn_fused_spread(mean, ROWS)
    s1, s2 = _bn_fused_sums(x_ptr, g_ptr, mean2, cb, M, C, S, NSC, NT, ROWS, B0, B1, True, ACC)
    if NEED_GW:
        tl.store(gw_ptr + ch, _bn_from_f64(s2 * invstd, gw_ptr.dtype.element_ty), mask=cmask)
    if NEED_GB:
        tl.store(gb_ptr + ch, _bn_from_f64(s1, gb_ptr.dtype.element_ty), mask=cmask)
    if NEED_DX:
        gs = invstd
        if HAS_W:
            gs = gs * tl.load(w_ptr + ch, mask=cmask, other=1.0).to(tl.float64)
        nf = tl.cast(n0, tl.float64) + tl.cast(n1, tl.float64)
        gm2 = _bn_fused_spread((s1 / nf).to(ACC), ROWS)
        proj2 = _bn_fused_spread((s2 / nf * invstd * invstd).to(ACC), ROWS)
        gs2 = _bn_fused_spread(gs.to(ACC), ROWS)
        for j in range(0, NT):
            offs, mask = _bn_fused_tile(NT - 1 - j, cb, M, C, S, NSC, ROWS, B0, B1)
            g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(ACC)
            if TRAIN:
                x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(ACC)
                dx = (g - gm2 - (x - mean2) * proj2) * gs2
            else:
                dx = g * gs2
            tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
