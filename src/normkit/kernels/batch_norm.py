"""Batch norm kernels (Triton) and their host launchers.

Layouts. Every input is seen as one of two canonical views, both handled natively:

* ``rows``: a row-major ``(M, C)`` matrix, ``M = N * prod(spatial)``: channels_last (NHWC),
  channels_last_3d (NDHWC), 2-D ``(N, C)`` input, and contiguous input whose spatial size is 1.
  A channel is a column.
* ``ncs``: contiguous ``(N, C, S)`` with ``S = prod(spatial) > 1`` (NCL, NCHW, NCDHW). A channel is
  ``N`` planes of ``S`` contiguous elements. Short unaligned planes of 16-bit inputs (7x7, 5x5, 3x3) are
  taken as the row-major ``(N, C*S)`` matrix instead ("spread", ``_spread``): the rows kernels with column
  j mapped to channel j // S, so their accesses are 16-byte vectors.

The output (and grad_input) keeps a dense input's layout (contiguous, channels_last, channels_last_3d:
``normkit.reference.dense_memory_format``); any other strides are copied once to
``x.suggest_memory_format()`` first.

Passes over HBM (a "pass" = one full read or write of an input-sized tensor):

* training forward: 3 passes -- a split reduction reads x once (per-(program, channel) fp32 partial
  shifted sums), a small fixed-order combine kernel (O(C x programs) bytes) makes mean/invstd,
  updates the running stats and writes per-channel coefficients, then an elementwise kernel
  reads x and writes y. Ceiling: 2/3 of copy bandwidth under the 2-pass byte count.
* eval forward: 2 passes, one elementwise kernel (per-channel affine computed in each program).
* backward, training: 5 passes -- split reduction over (x, dy), combine, elementwise
  (read x, dy; write dx). Ceiling 3/5 of copy bandwidth under the 3-pass byte count.
* backward, eval: grad_input alone is 2 passes (read dy, write dx); grad_weight needs the
  reduction over (x, dy) too.

Regime: split reduction (many programs per channel block, grid-stride over chunks so that the
whole grid sweeps memory front to back, two or four chunks in flight per step), then the
elementwise pass walks memory back to front so that its first tiles hit what the reduction left in
L2. Block sizes come from shape-keyed heuristics (``_TUNE``; no autotuning, so CUDA-graph capture
is safe).
ncs planes whose length is not a multiple of 16 (7x7, 14x14) cannot use 16-byte accesses; they
get small programs with few planes a thread (registers grow per plane), and S is compiled in when
S <= 1024 so the alignment S does have is used (196 = 4 x 49).

Rows-view reduction: forward statistics keep 4 row chunks in flight per loop step
(``red_unroll_rows_fwd``), the backward sums 2 (4 chunks of x and dy measured slower); forward and
backward have separate grid targets (``target_programs_rows_fwd`` / ``_bwd``). A flat 1-D path
for short unaligned ncs planes that loaded four coefficients per element was measured and dropped
(benchmarks/NOTES-batch_norm.md); the one kept (``_bn_ew_flat_kernel``, planes up to
``ew_flat_max_plane`` / ``_bwd`` elements) loads 16-byte vectors and spreads the per-plane
coefficients with ``tl.gather``. The rows reduction issues the next loop step's loads before this
step's sums in its source, but ptxas moves the sums ahead of them (sm_90 SASS), so a waiting program
has one step in flight: programs whose row segments are >= 256 bytes run 4 warps (twice the bytes a
thread has in flight); the ncs forward of aligned 16-bit planes runs fewer, longer programs
(``target_programs_ncs_fwd_16bit``). Measured and dropped (same bits, slower on the H200): the same
prefetch in the ncs reduction, the rows loop two steps ahead, and a flat reduction over short planes.

eps == 0 on a constant channel gives invstd = 0 (so y = bias, dx = 0), like ATen's InvStd on CPU
and CUDA; eps reaches the kernels as three fp32 parts summed in fp64 (exact for fp64 inputs).

Numerics: the forward accumulates sums of ``x - shift`` and ``(x - shift)^2`` with ``shift`` the
channel's first element, in fp32 (fp64 for fp64 input); partials are combined in fp64 in a fixed
order. The normalisation is ``(x - shift) * a + c`` with ``a = w * invstd`` and
``c = b - (mean - shift) * a``, so a large common offset costs no digits. No atomics, no host
synchronisation, the same bits on every run (the split depends on the shape only, never on the
device).
"""

import functools
import math
import struct

import torch
import triton
import triton.language as tl

from normkit.kernels import cdiv, next_pow2
from normkit.kernels import _plan
from normkit.kernels._launch import (alloc, gdc_launch_dependents, gdc_wait, launch, pdl_follow, pdl_on, pdl_trigger,
                                     scalar)

__all__ = ["bn_forward_train", "bn_forward_eval", "bn_backward", "supports"]

# Heuristic knobs (shape-keyed; tests shrink them to exercise many programs/iterations on tiny
# shapes, the GPU sweep varies them).
_TUNE = {
    # measured on the H200 (benchmarks/NOTES-batch_norm.md): each knob picked per layout/mode
    "red_tile_bytes": 4096,  # rows view: bytes of one tensor per reduction program per chunk
    "red_tile_bytes_ncs_fwd": 16384,  # ncs view, forward statistics
    "red_tile_bytes_ncs_bwd": 4096,  # ncs view, backward sums (two tensors per step)
    "ew_tile_bytes": 16384,  # bytes of one tensor per elementwise program, rows view
    "ew_tile_bytes_ncs": 8192,  # the same, ncs view
    "target_programs": 1024,  # programs of the split reduction (fixed: results never depend on the GPU)
    "target_programs_rows_fwd": 512,  # rows view, forward statistics
    "target_programs_rows_bwd": 660,  # rows view, backward sums
    "partial_frac": 0.05,  # ncs: partial sums (2 x P x C fp32) at most this fraction of the input bytes
    # (0.02 -> 0.05: resnet50 512x7x7 NCHW fwd / bwd -6 / -5 %, the other layers within 0.5 %)
    "partial_frac_rows": 0.005,  # the same, rows view
    "min_rows": 256,  # rows-layout reduction: at least this many rows per program before splitting C finer
    "combine_elems": 4096,  # elements of the [BLOCK_P, BLOCK_C] tile in the forward combine kernel
    # ... and in the backward's: 4096 took 96-252 registers (2 programs of 4 warps a SM), 1024 60-72; H200
    # 2026-12-01 (session 8), 15 resnet50 / suite rows: backward -2.9 % bf16, -1.8 % fp32 (geomean, worst
    # +0.5 %), forward within 0.4 % either way, so the forward keeps 4096
    "combine_elems_bwd": 1024,
    # ... and at most this many channels a forward combine program: 2-D inputs with 1-2 partials (1024x4096,
    # 512x8192) got 1-2 programs of 4096 channels, 255 registers and 1.1-1.4 KB of stack spills (offline sm_90
    # audit, session 23); the cap changes no other audited specialization (ptx_compare: 145 the same)
    "combine_max_channels_fwd": 512,
    "ew_warps": 8,
    "red_warps": 8,
    "red_unroll_rows_fwd": 4,  # rows-view forward statistics: row chunks in flight per loop step (2 or 4)
    # elementwise pass over short unaligned ncs planes as a flat array of 16-byte vectors, per-plane
    # coefficients spread with tl.gather (_bn_ew_flat_kernel), for S up to these (H200 2026-12-01, bf16
    # 256x2048x7x7 eval / fwd / bwd 0.0423 / 0.0750 / 0.0935 -> 0.0322 / 0.0632 / 0.0849 ms; at 14x14 the
    # backward won 3-6 % but the bf16 forward and eval lost 2-6 %)
    "ew_flat_max_plane": 64,
    "ew_flat_max_plane_bwd": 256,
    # rows-view forward statistics of 4- and 8-byte inputs: run 2's configuration (fp32 channels_last
    # 256x64x112x112: 0.602 ms, 0.64 SOL). The 2-byte winners above (4 KB, 4 chunks, 512 programs; swept
    # on bf16 only) made that row 0.824 ms and every fp32 rows forward 10-37 % slower in the full run.
    "red_tile_bytes_fwd_fp32": 8192,
    "target_programs_rows_fwd_fp32": 1024,
    "red_unroll_rows_fwd_fp32": 2,
    # programmatic dependent launch between the kernels of one call (sm_90+): the combine and the
    # elementwise pass are launched while their predecessor still runs, issue what does not depend on it
    # (per-channel parameters; the elementwise pass's first x / dy tile), then wait for it (griddepcontrol).
    # H200 2026-12-01 (session 8), 15 rows: forward -3.2 % bf16 / -3.3 % fp32, backward -3.0 / -1.7 %
    "pdl": 1,
    # session 20 (bn_reduce_probe.py: the reductions alone at 0.49-0.80 of copy, a one-tile-a-program read at
    # 0.92-1.03; bn_kernels.py A/B, results/h200-2026-12-03-s20/call2-part50, call4-part52): rows reduction programs
    # at 4 warps where a program's row segment is >= 256 bytes (bf16 forward: 65536x1024 -6.1 %, 256x512x28x28 NHWC
    # -4.8 %, 256x1024x14x14 -3.6 %; fp32 -1.7..-5.9 %; bf16 backward -2.6..-4.0 % on those three, the rest +-1 %;
    # bf16 with 128-byte segments: 256x2048x7x7 NHWC forward +4.7 %, the rest within 0.7 %), and a quarter of the
    # programs for the ncs forward of aligned 16-bit planes (longer loops: NCHW bf16 56x56 -8.7 %, 28x28 -2.9 %, 3-D
    # -3.8 %; the unaligned 14x14 lost 5.9 %, so those keep the common target)
    "red_warps_rows_wide": 4,
    "red_warps_rows_min_bytes": 256,
    "target_programs_ncs_fwd_16bit": 256,
    # one launch per direction (_bn_fused_*_kernel) for small layers: a channel of at most fused_max_rows elements
    # (N * spatial), at most fused_max_numel elements in all, at most fused_max_tiles tiles a program. One launch
    # instead of three, no partials. H200 2026-12-03 (session 23, results/h200-2026-12-03-s23/call1-part57, graph
    # kernel time, split -> fused): 2-D / NCHW layers <= 1.6M elements 0.45-1.04x (8x256x14x14 bf16 fwd 7.0 -> 3.4
    # us, 32x4096 fwd 21.6 -> 5.2, 256x1024 bwd 6.6 -> 4.7; one row slower: 32x512x7x7 bf16 bwd 7.5 -> 7.8);
    # 128x576x7x7 (3.6M) backward 1.04-1.24x, 25088 a channel 1.1-1.4x, channels_last of 64-256 channels with > 4
    # tiles 1.6-20x: those stay split. Host: the launchers fwd 67 -> 26 us, bwd 55 -> 24 us; F.batch_norm fwd + bwd
    # under enable() 245 -> 180 us
    "fused_max_rows": 8192,
    "fused_max_numel": 1 << 21,
    "fused_tile_elems": 2048,  # elements of a fused program's [B0, B1] tile (two fp64 accumulators each)
    # ... and only where a program sweeps at most this many tiles: a program's loop is serial, so a channels_last
    # layer with few channel blocks (C / 16 programs) and many rows would take far longer than the split path
    "fused_max_tiles": 4,
    "fused_min_programs": 128,  # rows view: channel blocks shrink (to 16 channels) to reach this many programs
    # short unaligned ncs planes (S % 16 != 0, S <= these) as the (N, C*S) rows view, column j = element j % S
    # of channel j // S (_spread): the rows kernels' 16-byte accesses and per-column coefficients where the ncs
    # kernels load 2-byte scalars (reduction) or spread per-element coefficients with tl.gather (flat pass).
    # The reduction writes S partials a program and channel. 0: off. Needs C * S % 16 == 0 (aligned rows), and
    # 16-bit inputs: H200 session 28 (bn_kernels.py, results/h200-2026-12-04-s28/call2), bf16 / fp32 params, graph
    # ms, ncs / flat -> spread: 256x2048x7x7 fwd 0.0591 -> 0.0539, bwd 0.0842 -> 0.0795, eval 0.0305 -> 0.0271;
    # 256x512x7x7 fwd 0.0215 -> 0.0184, eval 0.0088 -> 0.0076; but fp32 (4-byte accesses already) 256x512x7x7
    # fwd 0.0253 -> 0.0297, 256x2048x7x7 fwd +4 %. 14x14 planes (spread256) lost 3-13 % in training
    "spread_max_plane": 64,
    "spread_max_plane_ew": 64,
    "spread_max_esize": 2,
    # a spread reduction's column blocks: the narrowest row segment of at least spread_red_min_cols columns that
    # keeps them within target_programs_spread programs, so that a program sweeps most of the N rows. Call 2:
    # 256x2048x7x7 bwd 784 programs of 128 columns 0.0795 ms, 392 of 256 0.0756; call 6 (s28/call6-spread-tiles):
    # 256x512x7x7 at 64 / 128 columns (392 programs, P = 1 / 2) fwd 0.0196 / 0.0185, bwd 0.0230 / 0.0233
    "spread_red_min_cols": 128,
    "partial_frac_spread": 0.05,  # partials (2 x P x S x C fp32) at most this fraction of the input bytes
    # the spread reduction holds two steps' loads in two register sets (TWO_BUF), so one stays in flight while the
    # other is summed. Its registers fit 2 programs a SM, so the spread grid targets 256 programs (one wave on 132
    # SMs; 512 before). H200 session 30 (s30/call2-part90, bn_kernels.py twobuf196), bf16 graph ms, default ->
    # both: 256x2048x7x7 fwd 0.0531 -> 0.0506, bwd 0.0749 -> 0.0728; 256x512x7x7 fwd 0.0184 -> 0.0179, bwd 0.0233
    # -> 0.0231. Either alone is slower: two sets at 392 programs (two waves) fwd 0.0583; 256 programs with one set
    # (session 28's sptp256) fwd +1.5 %, bwd +3.7 %. Not on the channels_last / 2-D rows view: two sets were
    # slower on every such row (65536x1024 bf16 fwd 0.1104 -> 0.1215)
    # Only where a program sums >= red_two_buf_min_chunks row chunks at 256 programs: s30/call3-part91, one set ->
    # two, fwd ms: 32x512x7x7 (2 chunks) 0.0073 -> 0.0076, 8x512x7x7 (1) 0.0039 -> 0.0042; those keep one set, 512
    "red_two_buf_spread": 1,
    "red_two_buf_min_chunks": 16,
    "target_programs_spread_two_buf": 256,
    "target_programs_spread": 512,
    # the rows view (channels_last, 2-D) with two register sets where its columns split into at most
    # red_two_buf_rows_max_blocks blocks, on 264 programs (one wave: 2 a SM; two sets at today's 480-660 programs
    # lost everywhere in call 2). H200 session 30 (s30/call6-part94, bn_kernels.py rtb264), graph ms, one set -> two:
    # 256x256x56x56 CL bf16 bwd 0.5088 -> 0.4735, 256x64x56x56 bwd 0.1261 -> 0.1211, 256x128x28x28 fwd 0.0475 ->
    # 0.0451, 256x256x14x14 fwd 0.0285 -> 0.0270 (fp32 0.0475 -> 0.0443), 65536x1024 fp32 fwd 0.2086 -> 0.1977; but
    # 32 column blocks (2048 channels at 7x7, P 15 -> 8) lost: bwd bf16 0.0706 -> 0.0794, fp32 +8.5 %. Call 7
    # (s30/call7-part95) confirmed the rule, except the fp32 backward: 256x128x28x28 0.1193 -> 0.1224 (+2.6 %; call 6
    # +1.6 %), elsewhere within -0.9..+0.9 %: it keeps one set
    "red_two_buf_rows_max_blocks": 8,
    "target_programs_rows_two_buf": 264,
    # the spread reduction's loop pipelined by Triton through shared memory, this many stages (1: off; a variant, in
    # place of two register sets): the spread grid is bounded by its few rows, so its programs' bytes in flight are
    # what bounds it (session 16's pipelined rows / ncs loops lost where occupancy already gave them)
    "red_spread_stages": 1,
    "spread_ew_cols": 256,  # columns of a spread elementwise tile (rows fill the rest of ew_tile_bytes)
}

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# elementwise modes
_FWD_TRAIN, _FWD_EVAL, _BWD_TRAIN, _BWD_EVAL = 0, 1, 2, 3


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------


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
def _bn_reduce_rows_kernel(
    x_ptr, g_ptr, ref_ptr, part_ptr,
    M, C, P, NCB, n_iter, CCH,
    BM: tl.constexpr, BC: tl.constexpr, BWD: tl.constexpr, ACC: tl.constexpr,
    UNROLL: tl.constexpr, SMAP: tl.constexpr = 0, PDL: tl.constexpr = False, TWO_BUF: tl.constexpr = False,
    STAGES: tl.constexpr = 1,
):
    """Split reduction over a row-major (M, C) view. Program (p, cb) sums columns cb*BC.. over
    row chunks p, p+P, p+2P, ... (UNROLL = 2 or 4 chunks per loop step, all loads issued before
    any is used, and the next step's loads issued before this step's sums). Forward: sum(x-shift),
    sum((x-shift)^2), shift = row 0. Backward: sum(g), sum(g*(x-mean)). Writes part[0, p, c] and
    part[1, p, c]. PDL: the combine may launch once every program has started (it waits for the sums).
    SMAP > 0: the (N, C*S) rows view of short ncs planes (S = SMAP, CCH channels): column j is element
    j % S of channel j // S, and its sums go to part[0 / 1, p*S + j % S, j // S] (S partials a program and
    channel, so the combine sees P*S partials per channel in the usual [P, C] layout).
    TWO_BUF (``red_two_buf_spread``, ``red_two_buf_rows_max_blocks``): two steps' loads held in two sets of
    registers, each set reloaded right after its own sums, so one step stays in flight while the other is summed
    (with one set, ptxas reloads it only after its sums: sm_90 SASS). The same steps summed in the same order: the
    same bits.
    STAGES > 1 (``red_spread_stages``, a variant): a plain loop (a step's loads, then its sums) that Triton
    pipelines through shared memory, STAGES - 1 steps in flight as cp.async copies; again the same bits."""
    if PDL:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    cb = pid % NCB
    p = pid // NCB
    cols = cb * BC + tl.arange(0, BC)
    cmask = cols < C
    if SMAP:
        ch = cols // SMAP
        if BWD:
            ref = tl.load(ref_ptr + ch, mask=cmask, other=0.0).to(ACC)
        else:  # the channel's shift, its first element x[0, c, 0]: the combine's
            ref = tl.load(x_ptr + ch * SMAP, mask=cmask, other=0.0).to(ACC)
    elif BWD:
        ref = tl.load(ref_ptr + cols, mask=cmask, other=0.0).to(ACC)
    else:
        ref = tl.load(x_ptr + cols, mask=cmask, other=0.0).to(ACC)
    ref2 = ref[None, :]
    acc1 = tl.zeros([BM, BC], dtype=ACC)
    acc2 = tl.zeros([BM, BC], dtype=ACC)
    rr = tl.arange(0, BM)
    if STAGES > 1:
        for i in tl.range(0, n_iter, num_stages=STAGES):
            x0, g0, x1, g1, x2, g2, x3, g3 = _bn_rows_load_step(x_ptr, g_ptr, p, i, P, M, C, rr, cols, cmask,
                                                                BM, UNROLL, BWD)
            acc1, acc2 = _bn_rows_acc_step(acc1, acc2, x0, g0, x1, g1, x2, g2, x3, g3, p, i, P, M, rr, cmask,
                                           ref2, BM, UNROLL, BWD, ACC)
    elif TWO_BUF:
        x0, g0, x1, g1, x2, g2, x3, g3 = _bn_rows_load_step(x_ptr, g_ptr, p, 0, P, M, C, rr, cols, cmask,
                                                            BM, UNROLL, BWD)
        # (a step past the program's n_iter reads row chunks past the last: masked off by their row limit)
        y0, k0, y1, k1, y2, k2, y3, k3 = _bn_rows_load_step(x_ptr, g_ptr, p, 1, P, M, C, rr, cols, cmask,
                                                            BM, UNROLL, BWD)
        for i in range(0, n_iter, 2):
            acc1, acc2 = _bn_rows_acc_step(acc1, acc2, x0, g0, x1, g1, x2, g2, x3, g3, p, i, P, M, rr, cmask, ref2,
                                           BM, UNROLL, BWD, ACC)
            x0, g0, x1, g1, x2, g2, x3, g3 = _bn_rows_load_step(x_ptr, g_ptr, p, i + 2, P, M, C, rr, cols, cmask,
                                                                BM, UNROLL, BWD)
            acc1, acc2 = _bn_rows_acc_step(acc1, acc2, y0, k0, y1, k1, y2, k2, y3, k3, p, i + 1, P, M, rr, cmask,
                                           ref2, BM, UNROLL, BWD, ACC)
            y0, k0, y1, k1, y2, k2, y3, k3 = _bn_rows_load_step(x_ptr, g_ptr, p, i + 3, P, M, C, rr, cols, cmask,
                                                                BM, UNROLL, BWD)
    else:
        x0, g0, x1, g1, x2, g2, x3, g3 = _bn_rows_load_step(x_ptr, g_ptr, p, 0, P, M, C, rr, cols, cmask,
                                                            BM, UNROLL, BWD)
        for i in range(0, n_iter):
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
    C, S, NC, NSC, P, NCB, n_iter,
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
    if not BWD:  # the shift: the channel's first element
        ref2 = tl.load(x_ptr + ch.to(tl.int64) * S, mask=cmask, other=0.0).to(ACC)[:, None]
    acc1 = tl.zeros([CB, BS], dtype=ACC)
    acc2 = tl.zeros([CB, BS], dtype=ACC)
    sr = tl.arange(0, BS)
    first = 0
    if BWD:
        # step 0 peeled, its loads issued before the saved mean's (H200: NCHW bf16 backward 3-4.5 % faster;
        # the same peel with the forward's shift load was not measured alone: NOTES-batch_norm.md, session 13)
        o0, o1, m0, m1 = _bn_ncs_step(p, 0, P, C, S, NC, NSC, ch, cmask, sr, BS)
        xa, ga = _bn_load_raw(x_ptr, g_ptr, o0, m0, BWD)
        xb, gb = _bn_load_raw(x_ptr, g_ptr, o1, m1, BWD)
        ref2 = tl.load(ref_ptr + ch, mask=cmask, other=0.0).to(ACC)[:, None]
        acc1, acc2 = _bn_acc_loaded(acc1, acc2, xa.to(ACC), ga.to(ACC), m0, ref2, BWD)
        acc1, acc2 = _bn_acc_loaded(acc1, acc2, xb.to(ACC), gb.to(ACC), m1, ref2, BWD)
        first = 1
    for i in range(first, n_iter):
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
    C, S, NC, NSC, P, NCB, n_iter,
    CB: tl.constexpr, BS: tl.constexpr, BWD: tl.constexpr, ACC: tl.constexpr, PDL: tl.constexpr = False,
):
    """ncs split reduction, plane length S at run time (S a multiple of 16, or large)."""
    _bn_reduce_ncs(x_ptr, g_ptr, ref_ptr, part_ptr, C, S, NC, NSC, P, NCB, n_iter, CB, BS, BWD, ACC, PDL)


@triton.jit
def _bn_reduce_ncs_kernel_cs(
    x_ptr, g_ptr, ref_ptr, part_ptr,
    C, S: tl.constexpr, NC, NSC, P, NCB, n_iter,
    CB: tl.constexpr, BS: tl.constexpr, BWD: tl.constexpr, ACC: tl.constexpr, PDL: tl.constexpr = False,
):
    """ncs split reduction with S a compile-time constant (short planes not a multiple of 16:
    the compiler then knows every alignment S has, e.g. 4 for 14x14)."""
    _bn_reduce_ncs(x_ptr, g_ptr, ref_ptr, part_ptr, C, S, NC, NSC, P, NCB, n_iter, CB, BS, BWD, ACC, PDL)


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
    part_ptr, x_ptr, shift_stride, coef_ptr, mean_ptr, invstd_ptr,
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
    shift = tl.load(x_ptr + ch.to(tl.int64) * shift_stride, mask=cmask, other=0.0).to(tl.float64)
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
):
    """Elementwise pass over a row-major (M, C) view, tile [BM, BC], tiles walked from the end of
    memory to the start (L2 reuse after the reduction). PDL: launched while the combine runs; the
    tile's x (and dy) are loaded before waiting for the coefficients. SMAP > 0: the (N, C*S) rows view
    of short ncs planes (S = SMAP, CCH channels): column j takes channel j // S's coefficients."""
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
    PDL: tl.constexpr = False,
):
    """ncs elementwise pass, plane length S at run time."""
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


# ----------------------------------------------------------------------------------------------
# One-launch kernels for small tensors (``fused_max_rows``): a program owns a block of channels and
# sweeps all of their elements twice (sums, then the elementwise pass; the second sweep reads from L2),
# so a direction is one launch with no partials, instead of reduction + combine + elementwise.


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
    M, C, S, NSC, NT, n0, n1, e0, e1, e2, m0, m1, m2,
    ROWS: tl.constexpr, B0: tl.constexpr, B1: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_RS: tl.constexpr, F64: tl.constexpr, ACC: tl.constexpr,
    S_CONST: tl.constexpr = 0,
):
    """Training forward of channel block program_id(0) in one program: shifted sums (shift = the channel's
    first element, differences in ACC, summed in fp64: a lane sums many tiles); mean, invstd and running
    statistics as _bn_combine_fwd_kernel; then y = (x - shift) * a + c as the elementwise pass, tiles in
    reverse order. S_CONST: the plane length compiled in (short unaligned planes, as _const_s), else 0."""
    if S_CONST > 0:
        S = S_CONST
    cb = tl.program_id(0)
    ch, cmask = _bn_fused_channels(cb, C, ROWS, B1)
    if ROWS:
        shift = tl.load(x_ptr + ch, mask=cmask, other=0.0).to(ACC)
    else:
        shift = tl.load(x_ptr + ch.to(tl.int64) * S, mask=cmask, other=0.0).to(ACC)
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
    S_CONST: tl.constexpr = 0,
):
    """Backward of channel block program_id(0) in one program: sum(dy), sum(dy * (x - mean)) (products in ACC,
    summed in fp64), grad_weight / grad_bias as _bn_combine_bwd_kernel, then grad_input as the elementwise
    pass (training: dy - mean(dy) - (x - mean) invstd^2 mean(dy (x - mean)), times invstd w; eval: dy invstd w).
    mean / invstd: the saved statistics (training) or running mean and rsqrt(running var + eps) (eval).
    S_CONST: as the forward's."""
    if S_CONST > 0:
        S = S_CONST
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


# ----------------------------------------------------------------------------------------------
# Host side: layout, heuristics, launchers
# ----------------------------------------------------------------------------------------------


def _f32(v):
    try:
        return struct.unpack("f", struct.pack("f", v))[0]
    except OverflowError:
        return math.copysign(math.inf, v)


def _momentum_parts(momentum):
    """The momentum as _split3's three fp32 parts (None: 0, the running statistics are not updated)."""
    return _split3(momentum if momentum is not None else 0.0)


def _momentum_args(momentum):
    """The momentum's parts as kernel arguments: plan scalars 0-2 (``_launch.scalar``), so a plan replays
    each call's momentum (a momentum=None module's 1/num_batches_tracked changes every step)."""
    return tuple(scalar(part, slot) for slot, part in enumerate(_momentum_parts(momentum)))


@functools.lru_cache(maxsize=256)
def _split3(v):
    """v as three fp32 values whose fp64 sum is v exactly (normal range): passes a Python float
    (double) to a kernel without losing bits; the fp32 path uses the first part (= fp32(v))."""
    v = float(v)
    a = _f32(v)
    if not math.isfinite(a) or not math.isfinite(v):
        return a, 0.0, 0.0
    b = _f32(v - a)
    c = _f32(v - a - b)
    return a, b, c


@functools.lru_cache(maxsize=256)
def _split_count(n):
    """An integer count as two fp32 values summing exactly to it in fp64 (n < 2^48)."""
    a = _f32(float(n))
    return a, float(n - int(a))


def _acc(x):
    return (tl.float64, torch.float64) if x.dtype == torch.float64 else (tl.float32, torch.float32)


def _suggest_format(x):
    if x.dim() not in (4, 5):
        return torch.contiguous_format
    try:
        from torch._prims_common import suggest_memory_format

        return suggest_memory_format(x)
    except Exception:  # pragma: no cover - private helper moved
        cl = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
        return cl if x.is_contiguous(memory_format=cl) else torch.contiguous_format


def _same_layout(a, b):
    """Whether a and b (same shape) place every element at the same offset."""
    return all(sa == sb or n == 1 for sa, sb, n in zip(a.stride(), b.stride(), a.shape))


class _View:
    """Canonical view of an input: kind 'rows' (M, C) or 'ncs' (N, C, S). Dense inputs are used
    as they are (contiguous, channels_last, channels_last_3d); other strides are copied once to
    the suggested memory format."""

    __slots__ = ("x", "kind", "N", "C", "S", "M")

    def __init__(self, x):
        if x.is_contiguous():
            rows = False
        elif x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
            rows = True
        elif x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d):
            rows = True
        else:
            fmt = _suggest_format(x)
            x = x.contiguous(memory_format=fmt)
            rows = fmt != torch.contiguous_format
        self.x = x
        self.N = int(x.shape[0])
        self.C = int(x.shape[1])
        s = 1
        for d in x.shape[2:]:
            s *= int(d)
        self.S = s
        self.M = self.N * s
        self.kind = "rows" if (rows or s == 1) else "ncs"

    def like(self, t):
        """t (same shape as x) with x's element placement (copied once if needed)."""
        if _same_layout(t, self.x):
            return t
        out = torch.empty_like(self.x, dtype=t.dtype)
        out.copy_(t)
        return out

    def empty(self, dtype=None):
        # x is dense here, so preserve_format keeps its strides exactly
        return alloc(torch.empty_like(self.x, dtype=dtype))


def _tile(esize, key):
    return max(16, next_pow2(_TUNE[key] // esize))


def _pick_bs(S, tile):
    """Block along S for the ncs layout: whole planes when S <= 1024 (tiles of consecutive
    planes, contiguous in memory); otherwise the largest power of two in [256, tile] that
    wastes <= 7% of the lanes on the last chunk of a plane, else the least wasteful."""
    if S <= 1024 or tile <= 256:
        return min(next_pow2(S), tile)
    best, best_util = None, -1.0
    cands = [b for b in (256, 512, 1024, 2048, 4096, 8192, 16384) if b <= tile]
    for b in cands:
        util = S / (cdiv(S, b) * b)
        if util >= 0.93:
            best = b
    if best is None:
        for b in cands:
            util = S / (cdiv(S, b) * b)
            if util > best_util:
                best, best_util = b, util
    return best


def _reduce_cfg(v, esize, bwd=False):
    key = (v.kind, v.N, v.C, v.S, esize, bwd, tuple(_TUNE.values()))
    cfg = _CFG_CACHE.get(("red",) + key)
    if cfg is None:
        cfg = _CFG_CACHE[("red",) + key] = _reduce_cfg_uncached(v, esize, bwd)
    return cfg


def _ew_cfg(v, esize):
    key = (v.kind, v.N, v.C, v.S, esize, tuple(_TUNE.values()))
    cfg = _CFG_CACHE.get(("ew",) + key)
    if cfg is None:
        cfg = _CFG_CACHE[("ew",) + key] = _ew_cfg_uncached(v, esize)
    return cfg


_CFG_CACHE = {}


def _reduce_cfg_uncached(v, esize, bwd=False):
    """Split-reduction grid. Returns a dict with the block sizes, P (programs per channel block),
    NCB (channel blocks), n_iter (grid-stride steps). v may be a _SpreadView (kind "spread")."""
    rows_like = v.kind in ("rows", "spread")
    wide_fwd = rows_like and not bwd and esize >= 4
    if rows_like:
        tile = _tile(esize, "red_tile_bytes_fwd_fp32" if wide_fwd else "red_tile_bytes")
        target = _TUNE["target_programs_spread" if v.kind == "spread" else "target_programs_rows_bwd" if bwd else
                       "target_programs_rows_fwd_fp32" if wide_fwd else "target_programs_rows_fwd"]
        # (a spread input's N rows are few: its partials may take the ncs share, so that a few hundred rows still
        # split into several programs a column block)
        frac = _TUNE["partial_frac_spread" if v.kind == "spread" else "partial_frac_rows"]
    else:
        tile = _tile(esize, "red_tile_bytes_ncs_bwd" if bwd else "red_tile_bytes_ncs_fwd")
        target = _TUNE["target_programs"]
        if not bwd and esize <= 2 and not _unaligned(v):
            target = _TUNE["target_programs_ncs_fwd_16bit"]
        frac = _TUNE["partial_frac"]
    C = v.C
    if v.kind == "spread":  # few, very long rows: spread_red_min_cols (above)
        if _TUNE["red_two_buf_spread"] and _TUNE["red_spread_stages"] <= 1:
            BC, BM, ncb, units, P = _spread_cols(v, tile, _TUNE["target_programs_spread_two_buf"], frac, esize)
            if cdiv(units, P) >= _TUNE["red_two_buf_min_chunks"]:  # a program's row chunks
                return _reduce_cfg_done(dict(BM=BM, BC=BC, TWO_BUF=True), v, P, ncb, units, rows_like, bwd, wide_fwd)
        BC, BM, ncb, units, _ = _spread_cols(v, tile, target, frac, esize)
        cfg = dict(BM=BM, BC=BC)
        if _TUNE["red_spread_stages"] > 1:
            cfg["STAGES"] = _TUNE["red_spread_stages"]
    elif v.kind == "rows":
        BC = min(next_pow2(C), tile, 1024)
        # enough rows per program that the partials stay a small fraction of the input
        while BC > 32 and v.M * cdiv(C, BC) < _TUNE["min_rows"] * _TUNE["target_programs"]:
            BC //= 2
        BM = max(1, tile // BC)
        ncb = cdiv(C, BC)
        units = cdiv(v.M, BM)
        cfg = dict(BM=BM, BC=BC)
        # two register sets, a grid of one wave (below); not the fp32 backward (no gain: s30 call 7)
        if ncb <= _TUNE["red_two_buf_rows_max_blocks"] and not (bwd and esize >= 4):
            P = _programs_down(v, units, ncb, _TUNE["target_programs_rows_two_buf"], frac, esize)
            if cdiv(units, P) >= _TUNE["red_two_buf_min_chunks"]:
                return _reduce_cfg_done(dict(cfg, TWO_BUF=True), v, P, ncb, units, rows_like, bwd, wide_fwd)
    else:
        BS = _pick_bs(v.S, tile)
        if _unaligned(v):
            # planes that start off a 16-element boundary: scalar accesses, registers grow with
            # the planes a thread touches; small programs with few planes each, more of them
            nw = _unaligned_warps(BS)
            CB = min(next_pow2(C), max(1, (512 * nw) // BS))
            target = target * max(1, 8 // nw)
        else:
            nw = None
            CB = min(next_pow2(C), max(1, tile // BS))
        ncb = cdiv(C, CB)
        nsc = cdiv(v.S, BS)
        units = v.N * nsc
        cfg = dict(CB=CB, BS=BS, NSC=nsc, U=units)
        if nw is not None:
            cfg["nw"] = nw
    return _reduce_cfg_done(cfg, v, _programs_down(v, units, ncb, target, frac, esize), ncb, units, rows_like, bwd,
                            wide_fwd)


def _programs_down(v, units, ncb, target, frac, esize):
    """P, the programs a column block: within target programs, the partials (2 x P x C x 4 bytes) a small fraction
    of the input."""
    cap = int(frac * v.M * esize / 8)
    return max(1, min(units, target // ncb, max(cap, 1)))


def _spread_cols(v, tile, target, frac, esize):
    """(BC, BM, column blocks, row chunks, P) of a spread reduction aiming at ``target`` programs."""
    BC = min(next_pow2(v.C), tile, max(_TUNE["spread_red_min_cols"], next_pow2(cdiv(v.C, target))))
    BM = max(1, tile // BC)
    ncb, units = cdiv(v.C, BC), cdiv(v.M, BM)
    return BC, BM, ncb, units, _programs_down(v, units, ncb, target, frac, esize)


def _reduce_cfg_done(cfg, v, P, ncb, units, rows_like, bwd, wide_fwd):
    # (backward: 2; 4 chunks of x and dy in flight measured slower on the H200)
    unroll_key = "red_unroll_rows_fwd_fp32" if wide_fwd else "red_unroll_rows_fwd"
    unroll = 4 if (rows_like and not bwd and _TUNE[unroll_key] >= 4) else 2
    cfg.update(P=P, NCB=ncb, n_iter=cdiv(units, unroll * P), UNROLL=unroll)
    return cfg


def _ew_cfg_uncached(v, esize):
    rows_like = v.kind in ("rows", "spread")
    tile = _tile(esize, "ew_tile_bytes" if rows_like else "ew_tile_bytes_ncs")
    if rows_like:
        # spread rows: a narrow tile of many rows, so a thread's per-column coefficients serve several rows
        BC = min(next_pow2(v.C), tile, _TUNE["spread_ew_cols"] if v.kind == "spread" else tile)
        BM = max(1, tile // BC)
        ncb = cdiv(v.C, BC)
        nt = cdiv(v.M, BM) * ncb
        return dict(BM=BM, BC=BC, NCB=ncb, NT=nt)
    BS = _pick_bs(v.S, tile)
    if _unaligned(v):
        nw = _unaligned_warps(BS)
        R = max(1, (512 * nw) // BS)  # ~16 elements a thread, as few planes a thread as possible
    else:
        R = max(1, tile // BS)
        nw = _warps(R * BS)
    nsb = cdiv(v.S, BS)
    nt = cdiv(v.N * v.C, R) * nsb
    return dict(R=R, BS=BS, NSB=nsb, NT=nt, nw=nw)


@functools.lru_cache(maxsize=256)
def _flat_cfg_cached(N, C, S, esize, tile_bytes):
    """R planes per program of _bn_ew_flat_kernel: a multiple of the planes that make 16 bytes, R * S
    elements at most ~tile_bytes of data, the block (next power of two) as full as possible."""
    align = 16 // math.gcd(S * esize, 16)
    cap = max(align, (tile_bytes // esize) // S)
    best_util, R = -1.0, align
    for r in range(align, cap + 1, align):
        util = r * S / next_pow2(r * S)
        if util > best_util + 1e-9:
            best_util, R = util, r
    BLOCK = next_pow2(R * S)
    return dict(R=R, RP=next_pow2(R), BLOCK=BLOCK, NT=cdiv(N * C, R), nw=_warps(BLOCK))


def _warps(elems):
    return _TUNE["ew_warps"] if elems >= 2048 else 4


def _unaligned(v):
    """ncs planes whose length is not a multiple of 16 elements (7x7, 14x14, ...): Triton cannot
    prove 16-byte alignment, so every access is scalar and a warp spans a plane."""
    return v.kind == "ncs" and v.S % 16 != 0


def _const_s(v):
    """Compile S in (one kernel per plane length) for short unaligned planes, so the compiler sees
    the alignment S does have (196 = 4 x 49: 16-byte fp32 / 8-byte bf16 accesses)."""
    return _unaligned(v) and v.S <= 1024


def _spread(v, ew=False):
    """S where the short unaligned ncs planes of v are taken as the (N, C*S) rows view (column j = element
    j % S of channel j // S), else 0: planes of at most ``spread_max_plane`` (``spread_max_plane_ew`` for the
    elementwise pass) elements, rows of a multiple of 16 elements (16-byte aligned rows), inputs of at most
    ``spread_max_esize`` bytes an element."""
    if not _unaligned(v) or v.S > _TUNE["spread_max_plane_ew" if ew else "spread_max_plane"]:
        return 0
    if v.x.element_size() > _TUNE["spread_max_esize"] or v.C * v.S >= 2**31 - 2**16:  # (int32 column indices)
        return 0
    return v.S if (v.C * v.S) % 16 == 0 else 0


class _SpreadView:
    """The (N, C*S) rows view of a spread ncs input, as the grid heuristics see it."""

    __slots__ = ("kind", "N", "C", "S", "M")

    def __init__(self, v):
        self.kind, self.N, self.C, self.S, self.M = "spread", v.N, v.C * v.S, 1, v.N


def _flat_planes(v, mode):
    """Whether the elementwise pass takes short unaligned planes as one flat vector array."""
    if v.kind == "rows" or not _const_s(v):
        return False
    bwd = mode in (_BWD_TRAIN, _BWD_EVAL)
    return v.S <= _TUNE["ew_flat_max_plane_bwd" if bwd else "ew_flat_max_plane"]


def _unaligned_warps(BS):
    # ~4+ elements of a plane per thread: warps = BS / 128, at least 1, at most 8
    return max(1, min(8, BS // 128))


def _one_launch_cfg(v):
    """The one-launch kernels' configuration (``_fused_cfg``) where this call takes them, else None: channels of
    at most ``fused_max_rows`` elements, at most ``fused_max_numel`` in all (past it the split path's parallel
    reduction pays for its two extra launches), each program sweeping at most ``fused_max_tiles`` tiles."""
    if v.M > _TUNE["fused_max_rows"] or v.M * v.C > _TUNE["fused_max_numel"]:
        return None
    cfg = _fused_cfg(v)
    return cfg if cfg["NT"] <= _TUNE["fused_max_tiles"] else None


def _fused_cfg(v):
    key = ("fused", v.kind, v.N, v.C, v.S, tuple(_TUNE.values()))
    cfg = _CFG_CACHE.get(key)
    if cfg is None:
        cfg = _CFG_CACHE[key] = _fused_cfg_uncached(v)
    return cfg


def _fused_cfg_uncached(v):
    """Grid and tile [B0, B1] of the one-launch kernels. Rows view: [rows, channels], the channels per program
    shrinking (to 16) until there are ``fused_min_programs`` blocks. ncs view: one channel a program, tile
    [samples, plane chunk]: a small channel is one tile, all of its loads in flight at once."""
    tile = _TUNE["fused_tile_elems"]
    if v.kind == "rows":
        bc = min(next_pow2(v.C), 64)
        while bc > 16 and cdiv(v.C, bc) < _TUNE["fused_min_programs"]:
            bc //= 2
        bm = max(1, min(next_pow2(v.M), tile // bc))
        return dict(ROWS=True, B0=bm, B1=bc, NCB=cdiv(v.C, bc), NSC=1, NT=cdiv(v.M, bm), M=v.M)
    bs = min(next_pow2(v.S), tile)
    bn = max(1, min(next_pow2(v.N), tile // bs))
    nsc = cdiv(v.S, bs)
    return dict(ROWS=False, B0=bn, B1=bs, NCB=v.C, NSC=nsc, NT=cdiv(v.N, bn) * nsc, M=v.N)


def _combine_cfg(C, P, bwd=False):
    """(BLOCK_P, channels a program, programs) of the combine: a [BP, BCC] tile of partials, BCC capped
    in the forward (few partials would otherwise give one program of thousands of channels)."""
    BP = min(next_pow2(P), 512)
    BCC = max(1, min(next_pow2(C), _TUNE["combine_elems_bwd" if bwd else "combine_elems"] // BP))
    if not bwd:
        BCC = min(BCC, _TUNE["combine_max_channels_fwd"])
    return BP, BCC, cdiv(C, BCC)


def _reduce(v, g, ref, bwd, acc_tl, acc_t, pdl=False):
    """Launch the split reduction; returns (partials [2, P', C], P'): P' = P, or P*S on the spread view (S
    partials a program and channel). pdl: its dependent (the combine) is launched with programmatic dependent
    launch."""
    x = v.x
    sp = _spread(v)
    rv = _SpreadView(v) if sp else v
    cfg = _reduce_cfg(rv, x.element_size(), bwd)
    P, ncb = cfg["P"], cfg["NCB"]
    n_part = P * max(sp, 1)  # partials a channel
    part = alloc(torch.empty((2, n_part, v.C), device=x.device, dtype=acc_t))
    grid = (P * ncb,)
    gg = g if g is not None else x
    rr = ref if ref is not None else x
    if rv.kind != "ncs":
        launch(_bn_reduce_rows_kernel, grid,
            x, gg, rr, part, rv.M, rv.C, P, ncb, cfg["n_iter"], v.C,
            BM=cfg["BM"], BC=cfg["BC"], BWD=bwd, ACC=acc_tl, UNROLL=cfg["UNROLL"], SMAP=sp, **pdl_trigger(pdl),
            **({"TWO_BUF": True} if cfg.get("TWO_BUF") else {}),
            **({"STAGES": cfg["STAGES"]} if "STAGES" in cfg else {}),
            num_warps=_rows_reduce_warps(cfg, x.element_size()),
        )
        return part, n_part
    kern = _bn_reduce_ncs_kernel_cs if _const_s(v) else _bn_reduce_ncs_kernel
    nw = cfg.get("nw") or (_TUNE["red_warps"] if cfg["CB"] * cfg["BS"] >= 2048 else 4)
    launch(kern, grid,
        x, gg, rr, part, v.C, v.S, v.N * v.C, cfg["NSC"], P, ncb, cfg["n_iter"],
        CB=cfg["CB"], BS=cfg["BS"], BWD=bwd, ACC=acc_tl, **pdl_trigger(pdl),
        num_warps=nw,
    )
    return part, P


def _rows_reduce_warps(cfg, esize):
    """Warps of a rows reduction program. Programs with row segments of >= 256 bytes take 4 (twice the bytes a
    thread has in flight at as many programs a SM: ptxas issues a loop step's loads only after the previous
    step's sums, so a program waits with one step in flight)."""
    if cfg["BM"] * cfg["BC"] < 2048:
        return 4
    if cfg["BC"] * esize >= _TUNE["red_warps_rows_min_bytes"]:
        return _TUNE["red_warps_rows_wide"]
    return _TUNE["red_warps"]


def _elementwise(v, x, g, out, params, mode, has_w, has_b, eps, acc_tl, pdl=False):
    """The elementwise pass; pdl: launched with programmatic dependent launch after the combine."""
    e0, e1, e2 = _split3(eps)
    kw = pdl_follow(pdl)
    p0, p1, p2, p3 = params
    f64 = acc_tl == tl.float64
    sp = _spread(v, ew=True)
    rv = _SpreadView(v) if sp else v
    cfg = _ew_cfg(rv, out.element_size())
    grid = (cfg["NT"],)
    if rv.kind != "ncs":
        launch(_bn_ew_rows_kernel, grid,
            x, g, out, p0, p1, p2, p3, rv.M, rv.C, cfg["NCB"], cfg["NT"], v.C, e0, e1, e2,
            BM=cfg["BM"], BC=cfg["BC"], MODE=mode, HAS_W=has_w, HAS_B=has_b, F64=f64, ACC=acc_tl, SMAP=sp,
            num_warps=_warps(cfg["BM"] * cfg["BC"]), **kw,
        )
    elif _flat_planes(v, mode):
        fc = _flat_cfg_cached(v.N, v.C, v.S, out.element_size(), _TUNE["ew_tile_bytes_ncs"])
        launch(_bn_ew_flat_kernel, (fc["NT"],),
            x, g, out, p0, p1, p2, p3, v.N * v.C, v.C, fc["NT"], e0, e1, e2,
            S=v.S, R=fc["R"], RP=fc["RP"], BLOCK=fc["BLOCK"], MODE=mode, HAS_W=has_w, HAS_B=has_b, F64=f64,
            ACC=acc_tl, num_warps=fc["nw"], **kw,
        )
    else:
        kern = _bn_ew_ncs_kernel_cs if _const_s(v) else _bn_ew_ncs_kernel
        launch(kern, grid,
            x, g, out, p0, p1, p2, p3, v.N * v.C, v.C, v.S, cfg["NSB"], cfg["NT"], e0, e1, e2,
            R=cfg["R"], BS=cfg["BS"], MODE=mode, WRAP_MOD=cfg["R"] > v.C,
            LOCAL32=cfg["R"] * v.S < 2**31 - cfg["BS"], HAS_W=has_w, HAS_B=has_b, F64=f64, ACC=acc_tl,
            num_warps=cfg["nw"], **kw,
        )


def supports(x) -> bool:
    """Whether these kernels handle x: fp16/bf16/fp32/fp64, ndim >= 2, numel > 0, on CUDA (or on
    CPU under TRITON_INTERPRET=1)."""
    from normkit.kernels import runs_kernels_on

    if not isinstance(x, torch.Tensor) or x.dtype not in _DTYPES:
        return False
    if x.dim() < 2 or x.numel() == 0:
        return False
    return runs_kernels_on(x)


def bn_forward_train(x, weight, bias, running_mean, running_var, momentum, eps):
    """Training forward: 3 HBM passes (split reduction over x, tiny combine, elementwise x -> y).

    Returns ``(y, save_mean, save_invstd)``; y in x's dtype and memory format, stats (C,) fp32
    (fp64 for fp64 x). ``running_mean``/``running_var`` (both or neither) are updated in place:
    ``rm = (1-m) rm + m mean``, ``rv = (1-m) rv + m var n/(n-1)`` (n == 1 gives NaN like aten).
    weight/bias may be None. ``momentum`` is used verbatim.
    """
    if _plan.enabled() and x.is_cuda:  # (the momentum is a plan scalar: one plan for every value)
        return _plan.planned(_train_key(eps), (x, weight, bias, running_mean, running_var),
                             lambda: _forward_train(x, weight, bias, running_mean, running_var, momentum, eps),
                             _momentum_parts(momentum))
    return _forward_train(x, weight, bias, running_mean, running_var, momentum, eps)


def _train_key(eps):
    return ("bn_forward_train", eps, tuple(_TUNE.values()))


def _backward_key(train, mask):
    return ("bn_backward", bool(train), mask, tuple(_TUNE.values()))


# Replays without a launcher call behind them, for normkit.ops' fast routes: ``sig`` is ``_plan.signature`` of the
# same inputs; the outputs of the plan an earlier call recorded, or None (no such plan: nothing is recorded)

def bn_forward_train_replay(x, weight, bias, running_mean, running_var, momentum, eps, sig):
    return _plan.replay_only(_train_key(eps), (x, weight, bias, running_mean, running_var), sig,
                             _momentum_parts(momentum))


def bn_backward_train_replay(grad_out, x, weight, mean, invstd, mask, sig):
    return _plan.replay_only(_backward_key(True, mask), (grad_out, x, weight, mean, invstd), sig)


def bn_train_planned(eps, sig) -> bool:
    """Whether a training forward with inputs of signature ``sig`` has a plan (a replay would take it)."""
    return _plan.recorded(_train_key(eps), sig)


def bn_backward_train_planned(mask, sig) -> bool:
    return _plan.recorded(_backward_key(True, mask), sig)


def _forward_train(x, weight, bias, running_mean, running_var, momentum, eps):
    """``bn_forward_train``'s work, without a plan (what a plan records)."""
    v = _View(x)
    cfg = _one_launch_cfg(v)
    if cfg is not None:
        return _forward_train_fused(v, cfg, weight, bias, running_mean, running_var, momentum, eps)
    acc_tl, _ = _acc(x)
    pdl = pdl_on(x, _TUNE["pdl"])
    coef, mean, invstd = _statistics(v, weight, bias, running_mean, running_var, momentum, eps, pdl)
    y = v.empty()
    _elementwise(v, v.x, v.x, y, (coef, coef, coef, coef), _FWD_TRAIN, True, True, eps, acc_tl, pdl)
    return y, mean, invstd


def _forward_train_fused(v, cfg, weight, bias, running_mean, running_var, momentum, eps):
    """The training forward in one launch (_bn_fused_fwd_kernel)."""
    acc_tl, acc_t = _acc(v.x)
    dev = v.x.device
    mean = alloc(torch.empty((v.C,), device=dev, dtype=acc_t))
    invstd = alloc(torch.empty((v.C,), device=dev, dtype=acc_t))
    y = v.empty()
    has_rs = running_mean is not None and running_var is not None
    n0, n1 = _split_count(v.M)
    e = _split3(eps)
    m = _momentum_args(momentum)
    launch(_bn_fused_fwd_kernel, (cfg["NCB"],),
        v.x, y, mean, invstd, weight if weight is not None else mean, bias if bias is not None else mean,
        running_mean if has_rs else mean, running_var if has_rs else mean,
        cfg["M"], v.C, v.S, cfg["NSC"], cfg["NT"], n0, n1, e[0], e[1], e[2], m[0], m[1], m[2],
        ROWS=cfg["ROWS"], B0=cfg["B0"], B1=cfg["B1"], HAS_W=weight is not None, HAS_B=bias is not None,
        HAS_RS=has_rs, F64=acc_t == torch.float64, ACC=acc_tl, S_CONST=v.S if _const_s(v) else 0, num_warps=4,
    )
    return y, mean, invstd


def _statistics(v, weight, bias, running_mean, running_var, momentum, eps, pdl):
    """The split reduction and the combine: (coef [4, C], mean, invstd), running statistics updated."""
    acc_tl, acc_t = _acc(v.x)
    C = v.C
    dev = v.x.device
    part, P = _reduce(v, None, None, False, acc_tl, acc_t, pdl)
    mean = alloc(torch.empty((C,), device=dev, dtype=acc_t))
    invstd = alloc(torch.empty((C,), device=dev, dtype=acc_t))
    coef = alloc(torch.empty((4, C), device=dev, dtype=acc_t))
    has_rs = running_mean is not None and running_var is not None
    n0, n1 = _split_count(v.M)
    e = _split3(eps)
    m = _momentum_args(momentum)
    BP, BCC, nprog = _combine_cfg(C, P)
    shift_stride = 1 if v.kind == "rows" else v.S
    launch(_bn_combine_fwd_kernel, (nprog,),
        part, v.x, shift_stride, coef, mean, invstd,
        weight if weight is not None else mean, bias if bias is not None else mean,
        running_mean if has_rs else mean, running_var if has_rs else mean,
        C, P, n0, n1, e[0], e[1], e[2], m[0], m[1], m[2],
        BP=BP, BCC=BCC, HAS_W=weight is not None, HAS_B=bias is not None, HAS_RS=has_rs,
        F64=acc_t == torch.float64, ACC=acc_tl, num_warps=4, **pdl_follow(pdl),
    )
    return coef, mean, invstd


def bn_forward_eval(x, weight, bias, running_mean, running_var, eps):
    """Eval forward: 2 HBM passes, one elementwise kernel ``y = (x - rm) * (w / sqrt(rv + eps)) + b``
    (per-channel terms computed in every program, fp32; fp64 for fp64 x). y keeps x's format;
    NCHW and NHWC give the same bits."""
    if _plan.enabled() and x.is_cuda:
        key = ("bn_forward_eval", eps, tuple(_TUNE.values()))
        return _plan.planned(key, (x, weight, bias, running_mean, running_var),
                             lambda: (_forward_eval(x, weight, bias, running_mean, running_var, eps),))[0]
    return _forward_eval(x, weight, bias, running_mean, running_var, eps)


def _forward_eval(x, weight, bias, running_mean, running_var, eps):
    """``bn_forward_eval``'s work, without a plan (what a plan records)."""
    v = _View(x)
    acc_tl, _ = _acc(x)
    y = v.empty()
    w = weight if weight is not None else running_mean
    b = bias if bias is not None else running_mean
    _elementwise(v, v.x, v.x, y, (running_mean, running_var, w, b), _FWD_EVAL,
                 weight is not None, bias is not None, eps, acc_tl)
    return y


def bn_backward(grad_out, x, weight, mean, invstd, train, output_mask):
    """Backward: ``(grad_input | None, grad_weight | None, grad_bias | None)`` per output_mask.

    train=True: mean/invstd are the saved stats; 5 HBM passes for grad_input (split reduction over
    x and dy, combine, elementwise x, dy -> dx), 2 for weight/bias grads alone.
    train=False: mean = running_mean, invstd = rsqrt(running_var + eps) from the caller;
    grad_input = dy * invstd * w is 2 passes (dy only); weight/bias grads need the reduction.
    grad_input keeps x's memory format and dtype; grad_weight/grad_bias take weight's dtype
    (the stats dtype, fp32 or fp64, when weight is None).
    """
    mask = tuple(bool(m) for m in output_mask)
    if _plan.enabled() and x.is_cuda:
        return _plan.planned(_backward_key(train, mask), (grad_out, x, weight, mean, invstd),
                             lambda: _backward(grad_out, x, weight, mean, invstd, train, mask))
    return _backward(grad_out, x, weight, mean, invstd, train, mask)


def _backward(grad_out, x, weight, mean, invstd, train, output_mask):
    """``bn_backward``'s work, without a plan (what a plan records)."""
    need_dx, need_gw, need_gb = (bool(b) for b in output_mask)
    if not (need_dx or need_gw or need_gb):
        return None, None, None
    v = _View(x)
    g = v.like(grad_out)
    acc_tl, acc_t = _acc(x)
    C = v.C
    dev = x.device
    pdt = weight.dtype if weight is not None else acc_t
    gw = alloc(torch.empty((C,), device=dev, dtype=pdt)) if need_gw else None
    gb = alloc(torch.empty((C,), device=dev, dtype=pdt)) if need_gb else None
    dx = None
    need_red = need_gw or need_gb or (need_dx and train)
    cfg = _one_launch_cfg(v) if need_red else None
    if cfg is not None:
        dx = v.empty() if need_dx else None
        n0, n1 = _split_count(v.M)
        launch(_bn_fused_bwd_kernel, (cfg["NCB"],),
            g, v.x, dx if dx is not None else g, mean, invstd, weight if weight is not None else invstd,
            gw if gw is not None else invstd, gb if gb is not None else invstd,
            cfg["M"], v.C, v.S, cfg["NSC"], cfg["NT"], n0, n1,
            ROWS=cfg["ROWS"], B0=cfg["B0"], B1=cfg["B1"], TRAIN=bool(train), HAS_W=weight is not None,
            NEED_DX=need_dx, NEED_GW=need_gw, NEED_GB=need_gb, ACC=acc_tl, S_CONST=v.S if _const_s(v) else 0,
            num_warps=4,
        )
        return dx, gw, gb
    coef = None
    pdl = pdl_on(x, _TUNE["pdl"])
    if need_red:
        part, P = _reduce(v, g, mean, True, acc_tl, acc_t, pdl)
        coef_needed = need_dx and train
        coef = alloc(torch.empty((4, C), device=dev, dtype=acc_t)) if coef_needed else None
        n0, n1 = _split_count(v.M)
        BP, BCC, nprog = _combine_cfg(C, P, bwd=True)
        launch(_bn_combine_bwd_kernel, (nprog,),
            part, mean, invstd, weight if weight is not None else invstd,
            coef if coef is not None else part,
            gw if gw is not None else part, gb if gb is not None else part,
            C, P, n0, n1,
            BP=BP, BCC=BCC, HAS_W=weight is not None, NEED_DX=coef_needed,
            NEED_GW=need_gw, NEED_GB=need_gb, ACC=acc_tl, num_warps=4, **pdl_follow(pdl),
        )
    if need_dx:
        dx = v.empty()
        if train:
            _elementwise(v, v.x, g, dx, (coef, coef, coef, coef), _BWD_TRAIN, True, True, 0.0, acc_tl, pdl)
        else:
            w = weight if weight is not None else invstd
            _elementwise(v, g, g, dx, (invstd, invstd, w, invstd), _BWD_EVAL,
                         weight is not None, False, 0.0, acc_tl)
    return dx, gw, gb


# --------------------------------------------------------------------------------------------------
# SyncBatchNorm's primitives: the same kernels, composed per primitive (tiny per-channel terms in torch)

def bn_stats(x, eps):
    """``batch_norm_stats``: (mean, invstd) of x's channels, (C,) fp32 (fp64 for fp64 x): the training
    forward's reduction and combine, no elementwise pass and no running statistics."""
    v = _View(x)
    _, mean, invstd = _statistics(v, None, None, None, None, 0.0, eps, pdl_on(x, _TUNE["pdl"]))
    return mean, invstd


def _stats_dtype(x, *ts):
    acc_t = _acc(x)[1]
    return [t.to(acc_t) for t in ts]


def bn_elemt(x, weight, bias, mean, invstd):
    """``batch_norm_elemt``: (x - mean) * invstd * w + b with given statistics, in x's dtype and layout."""
    v = _View(x)
    mean, invstd = _stats_dtype(x, mean, invstd)
    a = invstd if weight is None else invstd * weight.to(invstd.dtype)
    c = torch.zeros_like(mean) if bias is None else bias.to(mean.dtype)
    coef = torch.stack([mean, mean, a, c])  # [shift, (unused by the pass), scale, offset]
    y = v.empty()
    _elementwise(v, v.x, v.x, y, (coef, coef, coef, coef), _FWD_TRAIN, True, True, 0.0, _acc(x)[0])
    return y


def bn_backward_reduce(grad_out, x, mean, invstd, weight, input_g, weight_g, bias_g):
    """``batch_norm_backward_reduce``: (sum_dy, sum_dy_xmu, grad_weight, grad_bias), each None unless asked:
    the backward's split reduction and combine (its partials summed in fp64 in a fixed order; with invstd 1
    its grad_weight / grad_bias outputs are the raw sums)."""
    v = _View(x)
    acc_tl, acc_t = _acc(x)
    mean, invstd = _stats_dtype(x, mean, invstd)
    C = v.C
    part, P = _reduce(v, v.like(grad_out), mean, True, acc_tl, acc_t)
    sums = torch.empty((2, C), device=x.device, dtype=acc_t)
    ones = torch.ones((C,), device=x.device, dtype=acc_t)
    BP, BCC, nprog = _combine_cfg(C, P, bwd=True)
    launch(_bn_combine_bwd_kernel, (nprog,), part, mean, ones, ones, part, sums[1], sums[0], C, P, 0, 0,
           BP=BP, BCC=BCC, HAS_W=False, NEED_DX=False, NEED_GW=True, NEED_GB=True, ACC=acc_tl, num_warps=4)
    sum_dy, sum_dy_xmu = sums[0], sums[1]
    pdt = weight.dtype if weight is not None else x.dtype
    return (sum_dy if input_g else None, sum_dy_xmu if input_g else None,
            (sum_dy_xmu * invstd).to(pdt) if weight_g else None, sum_dy.to(pdt) if bias_g else None)


def bn_backward_elemt(grad_out, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
    """``batch_norm_backward_elemt``: grad_input = (dy - sum_dy/N - (x - mean) invstd^2 sum_dy_xmu/N) invstd w,
    N = sum(count) (the global count: no host read), in x's dtype and layout."""
    v = _View(x)
    mean, invstd, sum_dy, sum_dy_xmu = _stats_dtype(x, mean, invstd, sum_dy, sum_dy_xmu)
    n = count.to(mean.dtype).sum()
    gs = invstd if weight is None else invstd * weight.to(invstd.dtype)
    coef = torch.stack([sum_dy / n, invstd * invstd * sum_dy_xmu / n, gs, mean])
    dx = v.empty()
    _elementwise(v, v.x, v.like(grad_out), dx, (coef, coef, coef, coef), _BWD_TRAIN, True, True, 0.0, _acc(x)[0])
    return dx
