"""Layer norm and RMS norm with aten's names, signatures and return values (no autograd).

The kernels work on `(M, N)` row views: `normalized_shape` is flattened into N, every leading dim into M.
Statistics come back with the contract's shape `shape[:axis] + [1] * len(normalized_shape)`, float32 for
fp16/bf16/fp32 input and float64 for fp64. Outputs are contiguous.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple


import torch
from torch import Tensor

from normkit import _checks
from normkit.kernels import _plan
from normkit.ops._select import PLAIN_TENSORS, kernels_for, params_ok, reference
from normkit.reference._common import acc_dtype

__all__ = [
    "native_layer_norm",
    "native_layer_norm_backward",
    "_fused_rms_norm",
    "_fused_rms_norm_backward",
    "rms_norm",
    "rms_norm_eps",
    "rms_memory_format",
    "check_rms_norm_rank",
    "add_layer_norm",
    "add_layer_norm_backward",
    "add_rms_norm",
    "add_rms_norm_backward",
]


def _geometry(x: Tensor, normalized_shape: Sequence[int]):
    ns = [int(s) for s in normalized_shape]
    shape = x.shape
    lead = shape[:len(shape) - len(ns)]
    return ns, math.prod(lead), math.prod(ns), [*lead] + [1] * len(ns)


def rms_norm_eps(dtype: torch.dtype, eps: Optional[float]) -> float:
    """`rms_norm`'s eps=None rule: machine epsilon of the compute type (fp32, or fp64 for fp64 input)."""
    if eps is not None:
        return float(eps)
    return float(torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps)


def _ln_kernels(family: str, x2d: Tensor, *flat_params):
    """The kernel module when it handles these `(M, N)` rows and flattened (`_flat`) parameters, else None."""
    m, n = x2d.shape
    mod = kernels_for(family, x2d)
    if mod is None or m == 0 or n == 0 or not params_ok(x2d, *flat_params):
        return None
    if not mod.supports(x2d, *flat_params):
        return None
    return mod


def _flat(p: Optional[Tensor]) -> Optional[Tensor]:
    # a 1-D parameter is its own flat view (reshape would make another view object, ~1 us)
    return p if p is None or p.dim() == 1 else p.reshape(-1)


def _row_stat(t: Tensor, m: int, dtype: torch.dtype) -> Tensor:
    """A saved per-row statistic as the kernels read it: dense `(M,)` in the acc dtype (a caller's strided
    mean/rstd would otherwise be read as if contiguous)."""
    t = t.reshape(m)
    acc = acc_dtype(dtype)
    return (t if t.dtype == acc else t.to(acc)).contiguous()


# ---------------------------------------------------------------------------------------------- layer norm

def native_layer_norm(input: Tensor, normalized_shape: Sequence[int], weight: Optional[Tensor],
                      bias: Optional[Tensor], eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    _checks.check_layer_norm(input, normalized_shape, weight, bias)
    return _layer_norm_core(input, normalized_shape, weight, bias, eps)


def _layer_norm_core(input, normalized_shape, weight, bias, eps):
    ns, m, n, stat_shape = _geometry(input, normalized_shape)
    x2d = input.reshape(m, n)
    w, b = _flat(weight), _flat(bias)
    mod = _ln_kernels("layer_norm", x2d, w, b)
    if mod is None:
        return tuple(reference().native_layer_norm(input, ns, weight, bias, eps))
    y, mean, rstd = mod.ln_forward(x2d, w, b, eps)
    return y.view(*input.shape), mean.view(*stat_shape), rstd.view(*stat_shape)


def native_layer_norm_backward(grad_out: Tensor, input: Tensor, normalized_shape: Sequence[int], mean: Tensor,
                               rstd: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                               output_mask: List[bool]):
    _checks.check_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias)
    return _layer_norm_backward_core(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask)


def _layer_norm_backward_core(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    ns, m, n, _ = _geometry(input, normalized_shape)
    mask = [bool(v) for v in output_mask]
    x2d = input.reshape(m, n)
    w = _flat(weight)
    mod = _ln_kernels("layer_norm", x2d, w, _flat(bias))
    # a gradient asked of an absent weight / bias (a raw aten call; autograd never asks): the reference's sums
    if mod is None or grad_out.dtype != input.dtype or (mask[1] and weight is None) or (mask[2] and bias is None):
        return tuple(reference().native_layer_norm_backward(grad_out, input, ns, mean, rstd, weight, bias, mask))
    dx, dw, db = mod.ln_backward(grad_out.reshape(m, n), x2d, _row_stat(mean, m, input.dtype),
                                 _row_stat(rstd, m, input.dtype), w, mask,
                                 bias_dtype=None if bias is None else bias.dtype)
    return (None if dx is None else dx.view(*input.shape),
            None if dw is None else dw.view(*ns),
            None if db is None else db.view(*ns))


# ---------------------------------------------------------------------------------------------- rms norm

def _fused_rms_norm(input: Tensor, normalized_shape: Sequence[int], weight: Optional[Tensor],
                    eps: Optional[float]) -> Tuple[Tensor, Tensor]:
    _checks.check_rms_norm(input, normalized_shape, weight)
    return _rms_norm_core(input, normalized_shape, weight, eps)


def _rms_norm_core(input, normalized_shape, weight, eps):
    ns, m, n, stat_shape = _geometry(input, normalized_shape)
    eps = rms_norm_eps(input.dtype, eps)
    x2d = input.reshape(m, n)
    w = _flat(weight)
    mod = _ln_kernels("rms_norm", x2d, w) if not input.dtype.is_complex else None
    if mod is None:
        return tuple(reference()._fused_rms_norm(input, ns, weight, eps))
    y, rstd = mod.rms_forward(x2d, w, eps)
    return y.view(*input.shape), rstd.view(*stat_shape)


def _fused_rms_norm_backward(grad_out: Tensor, input: Tensor, normalized_shape: Sequence[int], rstd: Tensor,
                             weight: Optional[Tensor], output_mask: List[bool]):
    _checks.check_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight)
    return _rms_norm_backward_core(grad_out, input, normalized_shape, rstd, weight, output_mask)


def _rms_norm_backward_core(grad_out, input, normalized_shape, rstd, weight, output_mask):
    ns, m, n, _ = _geometry(input, normalized_shape)
    mask = [bool(v) for v in output_mask][:2]
    x2d = input.reshape(m, n)
    w = _flat(weight)
    mod = _ln_kernels("rms_norm", x2d, w)
    if mod is None or grad_out.dtype != input.dtype or (mask[1] and weight is None):
        return tuple(reference()._fused_rms_norm_backward(grad_out, input, ns, rstd, weight, mask))
    dx, dw = mod.rms_backward(grad_out.reshape(m, n), x2d, _row_stat(rstd, m, input.dtype), w, mask)
    return (None if dx is None else dx.view(*input.shape), None if dw is None else dw.view(*ns))


# --- fast routes (under enable(), as batch norm's: normkit.ops.batch_norm) -------------------------------------
# A call of an op below with 1-D or no weight / bias and dense statistics, that passed every check and ran a launch
# plan, is noted with its signature (``_plan.signature``: device, dtype, sizes, strides), normalized_shape and eps /
# mask; a later call with the same ones replays the plan on ``x.reshape(M, N)`` (grad_out's too), as the ops do: a
# view, or a copy where the rows are not one (the (B, S, H) activation of a batch_first attention is (S, B, H) in
# memory), skipping aten's predicate, the checks, the geometry and the kernel selection. An entry keeps what the
# replay needs: M, N, the output shapes, the kernels module, the resolved eps (RMS: eps None) and the views'
# signature. aten wires these in with batch norm's (one switch: ``NORMKIT_FAST_ROUTES``; same-bits CUDA test on the
# H200, session 26, benchmarks/NOTES-host-overhead.md).

_routes: dict = {}
MAX_ROUTES = 4096


def _store(key, entry) -> None:
    if len(_routes) < MAX_ROUTES:
        _routes[key] = entry


def _launched_rows(t: Tensor, m: int, n: int) -> Tensor:
    """A tensor of the signature the kernels got for ``t.reshape(m, n)`` (what the ops pass them), without the copy
    where reshape would make one: its view where there is one, else an empty dense (m, n) of t's dtype."""
    try:
        return t.view(m, n)
    except RuntimeError:
        return t.new_empty((m, n))


def _forward_route(op, x, normalized_shape, params, eps, rms):
    """Op's forward outputs through its route, or None (nothing noted, or the replay does not apply)."""
    if type(x) not in PLAIN_TENSORS:
        return None
    sig = _plan.signature((x,) + params)
    entry = _routes.get((op, sig, tuple(normalized_shape), eps)) if sig is not None else None
    if entry is None:
        return None
    m, n, shape, stat_shape, run_eps, mod, launched = entry
    out = _plan.replay_only(mod.forward_key(run_eps, rms), (x.reshape(m, n),) + params, launched)
    if out is None:
        return None
    y, _, mean, rstd = out
    if rms:
        return y.view(shape), rstd.view(stat_shape)
    return y.view(shape), mean.view(stat_shape), rstd.view(stat_shape)


def _note_forward(op, x, normalized_shape, params, eps, rms) -> None:
    """After op's forward returned: note its route where its plan ran on x's rows as the ops pass them
    (``x.reshape(M, N)``: a view of x, or a copy) and on these very parameters."""
    if not x.is_cuda or any(p is not None and p.dim() != 1 for p in params):
        return
    mod = kernels_for("rms_norm" if rms else "layer_norm", x)
    ns, m, n, stat_shape = _geometry(x, normalized_shape)
    if mod is None or m == 0 or n == 0:
        return
    run_eps = rms_norm_eps(x.dtype, eps) if rms else eps
    sig = _plan.signature((x,) + params)
    launched = _plan.signature((_launched_rows(x, m, n),) + params) if sig is not None else None
    if launched is not None and _plan.recorded(mod.forward_key(run_eps, rms), launched):
        _store((op, sig, tuple(ns), eps), (m, n, tuple(x.shape), tuple(stat_shape), run_eps, mod, launched))


def _backward_route(op, grad_out, x, normalized_shape, stats, params, mask, bias_dtype, rms):
    """Op's backward gradients through its route, or None. ``stats``: (mean, rstd) or (rstd,)."""
    if type(x) not in PLAIN_TENSORS:
        return None
    sig = _plan.signature((grad_out, x) + stats + params)
    entry = _routes.get((op, sig, tuple(normalized_shape), mask)) if sig is not None else None
    if entry is None:
        return None
    m, n, shape, ns, mod, launched = entry
    inputs = (grad_out.reshape(m, n), x.reshape(m, n)) + tuple(t.view(m) for t in stats) + params[:1]
    out = _plan.replay_only(mod.backward_key(x.dtype, params[0], mask, bias_dtype, rms), inputs, launched)
    if out is None:
        return None
    dx, dw, db = out
    grads = (None if dx is None else dx.view(shape), None if dw is None else dw.view(ns))
    return grads if rms else grads + (None if db is None else db.view(ns),)


def _note_backward(op, grad_out, x, normalized_shape, stats, params, mask, bias_dtype, rms) -> None:
    """As _note_forward: grad_out in x's dtype, the statistics dense in its accumulation dtype (the kernels read
    them as they are)."""
    acc = acc_dtype(x.dtype)
    if not (x.is_cuda and grad_out.dtype == x.dtype) or any(
            t.dtype != acc or not t.is_contiguous() for t in stats) or any(
            p is not None and p.dim() != 1 for p in params):
        return
    # a gradient asked of an absent weight / bias goes to the reference, whose plan key would be the kernels' call
    # without that gradient
    if any(want and p is None for want, p in zip(mask[1:], params)):
        return
    mod = kernels_for("rms_norm" if rms else "layer_norm", x)
    ns, m, n, _ = _geometry(x, normalized_shape)
    if mod is None or m == 0 or n == 0:
        return
    sig = _plan.signature((grad_out, x) + stats + params)
    launched = _plan.signature((_launched_rows(grad_out, m, n), _launched_rows(x, m, n))
                               + tuple(t.view(m) for t in stats) + params[:1]) if sig is not None else None
    if launched is not None and _plan.recorded(
            mod.backward_key(x.dtype, params[0], mask, bias_dtype, rms), launched):
        _store((op, sig, tuple(ns), mask), (m, n, tuple(x.shape), tuple(ns), mod, launched))


def _bias_dtype(bias):
    return None if bias is None else bias.dtype


ROUTES = {
    "native_layer_norm": (
        lambda x, ns, w, b, eps: _forward_route("native_layer_norm", x, ns, (w, b), eps, False),
        lambda x, ns, w, b, eps: _note_forward("native_layer_norm", x, ns, (w, b), eps, False)),
    "native_layer_norm_backward": (
        lambda g, x, ns, mean, rstd, w, b, mask: _backward_route(
            "native_layer_norm_backward", g, x, ns, (mean, rstd), (w, b), tuple(bool(v) for v in mask),
            _bias_dtype(b), False),
        lambda g, x, ns, mean, rstd, w, b, mask: _note_backward(
            "native_layer_norm_backward", g, x, ns, (mean, rstd), (w, b), tuple(bool(v) for v in mask),
            _bias_dtype(b), False)),
    "_fused_rms_norm": (
        lambda x, ns, w, eps: _forward_route("_fused_rms_norm", x, ns, (w,), eps, True),
        lambda x, ns, w, eps: _note_forward("_fused_rms_norm", x, ns, (w,), eps, True)),
    "_fused_rms_norm_backward": (
        lambda g, x, ns, rstd, w, mask: _backward_route(
            "_fused_rms_norm_backward", g, x, ns, (rstd,), (w,), tuple(bool(v) for v in mask[:2]), None, True),
        lambda g, x, ns, rstd, w, mask: _note_backward(
            "_fused_rms_norm_backward", g, x, ns, (rstd,), (w,), tuple(bool(v) for v in mask[:2]), None, True)),
}


def rms_memory_format(input: Tensor) -> torch.memory_format:
    """The layout of aten `rms_norm`'s output and grad_input: ``input.suggest_memory_format()``, i.e.
    channels_last / channels_last_3d inputs keep it, everything else (an ambiguous (1, C, 1, W) input with
    channels_last strides too, unlike batch norm) is contiguous."""
    if input.dim() not in (4, 5) or input.is_contiguous():
        return torch.contiguous_format
    from normkit.reference import suggest_memory_format

    return suggest_memory_format(input)


def keep_channels_last(y: Tensor, input: Tensor) -> Tensor:
    """aten's `rms_norm` keeps channels_last / channels_last_3d inputs in that layout (one copy here)."""
    fmt = rms_memory_format(input)
    return y if fmt == torch.contiguous_format else y.contiguous(memory_format=fmt)


def check_rms_norm_rank(input: Tensor, normalized_shape: Sequence[int], weight: Optional[Tensor]) -> None:
    """aten `rms_norm` (what `F.rms_norm` and `nn.RMSNorm` call) raises a ValueError for an input with fewer
    dims than `normalized_shape`, after the normalized_shape / weight checks and before the shape check."""
    ns = [int(s) for s in normalized_shape]
    if ns and input.dim() < len(ns) and (weight is None or list(weight.shape) == ns):
        raise ValueError(f"Input tensor must have at least {len(ns)} dimensions, but got {input.dim()}")


def rms_norm(input: Tensor, normalized_shape: Sequence[int], weight: Optional[Tensor] = None,
             eps: Optional[float] = None) -> Tensor:
    """aten::rms_norm (forward only here; `normkit.rms_norm` has autograd)."""
    check_rms_norm_rank(input, normalized_shape, weight)
    return keep_channels_last(_fused_rms_norm(input, normalized_shape, weight, eps)[0], input)


# ------------------------------------------------------------------------------ pre-norm residual fusion

def _check_residual(x: Tensor, residual: Tensor) -> None:
    if residual.shape != x.shape:
        raise RuntimeError(
            f"Expected residual to have the same shape as input, but got residual of shape "
            f"{list(residual.shape)} and input of shape {list(x.shape)}")
    if residual.dtype != x.dtype:
        raise RuntimeError(f"expected residual to have dtype {x.dtype}, but got {residual.dtype}")


def add_layer_norm(x: Tensor, residual: Tensor, normalized_shape: Sequence[int], weight: Optional[Tensor],
                   bias: Optional[Tensor], eps: float):
    """`s = x + residual`, `y = layer_norm(s)`: returns `(y, s, mean, rstd)` (one fused kernel on GPU)."""
    _check_residual(x, residual)
    _checks.check_layer_norm(x, normalized_shape, weight, bias)
    return _add_layer_norm_core(x, residual, normalized_shape, weight, bias, eps)


def _add_layer_norm_core(x, residual, normalized_shape, weight, bias, eps):
    ns, m, n, stat_shape = _geometry(x, normalized_shape)
    x2d = x.reshape(m, n)
    w, b = _flat(weight), _flat(bias)
    mod = _ln_kernels("layer_norm", x2d, w, b)
    if mod is None or not hasattr(mod, "add_ln_forward"):
        s = x + residual
        y, mean, rstd = _layer_norm_core(s, ns, weight, bias, eps)
        return y, s, mean, rstd
    y, s, mean, rstd = mod.add_ln_forward(x2d, residual.reshape(m, n), w, b, eps)
    return y.view(*x.shape), s.view(*x.shape), mean.view(*stat_shape), rstd.view(*stat_shape)


def add_rms_norm(x: Tensor, residual: Tensor, normalized_shape: Sequence[int], weight: Optional[Tensor],
                 eps: Optional[float]):
    """`s = x + residual`, `y = rms_norm(s)`: returns `(y, s, rstd)`."""
    _check_residual(x, residual)
    check_rms_norm_rank(x, normalized_shape, weight)
    _checks.check_rms_norm(x, normalized_shape, weight)
    return _add_rms_norm_core(x, residual, normalized_shape, weight, eps)


def _add_rms_norm_core(x, residual, normalized_shape, weight, eps):
    ns, m, n, stat_shape = _geometry(x, normalized_shape)
    eps = rms_norm_eps(x.dtype, eps)
    x2d = x.reshape(m, n)
    w = _flat(weight)
    mod = _ln_kernels("rms_norm", x2d, w)
    if mod is None or not hasattr(mod, "add_rms_forward"):
        s = x + residual
        y, rstd = _rms_norm_core(s, ns, weight, eps)
        return y, s, rstd
    y, s, rstd = mod.add_rms_forward(x2d, residual.reshape(m, n), w, eps)
    return y.view(*x.shape), s.view(*x.shape), rstd.view(*stat_shape)


def add_layer_norm_backward(grad_y: Tensor, grad_s: Optional[Tensor], s: Tensor, normalized_shape, mean, rstd,
                            weight, bias, output_mask: List[bool]):
    """Gradients of `add_layer_norm`: `(d(x + residual), dw, db)`; x and residual get the same gradient."""
    mask = [bool(output_mask[0]), bool(output_mask[1]), bool(output_mask[2])]
    ds, dw, db = native_layer_norm_backward(grad_y, s, normalized_shape, mean, rstd, weight, bias, mask)
    if ds is not None and grad_s is not None:
        ds = ds + grad_s
    return ds, dw, db


def add_rms_norm_backward(grad_y: Tensor, grad_s: Optional[Tensor], s: Tensor, normalized_shape, rstd, weight,
                          output_mask: List[bool]):
    mask = [bool(output_mask[0]), bool(output_mask[1])]
    ds, dw = _fused_rms_norm_backward(grad_y, s, normalized_shape, rstd, weight, mask)
    if ds is not None and grad_s is not None:
        ds = ds + grad_s
    return ds, dw
