"""SyncBatchNorm over ``torch.distributed``: batch statistics merged across the ranks of a process group.

One training step of a rank, forward: local (mean, invstd, count) with ``batch_norm_stats``; an all-gather of
those rows; ``batch_norm_gather_stats_with_counts`` (the global statistics, Chan's merge, and the running
statistics' update); ``batch_norm_elemt``. Backward: local (sum_dy, sum_dy_xmu) and the local dw / db with
``batch_norm_backward_reduce``; an all-reduce of the two sums; ``batch_norm_backward_elemt``. dw / db stay
local, as with torch: data parallelism (DDP) all-reduces parameter gradients.

The primitives are ``normkit.ops``': batch norm's Triton kernels composed per primitive where they take the
input (CUDA; the CPU under ``TRITON_INTERPRET=1``), else the contract's torch-op forms (any device and dtype,
fp64 too); unlike torch's SyncBatchNorm this also runs on the CPU over gloo. Ranks whose batch
is empty take part with count 0 and change nothing; they are masked on the device rather than filtered on
the host, so no step reads a device value back (CUDA-graph capture friendly).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor

from normkit import functional, ops
from normkit.reference._common import acc_dtype

__all__ = ["sync_batch_norm"]


def _dense(t: Tensor) -> Tensor:
    """``t`` unless it is dense in channels_last(_3d) or contiguous order, else a contiguous copy (torch's rule:
    the output then has the same layout as torch's SyncBatchNorm gives)."""
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return t
    if t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d):
        return t
    return t.contiguous()


class _SyncBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, momentum, group, world_size):
        input = _dense(input)
        C = input.shape[1]
        if input.numel() > 0:
            mean, invstd = ops.batch_norm_stats(input, eps)
            count = torch.full((1,), input.numel() // C, dtype=mean.dtype, device=mean.device)
            row = torch.cat([mean, invstd, count])
        else:  # still part of the collective: a row of count 0
            row = torch.zeros(2 * C + 1, dtype=acc_dtype(input.dtype), device=input.device)
        gathered = [torch.empty_like(row) for _ in range(world_size)]
        dist.all_gather(gathered, row, group=group)  # (the one all-gather every torch version and backend has)
        rows = torch.stack(gathered)
        means, invstds, counts = rows[:, :C], rows[:, C:2 * C], rows[:, 2 * C]
        # an empty rank's invstd is 0, i.e. an infinite variance that its count 0 would turn into NaN: give it
        # any finite one (its weight is 0)
        invstds = torch.where((counts > 0).unsqueeze(1), invstds, torch.ones_like(invstds))
        mean, invstd = ops.batch_norm_gather_stats_with_counts(input, means, invstds, running_mean, running_var,
                                                               momentum, eps, counts)
        ctx.save_for_backward(input, weight, mean, invstd, counts)
        ctx.group = group
        ctx.bias_dtype = None if bias is None else bias.dtype
        if input.numel() == 0:
            return torch.empty_like(input)
        return ops.batch_norm_elemt(input, weight, bias, mean, invstd, eps)

    @staticmethod
    def backward(ctx, grad_out):
        saved = ctx.saved_tensors
        return _fail_on_second_backward(_SyncBatchNorm._grads(ctx, grad_out, *saved), (saved[0], saved[1], grad_out))

    @staticmethod
    def _grads(ctx, grad_out, input, weight, mean, invstd, counts):
        need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
        need_dw = need_dw and weight is not None
        # without a weight the op's grad_bias takes the input's dtype (aten's rule): a bf16 input's fp32 bias gets
        # sum_dy, summed in fp32, instead
        db_from_sum = need_db and weight is None
        dx = dw = db = None
        C = input.shape[1]
        if input.numel() > 0:
            grad_out = _dense(grad_out)
            sum_dy, sum_dy_xmu, dw, db = ops.batch_norm_backward_reduce(grad_out, input, mean, invstd, weight,
                                                                        need_dx or db_from_sum, need_dw,
                                                                        need_db and not db_from_sum)
            if db_from_sum:
                db = sum_dy.to(ctx.bias_dtype)
        else:  # no local grads (None, as torch's), but the rank still joins the all-reduce
            sum_dy = sum_dy_xmu = torch.zeros(C, dtype=mean.dtype, device=mean.device)
        if need_dx:  # every rank whose input needs a gradient joins this all-reduce, empty or not
            sums = torch.cat([sum_dy, sum_dy_xmu])
            dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=ctx.group)
            sum_dy, sum_dy_xmu = sums[:C], sums[C:]
            if input.numel() > 0:
                dx = ops.batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu,
                                                   counts)
            else:
                dx = torch.empty_like(input)
        return dx, dw, db, None, None, None, None, None, None


_SECOND_BACKWARD = ("normkit's sync_batch_norm / SyncBatchNorm has no second derivative: its global statistics and "
                    "all-reduce carry no graph (torch's SyncBatchNorm has none either)")


def _fail_on_second_backward(grads, sources):
    """``grads`` as they are, unless the backward records a graph (create_graph=True): then they are returned
    through a node that raises when differentiated, as aten's ops without a derivative formula do, with the
    ``sources`` they depend on (input, weight, incoming gradient) behind it, so that differentiating towards any
    of them reaches it. A second backward would otherwise be silently wrong (the all-reduce has no autograd)."""
    given = [i for i, g in enumerate(grads) if g is not None]
    if not (torch.is_grad_enabled() and given):
        return grads
    behind = [t for t in sources if t is not None and t.requires_grad]
    failing = torch._C._functions.DelayedError(_SECOND_BACKWARD, len(given) + len(behind))(
        *[grads[i].detach().requires_grad_() for i in given], *behind)
    out = list(grads)
    for i, g in zip(given, (failing,) if isinstance(failing, Tensor) else failing):
        out[i] = g
    return tuple(out)


def sync_batch_norm(input: Tensor, running_mean: Optional[Tensor], running_var: Optional[Tensor],
                    weight: Optional[Tensor] = None, bias: Optional[Tensor] = None, momentum: float = 0.1,
                    eps: float = 1e-5, group: Optional[dist.ProcessGroup] = None) -> Tensor:
    """Training-mode batch norm with statistics over every rank of ``group`` (default: the world).

    Every rank of the group must call it (it runs collectives), each with its own batch, the same channels and
    dtypes; a rank may pass an empty batch. Running statistics (optional) are updated with the global unbiased
    variance on every rank alike. With one rank, or no initialized process group, it is ``normkit.batch_norm``
    in training mode.
    """
    if input.dim() < 2:
        raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")
    if input.size(1) == 0:
        raise ValueError("SyncBatchNorm number of input channels should be non-zero")
    world_size = dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1
    if world_size <= 1:  # (-1: this rank is not in the group; it normalizes its own batch, as torch's module)
        return functional.batch_norm(input, running_mean, running_var, weight, bias, True, momentum, eps)
    return _SyncBatchNorm.apply(input, weight, bias, running_mean, running_var, eps, momentum,
                                group or dist.group.WORLD, world_size)
