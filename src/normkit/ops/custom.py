"""`torch.library` custom ops in the `normkit` namespace: the autograd and `torch.compile` path.

Forward ops return every statistic their backward needs; backward ops return empty `(0,)` tensors for
gradients masked out (custom ops cannot return None); the autograd glue turns those into None.

* `normkit::batch_norm(x, weight?, bias?, running_mean(a!)?, running_var(b!)?, training, momentum, eps)
  -> (y, save_mean, save_invstd)` (eval: empty saved stats). `register_autograd` refuses mutating ops,
  so its autograd is an `autograd.Function` (`batch_norm_autograd`), which Dynamo traces fine.
* `normkit::batch_norm_backward(grad, x, weight?, stat1, stat2, training, eps, mask) -> 3 tensors`:
  `(stat1, stat2)` are `(save_mean, save_invstd)` in training and `(running_mean, running_var)` in eval.
* `normkit::layer_norm(x, normalized_shape, weight?, bias?, eps) -> (y, mean, rstd)` (+ `_backward`)
* `normkit::rms_norm(x, normalized_shape, weight?, eps) -> (y, rstd)` (+ `_backward`)
* `normkit::add_layer_norm(x, residual, ...) -> (y, x + residual, mean, rstd)`, `normkit::add_rms_norm`.

Double backward: when the backward runs with grad mode on (``create_graph=True``), it is computed with
differentiable plain-torch code instead of the backward op: the statistics are recomputed from the
saved input through `normkit.reference` (so they depend on x), then `normkit.reference`'s aten-named
backward is applied. Autograd then differentiates that graph, as ATen's `batchnorm_double_backward` /
`layer_norm_double_backward` do analytically.

This module must not use `from __future__ import annotations`: `custom_op` infers schemas from the
annotations at decoration time on torch 2.4.
"""

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from normkit.ops import batch_norm as _bn
from normkit.ops import layer_norm as _ln
from normkit.ops._select import acc_dtype, reference

__all__ = ["batch_norm", "batch_norm_autograd", "batch_norm_backward", "layer_norm", "layer_norm_backward", "rms_norm",
           "rms_norm_backward", "add_layer_norm", "add_rms_norm"]


def _none_if_empty(t: Tensor, wanted: bool) -> Optional[Tensor]:
    return t if wanted else None


def _or_empty(t: Optional[Tensor], like: Tensor) -> Tensor:
    return like.new_empty((0,)) if t is None else t


def _fmt(x: Tensor):
    return reference().suggest_memory_format(x)


def _in_format(t: Tensor, fmt) -> Tensor:
    """The layout the fake implementation promises (a no-op for the kernels' and reference's outputs)."""
    return t if t.is_contiguous(memory_format=fmt) else t.contiguous(memory_format=fmt)


def _prod(shape) -> int:
    p = 1
    for s in shape:
        p *= s
    return p


# ----------------------------------------------------------------------------------------------- batch norm

@torch.library.custom_op("normkit::batch_norm", mutates_args=("running_mean", "running_var"))
def batch_norm(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], running_mean: Optional[Tensor],
               running_var: Optional[Tensor], training: bool, momentum: float,
               eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    y, m, s = _bn.native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)
    acc = acc_dtype(x.dtype)
    return _in_format(y, _fmt(x)), m.to(acc), s.to(acc)


@batch_norm.register_fake
def _(x, weight, bias, running_mean, running_var, training, momentum, eps):
    acc = acc_dtype(x.dtype)
    c = x.shape[1] if training else 0
    return (torch.empty_like(x, memory_format=_fmt(x)), x.new_empty((c,), dtype=acc),
            x.new_empty((c,), dtype=acc))


@torch.library.custom_op("normkit::batch_norm_backward", mutates_args=())
def batch_norm_backward(grad: Tensor, x: Tensor, weight: Optional[Tensor], stat1: Tensor, stat2: Tensor,
                        training: bool, eps: float, mask: List[bool]) -> Tuple[Tensor, Tensor, Tensor]:
    if training:
        gi, gw, gb = _bn.native_batch_norm_backward(grad, x, weight, None, None, stat1, stat2, True, eps, mask)
    else:
        gi, gw, gb = _bn.native_batch_norm_backward(grad, x, weight, stat1, stat2, None, None, False, eps, mask)
    gi = _in_format(gi, _fmt(x)) if mask[0] else None
    pdt = weight.dtype if weight is not None else x.dtype
    return (_or_empty(gi, x), _or_empty(gw.to(pdt) if mask[1] else None, x),
            _or_empty(gb.to(pdt) if mask[2] else None, x))


@batch_norm_backward.register_fake
def _(grad, x, weight, stat1, stat2, training, eps, mask):
    c = x.shape[1]
    pdt = weight.dtype if weight is not None else x.dtype
    gi = torch.empty_like(x, memory_format=_fmt(x)) if mask[0] else x.new_empty((0,))
    gw = x.new_empty((c,), dtype=pdt) if mask[1] else x.new_empty((0,))
    gb = x.new_empty((c,), dtype=pdt) if mask[2] else x.new_empty((0,))
    return gi, gw, gb


def _bn_double_backward_graph(grad, x, weight, s1, s2, training, eps, mask):
    ref = reference()
    if training:
        _, mean, invstd = ref.native_batch_norm(x, None, None, None, None, True, 0.0, eps)
        return ref.native_batch_norm_backward(grad, x, weight, None, None, mean, invstd, True, eps, mask)
    return ref.native_batch_norm_backward(grad, x, weight, s1, s2, None, None, False, eps, mask)


class _BatchNormFn(torch.autograd.Function):
    """Autograd for `normkit::batch_norm`. `register_autograd` refuses ops that mutate their inputs (the
    running statistics), so the mutating op is wrapped in an `autograd.Function`, which Dynamo traces
    (fullgraph) and AOTAutograd functionalizes like any mutating custom op."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps):
        y, s1, s2 = batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)
        ctx.training = training
        ctx.eps = eps
        if training:
            ctx.save_for_backward(x, weight, s1, s2)
        else:  # eval saved stats are empty: the backward reads the running stats (as ATen's autograd does)
            ctx.save_for_backward(x, weight, running_mean, running_var)
        ctx.mark_non_differentiable(s1, s2)
        return y, s1, s2

    @staticmethod
    def backward(ctx, grad, _g1, _g2):
        x, weight, s1, s2 = ctx.saved_tensors
        mask = [bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1]) and weight is not None,
                bool(ctx.needs_input_grad[2])]
        if grad is None or not any(mask):
            return None, None, None, None, None, None, None, None
        if torch.is_grad_enabled():
            gi, gw, gb = _bn_double_backward_graph(grad, x, weight, s1, s2, ctx.training, ctx.eps, mask)
        else:
            gi, gw, gb = batch_norm_backward(grad, x, weight, s1, s2, ctx.training, ctx.eps, mask)
        return (gi if mask[0] else None, gw if mask[1] else None, gb if mask[2] else None,
                None, None, None, None, None)


def batch_norm_autograd(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                        running_mean: Optional[Tensor], running_var: Optional[Tensor], training: bool,
                        momentum: float, eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    """`normkit::batch_norm` with autograd (and double backward)."""
    return _BatchNormFn.apply(x, weight, bias, running_mean, running_var, training, momentum, eps)


# ----------------------------------------------------------------------------------------------- layer norm

def _stat_shape(x: Tensor, normalized_shape: List[int]) -> List[int]:
    axis = x.dim() - len(normalized_shape)
    return list(x.shape[:axis]) + [1] * len(normalized_shape)


@torch.library.custom_op("normkit::layer_norm", mutates_args=())
def layer_norm(x: Tensor, normalized_shape: List[int], weight: Optional[Tensor], bias: Optional[Tensor],
               eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    y, mean, rstd = _ln.native_layer_norm(x, normalized_shape, weight, bias, eps)
    acc = acc_dtype(x.dtype)
    return y.contiguous(), mean.to(acc), rstd.to(acc)


@layer_norm.register_fake
def _(x, normalized_shape, weight, bias, eps):
    acc = acc_dtype(x.dtype)
    ss = _stat_shape(x, normalized_shape)
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device), x.new_empty(ss, dtype=acc),
            x.new_empty(ss, dtype=acc))


@torch.library.custom_op("normkit::layer_norm_backward", mutates_args=())
def layer_norm_backward(grad: Tensor, x: Tensor, normalized_shape: List[int], mean: Tensor, rstd: Tensor,
                        weight: Optional[Tensor], bias: Optional[Tensor],
                        mask: List[bool]) -> Tuple[Tensor, Tensor, Tensor]:
    gi, gw, gb = _ln.native_layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias, mask)
    return (_or_empty(gi.contiguous() if mask[0] else None, x),
            _or_empty(gw.to(weight.dtype) if mask[1] and weight is not None else None, x),
            _or_empty(gb.to(bias.dtype) if mask[2] and bias is not None else None, x))


@layer_norm_backward.register_fake
def _(grad, x, normalized_shape, mean, rstd, weight, bias, mask):
    e = x.new_empty((0,))
    gi = torch.empty(x.shape, dtype=x.dtype, device=x.device) if mask[0] else e
    gw = torch.empty_like(weight) if mask[1] and weight is not None else x.new_empty((0,))
    gb = torch.empty_like(bias) if mask[2] and bias is not None else x.new_empty((0,))
    return gi, gw, gb


def _ln_setup(ctx, inputs, output):
    x, normalized_shape, weight, bias, eps = inputs
    _, mean, rstd = output
    ctx.normalized_shape = list(normalized_shape)
    ctx.eps = eps
    ctx.save_for_backward(x, weight, bias, mean, rstd)


def _ln_double_backward_graph(grad, x, ns, weight, bias, eps, mask):
    ref = reference()
    _, mean, rstd = ref.native_layer_norm(x, ns, None, None, eps)
    return ref.native_layer_norm_backward(grad, x, ns, mean, rstd, weight, bias, mask)


def _ln_mask(ctx, weight, bias, x_index=0):
    n = ctx.needs_input_grad
    return [bool(n[x_index]), bool(n[x_index + 2]) and weight is not None, bool(n[x_index + 3]) and bias is not None]


def _ln_backward(ctx, grad, _gm, _gr):
    x, weight, bias, mean, rstd = ctx.saved_tensors
    mask = _ln_mask(ctx, weight, bias)
    if grad is None or not any(mask):
        return None, None, None, None, None
    if torch.is_grad_enabled():
        gi, gw, gb = _ln_double_backward_graph(grad, x, ctx.normalized_shape, weight, bias, ctx.eps, mask)
    else:
        gi, gw, gb = layer_norm_backward(grad, x, ctx.normalized_shape, mean, rstd, weight, bias, mask)
    return gi if mask[0] else None, None, gw if mask[1] else None, gb if mask[2] else None, None


layer_norm.register_autograd(_ln_backward, setup_context=_ln_setup)


# ------------------------------------------------------------------------------------------------- rms norm

@torch.library.custom_op("normkit::rms_norm", mutates_args=())
def rms_norm(x: Tensor, normalized_shape: List[int], weight: Optional[Tensor], eps: float) -> Tuple[Tensor, Tensor]:
    y, rstd = _ln._fused_rms_norm(x, normalized_shape, weight, eps)
    return y.contiguous(), rstd.to(acc_dtype(x.dtype))


@rms_norm.register_fake
def _(x, normalized_shape, weight, eps):
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            x.new_empty(_stat_shape(x, normalized_shape), dtype=acc_dtype(x.dtype)))


@torch.library.custom_op("normkit::rms_norm_backward", mutates_args=())
def rms_norm_backward(grad: Tensor, x: Tensor, normalized_shape: List[int], rstd: Tensor, weight: Optional[Tensor],
                      mask: List[bool]) -> Tuple[Tensor, Tensor]:
    gi, gw = _ln._fused_rms_norm_backward(grad, x, normalized_shape, rstd, weight, mask)
    return (_or_empty(gi.contiguous() if mask[0] else None, x),
            _or_empty(gw.to(weight.dtype) if mask[1] and weight is not None else None, x))


@rms_norm_backward.register_fake
def _(grad, x, normalized_shape, rstd, weight, mask):
    gi = torch.empty(x.shape, dtype=x.dtype, device=x.device) if mask[0] else x.new_empty((0,))
    gw = torch.empty_like(weight) if mask[1] and weight is not None else x.new_empty((0,))
    return gi, gw


def _rms_setup(ctx, inputs, output):
    x, normalized_shape, weight, eps = inputs
    ctx.normalized_shape = list(normalized_shape)
    ctx.eps = eps
    ctx.save_for_backward(x, weight, output[1])


def _rms_double_backward_graph(grad, x, ns, weight, eps, mask):
    ref = reference()
    _, rstd = ref._fused_rms_norm(x, ns, None, eps)
    return ref._fused_rms_norm_backward(grad, x, ns, rstd, weight, mask)


def _rms_backward(ctx, grad, _gr):
    x, weight, rstd = ctx.saved_tensors
    n = ctx.needs_input_grad
    mask = [bool(n[0]), bool(n[2]) and weight is not None]
    if grad is None or not any(mask):
        return None, None, None, None
    if torch.is_grad_enabled():
        gi, gw = _rms_double_backward_graph(grad, x, ctx.normalized_shape, weight, ctx.eps, mask)
    else:
        gi, gw = rms_norm_backward(grad, x, ctx.normalized_shape, rstd, weight, mask)
    return gi if mask[0] else None, None, gw if mask[1] else None, None


rms_norm.register_autograd(_rms_backward, setup_context=_rms_setup)


# -------------------------------------------------------------------------------- pre-norm residual fusion

@torch.library.custom_op("normkit::add_layer_norm", mutates_args=())
def add_layer_norm(x: Tensor, residual: Tensor, normalized_shape: List[int], weight: Optional[Tensor],
                   bias: Optional[Tensor], eps: float) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    y, s, mean, rstd = _ln.add_layer_norm(x, residual, normalized_shape, weight, bias, eps)
    acc = acc_dtype(x.dtype)
    return y.contiguous(), s.contiguous(), mean.to(acc), rstd.to(acc)


@add_layer_norm.register_fake
def _(x, residual, normalized_shape, weight, bias, eps):
    acc = acc_dtype(x.dtype)
    ss = _stat_shape(x, normalized_shape)
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty(x.shape, dtype=x.dtype, device=x.device),
            x.new_empty(ss, dtype=acc), x.new_empty(ss, dtype=acc))


def _add_ln_setup(ctx, inputs, output):
    x, residual, normalized_shape, weight, bias, eps = inputs
    _, s, mean, rstd = output
    ctx.normalized_shape = list(normalized_shape)
    ctx.eps = eps
    ctx.save_for_backward(s, weight, bias, mean, rstd)


def _add_ln_backward(ctx, gy, gs, _gm, _gr):
    s, weight, bias, mean, rstd = ctx.saved_tensors
    n = ctx.needs_input_grad
    need_sum = bool(n[0] or n[1])
    mask = [need_sum, bool(n[3]) and weight is not None, bool(n[4]) and bias is not None]
    gsum, gw, gb = None, None, None
    if gy is not None and any(mask):
        if torch.is_grad_enabled():
            gsum, gw, gb = _ln_double_backward_graph(gy, s, ctx.normalized_shape, weight, bias, ctx.eps, mask)
        else:
            gsum, gw, gb = layer_norm_backward(gy, s, ctx.normalized_shape, mean, rstd, weight, bias, mask)
    if need_sum:
        gsum = gs if not mask[0] or gy is None else (gsum if gs is None else gsum + gs)
    return (gsum if n[0] else None, gsum if n[1] else None, None, gw if mask[1] else None,
            gb if mask[2] else None, None)


add_layer_norm.register_autograd(_add_ln_backward, setup_context=_add_ln_setup)


@torch.library.custom_op("normkit::add_rms_norm", mutates_args=())
def add_rms_norm(x: Tensor, residual: Tensor, normalized_shape: List[int], weight: Optional[Tensor],
                 eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    y, s, rstd = _ln.add_rms_norm(x, residual, normalized_shape, weight, eps)
    return y.contiguous(), s.contiguous(), rstd.to(acc_dtype(x.dtype))


@add_rms_norm.register_fake
def _(x, residual, normalized_shape, weight, eps):
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty(x.shape, dtype=x.dtype, device=x.device),
            x.new_empty(_stat_shape(x, normalized_shape), dtype=acc_dtype(x.dtype)))


def _add_rms_setup(ctx, inputs, output):
    x, residual, normalized_shape, weight, eps = inputs
    ctx.normalized_shape = list(normalized_shape)
    ctx.eps = eps
    ctx.save_for_backward(output[1], weight, output[2])


def _add_rms_backward(ctx, gy, gs, _gr):
    s, weight, rstd = ctx.saved_tensors
    n = ctx.needs_input_grad
    need_sum = bool(n[0] or n[1])
    mask = [need_sum, bool(n[3]) and weight is not None]
    gsum, gw = None, None
    if gy is not None and any(mask):
        if torch.is_grad_enabled():
            gsum, gw = _rms_double_backward_graph(gy, s, ctx.normalized_shape, weight, ctx.eps, mask)
        else:
            gsum, gw = rms_norm_backward(gy, s, ctx.normalized_shape, rstd, weight, mask)
    if need_sum:
        gsum = gs if not mask[0] or gy is None else (gsum if gs is None else gsum + gs)
    return gsum if n[0] else None, gsum if n[1] else None, None, gw if mask[1] else None, None


add_rms_norm.register_autograd(_add_rms_backward, setup_context=_add_rms_setup)
