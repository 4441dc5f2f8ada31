"""Batch norm with aten's names, signatures and return values (no autograd: `enable()` registers these
below ATen's autograd formulas).

Each function validates with `normkit._checks` before touching data (a call that raises leaves the
running statistics untouched), then runs the Triton kernels when `normkit.kernels.runs_kernels_on(x)`
and the kernel module's `supports(x)` say so, else `normkit.reference`.

Conventions (docs/ARCHITECTURE.md): saved statistics are `(mean, invstd)` of shape `(C,)` in training,
float32 for fp16/bf16/fp32 input and float64 for fp64; eval returns empty `(0,)` saved statistics; every
backward accepts empty or filled saved statistics in eval and then uses the running statistics.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from normkit import _checks
from normkit.kernels import dense_param
from normkit.ops._select import kernels_for, params_ok, reference
from normkit.reference._common import acc_dtype

__all__ = [
    "native_batch_norm",
    "_native_batch_norm_legit",
    "_native_batch_norm_legit_no_stats",
    "_native_batch_norm_legit_no_training",
    "_batch_norm_with_update",
    "_batch_norm_no_update",
    "native_batch_norm_backward",
    "batch_norm_backward",
    "cudnn_batch_norm",
    "cudnn_batch_norm_backward",
    "batch_norm_update_stats",
]


def _bn_kernels(x: Tensor, *params):
    mod = kernels_for("batch_norm", x)
    if mod is None or not mod.supports(x) or not params_ok(x, *params):
        return None
    return mod


# new_empty(0) rather than new_empty((0,)): the same tensor, and an int parses faster than a tuple (~0.5 us)
def _empty_stats(x: Tensor) -> Tuple[Tensor, Tensor]:
    dt = acc_dtype(x.dtype)
    return x.new_empty(0, dtype=dt), x.new_empty(0, dtype=dt)


def _empty_reserve(x: Tensor) -> Tensor:
    return x.new_empty(0, dtype=torch.uint8)


def _forward(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """Validated forward: `(out, save_mean, save_invstd)`, eval stats empty."""
    _checks.check_batch_norm(x, weight, bias, running_mean, running_var, training)
    return _forward_core(x, weight, bias, running_mean, running_var, training, momentum, eps)


def _forward_core(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """`_forward` without validation (for callers that validated already: normkit.functional)."""
    mod = _bn_kernels(x, weight, bias, running_mean, running_var)
    if mod is None:
        return tuple(reference().native_batch_norm(x, weight, bias, running_mean, running_var, training,
                                                   momentum, eps))
    weight, bias = dense_param(weight), dense_param(bias)
    if training:
        # non-contiguous running stats: update a dense copy, then write it back in place
        rm, rv = dense_param(running_mean), dense_param(running_var)
        out = tuple(mod.bn_forward_train(x, weight, bias, rm, rv, momentum, eps))
        if rm is not running_mean:
            running_mean.copy_(rm)
        if rv is not running_var:
            running_var.copy_(rv)
        return out
    y = mod.bn_forward_eval(x, weight, bias, dense_param(running_mean), dense_param(running_var), eps)
    return (y,) + _empty_stats(x)


def native_batch_norm(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                      running_mean: Optional[Tensor], running_var: Optional[Tensor], training: bool,
                      momentum: float, eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    return _forward(input, weight, bias, running_mean, running_var, training, momentum, eps)


def _native_batch_norm_legit(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                             running_mean: Tensor, running_var: Tensor, training: bool, momentum: float,
                             eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    return _forward(input, weight, bias, running_mean, running_var, training, momentum, eps)


def _native_batch_norm_legit_no_stats(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                                      training: bool, momentum: float, eps: float):
    """`_native_batch_norm_legit.no_stats`: batch statistics, nothing to update (eval raises: no stats)."""
    return _forward(input, weight, bias, None, None, training, momentum, eps)


def _native_batch_norm_legit_no_training(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                                         running_mean: Tensor, running_var: Tensor, momentum: float,
                                         eps: float):
    return _forward(input, weight, bias, running_mean, running_var, False, momentum, eps)


def _batch_norm_with_update(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                            running_mean: Tensor, running_var: Tensor, momentum: float, eps: float):
    """Training forward that updates the running stats; 4th output: the (empty) uint8 reserve."""
    return _forward(input, weight, bias, running_mean, running_var, True, momentum, eps) + (_empty_reserve(input),)


def _batch_norm_no_update(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                          running_mean: Optional[Tensor], running_var: Optional[Tensor], momentum: float,
                          eps: float):
    """Eval forward with the running stats (raw aten segfaults without them on CPU; normkit raises)."""
    return _forward(input, weight, bias, running_mean, running_var, False, momentum, eps) + (_empty_reserve(input),)


def _backward(grad_out, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
              output_mask, *, kernel_name="batch_norm_backward_cpu"):
    _checks.check_batch_norm_backward(grad_out, x, weight, running_mean, running_var, save_mean,
                                      save_invstd, train, kernel=kernel_name)
    return _backward_core(grad_out, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
                          output_mask)


def _backward_core(grad_out, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
                   output_mask):
    """`_backward` without validation."""
    mask = [bool(m) for m in output_mask]
    mod = _bn_kernels(x, weight, running_mean, running_var)
    if mod is None or grad_out.dtype != x.dtype:
        res = reference().native_batch_norm_backward(grad_out, x, weight, running_mean, running_var,
                                                     save_mean, save_invstd, train, eps, mask)
        return tuple(res)
    if train:
        mean, invstd = save_mean, save_invstd
    else:
        acc = acc_dtype(x.dtype)
        mean = running_mean.to(acc)
        invstd = torch.rsqrt(running_var.to(acc) + eps)
    gi, gw, gb = mod.bn_backward(grad_out, x, dense_param(weight), dense_param(mean), dense_param(invstd), train,
                                 mask)
    # gradient dtype of an absent weight: the input's (the reference's rule; the kernels use fp32)
    pdt = weight.dtype if weight is not None else x.dtype
    if gw is not None and gw.dtype != pdt:
        gw = gw.to(pdt)
    if gb is not None and gb.dtype != pdt:
        gb = gb.to(pdt)
    return gi, gw, gb


def native_batch_norm_backward(grad_out: Tensor, input: Tensor, weight: Optional[Tensor],
                               running_mean: Optional[Tensor], running_var: Optional[Tensor],
                               save_mean: Optional[Tensor], save_invstd: Optional[Tensor], train: bool,
                               eps: float, output_mask: List[bool]):
    return _backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
                     output_mask)


def batch_norm_backward(grad_out: Tensor, input: Tensor, weight: Tensor, running_mean: Optional[Tensor],
                        running_var: Optional[Tensor], save_mean: Optional[Tensor],
                        save_var: Optional[Tensor], update: bool, eps: float, output_mask: List[bool],
                        reserve: Tensor):
    """`save_var` is, despite its name, the saved invstd; `reserve` is ignored (normkit keeps none)."""
    _checks.check_weight_required(weight, 3, "weight")
    return _backward(grad_out, input, weight, running_mean, running_var, save_mean, save_var, update, eps,
                     output_mask)


def cudnn_batch_norm(input: Tensor, weight: Tensor, bias: Optional[Tensor], running_mean: Optional[Tensor],
                     running_var: Optional[Tensor], training: bool, exponential_average_factor: float,
                     epsilon: float):
    """What fp32/fp16 `F.batch_norm` reaches on CUDA (contract §13): `(out, save_mean, save_invstd,
    reserve)`, reserve an empty uint8 tensor, eval saved stats empty (as cuDNN's)."""
    _checks.check_weight_required(weight, 2, "weight")
    return _forward(input, weight, bias, running_mean, running_var, training, exponential_average_factor,
                    epsilon) + (_empty_reserve(input),)


def cudnn_batch_norm_backward(input: Tensor, grad_output: Tensor, weight: Tensor,
                              running_mean: Optional[Tensor], running_var: Optional[Tensor],
                              save_mean: Optional[Tensor], save_var: Optional[Tensor], epsilon: float,
                              reserveSpace: Tensor):
    """cuDNN's backward (training only in ATen's autograd; `save_var` is the saved invstd). Returns all
    three gradients. Empty saved stats mean the forward ran in eval: the running stats are used."""
    _checks.check_weight_required(weight, 3, "weight")
    train = save_mean is not None and save_mean.numel() > 0
    return _backward(grad_output, input, weight, running_mean, running_var, save_mean, save_var, train,
                     epsilon, [True, True, True])


def batch_norm_update_stats(input: Tensor, running_mean: Optional[Tensor], running_var: Optional[Tensor],
                            momentum: float):
    return tuple(reference().batch_norm_update_stats(input, running_mean, running_var, momentum))
