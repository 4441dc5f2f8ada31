"""Batch norm, contract §2: aten's forward/backward ops as plain torch code.

Conventions (docs/ARCHITECTURE.md): saved stats are (mean, invstd) of shape (C,) in training and empty
(0,) tensors in eval; statistics and arithmetic use float32 for fp16/bf16/fp32 inputs and float64 for
float64 inputs (torch's CPU kernels accumulate fp32 inputs in double for the statistics; the difference is
within fp32 tolerances); outputs keep ``input``'s dtype and memory format (``dense_memory_format``). Parameters of any
floating dtype are accepted (mixed precision on every device). Every function is differentiable plain
torch except the documented in-place running-stat updates, which run under ``no_grad``.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from normkit import _checks
from normkit.reference._common import (
    acc_dtype,
    opmath_dtype,
    batch_dims,
    channel_view,
    empty_stat,
    invstd_from_var,
    affine_grad_dtype,
    dense_memory_format,
    to_format,
    write_running_stat,
)

__all__ = [
    "native_batch_norm",
    "_native_batch_norm_legit",
    "_native_batch_norm_legit_no_stats",
    "_native_batch_norm_legit_no_training",
    "_batch_norm_with_update",
    "_batch_norm_no_update",
    "native_batch_norm_backward",
    "batch_norm_backward",
    "batch_norm_update_stats",
    "cudnn_batch_norm",
    "cudnn_batch_norm_backward",
]


def _batch_stats(x: Tensor) -> Tuple[Tensor, Tensor]:
    """Per-channel mean and biased variance, two-pass (never E[x²] − E[x]², contract §12.2)."""
    dims = batch_dims(x.dim())
    mean = x.mean(dims)
    var = (x - channel_view(mean, x.dim())).square().mean(dims)
    return mean, var


def _unbiased(var: Tensor, n: int) -> Tensor:
    """var·n/(n−1); n == 1 gives 0/0, the NaN aten produces (F.batch_norm refuses such batches first)."""
    return var * (n / (n - 1)) if n > 1 else var * float("nan")


def _update_running_stats(running_mean: Optional[Tensor], running_var: Optional[Tensor], mean: Tensor,
                          unbiased_var: Tensor, momentum: float) -> None:
    """rm ← (1−m)·rm + m·mean, rv ← (1−m)·rv + m·unbiased_var, in place, in the running stats' dtype.

    ``momentum`` is used verbatim (negative or > 1 allowed). Not differentiable (running stats never
    are), hence no_grad.
    """
    with torch.no_grad():
        if running_mean is not None:
            rm = running_mean.to(torch.promote_types(running_mean.dtype, mean.dtype))
            write_running_stat(running_mean, (1 - momentum) * rm + momentum * mean)
        if running_var is not None:
            rv = running_var.to(torch.promote_types(running_var.dtype, unbiased_var.dtype))
            write_running_stat(running_var, (1 - momentum) * rv + momentum * unbiased_var)


def _normalize(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], mean: Tensor,
               invstd: Tensor) -> Tensor:
    """y = (x − mean)·invstd·w + b in the compute dtype, returned in input's dtype and memory format."""
    cdt = mean.dtype
    nd = input.dim()
    y = (input.to(cdt) - channel_view(mean, nd)) * channel_view(invstd, nd)
    if weight is not None:
        y = y * channel_view(weight.to(cdt), nd)
    if bias is not None:
        y = y + channel_view(bias.to(cdt), nd)
    return to_format(y.to(input.dtype), dense_memory_format(input))


def _running_invstd(input: Tensor, running_var: Tensor, eps: float, cdt: torch.dtype) -> Tensor:
    """Eval's rsqrt(running_var + eps), the sum rounded in the accumulation dtype as aten's kernels round it: a
    running_var of -eps then gives aten's infinite invstd (NaN outputs), not a finite one from a float64 sum."""
    return torch.rsqrt((running_var.to(acc_dtype(input.dtype)) + eps).to(cdt))


def _forward(input, weight, bias, running_mean, running_var, training, momentum, eps):
    cdt, sdt = opmath_dtype(input), acc_dtype(input.dtype)
    if training:
        mean, var = _batch_stats(input.to(cdt))
        invstd = invstd_from_var(var, eps)
        _update_running_stats(running_mean, running_var, mean,
                              _unbiased(var, input.numel() // input.shape[1]), momentum)
        return _normalize(input, weight, bias, mean, invstd), mean.to(sdt), invstd.to(sdt)
    # Eval: normalize with the running stats; plain 1/sqrt (aten has no zero guard here).
    mean = running_mean.to(cdt)
    invstd = _running_invstd(input, running_var, eps, cdt)
    out = _normalize(input, weight, bias, mean, invstd)
    return out, empty_stat(input, sdt), empty_stat(input, sdt)


def native_batch_norm(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                      running_mean: Optional[Tensor], running_var: Optional[Tensor], training: bool,
                      momentum: float, eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    """``aten::native_batch_norm`` → (out, save_mean, save_invstd)."""
    _checks.check_batch_norm(input, weight, bias, running_mean, running_var, training)
    return _forward(input, weight, bias, running_mean, running_var, training, momentum, eps)


def _native_batch_norm_legit(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                             running_mean: Tensor, running_var: Tensor, training: bool, momentum: float,
                             eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    """``aten::_native_batch_norm_legit`` (with running stats)."""
    return native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)


def _native_batch_norm_legit_no_stats(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                                      training: bool, momentum: float,
                                      eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    """``aten::_native_batch_norm_legit.no_stats``; training=False raises (aten segfaults, §2.5)."""
    return native_batch_norm(input, weight, bias, None, None, training, momentum, eps)


def _native_batch_norm_legit_no_training(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                                         running_mean: Tensor, running_var: Tensor, momentum: float,
                                         eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    """``aten::_native_batch_norm_legit_no_training``: eval with running stats."""
    return native_batch_norm(input, weight, bias, running_mean, running_var, False, momentum, eps)


def _reserve(input: Tensor) -> Tensor:
    # cuDNN's reserve space; empty everywhere normkit runs (it never calls cuDNN).
    return input.new_empty((0,), dtype=torch.uint8)


def _batch_norm_with_update(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                            running_mean: Tensor, running_var: Tensor, momentum: float,
                            eps: float) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """``aten::_batch_norm_with_update`` → (out, save_mean, save_invstd, reserve), training."""
    out, mean, invstd = native_batch_norm(input, weight, bias, running_mean, running_var, True, momentum,
                                          eps)
    return out, mean, invstd, _reserve(input)


def _batch_norm_no_update(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                          running_mean: Optional[Tensor], running_var: Optional[Tensor], momentum: float,
                          eps: float) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """``aten::_batch_norm_no_update`` → eval; running stats None raises (aten segfaults, §2.5)."""
    out, mean, invstd = native_batch_norm(input, weight, bias, running_mean, running_var, False, momentum,
                                          eps)
    return out, mean, invstd, _reserve(input)


def _backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
              output_mask):
    cdt = opmath_dtype(input)
    nd = input.dim()
    dims = batch_dims(nd)
    if train:
        mean, invstd = save_mean.to(cdt), save_invstd.to(cdt)
    else:
        # Eval always uses the running stats, whatever the saved stats hold (empty or filled).
        mean, invstd = running_mean.to(cdt), _running_invstd(input, running_var, eps, cdt)
    g = grad_out.to(cdt)
    xmu = input.to(cdt) - channel_view(mean, nd)
    sum_g = g.sum(dims)
    sum_gx = (g * xmu).sum(dims)

    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        scale = invstd if weight is None else invstd * weight.to(cdt)
        if train:
            n = input.numel() // input.shape[1] if input.shape[1] else 0
            # Every element moves the batch mean and variance: subtract their contributions.
            gi = (g - channel_view(sum_g / n, nd)
                  - xmu * channel_view(invstd * invstd * sum_gx / n, nd)) * channel_view(scale, nd)
        else:
            gi = g * channel_view(scale, nd)
        grad_input = to_format(gi.to(input.dtype), dense_memory_format(input))
    # weight None: the dtype of the statistics passed (fp32 in a mixed call), as aten's (contract §1.1)
    pdt = affine_grad_dtype(input, weight, running_mean, running_var, save_mean, save_invstd)
    if output_mask[1]:
        grad_weight = (sum_gx * invstd).to(pdt)
    if output_mask[2]:
        grad_bias = sum_g.to(pdt)
    return grad_input, grad_weight, grad_bias


def native_batch_norm_backward(grad_out: Tensor, input: Tensor, weight: Optional[Tensor],
                               running_mean: Optional[Tensor], running_var: Optional[Tensor],
                               save_mean: Optional[Tensor], save_invstd: Optional[Tensor], train: bool,
                               eps: float, output_mask: List[bool]
                               ) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """``aten::native_batch_norm_backward`` → (grad_input, grad_weight, grad_bias); masked out → None.

    Training uses only the saved (mean, invstd); eval only the running stats. grad_weight/grad_bias have
    the weight's dtype; with weight None that of the first statistic passed (running_mean, running_var,
    save_mean, save_invstd), the input's when there is none; grad_input keeps input's memory format.
    Differentiable in grad_out, input, weight and the saved stats: passing saved stats that are
    themselves differentiable functions of ``input`` gives the exact double backward.
    """
    _checks.check_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
                                      save_invstd, train)
    return _backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train,
                     eps, output_mask)


def batch_norm_backward(grad_out: Tensor, input: Tensor, weight: Tensor, running_mean: Optional[Tensor],
                        running_var: Optional[Tensor], save_mean: Optional[Tensor],
                        save_var: Optional[Tensor], update: bool, eps: float, output_mask: List[bool],
                        reserve: Tensor) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """``aten::batch_norm_backward``: like native, but weight is required; ``save_var`` holds invstd."""
    _checks.check_weight_required(weight)
    return native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
                                      save_var, update, eps, output_mask)


def batch_norm_update_stats(input: Tensor, running_mean: Optional[Tensor], running_var: Optional[Tensor],
                            momentum: float) -> Tuple[Tensor, Tensor]:
    """``aten::batch_norm_update_stats`` → (mean, biased var), updating the running stats given."""
    _checks.check_batch_norm_update_stats(input, running_mean, running_var)
    mean, var = _batch_stats(input.to(opmath_dtype(input)))
    _update_running_stats(running_mean, running_var, mean, _unbiased(var, input.numel() // input.shape[1]),
                          momentum)
    sdt = acc_dtype(input.dtype)
    return mean.to(sdt), var.to(sdt)


def cudnn_batch_norm(input: Tensor, weight: Tensor, bias: Optional[Tensor], running_mean: Optional[Tensor],
                     running_var: Optional[Tensor], training: bool, exponential_average_factor: float,
                     epsilon: float) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """``aten::cudnn_batch_norm`` → (out, save_mean, save_invstd, reserve) (contract §2.8, §13).

    Same results as native_batch_norm; saved stats follow normkit's dtype rule rather than cuDNN's
    (weight dtype), and the reserve space is empty.
    """
    _checks.check_weight_required(weight, 2, "weight")
    out, mean, invstd = native_batch_norm(input, weight, bias, running_mean, running_var, training,
                                          exponential_average_factor, epsilon)
    return out, mean, invstd, _reserve(input)


def cudnn_batch_norm_backward(input: Tensor, grad_output: Tensor, weight: Tensor,
                              running_mean: Optional[Tensor], running_var: Optional[Tensor],
                              save_mean: Optional[Tensor], save_var: Optional[Tensor], epsilon: float,
                              reserveSpace: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """``aten::cudnn_batch_norm_backward`` → all three grads; ``save_var`` is the saved invstd (§13).

    cuDNN only runs it after a training forward; given empty saved stats (an eval forward) normkit
    falls back to the eval formula with the running stats instead of failing.
    """
    _checks.check_weight_required(weight, 3, "weight")
    train = save_mean is not None and save_mean.numel() > 0
    return native_batch_norm_backward(grad_output, input, weight, running_mean, running_var, save_mean,
                                      save_var, train, epsilon, [True, True, True])
