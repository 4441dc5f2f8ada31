"""Group norm, instance norm and the SyncBatchNorm primitives, with aten's names and signatures.

Group norm runs the Triton kernels (`normkit.kernels.group_norm`) where they handle the input (fp16 / bf16
/ fp32 on CUDA, or on CPU under TRITON_INTERPRET=1; parameters in the input dtype or fp32), the reference
otherwise; instance norm runs group norm with one group per channel (or batch norm's eval mode with
running statistics). Group norm's outputs keep the input's suggested memory format, instance norm's are
contiguous (aten's). The SyncBatchNorm primitives
validate with `normkit._checks`, then run batch norm's kernels (composed per primitive) where those take the
input, else `normkit.reference`.
"""

from __future__ import annotations

from typing import List, Optional

import torch
from torch import Tensor

from normkit import _checks
from normkit.kernels import _plan
from normkit.ops._select import PLAIN_TENSORS, kernels_for, params_ok, reference
from normkit.ops.batch_norm import _bn_kernels
from normkit.reference._common import acc_dtype, affine_grad_dtype, dims_are_nc

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


def _gn_kernels(input: Tensor, N: int, C: int, *params):
    """The kernel module when it handles this input (whose dims 0 and 1 are the caller's N and C), else None."""
    mod = kernels_for("group_norm", input)
    if mod is None or not dims_are_nc(input, N, C):
        return None
    if not params_ok(input, *params) or not mod.supports(input, *params):
        return None
    return mod


def group_norm_stat_dtype(input: Tensor, *params: Optional[Tensor], fp32_stats: bool = False) -> torch.dtype:
    """mean / rstd dtype (contract §5): the input's, or its accumulation type when a parameter differs
    (or when ``fp32_stats`` asks for it)."""
    mixed = fp32_stats or any(p is not None and p.dtype != input.dtype for p in params)
    return acc_dtype(input.dtype) if mixed else input.dtype


def native_group_norm(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], N: int, C: int,
                      HxW: int, group: int, eps: float):
    _checks.check_group_norm(input, weight, bias, N, C, HxW, group)
    return _group_norm_core(input, weight, bias, N, C, HxW, group, eps)


def _group_norm_core(input, weight, bias, N, C, HxW, group, eps, fp32_stats=False):
    sdt = group_norm_stat_dtype(input, weight, bias, fp32_stats=fp32_stats)
    mod = _gn_kernels(input, N, C, weight, bias)
    if mod is None:
        if sdt == input.dtype:
            return tuple(reference().native_group_norm(input, weight, bias, N, C, HxW, group, eps))
        # fp32 statistics unrounded: the reference on the input in its compute type (the same arithmetic)
        y, mean, rstd = reference().native_group_norm(input.to(sdt), weight, bias, N, C, HxW, group, eps)
        return y.to(input.dtype), mean.to(sdt), rstd.to(sdt)
    return mod.gn_forward(input, weight, bias, group, eps, sdt)


def native_group_norm_backward(grad_out: Tensor, input: Tensor, mean: Tensor, rstd: Tensor,
                               weight: Optional[Tensor], N: int, C: int, HxW: int, group: int,
                               output_mask: List[bool]):
    _checks.check_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group)
    return _group_norm_backward_core(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask)


def _group_norm_backward_core(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    mask = [bool(m) for m in output_mask]
    mod = _gn_kernels(input, N, C, weight)
    if (mod is None or grad_out.dtype != input.dtype or grad_out.shape != input.shape or not any(mask)
            or (weight is not None and weight.dim() != 1)):
        return tuple(reference().native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group,
                                                            mask))
    pdt = affine_grad_dtype(input, weight, mean, rstd)  # the reference's rule (fp32 for a mixed call, weight None)
    return mod.gn_backward(grad_out, input, mean, rstd, weight, group, mask, pdt)


# --- fast routes (under enable(), as batch norm's: normkit.ops.batch_norm) -------------------------------------
# A call whose tensors (``_plan.signature``: device, dtype, sizes, strides) passed every check and ran a launch plan
# on them as they are (x's dims 0 and 1 are its N and C: else the ops take the reference) is noted with its N, C,
# HxW, group and eps / mask; a later call with the same ones replays the
# plan, skipping the checks, the kernel selection and the statistics' dtype rule (all read only what the signature
# and those arguments hold). Wired by normkit.aten with batch norm's, under its switch, while ``ROUTES_ON``.

ROUTES_ON = False  # (session 43) CPU-tested with stand-ins; on once the CUDA same-bits test has run (PART=129)
_routes: set = set()
MAX_ROUTES = 4096


def _note(entry) -> None:
    if len(_routes) < MAX_ROUTES:
        _routes.add(entry)


def _forward_route(x, weight, bias, N, C, HxW, group, eps):
    if not ROUTES_ON or type(x) not in PLAIN_TENSORS:
        return None
    sig = _plan.signature((x, weight, bias))
    if sig is None or ("fwd", sig, N, C, HxW, group, eps) not in _routes:
        return None
    sdt = group_norm_stat_dtype(x, weight, bias)
    out = kernels_for("group_norm", x).gn_forward_replay(x, weight, bias, group, eps, sdt, sig)
    return None if out is None else tuple(out)


def _note_forward(x, weight, bias, N, C, HxW, group, eps) -> None:
    # (a raw call whose N, C are not x's dims 0 and 1 went to the reference: the plan of x's signature is another's)
    mod = kernels_for("group_norm", x) if ROUTES_ON and x.is_cuda and dims_are_nc(x, N, C) else None
    sig = _plan.signature((x, weight, bias)) if mod is not None else None
    if sig is not None and mod.gn_forward_planned(group, eps, group_norm_stat_dtype(x, weight, bias), sig):
        _note(("fwd", sig, N, C, HxW, group, eps))


def _backward_route(grad_out, x, mean, rstd, weight, N, C, HxW, group, mask):
    if not ROUTES_ON or type(x) not in PLAIN_TENSORS:
        return None
    sig = _plan.signature((grad_out, x, mean, rstd, weight))
    if sig is None or ("bwd", sig, N, C, HxW, group, mask) not in _routes:
        return None
    pdt = affine_grad_dtype(x, weight, mean, rstd)
    out = kernels_for("group_norm", x).gn_backward_replay(grad_out, x, mean, rstd, weight, group, mask, pdt, sig)
    return None if out is None else tuple(out)


def _note_backward(grad_out, x, mean, rstd, weight, N, C, HxW, group, mask) -> None:
    mod = kernels_for("group_norm", x) if ROUTES_ON and x.is_cuda and dims_are_nc(x, N, C) else None
    sig = _plan.signature((grad_out, x, mean, rstd, weight)) if mod is not None else None
    if sig is not None and mod.gn_backward_planned(group, mask, affine_grad_dtype(x, weight, mean, rstd), sig):
        _note(("bwd", sig, N, C, HxW, group, mask))


ROUTES = {
    "native_group_norm": (_forward_route, _note_forward),
    "native_group_norm_backward": (
        lambda g, x, m, r, w, N, C, HxW, group, mask: _backward_route(g, x, m, r, w, N, C, HxW, group,
                                                                      tuple(bool(v) for v in mask)),
        lambda g, x, m, r, w, N, C, HxW, group, mask: _note_backward(g, x, m, r, w, N, C, HxW, group,
                                                                     tuple(bool(v) for v in mask))),
}


def tile_transpose_for(t: Tensor):
    """`normkit.kernels.layout` when it moves ``t`` (knob ``tile_transpose`` of group norm's kernels on, and the
    kernels take t's device and dtype), else None."""
    gn = kernels_for("group_norm", t)
    return kernels_for("layout", t) if gn is not None and gn._CFG["tile_transpose"] else None


def in_layout(t: Tensor, fmt) -> Tensor:
    """``t`` in layout ``fmt``. Between contiguous and channels_last(_3d) (dense either way) the copy is normkit's
    tile transpose where `tile_transpose_for` gives it: about copy speed, where torch's strided copy runs at a
    quarter of it."""
    if t.is_contiguous(memory_format=fmt):  # (before the kernels' lookup: the common case, on every device)
        return t
    mod = tile_transpose_for(t)
    return t.contiguous(memory_format=fmt) if mod is None else mod.in_format(t, fmt)


def instance_norm(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                  running_mean: Optional[Tensor], running_var: Optional[Tensor], use_input_stats: bool,
                  momentum: float, eps: float, cudnn_enabled: bool = False) -> Tensor:
    """aten::instance_norm. With input statistics: group norm with one group per channel (fp32 statistics)
    and the running statistics moved towards their batch average; otherwise batch norm's eval mode on the
    input. As aten's, it normalizes ``input.contiguous()``: the output is contiguous (contract §6)."""
    _checks.check_instance_norm(input, weight, bias, running_mean, running_var, use_input_stats)
    input = in_layout(input, torch.contiguous_format)
    if input.numel() == 0:  # aten returns before normalizing (the running statistics: the reference's rule)
        return reference().instance_norm(input, weight, bias, running_mean, running_var, use_input_stats, momentum,
                                         eps, cudnn_enabled)
    if not use_input_stats:
        from normkit.ops import batch_norm as _bn

        return _bn._forward_core(input, weight, bias, running_mean, running_var, False, momentum, eps)[0]
    n, c = input.shape[0], input.shape[1]
    hxw = input.numel() // (n * c)
    y, mean, _ = _group_norm_core(input, weight, bias, n, c, hxw, c, eps, fp32_stats=True)
    update_instance_running_stats(running_mean, running_var, mean, input, momentum)
    return y


def update_instance_running_stats(running_mean: Optional[Tensor], running_var: Optional[Tensor], mean: Tensor,
                                  input: Tensor, momentum: float) -> None:
    """running = (1 - momentum) * running + momentum * batch average of the per-(n, c) statistics (what
    ATen's batch norm on the (1, N*C, *) view leaves after averaging over N); the variance is the unbiased
    one, computed from ``input`` in its accumulation type (recovering it from rstd, var = rstd^-2 - eps, lost
    ~eps/var·1e-7 relative, all of it once var is far below eps, and gave 0 where ATen's is NaN: one element per
    instance). Each instance is shifted by its first element first (exact for nearby values): CUDA's fp32
    ``torch.var`` (Welford in fp32) of values near 1000 with std 0.1 was 9e-5 off (H200 session 16, the randomized
    test); the CPU's was not."""
    with torch.no_grad():
        updates = []  # both computed before either is written: aten's order, also for aliased statistics
        if running_mean is not None:
            updates.append((running_mean, _blended(running_mean, mean.mean(0), momentum)))
        if running_var is not None:
            x = input.to(acc_dtype(input.dtype)).flatten(2) if input.dim() > 2 else None
            if x is not None and x.shape[2] > 1 and x.shape[0] > 0:
                var = torch.var(x - x[:, :, :1], dim=2, correction=1)
            else:
                # one value per instance (a 2-D input, or spatial size 1: only a direct aten call gets here): its
                # unbiased variance is 0/0, NaN, as in ATen's batch norm on the (1, N*C) view; no instances: the
                # average below is NaN whatever they hold
                var = torch.full(mean.shape, float("nan"), dtype=acc_dtype(input.dtype), device=input.device)
            updates.append((running_var, _blended(running_var, var.mean(0), momentum)))
        for running, new in updates:
            running.copy_(new)


def _blended(running: Tensor, batch: Tensor, momentum: float) -> Tensor:
    """(1 - momentum) * running + momentum * batch, computed in the accumulation type (rounded once when copied into
    the buffer, as the batch-norm kernels do): in bf16 / fp16 buffers three roundings, the terms of opposite sign,
    were 4 half-ulps off float64 (randomized test, InstanceNorm2d with bf16 buffers, session 22)."""
    acc = acc_dtype(running.dtype)
    return torch.add(running.to(acc) * (1 - momentum), batch.to(acc), alpha=momentum)


def batch_norm_stats(input: Tensor, eps: float):
    _checks.check_batch_norm_stats(input)
    mod = _bn_kernels(input)
    if mod is not None:
        return mod.bn_stats(input, eps)
    return tuple(reference().batch_norm_stats(input, eps))


def batch_norm_gather_stats_with_counts(input: Tensor, mean: Tensor, invstd: Tensor,
                                        running_mean: Optional[Tensor], running_var: Optional[Tensor],
                                        momentum: float, eps: float, counts: Tensor):
    _checks.check_batch_norm_gather_stats(input, mean, invstd, running_mean, running_var, counts)
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
    _checks.check_batch_norm_elemt(input, weight, bias, mean, invstd)
    mod = _bn_kernels(input, weight, bias)
    if mod is not None:
        return mod.bn_elemt(input, weight, bias, mean, invstd)
    return reference().batch_norm_elemt(input, weight, bias, mean, invstd, eps)


def batch_norm_backward_reduce(grad_out: Tensor, input: Tensor, mean: Tensor, invstd: Tensor,
                               weight: Optional[Tensor], input_g: bool, weight_g: bool, bias_g: bool):
    _checks.check_batch_norm_backward_reduce(grad_out, input, mean, invstd, weight)
    mod = _bn_kernels(input, weight)
    if mod is not None and grad_out.dtype == input.dtype:  # (the shapes are checked equal)
        return mod.bn_backward_reduce(grad_out, input, mean, invstd, weight, input_g, weight_g, bias_g)
    return tuple(reference().batch_norm_backward_reduce(grad_out, input, mean, invstd, weight, input_g, weight_g,
                                                        bias_g))


def batch_norm_backward_elemt(grad_out: Tensor, input: Tensor, mean: Tensor, invstd: Tensor,
                              weight: Optional[Tensor], sum_dy: Tensor, sum_dy_xmu: Tensor,
                              count: Tensor) -> Tensor:
    _checks.check_batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu)
    mod = _bn_kernels(input, weight)
    if mod is not None and grad_out.dtype == input.dtype:  # (the shapes are checked equal)
        return mod.bn_backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, count)
    return reference().batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, count)
