"""RMS norm, contract §7: ``rms_norm``, ``_fused_rms_norm`` and its backward as plain torch code.

Math in opmath (float32 for half inputs, float64 for float64): rstd = rsqrt(mean(x², dims) + eps),
y = (x·rstd)·w multiplied **in opmath**, then cast to the input dtype. ``eps=None`` means
``finfo(opmath).eps`` (float32's eps for fp16/bf16/fp32 inputs), not the input dtype's eps.
Output is contiguous, except that channels_last / channels_last_3d inputs keep their format.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from normkit import _checks
from normkit.reference._common import acc_dtype, opmath_dtype, param_dtype, suggest_memory_format, to_format

__all__ = ["rms_norm", "_fused_rms_norm", "_fused_rms_norm_backward", "default_rms_eps"]


def default_rms_eps(dtype: torch.dtype) -> float:
    """The eps ``rms_norm`` uses when given None: machine eps of the compute (opmath) dtype."""
    return torch.finfo(acc_dtype(dtype)).eps


def _out_format(input: Tensor) -> torch.memory_format:
    fmt = suggest_memory_format(input)
    return fmt if fmt in (torch.channels_last, torch.channels_last_3d) else torch.contiguous_format


def _norm_dims(input: Tensor, normalized_shape: Sequence[int]) -> Tuple[int, ...]:
    return tuple(range(input.dim() - len(normalized_shape), input.dim()))


def _fused_rms_norm(input: Tensor, normalized_shape: Sequence[int], weight: Optional[Tensor],
                    eps: Optional[float]) -> Tuple[Tensor, Tensor]:
    """``aten::_fused_rms_norm`` → (out, rstd); rstd shape ``shape[:axis] + [1]*k``, opmath dtype."""
    _checks.check_rms_norm(input, normalized_shape, weight)
    cdt = opmath_dtype(input)
    if eps is None:
        eps = default_rms_eps(input.dtype)
    x = input.to(cdt)
    rstd = torch.rsqrt(x.pow(2).mean(_norm_dims(input, normalized_shape), keepdim=True) + eps)
    y = x * rstd
    if weight is not None:
        y = y * weight.to(cdt)  # in opmath, before the cast (unlike HF's LlamaRMSNorm)
    return to_format(y.to(input.dtype), _out_format(input)), rstd.to(acc_dtype(input.dtype))


def rms_norm(input: Tensor, normalized_shape: Sequence[int], weight: Optional[Tensor] = None,
             eps: Optional[float] = None) -> Tensor:
    """``aten::rms_norm`` (what ``F.rms_norm`` calls): the output of ``_fused_rms_norm``."""
    return _fused_rms_norm(input, normalized_shape, weight, eps)[0]


def _fused_rms_norm_backward(grad_out: Tensor, input: Tensor, normalized_shape: Sequence[int], rstd: Tensor,
                             weight: Optional[Tensor], output_mask: List[bool]
                             ) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """``aten::_fused_rms_norm_backward`` → (grad_input, grad_weight); masked out → None.

    With x̂ = x·rstd and g' = g·w: dx = rstd·(g' − x̂·mean(g'·x̂)), dw = Σ_rows g·x̂ (weight's dtype).
    """
    _checks.check_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight)
    cdt = opmath_dtype(input)
    dims = _norm_dims(input, normalized_shape)
    row_dims = tuple(range(0, input.dim() - len(normalized_shape)))
    r = rstd.to(cdt).reshape(list(input.shape[: len(row_dims)]) + [1] * len(dims))
    g = grad_out.to(cdt)
    xhat = input.to(cdt) * r
    grad_input = grad_weight = None
    if output_mask[0]:
        gw = g if weight is None else g * weight.to(cdt)
        gi = r * (gw - xhat * (gw * xhat).mean(dims, keepdim=True))
        grad_input = to_format(gi.to(input.dtype), _out_format(input))
    if output_mask[1]:
        gx = g * xhat
        gx = gx.sum(row_dims) if row_dims else gx
        grad_weight = gx.reshape(list(normalized_shape)).to(param_dtype(weight, input))
    return grad_input, grad_weight
