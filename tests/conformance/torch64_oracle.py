"""A stand-in float64 oracle for the checker's own tests: torch's CPU aten kernels in float64.

The shipped checker uses normkit.reference; these tests use this module so that they judge the
checker alone (it is what normkit.reference must match on every case, issue 2).
"""

import torch

A = torch.ops.aten


def _cpu64(t):
    return None if t is None else t.detach().to("cpu", torch.float64)


def native_batch_norm(x, w, b, rm, rv, training, momentum, eps):
    if not training and (rm is None or rv is None):
        raise RuntimeError("running_mean must be defined in evaluation mode")
    return A.native_batch_norm(x, w, b, rm, rv, training, momentum, eps)


def native_batch_norm_backward(g, x, w, rm, rv, sm, si, train, eps, mask):
    if not train:  # eval: use the running stats (saved stats may be empty or filled)
        sm = si = None
        if rm is None or rv is None:
            raise RuntimeError("running_mean must be defined in evaluation mode")
    return A.native_batch_norm_backward(g, x, w, rm, rv, sm, si, train, eps, mask)


def batch_norm_update_stats(x, rm, rv, momentum):
    return A.batch_norm_update_stats(x, rm, rv, momentum)


def native_layer_norm(x, ns, w, b, eps):
    return A.native_layer_norm(x, ns, w, b, eps)


def native_layer_norm_backward(g, x, ns, mean, rstd, w, b, mask):
    return A.native_layer_norm_backward(g, x, ns, mean, rstd, w, b, mask)


def _opmath_eps(x):
    return torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps


def _fused_rms_norm(x, ns, w, eps):
    if eps is None:
        eps = _opmath_eps(x)
    dims = list(range(x.dim() - len(ns), x.dim()))
    rstd = torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + eps)
    y = x * rstd
    if w is not None:
        y = y * w
    return y, rstd


def _fused_rms_norm_backward(g, x, ns, rstd, w, mask):
    dims = list(range(x.dim() - len(ns), x.dim()))
    n = 1
    for s in ns:
        n *= s
    gw = g * w if w is not None else g
    xhat = x * rstd
    dx = rstd * (gw - xhat * (gw * xhat).sum(dims, keepdim=True) / n)
    batch = list(range(0, x.dim() - len(ns)))
    dw = None
    if mask[1] and w is not None:
        dw = (g * xhat).sum(batch) if batch else g * xhat
    return (dx if mask[0] else None), dw


def native_group_norm(x, w, b, N, C, HxW, G, eps):
    return A.native_group_norm(x.contiguous(), w, b, N, C, HxW, G, eps)


def native_group_norm_backward(g, x, mean, rstd, w, N, C, HxW, G, mask):
    return A.native_group_norm_backward(g.contiguous(), x.contiguous(), mean, rstd, w, N, C, HxW, G, mask)
