"""A backend that delegates every aten-named function to torch's CPU kernels, correctly.

Raw aten leaves some bad inputs unchecked (contract §2.5: wrong-size params read out of bounds,
running stats missing in eval segfault), so this module validates those first with torch's own
messages, exactly as a conforming backend must. The broken backends in test_broken_backends.py
each replace one function of this module with a buggy one.

torch's CPU build has no SyncBatchNorm primitives (contract §3), so those are normkit.reference's, the
plain-torch path `--impl normkit` takes on the CPU; the tests judge them against torch64_oracle, which
writes the contract's formulas out independently.
"""

import torch
import torch.nn.functional as F

from normkit.reference.sync_batch_norm import (  # noqa: F401
    batch_norm_backward_elemt,
    batch_norm_backward_reduce,
    batch_norm_elemt,
    batch_norm_gather_stats,
    batch_norm_gather_stats_with_counts,
    batch_norm_stats,
)

A = torch.ops.aten


def _check_bn(x, weight, bias, running_mean, running_var, training):
    if x.dim() < 2:
        raise ValueError(f"expected at least 2D input (got {x.dim()}D input)")
    if (running_mean is None) != (running_var is None):
        raise ValueError("running_mean and running_var must either both be None or neither be None")
    C = x.shape[1]
    for name, t in (("weight", weight), ("bias", bias), ("running_mean", running_mean),
                    ("running_var", running_var)):
        if t is not None and t.numel() != C:
            raise RuntimeError(f"{name} should contain {C} elements not {t.numel()}")
    if not training:
        if running_mean is None:
            raise RuntimeError("running_mean must be defined in evaluation mode")


def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    _check_bn(input, weight, bias, running_mean, running_var, training)
    return A.native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)


def _native_batch_norm_legit(input, weight, bias, running_mean, running_var, training, momentum, eps):
    _check_bn(input, weight, bias, running_mean, running_var, training)
    return A._native_batch_norm_legit(input, weight, bias, running_mean, running_var, training, momentum, eps)


def _native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps):
    _check_bn(input, weight, bias, None, None, training)
    return A._native_batch_norm_legit.no_stats(input, weight, bias, training, momentum, eps)


def _native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    _check_bn(input, weight, bias, running_mean, running_var, False)
    return A._native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps)


def _batch_norm_with_update(input, weight, bias, running_mean, running_var, momentum, eps):
    _check_bn(input, weight, bias, running_mean, running_var, True)
    return A._batch_norm_with_update(input, weight, bias, running_mean, running_var, momentum, eps)


def _batch_norm_no_update(input, weight, bias, running_mean, running_var, momentum, eps):
    _check_bn(input, weight, bias, running_mean, running_var, False)
    return A._batch_norm_no_update(input, weight, bias, running_mean, running_var, momentum, eps)


def native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd,
                               train, eps, output_mask):
    return A.native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
                                        save_invstd, train, eps, output_mask)


def batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_var, update, eps,
                        output_mask, reserve):
    return A.batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_var,
                                 update, eps, output_mask, reserve)


def batch_norm_update_stats(input, running_mean, running_var, momentum):
    return A.batch_norm_update_stats(input, running_mean, running_var, momentum)


def native_layer_norm(input, normalized_shape, weight, bias, eps):
    return A.native_layer_norm(input, normalized_shape, weight, bias, eps)


def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    return A.native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask)


def _fused_rms_norm(input, normalized_shape, weight, eps):
    return A._fused_rms_norm(input, normalized_shape, weight, eps)


def rms_norm(input, normalized_shape, weight=None, eps=None):
    return A.rms_norm(input, normalized_shape, weight, eps)


def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    return A.native_group_norm(input, weight, bias, N, C, HxW, group, eps)


def native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    return A.native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask)


def instance_norm(input, weight, bias, running_mean, running_var, use_input_stats, momentum, eps,
                  cudnn_enabled=False):
    return A.instance_norm(input, weight, bias, running_mean, running_var, use_input_stats, momentum, eps,
                           cudnn_enabled)


class functional:  # F-style entry points (a namespace, like normkit.functional)
    batch_norm = staticmethod(F.batch_norm)
    layer_norm = staticmethod(F.layer_norm)
    rms_norm = staticmethod(F.rms_norm)
    group_norm = staticmethod(F.group_norm)
    instance_norm = staticmethod(F.instance_norm)
