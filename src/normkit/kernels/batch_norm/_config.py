"""Batch norm's host-side geometry: the canonical views of an input and the shape-keyed heuristics (``_TUNE``)
that pick each kernel's grid and tiles. Plain Python; the launchers (``__init__``) read it."""

import functools
import math

import torch

from normkit.kernels import cdiv, layout, next_pow2
from normkit.kernels._jit import alignment_hint
from normkit.kernels._launch import alloc

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
    # ... its backward. H200 session 33 (s33/call2-part102, bn_kernels.py pfr05), bf16 graph ms, 0.005 -> 0.05:
    # 256x512x7x7 CL bwd 0.0296 -> 0.0238 (15 -> 41 programs a column block), the other rows the rule below leaves
    # alone -0.8..0 % (the forward: 256x512x7x7 +7 %, so it keeps 0.005); 16-bit only (fp32 not measured)
    "partial_frac_rows_bwd": 0.05,
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
    # ... and odd planes (scalar ncs loads) up to this in the elementwise pass. H100 session 38
    # (results/h100-2026-12-05-s38, bn_kernels.py, bf16 graph ms, fwd / bwd / eval): the spread elementwise pass
    # alone (call 3, oddew320 / oddewall) won on every odd plane: 128x160x17x17 0.0238 / 0.0272 / 0.0110 -> 0.0215 /
    # 0.0252 / 0.0085, 128x768x17x17 0.0768 / 0.1224 / 0.0466 -> 0.0707 / 0.1166 / 0.0416, 32x288x35x35 fwd / eval
    # -7 / -18 %, 32x80x73x73 0.0484 / 0.0567 / 0.0242 -> 0.0442 / 0.0558 / 0.0201 (bwd -1..-2 %). The spread
    # reduction lost (oddred320: 128x160x17x17 fwd / bwd +4 / +10 %; from 35x35 up +7..+66 % in call 1), so odd
    # planes spread in the elementwise pass only. The cap stops at the largest plane measured in training (147x147
    # measured in eval only, -2 % in call 1). The spread pass compiles S in (SMAP), so each odd plane length of
    # 1,025-8,192 elements costs a compile of its own, as the constant-plane kernels' lengths up to 1,024 already did
    "spread_max_plane_ew_odd": 8192,
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
    # 16-bit rows of at least this many channels: column blocks of 1024 (2 KB row segments) with the partials cap
    # below, instead of min_rows' narrower blocks (0: off). H200 session 33 (s33/call2-part102, bn_kernels.py bc1024),
    # bf16 graph ms, fwd / bwd: 256x2048x7x7 CL 0.0483 / 0.0708 -> 0.0463 / 0.0685 (64 -> 1024 columns, 2 x 132
    # programs with two register sets), 256x1024x14x14 CL 0.0844 / 0.1249 -> 0.0819 / 0.1240, 65536x1024 0.1099 /
    # 0.1619 -> 0.1047 / 0.1596. Narrower channel counts lost with full-width blocks (256x256x14x14 fwd +13 %,
    # 256x512x7x7 +15 %, 256x128x28x28 +5 %); fp32 not measured
    "red_rows_full_min_cols_16bit": 1024,
    "partial_frac_rows_full": 0.05,
    # the rows reduction's column block fixed to this power of two (at most C's; 0: the min_rows rule above). For
    # sweeps (bn_kernels.py bc* variants): session 33 mapped each row's time against its block
    "red_rows_block_cols": 0,
    "target_programs_rows_two_buf": 264,
    "spread_ew_cols": 256,  # columns of a spread elementwise tile (rows fill the rest of ew_tile_bytes)
    # rows kernels told C's power-of-two factor below 16 (_row_align; 0: not told, element-by-element loads where
    # C % 16 != 0, as before session 37)
    "row_align": 1,
    # the run-time-plane ncs kernels (planes > 1024 elements, S % 16 != 0: 38x38, 150x150) told S's power-of-two
    # factor (_plane_align; 0: element-by-element loads, 70-76 scalar loads in the reduction offline). H100 session
    # 38 (results/h100-2026-12-05-s38/call1-part111, bn_kernels.py planealign), graph ms, off -> on: bf16 fwd
    # 32x512x38x38 0.0720 -> 0.0558, 16x64x150x150 0.0835 -> 0.0587, 64x256x50x50 0.1135 -> 0.0940; bwd -6..-8 %,
    # eval -6..-12 %; fp32 -1..-9 %; none of the 18 rows slower
    "plane_align": 1,
    # channels_last / 2-D rows of an odd C >= 3 up to fold_max_c, inputs of at most fold_max_esize bytes an element,
    # folded: the (M, C) rows taken as (M / K, K * C) with K * C a multiple of 16 (>= fold_min_cols), column j ->
    # channel j % C (_fold); a folded reduction program sums its K columns of each channel before it writes them
    # (FOLD_SUM: P * NCB partials a channel, so the partials cap does not cut P by K). Unfolded, C = 3 channels_last
    # bf16 ran at 0.17-0.19 of copy (rows of 6 bytes loaded element by element). H100 session 38
    # (results/h100-2026-12-05-s38, call 2, K partials a program), graph ms, bf16, off -> on: 64x3x224x224 CL fwd /
    # bwd / eval 0.0517 / 0.0578 / 0.0291 -> 0.0316 / 0.0406 / 0.0133, 1048576x7 0.0369 / 0.0410 / 0.0188 -> 0.0221 /
    # 0.0349 / 0.0101. Summed, session 39 (results/h100-2026-12-05-s39/call1-part115), K partials -> summed: bf16
    # 64x3x224x224 CL fwd / bwd 0.0322 / 0.0400 -> 0.0245 / 0.0370, 256x5x56x56 CL 0.0145 / 0.0242 -> 0.0135 / 0.0199;
    # fp32 (unfolded before) 64x3x224x224 CL 0.0458 / 0.0723 -> 0.0424 / 0.0671, 256x5x56x56 fwd / bwd / eval
    # 0.0256 / 0.0328 / 0.0113 -> 0.0224 / 0.0288 / 0.0104, but C = 3 fp32 eval +1.4 % (0.0279 -> 0.0283, 0.87 of
    # copy either way). Even C / C = 1 lost in training even summed (256x2x56x56 CL bf16 fwd 0.0083 -> 0.0096,
    # 1048576x1 bwd 0.0056 -> 0.0084); one folded row in one column block lost too (256x5x56x56 fwd 0.0135 -> 0.0203)
    "fold_max_c": 15,
    "fold_min_cols": 128,
    "fold_max_esize": 4,
    # a backward's dy dense in the other layout than x (a contiguous gradient of a channels_last input, from a
    # reshape after the layer) put in x's layout by normkit.kernels.layout's tile transpose, not torch's strided
    # copy. H100 2026-12-06 (session 42, benchmarks/layout_ab.py), forward + backward: bf16 256x64x56x56 CL x /
    # contiguous dy 0.507 -> 0.349 ms, fp32 0.806 -> 0.678, bf16 8x64x32x64x64 0.648 -> 0.452, bf16 256x256x28x28
    # contiguous x / CL dy 0.670 -> 0.352. 0 = torch's copy
    "tile_transpose": 1,
}

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# elementwise modes
_FWD_TRAIN, _FWD_EVAL, _BWD_TRAIN, _BWD_EVAL = 0, 1, 2, 3


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
    fold = 0  # (a _FoldView's C)

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
        fmt = torch.contiguous_format if self.x.is_contiguous() else _suggest_format(self.x)
        if _TUNE["tile_transpose"] and layout.transposable(t, fmt):
            return layout.to_memory_format(t, fmt)
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
    key = (v.kind, v.N, v.C, v.S, v.fold, esize, bwd, tuple(_TUNE.values()))
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
        frac = _TUNE["partial_frac_spread" if v.kind == "spread" else
                     "partial_frac_rows_bwd" if bwd and esize == 2 else "partial_frac_rows"]
    else:
        tile = _tile(esize, "red_tile_bytes_ncs_bwd" if bwd else "red_tile_bytes_ncs_fwd")
        target = _TUNE["target_programs"]
        if not bwd and esize <= 2 and not _unaligned(v):
            target = _TUNE["target_programs_ncs_fwd_16bit"]
        frac = _TUNE["partial_frac"]
    C = v.C
    if v.kind == "spread":  # few, very long rows: spread_red_min_cols (above)
        if _TUNE["red_two_buf_spread"]:
            BC, BM, ncb, units, P = _spread_cols(v, tile, _TUNE["target_programs_spread_two_buf"], frac, esize)
            if cdiv(units, P) >= _TUNE["red_two_buf_min_chunks"]:  # a program's row chunks
                return _reduce_cfg_done(dict(BM=BM, BC=BC, TWO_BUF=True), v, P, ncb, units, rows_like, bwd, wide_fwd)
        BC, BM, ncb, units, _ = _spread_cols(v, tile, target, frac, esize)
        cfg = dict(BM=BM, BC=BC)
    elif v.kind == "rows":
        BC = min(next_pow2(C), tile, 1024)
        full = esize == 2 and 0 < _TUNE["red_rows_full_min_cols_16bit"] <= C
        if _TUNE["red_rows_block_cols"]:  # a sweep's fixed column block
            BC = min(BC, _TUNE["red_rows_block_cols"])
        elif full:  # the widest block (2 KB row segments), more programs down the rows
            frac = _TUNE["partial_frac_rows_full"]
        else:  # enough rows per program that the partials stay a small fraction of the input
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
    """P, the programs a column block: within target programs, the partials (2 x P x C x 4 bytes; 2 x P x NCB x the
    channels on a folded view, whose programs sum their channels) a small fraction of the input."""
    cap = int(frac * v.M * esize / 8)
    if v.fold:
        cap = cap * v.C // (ncb * v.fold)
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


def _row_align(n):
    """C_ALIGN of the rows kernels (``known_multiple``): the power of two below 16 that rows of n elements are a
    multiple of, or 1 where Triton already knows (n % 16 == 0), nothing can be gained (odd n) or ``row_align`` is
    off."""
    return alignment_hint(n) if _TUNE["row_align"] else 1


def _plane_align(v):
    """S_ALIGN of the run-time-plane ncs kernels (``known_multiple``): as ``_row_align`` for the plane length, where
    ``plane_align`` is on."""
    return alignment_hint(v.S) if _TUNE["plane_align"] else 1


def _spread(v, ew=False):
    """S where the short unaligned ncs planes of v are taken as the (N, C*S) rows view (column j = element
    j % S of channel j // S), else 0: planes of at most ``spread_max_plane`` (``spread_max_plane_ew`` for the
    elementwise pass) elements, rows of a multiple of 16 elements (16-byte aligned rows), inputs of at most
    ``spread_max_esize`` bytes an element; in the elementwise pass odd planes up to ``spread_max_plane_ew_odd`` too."""
    limit = _TUNE["spread_max_plane_ew" if ew else "spread_max_plane"]
    if ew and v.S % 2:
        limit = max(limit, _TUNE["spread_max_plane_ew_odd"])
    if not _unaligned(v) or v.S > limit:
        return 0
    if v.x.element_size() > _TUNE["spread_max_esize"] or v.C * v.S >= 2**31 - 2**16:  # (int32 column indices)
        return 0
    return v.S if (v.C * v.S) % 16 == 0 else 0


def _fold(v):
    """K where the rows view (M, C) of an odd C >= 3 is taken as (M / K, K * C) rows (``fold_max_c``, inputs of at
    most ``fold_max_esize`` bytes an element), else 0. K is a multiple of 16 (C is odd, so that K * C is one of 16):
    the least with K * C >= ``fold_min_cols``, or the largest smaller one dividing M. Column j of a folded row is
    channel j % C."""
    if v.kind != "rows" or v.C % 2 == 0 or v.C == 1 or v.C > _TUNE["fold_max_c"]:
        return 0
    if v.x.element_size() > _TUNE["fold_max_esize"]:
        return 0
    k = 16 * max(1, -(-_TUNE["fold_min_cols"] // (16 * v.C)))
    while k > 16 and v.M % k:
        k -= 16
    return k if v.M % k == 0 and v.M // k >= 2 else 0


class _FoldView:
    """The (M / K, K * C) rows view of a folded rows input, as the grid heuristics see it."""

    __slots__ = ("kind", "N", "C", "S", "M", "fold")

    def __init__(self, v, k):
        self.kind, self.N, self.C, self.S, self.M, self.fold = "rows", v.M // k, v.C * k, 1, v.M // k, v.C


class _SpreadView:
    """The (N, C*S) rows view of a spread ncs input, as the grid heuristics see it."""

    __slots__ = ("kind", "N", "C", "S", "M")
    fold = 0

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


def _rows_reduce_warps(cfg, esize):
    """Warps of a rows reduction program. Programs with row segments of >= 256 bytes take 4 (twice the bytes a
    thread has in flight at as many programs a SM: ptxas issues a loop step's loads only after the previous
    step's sums, so a program waits with one step in flight)."""
    if cfg["BM"] * cfg["BC"] < 2048:
        return 4
    if cfg["BC"] * esize >= _TUNE["red_warps_rows_min_bytes"]:
        return _TUNE["red_warps_rows_wide"]
    return _TUNE["red_warps"]
