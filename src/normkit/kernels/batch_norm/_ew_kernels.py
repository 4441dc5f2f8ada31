"""Batch norm's elementwise passes: y from x and per-channel coefficients (training, eval), dx from x, dy and
coefficients (training) or from dy alone (eval)."""

import triton
import triton.language as tl

from normkit.kernels._jit import known_multiple
from normkit.kernels._launch import gdc_wait


@triton.jit
def _bn_ew_coefs(p0, p1, p2, p3, ch, cmask, C, e0, e1, e2,
                 MODE: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                 F64: tl.constexpr, ACC: tl.constexpr):
    """Per-channel coefficients (k0, k1, k2, k3) of the elementwise pass for channels ch."""
    if MODE == 0:  # forward train: p0 = coef [shift, dmean, a, c]
        k0 = tl.load(p0 + ch, mask=cmask, other=0.0).to(ACC)
        k2 = tl.load(p0 + 2 * C + ch, mask=cmask, other=0.0).to(ACC)
        k3 = tl.load(p0 + 3 * C + ch, mask=cmask, other=0.0).to(ACC)
        k1 = k3
    elif MODE == 1:  # forward eval: p0 = running_mean, p1 = running_var, p2 = w, p3 = b
        if F64:
            eps = tl.cast(e0, tl.float64) + tl.cast(e1, tl.float64) + tl.cast(e2, tl.float64)
        else:
            eps = e0
        k0 = tl.load(p0 + ch, mask=cmask, other=0.0).to(ACC)
        rv = tl.load(p1 + ch, mask=cmask, other=1.0).to(ACC)
        if F64:
            k2 = 1.0 / tl.sqrt(rv + eps)
        else:
            k2 = tl.rsqrt(rv + eps)  # MUFU.RSQ: ~1e-7 relative, one instruction per channel
        if HAS_W:
            k2 = k2 * tl.load(p2 + ch, mask=cmask, other=1.0).to(ACC)
        if HAS_B:
            k3 = tl.load(p3 + ch, mask=cmask, other=0.0).to(ACC)
        else:
            k3 = tl.zeros_like(k0)
        k1 = k3
    elif MODE == 2:  # backward train: p0 = coef [gm, proj, gs, mean]
        k0 = tl.load(p0 + ch, mask=cmask, other=0.0).to(ACC)
        k1 = tl.load(p0 + C + ch, mask=cmask, other=0.0).to(ACC)
        k2 = tl.load(p0 + 2 * C + ch, mask=cmask, other=0.0).to(ACC)
        k3 = tl.load(p0 + 3 * C + ch, mask=cmask, other=0.0).to(ACC)
    else:  # backward eval: p0 = invstd, p2 = w
        k2 = tl.load(p0 + ch, mask=cmask, other=0.0).to(ACC)
        if HAS_W:
            k2 = k2 * tl.load(p2 + ch, mask=cmask, other=1.0).to(ACC)
        k0 = k2
        k1 = k2
        k3 = k2
    return k0, k1, k2, k3


@triton.jit
def _bn_ew_apply(x, g, k0, k1, k2, k3, MODE: tl.constexpr):
    if MODE == 0:
        out = (x - k0) * k2 + k3
    elif MODE == 1:
        out = (x - k0) * k2 + k3
    elif MODE == 2:
        out = (g - k0 - (x - k3) * k1) * k2
    else:
        out = g * k2
    return out


@triton.jit
def _bn_ew_load(x_ptr, g_ptr, offs, mask, MODE: tl.constexpr, ACC: tl.constexpr):
    """The elementwise pass's inputs: x unless MODE 3 (eval backward), g in the backward modes."""
    if MODE != 3:
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(ACC)
    else:
        x = 0.0
    if MODE >= 2:
        g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(ACC)
    else:
        g = 0.0
    return x, g


@triton.jit
def _bn_ew_rows_kernel(
    x_ptr, g_ptr, y_ptr, p0, p1, p2, p3,
    M, C, NCB, NT, CCH, e0, e1, e2,
    BM: tl.constexpr, BC: tl.constexpr, MODE: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, F64: tl.constexpr, ACC: tl.constexpr,
    SMAP: tl.constexpr = 0, PDL: tl.constexpr = False,
    C_ALIGN: tl.constexpr = 1, FOLD: tl.constexpr = 0,
):
    """Elementwise pass over a row-major (M, C) view, tile [BM, BC], tiles walked from the end of
    memory to the start (L2 reuse after the reduction). PDL: launched while the combine runs; the
    tile's x (and dy) are loaded before waiting for the coefficients. SMAP > 0: the (N, C*S) rows view
    of short ncs planes (S = SMAP, CCH channels): column j takes channel j // S's coefficients. C_ALIGN: as the
    rows reduction's. FOLD > 0: the folded rows of a small C (FOLD = C, CCH channels): column j takes channel
    j % FOLD's."""
    C = known_multiple(C, C_ALIGN)
    pid = NT - 1 - tl.program_id(0)
    mb = pid // NCB
    cb = pid - mb * NCB
    cols = cb * BC + tl.arange(0, BC)
    cmask = cols < C
    rows = mb.to(tl.int64) * BM + tl.arange(0, BM)
    mask = (rows < M)[:, None] & cmask[None, :]
    offs = rows[:, None] * C + cols[None, :]
    if PDL:  # the tile first, the combine's coefficients after the wait
        x, g = _bn_ew_load(x_ptr, g_ptr, offs, mask, MODE, ACC)
        gdc_wait()
    if SMAP:
        k0, k1, k2, k3 = _bn_ew_coefs(p0, p1, p2, p3, cols // SMAP, cmask, CCH, e0, e1, e2,
                                      MODE, HAS_W, HAS_B, F64, ACC)
    elif FOLD:
        k0, k1, k2, k3 = _bn_ew_coefs(p0, p1, p2, p3, cols % FOLD, cmask, CCH, e0, e1, e2,
                                      MODE, HAS_W, HAS_B, F64, ACC)
    else:
        k0, k1, k2, k3 = _bn_ew_coefs(p0, p1, p2, p3, cols, cmask, C, e0, e1, e2,
                                      MODE, HAS_W, HAS_B, F64, ACC)
    if not PDL:
        x, g = _bn_ew_load(x_ptr, g_ptr, offs, mask, MODE, ACC)
    out = _bn_ew_apply(x, g, k0[None, :], k1[None, :], k2[None, :], k3[None, :], MODE)
    tl.store(y_ptr + offs, out.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bn_ew_ncs(
    x_ptr, g_ptr, y_ptr, p0, p1, p2, p3,
    NC, C, S, NSB, NT, e0, e1, e2,
    R: tl.constexpr, BS: tl.constexpr, MODE: tl.constexpr, WRAP_MOD: tl.constexpr,
    LOCAL32: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, F64: tl.constexpr, ACC: tl.constexpr, PDL: tl.constexpr,
):
    """Elementwise pass over a contiguous (N, C, S) view seen as (N*C) planes of S: tile
    [R planes, BS], tiles walked from the end of memory to the start. LOCAL32: offsets inside
    the tile in int32 from a per-program int64 base (fewer registers per plane). PDL: as the rows
    kernel."""
    pid = NT - 1 - tl.program_id(0)
    rb = pid // NSB
    sb = pid - rb * NSB
    r0 = rb.to(tl.int64) * R
    rl = tl.arange(0, R)
    rmask = rl < NC - r0
    # channel of each plane: one int64 remainder per program, int32 after that
    ch = (r0 % C).to(tl.int32) + tl.arange(0, R)
    if WRAP_MOD:
        ch = ch % C
    else:
        ch = tl.where(ch >= C, ch - C, ch)
    s = sb * BS + tl.arange(0, BS)
    mask = rmask[:, None] & (s < S)[None, :]
    base = r0 * S
    if LOCAL32:
        offs = rl[:, None] * S + s[None, :]
    else:
        offs = rl.to(tl.int64)[:, None] * S + s[None, :]
    if PDL:  # as the rows kernel
        x, g = _bn_ew_load(x_ptr + base, g_ptr + base, offs, mask, MODE, ACC)
        gdc_wait()
    k0, k1, k2, k3 = _bn_ew_coefs(p0, p1, p2, p3, ch, rmask, C, e0, e1, e2,
                                  MODE, HAS_W, HAS_B, F64, ACC)
    if not PDL:
        x, g = _bn_ew_load(x_ptr + base, g_ptr + base, offs, mask, MODE, ACC)
    out = _bn_ew_apply(x, g, k0[:, None], k1[:, None], k2[:, None], k3[:, None], MODE)
    tl.store(y_ptr + base + offs, out.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bn_ew_ncs_kernel(
    x_ptr, g_ptr, y_ptr, p0, p1, p2, p3,
    NC, C, S, NSB, NT, e0, e1, e2,
    R: tl.constexpr, BS: tl.constexpr, MODE: tl.constexpr, WRAP_MOD: tl.constexpr,
    LOCAL32: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, F64: tl.constexpr, ACC: tl.constexpr,
    PDL: tl.constexpr = False, S_ALIGN: tl.constexpr = 1,
):
    """ncs elementwise pass, plane length S at run time. S_ALIGN: as the ncs reduction's."""
    S = known_multiple(S, S_ALIGN)
    _bn_ew_ncs(x_ptr, g_ptr, y_ptr, p0, p1, p2, p3, NC, C, S, NSB, NT, e0, e1, e2,
               R, BS, MODE, WRAP_MOD, LOCAL32, HAS_W, HAS_B, F64, ACC, PDL)


@triton.jit
def _bn_ew_ncs_kernel_cs(
    x_ptr, g_ptr, y_ptr, p0, p1, p2, p3,
    NC, C, S: tl.constexpr, NSB, NT, e0, e1, e2,
    R: tl.constexpr, BS: tl.constexpr, MODE: tl.constexpr, WRAP_MOD: tl.constexpr,
    LOCAL32: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, F64: tl.constexpr, ACC: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """ncs elementwise pass with S a compile-time constant (short unaligned planes)."""
    _bn_ew_ncs(x_ptr, g_ptr, y_ptr, p0, p1, p2, p3, NC, C, S, NSB, NT, e0, e1, e2,
               R, BS, MODE, WRAP_MOD, LOCAL32, HAS_W, HAS_B, F64, ACC, PDL)


@triton.jit
def _bn_ew_flat_tile(x_ptr, g_ptr, y_ptr, p0, p1, p2, p3, base, i, lim, loc, ch, rmask, C, e0, e1, e2,
                     MODE: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, F64: tl.constexpr,
                     ACC: tl.constexpr, PDL: tl.constexpr):
    m = i < lim
    # the tile's loads in flight while the coefficients are loaded and spread (H200 session 19, bn_kernels
    # variant flatlf: bf16 256x2048x7x7 eval 0.0331 -> 0.0304 ms, forward -1.7 %, backward and fp32 within 1 %)
    x, g = _bn_ew_load(x_ptr + base, g_ptr + base, i, m, MODE, ACC)
    if PDL:
        gdc_wait()
    k0, k1, k2, k3 = _bn_ew_coefs(p0, p1, p2, p3, ch, rmask, C, e0, e1, e2,
                                  MODE, HAS_W, HAS_B, F64, ACC)
    # the R planes' coefficients spread to their elements (each used term gathered once)
    K2 = tl.gather(k2, loc, axis=0)
    if MODE == 3:
        K0, K1, K3 = K2, K2, K2
    else:
        K0 = tl.gather(k0, loc, axis=0)
        K3 = tl.gather(k3, loc, axis=0)
        if MODE == 2:
            K1 = tl.gather(k1, loc, axis=0)
        else:
            K1 = K3
    out = _bn_ew_apply(x, g, K0, K1, K2, K3, MODE)
    tl.store(y_ptr + base + i, out.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _bn_ew_flat_kernel(
    x_ptr, g_ptr, y_ptr, p0, p1, p2, p3,
    NC, C, NT, e0, e1, e2,
    S: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, BLOCK: tl.constexpr, MODE: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, F64: tl.constexpr, ACC: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Elementwise pass over short unaligned ncs planes (S % 16 != 0, compiled in) as one flat array:
    a program takes R consecutive planes, R * S contiguous elements starting on a 16-byte boundary (R
    a multiple of the planes that make 16 bytes), so its accesses are 16-byte vectors where the
    [planes, S] tiles of _bn_ew_ncs start every plane off a boundary. The R planes' coefficients are
    computed once and spread to the elements with tl.gather; the arithmetic per element is
    _bn_ew_apply's (the same bits). Tiles walked from the end of memory to the start. PDL: waits for
    the combine before reading its coefficients; the tile's x / dy, no kernel's output, are loaded
    before that."""
    pid = NT - 1 - tl.program_id(0)
    r0 = pid.to(tl.int64) * R
    rl = tl.arange(0, RP)
    rmask = rl < tl.minimum(NC - r0, R)
    ch = ((r0 % C).to(tl.int32) + rl) % C
    i = tl.arange(0, BLOCK)
    loc = tl.minimum(i // S, RP - 1)
    base = r0 * S
    if r0 + R <= NC:  # a whole tile: the bound is a compile-time multiple of the vector width
        _bn_ew_flat_tile(x_ptr, g_ptr, y_ptr, p0, p1, p2, p3, base, i, R * S, loc, ch, rmask, C, e0, e1, e2,
                         MODE, HAS_W, HAS_B, F64, ACC, PDL)
    else:
        _bn_ew_flat_tile(x_ptr, g_ptr, y_ptr, p0, p1, p2, p3, base, i, ((NC - r0) * S).to(tl.int32), loc, ch,
                         rmask, C, e0, e1, e2, MODE, HAS_W, HAS_B, F64, ACC, PDL)
