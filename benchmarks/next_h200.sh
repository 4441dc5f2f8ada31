#!/usr/bin/env bash
# Session 8's device calls (carry .whl; each <= ~9.5 min), run as
#   run(command="NORMKIT_GIT_SHA=<this checkout's commit> PART=<n> bash benchmarks/next_h200.sh", carry=[".whl"],
#       timeout_s=600)
# (the device's copy of .git is not the checkout's: without the variable the bench JSON's git_sha is wrong)
# PART=1: `pytest -m cuda`, the group-norm variants prepared in session 7 (adopted / deleted since).
# PART=2: the CUDA tests of programmatic dependent launch, conformance on CUDA, batch norm's combine tiles
#         and programmatic dependent launch, the layer / RMS backward's dw/db reduction with it.
# PART=3: `pytest -m cuda` at the adopted defaults, group norm with programmatic dependent launch (and, at
#         d348747, batch norm's sample-major reduction over short NCHW planes, variants redflat*: measured,
#         deleted since; NOTES-batch_norm.md session 8).
# PART=4: the suite bench (batch, layer, RMS norm: every dtype; group, instance norm) and resnet50 steps.
# For the next session (22's plan; 23 onwards):
# PART=57: the one-launch batch-norm kernels (fused_max_rows; off by default, prepared in session 22 without a GPU):
#          their CUDA tests, bn_kernels.py --small (split vs fused, graph and do_bench times), host cost per call with
#          and without. PART=58: the zoo's small models (timing, host syncs per step), split path against the defaults.
#          Predictions in NOTES-host-overhead.md "Session 22".
# Session 23: PART=57 ran (results/h200-2026-12-03-s23); thresholds adopted (fused_max_rows 8192, fused_max_numel 2M).
# PART=59: every batch-norm kernel CUDA test and conformance on CUDA at those thresholds (ran: 2 tests and 2 check
#          cases failed, fixed since). PART=60: PART=59 again, the zoo A/B interleaved in one process (knob_ab.py),
#          the randomized batch-norm / module cases on CUDA. PART=61: where small models' host time goes under
#          enable() (model_host_profile.py: forward / backward issue, autograd engine thread vs calling thread,
#          cProfile).
# Session 24: PART=62: the CUDA tests of plan scalars (the momentum) and the forward combine cap, batch-norm
#          conformance on CUDA, the cap against the old rule (variant combwide; predicted -5..-12 µs on 1024x4096 /
#          512x8192 forwards). PART=63: small models' host time (prediction: mlp_bn1d forward -100..-200 µs a step),
#          whole steps captured in CUDA graphs (graphed_steps.py; predictions in NOTES-host-overhead.md, session 23).
# Session 25: PART=66: the native plan replay (normkit.kernels._native, _replay.cpp): its build on the GPU machine, its
#          CUDA tests (same bits as the Python replay), the batch-norm kernel / plan CUDA tests replayed natively, host
#          cost per call (mode native against plan). PART=67: small models' host time per step, native against Python
#          replay (model_host_profile.py setting normkit_python), conformance on CUDA (every op). PART=68: the native
#          replay's own clocks in models (allocations vs launches), then the whole `pytest -m cuda`.
# For the next session: PART=69: batch norm's fast routes (prepared in session 25 without a GPU): their CUDA tests
#          (same bits with and without, torch's errors), the plan users' CUDA tests, small models' host time with and
#          without routes (model_host_profile.py setting normkit_routes), conformance on CUDA; group norm's launch plans
#          (_CFG["plans"], prepared in session 25): their CUDA same-bits test and host cost per call (host_overhead.py).
#          PART=70: small models' host time with and without routes, conformance on CUDA (each part < 10 min).
# Session 26: PART=69 and 70 ran (results/h200-2026-12-04-s26); group norm's plans and batch norm's routes on by default.
#          PART=71: the routes' CUDA tests (which calls are noted and routed) with the aten / ops / nn / functional CUDA
#          tests at the new defaults, small models' host time with the share of calls routed, randomized cases on CUDA.
#          PART=72: routes off (A) against on (B) interleaved in one process (knob_ab.py fast_routes=0|1): PART=70/71's
#          model_host_profile medians disagreed in sign (3 rounds a setting in sequence; a drifting host).
#          PART=73: routes inside captured CUDA graphs: their CUDA test, graphed_steps.py on resnet18 / mobilenet_v3.
#          PART=74: layer / RMS norm's fast routes (ops/layer_norm.py ROUTES, prepared, off): their CUDA same-bits test,
#          the layer-norm kernel CUDA tests (plan keys now from forward_key / backward_key), host cost per call.
# Session 27: PART=76: the persistent grid-synchronised batch-norm forward (bn_persist_probe.py: one kernel, x re-read
#          in reverse from L2; prediction in NOTES-batch_norm.md, session 27), then PART=75's routes_ab host cost.
#          PART=77: the split reduction with TMA tiles (bn_reduce_probe.py tma:*) on every channels_last row, then the
#          CUDA tests PART=75 was to run (the layer-norm kernels whole, the routes).
#          Both ran (results/h200-2026-12-04-s27), with probe calls outside this script (persistent-forward phases, TMA at
#          one wave, wider rows channel blocks, bn_breakdown.py, conformance and randomized cases on CUDA): nothing is
#          left prepared. Next steps are in NOTES-batch_norm.md, session 27 (the forward reductions and the flat NCHW
#          7x7 pass are where the gap is).
# Session 28: PART=78: short NCHW planes as the (N, C*S) rows view (spread_*; prediction in NOTES-batch_norm.md,
#          session 28): its CUDA tests, then bn_kernels.py default (spread) against nospread and the tile variants.
#          PART=79: PART=78 (its logs under a-b/), then the batch-norm suite bench (every dtype) and resnet50 steps.
#          PART=80: every batch-norm kernel CUDA test, conformance on CUDA, randomized batch-norm cases on CUDA.
#          PART=82 (prepared): fp32 layer / RMS forward rows up to 1024 wide at 8 elements a thread (fwd_ept_4byte;
#          sweep fwdsmall32 measured -1..-2 % at 768 / 1024, session 28 call 10): set it to 8, then run this part.
#          PART=83 (prepared): the reductions alone (bn_reduce_probe.py), NCHW 7x7 spread view against the ncs one and
#          a streaming read, to see how far the spread reduction (0.32-0.46 of copy in call 5's breakdown) is from a read.
#          PART=81 (ran at 84a6e94; its kernel branch and variants are deleted since): the spread reduction's loop
#          steps as one [K*BM, BC] tile (spread_kstep_*), CUDA tests and A/B.
# Session 29: PART=84: fp32 narrow LN / RMS forward at 8 elements a thread (fwd_ept_4byte now 8): its CUDA tests
#          (the subset a forward launch change touches) and the randomized LN / RMS cases on CUDA; the spread reduction
#          with wider column blocks (spc512 / spc1k / spc2k: 1-4 KB row segments, P > 1, the same ~392 programs and
#          16 KB a step) alone (bn_reduce_probe.py) and in whole forwards / backwards (bn_kernels.py).
#          PART=85 (carry .whl): the wide layer / RMS forward run in L2-sized row groups (ln_group_probe.py: two
#          launches a group), then the layer / RMS suite bench with the peers at the session's code.
#          PART=86: the one-row forward's elements a thread at 4096 / 8192 and its register cap at 16384 (sweeps
#          fwdmid, fwdmid16k: Liger leads there by 1-4 %), batch norm's fp32 channels_last 7x7 backward grid variants.
#          PART=87 (carry .whl): RMS forward rows of 4097-8192 at 16 elements a thread (fwd_ept_wide_rms): the CUDA
#          tests a forward launch change touches, randomized RMS cases on CUDA, the 4096 / 8192 rows with the peers,
#          conformance on CUDA (every op) at the session's final kernels.
#          PART=88: the one-row forward loading w/b with x, Liger's order (sweep fwdwbearly, knob fwd_wb_early_min_block).
#          Ran (results/h200-2026-12-04-s29/call6-part88): early loads won for RMS and fp32 layer norm at 4096 / 8192.
# Session 30: PART=89 (carry .whl): fwd_wb_early_min_block 4096 (w/b loaded with x): its CUDA tests, randomized
#          layer / RMS cases on CUDA, the 4096 / 8192 rows with the peers. PART=90 (ran at ffb2e9d; its contig*
#          variants and red_rows_contig are deleted since): consecutive row chunks (no change) and two register sets
#          (twobuf196 won on the spread view, adopted as red_two_buf_spread with target_programs_spread 256).
#          PART=91: the CUDA tests at those defaults (every batch-norm kernel test, conformance, randomized batch-norm
#          cases) and bn_kernels.py against the old spread reduction (variant onebuf). PART=92: two sets only where a
#          program sums >= 16 row chunks (small layers lost 3-8 % in PART=91): the spread CUDA tests, the small A/B,
#          the batch-norm suite bench (every dtype, cuDNN / FlagGems) and resnet50 steps. PART=93: resnet50 again.
#          PART=94: two sets on the rows view (rtb* variants). PART=95: its CUDA tests and A/B (adopted: <= 8 column
#          blocks, 264 programs, not the fp32 backward).
# For the next session: PART=96 (carry .whl): channels_last 7x7 in 8 column blocks with two sets (variant rtbwide),
#          then the batch-norm suite bench with FlagGems and resnet50 steps at the session's code (prediction in
#          NOTES-batch_norm.md, session 30). PART=97: the spread reduction's loop pipelined through shared memory
#          (red_spread_stages, prepared offline: cp.async on sm_90, default PTX unchanged): its CUDA tests, the probe
#          and the A/B (prediction in NOTES-batch_norm.md, session 30).
#          PART=98: the wide layer / RMS forward through the looped kernel with both loops pipelined through shared
#          memory (fwd_loop_stages, prepared offline): its CUDA tests, then sweep fwdloopst against today's split
#          forward (prediction in NOTES-layer_norm.md, session 30).
#          PART=75: the layer-norm kernel CUDA tests whole (PART=74 stopped at its limit with 78 passed),
#          host cost per call with routes off / on alternating within rounds (host_overhead.py routes_ab: PART=74's
#          rows drifted 1.6-1.9x between rows).
# PART=64: a batch-norm call's host time by piece in loops with and without cache-evicting work between calls and in
#          models (host_cache_probe.py; prediction in NOTES-host-overhead.md, session 24). PART=65: the final code's
#          batch-norm kernel CUDA tests, conformance on CUDA (every op), randomized cases on CUDA.
# Older:
# PART=5: conformance on CUDA at the final code (session 8's last attempt hit its 110 s limit on a cold
#         Triton cache) and the CUDA tests of the prepared layer-norm paths (-k "coop or hold").
# PART=6: their sweeps: the cooperative several-rows backward (ln_kernels.py group bwdcooprows), the narrow
#         mixed-dtype backward holding w (bwdmixnarrow) and that forward's tile (fwdmixnarrow), all prepared
#         in session 8 (NOTES-layer_norm.md); then bn_breakdown.py on resnet50's layers in both layouts.
# Session 9:
# PART=7: host cost per call (baseline for the host-path work), conformance on CUDA, the whole `pytest -m cuda`.
# PART=8: the whole `pytest -m cuda` (raw C-launcher calls, the fused combine), host cost per call in three
#         launch modes, batch norm's fused combine against the combine kernel (nofuse) and a wider limit.
# PART=10: which launch path the kernels take (probe_raw.py), the whole `pytest -m cuda`, conformance on CUDA.
# PART=11: the probe, host cost per call in three launch modes (the raw call now taken: Triton 3.6's launch
#          hooks are an empty HookChain, never None), resnet50 steps, the whole `pytest -m cuda`.
# For the next session:
# PART=12: the CUDA tests of launch plans, host cost per call in four modes (plan: NORMKIT_LAUNCH_PLANS,
#          prepared in session 9), resnet50 steps without and with plans.
# PART=9: the suite bench of batch norm (every dtype), resnet50 steps, the layer-norm sweeps of PART=6.
# Session 10:
# PART=13: the CUDA tests of launch plans (on by default now; views of inputs / scratch in plans: the
#          layer-norm backward's) and of batch norm's L2 eviction hints, their sweep, the layer-norm
#          sweeps of PART=6. (The hints and the sweep's losing layer-norm kernel are deleted since.)
# PART=14: the whole `pytest -m cuda` at the adopted code, host cost per call, resnet50 / ViT / GPT-2 steps.
# PART=15: the suite bench of layer and RMS norm (every dtype, peers), batch norm's per-kernel time on
#          resnet50's channels_last layers.
# PART=16: PART=15's bench again with FlagGems importable, resnet50 steps on another lease.
# Session 11:
# PART=17: shapes outside the suite (layer / RMS widths 320 ... 20480, non-powers of two; batch norm with odd
#          channel counts, unaligned planes, C = 3, 3-D, 2-D) side by side with the peers; resnet50 steps.
# PART=18: the layer-norm CUDA tests with two-part forward rows, sweeps fwdtwopart / bwd2k / bwd512.
# PART=19: the whole `pytest -m cuda` at the adopted knobs, PART=17's layer / RMS bench again (and 512 / 384
#          wide rows), resnet50 steps (PART=17's NCHW step was 87.8 ms against 56.6 ms of GPU time).
# PART=20: conformance on CUDA at the final code; the looped forward against the rows kernel where FlagGems
#          leads (sweeps fwdloopmid, fwdloopwide).
# For the next session:
# PART=21: `pytest -m cuda` (new: widths 320 / 1600 / 16385 / 20480 in test_cuda_widths), the prepared two-part
#          prefetching backward (sweep bwdtwopart), the persistent two-part forward (sweep fwdpersist2p).
# Session 12:
# PART=22: PART=21's sweeps first, the host trace of a batch-norm forward + backward per path (host_trace.py:
#          which aten ops and kernels the channels_last enable() path runs), then `pytest -m cuda -v` with
#          what time is left (the log names every test run, so a second call can take the rest).
# PART=23: the persistent forward at every width of the 16384 class (sweep fwdpersist16k), the layer / RMS bench
#          of the two-part widths with the peers (20480 persistent now), the layer-norm CUDA tests. (It ran
#          03a4c5d's src and tests: its `git checkout HEAD` met the device copy's stale .git; removed since.)
# PART=24: capped warps for two-part forward rows (sweep fwd2pwarps), the layer / RMS bench of the two-part
#          widths with the peers, the layer-norm CUDA tests (cut by its 150 s timeout after 31 passed).
# PART=25: bf16 x / fp32 w two-part rows (sweep fwd2pmix: call 3's bench had 9216 at 0.36 SOL), the whole
#          `pytest -m cuda -v` but the randomized differential test, then that test on CUDA (a third of its
#          810 CUDA cases: each new shape class compiles kernels on a cold Triton cache).
# For the next session:
# PART=26: the CUDA tests call 4's timeout cut (tests/test_aten.py, tests/test_functional.py), the randomized
#          test on CUDA again (half its cases; the seed is in pytest's header now: call 4's four batch-norm
#          failures lost theirs), conformance on CUDA at the final code.
# PART=27: batch norm A/B (session 13: the mean-of-8 forward shift, not adopted): the batch-norm kernel CUDA tests, the
#          randomized test's batch-norm / module / instance-norm cases on CUDA (seed given, SIGINT on timeout so
#          pytest still prints its failures), and the training forward before (ab_old/: the previous commit's src,
#          git-excluded: run with carry=["ab_old"]) against after, bn_kernels.py (AB_ROUNDS, AB_MODES), alternating.
# For the next session:
# PART=28: the CUDA tests session 13 could not run (tests/test_functional.py: the modules under real CUDA autocast;
#          tests/test_aten.py; the batch-norm kernel tests at the final code), then the suite bench of batch norm
#          (every dtype, with the peers: the NCHW backward's peeled first step, -3..-4.5 % in bn_kernels.py) and
#          resnet50 steps.
# PART=29: session 14: the CUDA tests of the eps-probe fix (test_functional's compile test) and of the pipelined
#          cooperative backward (test_cuda_coop_backward, pipe 0 / 1), its sweep (bwdcooppipe: cols / coop / pipe at 4
#          and 8 programs per SM, wide rows, bf16 and fp32), batch norm's per-kernel time on resnet50's layers.
#          (The pipelined kernel and its sweep group are deleted since: NOTES-layer_norm.md, session 14.)
# PART=30: the CUDA tests of layer norm's db split (test_cuda_db_split), its sweep (lnbwddbsplit: the 16-bit
#          backward at the 16384 class, cooperative kernel against rows kernel + db kernel).
# PART=31: the final check of a session: conformance on CUDA, then the whole `pytest -m cuda` but the randomized test
#          (SIGINT at its limit, so pytest still reports), the randomized test's seed given (RANDOM_S seconds, 0: skip).
# Session 15:
# PART=33: conformance on CUDA (launch plans keyed on every input's shape / strides / dtype, the eps = 0 eval case
#          as the installed torch rules; CHECK_S=0 skips it), the CUDA tests of plans, aten, functional and custom ops,
#          host cost per call. (Calls 2-4 ran the L2-block wide backward's CUDA tests and sweep bwdl2 here: deleted since.)
# For the next session:
# PART=34: batch norm's reductions with Triton's software pipelining (red_ncs_stages, red_rows_stages; prepared in
#          session 15, offline sm_90: cp.async into shared memory, but not at bf16 7x7 NCHW): their CUDA test (same
#          bits), then the A/B (bn_kernels.py variants ncsst2/3, rowsst2/3/4, forward and backward, both layouts).
# PART=35: the 5-pass wide layer / RMS backward (16-bit past 16384, fp32 past 65536) with Triton's software pipelining
#          (bwd_rowsum_stages, bwd_cols_stages, prepared in session 15): its CUDA test (same bits), the sweep bwdst.
# Session 16: PART=34 (the batch-norm reductions pipelined: slower on most rows, deleted, with its branch here)
# and PART=35 (the 5-pass wide backward pipelined: geomean -13 %, adopted at 3 stages) ran as above.
# PART=36: the layer-norm kernels' CUDA tests at the adopted stages, then around them (sweep bwdst4: 2 / 4 stages,
#          row-sum chunk, column tile) and the 5-pass path where the db-split / rows / cooperative kernels run now
#          (sweep bwd5route, per row).
# PART=37: the suite bench of layer and RMS norm (every dtype, peers) and of batch norm (every dtype): the README's
#          headline table at the current code.
# For the next session:
# PART=38: the CUDA tests of session 16's CPU-only changes (instance norm's shifted running variance; SyncBatchNorm
#          over gloo with CUDA tensors, three ranks on one GPU), then the randomized test's cases session 16 did not
#          reach on CUDA (seed 20261216: instance norm's 4 failures again, batch norm, group norm), and SyncBatchNorm's
#          per-rank primitives against torch's (benchmarks/sync_bn_bench.py).
# PART=39: the plain rows backward pipelined by Triton (bwd_rows_stages, prepared in session 16): its CUDA test
#          (same bits), then the sweep bwdrowsst (LN / RMS 8192-16384 wide rows, 2-4 stages).
# PART=32: the layer-norm bench at the rows the db split moves (4096x16384, 8192x12288, 8192x9216; bf16, fp16, bf16 x /
#          fp32 w; ATen, Liger, FlagGems side by side).
# Session 18:
# PART=40: the two-launch split forward's second launch with several rows per program (fwd_split_apply_rows) and
#          two launches at 65536 (fwd_split_fused_max_block*): its CUDA tests (same bits), the sweep fwdsplitrows.
# PART=41: the layer-norm kernels' CUDA tests at the heavy-params routing, the one-row forward's registers capped
#          (fwd_maxnreg: its same-bits CUDA test, the sweep fwdmaxnreg).
# PART=42: the suite bench of layer and RMS norm (every dtype, peers) at the adopted split / register knobs, the
#          split forward's widths outside the suite, the randomized test's layer / RMS cases on CUDA.
# Session 19:
# PART=43: the lag split forward's CUDA tests (same bits as two launches), the sweeps bwdnarrow (the narrow plain
#          backward: LN fp32 262144x256 at 0.54 SOL) and fwdlag (the lag split forward against today's routing; the
#          kernel, its tests and the group are deleted since).
# PART=44: the CUDA tests of the fp32 narrow backward on the prefetching kernel and of batch norm's flat pass loading
#          first; that pass's A/B (bn_kernels variants flatlf, flat16k, flatlf16k: their knobs are deleted since, the
#          tile-first order kept as the only one); the narrow layer / RMS rows' bench.
# PART=45: PDL same-bits CUDA tests (the flat pass now loads first), the sweep bwdpf16 (16-bit narrow backward's
#          programs per SM), the randomized batch-norm cases on CUDA, the batch-norm suite bench and resnet50 steps.
# PART=46: layer norm's PDL same-bits CUDA tests at the adopted 16-bit narrow backward, the layer / RMS suite bench.
# For the next session:
# PART=47: all layer-norm kernel CUDA tests at the final code (test_cuda_widths has not run on the 16-bit narrow
#          backward's two / four rows a block), the randomized layer / RMS cases on CUDA.
# PART=48: the cooperative backward holding its chunk's w (bwd_coop_hold_w, prepared in session 19): its CUDA tests
#          and the sweep bwdcoophold. Ran inside session 20's PART=49: -1.2 % on its row; the knob is deleted since.
# Session 20:
# PART=49: batch norm's split reduction alone against read-only references (benchmarks/bn_reduce_probe.py: the
#          forward reductions ran at 0.54-0.69 of copy on the 51-103 MB layers, session 14's bn_breakdown), the sweep
#          bwdcoophold (PART=48's; its knob deleted since), every layer-norm kernel CUDA test (PART=47's first half).
# PART=50: the probe again with more variants (the rows reduction's loads two steps ahead, 4-warp programs, fewer ncs
#          forward programs; forward and backward sums), their CUDA same-bits test, the A/B of the candidates on whole
#          forwards / backwards (bn_kernels.py), the randomized layer / RMS cases on CUDA (PART=47's second half).
#          (The two-steps-ahead knob, red_dist_rows, lost and is deleted since; its branch here names variants that
#          are gone.)
# PART=51: the batch-norm kernel CUDA tests at the adopted reduction rules (4-warp rows forward from 256-byte row
#          segments; 256 ncs forward programs for aligned 16-bit planes), the batch-norm suite bench and resnet50 steps.
# PART=52: the backward's rows sums at 4 warps from 256-byte row segments (red_warps_rows_bwd; bn_kernels.py variant
#          rowsbw4, every rows-view suite shape, bf16 and fp32), the batch-norm kernel CUDA tests at that setting.
#          (Adopted; the forward's and backward's knobs are one since, red_warps_rows_wide, and this block is gone.)
# For the next session:
# PART=53: conformance on CUDA and the randomized batch-norm / module / instance-norm cases on CUDA at session 20's
#          reduction rules (new reduction orders: 4-warp rows programs, fewer ncs forward programs); then the probe with
#          its tile-partials reductions (programs that read K = 1-8 tiles and exit, partials summed after: do they reach
#          the streaming read's 0.92-1.03 of copy, and what do the partials cost?).
# For session 32 (session 31 had no GPU): PART=99 first: session 31's changes on CUDA (the batch / layer norm kernel
#          packages, pipeline stages sized to shared memory, double-backward graphs, the add_* sum rules): the launch,
#          custom-op, functional and aten CUDA tests, every layer-norm kernel test with stages or the wide backward,
#          conformance on CUDA; then PART=96 / 97 / 98 (session 30's plan, predictions in the NOTES). Merge branch
#          s31-gn-nan first (group norm's NaN fixes, kernel changes made without a GPU): PART=99 runs the group-norm
#          kernel CUDA tests too, and it lands on main only if they pass (NOTES-group_norm.md on that branch).
# Session 32: a GPU came late; ran PART=101 (replaces 99: sessions 31-32's changes on CUDA, s31-gn-nan merged after
#          it passed), PART=100 (conformance of torch's ops under normkit.enabled and under FlagGems' norm ops) and
#          session 30's PART=97 / 98 (both variants lost and were deleted with their blocks; results/h200-2026-12-05-s32).
# For the next session: PART=96 (carry .whl: rtbwide A/B, the batch-norm suite bench with FlagGems, resnet50 steps).
# Session 33: PART=96 and 102 ran (results/h200-2026-12-05-s33). For the next session: check out branch s33-rows-full
#          (1024-column blocks for 16-bit rows of >= 1024 channels) and run its PART=104 (CUDA tests, conformance, A/B
#          against oldrows, resnet50); merge if they pass. Then PART=103 (carry .whl: batch norm against FlagGems).
# Session 34 (no GPU lent): a CPU audit fixed host-side defects on main and moved group norm's backward to form the
#          sum times rstd before rstd**3 on branch s34-gn-rstd (a kernel change): check it out and run PART=105
#          (CUDA tests of the group-norm kernels and of session 34's host changes, conformance on CUDA); merge if they
#          pass. Order: 104 (s33-rows-full), 105 (s34-gn-rstd), 103.
# Session 35: PART=106 = 104 + 105 in one call (branch s35-gpu). Batch norm's forward shifts by a median of three of
#          each program's elements (branch s35-bn-robust, CPU-built): PART=107 runs every touched CUDA test and
#          conformance on s35-all (both branches merged, and s35-gn-median: instance norm's median-of-three shift and
#          group reference), PART=108 (carry ab_old = s35-gpu's src) the batch-norm A/B and the randomized batch-norm
#          cases on CUDA (predictions: NOTES-batch_norm.md and NOTES-group_norm.md, session 35). PART=107 also runs
#          the bench timer's CUDA test (s35-bench-graph: graphs sized from device time).
#          PART=107 ran on an H100 (results/h100-2026-12-05-s35); s33-rows-full and s34-gn-rstd landed after it;
#          a second short call passed the group-norm kernel / bench-timer CUDA tests and group / instance conformance,
#          after which s35-gn-median (with its fix) and s35-bench-graph landed too.
# For the next session: check out branch s35-all (pending there: batch norm's median-of-three shifts), recreate
#          ab_old/src from main (`git archive main src | tar -x -C ab_old`), then PART=109 (carry ab_old: group-norm
#          kernel and bench-timer CUDA tests, group / instance conformance, the forward A/B) and PART=108 (the full
#          A/B in two rounds, randomized batch-norm cases); merge s35-all into main if the tests pass and the A/B
#          stays within the NOTES' prediction. Then PART=103 (carry .whl: batch norm against FlagGems).
# Session 36: s35-all was lost with the session's checkout; batch norm's median-of-three shift was rebuilt on
#          s36-bn-median (one shift a channel: NOTES-batch_norm.md, session 36) and landed after PART=110 ran twice on
#          an H100 (results/h100-2026-12-05-s36). For the next session: PART=103 (carry .whl: the bench of batch norm
#          with FlagGems / torch.compile at the landed code, on an H200), then PART=110 (carry ab_old) with
#          CHECK_S=150 (conformance on CUDA, not run this session) and the randomized batch-norm cases on CUDA
#          (random_cuda_tests), its A/B with AB_SHAPES adding a channels_last C = 3 / 4 shape (the one-set rows
#          forward at BC = 4 went 80 -> 123 registers with its peeled step, offline); then the constant-plane ncs
#          forward (S = 196 fp32, +3-4 %) without its peel; then merge the two-set rows loops into one helper (the
#          duplicate `duplicates --change` reports) and check its PTX and CUDA tests.
# Session 37: PART=103 ran on an H100 (results/h100-2026-12-05-s37: the suite with FlagGems / compile, conformance on
#          CUDA 777 / 777); on an H200, rows kernels told C's alignment (row_align) landed after their CUDA tests
#          (results/h200-2026-12-05-s37). For the next session (no carry): PART=111: bn_shift_probe.py (what the
#          median-of-three shift's samples cost at C = 3 / 4, contiguous, +8-9 % in session 37), odd NCHW planes
#          (element-by-element ncs loads offline; Inception-v3) as the spread view or the flat pass (spread320 /
#          spread1536 / spreadodd / flat320), plane_align (prepared off: its CUDA test, A/B at 38x38 / 50x50 / 150x150).
#          PART=112: layer / RMS norm's row_align (prepared off: CUDA tests, sweep rowalign), batch norm's fold_max_c
#          (odd C channels_last folded; prepared off: CUDA test, A/B), the fp32 eval rows batch norm's row_align slowed
#          by 4-5 % in one round. Predictions: NOTES-batch_norm.md / NOTES-layer_norm.md,
#          session 37. Turn each prepared knob on only after its CUDA test passes and its A/B loses no row.
# Session 38: PART=111 / 112 ran on an H100 (results/h100-2026-12-05-s38): plane_align, fold_max_c (2-byte inputs) and
#          layer norm's row_align turned on. PART=113: the CUDA tests at those defaults, conformance on CUDA, the odd-plane
#          spread reduction / elementwise pass apart (knobs spread_max_plane_odd / _ew_odd, off), fold at even C.
#          PART=113 ran (call 3): the spread elementwise pass on odd planes won everywhere (on, to 8192 elements), the
#          fold lost at even C / C = 1 (now odd C only). PART=114: the CUDA tests PART=113's limits cut, at those defaults.
#          PART=114 passed (call 4). For the next session: PART=115: fold_sum (prepared, off: folded programs sum their
#          K columns of each channel, so the partials cap stops cutting the grid by K), its CUDA test and A/B (odd C, and
#          even C / C = 1 with fold_all_c). Prediction in NOTES-batch_norm.md, session 38. PART=116 (carry ab_old,
#          main's src before session 36: `git archive 6e6d762 src`): per-kernel time of the C = 3 / 4 contiguous rows
#          that session 36's shift slowed 8-9 % (the samples' loads cost nothing: call 1), old against main.
#          Then, on an H200: PART=103 (carry .whl; the batch-norm suite with the peers, not re-benched there since
#          session 33) and the layer / RMS suite.
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=src
PART=${PART:-1}
OUT=${OUT:-/tmp/normkit-next}
W="$OUT/next$PART"
mkdir -p "$W"
T0=$(date +%s)
stamp() { echo "=== $1 at +$(( $(date +%s) - T0 ))s"; }
# the peers' wheels carried in .whl (liger-kernel, flag-gems and its needs), and the commit for the bench JSON
use_wheels() {
    if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; then
        export PYTHONPATH=/tmp/site:${NORMKIT_SRC:-src}  # NORMKIT_SRC: another tree's src (e.g. ab_old/src)
    fi
    export NORMKIT_GIT_SHA=${NORMKIT_GIT_SHA:-unknown}
}
# ln_kernels.py sweep groups ($1) within a budget of $2 s; its choices
ln_sweep() {
    timeout $(( $2 + 20 )) python3 benchmarks/ln_kernels.py --out "$W" --sweep --groups "$1" --sweep-budget "$2" \
        --no-rows > "$W/ln_kernels.log" 2>&1; echo "ln rc=$?"
    grep -E "${SWEEP_LINES:-chose|FAILED}" "$W/ln_kernels.log" | cut -c1-300 | tail -60
}
# `pytest -m cuda` of the given tests within $1 s (SIGINT, so pytest still reports), its failures
cuda_tests() {
    local limit=$1; shift
    timeout -s INT "$limit" python3 -m pytest -q --tb=short -m cuda "$@" > "$W/pytest_cuda.log" 2>&1
    echo "pytest rc=$?"; tail -1 "$W/pytest_cuda.log"; grep -E "^FAILED|^E  " "$W/pytest_cuda.log" | head -20
}
# layer / RMS bench with the peers (budget $1 s) at the shapes that follow
ln_bench() {
    local budget=$1; shift
    timeout $(( budget + 20 )) python3 -m normkit bench --ops layer_norm rms_norm --shapes "$@" --dtypes bf16 fp32 bf16:fp32 \
        --peers aten liger flaggems --budget "$budget" --json "$W/bench-ln/bench.json" --out "$W/bench-ln" --no-progress \
        > "$W/bench-ln.log" 2>&1; echo "bench rc=$?"
}
# the suite bench of batch norm (every dtype, with the peers) and resnet50 training steps
bn_bench_and_resnet() {
    stamp "bench: batch norm, every dtype"
    timeout 200 python3 -m normkit bench --ops batch_norm --all-dtypes --peers ${BN_PEERS:-aten aten-native flaggems} \
        --budget 180 --json "$W/bench/bench.json" --out "$W/bench" --no-progress \
        > "$W/bench.log" 2>&1; echo "bench rc=$?"; sed -n '/## Headline/,/^!\[/p' "$W/bench/summary.md" | head -30
    stamp "resnet50 training steps (both layouts), with and without enable()"
    timeout 140 python3 -m normkit bench --models resnet50 --json "$W/models/bench.json" --out "$W/models" --no-progress \
        > "$W/models.log" 2>&1; echo "models rc=$?"; grep -iE "resnet" "$W/models/summary.md" | head -20
}
# the layer / RMS suite bench in every dtype with the peers (budget $1 s) into $W/$2
ln_suite_bench() {
    timeout $(( $1 + 20 )) python3 -m normkit bench --ops layer_norm rms_norm --all-dtypes --peers aten liger flaggems \
        --budget "$1" --json "$W/$2/bench.json" --out "$W/$2" --no-progress \
        > "$W/$2.log" 2>&1; echo "bench rc=$?"; sed -n '/## Headline/,/^!\[/p' "$W/$2/summary.md" | head -30
}
# layer / RMS norm's 8192x8192 and 16384x4096 rows, every dtype, with the peers, into $W/$1; the forward lines
mid_rows_bench() {
    timeout 120 python3 -m normkit bench --ops rms_norm layer_norm --shapes 8192x8192 16384x4096 --dtypes bf16 fp16 fp32 \
        --peers aten liger flaggems --budget 90 --json "$W/$1/bench.json" --out "$W/$1" --no-progress \
        > "$W/$1.log" 2>&1; echo "bench rc=$?"; grep -E "fwd" "$W/$1/summary.md" | head -24
}
# the randomized differential test on CUDA, seed $1, within $2 s (SIGINT, so pytest still reports), more pytest args after
random_cuda_tests() {
    local seed=$1 limit=$2; shift 2
    NORMKIT_RANDOM_SEED=$seed timeout -s INT "$limit" python3 -m pytest -q --tb=short -m cuda tests/test_randomized.py "$@" \
        > "$W/pytest_randomized_cuda.log" 2>&1; echo "pytest rc=$?"; tail -1 "$W/pytest_randomized_cuda.log"
    grep -E "^FAILED|^E  |replay" "$W/pytest_randomized_cuda.log" | head -30 | cut -c1-300
}
# the layer-norm kernels' CUDA tests within $1 s
ln_cuda_tests() {
    timeout "$1" python3 -m pytest -q -m cuda tests/kernels/test_layer_norm_kernels.py > "$W/pytest_ln.log" 2>&1
    echo "pytest rc=$?"; tail -1 "$W/pytest_ln.log"; grep -E "^FAILED|^E  " "$W/pytest_ln.log" | head -20
}
# every batch-norm kernel CUDA test, then conformance on CUDA (every op)
# `normkit check --device cuda` (every op) within CHECK_S (default $1) s
cuda_check() {
    stamp "conformance on CUDA (normkit check)"
    timeout ${CHECK_S:-$1} python3 -m normkit check --impl normkit --device cuda --quiet --json "$W/check_cuda.json" \
        > "$W/check_cuda.log" 2>&1; echo "check rc=$?"; tail -15 "$W/check_cuda.log" | cut -c1-200
}
bn_tests_and_check() {
    stamp "pytest -m cuda: every batch-norm kernel test"
    cuda_tests ${PYTEST_S:-150} tests/kernels/test_batch_norm_kernels.py
    cuda_check 200
}
# host_overhead.py (2 rounds) within HOST_S (default $1) s; the log's lines matching $2, the last $3 (default 40)
host_cost() {
    timeout ${HOST_S:-$1} python3 benchmarks/host_overhead.py --out "$W/host" --rounds 2 > "$W/host.log" 2>&1
    echo "host_overhead rc=$?"; grep -E "$2" "$W/host.log" | cut -c1-260 | tail -${3:-40}
}
# model_host_profile.py within PROF_S (default $1) s on PROF_MODELS (default $2), PROF_ROUNDS (default $3) rounds
host_profile() {
    timeout ${PROF_S:-$1} python3 benchmarks/model_host_profile.py --out "$W/host_profile" --models ${PROF_MODELS:-$2} \
        --rounds ${PROF_ROUNDS:-$3} > "$W/model_host_profile.log" 2>&1; echo "profile rc=$?"
    grep -E "^\[|Error|inside|native" "$W/model_host_profile.log" | cut -c1-600
}
{
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [ "$PART" = 1 ]; then
    stamp "pytest -m cuda"
    timeout 300 python3 -m pytest -q -m cuda tests > "$W/pytest_cuda.log" 2>&1; echo "pytest rc=$?"
    tail -1 "$W/pytest_cuda.log"; grep -E "^FAILED|^E  " "$W/pytest_cuda.log" | head -20
    stamp "group-norm variants"
    timeout 230 python3 benchmarks/gn_kernels.py --out "$W" --variants base,ncnobwdwhole,ncbs1k \
        --budget 210 > "$W/gn_kernels.log" 2>&1; echo "sweep rc=$?"; cut -c1-200 "$W/gn_kernels.log"
elif [ "$PART" = 2 ]; then
    stamp "pytest -m cuda -k pdl (programmatic dependent launch: same bits, CUDA graphs)"
    timeout 120 python3 -m pytest -q -m cuda -k "pdl or graph" tests > "$W/pytest_pdl.log" 2>&1; echo "pytest rc=$?"
    tail -1 "$W/pytest_pdl.log"; grep -E "^FAILED|^E  " "$W/pytest_pdl.log" | head -20
    stamp "conformance"
    timeout 110 python3 -m normkit check --impl normkit --device cuda --quiet --json "$W/check_cuda.json" \
        > "$W/check_cuda.txt" 2>&1; echo "check rc=$?"; head -14 "$W/check_cuda.txt"
    stamp "batch-norm combine tiles and programmatic dependent launch"
    timeout 200 python3 benchmarks/bn_kernels.py --out "$W" --budget 170 --only-variants nopdl,comb4kbwd,comb1kfwd \
        --shapes 256x2048x7x7,256x1024x14x14,256x64x56x56,65536x1024,256x512x7x7,256x256x14x14,256x128x28x28,256x512x28x28 --modes fwd,bwd \
        > "$W/bn_kernels.log" 2>&1; echo "bn rc=$?"; tail -60 "$W/bn_kernels.log" | cut -c1-220
    stamp "layer / RMS backward: dw/db reduction with programmatic dependent launch"
    timeout 150 python3 benchmarks/ln_kernels.py --out "$W" --sweep --groups bwdpdl --sweep-budget 100 --no-rows \
        > "$W/ln_kernels.log" 2>&1; echo "ln rc=$?"; grep -E "sweep bwdpdl|chose|FAILED" "$W/ln_kernels.log" | cut -c1-200 | tail -40
elif [ "$PART" = 3 ]; then
    stamp "pytest -m cuda"
    timeout 240 python3 -m pytest -q -m cuda tests > "$W/pytest_cuda.log" 2>&1; echo "pytest rc=$?"
    tail -1 "$W/pytest_cuda.log"; grep -E "^FAILED|^E  " "$W/pytest_cuda.log" | head -20
    stamp "group norm: programmatic dependent launch"
    timeout 100 python3 benchmarks/gn_kernels.py --out "$W" --variants base,pdl --budget 85 \
        > "$W/gn_kernels.log" 2>&1; echo "gn rc=$?"; grep -E "base|pdl" "$W/gn_kernels.log" | cut -c1-120
elif [ "$PART" = 5 ]; then
    stamp "conformance"
    timeout 240 python3 -m normkit check --impl normkit --device cuda --quiet --json "$W/check_cuda.json" \
        > "$W/check_cuda.txt" 2>&1; echo "check rc=$?"; head -14 "$W/check_cuda.txt"
    stamp "pytest -m cuda -k coop"
    timeout 150 python3 -m pytest -q -m cuda -k "coop or hold" tests > "$W/pytest_coop.log" 2>&1; echo "pytest rc=$?"
    tail -1 "$W/pytest_coop.log"; grep -E "^FAILED|^E  " "$W/pytest_coop.log" | head -20
elif [ "$PART" = 7 ]; then
    stamp "host cost per call"
    timeout 90 python3 benchmarks/host_overhead.py --out "$W" > "$W/host_overhead.log" 2>&1; echo "host rc=$?"
    cut -c1-160 "$W/host_overhead.log" | head -40
    stamp "conformance"
    timeout 230 python3 -m normkit check --impl normkit --device cuda --quiet --json "$W/check_cuda.json" \
        > "$W/check_cuda.txt" 2>&1; echo "check rc=$?"; head -14 "$W/check_cuda.txt"
    stamp "pytest -m cuda"
    timeout 250 python3 -m pytest -q -m cuda tests > "$W/pytest_cuda.log" 2>&1; echo "pytest rc=$?"
    tail -1 "$W/pytest_cuda.log"; grep -E "^FAILED|^E  " "$W/pytest_cuda.log" | head -20
elif [ "$PART" = 8 ]; then
    stamp "pytest -m cuda"
    timeout 200 python3 -m pytest -q -m cuda tests > "$W/pytest_cuda.log" 2>&1; echo "pytest rc=$?"
    tail -1 "$W/pytest_cuda.log"; grep -E "^FAILED|^E  " "$W/pytest_cuda.log" | head -20
    stamp "host cost per call: triton / direct / raw launch"
    timeout 170 python3 benchmarks/host_overhead.py --out "$W" > "$W/host_overhead.log" 2>&1; echo "host rc=$?"
    grep -v -i warn "$W/host_overhead.log" | cut -c1-150 | head -40
    stamp "batch norm: fused combine (default) / combine kernel (nofuse) / fused up to 64K"
    timeout 190 python3 benchmarks/bn_kernels.py --out "$W" --budget 170 --only-variants nofuse,fuse64k \
        --shapes 256x2048x7x7,256x1024x14x14,256x512x28x28,256x128x28x28,256x256x14x14,256x512x7x7,65536x1024,256x64x56x56 \
        --modes fwd,bwd > "$W/bn_kernels.log" 2>&1; echo "bn rc=$?"; tail -40 "$W/bn_kernels.log" | cut -c1-200
elif [ "$PART" = 10 ]; then
    stamp "launch path probe"
    timeout 60 python3 benchmarks/probe_raw.py 2>&1 | tee "$W/probe_raw.log"
    stamp "pytest -m cuda"
    timeout 280 python3 -m pytest -q -m cuda tests > "$W/pytest_cuda.log" 2>&1; echo "pytest rc=$?"
    tail -1 "$W/pytest_cuda.log"; grep -E "^FAILED|^E  " "$W/pytest_cuda.log" | head -20
    stamp "conformance"
    timeout 170 python3 -m normkit check --impl normkit --device cuda --quiet --json "$W/check_cuda.json" \
        > "$W/check_cuda.txt" 2>&1; echo "check rc=$?"; head -14 "$W/check_cuda.txt"
elif [ "$PART" = 11 ]; then
    stamp "launch path probe"
    timeout 60 python3 benchmarks/probe_raw.py 2>&1 | tee "$W/probe_raw.log"
    stamp "host cost per call: triton / direct / raw launch"
    timeout 110 python3 benchmarks/host_overhead.py --out "$W" --calls 100 --rounds 2 > "$W/host_overhead.log" 2>&1
    echo "host rc=$?"; grep -v -i warn "$W/host_overhead.log" | cut -c1-150 | head -40
    stamp "resnet50 training steps (both layouts), with and without enable()"
    timeout 140 python3 -m normkit bench --models resnet50 --json "$W/models/bench.json" --out "$W/models" --no-progress \
        > "$W/models.log" 2>&1; echo "models rc=$?"; grep -iE "resnet" "$W/models/summary.md" | head -20
    stamp "pytest -m cuda"
    timeout 250 python3 -m pytest -q -m cuda tests > "$W/pytest_cuda.log" 2>&1; echo "pytest rc=$?"
    tail -1 "$W/pytest_cuda.log"; grep -E "^FAILED|^E  " "$W/pytest_cuda.log" | head -20
elif [ "$PART" = 12 ]; then
    stamp "pytest -m cuda -k plan (launch plans: same bits as the launchers)"
    timeout 120 python3 -m pytest -q -m cuda -k "plan or direct_launch" tests > "$W/pytest_plan.log" 2>&1
    echo "pytest rc=$?"; tail -1 "$W/pytest_plan.log"; grep -E "^FAILED|^E  " "$W/pytest_plan.log" | head -20
    stamp "host cost per call: triton / direct / raw / plan"
    timeout 140 python3 benchmarks/host_overhead.py --out "$W" --calls 100 --rounds 2 > "$W/host_overhead.log" 2>&1
    echo "host rc=$?"; grep -v -i warn "$W/host_overhead.log" | cut -c1-160 | head -40
    for plans in 0 1; do
        stamp "resnet50 training steps, NORMKIT_LAUNCH_PLANS=$plans"
        NORMKIT_LAUNCH_PLANS=$plans timeout 140 python3 -m normkit bench --models resnet50 --json "$W/models$plans/bench.json" \
            --out "$W/models$plans" --no-progress > "$W/models$plans.log" 2>&1; echo "models rc=$?"
        grep -iE "resnet" "$W/models$plans/summary.md" | head -20
    done
elif [ "$PART" = 13 ]; then
    stamp "pytest -m cuda -k 'plan or l2_hints or pdl' (launch plans on by default; L2 eviction hints: same bits)"
    timeout 150 python3 -m pytest -q -m cuda -k "plan or l2_hints or pdl" tests > "$W/pytest_sel.log" 2>&1; echo "pytest rc=$?"
    tail -1 "$W/pytest_sel.log"; grep -E "^FAILED|^E  " "$W/pytest_sel.log" | head -20
    stamp "batch norm: L2 eviction hints"
    timeout 200 python3 benchmarks/bn_kernels.py --out "$W" --budget 180 --only-variants l2ew,l2red,l2both,l2both128,l2bothall \
        --shapes 256x2048x7x7,256x1024x14x14,256x64x56x56,256x512x7x7,256x256x14x14,256x128x28x28,65536x1024,256x512x28x28 \
        --modes fwd,bwd > "$W/bn_kernels.log" 2>&1; echo "bn rc=$?"; tail -75 "$W/bn_kernels.log" | cut -c1-200
    stamp "layer / RMS: cooperative backward, several rows per exchange; narrow mixed-dtype backward / forward"
    timeout 170 python3 benchmarks/ln_kernels.py --out "$W" --sweep --groups bwdcooprows,bwdmixnarrow,fwdmixnarrow --sweep-budget 150 \
        --no-rows > "$W/ln_kernels.log" 2>&1; echo "ln rc=$?"
    grep -E "sweep (bwdcooprows|bwdmixnarrow|fwdmixnarrow)|chose|FAILED" "$W/ln_kernels.log" | cut -c1-200 | tail -50
elif [ "$PART" = 14 ]; then
    stamp "pytest -m cuda (launch plans on by default, the adopted layer-norm knobs)"
    timeout 280 python3 -m pytest -q -m cuda tests > "$W/pytest_cuda.log" 2>&1; echo "pytest rc=$?"
    tail -1 "$W/pytest_cuda.log"; grep -E "^FAILED|^E  " "$W/pytest_cuda.log" | head -20
    stamp "host cost per call (plan: the layer-norm backward too now)"
    timeout 60 python3 benchmarks/host_overhead.py --out "$W" --calls 100 --rounds 2 > "$W/host_overhead.log" 2>&1
    echo "host rc=$?"; grep -v -i warn "$W/host_overhead.log" | cut -c1-160 | grep -E "launcher|enable|modes|raw C"
    stamp "whole steps: resnet50 (both layouts), ViT-B/16, GPT-2 small"
    timeout 200 python3 -m normkit bench --models resnet50 vit_b16 gpt2 --json "$W/models/bench.json" --out "$W/models" \
        --no-progress > "$W/models.log" 2>&1; echo "models rc=$?"; grep -E "^\| (resnet|vit|gpt)" "$W/models/summary.md" | head -20
elif [ "$PART" = 15 ]; then
    use_wheels
    stamp "bench: layer and RMS norm, every dtype"
    ln_suite_bench 240 bench
    stamp "batch norm: per-kernel time on resnet50's layers, channels_last (programmatic dependent launch off while profiled)"
    timeout 120 python3 benchmarks/bn_breakdown.py --layout channels_last --out "$W" > "$W/bn_breakdown_channels_last.log" 2>&1
    echo "bn_breakdown rc=$?"; tail -1 "$W/bn_breakdown_channels_last.log"
elif [ "$PART" = 16 ]; then
    use_wheels
    stamp "bench: layer and RMS norm, every dtype, with FlagGems (its sqlalchemy / greenlet wheels carried)"
    ln_suite_bench 280 bench
    stamp "resnet50 training steps (both layouts), with and without enable()"
    timeout 140 python3 -m normkit bench --models resnet50 --json "$W/models/bench.json" --out "$W/models" --no-progress \
        > "$W/models.log" 2>&1; echo "models rc=$?"; grep -E "^\| resnet" "$W/models/summary.md" | head -20
elif [ "$PART" = 17 ]; then
    use_wheels
    stamp "bench: layer and RMS norm at widths outside the suite"
    timeout 200 python3 -m normkit bench --ops layer_norm rms_norm --shapes 131072x320 32768x1600 32768x2048 16384x3072 \
        16384x5120 8192x6144 8192x12288 4096x20480 --dtypes bf16 fp32 bf16:fp32 --peers aten liger flaggems \
        --budget 180 --json "$W/bench-ln/bench.json" --out "$W/bench-ln" --no-progress \
        > "$W/bench-ln.log" 2>&1; echo "bench rc=$?"; sed -n '/## Headline/,/^!\[/p' "$W/bench-ln/summary.md" | head -30
    stamp "bench: batch norm on shapes outside the suite"
    timeout 120 python3 -m normkit bench --ops batch_norm --shapes 256x96x56x56 128x160x17x17 128x768x17x17 64x32x112x112 \
        32x3x224x224 128x40x28x28 8x256x128x128 2x512x64x64 4096x512 16x64x16x16x16 --dtypes bf16:fp32 fp32 \
        --peers aten aten-native --budget 100 --json "$W/bench-bn/bench.json" --out "$W/bench-bn" --no-progress \
        > "$W/bench-bn.log" 2>&1; echo "bench rc=$?"; sed -n '/## Headline/,/^!\[/p' "$W/bench-bn/summary.md" | head -30
    stamp "resnet50 training steps (both layouts), with and without enable()"
    timeout 140 python3 -m normkit bench --models resnet50 --json "$W/models/bench.json" --out "$W/models" --no-progress \
        > "$W/models.log" 2>&1; echo "models rc=$?"; grep -E "^\| resnet" "$W/models/summary.md" | head -20
elif [ "$PART" = 18 ]; then
    stamp "pytest -m cuda: layer / RMS kernels (two-part forward rows on)"
    timeout 200 python3 -m pytest -q -m cuda tests/kernels/test_layer_norm_kernels.py > "$W/pytest_ln.log" 2>&1; echo "pytest rc=$?"
    tail -1 "$W/pytest_ln.log"; grep -E "^FAILED|^E  " "$W/pytest_ln.log" | head -20
    stamp "layer / RMS sweeps: two-part forward rows, the 2048-wide prefetching backward, 512-wide backward"
    timeout 330 python3 benchmarks/ln_kernels.py --out "$W" --sweep --groups fwdtwopart,bwd2k,bwd512 --sweep-budget 310 \
        --no-rows > "$W/ln_kernels.log" 2>&1; echo "ln rc=$?"
    grep -E "chose|FAILED" "$W/ln_kernels.log" | cut -c1-300
elif [ "$PART" = 19 ]; then
    use_wheels
    stamp "pytest -m cuda"
    timeout 270 python3 -m pytest -q -m cuda tests > "$W/pytest_cuda.log" 2>&1; echo "pytest rc=$?"
    tail -1 "$W/pytest_cuda.log"; grep -E "^FAILED|^E  " "$W/pytest_cuda.log" | head -20
    stamp "bench: layer and RMS norm at widths outside the suite"
    timeout 150 python3 -m normkit bench --ops layer_norm rms_norm --shapes 131072x320 65536x512 32768x1600 32768x2048 \
        16384x3072 16384x5120 8192x6144 8192x12288 4096x20480 --dtypes bf16 fp32 bf16:fp32 --peers aten liger flaggems \
        --budget 140 --json "$W/bench-ln/bench.json" --out "$W/bench-ln" --no-progress \
        > "$W/bench-ln.log" 2>&1; echo "bench rc=$?"; sed -n '/## Headline/,/^!\[/p' "$W/bench-ln/summary.md" | head -30
    stamp "resnet50 training steps (both layouts), with and without enable()"
    timeout 140 python3 -m normkit bench --models resnet50 --json "$W/models/bench.json" --out "$W/models" --no-progress \
        > "$W/models.log" 2>&1; echo "models rc=$?"; grep -E "^\| resnet" "$W/models/summary.md" | head -20
elif [ "$PART" = 20 ]; then
    stamp "conformance"
    timeout 200 python3 -m normkit check --impl normkit --device cuda --quiet --json "$W/check_cuda.json" \
        > "$W/check_cuda.txt" 2>&1; echo "check rc=$?"; head -14 "$W/check_cuda.txt"
    stamp "layer / RMS sweeps: the looped forward where FlagGems leads"
    timeout 125 python3 benchmarks/ln_kernels.py --out "$W" --sweep --groups fwdloopwide,fwdloopmid --sweep-budget 110 \
        --no-rows > "$W/ln_kernels.log" 2>&1; echo "ln rc=$?"
    grep -E "chose|FAILED" "$W/ln_kernels.log" | cut -c1-300
elif [ "$PART" = 21 ]; then
    stamp "pytest -m cuda"
    timeout 330 python3 -m pytest -q -m cuda tests > "$W/pytest_cuda.log" 2>&1; echo "pytest rc=$?"
    tail -1 "$W/pytest_cuda.log"; grep -E "^FAILED|^E  " "$W/pytest_cuda.log" | head -20
    stamp "layer / RMS sweep: the two-part prefetching backward"
    timeout 170 python3 benchmarks/ln_kernels.py --out "$W" --sweep --groups bwdtwopart,fwdpersist2p --sweep-budget 150 \
        --no-rows > "$W/ln_kernels.log" 2>&1; echo "ln rc=$?"
    grep -E "chose|FAILED" "$W/ln_kernels.log" | cut -c1-300
elif [ "$PART" = 22 ]; then
    stamp "layer / RMS sweep: the two-part prefetching backward, the persistent two-part forward"
    ln_sweep bwdtwopart,fwdpersist2p 150
    stamp "host trace: batch-norm forward + backward per path"
    timeout 70 python3 benchmarks/host_trace.py --out "$W" > "$W/host_trace.log" 2>&1; echo "trace rc=$?"
    grep -E "^==|kernels per call" "$W/host_trace.log" | cut -c1-400
    stamp "pytest -m cuda"
    timeout ${PYTEST_S:-300} python3 -m pytest -v -m cuda tests > "$W/pytest_cuda.log" 2>&1; echo "pytest rc=$?"
    grep -cE " PASSED" "$W/pytest_cuda.log"; tail -1 "$W/pytest_cuda.log"; grep -E "FAILED|^E  " "$W/pytest_cuda.log" | head -20
elif [ "$PART" = 23 ]; then
    use_wheels
    stamp "layer / RMS sweep: persistent forward programs at every width of the 16384 class"
    ln_sweep fwdpersist16k 130
    stamp "bench: layer / RMS norm at the two-part widths, peers"
    ln_bench 130 4096x20480 8192x12288 8192x10240
    stamp "pytest -m cuda: layer-norm kernels"
    ln_cuda_tests 200
elif [ "$PART" = 24 ]; then
    use_wheels
    stamp "layer / RMS sweep: two-part forward rows at capped warps"
    ln_sweep fwd2pwarps 140
    stamp "bench: layer / RMS norm at the two-part widths, peers"
    ln_bench 150 8192x9216 8192x10240 8192x12288 4096x18432 4096x20480
    stamp "pytest -m cuda: layer-norm kernels"
    ln_cuda_tests 150
elif [ "$PART" = 25 ]; then
    stamp "layer / RMS sweep: bf16 x / fp32 w two-part rows"
    ln_sweep fwd2pmix 65
    stamp "pytest -m cuda"
    timeout ${PYTEST_S:-330} python3 -m pytest -v -m cuda tests --ignore=tests/test_randomized.py > "$W/pytest_cuda.log" 2>&1
    echo "pytest rc=$?"; grep -cE " PASSED" "$W/pytest_cuda.log"; tail -1 "$W/pytest_cuda.log"
    grep -E "FAILED|^E  " "$W/pytest_cuda.log" | head -20
    stamp "randomized differential test on CUDA"
    NORMKIT_RANDOM_CASES=${RANDOM_CASES:-0.34} timeout ${RANDOM_S:-110} python3 -m pytest -v -m cuda tests/test_randomized.py \
        > "$W/pytest_randomized_cuda.log" 2>&1; echo "pytest rc=$?"; grep -cE " PASSED" "$W/pytest_randomized_cuda.log"
    tail -1 "$W/pytest_randomized_cuda.log"; grep -E "FAILED|^E  " "$W/pytest_randomized_cuda.log" | head -30 | cut -c1-400
elif [ "$PART" = 26 ]; then
    stamp "pytest -m cuda: enable() and functional"
    timeout 150 python3 -m pytest -v -m cuda tests/test_aten.py tests/test_functional.py > "$W/pytest_cuda_rest.log" 2>&1
    echo "pytest rc=$?"; tail -1 "$W/pytest_cuda_rest.log"; grep -E "FAILED|^E  " "$W/pytest_cuda_rest.log" | head -20
    stamp "randomized differential test on CUDA"
    NORMKIT_RANDOM_CASES=${RANDOM_CASES:-0.5} timeout ${RANDOM_S:-240} python3 -m pytest -q --tb=short -m cuda \
        tests/test_randomized.py > "$W/pytest_randomized_cuda.log" 2>&1; echo "pytest rc=$?"
    grep -m1 NORMKIT_RANDOM_SEED "$W/pytest_randomized_cuda.log"; tail -1 "$W/pytest_randomized_cuda.log"
    grep -E "^FAILED|^E  |replay" "$W/pytest_randomized_cuda.log" | head -40 | cut -c1-400
    stamp "conformance"
    timeout 170 python3 -m normkit check --impl normkit --device cuda --quiet --json "$W/check_cuda.json" \
        > "$W/check_cuda.txt" 2>&1; echo "check rc=$?"; head -14 "$W/check_cuda.txt"
elif [ "$PART" = 27 ]; then
    stamp "batch-norm kernel CUDA tests"
    timeout -s INT 200 python3 -m pytest -q -m cuda tests/kernels/test_batch_norm_kernels.py > "$W/pytest_bn.log" 2>&1
    echo "pytest rc=$?"; tail -1 "$W/pytest_bn.log"; grep -E "^FAILED|^E  " "$W/pytest_bn.log" | head -20
    stamp "randomized test on CUDA: batch norm, modules, instance norm"
    seed=${SEED:-$RANDOM$RANDOM}; echo "NORMKIT_RANDOM_SEED=$seed"
    NORMKIT_RANDOM_SEED=$seed NORMKIT_RANDOM_CASES=${RANDOM_CASES:-0.5} timeout -s INT ${RANDOM_S:-200} python3 -m pytest -q \
        --tb=short -m cuda tests/test_randomized.py -k "batch_norm or module or instance" > "$W/pytest_randomized_cuda.log" 2>&1
    echo "pytest rc=$?"; tail -1 "$W/pytest_randomized_cuda.log"; grep -E "^FAILED|^E  " "$W/pytest_randomized_cuda.log" | head -30 | cut -c1-400
    for round in ${AB_ROUNDS:-1 2}; do
        for side in before after; do
            stamp "training forward, $side (round $round)"
            src=src; [ "$side" = before ] && src=ab_old/src
            PYTHONPATH=$src timeout 150 python3 benchmarks/bn_kernels.py --out "$W/$side$round" --no-variants --modes ${AB_MODES:-fwd} \
                --dtypes bf16,fp32 --budget ${AB_BUDGET:-40} > "$W/$side$round.log" 2>&1; echo "bn_kernels rc=$?"
        done
        python3 benchmarks/ab_compare.py "$W/before$round/bn_kernels.jsonl" "$W/after$round/bn_kernels.jsonl" \
            --json "$W/ab$round.json" | tail -${AB_TAIL:-3}
    done
elif [ "$PART" = 28 ]; then
    use_wheels
    stamp "pytest -m cuda: functional (autocast modules), enable(), batch-norm kernels"
    cuda_tests 240 tests/test_functional.py tests/test_aten.py tests/kernels/test_batch_norm_kernels.py
    bn_bench_and_resnet
elif [ "$PART" = 29 ]; then
    stamp "pytest -m cuda: compile test (eps probe), cooperative backward (pipelined or not)"
    cuda_tests 170 tests/test_functional.py::test_cuda_compile_inductor_functional_and_enable \
        tests/kernels/test_layer_norm_kernels.py::test_cuda_coop_backward
    stamp "layer / RMS: pipelined cooperative backward (sweep bwdcooppipe)"
    SWEEP_LINES="sweep bwdcooppipe|chose|FAILED" ln_sweep bwdcooppipe 200
    if [ "${BREAKDOWN:-1}" = 1 ]; then
        stamp "batch norm: per-kernel time on resnet50's layers, channels_last"
        timeout 110 python3 benchmarks/bn_breakdown.py --layout channels_last --out "$W" > "$W/bn_breakdown_channels_last.log" 2>&1
        echo "bn_breakdown rc=$?"; tail -1 "$W/bn_breakdown_channels_last.log"
    fi
elif [ "$PART" = 30 ]; then
    stamp "pytest -m cuda: layer norm's db split"
    cuda_tests 150 tests/kernels/test_layer_norm_kernels.py::test_cuda_db_split
    stamp "layer norm: 16-bit backward at the 16384 class, db split (sweep lnbwddbsplit)"
    SWEEP_LINES="sweep lnbwddbsplit|chose|FAILED" ln_sweep lnbwddbsplit 170
elif [ "$PART" = 31 ]; then
    stamp "conformance on CUDA"
    timeout ${CHECK_S:-170} python3 -m normkit check --impl normkit --device cuda --quiet --json "$W/check_cuda.json" \
        > "$W/check_cuda.txt" 2>&1; echo "check rc=$?"; head -14 "$W/check_cuda.txt"
    stamp "pytest -m cuda (all but the randomized test; FIRST: files to run first)"
    cuda_tests "${PYTEST_S:-330}" ${FIRST:-} tests --deselect tests/test_randomized.py
    if [ "${RANDOM_S:-0}" != 0 ]; then
        stamp "randomized differential test on CUDA"
        random_cuda_tests ${RANDOM_SEED:-20261202} "$RANDOM_S"
    fi
elif [ "$PART" = 32 ]; then
    use_wheels
    stamp "bench: layer norm backward where the db split applies"
    # DB_SPLIT=<width>: the bench with the db split from that row width (session 14 call 4 ran it as
    # bwd_db_split_min_block=16384, the knob's first form: every row of the 16384 class, fp32 w/b included)
    timeout 200 python3 -c "import sys, runpy; import normkit.kernels.layer_norm as L
if '${DB_SPLIT:-}': L._CFG['bwd_db_split_min_width'] = int('${DB_SPLIT:-0}')
sys.argv = ['normkit'] + sys.argv[1:]; runpy.run_module('normkit', run_name='__main__')" \
        bench --ops layer_norm --shapes 4096x16384 8192x12288 8192x9216 \
        --dtypes bf16 fp16 bf16:fp32 --peers aten liger flaggems --budget 180 --json "$W/bench-ln/bench.json" \
        --out "$W/bench-ln" --no-progress > "$W/bench-ln.log" 2>&1; echo "bench rc=$?"
    grep -E "layer_norm|^\| [0-9]" "$W/bench-ln/summary.md" | head -40
elif [ "$PART" = 33 ]; then
    stamp "conformance on CUDA (plans keyed on the inputs' layout; the eps = 0 eval case by torch version)"
    if [ "${CHECK_S:-170}" != 0 ]; then  # CHECK_S=0: skip
        timeout ${CHECK_S:-170} python3 -m normkit check --impl normkit --device cuda --quiet --json "$W/check_cuda.json" \
            > "$W/check_cuda.txt" 2>&1; echo "check rc=$?"; head -14 "$W/check_cuda.txt"; grep -A3 "^FAIL" "$W/check_cuda.txt" | head -20
    fi
    stamp "pytest -m cuda: launch plans, then the aten / functional / custom-op CUDA tests"
    cuda_tests "${PYTEST_S:-200}" tests/kernels/test_plan.py tests/ops/test_custom_ops.py tests/test_aten.py tests/test_functional.py
    stamp "host cost per call (plans keyed on every input's shape / strides / dtype)"
    timeout ${HOST_S:-90} python3 benchmarks/host_overhead.py --out "$W" > "$W/host_overhead.log" 2>&1; echo "host rc=$?"
    tail -25 "$W/host_overhead.log"
elif [ "$PART" = 35 ]; then
    stamp "pytest -m cuda: the 5-pass wide backward software-pipelined (same bits)"
    cuda_tests 150 tests/kernels/test_layer_norm_kernels.py::test_cuda_wide_backward_stages_same_bits
    stamp "layer / RMS norm: the row-sum and column kernels pipelined (sweep bwdst)"
    SWEEP_LINES="sweep bwdst|chose|FAILED" ln_sweep bwdst ${SWEEP_S:-230}
elif [ "$PART" = 36 ]; then
    stamp "pytest -m cuda: layer-norm kernels (5-pass backward pipelined at 3 stages)"
    cuda_tests ${PYTEST_S:-200} tests/kernels/test_layer_norm_kernels.py
    stamp "layer / RMS norm: around the adopted stages (bwdst4), the 5-pass path where other paths run (bwd5route)"
    SWEEP_LINES="sweep bwdst4|sweep bwd5route|chose|FAILED" ln_sweep bwdst4,bwd5route ${SWEEP_S:-200}
elif [ "$PART" = 37 ]; then
    use_wheels
    stamp "bench: layer and RMS norm, every dtype, peers"
    ln_suite_bench $(( ${LN_S:-300} - 20 )) bench-ln
    stamp "bench: batch norm, every dtype, peers"
    timeout ${BN_S:-220} python3 -m normkit bench --ops batch_norm --all-dtypes --peers aten aten-native flaggems \
        --budget $(( ${BN_S:-220} - 20 )) --json "$W/bench-bn/bench.json" --out "$W/bench-bn" --no-progress \
        > "$W/bench-bn.log" 2>&1; echo "bench rc=$?"; sed -n '/## Headline/,/^!\[/p' "$W/bench-bn/summary.md" | head -30
elif [ "$PART" = 38 ]; then
    stamp "pytest -m cuda: instance norm's running variance, SyncBatchNorm (gloo, CUDA tensors)"
    cuda_tests ${PYTEST_S:-250} tests/test_functional.py::test_instance_norm_running_var_small_variance tests/test_distributed.py \
        tests/test_aten.py::test_cuda_sync_batch_norm_primitives_through_normkit_match_aten
    stamp "randomized test on CUDA: instance norm, group norm, batch norm (seed 20261216)"
    random_cuda_tests 20261216 ${RANDOM_S:-400} -k "instance_norm or group_norm or batch_norm"
    stamp "SyncBatchNorm's per-rank primitives: normkit's kernels against torch's (one GPU, no collectives)"
    timeout ${SYNC_S:-200} python3 benchmarks/sync_bn_bench.py --out "$W/sync_bn" --budget $(( ${SYNC_S:-200} - 30 )) \
        > "$W/sync_bn.log" 2>&1; echo "sync_bn rc=$?"; tail -40 "$W/sync_bn.log" | cut -c1-250
elif [ "$PART" = 57 ]; then
    stamp "pytest -m cuda: the one-launch batch-norm kernels (session 22, prepared without a GPU)"
    cuda_tests ${PYTEST_S:-150} tests/kernels/test_batch_norm_kernels.py -k "fused or knob_paths or pdl"
    stamp "batch norm on small models' layers: one launch (variant fused) against the split path, bf16 and fp32"
    timeout $(( ${BNK_S:-200} + 120 )) python3 benchmarks/bn_kernels.py --out "$W" --small --only-variants fused \
        --modes fwd,bwd --budget ${BNK_S:-200} --jobs 12 > "$W/bn_kernels.log" 2>&1; echo "bn_kernels rc=$?"
    grep -E "\| " "$W/bn_kernels.log" | tail -50
    stamp "host cost per call: split (default) against one launch per direction (32x64x8x8: 2048 a channel)"
    for knob in fused_max_rows=0 fused_max_rows=4096; do
        timeout 120 python3 benchmarks/host_overhead.py --out "$W/host-$knob" --rounds 2 --set $knob \
            > "$W/host-$knob.log" 2>&1; echo "host_overhead $knob rc=$?"; grep -E "batch_norm|F.batch_norm|launcher" "$W/host-$knob.log" | head -12
    done
elif [ "$PART" = 58 ]; then
    stamp "model zoo (timing, host syncs): the split path everywhere against the defaults (one launch for small layers)"
    for mode in split default; do
        timeout $(( ${ZOO_S:-200} + 60 )) python3 benchmarks/model_zoo.py --out "$W/zoo-$mode" --budget ${ZOO_S:-200} \
            --seed 237 $([ $mode = split ] && echo --set fused_max_rows=0) \
            --models ${ZOO_MODELS:-tv_resnet18,tv_mobilenet_v3_small,mlp_bn1d} > "$W/zoo-$mode.log" 2>&1; echo "zoo $mode rc=$?"
        grep -E "^\| (tv|timm|mlp)" "$W/zoo-$mode.log" | awk -F'|' '{print $2,$3,$4,$(NF-5),$(NF-4),$(NF-3),$(NF-2),$(NF-1)}'
    done
elif [ "$PART" = 59 ] || [ "$PART" = 60 ]; then
    bn_tests_and_check
    if [ "$PART" = 60 ]; then
        stamp "zoo models, split path (A) against the defaults (B), interleaved in one process (knob_ab.py)"
        timeout ${AB_S:-200} python3 benchmarks/knob_ab.py --models ${AB_MODELS:-tv_resnet18,tv_mobilenet_v3_small,mlp_bn1d} \
            --a fused_max_rows=0 --b "" --rounds ${AB_ROUNDS:-15} --out "$W/ab" > "$W/knob_ab.log" 2>&1; echo "knob_ab rc=$?"
        grep -E "^\[|^\|" "$W/knob_ab.log" | cut -c1-200
        stamp "randomized test on CUDA: batch norm, modules (seed 20261223)"
        random_cuda_tests 20261223 ${RANDOM_S:-150} -k "batch_norm or module"
    fi
elif [ "$PART" = 61 ]; then
    stamp "host time of small models' steps: forward / backward issue, eager / normkit, engine thread / calling thread"
    timeout ${PROF_S:-300} python3 benchmarks/model_host_profile.py --out "$W/host_profile" \
        --models ${PROF_MODELS:-tv_resnet18,mlp_bn1d,tv_mobilenet_v3_small} --rounds ${PROF_ROUNDS:-8} \
        > "$W/model_host_profile.log" 2>&1; echo "profile rc=$?"; grep -E "^\[|Error" "$W/model_host_profile.log" | cut -c1-250
elif [ "$PART" = 62 ]; then
    stamp "pytest -m cuda: launch plans (plan scalars: the momentum), batch-norm kernels (the combine cap)"
    cuda_tests ${PYTEST_S:-180} tests/kernels/test_plan.py tests/kernels/test_batch_norm_kernels.py
    stamp "conformance on CUDA (batch norm)"
    timeout ${CHECK_S:-110} python3 -m normkit check --impl normkit --device cuda --ops batch_norm --quiet \
        --json "$W/check_cuda.json" > "$W/check_cuda.log" 2>&1; echo "check rc=$?"; tail -5 "$W/check_cuda.log" | cut -c1-200
    stamp "the forward combine capped at 512 channels a program (default) against the old rule (combwide), 2-D layers"
    timeout $(( ${BNK_S:-60} + 100 )) python3 benchmarks/bn_kernels.py --out "$W" --small --only-variants combwide \
        --modes fwd --shapes 1024x4096,512x8192,4096x512,256x1024,32x4096 --budget ${BNK_S:-60} --jobs 12 \
        > "$W/bn_kernels.log" 2>&1; echo "bn_kernels rc=$?"; grep -E "\| " "$W/bn_kernels.log" | tail -24
elif [ "$PART" = 63 ]; then
    stamp "host time of small models' steps (momentum a plan scalar; gc off; µs inside normkit's kernels a call)"
    timeout ${PROF_S:-170} python3 benchmarks/model_host_profile.py --out "$W/host_profile" \
        --models ${PROF_MODELS:-mlp_bn1d,tv_resnet18,tv_mobilenet_v3_small} --rounds 6 \
        > "$W/model_host_profile.log" 2>&1; echo "profile rc=$?"; grep -E "^\[|Error|inside" "$W/model_host_profile.log" | cut -c1-250
    stamp "whole training steps captured in a CUDA graph, eager and normkit (graphed_steps.py)"
    timeout ${GRAPH_S:-200} python3 benchmarks/graphed_steps.py --out "$W/graphed" \
        --models ${GRAPH_MODELS:-tv_resnet18,tv_mobilenet_v3_small,mlp_bn1d} > "$W/graphed_steps.log" 2>&1
    echo "graphed rc=$?"; grep -E "^\[|^\|" "$W/graphed_steps.log" | cut -c1-250
elif [ "$PART" = 64 ]; then
    stamp "a batch-norm call's host time by piece: a loop alone / after a conv / an 8 MB memcpy / 100k objects, and in models"
    timeout ${PROBE_S:-300} python3 benchmarks/host_cache_probe.py --out "$W/host_cache" --calls ${PROBE_CALLS:-200} \
        --models ${PROBE_MODELS:-tv_resnet18,tv_mobilenet_v3_small} > "$W/host_cache_probe.log" 2>&1
    echo "probe rc=$?"; grep -vi warn "$W/host_cache_probe.log" | cut -c1-400 | tail -20
elif [ "$PART" = 65 ]; then
    bn_tests_and_check
    stamp "randomized test on CUDA: every family (seed 20261224)"
    random_cuda_tests 20261224 ${RANDOM_S:-150}
elif [ "$PART" = 66 ]; then
    stamp "native plan replay: build on a cold cache"
    python3 -c "
import time; from normkit.kernels import _native as N
t = time.time(); N.start(); ok = N.wait(600); print('native replay', ok, N.status(), '%.1f s' % (time.time() - t))"
    stamp "pytest -m cuda: native replay, launch plans, batch-norm kernels (plans replayed natively)"
    cuda_tests ${PYTEST_S:-200} tests/kernels/test_native_replay.py tests/kernels/test_plan.py \
        tests/kernels/test_batch_norm_kernels.py
    stamp "host cost per call: plans replayed in Python (plan) against the native replay (native)"
    host_cost 200 "native replay|batch_norm|layer_norm|launcher"
elif [ "$PART" = 67 ]; then
    stamp "host time of small models' steps: the native replay (normkit) against the Python replay (normkit_python)"
    host_profile 260 tv_resnet18,tv_mobilenet_v3_small,mlp_bn1d 6
    cuda_check 200
elif [ "$PART" = 68 ]; then
    stamp "where the native replay's time goes in models (its clocks: allocations, launches)"
    host_profile 150 tv_resnet18,tv_mobilenet_v3_small 3
    stamp "pytest -m cuda: every CUDA test (plans replayed natively), the plan users first"
    cuda_tests ${PYTEST_S:-400} tests/kernels/test_native_replay.py tests/kernels/test_plan.py tests/test_aten.py \
        tests/ops tests/nn tests/test_functional.py tests/kernels/test_launch.py tests/kernels/test_batch_norm_kernels.py \
        tests/kernels/test_layer_norm_kernels.py tests/kernels/test_group_norm_kernels.py tests/test_distributed.py \
        tests/conformance tests/bench tests/reference tests/test_info.py
elif [ "$PART" = 69 ]; then
    stamp "pytest -m cuda: batch norm's fast routes, native replay, plans, aten"
    cuda_tests ${PYTEST_S:-240} tests/ops/test_bn_routes.py tests/kernels/test_native_replay.py tests/kernels/test_plan.py \
        tests/test_aten.py tests/ops tests/nn "tests/kernels/test_group_norm_kernels.py::test_cuda_plans_same_bits"
    stamp "host cost per call (group norm with launch plans: _CFG plans 1, prepared in session 25)"
    host_cost 200 "native replay|group_norm|gn_|F.group_norm|eager" 12
elif [ "$PART" = 70 ]; then
    stamp "pytest -m cuda: batch norm's fast routes (which calls were noted), group norm's plans (on by default)"
    cuda_tests ${PYTEST_S:-150} tests/ops/test_bn_routes.py tests/kernels/test_group_norm_kernels.py
    stamp "host time of small models' steps: fast routes (normkit_routes) against none (normkit)"
    host_profile 200 tv_resnet18,tv_mobilenet_v3_small 4
    cuda_check 150
elif [ "$PART" = 71 ]; then
    stamp "pytest -m cuda: batch norm's fast routes (on by default now), aten, ops, nn, functional"
    cuda_tests ${PYTEST_S:-200} tests/ops/test_bn_routes.py tests/test_aten.py tests/ops tests/nn tests/test_functional.py
    stamp "host time of small models' steps (fast routes on; normkit_noroutes without) and the share of calls routed"
    host_profile 180 tv_resnet18,tv_mobilenet_v3_small 3
    stamp "randomized test on CUDA: batch norm, modules (seed 20261226)"
    random_cuda_tests 20261226 ${RANDOM_S:-120} -k "batch_norm or module"
elif [ "$PART" = 72 ]; then
    stamp "pytest -m cuda: batch norm's fast routes"
    cuda_tests ${PYTEST_S:-100} tests/ops/test_bn_routes.py tests/bench/test_knob_ab.py
    stamp "small models: without fast routes (A) against with (B), interleaved in one process (knob_ab.py)"
    timeout ${AB_S:-330} python3 benchmarks/knob_ab.py --models ${AB_MODELS:-tv_resnet18,tv_mobilenet_v3_small} \
        --a fast_routes=0 --b fast_routes=1 --rounds ${AB_ROUNDS:-12} --out "$W/ab" > "$W/knob_ab.log" 2>&1; echo "knob_ab rc=$?"
    grep -E "^\[|^\|" "$W/knob_ab.log" | cut -c1-200
elif [ "$PART" = 73 ]; then
    stamp "pytest -m cuda: batch norm's fast routes, inside a captured graph too"
    cuda_tests ${PYTEST_S:-100} tests/ops/test_bn_routes.py
    stamp "whole training steps captured in a CUDA graph with routes on (graphed_steps.py: replays against uncaptured bits)"
    timeout ${GRAPH_S:-220} python3 benchmarks/graphed_steps.py --out "$W/graphed" \
        --models ${GRAPH_MODELS:-tv_resnet18,tv_mobilenet_v3_small} > "$W/graphed_steps.log" 2>&1
    echo "graphed rc=$?"; grep -E "^\[|^\|" "$W/graphed_steps.log" | cut -c1-250
elif [ "$PART" = 74 ]; then
    stamp "pytest -m cuda: layer / RMS norm's fast routes, batch norm's, aten, layer-norm kernels"
    cuda_tests ${PYTEST_S:-200} tests/ops/test_ln_routes.py tests/ops/test_bn_routes.py tests/test_aten.py \
        tests/kernels/test_layer_norm_kernels.py
    stamp "host cost per call: F.layer_norm under enable() with and without layer norm's routes"
    host_cost 150 "layer_norm|F.batch_norm" 14
elif [ "$PART" = 76 ]; then
    stamp "batch norm: the persistent grid-synchronised training forward (bn_persist_probe.py)"
    timeout ${PROBE_S:-280} python3 benchmarks/bn_persist_probe.py --out "$W" --budget $(( ${PROBE_S:-280} - 60 )) \
        > "$W/bn_persist_probe.log" 2>&1; echo "probe rc=$?"
    grep -vE "Warning|warn" "$W/bn_persist_probe.log" | cut -c1-260 | tail -70
    stamp "host cost per call, with the fast routes off against on alternating within rounds (routes_ab)"
    host_cost 200 "routes off|fast routes"
elif [ "$PART" = 78 ]; then
    stamp "pytest -m cuda: the spread rows view's tests, then the batch-norm kernel tests"
    cuda_tests ${PYTEST_S:-200} tests/kernels/test_batch_norm_kernels.py -k "spread or large or pdl"
    stamp "batch norm A/B: short NCHW planes as the (N, C*S) rows view against the ncs / flat paths (bn_kernels.py)"
    timeout ${BN_S:-300} python3 benchmarks/bn_kernels.py --out "$W" --budget $(( ${BN_S:-300} - 40 )) \
        --only-variants ${BN_VARIANTS:-nospread,nospreadred,nospreadew,sptp256,sptp1k,spew1k,spread32} \
        --shapes ${BN_SHAPES:-256x2048x7x7,256x512x7x7} --layouts contig \
        > "$W/bn_kernels.log" 2>&1; echo "bn rc=$?"; tail -80 "$W/bn_kernels.log" | cut -c1-200
elif [ "$PART" = 79 ]; then
    PART=78 BN_S=${BN_S:-150} bash "$0" > /dev/null 2>&1; cp -r "$OUT/next78" "$W/a-b" 2>/dev/null
    grep -E "pytest rc|passed|failed|^FAILED|^E  " "$W/a-b/pytest_cuda.log" | head -8
    sed -n '/variants, graph ms/,$p' "$W/a-b/bn_kernels.log" | cut -c1-170
    BN_PEERS="aten aten-native" bn_bench_and_resnet  # (call 3 ran this with budgets 210 / 150 s)
elif [ "$PART" = 82 ]; then  # after fwd_ept_4byte is set to 8 in layer_norm.py's _CFG
    stamp "pytest -m cuda: every layer-norm kernel test (fp32 narrow forward at 8 elements a thread)"
    ln_cuda_tests ${PYTEST_S:-300}
    stamp "randomized test on CUDA: layer / RMS norm (seed 20261230)"
    random_cuda_tests 20261230 ${RANDOM_S:-150} -k "layer_norm or rms_norm"
elif [ "$PART" = 83 ]; then
    stamp "batch norm's reductions alone against a streaming read: the NCHW 7x7 spread view against the ncs one"
    timeout 200 python3 benchmarks/bn_reduce_probe.py --out "$W" --budget 160 --nk-variants default,nospread,sptp1k \
        > "$W/bn_reduce_probe.log" 2>&1; echo "probe rc=$?"
    grep -E "copy|nk:|stream|WRONG" "$W/bn_reduce_probe.log" | cut -c1-160 | tail -60
elif [ "$PART" = 84 ]; then  # session 29, call 1
    stamp "pytest -m cuda: layer-norm kernel tests on the widths / [B, S, H] / PDL / plans (fwd_ept_4byte now 8)"
    cuda_tests ${PYTEST_S:-200} tests/kernels/test_layer_norm_kernels.py -k "widths or bsh or pdl or plan"
    stamp "randomized test on CUDA: layer / RMS norm (seed 20261230)"
    random_cuda_tests 20261230 ${RANDOM_S:-100} -k "layer_norm or rms_norm"
    stamp "batch norm's reductions alone: the NCHW 7x7 spread view with 256-2048-column blocks (bn_reduce_probe.py)"
    timeout 150 python3 benchmarks/bn_reduce_probe.py --out "$W" --budget 120 \
        --shapes 256x2048x7x7:nchw,256x512x7x7:nchw,256x2048x7x7:cl --nk-variants default,nospread,sptp1k,spc512,spc1k,spc2k \
        > "$W/bn_reduce_probe.log" 2>&1; echo "probe rc=$?"
    grep -E "copy|nk:|stream|WRONG" "$W/bn_reduce_probe.log" | cut -c1-160 | tail -40
    stamp "batch norm A/B: the spread column-block variants, whole forward / backward (bn_kernels.py)"
    timeout ${BN_S:-170} python3 benchmarks/bn_kernels.py --out "$W" --budget $(( ${BN_S:-170} - 30 )) \
        --only-variants ${BN_VARIANTS:-spc512,spc1k,spc2k} --shapes ${BN_SHAPES:-256x2048x7x7,256x512x7x7} \
        --layouts contig --modes fwd,bwd > "$W/bn_kernels.log" 2>&1; echo "bn rc=$?"
    sed -n '/variants, graph ms/,$p' "$W/bn_kernels.log" | cut -c1-170 | tail -30
elif [ "$PART" = 85 ]; then  # session 29, call 2 (carry .whl)
    use_wheels
    stamp "layer / RMS wide forward in L2-sized row groups (ln_group_probe.py)"
    timeout ${GRP_S:-200} python3 benchmarks/ln_group_probe.py --out "$W" --budget $(( ${GRP_S:-200} - 40 )) \
        > "$W/ln_group_probe.log" 2>&1; echo "probe rc=$?"; grep -E "copy|SOL|budget|Error" "$W/ln_group_probe.log" | tail -60
    stamp "bench: layer / RMS norm, every dtype, with the peers"
    ln_suite_bench ${LNB_S:-240} bench-ln
elif [ "$PART" = 86 ]; then  # session 29, call 3
    stamp "layer / RMS forward, one-row widths 4096-16384 (sweeps fwdmid, fwdmid16k), where Liger leads by 1-4 %"
    SWEEP_LINES="sweep fwdmid" ln_sweep fwdmid,fwdmid16k ${SWEEP_S:-200}
    stamp "batch norm: fp32 channels_last 256x2048x7x7 backward (0.5 % behind cuDNN in s28's bench): grid variants"
    timeout 120 python3 benchmarks/bn_kernels.py --out "$W" --budget 90 --only-variants rowsw8,rowstp396,rowsr4ktp660,comb4kbwd,nopdl \
        --shapes 256x2048x7x7 --layouts cl --dtypes fp32 --modes bwd > "$W/bn_kernels.log" 2>&1; echo "bn rc=$?"
    sed -n '/variants, graph ms/,$p' "$W/bn_kernels.log" | cut -c1-190 | tail -8
elif [ "$PART" = 87 ]; then  # session 29, call 4 (carry .whl): RMS forward at 8192 wide on 16 elements a thread
    use_wheels
    stamp "pytest -m cuda: layer-norm kernel tests on the widths / [B, S, H] / PDL / plans (fwd_ept_wide_rms 16)"
    cuda_tests ${PYTEST_S:-170} tests/kernels/test_layer_norm_kernels.py -k "widths or bsh or pdl or plan"
    stamp "randomized test on CUDA: RMS norm (seed 20261231)"
    random_cuda_tests 20261231 ${RANDOM_S:-80} -k "rms_norm"
    stamp "bench: RMS norm 4096-8192 wide forward rows with the peers"
    mid_rows_bench bench-rms
    cuda_check ${CHECK_S:-170}
elif [ "$PART" = 88 ]; then  # session 29, call 6
    stamp "layer / RMS one-row forward: w/b loaded with x (sweep fwdwbearly)"
    SWEEP_LINES="sweep fwdwbearly" ln_sweep fwdwbearly ${SWEEP_S:-150}
elif [ "$PART" = 89 ]; then  # session 30, call 1 (carry .whl): fwd_wb_early_min_block now 4096
    use_wheels
    stamp "pytest -m cuda: layer-norm kernel tests a forward launch change touches (w/b loaded with x at 4096 / 8192)"
    cuda_tests ${PYTEST_S:-200} tests/kernels/test_layer_norm_kernels.py -k "widths or bsh or pdl or plan or early"
    stamp "randomized test on CUDA: layer / RMS norm (seed 20261232)"
    random_cuda_tests 20261232 ${RANDOM_S:-110} -k "layer_norm or rms_norm"
    stamp "bench: layer / RMS norm 4096-8192 wide forward rows with the peers (w/b loaded with x)"
    mid_rows_bench bench-early
elif [ "$PART" = 91 ]; then  # session 30, call 3: the spread reduction with two register sets, 256 programs
    PYTEST_S=${PYTEST_S:-150} bn_tests_and_check 170
    stamp "randomized test on CUDA: batch norm, modules, instance norm (seed 20261233)"
    random_cuda_tests 20261233 ${RANDOM_S:-90} -k "batch_norm or module or instance_norm"
    stamp "batch norm A/B: the spread reduction before (onebuf) and now (bn_kernels.py)"
    timeout 80 python3 benchmarks/bn_kernels.py --out "$W" --budget 55 --only-variants onebuf \
        --shapes 256x2048x7x7,256x512x7x7 --layouts contig --modes fwd,bwd > "$W/bn_kernels.log" 2>&1; echo "bn rc=$?"
    sed -n '/variants, graph ms/,$p' "$W/bn_kernels.log" | cut -c1-170 | tail -8
    mkdir -p "$W/small"
    timeout 80 python3 benchmarks/bn_kernels.py --out "$W/small" --budget 55 --small --only-variants onebuf \
        --shapes 8x512x7x7,32x512x7x7,128x576x7x7 --layouts contig --modes fwd,bwd > "$W/small/bn_kernels.log" 2>&1
    echo "bn small rc=$?"; sed -n '/variants, graph ms/,$p' "$W/small/bn_kernels.log" | cut -c1-170 | tail -10
elif [ "$PART" = 92 ]; then  # session 30, call 4: two sets only where a program sums >= 16 row chunks
    stamp "pytest -m cuda: the spread / knob-path batch-norm tests (red_two_buf_min_chunks)"
    cuda_tests ${PYTEST_S:-100} tests/kernels/test_batch_norm_kernels.py -k "spread or knob or two_buf"
    stamp "batch norm A/B: small spread layers, before (onebuf) and now"
    mkdir -p "$W/small"
    timeout 80 python3 benchmarks/bn_kernels.py --out "$W/small" --budget 55 --small --only-variants onebuf \
        --shapes 8x512x7x7,32x512x7x7,128x576x7x7 --layouts contig --modes fwd,bwd > "$W/small.log" 2>&1
    echo "bn small rc=$?"; sed -n '/variants, graph ms/,$p' "$W/small.log" | cut -c1-170 | tail -10
    bn_bench_and_resnet
elif [ "$PART" = 93 ]; then  # session 30, call 5: resnet50 steps again (call 4's channels_last normkit step had 6 ms of host gaps)
    stamp "resnet50 training steps (both layouts), with and without enable()"
    timeout 200 python3 -m normkit bench --models resnet50 --json "$W/models/bench.json" --out "$W/models" --no-progress \
        > "$W/models.log" 2>&1; echo "models rc=$?"; grep -iE "resnet" "$W/models/summary.md" | head -20
elif [ "$PART" = 94 ]; then  # session 30, call 6: two register sets on the rows view, grids of one wave
    stamp "batch norm A/B: two register sets on the rows view (rtb132 / rtb264 / rtb396 / rtb396f)"
    timeout ${BN_S:-200} python3 benchmarks/bn_kernels.py --out "$W" --budget $(( ${BN_S:-200} - 30 )) \
        --only-variants rtb132,rtb264,rtb396,rtb396f --modes fwd,bwd > "$W/bn_kernels.log" 2>&1; echo "bn rc=$?"
    sed -n '/variants, graph ms/,$p' "$W/bn_kernels.log" | cut -c1-170 | tail -40
elif [ "$PART" = 95 ]; then  # session 30, call 7: two register sets on the rows view where columns split into <= 8 blocks
    stamp "pytest -m cuda: every batch-norm kernel test"
    cuda_tests ${PYTEST_S:-110} tests/kernels/test_batch_norm_kernels.py
    stamp "batch norm A/B: the rows view before (rowsonebuf) and now"
    timeout 75 python3 benchmarks/bn_kernels.py --out "$W" --budget 50 --only-variants rowsonebuf --modes fwd,bwd \
        > "$W/bn_kernels.log" 2>&1; echo "bn rc=$?"
    sed -n '/variants, graph ms/,$p' "$W/bn_kernels.log" | cut -c1-170 | tail -40
    stamp "randomized test on CUDA: batch norm, modules (seed 20261234)"
    random_cuda_tests 20261234 ${RANDOM_S:-50} -k "batch_norm or module"
elif [ "$PART" = 101 ]; then  # session 32: sessions 31-32's CPU-made changes on CUDA (s31-gn-nan merged), one call
    stamp "pytest -m cuda: group-norm kernels (NaN fixes), launch, custom ops, functional, aten, nn modules"
    cuda_tests ${PYTEST_S:-200} tests/kernels/test_group_norm_kernels.py tests/kernels/test_launch.py \
        tests/ops/test_custom_ops.py tests/test_functional.py tests/test_aten.py tests/nn/test_modules.py
    cp "$W/pytest_cuda.log" "$W/pytest_cuda_ops.log"
    stamp "pytest -m cuda: layer-norm kernels with pipeline stages, the wide backward"
    cuda_tests ${PYTEST_S2:-90} tests/kernels/test_layer_norm_kernels.py -k "stages or wide or coop or db_split"
    cp "$W/pytest_cuda.log" "$W/pytest_cuda_ln.log"
    cuda_check ${CHECK_S:-150}
    stamp "conformance on CUDA: torch's ops within normkit.enabled"
    timeout ${WITHIN_S:-130} python3 -m normkit check --impl torch --within normkit.enabled --device cuda --quiet \
        --json "$W/check_within_normkit.json" > "$W/check_within_normkit.log" 2>&1; echo "check rc=$?"
    sed -n '1,12p' "$W/check_within_normkit.log" | cut -c1-200; grep -E "^same bits|cases passed" "$W/check_within_normkit.log"
elif [ "$PART" = 106 ]; then  # session 35: PART=104 and 105 in one call on branch s35-gpu (both branches merged)
    stamp "pytest -m cuda: batch-norm kernels (rows full width), group-norm kernels (rstd order), functional, aten, ops, nn, distributed, reference"
    cuda_tests ${PYTEST_S:-300} tests/kernels/test_batch_norm_kernels.py tests/kernels/test_group_norm_kernels.py \
        tests/test_functional.py tests/test_aten.py tests/ops tests/nn/test_modules.py tests/test_distributed.py tests/reference
    cuda_check ${CHECK_S:-150}
    stamp "batch norm A/B: today's rows rule against the old one (oldrows)"
    timeout 100 python3 benchmarks/bn_kernels.py --out "$W" --budget 70 --only-variants oldrows --layouts cl,contig \
        --modes fwd,bwd > "$W/bn_kernels.log" 2>&1; echo "bn rc=$?"
    sed -n '/variants, graph ms/,$p' "$W/bn_kernels.log" | cut -c1-120 | tail -50
elif [ "$PART" = 107 ]; then  # session 35, branch s35-all (s35-gpu + s35-bn-robust + s35-gn-median): every touched CUDA test
    stamp "pytest -m cuda: batch-norm kernels (rows full width, median-of-three shifts), group-norm kernels, functional, aten, ops, nn, distributed, reference"
    cuda_tests ${PYTEST_S:-330} tests/kernels/test_batch_norm_kernels.py tests/kernels/test_group_norm_kernels.py \
        tests/test_functional.py tests/test_aten.py tests/ops tests/nn/test_modules.py tests/test_distributed.py \
        tests/reference tests/bench/test_bench.py
    cuda_check ${CHECK_S:-150}
elif [ "$PART" = 108 ]; then  # session 35 (carry ab_old: s35-gpu's src): the median-of-three shifts' forward A/B
    for round in ${AB_ROUNDS:-1 2}; do
        for side in before after; do
            stamp "batch norm, every kernel path's rows, $side (round $round)"
            src=src; [ "$side" = before ] && src=ab_old/src
            PYTHONPATH=$src timeout 150 python3 benchmarks/bn_kernels.py --out "$W/$side$round" --no-variants \
                --modes ${AB_MODES:-fwd,bwd} --dtypes bf16,fp32 --budget ${AB_BUDGET:-45} > "$W/$side$round.log" 2>&1
            echo "bn_kernels rc=$?"
        done
        python3 benchmarks/ab_compare.py "$W/before$round/bn_kernels.jsonl" "$W/after$round/bn_kernels.jsonl" \
            --json "$W/ab$round.json" | tail -${AB_TAIL:-40}
    done
    stamp "randomized test on CUDA: batch norm, modules (seed 20261235)"
    random_cuda_tests 20261235 ${RANDOM_S:-80} -k "batch_norm or module"
elif [ "$PART" = 111 ]; then  # session 37 (prepared without a GPU): batch norm, ~520 s
    stamp "the median-of-three shift's samples against one sample line (bn_shift_probe.py)"
    timeout ${PROBE_S:-120} python3 benchmarks/bn_shift_probe.py --out "$W" 2>&1 | grep -v Warning | tail -10
    stamp "odd NCHW planes (17x17 .. 147x147): the spread rows view / the flat gather pass"
    timeout 210 python3 benchmarks/bn_kernels.py --out "$W/odd" --layouts contig --dtypes bf16,fp32 \
        --shapes 128x768x17x17,128x160x17x17,32x288x35x35,32x80x73x73,32x64x147x147 \
        --only-variants spread320,spread1536,spreadodd,flat320 --budget 130 \
        > "$W/odd.log" 2>&1; echo "bn rc=$?"; sed -n '/variants, graph ms/,$p' "$W/odd.log" | cut -c1-150 | tail -40
    stamp "batch norm plane_align (prepared, off): its CUDA test, then the A/B on 38x38 / 50x50 / 150x150 planes"
    timeout -s INT 80 python3 -m pytest -q --tb=short -m cuda tests/kernels/test_batch_norm_kernels.py -k plane_align \
        > "$W/pytest_plane_align.log" 2>&1; echo "pytest rc=$?"; tail -1 "$W/pytest_plane_align.log"
    grep -E "^FAILED|^E  " "$W/pytest_plane_align.log" | head -10 | cut -c1-250
    timeout 120 python3 benchmarks/bn_kernels.py --out "$W/plane" --layouts contig --dtypes bf16,fp32 \
        --shapes 32x512x38x38,64x256x50x50,16x64x150x150 --only-variants planealign --budget 60 \
        > "$W/plane.log" 2>&1; echo "bn rc=$?"; sed -n '/variants, graph ms/,$p' "$W/plane.log" | cut -c1-120 | tail -20
elif [ "$PART" = 112 ]; then  # session 37 (prepared without a GPU): layer / RMS norm row_align, batch norm fold, ~550 s
    stamp "layer / RMS norm row_align (prepared, off): its CUDA tests, then sweep rowalign (1000 / 3000 / 5000 / 20008)"
    timeout -s INT 120 python3 -m pytest -q --tb=short -m cuda tests/kernels/test_layer_norm_kernels.py -k row_align \
        > "$W/pytest_ln_align.log" 2>&1; echo "pytest rc=$?"; tail -1 "$W/pytest_ln_align.log"
    grep -E "^FAILED|^E  " "$W/pytest_ln_align.log" | head -10 | cut -c1-250
    SWEEP_LINES="sweep rowalign|chose|FAILED" ln_sweep rowalign 110
    stamp "batch norm fold_max_c (prepared, off): its CUDA test, then the A/B at C = 3 / 5 / 7"
    timeout -s INT 70 python3 -m pytest -q --tb=short -m cuda tests/kernels/test_batch_norm_kernels.py -k fold \
        > "$W/pytest_fold.log" 2>&1; echo "pytest rc=$?"; tail -1 "$W/pytest_fold.log"
    grep -E "^FAILED|^E  " "$W/pytest_fold.log" | head -10 | cut -c1-250
    timeout 100 python3 benchmarks/bn_kernels.py --out "$W/fold" --layouts cl,contig --dtypes bf16,fp32 \
        --shapes 64x3x224x224,4096x3x32x32,256x5x56x56,1048576x7 --only-variants fold --budget 50 \
        > "$W/fold.log" 2>&1; echo "bn rc=$?"; sed -n '/variants, graph ms/,$p' "$W/fold.log" | cut -c1-120 | tail -26
    stamp "batch norm fp32 channels_last eval / fwd, row_align on against off (two eval rows were +4-5 % in call 2)"
    timeout 100 python3 benchmarks/bn_kernels.py --out "$W/align" --layouts cl --dtypes fp32 --modes eval,fwd \
        --shapes 256x4x112x112,128x24x56x56,128x72x28x28 --only-variants noalign --budget 50 \
        > "$W/align.log" 2>&1; echo "bn rc=$?"; sed -n '/variants, graph ms/,$p' "$W/align.log" | cut -c1-140 | tail -12
elif [ "$PART" = 113 ]; then  # session 38: plane_align, fold (2-byte), layer-norm row_align on; odd planes apart, ~560 s
    stamp "pytest -m cuda: batch-norm kernels at the new defaults"
    timeout -s INT ${BN_PYTEST_S:-170} python3 -m pytest -q --tb=short -m cuda tests/kernels/test_batch_norm_kernels.py \
        > "$W/pytest_bn.log" 2>&1; echo "pytest rc=$?"; tail -1 "$W/pytest_bn.log"
    grep -E "^FAILED|^E  " "$W/pytest_bn.log" | head -12 | cut -c1-250
    stamp "pytest -m cuda: layer-norm kernels at the new defaults"
    timeout -s INT ${LN_PYTEST_S:-150} python3 -m pytest -q --tb=short -m cuda tests/kernels/test_layer_norm_kernels.py \
        > "$W/pytest_ln.log" 2>&1; echo "pytest rc=$?"; tail -1 "$W/pytest_ln.log"
    grep -E "^FAILED|^E  " "$W/pytest_ln.log" | head -12 | cut -c1-250
    stamp "conformance on CUDA: batch, layer, RMS norm"
    timeout ${CHECK_S:-100} python3 -m normkit check --impl normkit --device cuda --ops batch_norm,layer_norm,rms_norm \
        --quiet --json "$W/check.json" > "$W/check.log" 2>&1; echo "check rc=$?"; tail -4 "$W/check.log" | cut -c1-160
    stamp "odd NCHW planes: the spread reduction and the spread elementwise pass apart (bf16)"
    timeout 100 python3 benchmarks/bn_kernels.py --out "$W/odd" --layouts contig --dtypes bf16 \
        --shapes 128x768x17x17,128x160x17x17,32x288x35x35,32x80x73x73 \
        --only-variants oddred320,oddew320,oddewall,oddred320ewall --budget 60 \
        > "$W/odd.log" 2>&1; echo "bn rc=$?"; sed -n '/variants, graph ms/,$p' "$W/odd.log" | cut -c1-150 | tail -16
    stamp "fold at even C and C = 1 / 2 (bf16, unmeasured in call 2): on (default) against off"
    timeout 70 python3 benchmarks/bn_kernels.py --out "$W/fold" --layouts cl,contig --dtypes bf16 \
        --shapes 256x4x112x112,128x6x56x56,64x12x56x56,256x2x56x56,1048576x1,1048576x10 --only-variants nofold \
        --budget 35 > "$W/fold.log" 2>&1; echo "bn rc=$?"; sed -n '/variants, graph ms/,$p' "$W/fold.log" | cut -c1-120 | tail -20
    stamp "randomized test on CUDA: batch / layer / RMS norm (seed 20261238)"
    random_cuda_tests 20261238 ${RANDOM_S:-60} -k "batch_norm or layer_norm or rms"
elif [ "$PART" = 114 ]; then  # session 38: the CUDA tests PART=113's limits cut, the odd-plane spread pass on, ~360 s
    stamp "pytest -m cuda: batch-norm kernels PART=113 did not reach, spread (odd planes on), fold (odd C only)"
    timeout -s INT ${BN_PYTEST_S:-170} python3 -m pytest -q --tb=short -m cuda tests/kernels/test_batch_norm_kernels.py \
        -k "spread or fold or plane_align or rows_full_width or knob_paths or fused_one_launch" \
        > "$W/pytest_bn.log" 2>&1; echo "pytest rc=$?"; tail -1 "$W/pytest_bn.log"
    grep -E "^FAILED|^E  " "$W/pytest_bn.log" | head -12 | cut -c1-250
    stamp "pytest -m cuda: layer-norm kernels PART=113 did not reach (row_align on)"
    timeout -s INT ${LN_PYTEST_S:-170} python3 -m pytest -q --tb=short -m cuda tests/kernels/test_layer_norm_kernels.py \
        -k "not widths and not row_align and not over_2_31" > "$W/pytest_ln.log" 2>&1; echo "pytest rc=$?"
    tail -1 "$W/pytest_ln.log"; grep -E "^FAILED|^E  " "$W/pytest_ln.log" | head -12 | cut -c1-250
elif [ "$PART" = 115 ]; then  # session 38 (prepared without device time): fold_sum, ~420 s
    stamp "batch norm fold_sum (prepared, off): its CUDA test (K partials / summed, odd and even C, C = 1)"
    timeout -s INT 200 python3 -m pytest -q --tb=short -m cuda tests/kernels/test_batch_norm_kernels.py -k fold \
        > "$W/pytest_fold.log" 2>&1; echo "pytest rc=$?"; tail -1 "$W/pytest_fold.log"
    grep -E "^FAILED|^E  " "$W/pytest_fold.log" | head -10 | cut -c1-250
    stamp "fold_sum A/B: odd C (folded by default) and even C / C = 1 (not folded by default), bf16; fp32 folded"
    timeout 200 python3 benchmarks/bn_kernels.py --out "$W/foldsum" --layouts cl,contig --dtypes bf16,fp32 \
        --shapes 64x3x224x224,4096x3x32x32,256x5x56x56,1048576x7,256x4x112x112,128x6x56x56,64x12x56x56,256x2x56x56,1048576x1 \
        --only-variants foldsum,foldall,foldsumall,foldsumfull,foldsumallfull,foldsum32,foldsum32full --budget 150 \
        > "$W/foldsum.log" 2>&1; echo "bn rc=$?"; sed -n '/variants, graph ms/,$p' "$W/foldsum.log" | cut -c1-200 | tail -60
elif [ "$PART" = 116 ]; then  # session 38 (carry ab_old: the pre-median src): where C = 3 / 4's +8-9 % goes, ~250 s
    for dt in fp32 bf16; do
        for tree in ab_old/src src; do
            name=$([ "$tree" = src ] && echo main || echo old)
            stamp "per-kernel time ($dt, contiguous, PDL off), $name"
            PYTHONPATH=$tree timeout 100 python3 benchmarks/bn_breakdown.py --layout contiguous --dtype $dt \
                --shapes 64x3x224x224,256x4x112x112,4096x3x32x32,256x64x56x56 --out "$W/breakdown-$name" \
                > "$W/breakdown-$name-$dt.log" 2>&1; echo "breakdown rc=$?"; grep -E " us" "$W/breakdown-$name-$dt.log" | cut -c1-110
        done
    done
elif [ "$PART" = 110 ]; then  # session 36 (carry ab_old: main's src): batch norm's shift, the median of three samples
    stamp "pytest -m cuda: batch-norm kernels (median-of-three shift), group-norm kernels (the shared median helper)"
    cuda_tests ${PYTEST_S:-220} ${TESTS:-tests/kernels/test_batch_norm_kernels.py tests/kernels/test_group_norm_kernels.py}
    if [ "${CHECK_S:-120}" != 0 ]; then
        stamp "conformance on CUDA: ${CHECK_OPS:=batch_norm,group_norm,instance_norm}"
        timeout ${CHECK_S:-120} python3 -m normkit check --impl normkit --device cuda --ops $CHECK_OPS \
            --quiet --json "$W/check.json" > "$W/check.log" 2>&1; echo "check rc=$?"; tail -4 "$W/check.log" | cut -c1-160
    fi
    for round in ${AB_ROUNDS:-1}; do
        for side in before after; do
            stamp "batch norm ${AB_MODES:-fwd}, every kernel path's rows, $side (round $round)"
            src=src; [ "$side" = before ] && src=ab_old/src
            PYTHONPATH=$src timeout 110 python3 benchmarks/bn_kernels.py --out "$W/$side$round" --no-variants \
                --modes ${AB_MODES:-fwd} --dtypes bf16,fp32 --budget ${AB_BUDGET:-35} ${AB_SHAPES:+--shapes $AB_SHAPES} \
                > "$W/$side$round.log" 2>&1
            echo "bn_kernels rc=$?"
        done
        python3 benchmarks/ab_compare.py "$W/before$round/bn_kernels.jsonl" "$W/after$round/bn_kernels.jsonl" \
            --json "$W/ab$round.json" | tail -${AB_TAIL:-50}
    done
elif [ "$PART" = 109 ]; then  # session 35, after PART=107 (H100): the group-norm compile fix, the tests PART=107's limit cut
    stamp "pytest -m cuda: group-norm kernels (HW == 1 reference fix), the bench timer's graph sizing"
    cuda_tests ${PYTEST_S:-110} tests/kernels/test_group_norm_kernels.py tests/bench/test_bench.py
    stamp "conformance on CUDA: group and instance norm"
    timeout 50 python3 -m normkit check --impl normkit --device cuda --ops group_norm,instance_norm --quiet \
        --json "$W/check_gn.json" > "$W/check_gn.log" 2>&1; echo "check rc=$?"; tail -4 "$W/check_gn.log" | cut -c1-160
    for side in before after; do  # (carry ab_old: s35-gpu's src)
        stamp "batch norm, every kernel path's rows, $side"
        src=src; [ "$side" = before ] && src=ab_old/src
        PYTHONPATH=$src timeout 100 python3 benchmarks/bn_kernels.py --out "$W/$side" --no-variants --modes fwd \
            --dtypes bf16,fp32 --budget ${AB_BUDGET:-30} > "$W/$side.log" 2>&1; echo "bn_kernels rc=$?"
    done
    python3 benchmarks/ab_compare.py "$W/before/bn_kernels.jsonl" "$W/after/bn_kernels.jsonl" --json "$W/ab.json" | tail -45
elif [ "$PART" = 105 ]; then  # session 34 (no GPU lent): the audit's host-side fixes on CUDA; run it on branch s34-gn-rstd
    stamp "pytest -m cuda: group-norm kernels (rstd**3 order on s34-gn-rstd), functional, aten, ops, nn, distributed"
    cuda_tests ${PYTEST_S:-240} tests/kernels/test_group_norm_kernels.py tests/test_functional.py tests/test_aten.py \
        tests/ops tests/nn/test_modules.py tests/test_distributed.py tests/reference
    cuda_check ${CHECK_S:-180}
elif [ "$PART" = 102 ]; then  # session 33: the rows reduction's time against its column block; resnet50's other kernels
    stamp "batch norm: the rows reduction at fixed column blocks (bc32..bc1024, partials cap 5 %; pfr05: today's rule)"
    timeout 170 python3 benchmarks/bn_kernels.py --out "$W" --budget 140 \
        --only-variants pfr05,bc32,bc64,bc128,bc256,bc512,bc1024 --dtypes bf16 --layouts cl,contig --modes fwd,bwd \
        --shapes 256x64x56x56,256x256x56x56,256x512x28x28,256x1024x14x14,256x2048x7x7,65536x1024,256x128x28x28,256x256x14x14,256x512x7x7 \
        > "$W/bn_kernels.log" 2>&1; echo "bn rc=$?"
    sed -n '/variants, graph ms/,$p' "$W/bn_kernels.log" | cut -c1-200 | tail -30
    stamp "resnet50 training steps (both layouts), with and without enable(); the other kernels by name in the JSON"
    timeout 140 python3 -m normkit bench --models resnet50 --json "$W/models/bench.json" --out "$W/models" --no-progress \
        > "$W/models.log" 2>&1; echo "models rc=$?"; grep -iE "resnet" "$W/models/summary.md" | head -20
    python3 -c "
import json; d = json.load(open('$W/models/bench.json'))
rows = {(m['layout'], m['setting']): m.get('top_other_kernels') or {} for m in d['models']}
for lay in ('channels_last', 'contiguous'):
    e, n = rows.get((lay, 'eager'), {}), rows.get((lay, 'normkit'), {})
    print(lay, 'other kernels ms a step: eager', round(sum(e.values()), 3), 'normkit', round(sum(n.values()), 3))
    for k in sorted(set(e) | set(n), key=lambda k: -abs(n.get(k, 0) - e.get(k, 0)))[:10]:
        print('  %+.3f  %.3f -> %.3f  %s' % (n.get(k, 0) - e.get(k, 0), e.get(k, 0), n.get(k, 0), k[:90]))
"
elif [ "$PART" = 104 ]; then  # session 33: 1024-column blocks for 16-bit rows of >= 1024 channels, 5 % partials cap bwd
    stamp "pytest -m cuda: batch-norm kernels (rows full width, two sets, knob paths, all)"
    cuda_tests ${PYTEST_S:-200} tests/kernels/test_batch_norm_kernels.py
    stamp "conformance on CUDA: batch norm"
    timeout 200 python3 -m normkit check --impl normkit --device cuda --ops batch_norm --quiet --json "$W/check_cuda.json" \
        > "$W/check_cuda.log" 2>&1; echo "check rc=$?"; grep -E "cases passed|FAIL" "$W/check_cuda.log" | head -5
    stamp "batch norm A/B: today's rows rule against the old one (oldrows)"
    timeout 120 python3 benchmarks/bn_kernels.py --out "$W" --budget 90 --only-variants oldrows --layouts cl,contig \
        --modes fwd,bwd > "$W/bn_kernels.log" 2>&1; echo "bn rc=$?"
    sed -n '/variants, graph ms/,$p' "$W/bn_kernels.log" | cut -c1-120 | tail -50
    stamp "resnet50 training steps"
    timeout 140 python3 -m normkit bench --models resnet50 --json "$W/models/bench.json" --out "$W/models" --no-progress \
        > "$W/models.log" 2>&1; echo "models rc=$?"; grep -iE "resnet" "$W/models/summary.md" | head -20
elif [ "$PART" = 103 ]; then  # session 33 (carry .whl): batch norm's headline dtype against every peer (FlagGems' BN rows
    use_wheels                  # last ran in session 6; the every-dtype bench's budget leaves them out)
    stamp "bench: batch norm, bf16 in / fp32 params, with eager, FlagGems and torch.compile"
    timeout 540 python3 -m normkit bench --ops batch_norm --peers aten aten-native flaggems compile \
        --budget 500 --json "$W/bench/bench.json" --out "$W/bench" --no-progress \
        > "$W/bench.log" 2>&1; echo "bench rc=$?"; sed -n '/## Headline/,/^!\[/p' "$W/bench/summary.md" | head -12
    grep -cE "\| (ok|skip)" "$W/bench.log"; grep -E "unavailable|skip" "$W/bench.log" | head -5
elif [ "$PART" = 100 ]; then  # for session 33 (carry .whl): torch's ops under normkit.enable() and under FlagGems
    use_wheels
    # FlagGems' norm ops only: its full set re-registers ~400 ops on every entry of the context (each backend call)
    gems='flag_gems.use_gems(include=["native_batch_norm", "native_batch_norm_backward", "native_layer_norm",
        "native_layer_norm_backward", "native_group_norm", "native_group_norm_backward", "rms_norm"])'
    for ctx in normkit.enabled "$gems"; do
        tag=$(printf '%s' "$ctx" | cut -d'(' -f1)  # the context's name: file names without brackets or newlines
        stamp "conformance on CUDA: torch's ops within $ctx"
        timeout ${CHECK_S:-250} python3 -m normkit check --impl torch --within "$ctx" --device cuda --quiet \
            --json "$W/check_within_$tag.json" > "$W/check_within_$tag.log" 2>&1; echo "check rc=$?"
        sed -n '1,12p' "$W/check_within_$tag.log" | cut -c1-200; grep -E "^same bits|cases passed" "$W/check_within_$tag.log"
    done
elif [ "$PART" = 96 ]; then  # for session 31 (carry .whl): the rows view's two register sets in the suite
    use_wheels
    stamp "batch norm A/B: channels_last 7x7 in 8 column blocks with two register sets (rtbwide)"
    timeout 75 python3 benchmarks/bn_kernels.py --out "$W" --budget 50 --only-variants rtbwide,rowsonebuf \
        --layouts cl,contig --modes fwd,bwd > "$W/bn_kernels.log" 2>&1; echo "bn rc=$?"
    sed -n '/variants, graph ms/,$p' "$W/bn_kernels.log" | cut -c1-170 | tail -40
    bn_bench_and_resnet
elif [ "$PART" = 80 ]; then
    PYTEST_S=${PYTEST_S:-220} bn_tests_and_check 200
    stamp "randomized test on CUDA: batch norm, modules, instance norm (seed 20261228)"
    random_cuda_tests 20261228 ${RANDOM_S:-120} -k "batch_norm or module or instance_norm"
elif [ "$PART" = 77 ]; then
    stamp "batch norm: the split reduction with TMA tiles against today's (bn_reduce_probe.py tma:*, --big)"
    timeout 200 python3 benchmarks/bn_reduce_probe.py --out "$W" --budget 160 --big --nk-variants default \
        > "$W/bn_reduce_probe.log" 2>&1; echo "probe rc=$?"
    grep -E "copy|nk:|tma:|WRONG" "$W/bn_reduce_probe.log" | cut -c1-160 | tail -70
    stamp "pytest -m cuda: the layer-norm kernel tests PART=74 did not reach, the routes tests"
    cuda_tests ${PYTEST_S:-330} tests/kernels/test_layer_norm_kernels.py tests/ops/test_ln_routes.py tests/ops/test_bn_routes.py
elif [ "$PART" = 75 ]; then
    stamp "pytest -m cuda: the layer-norm kernel tests PART=74 did not reach, the routes tests"
    cuda_tests ${PYTEST_S:-300} tests/kernels/test_layer_norm_kernels.py tests/ops/test_ln_routes.py tests/ops/test_bn_routes.py
    stamp "host cost per call, with the fast routes off against on alternating within rounds (routes_ab)"
    host_cost 240 "routes off|fast routes"
elif [ "$PART" = 56 ]; then
    stamp "mobilenet_v3_small channels_last agreement: default, launch plans off, PDL off"
    for mode in default plans_off pdl_off; do
        NORMKIT_LAUNCH_PLANS=$([ $mode = plans_off ] && echo 0 || echo 1) timeout 70 python3 -c "
import sys; sys.path.insert(0, 'benchmarks'); import model_zoo as Z, torch
torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False
if '$mode' == 'pdl_off':
    from normkit.kernels import batch_norm as B; B._TUNE['pdl'] = False
r = Z.agreement('tv_mobilenet_v3_small', Z.MODELS['tv_mobilenet_v3_small'], 'channels_last', 'cuda', 237, 'CUDA')
print('$mode', r['agree'], round(r['worst_vs_bound'], 2), r['normkit_err']['grad_param'], '%.1e' % r['normkit_err']['grad'])
" 2>&1 | tail -2
    done
elif [ "$PART" = 55 ]; then
    stamp "mobilenet_v3_small channels_last: the batch-norm layer with the gradient error, captured and replayed"
    timeout 120 python3 benchmarks/zoo_bn_dump.py --model tv_mobilenet_v3_small --layer ${DUMP_LAYER:-features.5.block.0.1} \
        --layout channels_last --seed ${DUMP_SEED:-237} --out "$W" 2>&1 | grep -v Warning | tail -20
    stamp "model zoo (subset): agreement with the fixed running-statistics measure, GPU busy time per step"
    timeout $(( ${ZOO_S:-240} + 60 )) python3 benchmarks/model_zoo.py --out "$W" --budget ${ZOO_S:-240} --seed 237 \
        --models ${ZOO_MODELS:-tv_mobilenet_v3_small,timm_levit_128s,tv_resnet18,tv_vit_b_16,hf_bert,tv_densenet121,timm_resnetv2_50x1_bit,tv_efficientnet_b0} \
        > "$W/model_zoo.log" 2>&1; echo "zoo rc=$?"
    grep -E "^\[|runs," "$W/model_zoo.log" | cut -c1-220
    grep -E "^\| tv|^\| timm|^\| hf" "$W/model_zoo.log" | awk -F'|' '{print $2,$3,$4,$(NF-3),$(NF-2),$(NF-1)}'
elif [ "$PART" = 54 ]; then
    stamp "model zoo: every model's fp32 step against float64 with and without enable(), bf16 steps timed"
    timeout $(( ${ZOO_S:-420} + 60 )) python3 benchmarks/model_zoo.py --out "$W" --budget ${ZOO_S:-420} \
        ${ZOO_MODELS:+--models $ZOO_MODELS} > "$W/model_zoo.log" 2>&1; echo "zoo rc=$?"
    grep -E "^\[|runs," "$W/model_zoo.log" | cut -c1-220
elif [ "$PART" = 53 ]; then
    stamp "conformance on CUDA (normkit check)"
    timeout ${CHECK_S:-200} python3 -m normkit check --impl normkit --device cuda --quiet --json "$W/check_cuda.json" \
        > "$W/check_cuda.log" 2>&1; echo "check rc=$?"; tail -15 "$W/check_cuda.log" | cut -c1-200
    stamp "randomized test on CUDA: batch norm (seed 20261221)"
    random_cuda_tests 20261221 ${RANDOM_S:-300} -k "batch_norm or module or instance_norm"
    stamp "batch norm's reductions alone, with reductions that read a few tiles a program (bn_reduce_probe.py)"
    timeout $(( ${PROBE_S:-120} + 40 )) python3 benchmarks/bn_reduce_probe.py --out "$W" --budget ${PROBE_S:-120} \
        > "$W/bn_reduce_probe.log" 2>&1; echo "probe rc=$?"; grep -E "stream|tiles|default" "$W/bn_reduce_probe.log" | cut -c1-160
elif [ "$PART" = 51 ]; then
    use_wheels
    stamp "pytest -m cuda: the batch-norm kernels at the adopted reduction rules"
    cuda_tests ${PYTEST_S:-120} tests/kernels/test_batch_norm_kernels.py
    bn_bench_and_resnet
elif [ "$PART" = 50 ]; then
    stamp "batch norm's split reduction alone: prefetch distance, warps, ncs programs (bn_reduce_probe.py)"
    timeout $(( ${PROBE_S:-100} + 40 )) python3 benchmarks/bn_reduce_probe.py --out "$W" --budget ${PROBE_S:-100} \
        > "$W/bn_reduce_probe.log" 2>&1; echo "probe rc=$?"; cut -c1-150 "$W/bn_reduce_probe.log"
    stamp "pytest -m cuda: the rows reduction two steps ahead gives the same bits"
    cuda_tests ${PYTEST_S:-90} tests/kernels/test_batch_norm_kernels.py -k "prefetch_distance or knob_paths"
    stamp "batch norm A/B on whole forwards / backwards (bn_kernels.py)"
    timeout ${BN_S:-240} python3 benchmarks/bn_kernels.py --out "$W" --budget $(( ${BN_S:-240} - 30 )) \
        --only-variants ${BN_VARIANTS:-rowsd2,rowsw4,rowsd2w4,ncsfp512,ncsfp256,redw4} \
        --shapes ${BN_SHAPES:-256x64x56x56,256x1024x14x14,256x2048x7x7,256x512x28x28,65536x1024,16x64x32x64x64} \
        --modes fwd,bwd > "$W/bn_kernels.log" 2>&1; echo "bn rc=$?"; tail -60 "$W/bn_kernels.log" | cut -c1-200
    stamp "randomized test on CUDA: layer / RMS norm (seed 20261220)"
    random_cuda_tests 20261220 ${RANDOM_S:-90} -k "layer_norm or rms_norm"
elif [ "$PART" = 49 ]; then
    stamp "batch norm's split reduction alone, against read-only references (bn_reduce_probe.py)"
    timeout $(( ${PROBE_S:-100} + 40 )) python3 benchmarks/bn_reduce_probe.py --out "$W" --budget ${PROBE_S:-100} \
        > "$W/bn_reduce_probe.log" 2>&1; echo "probe rc=$?"; cut -c1-200 "$W/bn_reduce_probe.log"
    stamp "pytest -m cuda: every layer-norm kernel test (the 16-bit narrow backward's tiles)"
    ln_cuda_tests ${PYTEST_S:-240}
elif [ "$PART" = 47 ]; then
    stamp "pytest -m cuda: every layer-norm kernel test at session 19's narrow backward (widths 256 / 320 / 1600 ...)"
    ln_cuda_tests ${PYTEST_S:-300}
    stamp "randomized test on CUDA: layer / RMS norm (seed 20261220)"
    random_cuda_tests 20261220 ${RANDOM_S:-150} -k "layer_norm or rms_norm"
elif [ "$PART" = 46 ]; then
    use_wheels
    stamp "pytest -m cuda: layer norm's PDL same bits (the 16-bit narrow backward at two rows a block, 768 wide)"
    cuda_tests ${PYTEST_S:-60} tests/kernels/test_layer_norm_kernels.py -k "test_cuda_pdl_same_bits"
    stamp "bench: layer and RMS norm, every dtype, peers (the suite)"
    ln_suite_bench ${BENCH_S:-250} bench-ln
elif [ "$PART" = 45 ]; then
    use_wheels
    stamp "pytest -m cuda: PDL same bits (batch norm's flat pass loading first, bf16 and fp32; layer norm incl. fp32 256 wide)"
    cuda_tests ${PYTEST_S:-120} tests/kernels/test_batch_norm_kernels.py tests/kernels/test_layer_norm_kernels.py \
        -k "test_cuda_pdl_same_bits"
    stamp "layer / RMS norm: the 16-bit narrow prefetching backward's programs per SM (sweep bwdpf16)"
    ln_sweep bwdpf16 ${SWEEP_S:-110}
    stamp "randomized test on CUDA: batch norm (seed 20261219)"
    random_cuda_tests 20261219 ${RANDOM_S:-90} -k "batch_norm"
    bn_bench_and_resnet
elif [ "$PART" = 44 ]; then
    use_wheels
    stamp "pytest -m cuda: layer norm's widths and PDL bits (fp32 256 wide: prefetching backward), batch norm's flat pass loading first"
    cuda_tests ${PYTEST_S:-200} tests/kernels/test_layer_norm_kernels.py tests/kernels/test_batch_norm_kernels.py \
        -k "test_cuda_widths or test_cuda_pdl_same_bits or flat_load_first"
    stamp "batch norm: the flat elementwise pass loading first, 16 KB tiles for 2-byte outputs (bn_kernels A/B)"
    timeout ${BN_S:-200} python3 benchmarks/bn_kernels.py --out "$W" --budget $(( ${BN_S:-200} - 30 )) \
        --only-variants flatlf,flat16k,flatlf16k --shapes 256x2048x7x7,256x512x7x7,256x1024x14x14,256x256x14x14 \
        --layouts contig > "$W/bn_kernels.log" 2>&1; echo "bn rc=$?"; tail -45 "$W/bn_kernels.log" | cut -c1-200
    stamp "bench: layer / RMS narrow rows with the peers (fp32 256 wide's backward)"
    ln_bench 100 262144x256 1048576x64 32768x768
    grep -E "bwd" "$W/bench-ln/summary.md" | head -24
elif [ "$PART" = 43 ]; then
    stamp "pytest -m cuda: the lag split forward (the two launches' bits at lags of 1-32 items per SM)"
    cuda_tests ${PYTEST_S:-150} tests/kernels/test_layer_norm_kernels.py -k "split_lag or split_fused"
    stamp "layer / RMS norm: the narrow plain backward (sweep bwdnarrow), the lag split forward (sweep fwdlag)"
    ln_sweep bwdnarrow,fwdlag ${SWEEP_S:-400}
elif [ "$PART" = 42 ]; then
    use_wheels
    stamp "bench: layer and RMS norm, every dtype, peers (the suite)"
    ln_suite_bench 290 bench-ln
    stamp "bench: split-forward widths outside the suite (32768, 131072; 64 rows of 65536)"
    W0=$W; W=$W0/wide; mkdir -p "$W"; ln_bench 100 4096x32768 1024x131072 64x65536; W=$W0
    grep -E "bf16/fp32.*fwd" "$W/wide/bench-ln/summary.md" | head -12
    stamp "randomized test on CUDA: layer / RMS norm (seed 20261203, new)"
    random_cuda_tests 20261203 ${RANDOM_S:-120} -k "layer_norm or rms_norm"
elif [ "$PART" = 41 ]; then
    stamp "pytest -m cuda: the layer-norm kernels (the heavy-params split forward, the capped registers' same bits)"
    cuda_tests ${PYTEST_S:-260} tests/kernels/test_layer_norm_kernels.py
    stamp "layer / RMS norm: the one-row forward's registers capped (sweep fwdmaxnreg)"
    SWEEP_LINES="sweep fwdmaxnreg|chose|FAILED" ln_sweep fwdmaxnreg ${SWEEP_S:-150}
elif [ "$PART" = 40 ]; then
    stamp "pytest -m cuda: the split forward (several rows per program in the second launch: same bits)"
    cuda_tests ${PYTEST_S:-120} tests/kernels/test_layer_norm_kernels.py -k split
    stamp "layer / RMS norm: the split forward's rows per program, two launches at 65536 (sweep fwdsplitrows)"
    SWEEP_LINES="sweep fwdsplitrows|chose|FAILED" ln_sweep fwdsplitrows ${SWEEP_S:-300}
elif [ "$PART" = 39 ]; then
    stamp "pytest -m cuda: the plain rows backward pipelined (same bits)"
    cuda_tests 150 tests/kernels/test_layer_norm_kernels.py::test_cuda_rows_stages_same_bits
    stamp "layer / RMS norm: the plain rows backward pipelined (sweep bwdrowsst)"
    SWEEP_LINES="sweep bwdrowsst|chose|FAILED" ln_sweep bwdrowsst ${SWEEP_S:-200}
elif [ "$PART" = 9 ]; then
    use_wheels
    bn_bench_and_resnet
    stamp "layer / RMS: cooperative backward, several rows per exchange; narrow mixed-dtype backward / forward"
    timeout 170 python3 benchmarks/ln_kernels.py --out "$W" --sweep --groups bwdcooprows,bwdmixnarrow,fwdmixnarrow --sweep-budget 150 \
        --no-rows > "$W/ln_kernels.log" 2>&1; echo "ln rc=$?"
    grep -E "sweep (bwdcooprows|bwdmixnarrow|fwdmixnarrow)|chose|FAILED" "$W/ln_kernels.log" | cut -c1-200 | tail -50
elif [ "$PART" = 6 ]; then
    stamp "layer / RMS: cooperative backward, several rows per exchange; narrow mixed-dtype backward / forward"
    timeout 230 python3 benchmarks/ln_kernels.py --out "$W" --sweep --groups bwdcooprows,bwdmixnarrow,fwdmixnarrow --sweep-budget 200 \
        --no-rows > "$W/ln_kernels.log" 2>&1; echo "ln rc=$?"
    grep -E "sweep (bwdcooprows|bwdmixnarrow|fwdmixnarrow)|chose|FAILED" "$W/ln_kernels.log" | cut -c1-200 | tail -70
    stamp "batch norm: per-kernel time on resnet50's layers (programmatic dependent launch off while profiled)"
    for layout in channels_last contiguous; do
        timeout 120 python3 benchmarks/bn_breakdown.py --layout $layout --out "$W" > "$W/bn_breakdown_$layout.log" 2>&1
        echo "bn_breakdown $layout rc=$?"; tail -1 "$W/bn_breakdown_$layout.log"
    done
else
    use_wheels
    stamp "bench: batch, layer, RMS norm, every dtype"
    timeout 330 python3 -m normkit bench --ops batch_norm layer_norm rms_norm --all-dtypes \
        --peers aten aten-native liger flaggems --budget 300 --json "$W/bench/bench.json" --out "$W/bench" --no-progress \
        > "$W/bench.log" 2>&1; echo "bench rc=$?"; sed -n '/## Headline/,/^!\[/p' "$W/bench/summary.md" | head -30
    stamp "bench: group and instance norm"
    timeout 150 python3 -m normkit bench --ops group_norm instance_norm --all-dtypes --peers aten liger flaggems \
        --budget 130 --json "$W/bench-gn/bench.json" --out "$W/bench-gn" --no-progress \
        > "$W/bench-gn.log" 2>&1; echo "bench rc=$?"; sed -n '/## Headline/,/^!\[/p' "$W/bench-gn/summary.md" | head -30
    stamp "resnet50 training steps (both layouts), with and without enable()"
    timeout 130 python3 -m normkit bench --models resnet50 --json "$W/models/bench.json" --out "$W/models" --no-progress \
        > "$W/models.log" 2>&1; echo "models rc=$?"; grep -iE "resnet|speedup|step" "$W/models/summary.md" | head -20
fi
stamp "done"
} 2>&1 | tee "$OUT/summary$PART.log"
tar czf "$OUT/next$PART.tgz" -C "$OUT" "next$PART"
