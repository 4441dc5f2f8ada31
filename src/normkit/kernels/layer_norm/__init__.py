"""Layer norm and RMS norm: Triton kernels and their host launchers.

Inputs are 2-D ``(M, N)`` row views (the ops layer flattens ``normalized_shape``): the last stride must
be 1, the row stride may be anything (it is a kernel argument). Outputs are allocated contiguous.
No validation, no autograd, no host synchronisation here (CUDA-graph and ``torch.compile`` safe).

Regimes, picked by the row width N (``BLOCK_N = next_pow2(N)``; defaults in ``_CFG``, chosen from the
H200 sweep of 2026-11-30, ``benchmarks/ln_kernels.py --sweep``). Forward:

* ``BLOCK_N <= 16384`` (``'fwd_max_block'``): ``_fwd_rows_kernel``,
  one ``[BLOCK_M, BLOCK_N]`` tile per program, several rows per program up to 1024 wide
  (``BLOCK_M * BLOCK_N ~ 4K`` elements), one row above (4 where weight/bias are wider than x,
  ``'fwd_rows_wide_params'``: w/b read from L2 once per 4 rows). Read x, write y: 2 HBM passes.
  Widths of the 16384 class and up to 24576 that are not powers of two (``'fwd_two_part_min_block'``,
  ``'fwd_two_part_max'``) are held as two power-of-two column parts, 12288 = 8192 + 4096 and 20480 =
  16384 + 4096 lanes instead of 16384 and 32768 (narrower ones lost with two parts: twice the row
  reductions), persistent as below (``'fwd_persist_two_part'``).
* ``8192 <= BLOCK_N <= 16384`` with weight/bias wider than x (``'fwd_persist_min_block_wide_params'``
  .. ``'fwd_persist_max_block'``): the same kernel, persistent (1 program per SM): w/b loaded once per
  program instead of once per row, the next tile's x (and residual) loaded before this tile's
  reductions. 2 passes. (Persistent programs lost at 4096, and at 16384 where w/b are as narrow as x.)
* ``BLOCK_N >= 32768`` without residual (``'fwd_split_min_block'``): ``_fwd_split_kernel``, (row, chunk)
  programs, a row's chunks at consecutive ids, each chunk in registers. Up to 65536
  (``'fwd_split_fused_max_block'``), one launch with 16384-wide chunks: each program writes its chunk's
  (mean, M2) and counts itself in on a per-row int32 counter (an integer atomic; no float atomics); the
  row's last program to arrive merges the pairs in a fixed order and writes y for the whole row,
  re-reading x while the row's reads are still in L2. 2 passes (bf16 2048x65536 LN / RMS 0.193 / 0.170
  ms, two launches 0.212 / 0.194). Wider, where that last program's pass over the row is the kernel's
  tail, two launches with 4096-wide chunks: the first writes the pairs, the second (walking the rows
  last-first, so the end of the first launch's reads are L2 hits) merges them, re-reads x and writes y;
  3 passes at worst (bf16 512x262144 LN 0.221 ms, one launch 0.226). Both merge the pairs the same
  way: with the same chunk, the same bits. Layer norm with 16-bit x and fp32 w and b (more parameter
  bytes per column than twice x's, ``'fwd_split_fused_max_block_heavy_params'``) takes the two launches
  at every split width, the second with 8 rows per program, each w/b chunk loaded once for them
  (``'fwd_split_apply_rows_heavy_params'``; 2048x65536 0.294 -> 0.209 ms, 512x262144 0.240 -> 0.210).
* fp32 layer norm's one-row forward from 16384 wide runs at most 64 registers a thread (``'fwd_maxnreg'``):
  two 16-warp programs per SM instead of one, no spill (4096x16384 0.154 -> 0.136 ms).
* ``BLOCK_N > 16384`` with a residual (``add_*_forward``): ``_fwd_loop_kernel``, persistent programs
  (4 per SM) each looping twice over a row in chunks, the second loop walking backwards over the stored
  sum so that it re-reads the most recently written chunks from L2: read x and residual, write s and y,
  plus at worst one re-read of s (4-5 passes).

Backward (P persistent programs, each walking consecutive row blocks; dy*xhat and dy summed in
registers and written once as fp32 partials ``(P, N)``, reduced over P by one more small launch in a
fixed order, 32-column x 128-row blocks):

* ``BLOCK_N <= 256``: ``_bwd_rows_kernel`` (plain), several rows per program (``BLOCK_M * BLOCK_N ~ 4K``),
  ``32 / num_warps`` programs per SM. Read x, dy, write dx: 3 passes. (The prefetching kernel measured
  slower here: 1048576x64 0.1107 vs 0.1371 ms.)
* ``BLOCK_N`` 512 or 1024 (``'bwd_pf_min_block'`` .. ``'bwd_pf_max_block'``): ``_bwd_rows_pf_kernel``,
  the next two row blocks' loads issued before this block's row reductions; 1024-element tiles, 8
  elements per thread (4 warps), 4 programs per SM. 3 passes.
* ``2048 <= BLOCK_N <= 8192`` (``'bwd_pf_wide_max_block'``): the prefetching kernel, one row per block,
  8 elements per thread, 1 program per SM, two blocks ahead; at 4096 (``'bwd_pf_mid_block'``) 16
  elements per thread and 2 programs per SM; at 2048 (``'bwd_pf_2k_block'``) 16 elements per thread
  and 4 programs per SM. 3 passes. Rows of more than 16 KB
  (``'bwd_pf_wide_max_row_bytes'``: fp32 at 8192) and w wider than x (``'bwd_pf_wide_params'``) take the
  plain kernel instead, each persistent program holding w in registers (``'bwd_hold_w'``).
* ``BLOCK_N == 16384``, RMS only (``'bwd_max_block'``; ``'bwd_max_block_ln'`` = 8192 because the layer
  norm's extra accumulator spills at 16K): the plain kernel, one row per program, w held. 3 passes.
  Layer norm there with 16-bit x and w/b, rows of 12288 and more (``'bwd_db_split_min_width'``): the same
  kernel without the db accumulator, and ``_bwd_db_rows_kernel`` summing db over the same row blocks (the
  same bits). 4 passes (bf16 4096x16384 0.178 ms against the cooperative kernel's 0.206).
* wider, up to 65536 (16-bit inputs: 16384; ``'bwd_coop_max_block'``): ``_bwd_coop_kernel``, (row group,
  chunk) programs in ticket order; per row each chunk program publishes its two row sums, waits until
  the row's other programs have (acquire/release counters), and writes its dx slice from registers.
  3 passes (fp32 2048x65536 LN 0.751 -> 0.565 ms against the column path).
* wider still: a row-sum kernel (reads x, dy) and a column-tiled kernel (reads x, dy, writes dx,
  accumulates dw/db partials over a row group, walking the rows in the reverse order so the tail of the
  first kernel's reads hit L2): 5 passes at worst. Both loops are software-pipelined by Triton
  (``'bwd_rowsum_stages'``, ``'bwd_cols_stages'`` = 3: cp.async copies two steps ahead; bf16 LN
  2048x65536 0.480 -> 0.365 ms).

The timings quoted above are bf16 (CUDA-graph replay, H200, 2026-11-30) unless marked fp32; earlier
measurements of the default kernels: ``benchmarks/NOTES-layer_norm.md``.

Numerics: fp32 accumulation (fp64 for fp64 inputs); mean/rstd in fp32 (fp64 for fp64). Layer norm
works on ``x - x[row, 0]`` (exact for nearby values, so a +1000 offset costs no digits in ``x - mean``);
the variance is computed from ``x - mean`` held in registers (two passes over registers), and in the
looped regime from per-chunk (mean, M2) pairs merged with Chan's formula; never ``E[x^2] - E[x]^2``. ``rstd =
rsqrt(var + eps)``. RMS: ``rstd = rsqrt(mean(x^2) + eps)``, ``y = (x * rstd) * w`` in fp32, then cast.
dw/db are accumulated in fp32 per program and reduced in a fixed order: bitwise deterministic, no atomics.

Modules: this one holds the launchers (what ``normkit.ops`` calls); ``_config`` the tunables (``_CFG``) and the
width heuristics; ``_fwd_kernels`` and ``_bwd_kernels`` the Triton kernels.
"""

from __future__ import annotations

import functools

import torch
import triton.language as tl

from normkit.kernels import cdiv, dense_param, interpreting, next_pow2
from normkit.kernels import _plan
from normkit.kernels._jit import alignment_hint
from normkit.kernels._launch import alloc, fit_stages, launch, pdl_follow, pdl_on, pdl_trigger
from normkit.kernels.layer_norm._bwd_kernels import (_bwd_cols_kernel, _bwd_coop_kernel, _bwd_db_rows_kernel,
                                                     _bwd_rows_kernel, _bwd_rows_pf_kernel, _bwd_rowsum_kernel,
                                                     _reduce_partials_kernel)
from normkit.kernels.layer_norm._config import _CFG, _coop_warps, _rows_cfg, _two_part_warps, _two_parts
from normkit.kernels.layer_norm._fwd_kernels import (_fwd_loop_kernel, _fwd_rows_kernel, _fwd_split_apply_kernel,
                                                     _fwd_split_kernel)

__all__ = [
    "ln_forward",
    "ln_backward",
    "rms_forward",
    "rms_backward",
    "add_ln_forward",
    "add_rms_forward",
    "supports",
]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def supports(x2d, *params) -> bool:
    """Whether these kernels handle this input: fp16/bf16/fp32/fp64 2-D rows on CUDA (or on CPU under
    TRITON_INTERPRET=1); weight/bias (any of ``params``, None allowed) in the input dtype or fp32."""
    from normkit.kernels import runs_kernels_on

    if not isinstance(x2d, torch.Tensor) or x2d.dim() != 2 or x2d.dtype not in _DTYPES:
        return False
    if not runs_kernels_on(x2d):
        return False
    for p in params:
        if p is None:
            continue
        if p.device != x2d.device or p.dtype not in (x2d.dtype, torch.float32) or p.dim() != 1:
            return False
        if p.numel() != x2d.shape[1]:
            return False
    return True


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _num_sms(t: torch.Tensor) -> int:
    if t.device.type == "cuda":
        return _sm_count(t.device.index if t.device.index is not None else torch.cuda.current_device())
    return 4  # interpreter: a few programs, so that the multi-row loops are exercised


def _alloc(shape, dtype, device):
    """Every output and scratch buffer comes from here (tests swap in a NaN-filling version); noted for
    a launch plan being recorded (the zeroed ones are not: a call that needs them gets no plan)."""
    return alloc(torch.empty(shape, dtype=dtype, device=device))


def _acc(dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _stat_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _rows(t: torch.Tensor) -> torch.Tensor:
    """Rows with unit last stride (copied once otherwise)."""
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        t = t.contiguous()
    return t


def _row_stride(t: torch.Tensor) -> int:
    return t.stride(0) if t.shape[0] > 1 else t.shape[1]


def _align(*values) -> int:
    """ALIGN of the kernels: ``alignment_hint`` of the row length and strides, 1 with ``row_align`` off."""
    return alignment_hint(*values) if _CFG["row_align"] else 1


def _loop_programs(x, M, row_bytes):
    """Programs of the looped forward: enough to fill the GPU, few enough that the rows in flight
    (re-read by the second loop) fit in ``_CFG['l2_budget']`` bytes of L2."""
    budget = _CFG["l2_budget"]
    P = _num_sms(x) * _CFG["loop_progs_per_sm"]
    if budget:
        P = min(P, max(_num_sms(x) // 2, budget // max(1, row_bytes)))
    return max(1, min(M, P))


def _coop_chunk(x, N, BLOCK_N):
    """The chunk of the cooperative wide backward (a row's programs wait for each other), or 0 where it
    is off (past ``'bwd_coop_max_block'``, ``'bwd_coop_max_block_16bit'`` for 16-bit inputs) or unsafe: a
    row's S programs must all be resident at once, so S stays <= ``'coop_max_programs_per_row'`` and <=
    the SM count (the chunk grows instead, up to ``'coop_max_chunk'``), and S = 1 under the interpreter,
    which runs programs one after another."""
    if BLOCK_N > _CFG["bwd_coop_max_block_16bit" if x.element_size() == 2 else "bwd_coop_max_block"]:
        return 0
    cap = min(_CFG["coop_max_programs_per_row"], _num_sms(x))
    CH = min(BLOCK_N, max(_CFG["bwd_coop_chunk"], next_pow2(cdiv(N, cap))))
    S = cdiv(N, CH)
    if CH > _CFG["coop_max_chunk"] or (S > 1 and (x.device.type != "cuda" or interpreting())):
        return 0
    return CH


def _forward(x, residual, weight, bias, eps, is_rms):
    x = _rows(x)
    M, N = x.shape
    dev = x.device
    sd = _stat_dtype(x.dtype)
    y = _alloc((M, N), dtype=x.dtype, device=dev)
    rstd = _alloc((M,), dtype=sd, device=dev)
    mean = None if is_rms else _alloc((M,), dtype=sd, device=dev)
    s = None
    if residual is not None:
        residual = _rows(residual)
        s = _alloc((M, N), dtype=x.dtype, device=dev)
    if M == 0:
        return y, s, mean, rstd
    if N == 0:
        if mean is not None:
            mean.zero_()
        rstd.fill_(float("nan"))
        return y, s, mean, rstd
    weight, bias = dense_param(weight), dense_param(bias)
    dummy = x
    args = (
        x, residual if residual is not None else dummy,
        weight if weight is not None else dummy, bias if bias is not None else dummy,
        y, s if s is not None else dummy, mean if mean is not None else rstd, rstd,
    )
    strides = (
        _row_stride(x), _row_stride(residual) if residual is not None else 0,
        N, N,
    )
    flags = dict(
        HAS_W=weight is not None, HAS_B=bias is not None, HAS_RES=residual is not None,
        IS_RMS=is_rms, ACC=_acc(x.dtype), ALIGN=_align(N, *strides),
    )
    BLOCK_N = next_pow2(N)
    NA, NB = _two_parts(N)  # (NA = BLOCK_N when NB == 0)
    if NB:  # the rows kernel in two column parts; its knobs as for next_pow2(N) (at most fwd_max_block)
        BLOCK_N = min(BLOCK_N, _CFG["fwd_max_block"])
    if BLOCK_N >= _CFG["fwd_split_min_block"] and residual is None and not NB:
        heavy = sum(p.element_size() for p in (weight, bias) if p is not None) > 2 * x.element_size()
        sfx = "_heavy_params" if heavy else ""
        fused = BLOCK_N <= _CFG["fwd_split_fused_max_block" + sfx]
        pre = "fwd_split_fused_" if fused else "fwd_split_"
        CH = min(_CFG[pre + "chunk"], BLOCK_N)
        S = cdiv(N, CH)
        st = _alloc((M * S * 2,), dtype=sd, device=dev)
        # arrival counters, zeroed per call: a cached buffer would race across streams and CUDA graphs
        cnt = torch.zeros((M,), dtype=torch.int32, device=dev) if fused else st
        sargs = (x, args[2], args[3], y, args[6], rstd, st)
        scal = (M, N, _row_stride(x), N, float(eps), S)
        kw = dict(CHUNK=CH, BLOCK_S=next_pow2(S), HAS_W=flags["HAS_W"], HAS_B=flags["HAS_B"],
                  IS_RMS=is_rms, ACC=flags["ACC"], ALIGN=flags["ALIGN"], num_warps=_CFG[pre + "warps"])
        fin = min(_CFG["fwd_split_fin_block"], BLOCK_N) if fused else 1  # the last program's steps
        launch(_fwd_split_kernel, (M * S,), *sargs, cnt, *scal, FUSED=fused, FIN_BLOCK=fin, **kw)
        if not fused:
            # fewer rows a program where that would leave fewer than 2 programs per SM
            R = max(1, min(_CFG["fwd_split_apply_rows" + sfx], M * S // (2 * _num_sms(x))))
            launch(_fwd_split_apply_kernel, (cdiv(M, R) * S,), *sargs, *scal, ROWS=R, **kw)
    elif BLOCK_N <= _CFG["fwd_max_block"]:
        wide_params = any(p is not None and p.element_size() > x.element_size() for p in (weight, bias))
        lo = _CFG["fwd_persist_min_block_wide_params" if wide_params else "fwd_persist_min_block"]
        persist = lo <= BLOCK_N <= _CFG["fwd_persist_max_block"]
        one_row = BLOCK_N > _CFG["multi_row_max"]
        rows = _CFG["fwd_rows_wide_params"] if wide_params and one_row and not persist else None
        ept = None
        if x.element_size() == 4 and BLOCK_N <= _CFG["multi_row_max"]:
            ept = _CFG["fwd_ept_4byte"]
        elif is_rms and not wide_params and not NB and BLOCK_N >= 8192:
            ept = _CFG["fwd_ept_wide_rms"]
        BLOCK_M, nw = _rows_cfg(BLOCK_N, tile=_CFG["tile_elems_wide_params"] if wide_params else None, ept=ept,
                                rows=rows, width=NA + NB)
        cap = _two_part_warps(NB, x.element_size()) if NB and _CFG["fwd_two_part_cap_warps"] else nw
        # a persistent program holds w/b too: capped only while the first part keeps <= fwd_ept_wide elements
        # a thread (bf16 x / fp32 w at 9216 on 4 warps: 255 registers and a 240-byte stack, offline sm_90)
        if cap < nw and not (persist and NA > 32 * cap * _CFG["fwd_ept_wide"]):
            nw = cap  # 16 bytes of the second part a thread
        elif NB and x.element_size() == 2 and _CFG["fwd_persist_two_part"]:
            persist = True  # (not at capped warps: the persistent tile's registers double per thread)
        nblocks = cdiv(M, BLOCK_M)
        per = 1
        if persist:
            P = max(1, min(nblocks, _num_sms(x) * _CFG["fwd_persist_progs_per_sm"]))
            per = cdiv(nblocks, P)
            nblocks = cdiv(nblocks, per)
        capped = not (is_rms or persist or NB) and x.element_size() == 4 and BLOCK_N >= _CFG["fwd_maxnreg_min_block"]
        early_wb = (not (persist or wide_params or NB) and (is_rms or x.element_size() == 4)
                    and _CFG["fwd_wb_early_min_block"] <= BLOCK_N <= _CFG["fwd_wb_early_max_block"])
        cap_regs = _CFG["fwd_maxnreg"] if capped else 0
        launch(_fwd_rows_kernel, (nblocks,),
            *args, M, N, *strides, float(eps), per,
            BLOCK_M=BLOCK_M, BLOCK_N=NA, NB=NB, PERSIST=persist, num_warps=nw, **flags,
            **({"EARLY_WB": True} if early_wb else {}),
            **({"maxnreg": cap_regs} if cap_regs else {}),
        )
    else:
        P = _loop_programs(x, M, N * x.element_size() * (2 if residual is not None else 1))
        launch(_fwd_loop_kernel, (P,),
            *args, M, N, *strides, float(eps), cdiv(M, P),
            CHUNK=_CFG["fwd_chunk"], num_warps=_CFG["fwd_loop_warps"], **flags,
            **({"VEC_ACC": True} if is_rms and _CFG["fwd_loop_vec_acc"] else {}),
            **({"EVICT_FIRST": True} if _CFG["fwd_loop_evict_first"] else {}),
        )
    return y, s, mean, rstd


def _reduce(partials: torch.Tensor, dtypes, pdl=False):
    """Reduce the (K, P, N) partials (K = 1 or 2) over P into K vectors of the given dtypes; pdl: with
    programmatic dependent launch after the kernel that wrote them."""
    K, P, N = partials.shape
    outs = [_alloc((N,), dtype=dt, device=partials.device) for dt in dtypes]
    BLOCK_N = min(_CFG["red_block_n"], next_pow2(N))
    BLOCK_P = max(1, min(_CFG["red_block_p"], max(1, 4096 // BLOCK_N), next_pow2(P)))
    launch(_reduce_partials_kernel, (cdiv(N, BLOCK_N), K),
        partials, outs[0], outs[-1], P, N, BLOCK_P=BLOCK_P, BLOCK_N=BLOCK_N, ALIGN=_align(N), num_warps=4,
        **pdl_follow(pdl),
    )
    return outs


def _partials(need_dw, need_db, P, N, acc_t, dev, dummy):
    """One (K, P, N) scratch for the dw and/or db partials: O(P x N) fp32 (fp64 for fp64)."""
    K = int(need_dw) + int(need_db)
    if K == 0:
        return None, dummy, dummy
    part = _alloc((K, P, N), dtype=acc_t, device=dev)
    dwp = part[0] if need_dw else dummy
    dbp = part[K - 1] if need_db else dummy
    return part, dwp, dbp


def _backward(dy, x, mean, rstd, weight, need_dx, need_dw, need_db, is_rms, dw_dtype, db_dtype):
    # Backward kernels launch with enable_fp_fusion=False: contracted into an FMA, `dy * w - c2` keeps
    # the unrounded product while c2 sums rounded ones, so a constant row (dx = 0 exactly, rstd up to
    # 1/sqrt(eps)) came out as rstd x 1 ulp (1.8e-5 on the H200 where ATen gives 0). Memory-bound:
    # the separate mul/add cost nothing measurable.
    x = _rows(x)
    dy = _rows(dy)
    M, N = x.shape
    dev = x.device
    weight = dense_param(weight)
    dx = _alloc((M, N), dtype=x.dtype, device=dev) if need_dx else None
    if M == 0 or N == 0:
        dw = torch.zeros((N,), dtype=dw_dtype, device=dev) if need_dw else None
        db = torch.zeros((N,), dtype=db_dtype, device=dev) if need_db else None
        return dx, dw, db
    if not (need_dx or need_dw or need_db):
        return None, None, None
    acc_t = _stat_dtype(x.dtype)
    rstd = rstd.reshape(M)
    mean = rstd if is_rms else mean.reshape(M)
    dummy = x
    wp = weight if weight is not None else dummy
    need_partials = need_dw or need_db
    wide_params = weight is not None and weight.element_size() > x.element_size()
    BLOCK_N = next_pow2(N)
    pdl = need_partials and BLOCK_N <= _CFG["pdl_max_block"] and pdl_on(x, True)
    flags = dict(
        HAS_W=weight is not None, IS_RMS=is_rms, STORE_DX=need_dx, NEED_DW=need_dw, NEED_DB=need_db,
        ACC=_acc(x.dtype), ALIGN=_align(N, _row_stride(dy), _row_stride(x)), **pdl_trigger(pdl),
    )
    # layer norm's db accumulator is what spills at 16384: there (16-bit x and w/b) a second kernel sums db
    # (independent of PDL, which changes when kernels start, never which run: with it the rows kernel
    # triggers the db kernel's launch, which is not PDL-launched, and the reduction waits for the db kernel)
    db_split = (not is_rms and need_db and x.element_size() == 2 and not wide_params
                and N >= _CFG["bwd_db_split_min_width"] and BLOCK_N <= _CFG["bwd_max_block"])
    rows_kernels = BLOCK_N <= _CFG["bwd_max_block" if is_rms or db_split else "bwd_max_block_ln"]
    coop = 0 if rows_kernels else _coop_chunk(x, N, BLOCK_N)
    if rows_kernels:
        narrow = BLOCK_N <= _CFG["multi_row_max"]
        if narrow:
            lo = _CFG["bwd_pf_min_block_32bit" if x.element_size() == 4 else "bwd_pf_min_block"]
            pf = lo <= BLOCK_N <= _CFG["bwd_pf_max_block"]
        else:
            cap = _CFG["bwd_pf_wide_max_row_bytes"]
            pf = BLOCK_N <= _CFG["bwd_pf_wide_max_block"] and (not cap or BLOCK_N * x.element_size() <= cap)
            pf = pf and (_CFG["bwd_pf_wide_params"] or not wide_params)
        if pf:
            kind = ("bwd_pf" if narrow else "bwd_pf_mid" if BLOCK_N == _CFG["bwd_pf_mid_block"] else
                    "bwd_pf_2k" if BLOCK_N == _CFG["bwd_pf_2k_block"] else "bwd_pf_wide")
            sfx = "_16bit" if narrow and x.element_size() == 2 else ""  # the narrow kernel's 16-bit knobs
            BLOCK_M, nw = _rows_cfg(BLOCK_N, bwd=True, tile=_CFG["bwd_pf_tile_elems" + sfx],
                                    ept=_CFG[kind + "_ept" + sfx])
        else:
            BLOCK_M, nw = _rows_cfg(BLOCK_N, bwd=True)
        nblocks = cdiv(M, BLOCK_M)
        if pf:
            pps = _CFG[kind + "_progs_per_sm" + sfx + ("_512" if sfx and BLOCK_N <= 512 else "")]
        elif narrow:
            pps = max(1, 32 // nw)
        else:
            pps = _CFG["bwd_plain_progs_per_sm_wide_params" if wide_params else "bwd_plain_wide_progs_per_sm"]
            pps = pps or max(1, 32 // nw)
        if pf or need_partials:
            # the prefetching kernel is persistent even without partials (its point is the loop)
            P = _num_sms(x) * pps
            P = min(P, max(_num_sms(x), _CFG["progs_per_sm_cap"] // (2 * N)))
            P = max(1, min(P, nblocks))
            per = cdiv(nblocks, P)
            P = cdiv(nblocks, per)
        else:
            P, per = nblocks, 1
        part, dwp, dbp = _partials(need_dw, need_db, P, N, acc_t, dev, dummy)
        db_split = db_split and not pf
        if db_split:
            flags["NEED_DB"] = False
        if pf:  # narrow rows with w wider than x hold w (bwd_pf_hold_w_wide_params)
            variant = dict(HOLD_W=True) if narrow and wide_params and _CFG["bwd_pf_hold_w_wide_params"] else {}
        else:
            variant = dict(HOLD_W=bool(_CFG["bwd_hold_w"]) and not narrow)
            if _CFG["bwd_rows_stages_min_block"] <= BLOCK_N <= _CFG["bwd_rows_stages_max_block"]:
                block_bytes = 2 * BLOCK_M * BLOCK_N * x.element_size()  # x and dy
                variant["STAGES"] = fit_stages(x, _CFG["bwd_rows_stages"], block_bytes, _CFG["bwd_rows_stages_smem"])
        if need_dx or need_dw or not db_split:  # (db alone: the db kernel only)
            launch(_bwd_rows_pf_kernel if pf else _bwd_rows_kernel, (P,),
                   dy, x, wp, mean, rstd, dx if need_dx else dummy, dwp, dbp,
                   M, N, _row_stride(dy), _row_stride(x), N, per,
                   BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=nw, enable_fp_fusion=False, **variant, **flags)
        if db_split:
            launch(_bwd_db_rows_kernel, (P,), dy, dbp, M, N, _row_stride(dy), per,
                   BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, ACC=flags["ACC"], ALIGN=flags["ALIGN"], num_warps=nw)
    elif coop:
        S = cdiv(N, coop)
        G = max(1, min(M, _num_sms(x) * _CFG["bwd_coop_progs_per_sm"] // S))
        rpg = cdiv(M, G)
        G = cdiv(M, rpg)
        st = _alloc((M * S * 2,), dtype=acc_t, device=dev) if need_dx else dummy
        # arrival counters + the ticket counter, zeroed per call (a cached buffer would race across
        # streams and CUDA graphs)
        cnt = torch.zeros((M + 1,), dtype=torch.int32, device=dev)
        part, dwp, dbp = _partials(need_dw, need_db, G, N, acc_t, dev, dummy)
        args = (dy, x, wp, mean, rstd, st, cnt, dx if need_dx else dummy, dwp, dbp,
                M, N, _row_stride(dy), _row_stride(x), N, rpg, S)
        launch(_bwd_coop_kernel, (G * S,), *args, CHUNK=coop, BLOCK_S=next_pow2(S),
               num_warps=_coop_warps(coop), enable_fp_fusion=False, **flags)
    else:
        c = _alloc((M, 2), dtype=acc_t, device=dev)
        if need_dx:
            launch(_bwd_rowsum_kernel, (M,),
                dy, x, wp, mean, rstd, c, N, _row_stride(dy), _row_stride(x),
                CHUNK=_CFG["bwd_chunk"], HAS_W=weight is not None, IS_RMS=is_rms, ACC=_acc(x.dtype),
                ALIGN=flags["ALIGN"],
                STAGES=fit_stages(x, _CFG["bwd_rowsum_stages"], _CFG["bwd_chunk"] * (
                    dy.element_size() + x.element_size() + (wp.element_size() if weight is not None else 0))),
                num_warps=8, enable_fp_fusion=False,
            )
        BN = _CFG["bwd_col_block"]
        BR = _CFG["bwd_col_rows"]
        ncb = cdiv(N, BN)
        target = _num_sms(x) * 4
        G = max(1, min(cdiv(M, BR), cdiv(target, ncb)))
        rpg = cdiv(cdiv(M, G), BR) * BR
        G = cdiv(M, rpg)
        part, dwp, dbp = _partials(need_dw, need_db, G, N, acc_t, dev, dummy)
        launch(_bwd_cols_kernel, (ncb, G),
            dy, x, wp, mean, rstd, c, dx if need_dx else dummy, dwp, dbp,
            M, N, _row_stride(dy), _row_stride(x), N, rpg,
            BLOCK_R=BR, BLOCK_N=BN, STAGES=fit_stages(x, _CFG["bwd_cols_stages"], BR * BN * (dy.element_size()
                                                                                             + x.element_size())),
            num_warps=8, enable_fp_fusion=False, **flags,
        )
    if not need_partials:
        return dx, None, None
    dtypes = ([dw_dtype] if need_dw else []) + ([db_dtype] if need_db else [])
    outs = _reduce(part, dtypes, pdl)
    dw = outs[0] if need_dw else None
    db = outs[-1] if need_db else None
    return dx, dw, db


# --------------------------------------------------------------------------------------------------
# public launchers


def _cfg_key():
    """What of the knobs a launch plan's key holds (tests and sweeps change them)."""
    return tuple(_CFG.values())


def forward_key(eps, rms):
    """The launch-plan key of ``ln_forward`` / ``rms_forward`` (normkit.ops' fast routes replay by it)."""
    return ("rms_forward" if rms else "ln_forward", eps, _cfg_key())


def _backward_flags(x_dtype, weight, output_mask, bias_dtype, rms):
    """(need_dx, need_dw, need_db, dw's dtype, db's dtype) of a backward: dw only with a weight, db never for RMS;
    dw in weight's dtype (x's without one), db in ``bias_dtype`` (default: dw's)."""
    need_dx, need_dw, need_db = bool(output_mask[0]), bool(output_mask[1]), not rms and bool(output_mask[2])
    pdt = weight.dtype if weight is not None else x_dtype
    return need_dx, need_dw and weight is not None, need_db, pdt, bias_dtype if bias_dtype is not None else pdt


def _backward_key(need_dx, need_dw, need_db, bias_dtype, rms):
    if rms:
        return ("rms_backward", need_dx, need_dw, _cfg_key())
    return ("ln_backward", need_dx, need_dw, need_db, bias_dtype, _cfg_key())


def backward_key(x_dtype, weight, output_mask, bias_dtype, rms):
    """The launch-plan key of ``ln_backward`` / ``rms_backward`` (normkit.ops' fast routes replay by it)."""
    need_dx, need_dw, need_db, _, bdt = _backward_flags(x_dtype, weight, output_mask, bias_dtype, rms)
    return _backward_key(need_dx, need_dw, need_db, bdt, rms)


def ln_forward(x2d, weight, bias, eps):
    """Layer norm forward over rows: ``(y, mean[M], rstd[M])``; stats fp32 (fp64 for fp64 input).

    HBM: read x, write y (2 passes); rows wider than ``_CFG['fwd_max_block']``: the split-row kernel,
    one launch up to ``_CFG['fwd_split_fused_max_block']`` (2 passes), two wider (3 at worst).
    """
    run = lambda: _forward(x2d, None, weight, bias, eps, False)  # noqa: E731
    if _plan.enabled() and x2d.is_cuda:
        y, _, mean, rstd = _plan.planned(forward_key(eps, False), (x2d, weight, bias), run)
    else:
        y, _, mean, rstd = run()
    return y, mean, rstd


def rms_forward(x2d, weight, eps):
    """RMS norm forward over rows: ``(y, rstd[M])``, ``y = (x * rstd) * w`` in fp32, then cast.
    Passes as ``ln_forward``."""
    run = lambda: _forward(x2d, None, weight, None, eps, True)  # noqa: E731
    if _plan.enabled() and x2d.is_cuda:
        y, _, _, rstd = _plan.planned(forward_key(eps, True), (x2d, weight), run)
    else:
        y, _, _, rstd = run()
    return y, rstd


def add_ln_forward(x2d, residual2d, weight, bias, eps):
    """Pre-norm residual fusion: ``s = x + residual`` (x's dtype), ``y = layer_norm(s)``.

    Returns ``(y, s, mean, rstd)``. HBM: read x and residual, write s and y (4 passes, the minimum; rows
    wider than ``_CFG['fwd_max_block']`` take the looped kernel, which may re-read s: 5 at worst).
    """
    return _forward(x2d, residual2d, weight, bias, eps, False)


def add_rms_forward(x2d, residual2d, weight, eps):
    """``s = x + residual`` (x's dtype), ``y = rms_norm(s)``: returns ``(y, s, rstd)``. Passes as
    ``add_ln_forward``."""
    y, s, _, rstd = _forward(x2d, residual2d, weight, None, eps, True)
    return y, s, rstd


def ln_backward(dy2d, x2d, mean, rstd, weight, output_mask, bias_dtype=None):
    """Layer norm backward: ``(dx|None, dw|None, db|None)`` per ``output_mask``.

    dw in weight's dtype, db in ``bias_dtype`` (default: weight's dtype, else x's). dw/db are fp32
    per-program partials reduced in a fixed order. HBM: read x, dy, write dx (3 passes) in the
    rows-in-registers regime; 5 passes in the wide regime (row sums, then the column kernel), 3 with
    ``_CFG['bwd_coop_max_block']`` (the cooperative wide kernel: 16-bit inputs up to 16384, others 65536).
    """
    need_dx, need_dw, need_db, pdt, bdt = _backward_flags(x2d.dtype, weight, output_mask, bias_dtype, False)
    run = lambda: _backward(dy2d, x2d, mean, rstd, weight, need_dx, need_dw, need_db, False, pdt, bdt)  # noqa: E731
    if _plan.enabled() and x2d.is_cuda:
        key = _backward_key(need_dx, need_dw, need_db, bdt, False)
        return _plan.planned(key, (dy2d, x2d, mean, rstd, weight), run)
    return run()


def rms_backward(dy2d, x2d, rstd, weight, output_mask):
    """RMS norm backward: ``(dx|None, dw|None)``. Same passes and partials as ``ln_backward``."""
    need_dx, need_dw, _, pdt, _ = _backward_flags(x2d.dtype, weight, output_mask, None, True)
    run = lambda: _backward(dy2d, x2d, None, rstd, weight, need_dx, need_dw, False, True, pdt, pdt)  # noqa: E731
    if _plan.enabled() and x2d.is_cuda:
        key = _backward_key(need_dx, need_dw, False, pdt, True)
        dx, dw, _ = _plan.planned(key, (dy2d, x2d, rstd, weight), run)
    else:
        dx, dw, _ = run()
    return dx, dw
