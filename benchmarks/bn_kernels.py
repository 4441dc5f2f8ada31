"""GPU sweep of normkit's batch norm kernels against eager PyTorch, with the copy bandwidth
measured in the same run.

    PYTHONPATH=src python benchmarks/bn_kernels.py --out DIR [--budget SECONDS] [--jobs N]

Shapes are the batch_norm rows of the public suite (shared/bench/suite.json). For each shape,
layout (contiguous / channels_last), dtype (bf16 and fp32 inputs, fp32 params) and mode
(train forward, train backward, eval forward) it records:

* ``nk_graph_ms``: normkit, median per call of a CUDA-graph replay of K calls (kernel time,
  launch overhead excluded); inputs rotate over several buffers for tensors near L2 size;
* ``nk_bench_ms``: normkit through ``triton.testing.do_bench`` (median; includes Python launch
  overhead when the GPU work is shorter than it);
* ``eager_ms``: eager PyTorch (cuDNN where F.batch_norm uses it, else native), same graph method;
* SOL fractions under the minimal byte count (forward/eval: read x + write y; backward:
  read x + dy, write dx) against the device-to-device copy bandwidth measured here.

Block-size variants of ``batch_norm._TUNE`` are swept on the bf16 rows. Compilation is done
first by parallel worker processes (``--jobs``) sharing Triton's cache. Results go to
``DIR/bn_kernels.jsonl`` (one line per measurement, written as they come) and a table is printed
last.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

if "--dry" in sys.argv:  # CPU check of the script: the Triton interpreter, set before triton loads
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def load_bn():
    from normkit.kernels import batch_norm as B

    return B


# the batch_norm rows of shared/bench/suite.json
SHAPES = [(256, 64, 112, 112), (256, 64, 56, 56), (256, 256, 56, 56), (256, 512, 28, 28),
          (256, 1024, 14, 14), (256, 2048, 7, 7), (65536, 1024), (1048576, 64), (16, 64, 32, 64, 64),
          # resnet50 layers of 6-26 MB whose reductions ran at 0.28-0.50 of copy (bn_breakdown.py)
          (256, 128, 28, 28), (256, 256, 14, 14), (256, 512, 7, 7)]
# --small: batch-norm layers of the zoo's small models (resnet18 at batch 8 / 32, mobilenet_v3_small at 128, MLP
# batch norms, a small 3-D one): N * spatial from 32 to 25088 elements a channel, where one launch per direction
# (fused_max_rows, variant "fused") may beat the split reduction's three
SMALL_SHAPES = [(8, 64, 56, 56), (8, 128, 28, 28), (8, 256, 14, 14), (8, 512, 7, 7), (32, 512, 7, 7), (32, 256, 14, 14),
                (128, 576, 7, 7), (128, 96, 14, 14), (256, 1024), (32, 4096), (4, 64, 8, 28, 28),
                # 2-D layers with 1-2 partials a channel, whose forward combine had 1-2 programs of 4096 channels
                # before combine_max_channels_fwd (variant combwide: the old rule)
                (1024, 4096), (512, 8192), (4096, 512)]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# 2026-12-01: more reduction programs for inputs <= 64 MB (x2/x4/x8 target, partials to 5 %) lost on
# every resnet50 layer but one (256x128x28x28 CL fwd 0.0529 -> 0.0578/0.0655/0.0794 ms): knobs deleted.
# pfr* (rows partial fraction) neutral within 1 % but 256x512x28x28 CL bwd +12 %; pf05 (ncs) kept.
# 2026-11-30 H200 sweep measured the flat* (dropped) and rows* variants; won: forward rows = unroll 4 + 4 KB tile + 512 programs, backward rows = 4 KB tile + 660 programs (now the defaults)
VARIANTS = {
    "default": {},
    "red4k": {"red_tile_bytes": 4096, "red_tile_bytes_ncs_fwd": 4096, "red_tile_bytes_ncs_bwd": 4096},
    "red16k": {"red_tile_bytes": 16384, "red_tile_bytes_ncs_fwd": 16384, "red_tile_bytes_ncs_bwd": 16384},
    "tp512": {"target_programs": 512, "target_programs_rows_fwd": 512},
    "tp2048": {"target_programs": 2048, "target_programs_rows_fwd": 2048},
    "minrows128": {"min_rows": 128},
    "pf005": {"partial_frac": 0.005, "partial_frac_rows": 0.005},
    "ncsew16k": {"ew_tile_bytes_ncs": 16384},
    "ncsew4k": {"ew_tile_bytes_ncs": 4096},
    "rowsew8k": {"ew_tile_bytes": 8192},
    "rowsew32k": {"ew_tile_bytes": 32768},
    # rows view (NHWC / NDHWC / 2-D) reductions around the defaults: 2 chunks in flight, grid sizes
    "rowsu2": {"red_unroll_rows_fwd": 2},
    "rowstp1k": {"target_programs_rows_fwd": 1024},
    "rowstp396": {"target_programs_rows_fwd": 396, "target_programs_rows_bwd": 396},
    "rowsr4ktp660": {"red_tile_bytes": 4096, "target_programs_rows_fwd": 660, "target_programs_rows_bwd": 660},
    # small inputs: the partials cap (2 P C fp32 <= frac x input) held P to ~15-60 programs per channel
    # block on resnet50's 6-26 MB layers, and min_rows then split C into 64-byte row segments
    "pfr02": {"partial_frac_rows": 0.02},
    "pfr05": {"partial_frac_rows": 0.05},
    "pfr05m64": {"partial_frac_rows": 0.05, "min_rows": 64},
    "pf05": {"partial_frac": 0.05},
    # short unaligned planes: the flat 16-byte elementwise pass off, or on for 14x14 forward / eval too
    "noflat": {"ew_flat_max_plane": 0, "ew_flat_max_plane_bwd": 0},
    "flat256": {"ew_flat_max_plane": 256},
    # combine kernels with smaller [BP, BCC] tiles: at 4096 the forward combine needs 250-254 registers
    # (fp64 sums; 2 programs of 4 warps a SM), at 1024 72-80 (offline_audit.py, 2026-12-01)
    # 2026-12-01 (session 8): comb2k / comb1k (both combines) and programmatic dependent launch measured;
    # pdl and the backward's 1024 adopted. Left to check: 256x512x7x7 channels_last bf16 read +18 / +21 %
    # (fwd / bwd) with pdl and both combines at 1024 together, -11 / -11 % with pdl alone
    "nopdl": {"pdl": 0},
    "comb4kbwd": {"combine_elems_bwd": 4096},
    "comb1kfwd": {"combine_elems": 1024},
    # 2026-12-01 (session 9): the combine fused into the reduction's last program per channel block (an
    # acq_rel ticket zeroed per call by a memset) measured and deleted: fwd / bwd +2..+19 % on the rows it
    # touched (the memset and every program's release fence cost more than the PDL-overlapped combine
    # kernel); NOTES-batch_norm.md session 9
    # session 10: L2 eviction hints (reduction loads evict_last, elementwise loads / stores evict_first, for
    # inputs up to 64 MiB / 128 MiB / always) measured and deleted: -6..+3 % on the <= 51 MB rows (predicted
    # -8..-15 % on the 51 MB forwards), +4..+7 % on every >= 100 MB backward when always on (NOTES-batch_norm.md)
    # 2026-12-01 (session 8): a sample-major reduction over short unaligned NCHW planes (16-byte loads, the
    # position sums split into channels once per program) measured and deleted (NOTES-batch_norm.md)
    # session 15 / 16: both reductions' loops software-pipelined by Triton (tl.range num_stages, 2-4 stages:
    # ncs and rows reductions) measured and deleted: slower on most rows (NOTES-batch_norm.md, session 16)
    # session 19: the flat elementwise pass (NCHW planes <= 64, <= 256 backward) loading x / dy before its
    # coefficients and the PDL wait (flatlf), 16 KB tiles for 2-byte outputs (flat16k). Predicted: bf16
    # 256x2048x7x7 eval 0.032 -> 0.027-0.029 ms, forward / backward -2..-5 % at 7x7. Measured (call 2): flatlf
    # eval 0.0331 -> 0.0304, forward 0.0603 -> 0.0593, backward and fp32 within 1 %; flat16k nothing. flatlf
    # is the kernel's only order since; both knobs deleted (NOTES-batch_norm.md, session 19)
    # session 20 (bn_reduce_probe.py: the forward reductions alone at 0.49-0.80 of copy, a one-tile-a-program read
    # at 0.92-1.03), measured in call 2: the rows reduction's loads two steps ahead (rowsd2, +4..+13 % bf16: 96
    # registers, 2 programs a SM; deleted), 4-warp rows forward programs (adopted from 256-byte row segments),
    # fewer ncs forward programs (adopted at 256 for aligned 16-bit planes), 4-warp reductions everywhere (redw4:
    # NCHW forward +8..+23 %, not taken); call 4: the backward's rows sums at 4 warps too (adopted). The variants
    # below now set each rule's other side.
    "rowsw8": {"red_warps_rows_wide": 8},
    "rowsw4all": {"red_warps_rows_min_bytes": 0},
    "ncsfp1k": {"target_programs_ncs_fwd_16bit": 1024},
    "ncsfp512": {"target_programs_ncs_fwd_16bit": 512},
    # session 22 (prepared without a GPU): every training forward / backward in one launch (_bn_fused_*_kernel);
    # session 23 measured it (call 1) and adopted it for small layers; "split" is every call on three launches
    "fused": {"fused_max_rows": 1 << 40, "fused_max_numel": 1 << 40, "fused_max_tiles": 1 << 40},
    "split": {"fused_max_rows": 0},
    # session 23: the forward combine capped at 512 channels a program; "combwide" is the old rule (its tile's
    # 4096 elements all in one program's channels where there are few partials)
    "combwide": {"combine_max_channels_fwd": 1 << 20},
    # session 28: short unaligned NCHW planes as the (N, C*S) rows view (spread_*): off, off in one pass, its tiles,
    # and 14x14 planes too
    "nospread": {"spread_max_plane": 0, "spread_max_plane_ew": 0, "spread_max_plane_ew_odd": 0},
    "nospreadred": {"spread_max_plane": 0},
    "nospreadew": {"spread_max_plane_ew": 0, "spread_max_plane_ew_odd": 0},
    "sptp256": {"target_programs_spread": 256},
    "sptp1k": {"target_programs_spread": 1024},
    "spew1k": {"spread_ew_cols": 1024},
    "spread256": {"spread_max_plane": 256, "spread_max_plane_ew": 256},
    "spread32": {"spread_max_esize": 4},
    "spt8k": {"red_tile_bytes": 8192},  # (on contiguous inputs only the spread reduction reads these two)
    "spw8": {"red_warps_rows_wide": 8},
    "spmin128": {"spread_red_min_cols": 128},
    "spr256": {"spread_max_plane": 256},
    # session 29: spread reductions with wider column blocks (1-4 KB row segments), P > 1 programs a block
    "spc512": {"spread_red_min_cols": 512, "target_programs_spread": 400, "partial_frac_spread": 0.25},
    "spc1k": {"spread_red_min_cols": 1024, "target_programs_spread": 400, "partial_frac_spread": 0.25},
    "spc2k": {"spread_red_min_cols": 2048, "target_programs_spread": 400, "partial_frac_spread": 0.5},
    # session 30: the spread reduction before red_two_buf_spread (one register set, 512 programs)
    "onebuf": {"red_two_buf_spread": 0, "target_programs_spread": 512},
    # session 30: the rows view before red_two_buf_rows_max_blocks (one register set everywhere)
    "rowsonebuf": {"red_two_buf_rows_max_blocks": 0},
    # session 30 (prepared): channels_last 7x7 at 2048 channels in 8 column blocks of 256 (min_rows 64, partials cap
    # 5 %), so that they take two register sets at 264 programs (session 27's pfr05m64 was this grid with one set)
    "rtbwide": {"min_rows": 64, "partial_frac_rows": 0.05},
    # session 33: the rows reduction at a fixed column block (two register sets where the rule allows), to map each
    # row's time against its block (rtbwide: 65536x1024 bf16 fwd -5 % at 1024 columns, 256x512x7x7 bwd -15 % at 64)
    # (partials cap 5 % as rtbwide: at 0.5 % wide blocks of the small layers would get 15-81 programs)
    **{f"bc{b}": {"red_rows_block_cols": b, "partial_frac_rows": 0.05} for b in (32, 64, 128, 256, 512, 1024)},
    # session 33: the rows rule before red_rows_full_min_cols_16bit / partial_frac_rows_bwd
    "oldrows": {"red_rows_full_min_cols_16bit": 0, "partial_frac_rows_bwd": 0.005},
    # session 37: rows kernels not told C's alignment (C % 16 in 2, 4, 8: element-by-element loads, as before)
    "noalign": {"row_align": 0},
    # session 37 (prepared, not measured): odd 17x17 planes (Inception-v3's 768 / 160 channels), whose ncs kernels
    # load element by element (offline sm_90: 76 b16 loads, no vectors), as the spread rows view (16-byte loads
    # where C * 289 % 16 == 0) or through the flat gather pass (elementwise only)
    "spread320": {"spread_max_plane": 320, "spread_max_plane_ew": 320},
    "spread1536": {"spread_max_plane": 1536, "spread_max_plane_ew": 1536},  # 35x35 too (1225 partials a program)
    "spreadodd": {"spread_max_plane": 1 << 30, "spread_max_plane_ew": 1 << 30},  # every unaligned plane (73x73, 147x147)
    "flat320": {"ew_flat_max_plane": 320, "ew_flat_max_plane_bwd": 320},
    # session 38: odd planes through the ncs elementwise pass (the spread one since, up to 8192 elements), or spread
    # at every size (call 3 measured the spread reduction half too, through a knob deleted since: it lost)
    "oddewoff": {"spread_max_plane_ew_odd": 0},
    "oddewall": {"spread_max_plane_ew_odd": 1 << 30},
    # session 38: fold off (on by default since: odd C, 2-byte inputs; 4-byte too and summed partials since s39)
    "nofold": {"fold_max_c": 0},
    # session 37: run-time planes of S % 16 != 0 (38x38, 50x50, 150x150) not told S's power-of-two factor (told
    # since session 38)
    "noplanealign": {"plane_align": 0},
}
# where a variant can change anything (others are skipped): "rows" = channels_last / 2-D input;
# modes it touches
VARIANT_SCOPE = {
    "rowsu2": ("rows", ("fwd",)),  # red_unroll_rows_fwd: forward statistics only
    "rowstp1k": ("rows", ("fwd",)),
    "rowstp396": ("rows", ("fwd", "bwd")),
    "rowsr4ktp660": ("rows", ("fwd", "bwd")),
    "pfr02": ("rows", ("fwd", "bwd")),
    "pfr05": ("rows", ("fwd", "bwd")),
    "pfr05m64": ("rows", ("fwd", "bwd")),
    "pf05": ("ncs", ("fwd", "bwd")),
    "noflat": ("ncs", ("fwd", "bwd", "eval")),
    "flat256": ("ncs", ("fwd", "eval")),
    "nopdl": ("any", ("fwd", "bwd")),
    "comb4kbwd": ("any", ("bwd",)),
    "comb1kfwd": ("any", ("fwd",)),
    "rowsw8": ("rows", ("fwd", "bwd")),
    "rowsw4all": ("rows", ("fwd", "bwd")),
    "ncsfp1k": ("ncs", ("fwd",)),
    "ncsfp512": ("ncs", ("fwd",)),
    "fused": ("any", ("fwd", "bwd")),
    "split": ("any", ("fwd", "bwd")),
    "combwide": ("any", ("fwd",)),
    "nospread": ("ncs", ("fwd", "bwd", "eval")),
    "nospreadred": ("ncs", ("fwd", "bwd")),
    "nospreadew": ("ncs", ("fwd", "bwd", "eval")),
    "sptp256": ("ncs", ("fwd", "bwd")),
    "sptp1k": ("ncs", ("fwd", "bwd")),
    "spew1k": ("ncs", ("fwd", "bwd", "eval")),
    "spread256": ("ncs", ("fwd", "bwd", "eval")),
    "spread32": ("ncs", ("fwd", "bwd", "eval")),
    "spt8k": ("ncs", ("fwd", "bwd")),
    "spw8": ("ncs", ("fwd", "bwd")),
    "spmin128": ("ncs", ("fwd", "bwd")),
    "spr256": ("ncs", ("fwd", "bwd")),
    "spc512": ("ncs", ("fwd", "bwd")),
    "spc1k": ("ncs", ("fwd", "bwd")),
    "spc2k": ("ncs", ("fwd", "bwd")),
    "onebuf": ("ncs", ("fwd", "bwd")),
    "rowsonebuf": ("rows", ("fwd", "bwd")),
    "rtbwide": ("rows", ("fwd", "bwd")),
    **{f"bc{b}": ("rows", ("fwd", "bwd")) for b in (32, 64, 128, 256, 512, 1024)},
    "oldrows": ("rows", ("fwd", "bwd")),
    "noalign": ("rows", ("fwd", "bwd", "eval")),
    "spread320": ("ncs", ("fwd", "bwd", "eval")),
    "spread1536": ("ncs", ("fwd", "bwd", "eval")),
    "spreadodd": ("ncs", ("fwd", "bwd", "eval")),
    "flat320": ("ncs", ("fwd", "bwd", "eval")),
    "oddewoff": ("ncs", ("fwd", "bwd", "eval")),
    "oddewall": ("ncs", ("fwd", "bwd", "eval")),
    "nofold": ("rows", ("fwd", "bwd", "eval")),
    "noplanealign": ("ncs", ("fwd", "bwd", "eval")),
}
# variants also run in fp32 (the rest: bf16 only)
FP32_VARIANTS = ("noflat", "flat256", "nopdl", "comb4kbwd", "comb1kfwd", "rowsw8", "fused", "split", "combwide",
                 "nospread", "spread32", "rowstp396", "rowsr4ktp660", "rowsonebuf", "rtbwide", "noalign", "spread320",
                 "spread1536", "spreadodd", "flat320",
                 "noplanealign", "nofold")
FILTERS = {}  # --shapes/--layouts/--dtypes/--modes/--only-variants
L2_BYTES = 60 * 2**20
DEV = "cuda"  # --dry: "cpu" under TRITON_INTERPRET=1 with tiny shapes (checks this script, times nothing real)


def _in_scope(var, shape, layout, mode):
    if var not in VARIANT_SCOPE:
        return True
    scope, modes = VARIANT_SCOPE[var]
    if mode not in modes:
        return False
    S = math.prod(shape[2:]) if len(shape) > 2 else 1
    if scope == "rows":
        return layout == "cl" or S == 1
    if scope == "ncs":
        return layout == "contig" and S > 1
    return True


def configs():
    out = []
    for shape in SHAPES:
        if "shapes" in FILTERS and "x".join(map(str, shape)) not in FILTERS["shapes"]:
            continue
        for layout in ("contig", "cl"):
            if layout == "cl" and len(shape) < 4:
                continue
            if "layouts" in FILTERS and layout not in FILTERS["layouts"]:
                continue
            for dt in ("bf16", "fp32"):
                if "dtypes" in FILTERS and dt not in FILTERS["dtypes"]:
                    continue
                for mode in ("fwd", "bwd", "eval"):
                    if "modes" in FILTERS and mode not in FILTERS["modes"]:
                        continue
                    variants = list(VARIANTS) if dt == "bf16" else ["default"] + list(FP32_VARIANTS)
                    if mode == "eval":
                        variants = [v for v in variants if v == "default" or "ew" in v or v in VARIANT_SCOPE]
                    elif dt == "bf16":
                        variants = [v for v in variants if "ew" not in v or mode == "fwd" or v in VARIANT_SCOPE]
                    variants = [v for v in variants if _in_scope(v, shape, layout, mode)]
                    if "variants" in FILTERS:
                        variants = [v for v in variants if v in FILTERS["variants"]]
                    for var in variants:
                        out.append((shape, layout, dt, mode, var))
    return out


class Case:
    def __init__(self, B, shape, layout, dt, nbuf):
        dtype = DTYPES[dt]
        C = shape[1]
        self.B = B
        self.shape = shape
        self.xs, self.gs = [], []
        for _ in range(nbuf):
            x = torch.randn(shape, device=DEV, dtype=dtype)
            g = torch.randn(shape, device=DEV, dtype=dtype)
            if layout == "cl":
                fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
                x = x.contiguous(memory_format=fmt)
                g = g.contiguous(memory_format=fmt)
            self.xs.append(x)
            self.gs.append(g)
        self.w = torch.rand(C, device=DEV) + 0.5
        self.b = torch.randn(C, device=DEV)
        self.rm = torch.randn(C, device=DEV)
        self.rv = torch.rand(C, device=DEV) + 0.5
        self.eps = 1e-5
        self.saved = []
        for x in self.xs:
            _, m, r = B.bn_forward_train(x, self.w, self.b, None, None, 0.1, self.eps)
            self.saved.append((m, r))
        self.eager_saved = []
        self.cudnn = (DEV == "cuda" and dtype != torch.bfloat16 and len(shape) >= 3 and shape[0] <= 880801
                      and torch.backends.cudnn.enabled)
        for x in self.xs:
            if self.cudnn:
                out = torch.ops.aten.cudnn_batch_norm(x, self.w, self.b, self.rm.clone(), self.rv.clone(),
                                                      True, 0.1, self.eps)
                self.eager_saved.append(out[1:])
            else:
                out = torch.ops.aten.native_batch_norm(x, self.w, self.b, self.rm.clone(), self.rv.clone(),
                                                       True, 0.1, self.eps)
                self.eager_saved.append(out[1:])

    # normkit
    def nk(self, mode, i):
        B, x = self.B, self.xs[i]
        if mode == "fwd":
            return B.bn_forward_train(x, self.w, self.b, self.rm, self.rv, 0.1, self.eps)
        if mode == "eval":
            return B.bn_forward_eval(x, self.w, self.b, self.rm, self.rv, self.eps)
        m, r = self.saved[i]
        return B.bn_backward(self.gs[i], x, self.w, m, r, True, (True, True, True))

    # eager torch (what F.batch_norm / autograd run)
    def eager(self, mode, i):
        x = self.xs[i]
        if mode == "fwd":
            return torch.batch_norm(x, self.w, self.b, self.rm, self.rv, True, 0.1, self.eps, True)
        if mode == "eval":
            return torch.batch_norm(x, self.w, self.b, self.rm, self.rv, False, 0.1, self.eps, True)
        if self.cudnn:
            sm, sv, reserve = self.eager_saved[i]
            return torch.ops.aten.cudnn_batch_norm_backward(x, self.gs[i], self.w, self.rm, self.rv, sm, sv,
                                                            self.eps, reserve)
        sm, sv = self.eager_saved[i]
        return torch.ops.aten.native_batch_norm_backward(self.gs[i], x, self.w, self.rm, self.rv, sm, sv, True,
                                                         self.eps, [True, True, True])


def graph_ms(call, nbuf, calls=10, reps=15):
    if DEV == "cpu":
        t = time.perf_counter()
        for i in range(nbuf):
            call(i)
        return (time.perf_counter() - t) * 1e3 / nbuf
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(nbuf):
            call(i)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    k = max(calls, nbuf)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for j in range(k):
            call(j % nbuf)
    g.replay()
    torch.cuda.synchronize()
    ts = []
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) / k)
    del g
    return statistics.median(ts)


def bench_ms(call, nbuf):
    if DEV == "cpu":
        return graph_ms(call, nbuf)
    import triton.testing

    state = [0]

    def fn():
        state[0] = (state[0] + 1) % nbuf
        call(state[0])

    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def copy_bw():
    """Device-to-device copy of 1 GiB fp32 (bytes read + written), the max of do_bench (eager
    copy_) and a graph of copy kernels; a memcpy node inside a CUDA graph can run on a copy engine
    at ~2.8 TB/s, which is not the SM-driven ceiling our kernels compete with."""
    n = 2**30 // 4 if DEV == "cuda" else 2**20
    a = torch.randn(n, device=DEV)
    b = torch.empty_like(a)
    ms = [bench_ms(lambda i: b.copy_(a), 1), graph_ms(lambda i: b.copy_(a), 1, calls=5, reps=10)]
    if DEV == "cuda":
        c = torch.empty_like(a)
        ms.append(graph_ms(lambda i: torch.mul(a, 1.0, out=c), 1, calls=5, reps=10))
    best = min(ms)
    return 2 * a.numel() * 4 / (best * 1e-3) / 1e9, ms


def relerr(a, b):
    a, b = a.float(), b.float()
    return (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b)).item()


def check(case, mode):
    """normkit vs eager on the same inputs (sanity, fp32 math): relative L2 error of the main output."""
    if mode == "fwd":
        a = case.nk("fwd", 0)[0]
        bref = torch.batch_norm(case.xs[0].float(), case.w, case.b, None, None, True, 0.1, case.eps, True)
        return relerr(a, bref)
    if mode == "eval":
        a = case.nk("eval", 0)
        bref = torch.batch_norm(case.xs[0].float(), case.w, case.b, case.rm, case.rv, False, 0.1, case.eps, True)
        return relerr(a, bref)
    m, r = case.saved[0]
    a = case.nk("bwd", 0)
    bref = torch.ops.aten.native_batch_norm_backward(case.gs[0].float(), case.xs[0].float(), case.w, None, None,
                                                     m, r, True, case.eps, [True, True, True])
    return max(relerr(a[0], bref[0]), relerr(a[1], bref[1]), relerr(a[2], bref[2]))


def nbytes(shape, dt, mode):
    n = math.prod(shape) * (2 if dt == "bf16" else 4)
    return n * (3 if mode == "bwd" else 2)


def set_variant(B, var, base):
    B._TUNE.clear()
    B._TUNE.update(base)
    B._TUNE.update(VARIANTS[var])


def warm(shard, nshard):
    B = load_bn()
    base = dict(B._TUNE)
    cfgs = configs()
    groups = {}
    for c in cfgs:
        groups.setdefault(c[:3], []).append(c)
    keys = sorted(groups)[shard::nshard]
    for key in keys:
        shape, layout, dt = key
        case = Case(B, shape, layout, dt, 1)
        for (_, _, _, mode, var) in groups[key]:
            set_variant(B, var, base)
            case.nk(mode, 0)
        torch.cuda.synchronize()
        del case
    print(f"[warm {shard}] done {len(keys)} groups", flush=True)


def _filter_argv(a):
    out = []
    for opt, attr in (("--shapes", "shapes"), ("--layouts", "layouts"), ("--dtypes", "dtypes"),
                      ("--modes", "modes"), ("--only-variants", "only_variants")):
        if getattr(a, attr):
            out += [opt, getattr(a, attr)]
    if a.dry:
        out.append("--dry")
    if a.small:
        out.append("--small")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--budget", type=float, default=200.0, help="seconds for the timed sweep")
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--warm", action="store_true")
    ap.add_argument("--shard", type=int, default=0)
    ap.add_argument("--nshard", type=int, default=1)
    ap.add_argument("--no-variants", action="store_true")
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--warm-only", action="store_true")
    ap.add_argument("--shapes", default="", help="comma list, e.g. 256x2048x7x7,65536x1024 (any shapes)")
    ap.add_argument("--layouts", default="", help="comma list of contig,cl")
    ap.add_argument("--dtypes", default="", help="comma list of bf16,fp32")
    ap.add_argument("--modes", default="", help="comma list of fwd,bwd,eval")
    ap.add_argument("--only-variants", default="", help="comma list of VARIANTS keys (default always kept)")
    ap.add_argument("--small", action="store_true", help="SMALL_SHAPES (small models' layers) instead of the suite's")
    a = ap.parse_args()
    for k, attr in (("shapes", "shapes"), ("layouts", "layouts"), ("dtypes", "dtypes"), ("modes", "modes"),
                    ("variants", "only_variants")):
        val = getattr(a, attr)
        if val:
            FILTERS[k] = set(val.split(","))
    if "variants" in FILTERS:
        FILTERS["variants"].add("default")
        unknown = FILTERS["variants"] - set(VARIANTS)
        if unknown:
            raise SystemExit(f"unknown variants {sorted(unknown)}; known: {sorted(VARIANTS)}")
    global DEV, SHAPES
    if a.small:
        SHAPES = SMALL_SHAPES
    if a.dry:
        DEV = "cpu"
        SHAPES = [(4, 6, 5, 3), (2, 3, 4), (33, 5), (2, 3, 2, 3, 4)]
        a.jobs = 0
    if "shapes" in FILTERS:  # exactly the named shapes, in or outside the lists above
        SHAPES = [tuple(int(d) for d in s.split("x")) for s in sorted(FILTERS["shapes"])]
    if a.warm:
        warm(a.shard, a.nshard)
        return
    t0 = time.time()
    if a.jobs > 0:
        env = dict(os.environ)
        procs = [subprocess.Popen([sys.executable, __file__, "--warm", "--shard", str(i), "--nshard", str(a.jobs)]
                                  + _filter_argv(a), env=env) for i in range(a.jobs)]
        for p in procs:
            p.wait()
        print(f"[bn_kernels] compile warm-up {time.time() - t0:.1f}s", flush=True)
    if a.warm_only:
        return
    B = load_bn()
    base = dict(B._TUNE)
    os.makedirs(a.out, exist_ok=True)
    log = open(os.path.join(a.out, "bn_kernels.jsonl"), "w")
    bw, cms = copy_bw()
    meta = {"device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu", "torch": torch.__version__,
            "triton": __import__("triton").__version__, "copy_GBps": bw, "copy_ms_bench_graph_mulkernel": cms,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "tune": base,
            "variants": {k: VARIANTS[k] for k in sorted({c[4] for c in configs()})},
            "argv": sys.argv[1:]}
    log.write(json.dumps({"meta": meta}) + "\n")
    log.flush()
    print(f"[bn_kernels] copy {bw:.0f} GB/s", flush=True)
    rows = []
    cfgs = configs()
    if a.no_variants:
        cfgs = [c for c in cfgs if c[4] == "default"]
    # default variant first (the table), variants after, so a budget cut loses variants only
    cfgs.sort(key=lambda c: (c[4] != "default", c[:3]))
    groups = {}
    for c in cfgs:
        groups.setdefault((c[4] != "default",) + c[:3], []).append(c)
    t1 = time.time()
    for key in groups:
        if time.time() - t1 > a.budget:
            print("[bn_kernels] budget reached; skipping the rest", flush=True)
            break
        _, shape, layout, dt = key
        nb = math.prod(shape) * (2 if dt == "bf16" else 4)
        nbuf = 3 if 3 * nb < 4 * L2_BYTES else 1
        case = Case(B, shape, layout, dt, nbuf)
        for (_, _, _, mode, var) in groups[key]:
            if time.time() - t1 > a.budget:
                print("[bn_kernels] budget reached inside a group; skipping the rest", flush=True)
                break
            set_variant(B, var, base)
            rec = {"shape": list(shape), "layout": layout, "dtype": dt, "params": "fp32", "mode": mode,
                   "variant": var}
            try:
                rec["nk_graph_ms"] = graph_ms(lambda i: case.nk(mode, i), nbuf)
                if var == "default":
                    rec["nk_bench_ms"] = bench_ms(lambda i: case.nk(mode, i), nbuf)
                    rec["eager_ms"] = graph_ms(lambda i: case.eager(mode, i), nbuf)
                    rec["relerr_vs_eager_fp32"] = check(case, mode)
                else:  # new paths: numbers too
                    rec["relerr_vs_eager_fp32"] = check(case, mode)
            except Exception as e:  # record and go on
                rec["error"] = f"{type(e).__name__}: {e}"[:500]
            by = nbytes(shape, dt, mode)
            rec["bytes"] = by
            for k in ("nk_graph_ms", "nk_bench_ms", "eager_ms"):
                if k in rec:
                    rec[k.replace("_ms", "_sol")] = by / (rec[k] * 1e-3) / 1e9 / bw
            if "error" in rec:
                print("[bn_kernels] error", rec, flush=True)
            log.write(json.dumps(rec) + "\n")
            log.flush()
            rows.append(rec)
        set_variant(B, "default", base)
        del case
        if DEV == "cuda":
            torch.cuda.empty_cache()
    log.close()
    # table: default variant; best variant per row
    best = {}
    for r in rows:
        k = (tuple(r["shape"]), r["layout"], r["dtype"], r["mode"])
        if "nk_graph_ms" in r and (k not in best or r["nk_graph_ms"] < best[k][0]):
            best[k] = (r["nk_graph_ms"], r["variant"])
    print(f"copy {bw:.0f} GB/s; SOL = minimal bytes / time / copy BW; graph = kernel time, bench = do_bench")
    print(f"{'shape':>20} {'lay':>6} {'dt':>4} {'mode':>4} | {'nk ms':>7} {'SOL':>5} {'bench':>6} | {'eager':>7} {'SOL':>5} | {'x':>5} | best variant | err")
    for r in rows:
        if r["variant"] != "default":
            continue
        k = (tuple(r["shape"]), r["layout"], r["dtype"], r["mode"])
        if "error" in r:
            print(f"{'x'.join(map(str, r['shape'])):>20} {r['layout']:>6} {r['dtype']:>4} {r['mode']:>4} | ERROR {r['error'][:80]}")
            continue
        bv = best.get(k, (0, "-"))
        print(f"{'x'.join(map(str, r['shape'])):>20} {r['layout']:>6} {r['dtype']:>4} {r['mode']:>4} | "
              f"{r['nk_graph_ms']:7.3f} {r['nk_graph_sol']:5.2f} {r['nk_bench_sol']:6.2f} | "
              f"{r['eager_ms']:7.3f} {r['eager_sol']:5.2f} | {r['eager_ms'] / r['nk_graph_ms']:5.2f} | "
              f"{bv[1]:>7} {bv[0]:6.3f} | {r['relerr_vs_eager_fp32']:.1e}")
    # variants: graph ms per row, one column per variant that ran
    vnames = [v for v in VARIANTS if v != "default" and any(r["variant"] == v for r in rows)]
    if vnames:
        cell = {}
        for r in rows:
            k = (tuple(r["shape"]), r["layout"], r["dtype"], r["mode"])
            if "nk_graph_ms" in r:
                cell[k + (r["variant"],)] = r["nk_graph_ms"]
        print("variants, graph ms per call:")
        print(f"{'shape':>20} {'lay':>6} {'dt':>4} {'mode':>4} | {'default':>8} " + " ".join(f"{v:>13}" for v in vnames))
        seen = []
        for r in rows:
            k = (tuple(r["shape"]), r["layout"], r["dtype"], r["mode"])
            if k in seen or not any(k + (v,) in cell for v in vnames):
                continue
            seen.append(k)
            d = cell.get(k + ("default",))
            print(f"{'x'.join(map(str, k[0])):>20} {k[1]:>6} {k[2]:>4} {k[3]:>4} | "
                  + (f"{d:8.4f} " if d else f"{'-':>8} ")
                  + " ".join(f"{cell[k + (v,)]:13.4f}" if k + (v,) in cell else f"{'-':>13}" for v in vnames))
    print(f"[bn_kernels] total {time.time() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    main()
