"""Small helpers shared by the runner and the per-family checks.

Upcasting to the float64 oracle (`up`), detached copies (`_clone`) and gradient leaves (`_leaf`), the
accumulation dtype of reduced-precision inputs (`_acc`), the dtype the backward ops give grad_weight /
grad_bias (`_affine_grad_dtype`), the functional-API baseline through torch
(`_f_torch`), and `_NotOnDevice`, raised where an op has no kernel on the device under test.
"""

from __future__ import annotations

import torch


def up(t):
    """Upcast to float64 on the CPU (exact for every float dtype); None stays None."""
    if t is None:
        return None
    return t.detach().to("cpu", torch.float64, copy=True)


def _clone(t):
    return None if t is None else t.detach().clone()


def _acc(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _affine_grad_dtype(x, *params):
    """Expected dtype of batch / group norm's aten-level grad_weight and grad_bias (contract §1.1, §2.6): that
    of the first defined of ``params`` (the weight, then the statistics the backward op was passed, in its
    argument order), x's when none is. The backward never sees the bias: with weight None, fp32 statistics
    of a bf16 / fp16 input (a mixed call) make them fp32. Judged by what each implementation's backward
    received: its own saved statistics (fp32 for a 16-bit input in normkit, the input's dtype on torch's CPU
    for a non-mixed call; both allowed)."""
    for p in params:
        if p is not None:
            return p.dtype
    return x.dtype


class _NotOnDevice(Exception):
    def __init__(self, op):
        super().__init__(op)
        self.op = op


def _leaf(t):
    if t is None:
        return None
    return t.detach().clone().requires_grad_(True) if t.is_floating_point() else t


def _f_torch(name, I, args, kwargs, bias):
    F = torch.nn.functional
    x, w = _leaf(I["x"]), _leaf(I["weight"])
    leaves = [x, w]
    if bias:
        b = _leaf(I["bias"])
        leaves.append(b)
        out = getattr(F, name)(x, *args, weight=w, bias=b, **kwargs)
    else:
        out = getattr(F, name)(x, *args, weight=w, **kwargs)
    out.backward(I["grad_out"])
    return out.detach(), [t.grad if t is not None else None for t in leaves]


def _f_with_running_stats_torch(name, I, case):
    """torch's F.batch_norm / F.instance_norm (running stats second) with autograd: (out, stats, grads)."""
    x, w, b = _leaf(I["x"]), _leaf(I["weight"]), _leaf(I["bias"])
    rm, rv = _clone(I["running_mean"]), _clone(I["running_var"])
    out = getattr(torch.nn.functional, name)(x, rm, rv, w, b, case.training, case.momentum, case.eps)
    out.backward(I["grad_out"])
    return out.detach(), (rm, rv), [t.grad if t is not None else None for t in (x, w, b)]
