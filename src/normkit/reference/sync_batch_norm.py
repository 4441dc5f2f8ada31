"""SyncBatchNorm building blocks, contract §3 (CUDA-only in torch; here any device, float64 too).

A SyncBatchNorm step is: per rank ``batch_norm_stats``; all-gather; ``batch_norm_gather_stats_with_counts``
(global stats + running update); ``batch_norm_elemt``. Backward: ``batch_norm_backward_reduce`` per rank;
all-reduce of (sum_dy, sum_dy_xmu); ``batch_norm_backward_elemt``.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from normkit import _checks
from normkit.reference._common import (
    acc_dtype,
    opmath_dtype,
    batch_dims,
    channel_view,
    invstd_from_var,
    param_dtype,
    dense_memory_format,
    to_format,
)
from normkit.reference.batch_norm import _batch_stats, _normalize, _update_running_stats

__all__ = [
    "batch_norm_stats",
    "batch_norm_gather_stats",
    "batch_norm_gather_stats_with_counts",
    "batch_norm_elemt",
    "batch_norm_backward_reduce",
    "batch_norm_backward_elemt",
]


def batch_norm_stats(input: Tensor, eps: float) -> Tuple[Tensor, Tensor]:
    """Local (mean, invstd), each (C,) in the acc dtype; eps only enters invstd (0 guard as aten)."""
    _checks.check_batch_norm_stats(input)
    mean, var = _batch_stats(input.to(opmath_dtype(input)))
    sdt = acc_dtype(input.dtype)
    return mean.to(sdt), invstd_from_var(var, eps).to(sdt)


def batch_norm_gather_stats_with_counts(input: Tensor, mean: Tensor, invstd: Tensor,
                                        running_mean: Optional[Tensor], running_var: Optional[Tensor],
                                        momentum: float, eps: float, counts: Tensor) -> Tuple[Tensor, Tensor]:
    """Merge per-rank (mean, invstd) rows (W, C) weighted by ``counts`` (W,) into global (C,) stats.

    Each rank's biased variance is 1/invstd² − eps; ranks merge with Chan's parallel formula
    (M2 = Σ count·(var + (mean_r − mean)²)). Updates the running stats with the unbiased M2/(n−1).
    Rows with count 0 must be dropped by the caller, as with aten (an empty rank's zero invstd makes
    its variance infinite, and 0·inf is NaN). Results are float32 for half/bf16 ``mean``, else mean's dtype.
    """
    _checks.check_batch_norm_gather_stats(input, mean, invstd, running_mean, running_var, counts)
    cdt = acc_dtype(mean.dtype)
    w = counts.to(cdt)[: mean.shape[0]].unsqueeze(1)
    means, invstds = mean.to(cdt), invstd.to(cdt)
    n = w.sum(0)
    # no rows (every rank empty): mean 0 and M2 0 as aten's merge loop leaves them, so the running stats decay
    # by (1 - momentum) (M2 / (n - 1) = -0) instead of turning NaN
    gmean = (w * means).sum(0) / n.clamp_min(1)
    var_r = 1 / (invstds * invstds) - eps
    m2 = (w * (var_r + (means - gmean).square())).sum(0)
    gvar = m2 / n
    ginvstd = invstd_from_var(gvar, eps)
    _update_running_stats(running_mean, running_var, gmean, m2 / (n - 1), momentum)  # n: a tensor, no sync
    return gmean, ginvstd


def batch_norm_gather_stats(input: Tensor, mean: Tensor, invstd: Tensor, running_mean: Optional[Tensor],
                            running_var: Optional[Tensor], momentum: float, eps: float,
                            count: int) -> Tuple[Tensor, Tensor]:
    """Legacy form of the above: every rank saw ``count`` values per channel."""
    counts = torch.full((mean.shape[0],), count, dtype=acc_dtype(mean.dtype), device=mean.device)
    return batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var, momentum,
                                               eps, counts)


def batch_norm_elemt(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], mean: Tensor,
                     invstd: Tensor, eps: float) -> Tensor:
    """(x − mean)·invstd·w + b with given stats; ``eps`` is ignored, as in aten."""
    _checks.check_batch_norm_elemt(input, weight, bias, mean, invstd)
    cdt = acc_dtype(input.dtype)
    return _normalize(input, weight, bias, mean.to(cdt), invstd.to(cdt))


def batch_norm_backward_reduce(grad_out: Tensor, input: Tensor, mean: Tensor, invstd: Tensor,
                               weight: Optional[Tensor], input_g: bool, weight_g: bool, bias_g: bool
                               ) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor],
                                          Optional[Tensor]]:
    """Local (sum_dy, sum_dy_xmu, grad_weight, grad_bias); sums only when ``input_g``, grads when asked.

    sum_dy = Σg, sum_dy_xmu = Σg·(x − mean) in the acc dtype; grad_weight = sum_dy_xmu·invstd and
    grad_bias = sum_dy in the weight's dtype (input's when weight is None).
    """
    _checks.check_batch_norm_backward_reduce(grad_out, input, mean, invstd, weight)
    cdt = acc_dtype(input.dtype)
    nd = input.dim()
    dims = batch_dims(nd)
    g = grad_out.to(cdt)
    sum_dy = g.sum(dims)
    sum_dy_xmu = (g * (input.to(cdt) - channel_view(mean.to(cdt), nd))).sum(dims)
    pdt = param_dtype(weight, input)
    return (
        sum_dy if input_g else None,
        sum_dy_xmu if input_g else None,
        (sum_dy_xmu * invstd.to(cdt)).to(pdt) if weight_g else None,
        sum_dy.to(pdt) if bias_g else None,
    )


def batch_norm_backward_elemt(grad_out: Tensor, input: Tensor, mean: Tensor, invstd: Tensor,
                              weight: Optional[Tensor], sum_dy: Tensor, sum_dy_xmu: Tensor,
                              count: Tensor) -> Tensor:
    """grad_input = (g − sum_dy/N − (x−mean)·invstd²·sum_dy_xmu/N)·invstd·w with N = Σcount (global)."""
    _checks.check_batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu)
    cdt = acc_dtype(input.dtype)
    nd = input.dim()
    n = count.to(cdt).sum()  # a tensor: no host sync
    mean, invstd = mean.to(cdt), invstd.to(cdt)
    scale = invstd if weight is None else invstd * weight.to(cdt)
    xmu = input.to(cdt) - channel_view(mean, nd)
    gi = (grad_out.to(cdt) - channel_view(sum_dy.to(cdt) / n, nd)
          - xmu * channel_view(invstd * invstd * sum_dy_xmu.to(cdt) / n, nd)) * channel_view(scale, nd)
    return to_format(gi.to(input.dtype), dense_memory_format(input))
