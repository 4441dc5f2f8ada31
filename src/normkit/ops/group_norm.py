"""Group norm, instance norm and the SyncBatchNorm primitives, with aten's names and signatures.

These validate with `normkit._checks` and run `normkit.reference` for now (no Triton kernels yet).
"""

from __future__ import annotations

from typing import List, Optional

from torch import Tensor

from normkit.ops._select import checks, reference

__all__ = [
    "native_group_norm",
    "native_group_norm_backward",
    "instance_norm",
    "batch_norm_stats",
    "batch_norm_gather_stats",
    "batch_norm_gather_stats_with_counts",
    "batch_norm_elemt",
    "batch_norm_backward_reduce",
    "batch_norm_backward_elemt",
]


def native_group_norm(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], N: int, C: int,
                      HxW: int, group: int, eps: float):
    checks().check_group_norm(input, weight, bias, N, C, HxW, group)
    return tuple(reference().native_group_norm(input, weight, bias, N, C, HxW, group, eps))


def native_group_norm_backward(grad_out: Tensor, input: Tensor, mean: Tensor, rstd: Tensor,
                               weight: Optional[Tensor], N: int, C: int, HxW: int, group: int,
                               output_mask: List[bool]):
    checks().check_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group)
    return tuple(reference().native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group,
                                                        [bool(m) for m in output_mask]))


def instance_norm(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                  running_mean: Optional[Tensor], running_var: Optional[Tensor], use_input_stats: bool,
                  momentum: float, eps: float, cudnn_enabled: bool = False) -> Tensor:
    checks().check_instance_norm(input, weight, bias, running_mean, running_var, use_input_stats)
    return reference().instance_norm(input, weight, bias, running_mean, running_var, use_input_stats, momentum,
                                     eps, cudnn_enabled)


def batch_norm_stats(input: Tensor, eps: float):
    checks().check_batch_norm_stats(input)
    return tuple(reference().batch_norm_stats(input, eps))


def batch_norm_gather_stats_with_counts(input: Tensor, mean: Tensor, invstd: Tensor,
                                        running_mean: Optional[Tensor], running_var: Optional[Tensor],
                                        momentum: float, eps: float, counts: Tensor):
    checks().check_batch_norm_gather_stats(input, mean, invstd, running_mean, running_var, counts)
    return tuple(reference().batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var,
                                                                 momentum, eps, counts))


def batch_norm_gather_stats(input: Tensor, mean: Tensor, invstd: Tensor, running_mean: Optional[Tensor],
                            running_var: Optional[Tensor], momentum: float, eps: float, count: int):
    ref = reference()
    if hasattr(ref, "batch_norm_gather_stats"):
        return tuple(ref.batch_norm_gather_stats(input, mean, invstd, running_mean, running_var, momentum, eps,
                                                 count))
    counts = mean.new_full((mean.shape[0],), float(count),
                           dtype=running_mean.dtype if running_mean is not None else input.dtype)
    return batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var, momentum, eps,
                                               counts)


def batch_norm_elemt(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], mean: Tensor,
                     invstd: Tensor, eps: float) -> Tensor:
    checks().check_batch_norm_elemt(input, weight, bias, mean, invstd)
    return reference().batch_norm_elemt(input, weight, bias, mean, invstd, eps)


def batch_norm_backward_reduce(grad_out: Tensor, input: Tensor, mean: Tensor, invstd: Tensor,
                               weight: Optional[Tensor], input_g: bool, weight_g: bool, bias_g: bool):
    checks().check_batch_norm_backward_reduce(grad_out, input, mean, invstd, weight)
    return tuple(reference().batch_norm_backward_reduce(grad_out, input, mean, invstd, weight, input_g, weight_g,
                                                        bias_g))


def batch_norm_backward_elemt(grad_out: Tensor, input: Tensor, mean: Tensor, invstd: Tensor,
                              weight: Optional[Tensor], sum_dy: Tensor, sum_dy_xmu: Tensor,
                              count: Tensor) -> Tensor:
    checks().check_batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu)
    return reference().batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, count)
