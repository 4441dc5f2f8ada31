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
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from normkit.kernels import cdiv, dense_param, interpreting, next_pow2, prev_pow2
from normkit.kernels import _plan
from normkit.kernels._launch import alloc, gdc_launch_dependents, gdc_wait, launch, pdl_follow, pdl_on, pdl_trigger

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

# Tunables (the GPU sweep in benchmarks/ln_kernels.py overrides them to compare variants).
_CFG = {
    "fwd_max_block": 16384,  # widest next_pow2(N) kept in registers, forward
    "bwd_max_block": 16384,  # same for the RMS backward
    "bwd_max_block_ln": 8192,  # same for the layer-norm backward (one more accumulator: spills at 16K)
    # ... unless db is left to its own kernel (_bwd_db_rows_kernel: dy read once more): rows of at least
    # this many elements up to bwd_max_block wide, x and w/b 16-bit, take the plain rows kernel without the
    # db accumulator (H200 session 14: bf16 4096x16384 0.2062 -> 0.1783 ms against the cooperative kernel,
    # 8192x12288 -3 %, 8192x9216 +6 %, fp32 w/b +8..+58 %)
    "bwd_db_split_min_width": 12288,
    # forward tiles (2026-12-01 H200, sweep "fwdsmall" and the headline bench): 1024-element programs,
    # 16 elements a thread; bf16 rows of 768 / 1024: LN 0.0371 / 0.0225 -> 0.0328 / 0.0202 ms, RMS
    # 0.0346 / 0.0219 -> 0.0298 / 0.0189. With fp32 weight/bias on 16-bit rows each program re-reads
    # w and b from L2 (8 KB at 1024), so those keep 4096-element tiles (LN 768 / 1024 bf16-fp32 got
    # 0.0387 / 0.0232 -> 0.0458 / 0.0261 ms with 1024). Session 10's sweep "fwdmixnarrow" (bf16 x, fp32
    # w/b) found 2048 in between better than both: LN 768 / 1024 0.0376 / 0.0225 (4096) -> 0.0363 / 0.0216,
    # RMS 0.0294 / 0.0194 -> 0.0284 / 0.0191 (1024: 0.0455 / 0.0259, 0.0294 / 0.0196).
    "tile_elems": 1024,  # target BLOCK_M * BLOCK_N for narrow rows, forward
    "tile_elems_wide_params": 2048,  # the same when weight/bias are wider than x
    "fwd_ept": 16,  # elements per thread, forward, BLOCK_N <= multi_row_max (several rows a program)
    # ... for 4-byte x (fwdsmall chose 16 on bf16). H200 session 28 sweep fwdsmall32 (s28/call10-fwdsmall32), fp32,
    # 16 -> 8: LN / RMS 16384x1024 0.0364 / 0.0355 -> 0.0356 / 0.0352 ms, 32768x768 0.0524 / 0.0511 -> 0.0514 /
    # 0.0508; 1048576x64 and 262144x256 within 0.3 %; 4 elements lost everywhere (LN 32768x768 0.0616)
    "fwd_ept_4byte": 8,
    # the same, multi_row_max < BLOCK_N < 8192 (one row a program): 32 measured -1 % in the sweep but
    # RMS 16384x4096 bf16 0.0691 -> 0.0756 ms in the bench (L2-rotated inputs): 16
    "fwd_ept_mid": 16,
    "fwd_ept_wide": 32,  # elements per thread, forward, BLOCK_N >= 8192
    # ... RMS norm with weights of x's dtype (no mean, no bias: fewer live registers a row). H200 session 29 sweep
    # fwdmid (s29/call3-part86), 8192x8192, 32 -> 16: RMS bf16 0.0700 -> 0.0683 ms, fp32 0.1337 -> 0.1329 (layer
    # norm bf16 0.0697 -> 0.0759: it keeps 32). At 16384 both give max_warps
    "fwd_ept_wide_rms": 16,
    # one-row programs of these widths load w/b with x (Liger's order) instead of after the statistics: RMS norm, and
    # layer norm of 4-byte x. H200 session 29 sweep fwdwbearly (s29/call6-part88), ms, late -> early: LN fp32 4096
    # 0.1352 -> 0.1328, 8192 0.1361 -> 0.1312; RMS bf16 0.0688 -> 0.0681, 0.0689 -> 0.0678; RMS fp32 0.1339 ->
    # 0.1338, 0.1331 -> 0.1321; but LN bf16 0.0730 -> 0.0745, 8192 0.0698 -> 0.0971 (80 registers against 63). Not
    # at 16384: LN fp32 spills under its register cap there (offline sm_90), and nothing was measured. On since its
    # CUDA tests passed (session 30, next_h200.sh PART=89)
    "fwd_wb_early_min_block": 4096,
    "fwd_wb_early_max_block": 8192,
    "bwd_tile_elems": 4096,  # same for backward
    "bwd_ept": 8,
    "multi_row_max": 1024,  # widest BLOCK_N that still packs several rows per program
    "max_warps": 16,
    # persistent forward rows kernel for widths in [min, max] block (w/b loaded once per program, the
    # next tile's x prefetched). Off where w/b are as narrow as x: H200 2026-12-01 session 5 sweep
    # "fwd16kp", 4096x16384 one-row programs against one persistent program per SM: fp32 LN / RMS 0.1692 /
    # 0.1434 -> 0.1534 / 0.1371 ms, bf16 LN / RMS 0.0771 / 0.0721 -> 0.0776 / 0.0708
    "fwd_persist_min_block": 1 << 30,
    "fwd_persist_max_block": 16384,
    "fwd_persist_progs_per_sm": 1,
    # the same lower bound where weight/bias are wider than x (16-bit x, fp32 w/b: each one-row program
    # re-reads 4x its row's bytes of w/b from L2, a persistent program reads them once). H200 2026-12-01
    # sweep "fwdmixpersist", LN bf16 x / fp32 w,b: 8192x8192 0.1086 -> 0.0867 ms; at 4096 it lost
    # (16384x4096 0.0996 -> 0.1152)
    "fwd_persist_min_block_wide_params": 8192,
    # rows per program of the one-row widths (multi_row_max < BLOCK_N) below that, w/b wider than x: w/b
    # read from L2 once per that many rows (sweep "fwdmixrows", LN bf16 x / fp32 w,b 16384x4096: 1 / 2 / 4
    # rows 0.0998 / 0.0981 / 0.0773 ms; Liger 0.0803; at 2048 wide not measured)
    "fwd_rows_wide_params": 4,
    # split-row forward (_fwd_split_kernel) for BLOCK_N >= fwd_split_min_block (off: 1 << 30), no
    # residual. Up to fwd_split_fused_max_block one launch (the row's last program writes all of y, x
    # read once from HBM; 0: never), wider two launches (3 passes). H200 2026-12-01 (CUDA graphs, bf16,
    # two-launch c4096_w4 -> one launch c16384_w16_f8192): 4096x32768 LN 0.2007 -> 0.1942, RMS 0.1941 ->
    # 0.1503 ms; 2048x65536 LN 0.2117 -> 0.1931, RMS 0.1944 -> 0.1697; but 512x262144 LN 0.2205 ->
    # 0.2262, 256x131072 LN 0.0551 -> 0.0631 (the last program's pass over a long row is the tail)
    "fwd_split_min_block": 32768,
    "fwd_split_fused_max_block": 65536,
    # "heavy" weight/bias, more bytes per column than twice x's (layer norm, 16-bit x, fp32 w and b): the one
    # launch's last program re-reads them alone (bf16 x / fp32 w,b LN 2048x65536 0.293 ms, bf16 0.195), so two
    # launches, the second with several rows per program (the w/b chunk loaded once for them). H200 session 18
    # sweep fwdsplitrows, LN bf16 x / fp32 w,b, rows 1 / 2 / 4 / 8: 2048x65536 one launch 0.2938, two 0.2208 /
    # - / 0.2195 / 0.2092 ms; 512x262144 0.2401 / 0.2183 / 0.2098 / 0.2100. Elsewhere rows lost or tied (LN bf16
    # 512x262144 0.2020 -> 0.2083 at 4, fp32 +1..+3 %; RMS within 1 %) and two launches lost at 65536 (LN bf16
    # 0.1952 -> 0.1991, RMS bf16 x / fp32 w 0.1724 -> 0.1941)
    "fwd_split_fused_max_block_heavy_params": 0,
    "fwd_split_apply_rows": 1,
    "fwd_split_apply_rows_heavy_params": 8,
    # registers a thread of fp32 layer norm's one-row forward (BLOCK_N >= min block, not persistent, one column
    # part) at most (0: Triton's choice). Uncapped it takes 92 at 16384 (offline sm_90: x - shift and x - mean
    # both held), so one 16-warp program per SM; at 64 two, and no spill. H200 session 18 sweep fwdmaxnreg, LN
    # fp32 4096x16384 0.1539 -> 0.1360 ms (Liger 0.142); elsewhere it lost or tied: LN fp32 8192x8192 +1 %,
    # LN bf16 16384 +2 % (64 registers already), RMS fp32 (74 registers uncapped, 24 B of stack capped) +1.5..+3 %
    "fwd_maxnreg": 64,
    "fwd_maxnreg_min_block": 16384,
    # rows of a width that is not a power of two are held as two power-of-two column parts where that
    # takes fewer lanes (12288 = 8192 + 4096 instead of 16384; _two_parts), for next_pow2(N) >= the min
    # block and up to max lanes (0: off). H200 sweep "fwdtwopart" (session 11), one tile -> two parts, ms:
    # 8192x12288 LN bf16 / fp32 0.1244 / 0.2536 -> 0.1187 / 0.1985, RMS 0.1141 / 0.2222 -> 0.1120 / 0.1978;
    # 4096x20480 (split kernel before) LN 0.1662 / 0.2852 -> 0.1562 / 0.1947, bf16 x / fp32 w 0.2558 ->
    # 0.1213; but narrower rows lost (bf16 LN 16384x3072 0.0613 -> 0.0809, 32768x768 0.0321 -> 0.0399:
    # twice the cross-warp reductions per row), so two parts only from the 16384 class up
    "fwd_two_part_min_block": 16384,
    "fwd_two_part_max": 24576,
    # 16-bit two-part rows at full warps (below) run persistent: a 20480-wide row took 96 registers at 16 warps, one program per SM
    # working one row at a time; the persistent program prefetches the next row. H200 sweep "fwdpersist2p"
    # (session 12), 4096x20480 bf16 LN 0.1566 -> 0.1238 ms, RMS 0.1022 -> 0.0920; 8192x12288 equal (LN
    # 0.1179 / 0.1181, RMS 0.1113 / 0.1112). fp32 lost (sweep "fwdpersist16k": 4096x20480 LN 0.1953 ->
    # 0.2515, RMS 0.1663 -> 0.1780; 8192x10240 LN 0.1641 -> 0.1811)
    "fwd_persist_two_part": 1,
    # two-part rows at most _two_part_warps(NB) warps (16 bytes of the second part a thread), else Triton
    # converts the first part's tile between layouts (layer norm bf16 8192x10240 0.51 SOL, session 12);
    # capped rows are not persistent (offline sm_90: 195-255 registers and spills at 9216 / 10240 / 18432)
    "fwd_two_part_cap_warps": 1,
    "fwd_split_fused_chunk": 16384,  # one launch: chunk per program, warps, elements per step of the
    "fwd_split_fused_warps": 16,  # last program's pass over its row
    "fwd_split_fin_block": 8192,
    # two launches: chunk, warps (c4096_w4 beat c8192_w8 on every row of that run: 512x262144 fp32 LN
    # 0.4086 -> 0.3855 ms, bf16 RMS 0.2007 -> 0.1954)
    "fwd_split_chunk": 4096,
    "fwd_split_warps": 4,
    "fwd_chunk": 8192,  # chunk of the looped forward (rows wider than fwd_max_block with a residual)
    "fwd_loop_warps": 16,
    # the looped forward's two loops pipelined through shared memory, this many stages (1: plain loops; a variant:
    # with fwd_split_min_block past the row, wide rows take the looped forward instead of the split one)
    "fwd_loop_stages": 1,
    "loop_progs_per_sm": 4,  # looped forward: persistent programs per SM ...
    "l2_budget": 0,  # ... optionally capped so that P * row bytes fits this much L2 (0: no cap)
    "bwd_chunk": 4096,  # chunk of the backward row-sum kernel
    "bwd_col_block": 1024,  # column tile of the backward column kernel
    "bwd_col_rows": 4,  # rows per step of the backward column kernel
    # the row-sum and column kernels' loops software-pipelined by Triton (tl.range num_stages: loads issued
    # stages - 1 steps ahead through shared memory; 1: not). H200 session 16, sweep bwdst, 7 rows: geomean
    # 0.447 -> 0.390 ms (bf16 LN 2048x65536 0.480 -> 0.365, 4096x32768 0.437 -> 0.351, fp32 LN 512x262144
    # 0.751 -> 0.642; RMS bf16 512x262144 0.350 -> 0.351, the one row not faster)
    "bwd_rowsum_stages": 3,
    "bwd_cols_stages": 3,
    # cooperative wide backward (_bwd_coop_kernel: a row's chunk programs wait for each other's row sums,
    # then each writes its dx slice; 3 passes) where the rows kernels stop, up to bwd_coop_max_block
    # (16-bit inputs: bwd_coop_max_block_16bit); chunk, elements per thread (-> warps), programs per SM
    # (row groups x chunks). H200 2026-12-01, c2048_e16_p4 against row sums + columns: fp32 LN 4096x16384
    # 0.339 -> 0.258 ms, 2048x65536 0.751 -> 0.565, RMS 0.727 -> 0.555, bf16 LN 4096x16384 0.232 -> 0.200;
    # lost at bf16 65536 (RMS 0.384 -> 0.430) and 262144 (LN 0.397 -> 0.550; fp32 RMS 0.681 -> 0.748), where
    # the per-row wait outweighs the halved reads. A row's S programs must be resident together: S <=
    # coop_max_programs_per_row (and the SM count), the chunk grows to keep it so, up to coop_max_chunk.
    # (The last-program form, one program writing the row's whole dx from L2, ran 3-90x slower: deleted.)
    "bwd_coop_max_block": 65536,
    "bwd_coop_max_block_16bit": 16384,
    "bwd_coop_chunk": 2048,
    "bwd_coop_ept": 16,  # sm_90 registers, LN bf16 / fp32: c2048 (4 warps) 121 / 127, c4096 (8) 121 / 128
    "bwd_coop_progs_per_sm": 4,
    "coop_max_programs_per_row": 32,
    # (Several rows per exchange, _bwd_coop_rows_kernel, lost on every row it was swept on: H200 session 10,
    # NOTES-layer_norm.md; deleted.)
    "coop_max_chunk": 16384,
    "progs_per_sm_cap": 2 ** 22,  # cap on P * N for the dw/db partials (elements)
    # prefetching backward rows kernel (_bwd_rows_pf_kernel: the next two row blocks' loads issued before
    # this block's reductions) for bwd_pf_min_block <= BLOCK_N <= bwd_pf_max_block (BLOCK_N <= multi_row_max;
    # 64 / 256 wide: the plain kernel measured faster, 1048576x64 0.1107 vs 0.1371 ms; 512 wide: the
    # prefetching kernel, sweep "bwd512" (session 11), plain -> prefetching, ms: LN bf16 131072x320 0.1939 ->
    # 0.1152, 65536x512 0.1235 -> 0.0741, 131072x384 0.1994 -> 0.1191; LN fp32 320 0.2332 -> 0.1610; RMS bf16
    # within 1-6 % either way) ...
    "bwd_pf_min_block": 512,
    # ... and from this BLOCK_N for fp32 x: sweep "bwdnarrow" (session 19), 262144x256 plain -> prefetching,
    # ms: LN fp32 0.3688 -> 0.2062 (0.52 -> 0.92 SOL; the plain kernel's 83 registers left one 16-warp program
    # per SM), RMS fp32 0.2603 -> 0.2033; 16-bit x lost there (LN bf16 0.1276 -> 0.1403, RMS 0.1133 -> 0.1395,
    # bf16 x / fp32 w 0.1282 -> 0.1511) and 64 wide moved within 1-3 %
    "bwd_pf_min_block_32bit": 256,
    "bwd_pf_max_block": 1024,
    "bwd_pf_tile_elems": 1024,  # BLOCK_M * BLOCK_N of the prefetching kernel (narrow rows)
    "bwd_pf_ept": 8,  # elements per thread -> num_warps (capped by max_warps)
    "bwd_pf_progs_per_sm": 4,  # persistent programs per SM
    # ... the same for 16-bit x: twice the elements a thread (two rows a block at 1024 wide), so each program keeps
    # as many bytes in flight as fp32's; programs per SM as many as fit in registers (offline sm_90: 119-128 at
    # 1024 wide, 4 a SM; 156-168 at 512 wide, 3). H200 sweep "bwdpf16" (session 19), ms, t1024_e8_p4 -> these:
    # LN bf16 32768x768 0.0667 -> 0.0558, 16384x1024 0.0395 -> 0.0356, 65536x512 0.0745 -> 0.0672 (p4 there:
    # 0.0831); RMS bf16 768 0.0644 -> 0.0521, 1024 0.0402 -> 0.0332; bf16 x / fp32 w 768 0.0652 -> 0.0559
    "bwd_pf_tile_elems_16bit": 2048,
    "bwd_pf_ept_16bit": 16,
    "bwd_pf_progs_per_sm_16bit": 4,
    "bwd_pf_progs_per_sm_16bit_512": 3,
    # ... and for one-row blocks (multi_row_max < BLOCK_N <= bwd_pf_wide_max_block; 0: off)
    "bwd_pf_wide_max_block": 8192,
    # ... and rows of at most this many bytes: two 32 KB fp32 blocks ahead spill (sweep "bwd8k32", fp32
    # LN 8192x8192 0.3293 -> 0.2640 ms with the plain kernel; RMS 0.2358 / 0.2361, bf16 unaffected)
    "bwd_pf_wide_max_row_bytes": 16384,
    # programs per SM of the plain backward rows kernel on one-row blocks (0: 32 // num_warps, i.e. 2 at
    # 16 warps, where registers allow one resident). Sweep "bwdplainpps", fp32 8192x8192 LN / RMS: 0 (2)
    # 0.2713 / 0.2350 ms, 1: 0.2539 / 0.2364, 2: 0.2660 / 0.2349. The RMS backward at 16384 (bf16 and
    # fp32) takes this kernel too (with w held: bf16 4096x16384 0.1218 ms, Liger 0.1772); 1 against 2
    # programs per SM is not compared there
    "bwd_plain_wide_progs_per_sm": 1,
    "bwd_pf_wide_ept": 8,
    "bwd_pf_wide_progs_per_sm": 1,
    # one-row blocks where w is wider than x (16-bit x, fp32 w): the prefetching kernel (1) or the plain
    # one with this many programs per SM (0: 32 // num_warps). H200 sweep "bwdmix" 2026-12-01 (bf16 x,
    # fp32 w/b), prefetching -> plain with 2 per SM: LN 16384x4096 0.2274 -> 0.2125 ms, 8192x8192 0.1724 ->
    # 0.1601, RMS 0.1310 -> 0.1290, 0.1423 -> 0.1483; geomean -3 %. Far from the bf16-w kernel (0.112 ms
    # at LN 4096): the 181 vs 128 registers of the prefetching kernel were not the cause
    "bwd_pf_wide_params": 0,
    # narrow rows (prefetching kernel, one 1024-wide row a block) with w wider than x: w held per program
    # instead of reloaded per row (bf16 x / fp32 w reads 4 KB of w per 4 KB of x + dy). H200 sweep
    # "bwdmixnarrow" (session 10), reload -> hold: LN 32768x768 0.0895 -> 0.0653 ms, 16384x1024 0.0493 ->
    # 0.0407, RMS 0.0599 -> 0.0592, 0.0381 -> 0.0373
    "bwd_pf_hold_w_wide_params": 1,
    # the plain rows backward on one-row blocks: w held in registers by each persistent program instead
    # of reloaded from L2 per row. H200 sweep "bwdholdw" 2026-12-01, reload -> hold: fp32 LN 8192x8192
    # 0.2684 -> 0.2130 ms (Liger 0.2198), bf16 x / fp32 w LN 16384x4096 0.2102 -> 0.1420, 8192x8192 0.1581
    # -> 0.1547, RMS fp32 8192 0.2356 -> 0.2088, RMS bf16 4096x16384 0.1536 -> 0.1241; no row slower
    "bwd_hold_w": 1,
    "bwd_plain_progs_per_sm_wide_params": 2,
    # the plain rows kernel's walk over one-row blocks software-pipelined by Triton (tl.range num_stages;
    # 1: not), for blocks of bwd_rows_stages_min_block .. _max_block, with at most bwd_rows_stages_smem bytes
    # of x / dy blocks in flight (stages - 1 of them; sm_90 has 227 KB). H200 sweeps (session 17): every
    # 16384-wide row lost 20-50 % at 2-4 stages (sweep bwdrowsst), so the 8192 block only (4097-8192 wide);
    # there at 3 stages (sweep bwdrowsst8k), ms: LN bf16 x / fp32 w 8192x8192 0.1640 -> 0.1187, 12288x5120
    # 0.1869 -> 0.1412, RMS 8192x8192 0.1359 -> 0.1128; LN fp32 8192x6144 0.1763 -> 0.1636; 16-bit rows and
    # fp32 8192 within 1 % (3 vs 4 stages: within 1 %; fp32 8192 is capped at 3 by the smem budget anyway)
    "bwd_rows_stages": 3,
    "bwd_rows_stages_min_block": 8192,
    "bwd_rows_stages_max_block": 8192,
    "bwd_rows_stages_smem": 160 * 1024,
    # ... except at BLOCK_N == bwd_pf_mid_block: 16 elements a thread (8 warps), 2 programs per SM
    # (2026-12-01 sweep "bwdmid", bf16 16384x4096 LN / RMS 0.1428 / 0.1311 -> 0.1156 / 0.1118 ms; at
    # 8192 the same change was 5 % slower: 8192x8192 0.1198 / 0.1116 -> 0.1258 / 0.1156)
    "bwd_pf_mid_block": 4096,
    "bwd_pf_mid_ept": 16,
    "bwd_pf_mid_progs_per_sm": 2,
    # ... and at BLOCK_N == bwd_pf_2k_block (1025-2048 wide; 8 warps a row): the wide defaults left one
    # program of 8 warps per SM, with ~24 KB of x / dy in flight (LN bf16 32768x2048 bwd 0.49 SOL, session
    # 11's bench of widths outside the suite). Sweep "bwd2k" (session 11), e8 p1 -> e16 p4 (4 warps, 4
    # programs per SM), ms: LN bf16 32768x2048 0.1962 -> 0.1176, 32768x1600 0.1866 -> 0.1066, 65536x1536
    # 0.3572 -> 0.1948; RMS bf16 2048 0.1869 -> 0.1125 (e8 p4: 0.1084); LN fp32 2048 0.2690 -> 0.2157
    "bwd_pf_2k_block": 2048,
    "bwd_pf_2k_ept": 16,
    "bwd_pf_2k_progs_per_sm": 4,
    # dw/db partials reduction: column block and row block (more, smaller programs for narrow N)
    "red_block_n": 32,
    "red_block_p": 128,
    # programmatic dependent launch of the dw/db reduction (sm_90+) for rows up to this next_pow2 width
    # (0: never): launched while the backward kernel runs, its launch latency overlaps that kernel's tail.
    # H200 2026-12-01 (session 8), bf16 unless noted: LN 32768x768 0.0685 -> 0.0635 ms, 16384x1024
    # 0.0410 -> 0.0400 (fp32 0.0607 -> 0.0597), RMS 16384x1024 0.0422 -> 0.0409; at 4096-16384 +0.4..+2.2 %
    # (RMS 8192x8192 0.1121 -> 0.1146), at 65536 -0.3..-0.6 %
    "pdl_max_block": 1024,
}


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
):
    """[BLOCK_M, BLOCK_N] tiles (and, NB > 0, [BLOCK_M, NB] tiles of columns BLOCK_N ..), whole rows in
    registers. HBM: read x (+residual), write y (+sum).

    PERSIST=False: one tile per program, w/b loaded by every program (an L2 read per tile) after the
    statistics (loaded with x, as Liger does, measured 2-40 % slower on the H200: more live registers).
    PERSIST=True: ``blocks_per_prog`` consecutive tiles per program, w/b loaded once and held, the next
    tile's x (and residual) loaded before this tile's reductions.
    EARLY_WB (one tile per program): w/b loaded first, with x (``fwd_wb_early_min_block``; a variant).
    """
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
def _loop_stats_chunk(xrow, rrow, srow, start, offs, N, shift, mean, m2, CHUNK: tl.constexpr,
                      HAS_RES: tl.constexpr, IS_RMS: tl.constexpr, ACC: tl.constexpr):
    """The looped forward's first loop, one chunk: read x (and residual, writing the sum) and merge the chunk's
    (mean, M2) of ``x - shift`` into the row's with Chan's formula (RMS: x^2 summed into m2)."""
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
    return mean, m2


@triton.jit
def _loop_y_chunk(xrow, srow, yrow, W, B, start, offs, N, shift, mean, rstd,
                  HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_RES: tl.constexpr, IS_RMS: tl.constexpr,
                  ACC: tl.constexpr):
    """The looped forward's second loop, one chunk: re-read x (or the stored sum) and write y."""
    cols = start + offs
    cmask = cols < N
    if HAS_RES:
        x = tl.load(srow + cols, mask=cmask, other=0.0).to(ACC)
    else:
        x = tl.load(xrow + cols, mask=cmask, other=0.0).to(ACC)
    if IS_RMS:
        y = x * rstd
    else:
        y = ((x - shift) - mean) * rstd
    if HAS_W:
        y = y * tl.load(W + cols, mask=cmask, other=0.0).to(ACC)
    if HAS_B:
        y = y + tl.load(B + cols, mask=cmask, other=0.0).to(ACC)
    tl.store(yrow + cols, y, mask=cmask)


@triton.jit
def _fwd_loop_kernel(
    X, R, W, B, Y, S, MEAN, RSTD,
    M, N, stride_x, stride_r, stride_y, stride_s, eps, iters,
    CHUNK: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_RES: tl.constexpr, IS_RMS: tl.constexpr,
    ACC: tl.constexpr, STAGES: tl.constexpr = 1,
):
    """Persistent programs, each taking rows ``pid, pid + P, ...``; two loops over CHUNK-wide slices.

    Loop 1 reads x (and residual, writing the sum) and merges per-chunk (mean, M2) of ``x - x[0]``
    with Chan's formula (RMS: sums x^2). Loop 2 walks the row backwards, re-reading x (or the stored
    sum) while the latest chunks are still in L2, and writes y. The host sizes P so that the rows in
    flight fit in L2: 2 HBM passes then, 3 at worst.
    STAGES > 1 (``fwd_loop_stages``, a variant): both loops pipelined by Triton through shared memory,
    STAGES - 1 chunks in flight as cp.async copies (the same chunks in the same order: the same bits).
    """
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
            shift = tl.zeros([], dtype=ACC)
            if not IS_RMS:
                shift = tl.load(xrow).to(ACC)
                if HAS_RES:
                    shift = (shift + tl.load(rrow).to(ACC)).to(X.dtype.element_ty).to(ACC)
            # (two loop forms: one tl.range form for both raised the plain kernel's registers 32-46 -> 37-54, sm_90)
            if STAGES > 1:
                for k in tl.range(0, nchunks, num_stages=STAGES):
                    mean, m2 = _loop_stats_chunk(xrow, rrow, srow, k * CHUNK, offs, N, shift, mean, m2, CHUNK,
                                                 HAS_RES, IS_RMS, ACC)
            else:
                for start in range(0, N, CHUNK):
                    mean, m2 = _loop_stats_chunk(xrow, rrow, srow, start, offs, N, shift, mean, m2, CHUNK,
                                                 HAS_RES, IS_RMS, ACC)
            rstd = _rsqrt(m2 / N + eps, ACC)
            tl.store(RSTD + row, rstd)
            if not IS_RMS:
                tl.store(MEAN + row, shift + mean)
            if STAGES > 1:
                for i in tl.range(0, nchunks, num_stages=STAGES):
                    _loop_y_chunk(xrow, srow, yrow, W, B, (nchunks - 1 - i) * CHUNK, offs, N, shift, mean, rstd,
                                  HAS_W, HAS_B, HAS_RES, IS_RMS, ACC)
            else:
                for i in range(0, nchunks):
                    _loop_y_chunk(xrow, srow, yrow, W, B, (nchunks - 1 - i) * CHUNK, offs, N, shift, mean, rstd,
                                  HAS_W, HAS_B, HAS_RES, IS_RMS, ACC)


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
):
    """The two-launch split forward's second launch: program = (ROWS consecutive rows, chunk), the
    programs walked last-first (the end of the first launch's reads are L2 hits). The chunk's w/b are
    loaded once for its ROWS rows (a one-row program re-reads them from L2 per row: with fp32 w/b on
    16-bit x, 4x the row's own bytes). Per row: re-read the chunk (the next row's load issued before
    this row's arithmetic), merge the row's S pairs (``_split_stats``, as the one launch: the same
    statistics) and write the chunk's slice of y. HBM: read x twice, write y (3 passes at worst)."""
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
):
    """Each program walks ``blocks_per_prog`` consecutive [BLOCK_M, BLOCK_N] row blocks (HOLD_W: w
    loaded once, held in registers; else reloaded per block). STAGES > 1: the walk software-pipelined by
    Triton (the next blocks' x / dy copied into shared memory STAGES - 1 blocks ahead; the same sums).

    dx per row from the two row sums; dy*xhat and dy summed over the program's rows in registers and
    written once as row ``pid`` of the (P, N) partials. HBM: read x, dy, write dx (3 passes) + P*N.
    """
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
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACC: tl.constexpr):
    """db partials for ``_bwd_rows_kernel`` run without its db accumulator: program ``pid`` sums dy over
    the same row blocks, in the same order, into row ``pid`` of (P, N) (the bits the rows kernel's
    accumulator gives). The next two blocks' loads are issued before this one is added. HBM: read dy."""
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
):
    """``_bwd_rows_kernel`` software-pipelined by hand: the loads of the next two row blocks (x, dy kept
    in the input dtype: half the registers of fp32; mean/rstd) are issued before this block's row
    reductions, so that HBM reads stay in flight while the program reduces (the plain kernel issues
    nothing during its reductions; Triton pipelines a loop without a dot only as ``tl.range(num_stages=k)``,
    through shared memory, which at 16384 wide rows costs stack and shared memory). Same math,
    same partial layout (row ``pid`` of (P, N)), same accumulation order per program as the plain kernel.
    HOLD_W: w loaded once per program and held (as the plain kernel's HOLD_W), else reloaded per block.
    """
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
):
    """One program per row: C[row] = (sum(w*dy*xhat)/N, sum(w*dy)/N). HBM: read x, dy. STAGES > 1: the
    loop software-pipelined by Triton (loads issued that many chunks ahead, through shared memory)."""
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
):
    """Program (column block, row group): dx for its tile of every row of the group, dw/db partials.

    Row groups and the rows inside them are walked last-first, the reverse of the row-sum kernel.
    HBM: read x, dy, write dx (3 passes; 5 with the row-sum kernel) + G*N partials. STAGES > 1: the
    loop software-pipelined by Triton.
    """
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
                            PDL: tl.constexpr = False):
    """OUT_k[n] = sum_p P_PTR[k, p, n] in a fixed order (deterministic); k = program_id(1) picks dw
    (OUT0) or db (OUT1), so both reduce in one launch. Reads the (k, P, N) partials once. PDL: launched
    while the backward kernel runs, waits for it before reading the partials."""
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


# --------------------------------------------------------------------------------------------------
# host side


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


def _coop_warps(CH):
    return next_pow2(min(_CFG["max_warps"], max(1, CH // (32 * _CFG["bwd_coop_ept"]))))


def _two_parts(N: int):
    """(NA, NB): a row of N held as two power-of-two column parts NA + NB >= N (NA the largest power of
    two <= N) where that takes fewer lanes than next_pow2(N), e.g. 5120 = 4096 + 1024, 768 = 512 + 256,
    3000 -> 2048 + 1024; else (next_pow2(N), 0). Two parts for next_pow2(N) >= ``'fwd_two_part_min_block'``,
    up to ``'fwd_two_part_max'`` lanes (0: off)."""
    BLOCK_N = next_pow2(N)
    NA = BLOCK_N if BLOCK_N == N else BLOCK_N // 2
    NB = next_pow2(N - NA) if N > NA else 0
    if (not NB or NA + NB >= BLOCK_N or NA > _CFG["fwd_max_block"] or NA + NB > _CFG["fwd_two_part_max"]
            or BLOCK_N < _CFG["fwd_two_part_min_block"]):
        return BLOCK_N, 0
    return NA, NB


def _two_part_warps(NB: int, elem_bytes: int) -> int:
    """The most warps at which a two-part row's second part (NB wide) still gives every thread 16 bytes:
    with fewer (10240 = 8192 + 2048 at 16 warps, 16-bit: 4 elements a thread against the first part's 8)
    the parts take different layouts, and Triton's layout assignment converted the whole first part
    through shared memory, twice a row (layer norm: the row's shift and mean tie the parts together;
    offline sm_90, Triton 3.6). Layer norm bf16 8192x10240 ran at 0.51 SOL against 0.80 at 12288."""
    return max(1, NB * elem_bytes // (16 * 32))


def _rows_cfg(BLOCK_N: int, bwd: bool = False, tile=None, ept=None, rows=None, width=None):
    """(BLOCK_M, num_warps) for the rows-in-registers kernels: several rows per program up to a tile
    of ``tile_elems`` (forward) / ``bwd_tile_elems`` (backward) elements, about ``*_ept`` elements per
    thread (backward holds x, dy and two accumulators per element, so it gets fewer). ``width``: the
    lanes a row takes when that is not BLOCK_N (two column parts); the elements per thread and the
    one-row threshold still follow BLOCK_N's class."""
    if tile is None:
        tile = _CFG["bwd_tile_elems" if bwd else "tile_elems"]
    if ept is None:
        if bwd:
            ept = _CFG["bwd_ept"]
        else:
            ept = _CFG["fwd_ept_wide" if BLOCK_N >= 8192 else
                       "fwd_ept" if BLOCK_N <= _CFG["multi_row_max"] else "fwd_ept_mid"]
    if width is None:
        width = BLOCK_N
    if rows is None:
        rows = prev_pow2(max(1, tile // width)) if BLOCK_N <= _CFG["multi_row_max"] else 1
    BLOCK_M = rows
    num_warps = min(_CFG["max_warps"], max(1, cdiv(BLOCK_M * width, 32 * ept)))
    return BLOCK_M, next_pow2(num_warps)


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
        IS_RMS=is_rms, ACC=_acc(x.dtype),
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
                  IS_RMS=is_rms, ACC=flags["ACC"], num_warps=_CFG[pre + "warps"])
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
            **({"STAGES": _CFG["fwd_loop_stages"]} if _CFG["fwd_loop_stages"] > 1 else {}),
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
        partials, outs[0], outs[-1], P, N, BLOCK_P=BLOCK_P, BLOCK_N=BLOCK_N, num_warps=4, **pdl_follow(pdl),
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
        ACC=_acc(x.dtype), **pdl_trigger(pdl),
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
                fit = 1 + _CFG["bwd_rows_stages_smem"] // block_bytes
                variant["STAGES"] = max(1, min(_CFG["bwd_rows_stages"], fit))
        if need_dx or need_dw or not db_split:  # (db alone: the db kernel only)
            launch(_bwd_rows_pf_kernel if pf else _bwd_rows_kernel, (P,),
                   dy, x, wp, mean, rstd, dx if need_dx else dummy, dwp, dbp,
                   M, N, _row_stride(dy), _row_stride(x), N, per,
                   BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=nw, enable_fp_fusion=False, **variant, **flags)
        if db_split:
            launch(_bwd_db_rows_kernel, (P,), dy, dbp, M, N, _row_stride(dy), per,
                   BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, ACC=flags["ACC"], num_warps=nw)
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
                STAGES=_CFG["bwd_rowsum_stages"], num_warps=8, enable_fp_fusion=False,
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
            BLOCK_R=BR, BLOCK_N=BN, STAGES=_CFG["bwd_cols_stages"], num_warps=8, enable_fp_fusion=False, **flags,
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
