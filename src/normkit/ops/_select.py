"""Which implementation runs: the Triton kernels or the reference. Lazy imports keep `import normkit` light."""

from __future__ import annotations

import importlib

import torch

# tensors of these exact types take normkit's path under enable() (a subclass may change what an op means)
PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)

_FAMILY_MODULE = {"batch_norm": "normkit.kernels.batch_norm", "layer_norm": "normkit.kernels.layer_norm",
                  "rms_norm": "normkit.kernels.layer_norm", "group_norm": "normkit.kernels.group_norm",
                  "layout": "normkit.kernels.layout"}
_modules: dict = {}


def kernel_module(family: str):
    """The kernel launcher module for an op family, or None when Triton (or the module) is missing."""
    if family in _modules:
        return _modules[family]
    from normkit import kernels

    mod = None
    if kernels.available():
        try:
            mod = importlib.import_module(_FAMILY_MODULE[family])
        except ImportError:
            mod = None
    if mod is not None:  # cache hits only: a module landing later is still picked up
        _modules[family] = mod
    return mod


def kernels_for(family: str, x: torch.Tensor):
    """The kernel module when normkit's kernels handle tensors on x's device and dtype, else None.

    float64 is declined: Triton passes eps as an fp32 scalar, ~1e-8 relative error in invstd/rstd, at
    or past fp64 tolerances. fp64 has no performance target, so it runs the reference (under
    ``enable()``: ATen's own kernel) until the kernels take an fp64 eps.
    """
    if not isinstance(x, torch.Tensor) or x.dtype == torch.float64:
        return None
    if family in _modules and x.is_cuda:  # fast path (per-call overhead matters at small sizes)
        return _modules[family]
    from normkit import kernels

    if x.device.type == "cpu" and not kernels.interpreting():
        return None  # the reference runs; don't import Triton for nothing
    if not kernels.runs_kernels_on(x):
        return None
    return kernel_module(family)


def reference():
    import normkit.reference as ref

    return ref


def params_ok(x: torch.Tensor, *params) -> bool:
    """Parameters the kernels take: on x's device, in x's dtype or float32, 1-D."""
    dev, dt = x.get_device(), x.dtype
    for p in params:
        if p is not None and not (isinstance(p, torch.Tensor) and p.get_device() == dev
                                  and (p.dtype is dt or p.dtype is torch.float32)):
            return False
    return True
