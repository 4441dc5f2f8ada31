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


# SyncBatchNorm primitives (contract §3): torch has no CPU kernels for them, so here they are written out
# directly from the contract's formulas, independently of normkit.reference.

def _bdims(x):
    return [0] + list(range(2, x.dim()))


def _cv(t, x):
    return t.reshape([1, -1] + [1] * (x.dim() - 2))


def batch_norm_stats(x, eps):
    var, mean = torch.var_mean(x.double(), _bdims(x), unbiased=False)
    return mean, torch.rsqrt(var + eps)


def batch_norm_gather_stats_with_counts(x, mean, invstd, rm, rv, momentum, eps, counts):
    n_r = counts.double()[: mean.shape[0]].unsqueeze(1)
    n = n_r.sum(0)
    gmean = (n_r * mean).sum(0) / n
    m2 = (n_r * (1.0 / invstd ** 2 - eps + (mean - gmean) ** 2)).sum(0)
    with torch.no_grad():
        if rm is not None:
            rm.copy_((1 - momentum) * rm + momentum * gmean)
        if rv is not None:
            rv.copy_((1 - momentum) * rv + momentum * m2 / (n - 1))
    return gmean, torch.rsqrt(m2 / n + eps)


def batch_norm_gather_stats(x, mean, invstd, rm, rv, momentum, eps, count):
    counts = torch.full((mean.shape[0],), float(count), dtype=torch.float64)
    return batch_norm_gather_stats_with_counts(x, mean, invstd, rm, rv, momentum, eps, counts)


def batch_norm_elemt(x, w, b, mean, invstd, eps):
    y = (x - _cv(mean, x)) * _cv(invstd, x)
    if w is not None:
        y = y * _cv(w, x)
    if b is not None:
        y = y + _cv(b, x)
    return y


def batch_norm_backward_reduce(g, x, mean, invstd, w, input_g, weight_g, bias_g):
    sum_dy = g.sum(_bdims(x))
    sum_dy_xmu = (g * (x - _cv(mean, x))).sum(_bdims(x))
    return (sum_dy if input_g else None, sum_dy_xmu if input_g else None,
            sum_dy_xmu * invstd if weight_g else None, sum_dy if bias_g else None)


def batch_norm_backward_elemt(g, x, mean, invstd, w, sum_dy, sum_dy_xmu, count):
    n = count.double().sum()
    scale = invstd if w is None else invstd * w
    xmu = x - _cv(mean, x)
    return (g - _cv(sum_dy / n, x) - xmu * _cv(invstd ** 2 * sum_dy_xmu / n, x)) * _cv(scale, x)
