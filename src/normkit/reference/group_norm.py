"""Group norm, contract §5: ``native_group_norm`` and its backward as plain torch code.

Statistics over each (n, group) block of C/group·HxW elements; weight/bias per channel. ``mean``/``rstd``
are (N, group) in the input dtype, or float32 when mixed (a parameter of another dtype than the input),
on every device as in aten; they are computed in the acc dtype and the output uses them unrounded.
Output and grad_input keep ``input``'s suggested memory format; any input strides are accepted.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from normkit import _checks
from normkit.reference._common import (acc_dtype, affine_grad_dtype, channel_view, dims_are_nc, opmath_dtype,
                                      suggest_memory_format, to_format)

__all__ = ["native_group_norm", "native_group_norm_backward"]


def _stat_dtype(input: Tensor, *params: Optional[Tensor]) -> torch.dtype:
    mixed = any(p is not None and p.dtype != input.dtype for p in params)
    return acc_dtype(input.dtype) if mixed else input.dtype


def _grouped(t: Tensor, N: int, C: int, HxW: int, group: int) -> Tensor:
    # (N, C, *) → (N, group, C/group·HxW); a copy for channels-last or strided inputs, a view otherwise.
    # Explicit sizes, not -1: N or HxW may be 0.
    return t.reshape(N, group, (C // group) * HxW)


def native_group_norm(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], N: int, C: int,
                      HxW: int, group: int, eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    """``aten::native_group_norm`` → (out, mean (N, group), rstd (N, group))."""
    _checks.check_group_norm(input, weight, bias, N, C, HxW, group)
    if not dims_are_nc(input, N, C):
        out, mean, rstd = native_group_norm(input.reshape(N, C, HxW), weight, bias, N, C, HxW, group, eps)
        return out.reshape(input.shape), mean, rstd
    cdt = opmath_dtype(input)
    sdt = _stat_dtype(input, weight, bias)
    x = _grouped(input.to(cdt), N, C, HxW, group)
    if (C // group) * HxW == 0:
        # Empty groups: aten reports mean 0 and rstd NaN; the output is empty or all-empty groups.
        mean = x.sum(-1)
        rstd = torch.full_like(mean, float("nan"))
        out = to_format(input.clone(), suggest_memory_format(input))
        return out, mean.to(sdt), rstd.to(sdt)
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).square().mean(-1, keepdim=True)  # two-pass, biased
    rstd = torch.rsqrt(var + eps)
    y = ((x - mean) * rstd).reshape(input.shape)
    if weight is not None:
        y = y * channel_view(weight.to(cdt), input.dim())
    if bias is not None:
        y = y + channel_view(bias.to(cdt), input.dim())
    out = to_format(y.to(input.dtype), suggest_memory_format(input))
    return out, mean.reshape(N, group).to(sdt), rstd.reshape(N, group).to(sdt)


def native_group_norm_backward(grad_out: Tensor, input: Tensor, mean: Tensor, rstd: Tensor,
                               weight: Optional[Tensor], N: int, C: int, HxW: int, group: int,
                               output_mask: List[bool]
                               ) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """``aten::native_group_norm_backward`` → (grad_input, grad_weight, grad_bias); masked out → None.

    With x̂ = (x − mean)·rstd and g' = g·w, per group: dx = rstd·(g' − mean(g') − x̂·mean(g'·x̂));
    per channel: dw = Σ g·x̂, db = Σ g (weight's dtype; with weight None mean's, which is fp32 when a bias made the
    forward mixed, as batch norm's rule; aten's kernels raise for weight None with those outputs asked for).
    """
    _checks.check_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group)
    if not (dims_are_nc(input, N, C) and grad_out.shape == input.shape):
        grads = native_group_norm_backward(grad_out.reshape(N, C, HxW), input.reshape(N, C, HxW), mean, rstd,
                                           weight, N, C, HxW, group, output_mask)
        return (None if grads[0] is None else grads[0].reshape(input.shape),) + grads[1:]
    cdt = opmath_dtype(input)
    nd = input.dim()
    # Per-channel reductions over every dim but 1 (the batch and spatial dims).
    dims = [0] + list(range(2, nd))
    m = mean.to(cdt).reshape(N, group, 1)
    r = rstd.to(cdt).reshape(N, group, 1)
    g = grad_out.to(cdt)
    xhat = ((_grouped(input.to(cdt), N, C, HxW, group) - m) * r).reshape(input.shape)

    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        gw = g if weight is None else g * channel_view(weight.to(cdt), nd)
        gw_grp, xhat_grp = _grouped(gw, N, C, HxW, group), _grouped(xhat, N, C, HxW, group)
        if gw_grp.shape[-1] == 0:
            gi = gw
        else:
            gi = (r * (gw_grp - gw_grp.mean(-1, keepdim=True)
                       - xhat_grp * (gw_grp * xhat_grp).mean(-1, keepdim=True))).reshape(input.shape)
        grad_input = to_format(gi.to(input.dtype), suggest_memory_format(input))
    pshape = (C,) if weight is None else weight.shape  # aten's are empty_like(weight): any shape of C elements
    # weight None: mean's dtype, fp32 when a parameter (the bias) made the forward mixed (aten itself raises there)
    pdt = affine_grad_dtype(input, weight, mean, rstd)
    if output_mask[1]:
        grad_weight = (g * xhat).sum(dims).to(pdt).reshape(pshape)
    if output_mask[2]:
        grad_bias = g.sum(dims).to(pdt).reshape(pshape)
    return grad_input, grad_weight, grad_bias
