"""Layer / RMS norm's forward kernels: rows in registers (several rows a program, one row, persistent), looped rows,
and split rows (several programs a row)."""

import triton
import triton.language as tl

from normkit.kernels._jit import known_multiple


# --------------------------------------------------------------------------------------------------
# device helpers


@triton.jit
def _rsqrt(v, ACC: tl.constexpr):
    if ACC == tl.float64:
        r = 1.0 / tl.sqrt(v)
    else:
        r = tl.math.rsqrt(v)
    return r


# --------------------------------------------------------------------------------------------------
# forward, rows in registers


@triton.jit
def _fwd_part_x(X, R, S, rows, mask, cols, stride_x, stride_r, stride_s, xv_in, rv_in,
                HAS_RES: tl.constexpr, ACC: tl.constexpr, GIVEN: tl.constexpr):
    """One column part of a row tile in ACC: x, or x + residual (rounded to x's dtype, stored to S).
    GIVEN: x (and the residual) were loaded by the caller (prefetched)."""
    if GIVEN:
        xv = xv_in
    else:
        xv = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    if HAS_RES:
        if GIVEN:
            rv = rv_in
        else:
            rv = tl.load(R + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0)
        sv = (xv.to(ACC) + rv.to(ACC)).to(xv.dtype)  # the sum, rounded to x's dtype
        tl.store(S + rows[:, None] * stride_s + cols[None, :], sv, mask=mask)
        x = sv.to(ACC)
    else:
        x = xv.to(ACC)
    return x


@triton.jit
def _fwd_part_store(W, B, Y, w, b, y, rows, mask, cols, cmask, stride_y,
                    LOAD_WB: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACC: tl.constexpr):
    """Affine and store of one column part. w/b: held ([part width]), or, with LOAD_WB, loaded here after
    the statistics (short live range)."""
    if LOAD_WB:
        if HAS_W:
            w = tl.load(W + cols, mask=cmask, other=0.0).to(ACC)
        if HAS_B:
            b = tl.load(B + cols, mask=cmask, other=0.0).to(ACC)
    if HAS_W:
        y = y * w[None, :]
    if HAS_B:
        y = y + b[None, :]
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y, mask=mask)


@triton.jit
def _fwd_rows_tile(
    X, R, W, B, Y, S, MEAN, RSTD, w, b, w2, b2, row0, cols, cmask, cols2, cmask2,
    M, N, stride_x, stride_r, stride_y, stride_s, eps,
    BLOCK_M: tl.constexpr, NB: tl.constexpr, LOAD_WB: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_RES: tl.constexpr, IS_RMS: tl.constexpr,
    ACC: tl.constexpr, xv_in, rv_in, xv2_in, rv2_in, GIVEN: tl.constexpr,
):
    """Normalise rows ``row0 .. row0 + BLOCK_M`` held whole in registers, as one column part (``cols``)
    or, with NB > 0, two: ``cols`` (a power of two wide) and ``cols2`` (NB wide, after it), so that a
    width like 5120 = 4096 + 1024 occupies 5120 lanes instead of 8192. w/b (w2/b2: the second part's):
    held by a persistent program, or, with LOAD_WB, loaded after the statistics. GIVEN: x (and the
    residual) were loaded by the caller (``xv_in``/``rv_in``, ``xv2_in``/``rv2_in``; prefetched)."""
    rows = row0 + tl.arange(0, BLOCK_M).to(tl.int64)
    rmask = rows < M
    mask = rmask[:, None] & cmask[None, :]
    x = _fwd_part_x(X, R, S, rows, mask, cols, stride_x, stride_r, stride_s, xv_in, rv_in, HAS_RES, ACC, GIVEN)
    if NB > 0:
        mask2 = rmask[:, None] & cmask2[None, :]
        x2 = _fwd_part_x(X, R, S, rows, mask2, cols2, stride_x, stride_r, stride_s, xv2_in, rv2_in,
                         HAS_RES, ACC, GIVEN)
    if IS_RMS:
        ss = tl.sum(x * x, axis=1)
        if NB > 0:
            ss += tl.sum(x2 * x2, axis=1)
        rstd = _rsqrt(ss / N + eps, ACC)
        y = x * rstd[:, None]
        if NB > 0:
            y2 = x2 * rstd[:, None]
    else:
        # shift by the row's first element: x - shift is exact for nearby values, so a large common
        # offset costs no digits in x - mean (the fp32 mean itself cannot hold them)
        shift = tl.load(X + rows * stride_x, mask=rmask, other=0.0)
        if HAS_RES:
            r0 = tl.load(R + rows * stride_r, mask=rmask, other=0.0)
            shift = (shift.to(ACC) + r0.to(ACC)).to(X.dtype.element_ty)
        shift = shift.to(ACC)
        xs = tl.where(mask, x - shift[:, None], 0.0)
        s1 = tl.sum(xs, axis=1)
        if NB > 0:
            xs2 = tl.where(mask2, x2 - shift[:, None], 0.0)
            s1 += tl.sum(xs2, axis=1)
        mean_s = s1 / N
        d = tl.where(mask, xs - mean_s[:, None], 0.0)
        s2 = tl.sum(d * d, axis=1)
        if NB > 0:
            d2 = tl.where(mask2, xs2 - mean_s[:, None], 0.0)
            s2 += tl.sum(d2 * d2, axis=1)
        rstd = _rsqrt(s2 / N + eps, ACC)
        y = d * rstd[:, None]
        if NB > 0:
            y2 = d2 * rstd[:, None]
        tl.store(MEAN + rows, shift + mean_s, mask=rmask)
    tl.store(RSTD + rows, rstd, mask=rmask)
    _fwd_part_store(W, B, Y, w, b, y, rows, mask, cols, cmask, stride_y, LOAD_WB, HAS_W, HAS_B, ACC)
    if NB > 0:
        _fwd_part_store(W, B, Y, w2, b2, y2, rows, mask2, cols2, cmask2, stride_y, LOAD_WB, HAS_W, HAS_B, ACC)


@triton.jit
def _fwd_load_next(X, R, rows, M, cols, cmask, stride_x, stride_r, HAS_RES: tl.constexpr):
    """x (and the residual) of one column part of the tile at ``rows`` (rows >= M masked off)."""
    mask = (rows < M)[:, None] & cmask[None, :]
    xn = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    rn = xn
    if HAS_RES:
        rn = tl.load(R + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0)
    return xn, rn


@triton.jit
def _fwd_rows_kernel(
    X, R, W, B, Y, S, MEAN, RSTD,
    M, N, stride_x, stride_r, stride_y, stride_s, eps, blocks_per_prog,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NB: tl.constexpr, PERSIST: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_RES: tl.constexpr, IS_RMS: tl.constexpr,
    ACC: tl.constexpr, EARLY_WB: tl.constexpr = False,
    ALIGN: tl.constexpr = 1,
):
    """[BLOCK_M, BLOCK_N] tiles (and, NB > 0, [BLOCK_M, NB] tiles of columns BLOCK_N ..), whole rows in
    registers. HBM: read x (+residual), write y (+sum).

    PERSIST=False: one tile per program, w/b loaded by every program (an L2 read per tile) after the
    statistics (loaded with x, as Liger does, measured 2-40 % slower on the H200: more live registers).
    PERSIST=True: ``blocks_per_prog`` consecutive tiles per program, w/b loaded once and held, the next
    tile's x (and residual) loaded before this tile's reductions.
    EARLY_WB (one tile per program): w/b loaded first, with x (``fwd_wb_early_min_block``; a variant).
    """
    N = known_multiple(N, ALIGN)
    stride_x = known_multiple(stride_x, ALIGN)
    stride_r = known_multiple(stride_r, ALIGN)
    stride_y = known_multiple(stride_y, ALIGN)
    stride_s = known_multiple(stride_s, ALIGN)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    w = tl.zeros([BLOCK_N], dtype=ACC)
    b = tl.zeros([BLOCK_N], dtype=ACC)
    if NB > 0:
        cols2 = BLOCK_N + tl.arange(0, NB)
        cmask2 = cols2 < N
        w2 = tl.zeros([NB], dtype=ACC)
        b2 = tl.zeros([NB], dtype=ACC)
    else:  # unused stand-ins
        cols2, cmask2, w2, b2 = cols, cmask, w, b
    if PERSIST or EARLY_WB:
        if HAS_W:
            w = tl.load(W + cols, mask=cmask, other=0.0).to(ACC)
            if NB > 0:
                w2 = tl.load(W + cols2, mask=cmask2, other=0.0).to(ACC)
        if HAS_B:
            b = tl.load(B + cols, mask=cmask, other=0.0).to(ACC)
            if NB > 0:
                b2 = tl.load(B + cols2, mask=cmask2, other=0.0).to(ACC)
        first = pid.to(tl.int64) * blocks_per_prog
        rows = first * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
        xn, rn = _fwd_load_next(X, R, rows, M, cols, cmask, stride_x, stride_r, HAS_RES)
        xn2, rn2 = xn, rn
        if NB > 0:
            xn2, rn2 = _fwd_load_next(X, R, rows, M, cols2, cmask2, stride_x, stride_r, HAS_RES)
        for i in range(0, blocks_per_prog):
            xv, rv, xv2, rv2 = xn, rn, xn2, rn2
            rows = rows + BLOCK_M
            lim = tl.where(i + 1 < blocks_per_prog, M, 0)
            xn, rn = _fwd_load_next(X, R, rows, lim, cols, cmask, stride_x, stride_r, HAS_RES)
            if NB > 0:
                xn2, rn2 = _fwd_load_next(X, R, rows, lim, cols2, cmask2, stride_x, stride_r, HAS_RES)
            _fwd_rows_tile(X, R, W, B, Y, S, MEAN, RSTD, w, b, w2, b2, (first + i) * BLOCK_M,
                           cols, cmask, cols2, cmask2, M, N, stride_x, stride_r, stride_y, stride_s, eps,
                           BLOCK_M, NB, False, HAS_W, HAS_B, HAS_RES, IS_RMS, ACC, xv, rv, xv2, rv2, True)
    else:
        _fwd_rows_tile(X, R, W, B, Y, S, MEAN, RSTD, w, b, w2, b2, pid.to(tl.int64) * BLOCK_M,
                       cols, cmask, cols2, cmask2, M, N, stride_x, stride_r, stride_y, stride_s, eps,
                       BLOCK_M, NB, not EARLY_WB, HAS_W, HAS_B, HAS_RES, IS_RMS, ACC, w, w, w, w, False)


# --------------------------------------------------------------------------------------------------
# forward, looped rows


@triton.jit
def _fwd_loop_kernel(
    X, R, W, B, Y, S, MEAN, RSTD,
    M, N, stride_x, stride_r, stride_y, stride_s, eps, iters,
    CHUNK: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_RES: tl.constexpr, IS_RMS: tl.constexpr,
    ACC: tl.constexpr,
    ALIGN: tl.constexpr = 1,
    VEC_ACC: tl.constexpr = False,
    EVICT_FIRST: tl.constexpr = False,
):
    """Persistent programs, each taking rows ``pid, pid + P, ...``; two loops over CHUNK-wide slices.

    Loop 1 reads x (and residual, writing the sum) and merges per-chunk (mean, M2) of ``x - x[0]``
    with Chan's formula (RMS: sums x^2; with VEC_ACC per lane across the chunks, one reduction a row
    instead of one a chunk). Loop 2 walks the row backwards, re-reading x (or the stored sum) while the
    latest chunks are still in L2 (EVICT_FIRST: marked as the last use), and writes y. The host sizes P
    so that the rows in flight fit in L2: 2 HBM passes then, 3 at worst.
    """
    N = known_multiple(N, ALIGN)
    stride_x = known_multiple(stride_x, ALIGN)
    stride_r = known_multiple(stride_r, ALIGN)
    stride_y = known_multiple(stride_y, ALIGN)
    stride_s = known_multiple(stride_s, ALIGN)
    P = tl.num_programs(0)
    offs = tl.arange(0, CHUNK)
    nchunks = tl.cdiv(N, CHUNK)
    for it in range(0, iters):
        row_i = tl.program_id(0) + it * P
        if row_i < M:
            row = row_i.to(tl.int64)
            xrow = X + row * stride_x
            rrow = R + row * stride_r
            yrow = Y + row * stride_y
            srow = S + row * stride_s
            mean = tl.zeros([], dtype=ACC)  # mean of x - shift
            m2 = tl.zeros([], dtype=ACC)
            lanes = tl.zeros([CHUNK], dtype=ACC)  # (VEC_ACC: RMS's sums of x^2 per lane)
            shift = tl.zeros([], dtype=ACC)
            if not IS_RMS:
                shift = tl.load(xrow).to(ACC)
                if HAS_RES:
                    shift = (shift + tl.load(rrow).to(ACC)).to(X.dtype.element_ty).to(ACC)
            for start in range(0, N, CHUNK):
                cols = start + offs
                cmask = cols < N
                xv = tl.load(xrow + cols, mask=cmask, other=0.0)
                if HAS_RES:
                    rv = tl.load(rrow + cols, mask=cmask, other=0.0)
                    sv = (xv.to(ACC) + rv.to(ACC)).to(xv.dtype)
                    tl.store(srow + cols, sv, mask=cmask)
                    x = sv.to(ACC)
                else:
                    x = xv.to(ACC)
                if IS_RMS:
                    if VEC_ACC:
                        lanes += x * x  # (0 past N: the loads' other)
                    else:
                        m2 += tl.sum(x * x, axis=0)
                else:
                    zero = tl.zeros([], dtype=tl.int32)
                    cnt = tl.minimum(N - start + zero, CHUNK).to(ACC)
                    xs = tl.where(cmask, x - shift, 0.0)
                    cmean = tl.sum(xs, axis=0) / cnt
                    d = tl.where(cmask, xs - cmean, 0.0)
                    cm2 = tl.sum(d * d, axis=0)
                    seen = (start + zero).to(ACC)
                    tot = seen + cnt
                    delta = cmean - mean
                    mean = mean + delta * (cnt / tot)
                    m2 = m2 + cm2 + delta * delta * (seen * cnt / tot)
            if IS_RMS and VEC_ACC:
                m2 = tl.sum(lanes, axis=0)
            rstd = _rsqrt(m2 / N + eps, ACC)
            tl.store(RSTD + row, rstd)
            if not IS_RMS:
                tl.store(MEAN + row, shift + mean)
            for i in range(0, nchunks):
                start = (nchunks - 1 - i) * CHUNK
                cols = start + offs
                cmask = cols < N
                src = srow if HAS_RES else xrow
                if EVICT_FIRST:
                    x = tl.load(src + cols, mask=cmask, other=0.0, eviction_policy="evict_first").to(ACC)
                else:
                    x = tl.load(src + cols, mask=cmask, other=0.0).to(ACC)
                if IS_RMS:
                    y = x * rstd
                else:
                    y = ((x - shift) - mean) * rstd
                if HAS_W:
                    y = y * tl.load(W + cols, mask=cmask, other=0.0).to(ACC)
                if HAS_B:
                    y = y + tl.load(B + cols, mask=cmask, other=0.0).to(ACC)
                tl.store(yrow + cols, y, mask=cmask)


# --------------------------------------------------------------------------------------------------
# forward, split rows: several programs per row, each holding one CHUNK in registers


@triton.jit
def _split_x(xv, cmask, shift, IS_RMS: tl.constexpr, ACC: tl.constexpr):
    """A loaded slice of a row in ACC (layer norm: ``x - shift``, 0 past N)."""
    x = xv.to(ACC)
    if not IS_RMS:
        x = tl.where(cmask, x - shift, 0.0)
    return x


@triton.jit
def _split_stats(ST, row, S, N, eps,
                 CHUNK: tl.constexpr, BLOCK_S: tl.constexpr, IS_RMS: tl.constexpr, ACC: tl.constexpr):
    """(mean of ``x - shift``, rstd) of a row, its S chunk pairs merged in a fixed order (both paths run
    this code: bit-identical statistics). ``.cg``: in the one-launch path other SMs wrote the pairs
    during this launch, and L1 is not coherent (a line may hold a neighbour row's stale pairs)."""
    ss = tl.arange(0, BLOCK_S)
    smask = ss < S
    means = tl.load(ST + (row * S + ss) * 2, mask=smask, other=0.0, cache_modifier=".cg")
    cnts = tl.where(smask, tl.minimum(N - ss * CHUNK, CHUNK), 0).to(ACC)
    mean = tl.zeros([], dtype=ACC)
    if IS_RMS:
        ms = tl.sum(means * cnts, axis=0) / N
        rstd = _rsqrt(ms + eps, ACC)
    else:
        m2s = tl.load(ST + (row * S + ss) * 2 + 1, mask=smask, other=0.0, cache_modifier=".cg")
        mean = tl.sum(means * cnts, axis=0) / N
        dm = tl.where(smask, means - mean, 0.0)
        m2 = tl.sum(m2s, axis=0) + tl.sum(cnts * dm * dm, axis=0)  # exact merge of the pairs
        rstd = _rsqrt(m2 / N + eps, ACC)
    return mean, rstd


@triton.jit
def _split_y(x, wv, bv, mean, rstd,
             HAS_W: tl.constexpr, HAS_B: tl.constexpr, IS_RMS: tl.constexpr, ACC: tl.constexpr):
    if IS_RMS:
        y = x * rstd
    else:
        y = (x - mean) * rstd
    if HAS_W:
        y = y * wv.to(ACC)
    if HAS_B:
        y = y + bv.to(ACC)
    return y


@triton.jit
def _fwd_split_kernel(
    X, W, B, Y, MEAN, RSTD, ST, CNT,
    M, N, stride_x, stride_y, eps, S,
    CHUNK: tl.constexpr, BLOCK_S: tl.constexpr, FUSED: tl.constexpr, FIN_BLOCK: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, IS_RMS: tl.constexpr, ACC: tl.constexpr,
    ALIGN: tl.constexpr = 1,
):
    """Program = (row, chunk): S = cdiv(N, CHUNK) programs per row, consecutive ids, the chunk held in
    registers. Each writes the chunk's (mean, M2) of ``x - x[row, 0]`` (RMS: mean of squares) to
    ST[row, s].

    FUSED (one launch): then counts itself in on the row's int32 CNT (acquire-release, GPU scope); the
    row's last program to arrive merges the S pairs, writes mean/rstd and y for the whole row in
    FIN_BLOCK-wide steps, re-reading x, which the row's programs (scheduled alongside) read moments
    before: L2 hits. HBM: read x once, write y (2 passes).
    Else (two launches) ``_fwd_split_apply_kernel`` writes y.
    """
    N = known_multiple(N, ALIGN)
    stride_x = known_multiple(stride_x, ALIGN)
    stride_y = known_multiple(stride_y, ALIGN)
    t = tl.program_id(0).to(tl.int64)
    row = t // S
    s = t % S
    xrow = X + row * stride_x
    yrow = Y + row * stride_y
    cols = s * CHUNK + tl.arange(0, CHUNK)
    cmask = cols < N
    shift = tl.zeros([], dtype=ACC)
    if not IS_RMS:
        shift = tl.load(xrow).to(ACC)
    x = _split_x(tl.load(xrow + cols, mask=cmask, other=0.0), cmask, shift, IS_RMS, ACC)
    zero = tl.zeros([], dtype=tl.int64)
    cnt = tl.minimum(N - s * CHUNK + zero, CHUNK).to(ACC)
    if IS_RMS:
        cmean = tl.sum(x * x, axis=0) / cnt  # mean of squares of the chunk
        cm2 = tl.zeros([], dtype=ACC)
    else:
        cmean = tl.sum(x, axis=0) / cnt
        d = tl.where(cmask, x - cmean, 0.0)
        cm2 = tl.sum(d * d, axis=0)
    tl.store(ST + (row * S + s) * 2, cmean)
    tl.store(ST + (row * S + s) * 2 + 1, cm2)
    if FUSED:
        # every thread's pair store before the counter's release; the acquire side (the last
        # program) then sees all S pairs
        tl.debug_barrier()
        old = tl.atomic_add(CNT + row, 1, sem="acq_rel", scope="gpu")
        if old == S - 1:
            mean, rstd = _split_stats(ST, row, S, N, eps, CHUNK, BLOCK_S, IS_RMS, ACC)
            tl.store(RSTD + row, rstd)
            if not IS_RMS:
                tl.store(MEAN + row, shift + mean)
            # the own chunk too is re-read (from L2): held across the counter it cost every program
            # ~4x the registers (H200: 212-254 vs 48-64 at 8192 / 8 warps, 1 CTA per SM), and
            # occupancy bounds the HBM reads of the first pass. Each step's loads (x, w, b) are issued
            # a step ahead: one program walks the row alone, at L2 latency
            fo = tl.arange(0, FIN_BLOCK)
            xn = tl.load(xrow + fo, mask=fo < N, other=0.0)
            wn = xn
            bn = xn
            if HAS_W:
                wn = tl.load(W + fo, mask=fo < N, other=0.0)
            if HAS_B:
                bn = tl.load(B + fo, mask=fo < N, other=0.0)
            for start in range(0, N, FIN_BLOCK):
                c = start + fo
                cm = c < N
                xv = xn
                wv = wn
                bv = bn
                nm = c + FIN_BLOCK < N
                xn = tl.load(xrow + c + FIN_BLOCK, mask=nm, other=0.0)
                if HAS_W:
                    wn = tl.load(W + c + FIN_BLOCK, mask=nm, other=0.0)
                if HAS_B:
                    bn = tl.load(B + c + FIN_BLOCK, mask=nm, other=0.0)
                xc = _split_x(xv, cm, shift, IS_RMS, ACC)
                tl.store(yrow + c, _split_y(xc, wv, bv, mean, rstd, HAS_W, HAS_B, IS_RMS, ACC), mask=cm)


@triton.jit
def _fwd_split_apply_kernel(
    X, W, B, Y, MEAN, RSTD, ST,
    M, N, stride_x, stride_y, eps, S,
    CHUNK: tl.constexpr, BLOCK_S: tl.constexpr, ROWS: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, IS_RMS: tl.constexpr, ACC: tl.constexpr,
    ALIGN: tl.constexpr = 1,
):
    """The two-launch split forward's second launch: program = (ROWS consecutive rows, chunk), the
    programs walked last-first (the end of the first launch's reads are L2 hits). The chunk's w/b are
    loaded once for its ROWS rows (a one-row program re-reads them from L2 per row: with fp32 w/b on
    16-bit x, 4x the row's own bytes). Per row: re-read the chunk (the next row's load issued before
    this row's arithmetic), merge the row's S pairs (``_split_stats``, as the one launch: the same
    statistics) and write the chunk's slice of y. HBM: read x twice, write y (3 passes at worst)."""
    N = known_multiple(N, ALIGN)
    stride_x = known_multiple(stride_x, ALIGN)
    stride_y = known_multiple(stride_y, ALIGN)
    t = (tl.num_programs(0) - 1 - tl.program_id(0)).to(tl.int64)
    r0 = (t // S) * ROWS
    s = t % S
    cols = s * CHUNK + tl.arange(0, CHUNK)
    cmask = cols < N
    wv = tl.zeros([CHUNK], dtype=ACC)
    bv = wv
    if HAS_W:
        wv = tl.load(W + cols, mask=cmask, other=0.0)
    if HAS_B:
        bv = tl.load(B + cols, mask=cmask, other=0.0)
    # rows past M (the last block) redo row M - 1 and store nothing
    xn = tl.load(X + r0 * stride_x + cols, mask=cmask, other=0.0)
    for i in tl.static_range(ROWS):
        ok = r0 + i < M
        row = tl.minimum(r0 + i, M - 1)
        xv = xn
        if i + 1 < ROWS:
            xn = tl.load(X + tl.minimum(row + 1, M - 1) * stride_x + cols, mask=cmask, other=0.0)
        shift = tl.zeros([], dtype=ACC)
        if not IS_RMS:
            shift = tl.load(X + row * stride_x).to(ACC)
        mean, rstd = _split_stats(ST, row, S, N, eps, CHUNK, BLOCK_S, IS_RMS, ACC)
        if s == 0:
            if ok:
                tl.store(RSTD + row, rstd)
                if not IS_RMS:
                    tl.store(MEAN + row, shift + mean)
        x = _split_x(xv, cmask, shift, IS_RMS, ACC)
        tl.store(Y + row * stride_y + cols, _split_y(x, wv, bv, mean, rstd, HAS_W, HAS_B, IS_RMS, ACC),
                 mask=cmask & (r0 + i + tl.zeros_like(cols) < M))
