"""Layer / RMS norm's backward kernels: rows in registers (plain and prefetching), wide rows (row sums, then a
column-tiled dx + dw / db pass; or the cooperative kernel), and the fixed-order dw / db reduction."""

import triton
import triton.language as tl

from normkit.kernels._jit import known_multiple
from normkit.kernels._launch import gdc_launch_dependents, gdc_wait


# --------------------------------------------------------------------------------------------------
# backward, rows in registers


@triton.jit
def _dx_from_sums(wdy, xhat, c1, c2, rstd, IS_RMS: tl.constexpr):
    """dx = (w*dy - xhat*c1 - c2) * rstd per row, c1 = mean(w*dy*xhat), c2 = mean(w*dy) (RMS: no c2)."""
    if IS_RMS:
        dx = (wdy - xhat * c1[:, None]) * rstd[:, None]
    else:
        dx = (wdy - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
    return dx


@triton.jit
def _bwd_block(x, dy, mean, rstd, W, w_held, cols, cmask, N, dw_acc, db_acc,
               HAS_W: tl.constexpr, IS_RMS: tl.constexpr, NEED_DW: tl.constexpr, NEED_DB: tl.constexpr,
               STORE_DX: tl.constexpr, HOLD_W: tl.constexpr, ACC: tl.constexpr):
    """One [rows, N] block of the backward from registers: dw/db accumulated, dx returned (0 when
    STORE_DX is off). Masked columns: xhat is junk there but dy is 0, so it reaches no sum and no store."""
    if IS_RMS:
        xhat = x * rstd[:, None]
    else:
        xhat = (x - mean[:, None]) * rstd[:, None]
    if NEED_DW:
        dw_acc += dy * xhat
    if NEED_DB:
        db_acc += dy
    dx = dy
    if STORE_DX:
        if HAS_W:
            if HOLD_W:  # loaded once by the program
                w = w_held
            else:  # reloaded per row block (an L1/L2 hit): registers are the limit
                w = tl.load(W + cols, mask=cmask, other=0.0).to(ACC)
            wdy = dy * w[None, :]
        else:
            wdy = dy
        c1 = tl.sum(wdy * xhat, axis=1) / N
        c2 = c1
        if not IS_RMS:
            c2 = tl.sum(wdy, axis=1) / N
        dx = _dx_from_sums(wdy, xhat, c1, c2, rstd, IS_RMS)
    return dx, dw_acc, db_acc


@triton.jit
def _bwd_load_block(DY, X, MEAN, RSTD, rows, lim, cols, cmask, stride_dy, stride_x,
                    IS_RMS: tl.constexpr, ACC: tl.constexpr):
    """x, dy (input dtype), mean, rstd of one row block; rows >= lim are masked off."""
    rmask = rows < lim
    mask = rmask[:, None] & cmask[None, :]
    xv = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    dyv = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0)
    rstd = tl.load(RSTD + rows, mask=rmask, other=0.0).to(ACC)
    if IS_RMS:
        mean = rstd  # RMS has no mean; _bwd_block ignores it
    else:
        mean = tl.load(MEAN + rows, mask=rmask, other=0.0).to(ACC)
    return xv, dyv, mean, rstd


@triton.jit
def _bwd_rows_kernel(
    DY, X, W, MEAN, RSTD, DX, DWP, DBP,
    M, N, stride_dy, stride_x, stride_dx, blocks_per_prog,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_W: tl.constexpr, IS_RMS: tl.constexpr,
    STORE_DX: tl.constexpr, NEED_DW: tl.constexpr, NEED_DB: tl.constexpr, HOLD_W: tl.constexpr,
    ACC: tl.constexpr, PDL: tl.constexpr = False, STAGES: tl.constexpr = 1,
    ALIGN: tl.constexpr = 1,
):
    """Each program walks ``blocks_per_prog`` consecutive [BLOCK_M, BLOCK_N] row blocks (HOLD_W: w
    loaded once, held in registers; else reloaded per block). STAGES > 1: the walk software-pipelined by
    Triton (the next blocks' x / dy copied into shared memory STAGES - 1 blocks ahead; the same sums).

    dx per row from the two row sums; dy*xhat and dy summed over the program's rows in registers and
    written once as row ``pid`` of the (P, N) partials. HBM: read x, dy, write dx (3 passes) + P*N.
    """
    N = known_multiple(N, ALIGN)
    stride_dy = known_multiple(stride_dy, ALIGN)
    stride_x = known_multiple(stride_x, ALIGN)
    stride_dx = known_multiple(stride_dx, ALIGN)
    if PDL:  # the dw/db reduction may launch once every program has started (it waits for them)
        gdc_launch_dependents()
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    dw_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=ACC)
    db_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=ACC)
    first = pid.to(tl.int64) * blocks_per_prog
    w_held = dw_acc
    if HOLD_W and HAS_W and STORE_DX:
        w_held = tl.load(W + cols, mask=cmask, other=0.0).to(ACC)
    for i in tl.range(0, blocks_per_prog, num_stages=STAGES):
        rows = (first + i) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
        xv, dyv, mean, rstd = _bwd_load_block(DY, X, MEAN, RSTD, rows, M, cols, cmask, stride_dy, stride_x,
                                              IS_RMS, ACC)
        dx, dw_acc, db_acc = _bwd_block(xv.to(ACC), dyv.to(ACC), mean, rstd, W, w_held, cols, cmask, N,
                                        dw_acc, db_acc, HAS_W, IS_RMS, NEED_DW, NEED_DB, STORE_DX, HOLD_W, ACC)
        if STORE_DX:
            mask = (rows < M)[:, None] & cmask[None, :]
            tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx, mask=mask)
    if NEED_DW:
        tl.store(DWP + pid.to(tl.int64) * N + cols, tl.sum(dw_acc, axis=0), mask=cmask)
    if NEED_DB:
        tl.store(DBP + pid.to(tl.int64) * N + cols, tl.sum(db_acc, axis=0), mask=cmask)


@triton.jit
def _bwd_db_rows_kernel(DY, DBP, M, N, stride_dy, blocks_per_prog,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACC: tl.constexpr,
                        ALIGN: tl.constexpr = 1):
    """db partials for ``_bwd_rows_kernel`` run without its db accumulator: program ``pid`` sums dy over
    the same row blocks, in the same order, into row ``pid`` of (P, N) (the bits the rows kernel's
    accumulator gives). The next two blocks' loads are issued before this one is added. HBM: read dy."""
    N = known_multiple(N, ALIGN)
    stride_dy = known_multiple(stride_dy, ALIGN)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=ACC)
    rows = pid.to(tl.int64) * blocks_per_prog * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    base = DY + cols[None, :]
    a = tl.load(base + rows[:, None] * stride_dy, mask=(rows < M)[:, None] & cmask[None, :], other=0.0)
    nxt = rows + BLOCK_M
    lim = tl.where(1 < blocks_per_prog, M, 0)  # past the program's last block: masked off
    b = tl.load(base + nxt[:, None] * stride_dy, mask=(nxt < lim)[:, None] & cmask[None, :], other=0.0)
    for i in range(0, blocks_per_prog):
        cur = a
        a = b
        nxt = rows + (i + 2) * BLOCK_M
        lim = tl.where(i + 2 < blocks_per_prog, M, 0)
        b = tl.load(base + nxt[:, None] * stride_dy, mask=(nxt < lim)[:, None] & cmask[None, :], other=0.0)
        acc += cur.to(ACC)
    tl.store(DBP + pid.to(tl.int64) * N + cols, tl.sum(acc, axis=0), mask=cmask)


@triton.jit
def _bwd_rows_pf_kernel(
    DY, X, W, MEAN, RSTD, DX, DWP, DBP,
    M, N, stride_dy, stride_x, stride_dx, blocks_per_prog,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_W: tl.constexpr, IS_RMS: tl.constexpr,
    STORE_DX: tl.constexpr, NEED_DW: tl.constexpr, NEED_DB: tl.constexpr,
    ACC: tl.constexpr, HOLD_W: tl.constexpr = False, PDL: tl.constexpr = False,
    ALIGN: tl.constexpr = 1,
):
    """``_bwd_rows_kernel`` software-pipelined by hand: the loads of the next two row blocks (x, dy kept
    in the input dtype: half the registers of fp32; mean/rstd) are issued before this block's row
    reductions, so that HBM reads stay in flight while the program reduces (the plain kernel issues
    nothing during its reductions; Triton pipelines a loop without a dot only as ``tl.range(num_stages=k)``,
    through shared memory, which at 16384 wide rows costs stack and shared memory). Same math,
    same partial layout (row ``pid`` of (P, N)), same accumulation order per program as the plain kernel.
    HOLD_W: w loaded once per program and held (as the plain kernel's HOLD_W), else reloaded per block.
    """
    N = known_multiple(N, ALIGN)
    stride_dy = known_multiple(stride_dy, ALIGN)
    stride_x = known_multiple(stride_x, ALIGN)
    stride_dx = known_multiple(stride_dx, ALIGN)
    if PDL:  # the dw/db reduction may launch once every program has started (it waits for them)
        gdc_launch_dependents()
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    dw_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=ACC)
    db_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=ACC)
    rows = pid.to(tl.int64) * blocks_per_prog * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    # stage a: the block computed next; stage b: the one after
    w_held = dw_acc
    if HOLD_W and HAS_W and STORE_DX:
        w_held = tl.load(W + cols, mask=cmask, other=0.0).to(ACC)
    xa, dya, meana, rstda = _bwd_load_block(DY, X, MEAN, RSTD, rows, M, cols, cmask, stride_dy, stride_x,
                                            IS_RMS, ACC)
    xb, dyb, meanb, rstdb = _bwd_load_block(DY, X, MEAN, RSTD, rows + BLOCK_M,
                                            tl.where(1 < blocks_per_prog, M, 0), cols, cmask,
                                            stride_dy, stride_x, IS_RMS, ACC)
    for i in range(0, blocks_per_prog):
        x = xa.to(ACC)
        dy = dya.to(ACC)
        rstd = rstda
        mean = meana
        cur = rows
        rows = rows + BLOCK_M
        # issue the loads two blocks ahead now (masked off past this program's last block)
        xa, dya, meana, rstda = xb, dyb, meanb, rstdb
        xb, dyb, meanb, rstdb = _bwd_load_block(DY, X, MEAN, RSTD, rows + BLOCK_M,
                                                tl.where(i + 2 < blocks_per_prog, M, 0), cols, cmask,
                                                stride_dy, stride_x, IS_RMS, ACC)
        # w reloaded per block by default: holding it lost with w in x's dtype (sweep "bwdpfhold"
        # 2026-12-01: LN bf16 / fp16 8192x8192 0.1281 / 0.1189 -> 0.1383 / 0.1396 ms; RMS 2-3 % faster)
        dx, dw_acc, db_acc = _bwd_block(x, dy, mean, rstd, W, w_held, cols, cmask, N, dw_acc, db_acc,
                                        HAS_W, IS_RMS, NEED_DW, NEED_DB, STORE_DX, HOLD_W, ACC)
        if STORE_DX:
            smask = (cur < M)[:, None] & cmask[None, :]
            tl.store(DX + cur[:, None] * stride_dx + cols[None, :], dx, mask=smask)
    if NEED_DW:
        tl.store(DWP + pid.to(tl.int64) * N + cols, tl.sum(dw_acc, axis=0), mask=cmask)
    if NEED_DB:
        tl.store(DBP + pid.to(tl.int64) * N + cols, tl.sum(db_acc, axis=0), mask=cmask)


# --------------------------------------------------------------------------------------------------
# backward, wide rows: row sums, then a column-tiled dx + dw/db kernel


@triton.jit
def _row_terms(X, DY, W, row, cols, cmask, stride_x, stride_dy, mean, rstd,
               HAS_W: tl.constexpr, IS_RMS: tl.constexpr, ACC: tl.constexpr):
    """(dy, w*dy, xhat) on one row's columns ``cols``; xhat is 0 on masked columns."""
    x = tl.load(X + row * stride_x + cols, mask=cmask, other=0.0).to(ACC)
    dy = tl.load(DY + row * stride_dy + cols, mask=cmask, other=0.0).to(ACC)
    wdy = dy
    if HAS_W:
        wdy = dy * tl.load(W + cols, mask=cmask, other=0.0).to(ACC)
    if IS_RMS:
        xhat = x * rstd
    else:
        xhat = tl.where(cmask, (x - mean) * rstd, 0.0)
    return dy, wdy, xhat


@triton.jit
def _bwd_rowsum_kernel(
    DY, X, W, MEAN, RSTD, C,
    N, stride_dy, stride_x,
    CHUNK: tl.constexpr, HAS_W: tl.constexpr, IS_RMS: tl.constexpr, ACC: tl.constexpr,
    STAGES: tl.constexpr = 1,
    ALIGN: tl.constexpr = 1,
):
    """One program per row: C[row] = (sum(w*dy*xhat)/N, sum(w*dy)/N). HBM: read x, dy. STAGES > 1: the
    loop software-pipelined by Triton (loads issued that many chunks ahead, through shared memory)."""
    N = known_multiple(N, ALIGN)
    stride_dy = known_multiple(stride_dy, ALIGN)
    stride_x = known_multiple(stride_x, ALIGN)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, CHUNK)
    rstd = tl.load(RSTD + row).to(ACC)
    mean = rstd
    if not IS_RMS:
        mean = tl.load(MEAN + row).to(ACC)
    s1 = tl.zeros([CHUNK], dtype=ACC)
    s2 = tl.zeros([CHUNK], dtype=ACC)
    for start in tl.range(0, N, CHUNK, num_stages=STAGES):
        cols = start + offs
        cmask = cols < N
        _, wdy, xhat = _row_terms(X, DY, W, row, cols, cmask, stride_x, stride_dy, mean, rstd,
                                  HAS_W, IS_RMS, ACC)
        s1 += wdy * xhat
        s2 += wdy
    tl.store(C + row * 2, tl.sum(s1, axis=0) / N)
    tl.store(C + row * 2 + 1, tl.sum(s2, axis=0) / N)


@triton.jit
def _bwd_cols_kernel(
    DY, X, W, MEAN, RSTD, C, DX, DWP, DBP,
    M, N, stride_dy, stride_x, stride_dx, rows_per_group,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_W: tl.constexpr, IS_RMS: tl.constexpr,
    STORE_DX: tl.constexpr, NEED_DW: tl.constexpr, NEED_DB: tl.constexpr,
    ACC: tl.constexpr, PDL: tl.constexpr = False, STAGES: tl.constexpr = 1,
    ALIGN: tl.constexpr = 1,
):
    """Program (column block, row group): dx for its tile of every row of the group, dw/db partials.

    Row groups and the rows inside them are walked last-first, the reverse of the row-sum kernel.
    HBM: read x, dy, write dx (3 passes; 5 with the row-sum kernel) + G*N partials. STAGES > 1: the
    loop software-pipelined by Triton.
    """
    N = known_multiple(N, ALIGN)
    stride_dy = known_multiple(stride_dy, ALIGN)
    stride_x = known_multiple(stride_x, ALIGN)
    stride_dx = known_multiple(stride_dx, ALIGN)
    if PDL:  # the dw/db reduction may launch once every program has started (it waits for them)
        gdc_launch_dependents()
    pid_n = tl.program_id(0)
    g = tl.num_programs(1) - 1 - tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    if HAS_W:
        w = tl.load(W + cols, mask=cmask, other=0.0).to(ACC)
    dw_acc = tl.zeros([BLOCK_R, BLOCK_N], dtype=ACC)
    db_acc = tl.zeros([BLOCK_R, BLOCK_N], dtype=ACC)
    row0 = g.to(tl.int64) * rows_per_group
    nsteps = tl.cdiv(rows_per_group, BLOCK_R)
    for i in tl.range(0, nsteps, num_stages=STAGES):
        rows = row0 + (nsteps - 1 - i) * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
        rmask = (rows < M) & (rows < row0 + rows_per_group)
        mask = rmask[:, None] & cmask[None, :]
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(ACC)
        dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(ACC)
        rstd = tl.load(RSTD + rows, mask=rmask, other=0.0).to(ACC)
        if IS_RMS:
            xhat = x * rstd[:, None]
        else:
            mean = tl.load(MEAN + rows, mask=rmask, other=0.0).to(ACC)
            xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        if NEED_DW:
            dw_acc += dy * xhat
        if NEED_DB:
            db_acc += dy
        if STORE_DX:
            c1 = tl.load(C + rows * 2, mask=rmask, other=0.0)
            if HAS_W:
                wdy = dy * w[None, :]
            else:
                wdy = dy
            c2 = c1
            if not IS_RMS:
                c2 = tl.load(C + rows * 2 + 1, mask=rmask, other=0.0)
            dx = _dx_from_sums(wdy, xhat, c1, c2, rstd, IS_RMS)
            tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx, mask=mask)
    if NEED_DW:
        tl.store(DWP + g.to(tl.int64) * N + cols, tl.sum(dw_acc, axis=0), mask=cmask)
    if NEED_DB:
        tl.store(DBP + g.to(tl.int64) * N + cols, tl.sum(db_acc, axis=0), mask=cmask)


@triton.jit
def _coop_exchange(CNT_AT, S):
    """The cooperative backward's exchange, after a program stored its chunk's sums: count in on the
    counter (release: every thread's stores first), then wait until all S programs have (acquire: their
    sums are visible afterwards; read them with .cg, L1 is not coherent)."""
    tl.debug_barrier()
    tl.atomic_add(CNT_AT, 1, sem="release", scope="gpu")
    arrived = tl.atomic_add(CNT_AT, 0, sem="acquire", scope="gpu")
    while arrived < S:
        arrived = tl.atomic_add(CNT_AT, 0, sem="acquire", scope="gpu")


@triton.jit
def _bwd_coop_kernel(
    DY, X, W, MEAN, RSTD, ST, CNT, DX, DWP, DBP,
    M, N, stride_dy, stride_x, stride_dx, rows_per_group, S,
    CHUNK: tl.constexpr, BLOCK_S: tl.constexpr,
    HAS_W: tl.constexpr, IS_RMS: tl.constexpr,
    STORE_DX: tl.constexpr, NEED_DW: tl.constexpr, NEED_DB: tl.constexpr,
    ACC: tl.constexpr, PDL: tl.constexpr = False,
    ALIGN: tl.constexpr = 1,
):
    """Cooperative wide backward. Program = (row group g, chunk s) from a ticket (CNT[M]): a group's S
    programs draw consecutive tickets, so a program only ever waits for programs that already run (no
    deadlock while S programs fit the GPU). They walk the group's rows in step. Per row each adds its
    chunk's dw/db terms to registers; with dx, it writes the chunk's sums of w*dy*xhat and w*dy to
    ST[row, s], counts itself in on CNT[row] (release), waits until all S have (acquire), merges the S
    sums in chunk order (every program gets the same bits) and writes its own dx slice from the
    registers it holds. At the end each writes its dw/db partials to row g of (G, N).
    HBM: read x and dy once, write dx (3 passes; row sums + column kernel: 5).
    Never under the interpreter with S > 1 (programs run one after another)."""
    N = known_multiple(N, ALIGN)
    stride_dy = known_multiple(stride_dy, ALIGN)
    stride_x = known_multiple(stride_x, ALIGN)
    stride_dx = known_multiple(stride_dx, ALIGN)
    if PDL:  # the dw/db reduction may launch once every program has started (it waits for them)
        gdc_launch_dependents()
    t = tl.atomic_add(CNT + M, 1, sem="relaxed", scope="gpu")
    g = (t // S).to(tl.int64)
    s = t % S
    cols = s * CHUNK + tl.arange(0, CHUNK)
    cmask = cols < N
    dw_acc = tl.zeros([CHUNK], dtype=ACC)
    db_acc = tl.zeros([CHUNK], dtype=ACC)
    row0 = g * rows_per_group
    row_end = tl.minimum(row0 + rows_per_group, M)
    so = tl.arange(0, BLOCK_S)
    for row in range(row0, row_end):
        rstd = tl.load(RSTD + row).to(ACC)
        mean = rstd
        if not IS_RMS:
            mean = tl.load(MEAN + row).to(ACC)
        dy, wdy, xhat = _row_terms(X, DY, W, row, cols, cmask, stride_x, stride_dy, mean, rstd,
                                   HAS_W, IS_RMS, ACC)
        if NEED_DW:
            dw_acc += dy * xhat
        if NEED_DB:
            db_acc += dy
        if STORE_DX:
            tl.store(ST + (row * S + s) * 2, tl.sum(wdy * xhat, axis=0))
            tl.store(ST + (row * S + s) * 2 + 1, tl.sum(wdy, axis=0))
            _coop_exchange(CNT + row, S)
            sm = so < S
            c1 = tl.sum(tl.load(ST + (row * S + so) * 2, mask=sm, other=0.0, cache_modifier=".cg"), axis=0) / N
            if IS_RMS:
                dx = (wdy - xhat * c1) * rstd
            else:
                c2 = tl.sum(tl.load(ST + (row * S + so) * 2 + 1, mask=sm, other=0.0, cache_modifier=".cg"),
                            axis=0) / N
                dx = (wdy - xhat * c1 - c2) * rstd
            tl.store(DX + row * stride_dx + cols, dx, mask=cmask)
    if NEED_DW:
        tl.store(DWP + g * N + cols, dw_acc, mask=cmask)
    if NEED_DB:
        tl.store(DBP + g * N + cols, db_acc, mask=cmask)


@triton.jit
def _reduce_partials_kernel(P_PTR, OUT0, OUT1, P, N, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
                            PDL: tl.constexpr = False, ALIGN: tl.constexpr = 1):
    """OUT_k[n] = sum_p P_PTR[k, p, n] in a fixed order (deterministic); k = program_id(1) picks dw
    (OUT0) or db (OUT1), so both reduce in one launch. Reads the (k, P, N) partials once. PDL: launched
    while the backward kernel runs, waits for it before reading the partials."""
    N = known_multiple(N, ALIGN)
    if PDL:
        gdc_wait()
    pid = tl.program_id(0)
    k = tl.program_id(1)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    base = P_PTR + k.to(tl.int64) * P * N
    acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=P_PTR.dtype.element_ty)
    for p0 in range(0, P, BLOCK_P):
        ps = p0 + tl.arange(0, BLOCK_P)
        m = (ps < P)[:, None] & cmask[None, :]
        acc += tl.load(base + ps.to(tl.int64)[:, None] * N + cols[None, :], mask=m, other=0.0)
    tot = tl.sum(acc, axis=0)
    if k == 0:
        tl.store(OUT0 + cols, tot, mask=cmask)
    else:
        tl.store(OUT1 + cols, tot, mask=cmask)
