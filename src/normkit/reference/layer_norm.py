"""Layer norm, contract §4: ``native_layer_norm`` and its backward as plain torch code.

Rows are the leading ``input.dim() − len(normalized_shape)`` dims; weight/bias are elementwise over
``normalized_shape``. ``mean``/``rstd`` have shape ``shape[:axis] + [1]*k`` in the acc dtype (float32
for half inputs, CUDA's convention, on every device). Output and grad_input are always contiguous.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple


import torch
from torch import Tensor

from normkit import _checks
from normkit.reference._common import acc_dtype, opmath_dtype, param_dtype

__all__ = ["native_layer_norm", "native_layer_norm_backward"]


def _norm_dims(input: Tensor, normalized_shape: Sequence[int]) -> Tuple[int, ...]:
    axis = input.dim() - len(normalized_shape)
    return tuple(range(axis, input.dim()))


def _sum_rows(t: Tensor, row_dims: Tuple[int, ...]) -> Tensor:
    # sum(dim=()) would reduce every dim: with no row dims there is nothing to sum, and a copy (grad_bias would
    # otherwise be grad_out itself: outputs are new tensors)
    return t.sum(row_dims) if row_dims else t.clone()


def native_layer_norm(input: Tensor, normalized_shape: Sequence[int], weight: Optional[Tensor],
                      bias: Optional[Tensor], eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    """``aten::native_layer_norm`` → (out, mean, rstd)."""
    _checks.check_layer_norm(input, normalized_shape, weight, bias)
    cdt, sdt = opmath_dtype(input), acc_dtype(input.dtype)
    dims = _norm_dims(input, normalized_shape)
    x = input.to(cdt)
    if math.prod(normalized_shape) == 0:
        # Empty rows: aten reports mean 0 and rstd NaN (a mean over nothing would be NaN too).
        mean = x.sum(dims, keepdim=True)
        rstd = torch.full_like(mean, float("nan"))
        return input.contiguous().clone(), mean.to(sdt), rstd.to(sdt)
    mean = x.mean(dims, keepdim=True)
    var = (x - mean).square().mean(dims, keepdim=True)  # two-pass, biased
    rstd = torch.rsqrt(var + eps)
    y = (x - mean) * rstd
    if weight is not None:
        y = y * weight.to(cdt)
    if bias is not None:
        y = y + bias.to(cdt)
    return y.to(input.dtype).contiguous(), mean.to(sdt), rstd.to(sdt)


def native_layer_norm_backward(grad_out: Tensor, input: Tensor, normalized_shape: Sequence[int],
                               mean: Tensor, rstd: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                               output_mask: List[bool]
                               ) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """``aten::native_layer_norm_backward`` → (grad_input, grad_weight, grad_bias); masked out → None.

    With g' = g·w and x̂ = (x − mean)·rstd over each row of N elements:
    dx = rstd·(g' − mean(g') − x̂·mean(g'·x̂)), dw = Σ_rows g·x̂, db = Σ_rows g.
    dw/db take the weight's/bias's dtype (the input's when absent: aten errors there instead).
    """
    _checks.check_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias)
    cdt = opmath_dtype(input)
    dims = _norm_dims(input, normalized_shape)
    row_dims = tuple(range(0, input.dim() - len(normalized_shape)))
    stat_shape = list(input.shape[: len(row_dims)]) + [1] * len(dims)
    g = grad_out.to(cdt)
    xhat = (input.to(cdt) - mean.to(cdt).reshape(stat_shape)) * rstd.to(cdt).reshape(stat_shape)

    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        gw = g if weight is None else g * weight.to(cdt)
        if math.prod(normalized_shape) == 0:
            gi = gw
        else:
            gi = rstd.to(cdt).reshape(stat_shape) * (
                gw - gw.mean(dims, keepdim=True) - xhat * (gw * xhat).mean(dims, keepdim=True))
        grad_input = gi.to(input.dtype).contiguous()
    if output_mask[1]:
        grad_weight = _sum_rows(g * xhat, row_dims).reshape(list(normalized_shape)).to(param_dtype(weight, input))
    if output_mask[2]:
        grad_bias = _sum_rows(g, row_dims).reshape(list(normalized_shape)).to(param_dtype(bias, input))
    return grad_input, grad_weight, grad_bias
