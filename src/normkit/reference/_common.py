"""Helpers shared by the reference modules: compute dtype, memory format, broadcasting views."""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
from torch import Tensor


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype statistics are computed and saved in: float64 for float64, float32 for everything else.

    This is CUDA's ``acc_type`` and normkit's convention on every device (torch's CPU kernels save
    bf16/fp16 statistics for non-mixed bf16/fp16 inputs; normkit keeps them in float32). Complex inputs
    (rms_norm only) compute in their own precision, complex32 widened to complex64.
    """
    if dtype == torch.float64:
        return torch.float64
    if dtype.is_complex:
        return torch.complex128 if dtype == torch.complex128 else torch.complex64
    return torch.float32


def opmath_dtype(input: Tensor) -> torch.dtype:
    """Dtype the reference computes in: float64 (complex128) wherever the device has it.

    The reference is the oracle and the CPU path, so it rounds once, at the end: statistics are computed
    in double (as torch's CPU kernels do for fp32 inputs) and cast to ``acc_dtype`` only when returned.
    A constant channel then has exactly zero variance, and a +1000 offset costs no digits. MPS has no
    float64: there it computes in ``acc_dtype``.
    """
    if input.device.type == "mps":
        return acc_dtype(input.dtype)
    return torch.complex128 if input.dtype.is_complex else torch.float64


def suggest_memory_format(t: Tensor) -> torch.memory_format:
    """Python port of C++ ``Tensor::suggest_memory_format()`` (no such method in Python)."""
    if t.layout != torch.strided or t.dim() not in (4, 5):
        return torch.contiguous_format
    sizes, strides = t.shape, t.stride()
    # Channels-last orders dims C, W, (H,) D..., N from the fastest to the slowest stride.
    order = (1, 3, 2, 0) if t.dim() == 4 else (1, 4, 3, 2, 0)
    if strides[1] == 0:
        return torch.contiguous_format
    lowest = 0
    for d in order:
        if sizes[d] == 0 or strides[d] < lowest:
            return torch.contiguous_format
        # N111-like tensors with equal strides are ambiguous: torch defaults to NCHW.
        if d == 0 and lowest == strides[1]:
            return torch.contiguous_format
        lowest = strides[d] * sizes[d]
    return torch.channels_last if t.dim() == 4 else torch.channels_last_3d


def dense_memory_format(t: Tensor) -> torch.memory_format:
    """The layout batch-norm outputs take: a channels_last / channels_last_3d dense input keeps it (torch's CPU
    kernels and CUDA's ``empty_like`` do), also where ``suggest_memory_format`` calls it contiguous (an
    ambiguous (1, C, 1, W) input with channels_last strides); anything else: ``suggest_memory_format``."""
    if t.layout == torch.strided and not t.is_contiguous():
        if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
            return torch.channels_last
        if t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d):
            return torch.channels_last_3d
    return suggest_memory_format(t)


def to_format(y: Tensor, memory_format: torch.memory_format) -> Tensor:
    """``y`` laid out in ``memory_format`` (differentiable; no copy when already laid out so)."""
    return y.contiguous(memory_format=memory_format)


def channel_view(t: Tensor, ndim: int) -> Tensor:
    """A per-channel (C,) tensor shaped (1, C, 1, ...) to broadcast over an (N, C, *) input."""
    return t.reshape([1, -1] + [1] * (ndim - 2))


def batch_dims(ndim: int) -> list:
    """Reduction dims of batch norm: every dim except the channel dim 1."""
    return [0] + list(range(2, ndim))


def param_dtype(param: Optional[Tensor], input: Tensor) -> torch.dtype:
    """Dtype of a parameter's gradient: the parameter's own, the input's when it is absent."""
    return input.dtype if param is None else param.dtype


def affine_grad_dtype(input: Tensor, *params: Optional[Tensor]) -> torch.dtype:
    """Dtype of batch / group norm's grad_weight and grad_bias: that of the first defined of ``params`` (the
    weight, then the statistics the backward op receives, in its argument order), the input's when none is.

    aten decides "mixed" by the first defined parameter (contract §1.1), and these backward ops never see the
    bias: with weight None, the fp32 statistics of a bf16 / fp16 input with an fp32 bias are what make the call
    mixed and its grad_bias fp32 (torch's CPU kernels). ``param_dtype(weight, input)`` gave the input's dtype
    there: the fp32 bias got a 16-bit-rounded gradient (~1e-3 relative).
    """
    for p in params:
        if p is not None:
            return p.dtype
    return input.dtype


def empty_stat(input: Tensor, dtype: torch.dtype) -> Tensor:
    """The (0,) saved statistic of eval mode (normkit's choice on every device, as on CPU/MPS)."""
    return input.new_empty((0,), dtype=dtype)


def invstd_from_var(var: Tensor, eps: float) -> Tensor:
    """``rsqrt(var + eps)``, with torch's batch-norm ``InvStd`` guard: var == 0 and eps == 0 give 0, not inf.

    The guard keeps a constant channel's output at ``bias`` instead of NaN (CPU eager behaviour). Both
    ``where`` branches stay finite so the gradient of the unused branch is not NaN.
    """
    if eps != 0:
        return torch.rsqrt(var + eps)
    zero = var == 0
    return torch.where(zero, torch.zeros_like(var), torch.rsqrt(torch.where(zero, torch.ones_like(var), var)))


def dims_are_nc(t: Tensor, N: int, C: int) -> bool:
    """Whether t's dims 0 and 1 are a group-norm caller's N and C. aten reads group norm's tensors as (N, C, HxW) by
    element count alone, so a caller may pass another shape of the same numel (the results then take that shape)."""
    return t.dim() >= 2 and t.shape[0] == N and t.shape[1] == C


def write_running_stat(running: Tensor, value: Tensor) -> None:
    """running[...] = value in place without bumping running's autograd version, as aten's kernels write running
    statistics: an eval-mode batch norm saved them for its backward, and a training step in between must not make
    that backward raise (torch's does not). An inference tensor (made under torch.inference_mode) has no version
    counter to preserve: it is written plainly."""
    keep_version = (contextlib.nullcontext() if running.is_inference()
                    else torch.autograd._unsafe_preserve_version_counter(running))
    with torch.no_grad(), keep_version:
        running.copy_(value)
