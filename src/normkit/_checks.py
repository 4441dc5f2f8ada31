"""Input validation with torch's exact error types and messages (contract §2.5, §3, §4, §5, §6, §7).

Every check looks only at shapes, dtypes and Python scalars, never at tensor data, so it is safe under
``torch.compile`` and CUDA-graph capture. Messages are torch 2.13's CPU text where torch raises; where raw
aten leaves an input unchecked (and reads out of bounds or crashes), normkit raises the message torch's
own higher-level entry point (``torch.batch_norm``) gives for the same mistake.

Two levels:

* aten level (``check_batch_norm`` ...): what the aten-named functions of ``normkit.reference`` and
  ``normkit.ops`` validate before touching any data or running statistic.
* functional level (``verify_batch_size``, ``check_batch_norm_eps`` ...): the extra Python-side checks of
  ``torch.nn.functional`` (batch of one, eps sign, spatial size, group count).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence


import torch
from torch import Tensor

__all__ = [
    "FLOAT_DTYPES",
    "dtype_name",
    "check_floating",
    "check_channel_dim",
    # batch norm, aten level
    "check_batch_norm",
    "check_batch_norm_running_stats",
    "check_batch_norm_backward",
    "check_batch_norm_update_stats",
    "check_weight_required",
    # batch norm, functional level
    "verify_batch_size",
    "check_batch_norm_eps",
    "check_batch_norm_functional",
    # SyncBatchNorm primitives
    "check_batch_norm_stats",
    "check_batch_norm_gather_stats",
    "check_batch_norm_elemt",
    "check_batch_norm_backward_reduce",
    "check_batch_norm_backward_elemt",
    # layer / rms norm
    "check_layer_norm",
    "check_layer_norm_backward",
    "check_rms_norm",
    "check_rms_norm_backward",
    # group norm
    "check_group_norm",
    "check_group_norm_backward",
    "check_group_norm_functional",
    # instance norm
    "check_instance_norm",
    "verify_spatial_size",
]

# The input dtypes every normkit op computes in; anything else is "not implemented" as in torch.
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_FLOATING = frozenset(FLOAT_DTYPES)

# C++ ScalarType names as torch prints them in "not implemented for 'X'" messages.
_SCALAR_TYPE_NAMES = {
    torch.bool: "Bool",
    torch.uint8: "Byte",
    torch.int8: "Char",
    torch.int16: "Short",
    torch.int32: "Int",
    torch.int64: "Long",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.float32: "Float",
    torch.float64: "Double",
    torch.complex32: "ComplexHalf",
    torch.complex64: "ComplexFloat",
    torch.complex128: "ComplexDouble",
}
for _name in ("uint16", "uint32", "uint64"):
    if hasattr(torch, _name):
        _SCALAR_TYPE_NAMES[getattr(torch, _name)] = _name.capitalize().replace("int", "Int")
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"):
    if hasattr(torch, _name):
        _SCALAR_TYPE_NAMES[getattr(torch, _name)] = "Float8_" + _name[len("float8_"):]


def dtype_name(dtype: torch.dtype) -> str:
    """The C++ ScalarType name torch uses in dispatch errors ('Long', 'BFloat16', 'ComplexFloat')."""
    return _SCALAR_TYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def _shape(t: Optional[Tensor]) -> list:
    # torch prints IntArrayRefs as [a, b]; an undefined tensor has sizes [0] in those messages.
    return [0] if t is None else [int(s) for s in t.shape]


def check_floating(input: Tensor, kernel: str, allow_complex: bool = False) -> None:
    """NotImplementedError like an AT_DISPATCH miss: '"batch_norm" not implemented for 'Long''."""
    if input.dtype in FLOAT_DTYPES:
        return
    if allow_complex and input.dtype.is_complex:
        return
    raise NotImplementedError(f'"{kernel}" not implemented for \'{dtype_name(input.dtype)}\'')


# Parameter dtypes normkit computes with (the input's accumulation type after a cast): any floating dtype.
_PARAM_FLOATING = frozenset(d for d in vars(torch).values() if isinstance(d, torch.dtype) and d.is_floating_point)


def _param_dtype_error(input: Tensor, params) -> None:
    """A weight / bias / running statistic of a non-floating dtype (int, bool, complex), which torch's kernels
    reject: normkit would otherwise cast it (a complex one losing its imaginary part)."""
    for name, p in params:
        if p is not None and p.dtype not in _PARAM_FLOATING:
            if input.device.type == "cpu":  # torch's CPU text (contract §2), fp64 input included
                raise RuntimeError("mixed dtype (CPU): expect parameter to have scalar type of Float")
            raise RuntimeError(f"expected {name} to have a floating point dtype, but got {dtype_name(p.dtype)}")


def check_channel_dim(input: Tensor) -> None:
    """Batch-style ops read the channel count from dim 1: raise what ``input.size(1)`` raises in torch.

    Raw aten reads a nonexistent dim for 1-D input (garbage sizes, contract §2.5); normkit refuses it.
    """
    if input.dim() == 0:
        raise IndexError("Dimension specified as 1 but tensor has no dimensions")
    if input.dim() == 1:
        raise IndexError("Dimension out of range (expected to be in range of [-1, 0], but got 1)")


# --------------------------------------------------------------------------------------------------
# Batch norm: aten level
# --------------------------------------------------------------------------------------------------


def _check_numel(name: str, t: Tensor, expected: int) -> None:
    if t.numel() != expected:
        raise RuntimeError(f"{name} should contain {expected} elements not {t.numel()}")


def check_batch_norm_running_stats(running_mean, running_var) -> None:
    """One running statistic without the other (checked by torch's CPU and CUDA kernels)."""
    if (running_mean is None) != (running_var is None):
        raise ValueError("running_mean and running_var must either both be None or neither be None")


def check_batch_norm(
    input: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    running_mean: Optional[Tensor],
    running_var: Optional[Tensor],
    training: bool,
    *,
    kernel: str = "batch_norm",
    allow_empty: bool = False,
    functional: bool = False,
) -> None:
    """Every forward batch-norm check, in the order torch applies them at the level of the caller.

    Called from the functional level (``functional=True``), the order is ``torch.batch_norm``'s: rank
    (channel dim exists), running stats defined in eval and of size C, weight/bias of size C
    (``_batch_norm_impl_index``), one running stat without the other, dtype (the kernel), and finally
    an empty input in training (the CPU kernel). Raw aten ops check one running stat without the other
    first (the kernel's own check runs before anything else there). ``allow_empty`` skips the empty-input
    check for callers that handle empty training batches themselves (``instance_norm``, the functional API).
    """
    # Every call under enable() runs this: the passing tests inline, the helpers called only to raise.
    if not functional:
        check_batch_norm_running_stats(running_mean, running_var)
    if input.dim() < 2:
        check_channel_dim(input)
    c = input.shape[1]
    for name, stat in (("running_mean", running_mean), ("running_var", running_var)):
        if stat is None:
            if not training:
                raise RuntimeError(f"{name} must be defined in evaluation mode")
        elif stat.numel() != c:
            _check_numel(name, stat, c)
    if weight is not None and weight.numel() != c:
        _check_numel("weight", weight, c)
    if bias is not None and bias.numel() != c:
        _check_numel("bias", bias, c)
    if functional:  # (raw aten checked this first, above)
        check_running_stats_need_no_grad(running_mean, running_var)
        check_batch_norm_running_stats(running_mean, running_var)
    if input.dtype not in _FLOATING:
        check_floating(input, kernel)
    for p in (weight, bias, running_mean, running_var):
        if p is not None and p.dtype not in _PARAM_FLOATING:
            _param_dtype_error(input, (("weight", weight), ("bias", bias), ("running_mean", running_mean),
                                       ("running_var", running_var)))
    if training and input.numel() == 0 and not allow_empty:
        raise RuntimeError(
            "input tensor must have at least one element, but got input_sizes = "
            f"{_shape(input)}"
        )


def check_running_stats_need_no_grad(running_mean: Optional[Tensor], running_var: Optional[Tensor]) -> None:
    """The autograd kernel of ``native_batch_norm`` refuses running stats that require grad while grad mode is on
    (they are updated in place, never differentiated)."""
    if not torch.is_grad_enabled():
        return
    for name, stat in (("running_mean", running_mean), ("running_var", running_var)):
        if stat is not None and stat.requires_grad:
            raise RuntimeError(f"The function 'native_batch_norm' is not differentiable with respect to argument "
                               f"'{name}'. This input cannot have requires_grad True.")


def check_weight_required(weight: Optional[Tensor], arg_index: int = 2, name: str = "weight") -> None:
    """aten ops whose schema says ``Tensor weight`` (``batch_norm_backward``, ``cudnn_batch_norm``)."""
    if weight is None:
        raise RuntimeError(
            "Expected a proper Tensor but got None (or an undefined Tensor in C++) for argument "
            f"#{arg_index} '{name}'"
        )


def check_batch_norm_backward(
    grad_out: Tensor,
    input: Tensor,
    weight: Optional[Tensor],
    running_mean: Optional[Tensor],
    running_var: Optional[Tensor],
    save_mean: Optional[Tensor],
    save_invstd: Optional[Tensor],
    train: bool,
    *,
    kernel: str = "batch_norm_backward_cpu",
) -> None:
    """``native_batch_norm_backward`` / ``batch_norm_backward``.

    Training needs the saved stats (size C); eval needs the running stats (size C) and accepts saved
    stats that are empty or filled. Raw aten crashes on the missing ones; normkit raises instead.
    """
    # hot under enable(), as check_batch_norm
    if input.dim() < 2:
        check_channel_dim(input)
    c = input.shape[1]
    if train:
        for name, stat in (("save_mean", save_mean), ("save_invstd", save_invstd)):
            if stat is None:
                raise RuntimeError(f"{name} must be defined in training mode")
            if stat.numel() != c:
                _check_numel(name, stat, c)
    else:
        for name, stat in (("running_mean", running_mean), ("running_var", running_var)):
            if stat is None:
                raise RuntimeError(f"{name} must be defined in evaluation mode")
            if stat.numel() != c:
                _check_numel(name, stat, c)
    if weight is not None and weight.numel() != c:
        _check_numel("weight", weight, c)
    if input.dtype not in _FLOATING:
        check_floating(input, kernel)
    _check_grad_dtype(grad_out, input)
    if grad_out.shape != input.shape:
        raise RuntimeError(
            f"Expected grad_out to have the same shape as input, but got grad_out of shape "
            f"{_shape(grad_out)} and input of shape {_shape(input)}"
        )


def check_batch_norm_update_stats(input: Tensor, running_mean, running_var) -> None:
    """``batch_norm_update_stats``: torch accepts one running stat alone here (it updates that one)."""
    check_channel_dim(input)
    c = input.shape[1]
    for name, stat in (("running_mean", running_mean), ("running_var", running_var)):
        if stat is not None:
            _check_numel(name, stat, c)
    check_floating(input, "batch_norm_update_stats_cpu")
    if input.numel() == 0:
        raise RuntimeError(
            "input tensor must have at least one element, but got input_sizes = "
            f"{_shape(input)}"
        )


# --------------------------------------------------------------------------------------------------
# Batch norm: functional level (torch/nn/functional.py)
# --------------------------------------------------------------------------------------------------


def verify_batch_size(size) -> None:
    """``F._verify_batch_size``: training needs more than one value per channel.

    ``size`` is printed as given: ``input.size()`` prints ``torch.Size([1, 3])``, a list prints ``[1, 3]``
    (``F.group_norm`` passes a list), an int prints as an int (SyncBatchNorm).
    """
    if isinstance(size, int):
        prod = size
    else:
        prod = size[0]
        for s in size[2:]:
            prod *= s
    if prod == 1:
        raise ValueError(f"Expected more than 1 value per channel when training, got input size {size}")


def check_batch_norm_functional(input: Tensor, running_mean, running_var, weight, bias, training: bool,
                                eps) -> bool:
    """All of ``F.batch_norm``'s checks in its order; returns False when aten would return early.

    batch size (training), eps sign, then ``torch.batch_norm``'s: an empty input returns ``input``-shaped
    output without any further check (the caller must skip the op and running-stat update), otherwise
    the aten-level ``check_batch_norm``.
    """
    if training:
        verify_batch_size(input.size())
    check_batch_norm_eps(eps, training)
    if input.numel() == 0:
        return False
    check_batch_norm(input, weight, bias, running_mean, running_var, training, functional=True)
    return True


def _probe_eps_zero_in_eval() -> bool:
    """torch 2.13's F.batch_norm takes eps = 0 in eval (eps > 0 only in training); torch 2.11's rejects
    eps <= 0 in either mode, with another message. Asked of the installed torch on the CPU."""
    stat = torch.ones(1)
    try:
        torch.nn.functional.batch_norm(torch.ones(2, 1), stat, stat.clone(), training=False, eps=0.0)
    except ValueError:
        return True
    return False


# Asked at import: a first ask inside torch.compile would be traced with fake tensors and raise there.
_REJECTS_EPS_ZERO_IN_EVAL = _probe_eps_zero_in_eval()


def batch_norm_eps_error(eps, training: bool) -> Optional[str]:
    """The installed torch's ``F.batch_norm`` message for this eps, None where it accepts it (eps is
    printed as passed: 0 or 0.0)."""
    if _REJECTS_EPS_ZERO_IN_EVAL:
        return f"batch_norm eps must be positive, but got {eps}" if eps <= 0.0 else None
    if training and eps <= 0.0:
        return f"batch_norm eps must be positive during training, but got {eps}"
    if eps < 0.0:
        return f"batch_norm eps must be non-negative, but got {eps}"
    return None


def check_batch_norm_eps(eps, training: bool) -> None:
    """``F.batch_norm``'s eps check, as the installed torch makes it (``batch_norm_eps_error``)."""
    message = batch_norm_eps_error(eps, training)
    if message is not None:
        raise ValueError(message)


# --------------------------------------------------------------------------------------------------
# SyncBatchNorm primitives (CUDA-only in torch; normkit runs them anywhere)
# --------------------------------------------------------------------------------------------------


def check_batch_norm_stats(input: Tensor) -> None:
    check_channel_dim(input)
    check_floating(input, "batch_norm_stats")


def check_batch_norm_gather_stats(input: Tensor, mean: Tensor, invstd: Tensor, running_mean, running_var,
                                  counts: Tensor) -> None:
    """Shape checks of newer torch sources: mean 2-D (world, C), invstd like mean, one count per row."""
    if mean.dim() != 2:
        raise RuntimeError(f"Expected mean to be a 2-D tensor, but got {mean.dim()}-D")
    if invstd.shape != mean.shape:
        raise RuntimeError(
            f"Expected invstd to have the same shape as mean, but got {_shape(invstd)} and {_shape(mean)}"
        )
    if counts.numel() < mean.shape[0]:
        raise RuntimeError(
            f"Expected counts to have at least {mean.shape[0]} elements, but got {counts.numel()}"
        )
    c = mean.shape[1]
    for name, stat in (("running_mean", running_mean), ("running_var", running_var)):
        if stat is not None:
            _check_numel(name, stat, c)
    check_floating(mean, "batch_norm_update_stats_cuda")


def _check_mean_invstd(input: Tensor, mean: Tensor, invstd: Tensor) -> None:
    check_channel_dim(input)
    c = input.shape[1]
    _check_numel("mean", mean, c)
    _check_numel("invstd", invstd, c)
    if mean.dtype != invstd.dtype:
        raise RuntimeError("mean and invstd need to have the same data types")


def check_batch_norm_elemt(input: Tensor, weight, bias, mean: Tensor, invstd: Tensor) -> None:
    _check_mean_invstd(input, mean, invstd)
    c = input.shape[1]
    for name, param in (("weight", weight), ("bias", bias)):
        if param is not None:
            _check_numel(name, param, c)
    check_floating(input, "batch_norm_elementwise_cuda")


def check_batch_norm_backward_reduce(grad_out: Tensor, input: Tensor, mean: Tensor, invstd: Tensor,
                                     weight) -> None:
    _check_mean_invstd(input, mean, invstd)
    if weight is not None:
        _check_numel("weight", weight, input.shape[1])
    check_floating(input, "batch_norm_backward_reduce")
    if grad_out.shape != input.shape:
        raise RuntimeError(
            f"Expected grad_out to have the same shape as input, but got grad_out of shape "
            f"{_shape(grad_out)} and input of shape {_shape(input)}"
        )


def check_batch_norm_backward_elemt(grad_out: Tensor, input: Tensor, mean: Tensor, invstd: Tensor,
                                    weight, sum_dy: Tensor, sum_dy_xmu: Tensor) -> None:
    check_batch_norm_backward_reduce(grad_out, input, mean, invstd, weight)
    _check_numel("sum_dy", sum_dy, input.shape[1])
    _check_numel("sum_dy_xmu", sum_dy_xmu, input.shape[1])


# --------------------------------------------------------------------------------------------------
# Layer norm and RMS norm
# --------------------------------------------------------------------------------------------------


def _check_normalized_shape(input: Tensor, normalized_shape: Sequence[int], params, star: str) -> None:
    # Mirrors aten's _check_layer_norm_inputs / _check_rms_norm_inputs; `star` is "*, " for layer norm
    # and "*" for rms norm (torch's rms message lacks the comma).
    ns = [int(s) for s in normalized_shape]
    if len(ns) < 1:
        raise RuntimeError(
            "Expected normalized_shape to be at least 1-dimensional, i.e., containing at least one "
            f"element, but got normalized_shape = {ns}"
        )
    for name, p in params:
        if p is not None and [int(s) for s in p.shape] != ns:
            raise RuntimeError(
                f"Expected {name} to be of same shape as normalized_shape, but got {name} of shape "
                f"{_shape(p)} and normalized_shape = {ns}"
            )
    shape = _shape(input)
    if len(shape) < len(ns) or shape[len(shape) - len(ns):] != ns:
        expected = "[" + star + ", ".join(str(s) for s in ns) + "]"
        raise RuntimeError(
            f"Given normalized_shape={ns}, expected input with shape {expected}, but got input of "
            f"size{shape}"
        )


def check_layer_norm(input: Tensor, normalized_shape, weight, bias) -> None:
    """``native_layer_norm`` (and ``F.layer_norm``, which adds nothing)."""
    _check_normalized_shape(input, normalized_shape, (("weight", weight), ("bias", bias)), "*, ")
    check_floating(input, "LayerNormKernelImpl")
    _param_dtype_error(input, (("weight", weight), ("bias", bias)))


def check_layer_norm_backward(grad_out: Tensor, input: Tensor, normalized_shape, mean: Tensor, rstd: Tensor,
                              weight, bias) -> None:
    _check_normalized_shape(input, normalized_shape, (("weight", weight), ("bias", bias)), "*, ")
    check_floating(input, "LayerNormBackwardKernelImpl")
    _check_row_backward(grad_out, input, normalized_shape, (("mean", mean), ("rstd", rstd)))
    _check_grad_dtype(grad_out, input)


def _check_grad_dtype(grad_out: Tensor, input: Tensor) -> None:
    """aten's batch / layer norm backward kernels read dY as X's type (their data_ptr<T> check)."""
    if grad_out.dtype != input.dtype:
        raise RuntimeError(
            f"expected scalar type {dtype_name(input.dtype)} but found {dtype_name(grad_out.dtype)}"
        )


def _check_row_backward(grad_out: Tensor, input: Tensor, normalized_shape, stats) -> None:
    """Layer/RMS norm backward: grad_out shaped like input, one saved statistic per row."""
    if grad_out.shape != input.shape:
        raise RuntimeError(
            f"Expected grad_out to have the same shape as input, but got grad_out of shape "
            f"{_shape(grad_out)} and input of shape {_shape(input)}"
        )
    rows = math.prod(input.shape[: input.dim() - len(normalized_shape)])
    for name, stat in stats:
        if stat.numel() != rows:
            raise RuntimeError(f"{name} should contain {rows} elements not {stat.numel()}")


def check_rms_norm(input: Tensor, normalized_shape, weight) -> None:
    """``rms_norm`` / ``_fused_rms_norm`` (torch's fused op skips the shape checks on CPU; normkit doesn't)."""
    _check_normalized_shape(input, normalized_shape, (("weight", weight),), "*")
    check_floating(input, "rms_norm", allow_complex=True)


def check_rms_norm_backward(grad_out: Tensor, input: Tensor, normalized_shape, rstd: Tensor, weight) -> None:
    _check_normalized_shape(input, normalized_shape, (("weight", weight),), "*")
    check_floating(input, "rms_norm")
    _check_row_backward(grad_out, input, normalized_shape, (("rstd", rstd),))


# --------------------------------------------------------------------------------------------------
# Group norm
# --------------------------------------------------------------------------------------------------


def _check_group_norm_inputs(input: Tensor, weight, bias, C: int, group: int) -> None:
    if group <= 0:
        raise RuntimeError(f"Expected num groups to be greater than 0, got {group}")
    if C % group != 0:
        raise RuntimeError(
            "Expected number of channels in input to be divisible by num_groups, but got input of shape "
            f"{_shape(input)} and num_groups={group}"
        )
    if weight is not None and not (weight.dim() == 1 and weight.numel() == C):
        raise RuntimeError(
            "Expected weight to be a vector of size equal to the number of channels in input, but got "
            f"weight of shape {_shape(weight)} and input of shape {_shape(input)}"
        )
    if bias is not None and not (bias.dim() == 1 and bias.numel() == C):
        # torch prints the *weight's* shape here (a long-standing aten bug; [0] when weight is None).
        raise RuntimeError(
            "Expected bias to be a vector of size equal to the number of channels in input, but got "
            f"bias of shape {_shape(weight)} and input of shape {_shape(input)}"
        )


def check_group_norm(input: Tensor, weight, bias, N: int, C: int, HxW: int, group: int) -> None:
    """``native_group_norm``. Unlike aten on CPU, any input strides are accepted."""
    _check_group_norm_inputs(input, weight, bias, C, group)
    _check_true(input.numel() == N * C * HxW, "X.numel() == N * C * HxW")
    check_floating(input, "GroupNormKernelImpl")
    _param_dtype_error(input, (("weight", weight), ("bias", bias)))


def _check_true(ok: bool, condition: str) -> None:
    """A bare ``TORCH_CHECK(condition)``'s message."""
    if not ok:
        raise RuntimeError(f"Expected {condition} to be true, but got false.  (Could this error message be improved?  "
                           "If so, please report an enhancement request to PyTorch.)")


def check_group_norm_backward(grad_out: Tensor, input: Tensor, mean: Tensor, rstd: Tensor, weight,
                              N: int, C: int, HxW: int, group: int) -> None:
    """``native_group_norm_backward``: aten's kernel checks, which go by element counts (any shapes of those
    counts), after a group count that divides C (aten's kernels would divide by zero or misread the groups)."""
    _check_group_norm_inputs(input, None, None, C, group)
    if grad_out.dtype != input.dtype:
        raise RuntimeError("Expected scalar types of X and dY are same.")
    _check_true(grad_out.numel() == N * C * HxW, "dY.numel() == N * C * HxW")
    _check_true(input.numel() == N * C * HxW, "X.numel() == N * C * HxW")
    _check_true(mean.numel() == N * group, "mean.numel() == N * group")
    _check_true(rstd.numel() == N * group, "rstd.numel() == N * group")
    _check_true(weight is None or weight.numel() == C, "!gamma.defined() || gamma.numel() == C")
    check_floating(input, "GroupNormBackwardKernelImpl")


def check_group_norm_functional(input: Tensor, num_groups: int) -> None:
    """``F.group_norm``'s own checks, before aten's: rank, then group size (always, not only training)."""
    if input.dim() < 2:
        raise RuntimeError(f"Expected at least 2 dimensions for input tensor but received {input.dim()}")
    shape = list(input.shape)  # (a zero num_groups: the division raises what F.group_norm's does, by its type)
    verify_batch_size([shape[0] * shape[1] // num_groups, num_groups] + shape[2:])


# --------------------------------------------------------------------------------------------------
# Instance norm
# --------------------------------------------------------------------------------------------------


def check_instance_norm(input: Tensor, weight, bias, running_mean, running_var, use_input_stats: bool) -> None:
    """``instance_norm``: its own running-stat rule, then batch norm's checks on the (1, N*C, *) view.

    Sizes are reported as torch does, after repeating C-sized parameters N times
    (``weight should contain 6 elements not 8`` for N=2, C=3, weight of 4).
    """
    if not use_input_stats and (running_mean is None or running_var is None):
        raise RuntimeError("Expected running_mean and running_var to be defined when use_input_stats is false")
    check_channel_dim(input)
    n, c = input.shape[0], input.shape[1]
    if any(t is not None and t.dim() > 1 for t in (weight, bias, running_mean, running_var)):
        # aten repeats each of them N times along one dim
        raise RuntimeError("Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor")
    for name, t in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight),
                    ("bias", bias)):
        if t is not None and t.numel() * n != n * c:
            raise RuntimeError(f"{name} should contain {n * c} elements not {t.numel() * n}")
    if input.numel():
        check_running_stats_need_no_grad(running_mean, running_var)  # (their repeats reach native_batch_norm)
    elif use_input_stats and torch.is_grad_enabled() and any(
            t is not None and t.requires_grad and t.is_leaf for t in (running_mean, running_var)):
        # an empty batch skips batch norm; aten then writes the stats back through a view, which autograd refuses
        raise RuntimeError("a view of a leaf Variable that requires grad is being used in an in-place operation.")
    check_batch_norm_running_stats(running_mean, running_var)
    if input.numel():  # (aten's batch norm returns an empty input before its dtype checks)
        check_floating(input, "batch_norm")
        _param_dtype_error(input, (("weight", weight), ("bias", bias), ("running_mean", running_mean),
                                   ("running_var", running_var)))
    elif (use_input_stats and (running_mean is not None or running_var is not None)
          and not (input.is_floating_point() or input.is_complex())):
        # an empty batch's running-stat write-back takes the mean of the (empty) input statistics in its dtype
        raise RuntimeError("mean(): could not infer output dtype. Input dtype must be either a floating point or "
                           f"complex dtype. Got: {dtype_name(input.dtype)}")


def verify_spatial_size(size) -> None:
    """``F._verify_spatial_size``: instance norm with input stats needs more than 1 spatial element."""
    prod = 1
    for s in list(size)[2:]:
        prod *= s
    if prod == 1:
        raise ValueError(f"Expected more than 1 spatial element when training, got input size {size}")
