"""`torch.library` custom ops in the `normkit` namespace, and the autograd functions over them.

Custom ops (what `torch.compile` sees; fake implementations for tracing):

* `normkit::batch_norm(x, weight?, bias?, running_mean(a!)?, running_var(b!)?, training, momentum, eps)
  -> (y, save_mean, save_invstd)`; eval returns empty `(0,)` saved stats.
* `normkit::batch_norm_backward(grad, x, weight?, stat1, stat2, training, eps, mask) -> 3 tensors`:
  `(stat1, stat2)` are `(save_mean, save_invstd)` in training and `(running_mean, running_var)` in eval.
* `normkit::layer_norm(x, normalized_shape, weight?, bias?, eps) -> (y, mean, rstd)` and `_backward`
* `normkit::rms_norm(x, normalized_shape, weight?, eps) -> (y, rstd)` and `_backward`
* `normkit::add_layer_norm(x, residual, ...) -> (y, x + residual, mean, rstd)`, `normkit::add_rms_norm`.
* `normkit::group_norm(x, num_groups, weight?, bias?, eps, fp32_stats) -> (y, mean, rstd)` and `_backward`

Backward ops return empty `(0,)` tensors for gradients masked out (custom ops cannot return None).

Autograd: one `torch.autograd.Function` per op (`batch_norm_autograd`, `layer_norm_autograd`, ...), used
by `normkit.functional`. `register_autograd` refuses ops that mutate an input (the running stats), and
Dynamo traces autograd Functions with `fullgraph=True`, so one mechanism serves every op. Inside a
`torch.compile` trace the Functions call the custom ops (opaque to Inductor, mutation functionalized);
in eager they call the same implementations directly, skipping the custom-op dispatch (tens of us of
Python per call). The layer/RMS custom ops also carry `register_autograd` for direct callers.

Double backward: when a backward runs with grad mode on (`create_graph=True`) it is computed with
differentiable plain torch: the statistics are recomputed from the saved input through
`normkit.reference` (so they depend on x), then `normkit.reference`'s aten-named backward is applied.
Autograd differentiates that graph, as ATen's `batchnorm_double_backward` / `layer_norm_double_backward`
do analytically.

No `from __future__ import annotations` here: `custom_op` infers schemas from the annotations at
decoration time on torch 2.4.
"""

import math
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from normkit import _checks
from normkit.ops import batch_norm as _bn
from normkit.ops import group_norm as _gn
from normkit.ops import layer_norm as _ln
from normkit.ops import _select
from normkit.ops._select import reference
from normkit.reference._common import acc_dtype, affine_grad_dtype

__all__ = ["batch_norm", "batch_norm_backward", "layer_norm", "layer_norm_backward", "rms_norm",
           "rms_norm_backward", "add_layer_norm", "add_rms_norm", "batch_norm_autograd", "layer_norm_autograd",
           "rms_norm_autograd", "add_layer_norm_autograd", "add_rms_norm_autograd", "group_norm",
           "group_norm_backward", "group_norm_autograd", "contiguous_autograd"]


def _compiling() -> bool:
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and hasattr(compiler, "is_compiling"):
        return compiler.is_compiling()
    return torch._dynamo.is_compiling()  # pragma: no cover - torch < 2.3


_PLAIN = _select.PLAIN_TENSORS
_dispatch_stack_len = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)


def _via_custom_op(x: Tensor) -> bool:
    """Whether to call the custom op (opaque to tracers) rather than the implementation directly: inside
    `torch.compile`, and whenever something traces or intercepts dispatch (fake / functional tensors,
    `make_fx`, `opcheck`, any `TorchDispatchMode`). Plain eager calls skip the custom-op dispatch."""
    return _compiling() or type(x) not in _PLAIN or _dispatch_stack_len() > 0


def _has_storage(t: Tensor) -> bool:
    """False for a tensor wrapping others, whose values no kernel can address: the gradients of
    ``torch.autograd.grad(..., is_grads_batched=True)`` (and of vectorized `jacobian` / `hessian`) are legacy-vmap
    batched tensors. Their backward runs the reference's plain torch ops, which that vmap batches."""
    try:
        t.untyped_storage()
    except NotImplementedError:
        return False
    return True


def _own(t: Tensor) -> Tensor:
    """``t`` (same memory, no copy) as a tensor autograd does not take for a view. The kernels' row-wise outputs are
    views of their (rows, width) buffers; a custom Function's output that is a view of a tensor made inside it may
    not be modified in place ("Output 0 of _LayerNormFn is a view and is being modified inplace"), where torch's
    output may (``nn.ReLU(inplace=True)`` after a LayerNorm). Only for the no-grad insides of the Functions and
    custom ops, where detaching cuts no graph."""
    return t.detach() if t._is_view() else t


def _or_empty(t: Optional[Tensor], like: Tensor) -> Tensor:
    return like.new_empty((0,)) if t is None else t


def _fmt(x: Tensor):
    return reference().suggest_memory_format(x)


def _bn_fmt(x: Tensor):
    return reference().dense_memory_format(x)


def _in_format(t: Tensor, fmt) -> Tensor:
    """The layout the fake implementation promises (a no-op for the kernels' and reference's outputs)."""
    return t if t.is_contiguous(memory_format=fmt) else t.contiguous(memory_format=fmt)


def _dense_like(p: Tensor) -> Tensor:
    """A fake dw / db: contiguous, as the real ones (and aten's) are; empty_like would keep a permuted
    multi-dim weight's strides, and inductor asserts the real strides against these."""
    return torch.empty(p.shape, dtype=p.dtype, device=p.device)


class _DependsOn(torch.autograd.Function):
    """``t`` as an output of ``deps``, with no gradient to them. ATen's backward ops return gradients that require
    grad whenever one of the op's inputs does, also where the value does not depend on it (weight's gradient in a
    training batch norm); a gradient penalty built on such a gradient runs backward through it, and the inputs
    get no gradient from it (None), as here."""

    @staticmethod
    def forward(ctx, t, *deps):
        return t.clone()

    @staticmethod
    def backward(ctx, g):
        return (None,) * len(ctx.needs_input_grad)


class _GradInFormat(torch.autograd.Function):
    """``t`` itself, with its gradient laid out in ``fmt``. Autograd through the reference's ops gives a gradient
    in the layout of the gradient flowing in, where ATen's double backward keeps the input's (channels_last)."""

    @staticmethod
    def forward(ctx, t, fmt):
        ctx.set_materialize_grads(False)  # no gradient stays None, not zeros (torch's is None)
        ctx.fmt = fmt
        return t.view_as(t)

    @staticmethod
    def backward(ctx, g):
        return None if g is None else _in_format(g, ctx.fmt), None


def _distinct(*tensors):
    """The tensors, each repeat of an earlier one replaced by a view of it (the same memory): Dynamo refuses an
    autograd Function given one tensor twice, so `torch.compile(fullgraph=True)` of `batch_norm(x, ..., w, w)` (a
    weight tied to the bias, one buffer for both running statistics) failed where torch's op compiles."""
    out = []
    for t in tensors:
        if t is not None and any(t is u for u in out):
            t = t.view_as(t)
        out.append(t)
    return out


def _double_backward_outputs(grads, *inputs):
    """The double-backward graph's gradients, each one requiring grad where one of the ATen backward op's inputs
    (``inputs``, None allowed) does."""
    deps = [t for t in inputs if t is not None and t.requires_grad]
    if not deps:
        return grads
    return tuple(g if g is None or g.requires_grad else _DependsOn.apply(g, *deps) for g in grads)


def _stat_shape(x: Tensor, normalized_shape: List[int]) -> List[int]:
    axis = x.dim() - len(normalized_shape)
    return list(x.shape[:axis]) + [1] * len(normalized_shape)


# ----------------------------------------------------------------------------------------------- batch norm
# implementations shared by the custom ops (compile) and the autograd Functions (eager)

def _bn_forward_impl(x, weight, bias, running_mean, running_var, training, momentum, eps):
    y, m, s = _bn._forward_core(x, weight, bias, running_mean, running_var, training, momentum, eps)
    acc = acc_dtype(x.dtype)
    return y, m.to(acc), s.to(acc)


def _bn_backward_impl(grad, x, weight, stat1, stat2, training, eps, mask):
    if training:
        gi, gw, gb = _bn._backward_core(grad, x, weight, None, None, stat1, stat2, True, eps, mask)
    else:
        gi, gw, gb = _bn._backward_core(grad, x, weight, stat1, stat2, None, None, False, eps, mask)
    # stat1 / stat2: the saved statistics (training) or the running ones (eval), as _backward_core got them
    pdt = affine_grad_dtype(x, weight, stat1, stat2)
    return (gi if mask[0] else None, gw.to(pdt) if mask[1] else None, gb.to(pdt) if mask[2] else None)


@torch.library.custom_op("normkit::batch_norm", mutates_args=("running_mean", "running_var"))
def batch_norm(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], running_mean: Optional[Tensor],
               running_var: Optional[Tensor], training: bool, momentum: float,
               eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    _checks.check_batch_norm(x, weight, bias, running_mean, running_var, training)
    y, m, s = _bn_forward_impl(x, weight, bias, running_mean, running_var, training, momentum, eps)
    return _in_format(y, _bn_fmt(x)), m, s


@batch_norm.register_fake
def _(x, weight, bias, running_mean, running_var, training, momentum, eps):
    acc = acc_dtype(x.dtype)
    c = x.shape[1] if training else 0
    return (torch.empty_like(x, memory_format=_bn_fmt(x)), x.new_empty((c,), dtype=acc),
            x.new_empty((c,), dtype=acc))


@torch.library.custom_op("normkit::batch_norm_backward", mutates_args=())
def batch_norm_backward(grad: Tensor, x: Tensor, weight: Optional[Tensor], stat1: Tensor, stat2: Tensor,
                        training: bool, eps: float, mask: List[bool]) -> Tuple[Tensor, Tensor, Tensor]:
    gi, gw, gb = _bn_backward_impl(grad, x, weight, stat1, stat2, training, eps, mask)
    if gi is not None:
        gi = _in_format(gi, _bn_fmt(x))
    return _or_empty(gi, x), _or_empty(gw, x), _or_empty(gb, x)


@batch_norm_backward.register_fake
def _(grad, x, weight, stat1, stat2, training, eps, mask):
    c = x.shape[1]
    pdt = affine_grad_dtype(x, weight, stat1, stat2)  # _bn_backward_impl's
    gi = torch.empty_like(x, memory_format=_bn_fmt(x)) if mask[0] else x.new_empty((0,))
    gw = x.new_empty((c,), dtype=pdt) if mask[1] else x.new_empty((0,))
    gb = x.new_empty((c,), dtype=pdt) if mask[2] else x.new_empty((0,))
    return gi, gw, gb


def _bn_double_backward_graph(grad, x, weight, s1, s2, training, eps, mask):
    ref = reference()
    if x.requires_grad:  # the gradient w.r.t. x laid out as ATen's: x's in training (channels_last kept), contiguous
        x = _GradInFormat.apply(x, _bn_fmt(x) if training else torch.contiguous_format)  # in eval (its formula's)
    if training:
        _, mean, invstd = ref.native_batch_norm(x, None, None, None, None, True, 0.0, eps)
        grads = ref.native_batch_norm_backward(grad, x, weight, None, None, mean, invstd, True, eps, mask)
    else:
        grads = ref.native_batch_norm_backward(grad, x, weight, s1, s2, None, None, False, eps, mask)
    return _double_backward_outputs(grads, grad, x, weight, s1, s2)


class _BatchNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps):
        if _via_custom_op(x):
            y, s1, s2 = batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)
        else:
            y, s1, s2 = _bn_forward_impl(x, weight, bias, running_mean, running_var, training, momentum, eps)
        # the statistics outputs get no gradient: without this autograd fills zeros for them (a
        # launch each, every backward)
        ctx.set_materialize_grads(False)
        ctx.training = training
        ctx.eps = eps
        if training:
            ctx.save_for_backward(x, weight, s1, s2)
        else:  # eval saves nothing: the backward reads the running stats (as ATen's autograd does)
            ctx.save_for_backward(x, weight, running_mean, running_var)
        ctx.mark_non_differentiable(s1, s2)
        return y, s1, s2

    @staticmethod
    def backward(ctx, grad, _g1, _g2):
        x, weight, s1, s2 = ctx.saved_tensors
        n = ctx.needs_input_grad
        mask = [bool(n[0]), bool(n[1]) and weight is not None, bool(n[2])]
        if grad is None or not any(mask):
            return None, None, None, None, None, None, None, None
        if torch.is_grad_enabled():
            gi, gw, gb = _bn_double_backward_graph(grad, x, weight, s1, s2, ctx.training, ctx.eps, mask)
        elif _via_custom_op(grad):
            gi, gw, gb = batch_norm_backward(grad, x, weight, s1, s2, ctx.training, ctx.eps, mask)
        elif not _has_storage(grad):
            gi, gw, gb = _bn_double_backward_graph(grad, x, weight, s1, s2, ctx.training, ctx.eps, mask)
        else:
            gi, gw, gb = _bn_backward_impl(grad, x, weight, s1, s2, ctx.training, ctx.eps, mask)
        return (gi if mask[0] else None, gw if mask[1] else None, gb if mask[2] else None,
                None, None, None, None, None)


def batch_norm_autograd(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                        running_mean: Optional[Tensor], running_var: Optional[Tensor], training: bool,
                        momentum: float, eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    """Batch norm with autograd and double backward (inputs already validated by the caller)."""
    x, weight, bias, running_mean, running_var = _distinct(x, weight, bias, running_mean, running_var)
    return _BatchNormFn.apply(x, weight, bias, running_mean, running_var, training, momentum, eps)


# ----------------------------------------------------------------------------------------------- layer norm

def _ln_forward_impl(x, normalized_shape, weight, bias, eps):
    y, mean, rstd = _ln._layer_norm_core(x, normalized_shape, weight, bias, eps)
    acc = acc_dtype(x.dtype)
    return _own(y.contiguous()), mean.to(acc), rstd.to(acc)


def _ln_backward_impl(grad, x, normalized_shape, mean, rstd, weight, bias, mask):
    gi, gw, gb = _ln._layer_norm_backward_core(grad, x, normalized_shape, mean, rstd, weight, bias, mask)
    return (gi.contiguous() if mask[0] else None,
            gw.to(weight.dtype) if mask[1] and weight is not None else None,
            gb.to(bias.dtype) if mask[2] and bias is not None else None)


@torch.library.custom_op("normkit::layer_norm", mutates_args=())
def layer_norm(x: Tensor, normalized_shape: List[int], weight: Optional[Tensor], bias: Optional[Tensor],
               eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    _checks.check_layer_norm(x, normalized_shape, weight, bias)
    return _ln_forward_impl(x, normalized_shape, weight, bias, eps)


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
    gi, gw, gb = _ln_backward_impl(grad, x, normalized_shape, mean, rstd, weight, bias, mask)
    return _or_empty(gi, x), _or_empty(gw, x), _or_empty(gb, x)


@layer_norm_backward.register_fake
def _(grad, x, normalized_shape, mean, rstd, weight, bias, mask):
    gi = torch.empty(x.shape, dtype=x.dtype, device=x.device) if mask[0] else x.new_empty((0,))
    gw = _dense_like(weight) if mask[1] and weight is not None else x.new_empty((0,))
    gb = _dense_like(bias) if mask[2] and bias is not None else x.new_empty((0,))
    return gi, gw, gb


def _ln_double_backward_graph(grad, x, ns, weight, bias, eps, mask):
    ref = reference()
    _, mean, rstd = ref.native_layer_norm(x, ns, None, None, eps)
    grads = ref.native_layer_norm_backward(grad, x, ns, mean, rstd, weight, bias, mask)
    return _double_backward_outputs(grads, grad, x, weight, bias)


def _ln_grads(grad, x, ns, mean, rstd, weight, bias, eps, mask):
    if torch.is_grad_enabled():
        return _ln_double_backward_graph(grad, x, ns, weight, bias, eps, mask)
    if _via_custom_op(grad):
        return layer_norm_backward(grad, x, ns, mean, rstd, weight, bias, mask)
    if not _has_storage(grad):
        return _ln_double_backward_graph(grad, x, ns, weight, bias, eps, mask)
    return _ln_backward_impl(grad, x, ns, mean, rstd, weight, bias, mask)


class _LayerNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, normalized_shape, weight, bias, eps):
        if _via_custom_op(x):
            y, mean, rstd = layer_norm(x, normalized_shape, weight, bias, eps)
        else:
            y, mean, rstd = _ln_forward_impl(x, normalized_shape, weight, bias, eps)
        ctx.set_materialize_grads(False)  # as in _BatchNormFn
        ctx.normalized_shape = list(normalized_shape)
        ctx.eps = eps
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        ctx.mark_non_differentiable(mean, rstd)
        return y, mean, rstd

    @staticmethod
    def backward(ctx, grad, _gm, _gr):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        n = ctx.needs_input_grad
        mask = [bool(n[0]), bool(n[2]) and weight is not None, bool(n[3]) and bias is not None]
        if grad is None or not any(mask):
            return None, None, None, None, None
        gi, gw, gb = _ln_grads(grad, x, ctx.normalized_shape, mean, rstd, weight, bias, ctx.eps, mask)
        return gi if mask[0] else None, None, gw if mask[1] else None, gb if mask[2] else None, None


def layer_norm_autograd(x: Tensor, normalized_shape: List[int], weight: Optional[Tensor],
                        bias: Optional[Tensor], eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    x, weight, bias = _distinct(x, weight, bias)
    return _LayerNormFn.apply(x, normalized_shape, weight, bias, eps)


def _ln_setup(ctx, inputs, output):
    x, normalized_shape, weight, bias, eps = inputs
    ctx.set_materialize_grads(False)  # as in _BatchNormFn
    ctx.normalized_shape = list(normalized_shape)
    ctx.eps = eps
    ctx.save_for_backward(x, weight, bias, output[1], output[2])


def _ln_op_backward(ctx, grad, _gm, _gr):
    return _LayerNormFn.backward(ctx, grad, _gm, _gr)


layer_norm.register_autograd(_ln_op_backward, setup_context=_ln_setup)


# ------------------------------------------------------------------------------------------------- rms norm

def _rms_forward_impl(x, normalized_shape, weight, eps):
    y, rstd = _ln._rms_norm_core(x, normalized_shape, weight, eps)
    return _own(y.contiguous()), rstd.to(acc_dtype(x.dtype))


def _rms_grad_format(grad: Tensor, x: Tensor):
    """grad_input's layout: channels_last(_3d) where x and the incoming gradient both are, else contiguous. A
    channels_last input takes aten's composite rms_norm, whose input gradient follows the incoming one's layout."""
    fmt = _ln.rms_memory_format(x)
    return fmt if grad.is_contiguous(memory_format=fmt) else torch.contiguous_format


def _rms_backward_impl(grad, x, normalized_shape, rstd, weight, mask):
    gi, gw = _ln._rms_norm_backward_core(grad, x, normalized_shape, rstd, weight, mask)
    return (_in_format(gi, _rms_grad_format(grad, x)) if mask[0] else None,
            gw.to(weight.dtype) if mask[1] and weight is not None else None)


@torch.library.custom_op("normkit::rms_norm", mutates_args=())
def rms_norm(x: Tensor, normalized_shape: List[int], weight: Optional[Tensor], eps: float) -> Tuple[Tensor, Tensor]:
    _checks.check_rms_norm(x, normalized_shape, weight)
    return _rms_forward_impl(x, normalized_shape, weight, eps)


@rms_norm.register_fake
def _(x, normalized_shape, weight, eps):
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            x.new_empty(_stat_shape(x, normalized_shape), dtype=acc_dtype(x.dtype)))


@torch.library.custom_op("normkit::rms_norm_backward", mutates_args=())
def rms_norm_backward(grad: Tensor, x: Tensor, normalized_shape: List[int], rstd: Tensor, weight: Optional[Tensor],
                      mask: List[bool]) -> Tuple[Tensor, Tensor]:
    gi, gw = _rms_backward_impl(grad, x, normalized_shape, rstd, weight, mask)
    return _or_empty(gi, x), _or_empty(gw, x)


@rms_norm_backward.register_fake
def _(grad, x, normalized_shape, rstd, weight, mask):
    gi = (torch.empty_like(x, memory_format=_rms_grad_format(grad, x)) if mask[0] else x.new_empty((0,)))
    gw = _dense_like(weight) if mask[1] and weight is not None else x.new_empty((0,))
    return gi, gw


def _rms_double_backward_graph(grad, x, ns, weight, eps, mask):
    ref = reference()
    _, rstd = ref._fused_rms_norm(x, ns, None, eps)
    grads = ref._fused_rms_norm_backward(grad, x, ns, rstd, weight, mask)
    return _double_backward_outputs(grads, grad, x, weight)  # as CUDA's _fused_rms_norm_backward


def _rms_grads(grad, x, ns, rstd, weight, eps, mask):
    if torch.is_grad_enabled():
        return _rms_double_backward_graph(grad, x, ns, weight, eps, mask)
    if _via_custom_op(grad):
        return rms_norm_backward(grad, x, ns, rstd, weight, mask)
    if not _has_storage(grad):
        return _rms_double_backward_graph(grad, x, ns, weight, eps, mask)
    return _rms_backward_impl(grad, x, ns, rstd, weight, mask)


class _RMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, normalized_shape, weight, eps):
        if _via_custom_op(x):
            y, rstd = rms_norm(x, normalized_shape, weight, eps)
        else:
            y, rstd = _rms_forward_impl(x, normalized_shape, weight, eps)
        ctx.set_materialize_grads(False)  # as in _BatchNormFn
        ctx.normalized_shape = list(normalized_shape)
        ctx.eps = eps
        ctx.save_for_backward(x, weight, rstd)
        ctx.mark_non_differentiable(rstd)
        return y, rstd

    @staticmethod
    def backward(ctx, grad, _gr):
        x, weight, rstd = ctx.saved_tensors
        n = ctx.needs_input_grad
        mask = [bool(n[0]), bool(n[2]) and weight is not None]
        if grad is None or not any(mask):
            return None, None, None, None
        gi, gw = _rms_grads(grad, x, ctx.normalized_shape, rstd, weight, ctx.eps, mask)
        return gi if mask[0] else None, None, gw if mask[1] else None, None


def rms_norm_autograd(x: Tensor, normalized_shape: List[int], weight: Optional[Tensor],
                      eps: float) -> Tuple[Tensor, Tensor]:
    x, weight = _distinct(x, weight)
    return _RMSNormFn.apply(x, normalized_shape, weight, eps)


def _rms_setup(ctx, inputs, output):
    x, normalized_shape, weight, eps = inputs
    ctx.set_materialize_grads(False)  # as in _BatchNormFn
    ctx.normalized_shape = list(normalized_shape)
    ctx.eps = eps
    ctx.save_for_backward(x, weight, output[1])


def _rms_op_backward(ctx, grad, _gr):
    return _RMSNormFn.backward(ctx, grad, _gr)


rms_norm.register_autograd(_rms_op_backward, setup_context=_rms_setup)


# -------------------------------------------------------------------------------- pre-norm residual fusion

def _add_ln_impl(x, residual, normalized_shape, weight, bias, eps):
    y, s, mean, rstd = _ln._add_layer_norm_core(x, residual, normalized_shape, weight, bias, eps)
    acc = acc_dtype(x.dtype)
    return _own(y.contiguous()), _own(s.contiguous()), mean.to(acc), rstd.to(acc)


@torch.library.custom_op("normkit::add_layer_norm", mutates_args=())
def add_layer_norm(x: Tensor, residual: Tensor, normalized_shape: List[int], weight: Optional[Tensor],
                   bias: Optional[Tensor], eps: float) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    _ln._check_residual(x, residual)
    _checks.check_layer_norm(x, normalized_shape, weight, bias)
    return _add_ln_impl(x, residual, normalized_shape, weight, bias, eps)


@add_layer_norm.register_fake
def _(x, residual, normalized_shape, weight, bias, eps):
    acc = acc_dtype(x.dtype)
    ss = _stat_shape(x, normalized_shape)
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty(x.shape, dtype=x.dtype, device=x.device),
            x.new_empty(ss, dtype=acc), x.new_empty(ss, dtype=acc))


def _sum_without_grad(ctx, s):
    """s = x + residual requires grad only where x or residual does, as torch's sum would (not for weight's)."""
    if not (ctx.needs_input_grad[0] or ctx.needs_input_grad[1]):
        ctx.mark_non_differentiable(s)


def _sum_grad(gsum, gs):
    if gsum is None:
        return gs
    return gsum if gs is None else gsum + gs


class _AddLayerNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, normalized_shape, weight, bias, eps):
        if _via_custom_op(x):
            y, s, mean, rstd = add_layer_norm(x, residual, normalized_shape, weight, bias, eps)
        else:
            y, s, mean, rstd = _add_ln_impl(x, residual, normalized_shape, weight, bias, eps)
        # an unused y gives gy None (not zeros): no layer-norm backward, and weight/bias get no gradient
        ctx.set_materialize_grads(False)
        ctx.normalized_shape = list(normalized_shape)
        ctx.eps = eps
        ctx.save_for_backward(s, weight, bias, mean, rstd)
        ctx.mark_non_differentiable(mean, rstd)
        _sum_without_grad(ctx, s)
        return y, s, mean, rstd

    @staticmethod
    def backward(ctx, gy, gs, _gm, _gr):
        n = ctx.needs_input_grad
        need_sum = bool(n[0] or n[1])
        gnorm = gw = gb = None
        if gy is not None:  # else the saved sum is not read: it may have changed in place since, as torch's x + r
            s, weight, bias, mean, rstd = ctx.saved_tensors
            mask = [need_sum, bool(n[3]) and weight is not None, bool(n[4]) and bias is not None]
            if any(mask):
                gnorm, gw, gb = _ln_grads(gy, s, ctx.normalized_shape, mean, rstd, weight, bias, ctx.eps, mask)
            gnorm, gw, gb = (g if m else None for g, m in zip((gnorm, gw, gb), mask))
        gsum = _sum_grad(gnorm, gs) if need_sum else None
        return gsum if n[0] else None, gsum if n[1] else None, None, gw, gb, None


def _add_ln_setup(ctx, inputs, output):
    x, residual, normalized_shape, weight, bias, eps = inputs
    ctx.set_materialize_grads(False)  # as in the autograd Function
    ctx.normalized_shape = list(normalized_shape)
    ctx.eps = eps
    ctx.save_for_backward(output[1], weight, bias, output[2], output[3])


add_layer_norm.register_autograd(lambda ctx, *grads: _AddLayerNormFn.backward(ctx, *grads),
                                 setup_context=_add_ln_setup)


def add_layer_norm_autograd(x: Tensor, residual: Tensor, normalized_shape: List[int], weight: Optional[Tensor],
                            bias: Optional[Tensor], eps: float):
    x, residual, weight, bias = _distinct(x, residual, weight, bias)
    return _AddLayerNormFn.apply(x, residual, normalized_shape, weight, bias, eps)


def _add_rms_impl(x, residual, normalized_shape, weight, eps):
    y, s, rstd = _ln._add_rms_norm_core(x, residual, normalized_shape, weight, eps)
    return _own(y.contiguous()), _own(s.contiguous()), rstd.to(acc_dtype(x.dtype))


@torch.library.custom_op("normkit::add_rms_norm", mutates_args=())
def add_rms_norm(x: Tensor, residual: Tensor, normalized_shape: List[int], weight: Optional[Tensor],
                 eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    _ln._check_residual(x, residual)
    _checks.check_rms_norm(x, normalized_shape, weight)
    return _add_rms_impl(x, residual, normalized_shape, weight, eps)


@add_rms_norm.register_fake
def _(x, residual, normalized_shape, weight, eps):
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty(x.shape, dtype=x.dtype, device=x.device),
            x.new_empty(_stat_shape(x, normalized_shape), dtype=acc_dtype(x.dtype)))


class _AddRMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, normalized_shape, weight, eps):
        if _via_custom_op(x):
            y, s, rstd = add_rms_norm(x, residual, normalized_shape, weight, eps)
        else:
            y, s, rstd = _add_rms_impl(x, residual, normalized_shape, weight, eps)
        ctx.set_materialize_grads(False)  # as in _AddLayerNormFn
        ctx.normalized_shape = list(normalized_shape)
        ctx.eps = eps
        ctx.save_for_backward(s, weight, rstd)
        ctx.mark_non_differentiable(rstd)
        _sum_without_grad(ctx, s)
        return y, s, rstd

    @staticmethod
    def backward(ctx, gy, gs, _gr):
        n = ctx.needs_input_grad
        need_sum = bool(n[0] or n[1])
        gnorm = gw = None
        if gy is not None:  # as in _AddLayerNormFn
            s, weight, rstd = ctx.saved_tensors
            mask = [need_sum, bool(n[3]) and weight is not None]
            if any(mask):
                gnorm, gw = _rms_grads(gy, s, ctx.normalized_shape, rstd, weight, ctx.eps, mask)
            gnorm, gw = (g if m else None for g, m in zip((gnorm, gw), mask))
        gsum = _sum_grad(gnorm, gs) if need_sum else None
        return gsum if n[0] else None, gsum if n[1] else None, None, gw, None


def _add_rms_setup(ctx, inputs, output):
    x, residual, normalized_shape, weight, eps = inputs
    ctx.set_materialize_grads(False)  # as in the autograd Function
    ctx.normalized_shape = list(normalized_shape)
    ctx.eps = eps
    ctx.save_for_backward(output[1], weight, output[2])


add_rms_norm.register_autograd(lambda ctx, *grads: _AddRMSNormFn.backward(ctx, *grads),
                               setup_context=_add_rms_setup)


def add_rms_norm_autograd(x: Tensor, residual: Tensor, normalized_shape: List[int], weight: Optional[Tensor],
                          eps: float):
    x, residual, weight = _distinct(x, residual, weight)
    return _AddRMSNormFn.apply(x, residual, normalized_shape, weight, eps)


# ------------------------------------------------------------------------- instance norm's contiguous input

class _ContiguousFn(torch.autograd.Function):
    """``x.contiguous()`` of a dense channels_last(_3d) x through normkit's tile transpose. The backward returns
    the gradient in x's layout (the tile transpose again): a leaf's AccumulateGrad would otherwise make that copy
    with torch's slower strided one, and a convolution before it takes either layout. (torch's `contiguous`
    passes the contiguous gradient on; the values are the same.) Differentiated (create_graph), the backward is
    torch's copy, which autograd records: the kernel's is not."""

    @staticmethod
    def forward(ctx, x, fmt):
        ctx.fmt = fmt
        return _gn.in_layout(x, torch.contiguous_format)

    @staticmethod
    def backward(ctx, g):
        if g is None:
            return None, None
        return (g.contiguous(memory_format=ctx.fmt) if torch.is_grad_enabled() else _gn.in_layout(g, ctx.fmt)), None


def contiguous_autograd(x: Tensor) -> Tensor:
    """``x.contiguous()`` with autograd, fast for dense channels_last(_3d) inputs on the kernels' devices (instance
    norm's input, which aten normalizes contiguous). Traced or compiled calls keep torch's own."""
    fmt = _bn_fmt(x)
    if (fmt == torch.contiguous_format or not x.is_contiguous(memory_format=fmt) or _via_custom_op(x)
            or _gn.tile_transpose_for(x) is None):
        return x.contiguous()
    return _ContiguousFn.apply(x, fmt)


# ----------------------------------------------------------------------------------------------- group norm

def _gn_dims(x: Tensor) -> Tuple[int, int, int]:
    """(N, C, HxW) as aten's group_norm passes them."""
    return x.shape[0], x.shape[1], math.prod(x.shape[2:])


def _gn_forward_impl(x, num_groups, weight, bias, eps, fp32_stats):
    n, c, hxw = _gn_dims(x)
    y, mean, rstd = _gn._group_norm_core(x, weight, bias, n, c, hxw, num_groups, eps, fp32_stats)
    return _in_format(y, _fmt(x)), mean, rstd


def _gn_backward_impl(grad, x, num_groups, mean, rstd, weight, mask):
    n, c, hxw = _gn_dims(x)
    gi, gw, gb = _gn._group_norm_backward_core(grad, x, mean, rstd, weight, n, c, hxw, num_groups, mask)
    return (_in_format(gi, _fmt(x)) if mask[0] else None, gw if mask[1] else None, gb if mask[2] else None)


@torch.library.custom_op("normkit::group_norm", mutates_args=())
def group_norm(x: Tensor, num_groups: int, weight: Optional[Tensor], bias: Optional[Tensor], eps: float,
               fp32_stats: bool) -> Tuple[Tensor, Tensor, Tensor]:
    n, c, hxw = _gn_dims(x)
    _checks.check_group_norm(x, weight, bias, n, c, hxw, num_groups)
    return _gn_forward_impl(x, num_groups, weight, bias, eps, fp32_stats)


@group_norm.register_fake
def _(x, num_groups, weight, bias, eps, fp32_stats):
    sdt = _gn.group_norm_stat_dtype(x, weight, bias, fp32_stats=fp32_stats)
    return (torch.empty_like(x, memory_format=_fmt(x)), x.new_empty((x.shape[0], num_groups), dtype=sdt),
            x.new_empty((x.shape[0], num_groups), dtype=sdt))


@torch.library.custom_op("normkit::group_norm_backward", mutates_args=())
def group_norm_backward(grad: Tensor, x: Tensor, num_groups: int, mean: Tensor, rstd: Tensor,
                        weight: Optional[Tensor], mask: List[bool]) -> Tuple[Tensor, Tensor, Tensor]:
    gi, gw, gb = _gn_backward_impl(grad, x, num_groups, mean, rstd, weight, mask)
    return _or_empty(gi, x), _or_empty(gw, x), _or_empty(gb, x)


@group_norm_backward.register_fake
def _(grad, x, num_groups, mean, rstd, weight, mask):
    c = x.shape[1]
    pdt = affine_grad_dtype(x, weight, mean, rstd)  # native_group_norm_backward's (normkit.ops.group_norm)
    gi = torch.empty_like(x, memory_format=_fmt(x)) if mask[0] else x.new_empty((0,))
    gw = x.new_empty((c,), dtype=pdt) if mask[1] else x.new_empty((0,))
    gb = x.new_empty((c,), dtype=pdt) if mask[2] else x.new_empty((0,))
    return gi, gw, gb


def _gn_double_backward_graph(grad, x, num_groups, stat_dtype, weight, eps, mask):
    """The backward as differentiable reference ops, statistics recomputed from x in the saved ones' dtype (fp32
    for a mixed call: unrounded, and the gradients' dtype follows them)."""
    ref = reference()
    n, c, hxw = _gn_dims(x)
    xs = x if stat_dtype == x.dtype else x.to(stat_dtype)
    _, m, r = ref.native_group_norm(xs, None, None, n, c, hxw, num_groups, eps)
    grads = ref.native_group_norm_backward(grad, x, m, r, weight, n, c, hxw, num_groups, mask)
    return _double_backward_outputs(grads, grad, x, weight)


def _gn_grads(grad, x, num_groups, mean, rstd, weight, eps, mask):
    if torch.is_grad_enabled():
        return _gn_double_backward_graph(grad, x, num_groups, mean.dtype, weight, eps, mask)
    if _via_custom_op(grad):
        return group_norm_backward(grad, x, num_groups, mean, rstd, weight, mask)
    if not _has_storage(grad):
        return _gn_double_backward_graph(grad, x, num_groups, mean.dtype, weight, eps, mask)
    return _gn_backward_impl(grad, x, num_groups, mean, rstd, weight, mask)


class _GroupNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, num_groups, weight, bias, eps, fp32_stats):
        if _via_custom_op(x):
            y, mean, rstd = group_norm(x, num_groups, weight, bias, eps, fp32_stats)
        else:
            y, mean, rstd = _gn_forward_impl(x, num_groups, weight, bias, eps, fp32_stats)
        ctx.set_materialize_grads(False)  # as in _BatchNormFn
        ctx.num_groups = num_groups
        ctx.eps = eps
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.mark_non_differentiable(mean, rstd)
        return y, mean, rstd

    @staticmethod
    def backward(ctx, grad, _gm, _gr):
        x, weight, mean, rstd = ctx.saved_tensors
        n = ctx.needs_input_grad
        mask = [bool(n[0]), bool(n[2]) and weight is not None, bool(n[3])]
        if grad is None or not any(mask):
            return None, None, None, None, None, None
        gi, gw, gb = _gn_grads(grad, x, ctx.num_groups, mean, rstd, weight, ctx.eps, mask)
        return gi if mask[0] else None, None, gw if mask[1] else None, gb if mask[2] else None, None, None


def group_norm_autograd(x: Tensor, num_groups: int, weight: Optional[Tensor], bias: Optional[Tensor],
                        eps: float, fp32_stats: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """Group norm with autograd and double backward (inputs already validated by the caller).
    ``fp32_stats``: mean / rstd in fp32 whatever the contract's dtype (instance norm's saved statistics)."""
    x, weight, bias = _distinct(x, weight, bias)
    return _GroupNormFn.apply(x, num_groups, weight, bias, eps, fp32_stats)
