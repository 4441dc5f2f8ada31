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

Numerics: the forward accumulates sums of ``x - shift`` and ``(x - shift)^2`` with ``shift`` the median
of three of the channel's elements (first, middle, last: never a lone outlier, so its distance from the data costs
no digits), in fp32 (fp64 for fp64 input); partials are combined in fp64 in a fixed order. The normalisation
is ``(x - shift) * a + c`` with ``a = w * invstd`` and ``c = b - (mean - shift) * a``, so a large common offset
costs no digits. No atomics, no host synchronisation, the same bits on every run (the split depends on the shape
only, never on the device).

Modules: this one holds the launchers (what ``normkit.ops`` calls); ``_config`` the views and the heuristics
(``_TUNE``); ``_reduce_kernels``, ``_ew_kernels`` and ``_fused_kernels`` the Triton kernels.
"""

import functools
import math
import struct

import torch
import triton.language as tl

from normkit.kernels import _plan, next_pow2
from normkit.kernels._launch import alloc, launch, pdl_follow, pdl_on, pdl_trigger, scalar
from normkit.kernels.batch_norm._config import (_BWD_EVAL, _BWD_TRAIN, _FWD_EVAL, _FWD_TRAIN, _TUNE, _SpreadView,
                                                _FoldView, _View, _combine_cfg, _const_s, _ew_cfg, _flat_cfg_cached,
                                                _flat_planes, _fold, _one_launch_cfg, _reduce_cfg, _rows_reduce_warps,
                                                _plane_align, _row_align, _spread, _warps)
from normkit.kernels.batch_norm._ew_kernels import (_bn_ew_flat_kernel, _bn_ew_ncs_kernel, _bn_ew_ncs_kernel_cs,
                                                    _bn_ew_rows_kernel)
from normkit.kernels.batch_norm._fused_kernels import _bn_fused_bwd_kernel, _bn_fused_fwd_kernel
from normkit.kernels.batch_norm._reduce_kernels import (_bn_combine_bwd_kernel, _bn_combine_fwd_kernel,
                                                        _bn_reduce_ncs_kernel, _bn_reduce_ncs_kernel_cs,
                                                        _bn_reduce_rows_kernel)

__all__ = ["bn_forward_train", "bn_forward_eval", "bn_backward", "supports"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


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


def _shift_samples(v):
    """Offsets, from each channel's first element, of the other two elements the forward's shift is the median of
    (``_bn_shift``): the channel's middle and last elements in v's view (rows: rows (M - 1) // 2 and M - 1; ncs:
    the middle element of plane (N - 1) // 2 and the last plane's last)."""
    if v.kind == "rows":
        return ((v.M - 1) // 2) * v.C, (v.M - 1) * v.C
    plane = v.C * v.S
    return ((v.N - 1) // 2) * plane + (v.S - 1) // 2, (v.N - 1) * plane + v.S - 1


def _rows_view(v, ew=False):
    """(the view the kernels run on, SMAP, FOLD): the spread rows of short unaligned planes (SMAP = S), the folded
    rows of a small C (FOLD = C), or v itself."""
    sp = _spread(v, ew)
    if sp:
        return _SpreadView(v), sp, 0
    k = _fold(v)
    return (_FoldView(v, k), 0, v.C) if k else (v, 0, 0)


def _reduce(v, g, ref, bwd, acc_tl, acc_t, pdl=False, samples=(0, 0)):
    """Launch the split reduction; returns (partials [2, P', C], P'): P' = P, or P*S on the spread view (S
    partials a program and channel), P*NCB on the folded view (its programs sum each channel's columns). pdl: its
    dependent (the combine) is launched with programmatic dependent launch. samples: the forward's
    ``_shift_samples(v)`` (unused by the backward)."""
    x = v.x
    rv, sp, fold = _rows_view(v)
    cfg = _reduce_cfg(rv, x.element_size(), bwd)
    P, ncb = cfg["P"], cfg["NCB"]
    # partials a channel: S a program on the spread view, NCB on the folded one, else 1
    n_part = P * ncb if fold else P * (rv.C // v.C)
    part = alloc(torch.empty((2, n_part, v.C), device=x.device, dtype=acc_t))
    grid = (P * ncb,)
    gg = g if g is not None else x
    rr = ref if ref is not None else x
    if rv.kind != "ncs":
        launch(_bn_reduce_rows_kernel, grid,
            x, gg, rr, part, rv.M, rv.C, P, ncb, cfg["n_iter"], v.C, *samples,
            BM=cfg["BM"], BC=cfg["BC"], BWD=bwd, ACC=acc_tl, UNROLL=cfg["UNROLL"], SMAP=sp, C_ALIGN=_row_align(rv.C),
            FOLD=fold, FOLD_SUM=next_pow2(fold) if fold else 0, **pdl_trigger(pdl),
            **({"TWO_BUF": True} if cfg.get("TWO_BUF") else {}),
            num_warps=_rows_reduce_warps(cfg, x.element_size()),
        )
        return part, n_part
    const_s = _const_s(v)
    nw = cfg.get("nw") or (_TUNE["red_warps"] if cfg["CB"] * cfg["BS"] >= 2048 else 4)
    launch(_bn_reduce_ncs_kernel_cs if const_s else _bn_reduce_ncs_kernel, grid,
        x, gg, rr, part, v.C, v.S, v.N * v.C, cfg["NSC"], P, ncb, cfg["n_iter"], *samples,
        CB=cfg["CB"], BS=cfg["BS"], BWD=bwd, ACC=acc_tl, **pdl_trigger(pdl),
        **({} if const_s else {"S_ALIGN": _plane_align(v)}), num_warps=nw,
    )
    return part, n_part


def _elementwise(v, x, g, out, params, mode, has_w, has_b, eps, acc_tl, pdl=False):
    """The elementwise pass; pdl: launched with programmatic dependent launch after the combine."""
    e0, e1, e2 = _split3(eps)
    kw = pdl_follow(pdl)
    p0, p1, p2, p3 = params
    f64 = acc_tl == tl.float64
    rv, sp, fold = _rows_view(v, ew=True)
    cfg = _ew_cfg(rv, out.element_size())
    grid = (cfg["NT"],)
    if rv.kind != "ncs":
        launch(_bn_ew_rows_kernel, grid,
            x, g, out, p0, p1, p2, p3, rv.M, rv.C, cfg["NCB"], cfg["NT"], v.C, e0, e1, e2,
            BM=cfg["BM"], BC=cfg["BC"], MODE=mode, HAS_W=has_w, HAS_B=has_b, F64=f64, ACC=acc_tl, SMAP=sp,
            C_ALIGN=_row_align(rv.C), FOLD=fold, num_warps=_warps(cfg["BM"] * cfg["BC"]), **kw,
        )
    elif _flat_planes(v, mode):
        fc = _flat_cfg_cached(v.N, v.C, v.S, out.element_size(), _TUNE["ew_tile_bytes_ncs"])
        launch(_bn_ew_flat_kernel, (fc["NT"],),
            x, g, out, p0, p1, p2, p3, v.N * v.C, v.C, fc["NT"], e0, e1, e2,
            S=v.S, R=fc["R"], RP=fc["RP"], BLOCK=fc["BLOCK"], MODE=mode, HAS_W=has_w, HAS_B=has_b, F64=f64,
            ACC=acc_tl, num_warps=fc["nw"], **kw,
        )
    else:
        const_s = _const_s(v)
        launch(_bn_ew_ncs_kernel_cs if const_s else _bn_ew_ncs_kernel, grid,
            x, g, out, p0, p1, p2, p3, v.N * v.C, v.C, v.S, cfg["NSB"], cfg["NT"], e0, e1, e2,
            R=cfg["R"], BS=cfg["BS"], MODE=mode, WRAP_MOD=cfg["R"] > v.C,
            LOCAL32=cfg["R"] * v.S < 2**31 - cfg["BS"], HAS_W=has_w, HAS_B=has_b, F64=f64, ACC=acc_tl,
            **({} if const_s else {"S_ALIGN": _plane_align(v)}), num_warps=cfg["nw"], **kw,
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


def _eval_key(eps):
    return ("bn_forward_eval", eps, tuple(_TUNE.values()))


def _backward_key(train, mask):
    return ("bn_backward", bool(train), mask, tuple(_TUNE.values()))


# Replays without a launcher call behind them, for normkit.ops' fast routes: ``sig`` is ``_plan.signature`` of the
# same inputs; the outputs of the plan an earlier call recorded, or None (no such plan: nothing is recorded)

def bn_forward_train_replay(x, weight, bias, running_mean, running_var, momentum, eps, sig):
    return _plan.replay_only(_train_key(eps), (x, weight, bias, running_mean, running_var), sig,
                             _momentum_parts(momentum))


def bn_backward_train_replay(grad_out, x, weight, mean, invstd, mask, sig):
    return _plan.replay_only(_backward_key(True, mask), (grad_out, x, weight, mean, invstd), sig)


def bn_forward_eval_replay(x, weight, bias, running_mean, running_var, eps, sig):
    out = _plan.replay_only(_eval_key(eps), (x, weight, bias, running_mean, running_var), sig)
    return None if out is None else out[0]


def bn_eval_planned(eps, sig) -> bool:
    return _plan.recorded(_eval_key(eps), sig)


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
        cfg["M"], v.C, v.S, cfg["NSC"], cfg["NT"], n0, n1, e[0], e[1], e[2], m[0], m[1], m[2], *_shift_samples(v),
        ROWS=cfg["ROWS"], B0=cfg["B0"], B1=cfg["B1"], HAS_W=weight is not None, HAS_B=bias is not None,
        HAS_RS=has_rs, F64=acc_t == torch.float64, ACC=acc_tl, S_CONST=v.S if _const_s(v) else 0,
        C_ALIGN=_row_align(v.C) if cfg["ROWS"] else 1, num_warps=4,
    )
    return y, mean, invstd


def _statistics(v, weight, bias, running_mean, running_var, momentum, eps, pdl):
    """The split reduction and the combine: (coef [4, C], mean, invstd), running statistics updated."""
    acc_tl, acc_t = _acc(v.x)
    C = v.C
    dev = v.x.device
    samples = _shift_samples(v)
    part, P = _reduce(v, None, None, False, acc_tl, acc_t, pdl, samples)
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
        part, v.x, shift_stride, *samples, coef, mean, invstd,
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
        return _plan.planned(_eval_key(eps), (x, weight, bias, running_mean, running_var),
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
            C_ALIGN=_row_align(v.C) if cfg["ROWS"] else 1, num_warps=4,
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
