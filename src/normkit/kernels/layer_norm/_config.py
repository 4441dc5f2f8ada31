"""Layer / RMS norm's heuristics: the tunables (``_CFG``) and the pure functions of a row's width that pick a
kernel's tile, warps and column parts. Plain Python; the launchers (``__init__``) read it."""

from normkit.kernels import cdiv, next_pow2, prev_pow2

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
    "loop_progs_per_sm": 4,  # looped forward: persistent programs per SM ...
    "l2_budget": 0,  # ... optionally capped so that P * row bytes fits this much L2 (0: no cap)
    # looped-forward variants, off (session 43, for the H100's RMS 2048x65536 bf16 row, 10 % behind FlagGems' per-row
    # loop): RMS's sums of squares per lane across the chunks (one block reduction a row instead of one a chunk), and
    # the second loop's re-reads marked evict-first. Measured by ln_kernels.py's sweep group "fwdloopvec" (PART=130)
    "fwd_loop_vec_acc": 0,
    "fwd_loop_evict_first": 0,
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
    # 1: every kernel told the power of two below 16 that rows (N) and row strides share (``alignment_hint``), so
    # widths like 1000 / 3000 load vectors, not elements (0: offline sm_90, the bf16 rows forward at 3000 had 49
    # scalar loads). H100 session 38 (results/h100-2026-12-05-s38/call2-part112, sweep rowalign), ms, off -> on:
    # bf16 LN 16384x3000 fwd 0.1244 -> 0.0720, bwd 0.2511 -> 0.1230; LN 8192x5000 fwd 0.2082 -> 0.0622; RMS
    # 32768x1000 bwd 0.1223 -> 0.0773; fp32 LN 16384x3000 bwd 0.2843 -> 0.2253; geomean of 64 rows 0.1323 -> 0.1004.
    # Slowest change: RMS 16384x3000 fp32 fwd +1.0 %; the aligned 3072 control within 0.3 %
    "row_align": 1,
}


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
