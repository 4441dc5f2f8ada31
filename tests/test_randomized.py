"""Randomized differential test: normkit's public API against torch's own CPU ops run in float64.

Every case draws an input a user might plausibly pass (op, dtype, parameter dtype, weight/bias/running
statistics present or not, train/eval, momentum, eps, odd shapes, memory layouts and views, values
``randn * scale + offset``), runs normkit's public API (``normkit.batch_norm``, ``layer_norm``,
``rms_norm``, ``group_norm``, ``instance_norm``, the ``normkit.nn`` modules) forward and backward through
autograd, and compares output, input / weight / bias gradients, running statistics and (for some cases)
the saved statistics of the aten-named ops with ``torch.nn.functional`` run in float64 on the same rounded
inputs. Without CUDA the kernels run under Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1).

Seeds: a fresh base seed from ``os.urandom`` each run; every assertion message carries the base seed, the
case id and the drawn case. Replay with ``NORMKIT_RANDOM_SEED=<seed> pytest
'tests/test_randomized.py::test_randomized[<case id>]'``. ``NORMKIT_RANDOM_CASES=<factor>`` multiplies the number of cases (bug hunting; the default
keeps the file well under 90 s on a 2-core CPU under the interpreter).

Device: the cases are drawn on the CPU; ``NORMKIT_RANDOM_DEVICE=cuda`` (default ``cpu``) hands normkit CUDA
copies of every tensor with the CPU tensor's sizes, strides and storage offset (``to_device``), while the
float64 oracle stays on the CPU. ``test_randomized_cuda`` (marked ``cuda``, skipped without CUDA) runs 3x
the CPU case counts (times ``NORMKIT_RANDOM_CASES``) on CUDA whatever the variable says:
``python -m pytest tests/test_randomized.py -m cuda``.

Tolerances are those of tests/kernels (relative L2 per input dtype; grad_input against the size of the
terms that cancel; parameter gradients at the looser of the input's and the parameter's dtype), plus, where
the statistics subtract a mean, the rounding of the float32 mean itself: ``4·eps32·|mean|/std`` relative
(the allowance tests/kernels/test_group_norm_kernels.py makes for the +1000 offsets).
"""

import copy
import math
import os
import random
import zlib

import pytest
import torch
import torch.nn.functional as F

import normkit
from normkit.kernels import batch_norm as KB

F32, F16, BF16, F64 = torch.float32, torch.float16, torch.bfloat16, torch.float64
EPS32 = torch.finfo(F32).eps

TOL = {F32: 2e-6, F16: 2e-3, BF16: 1.2e-2}
TOL_BWD_BN = {F32: 1e-5, F16: 4e-3, BF16: 2e-2}
TOL_BWD = {F32: 1e-4, F16: 4e-3, BF16: 2e-2}  # layer / RMS / group norm (tests/kernels)
TOL_STAT = 1e-6  # fp32 statistics of any input dtype (relative)
TOL_RUNNING = {F32: 1e-6, F16: 8e-3, BF16: 8e-3}  # by the running statistics' dtype

_env_seed = os.environ.get("NORMKIT_RANDOM_SEED")
BASE_SEED = int(_env_seed) if _env_seed else int.from_bytes(os.urandom(4), "little")
FACTOR = float(os.environ.get("NORMKIT_RANDOM_CASES", "1"))
DEVICE = os.environ.get("NORMKIT_RANDOM_DEVICE", "cpu")  # where normkit runs; the oracle stays on the CPU
CUDA_MULT = 3  # the CUDA test's case counts, relative to the CPU's

N_CASES = {"batch_norm": 80, "layer_norm": 50, "rms_norm": 40, "add_norm": 30, "group_norm": 50,
           "instance_norm": 30, "module": 20}


def _case_ids(op, mult=1):
    return [f"{op}-{i}" for i in range(max(1, int(round(N_CASES[op] * mult * FACTOR))))]


def _seed(case_id):
    return zlib.crc32(f"{BASE_SEED}:{case_id}".encode())


# ------------------------------------------------------------------------------------------------ helpers


class Ctx:
    """The case's description and an assertion helper whose message tells how to replay it."""

    def __init__(self, case_id, desc, device="cpu"):
        self.case_id = case_id
        self.desc = desc
        self.device = str(device)

    def msg(self, what):
        cases = os.environ.get("NORMKIT_RANDOM_CASES")
        env = f"NORMKIT_RANDOM_SEED={BASE_SEED}" + (f" NORMKIT_RANDOM_CASES={cases}" if cases else "")
        test = "test_randomized" if self.device == "cpu" else "test_randomized_cuda"
        return (f"{what}\n  replay ({self.device}): {env} python -m pytest "
                f"'tests/test_randomized.py::{test}[{self.case_id}]'\n  case: {self.desc}")

    def check(self, cond, what):
        assert cond, self.msg(what)

    def close(self, got, ref, tol, what, den=None, slack=0.0):
        """||got - ref|| <= tol·den + slack (den: ||ref|| unless given; slack: an absolute allowance)"""
        self.check(got is not None, what + ": missing")
        self.check(tuple(got.shape) == tuple(ref.shape), f"{what}: shape {tuple(got.shape)} != {tuple(ref.shape)}")
        g = got.detach().cpu().double()
        self.check(bool(torch.isfinite(g).all()) or not bool(torch.isfinite(ref).all()),
                   f"{what}: non-finite values")
        d = torch.linalg.vector_norm(g - ref).item()
        n = torch.linalg.vector_norm(ref).item() if den is None else den
        e = d / n if n > 0 else d
        lim = tol + (slack / n if n > 0 else slack)
        self.check(d <= tol * n + slack, f"{what}: relative error {e:.3g} > {lim:.3g}")


def _ulp(v, dtype):
    return 2.0 ** (math.floor(math.log2(abs(v))) if v else -126) * torch.finfo(dtype).eps


def draw_values(r, dtype):
    """(scale, offset) of randn * scale + offset; small spreads on large offsets (catastrophic
    cancellation in a one-pass variance), kept a few ulps of the offset wide so that the rounded input
    is not constant."""
    scale, offset = r.choice([(1.0, 0.0), (1.5, 0.3), (1.0, 0.0), (0.05, 0.0), (30.0, 0.0), (0.1, 1000.0),
                              (0.01, 100.0), (1.0, 1000.0), (2.0, -50.0), (1e-3, 1.0), (200.0, 0.0)])
    if offset:
        scale = max(scale, 32 * _ulp(offset, dtype))
    return scale, offset


def randn(g, shape, scale=1.0, offset=0.0):
    return torch.randn(shape, generator=g, dtype=F64) * scale + offset


def positive(g, shape):
    return torch.rand(shape, generator=g, dtype=F64) + 0.5


def make_input(g, shape, dtype, layout, scale, offset):
    """A tensor of ``shape`` in ``layout``; values drawn in float64, rounded once to ``dtype``."""
    nd = len(shape)
    if layout == "contig":
        return randn(g, shape, scale, offset).to(dtype)
    if layout == "cl":
        fmt = torch.channels_last if nd == 4 else torch.channels_last_3d
        return randn(g, shape, scale, offset).to(dtype).contiguous(memory_format=fmt)
    if layout == "cl_sliced":  # channels_last strides, not dense: a slice along N or H
        fmt = torch.channels_last if nd == 4 else torch.channels_last_3d
        big = randn(g, (shape[0] + 1,) + tuple(shape[1:]), scale, offset).to(dtype).contiguous(memory_format=fmt)
        return big[1:]
    if layout == "sliced":  # every other element of the last dim
        big = randn(g, tuple(shape[:-1]) + (2 * shape[-1],), scale, offset).to(dtype)
        return big[..., ::2]
    if layout == "permuted":  # dense, but the dims stored in reverse order
        return randn(g, tuple(reversed(shape)), scale, offset).to(dtype).permute(*reversed(range(nd)))
    if layout == "transposed01":  # leading dims swapped (rows of a layer norm not in order)
        s = (shape[1], shape[0]) + tuple(shape[2:])
        return randn(g, s, scale, offset).to(dtype).transpose(0, 1)
    if layout == "offset":  # contiguous with a storage offset
        k = 3
        numel = math.prod(shape)
        flat = randn(g, (numel + k + 2,), scale, offset).to(dtype)
        return flat[k:k + numel].view(shape)
    if layout == "expanded":  # stride 0 along dim 0 (a broadcast batch)
        return randn(g, (1,) + tuple(shape[1:]), scale, offset).to(dtype).expand(shape)
    raise AssertionError(layout)


def leaf(t):
    """a leaf that requires grad with ``t``'s strides and storage offset"""
    return t.detach().requires_grad_()


def strided_copy(t, device):
    """a copy of ``t`` on ``device`` (the CPU too) with ``t``'s sizes, strides and storage offset
    (``t.to(device)`` and ``t.clone()`` make non-dense tensors contiguous): the whole underlying storage is
    copied, then viewed."""
    n = t.untyped_storage().nbytes() // t.element_size()
    flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), 0, (n,), (1,))
    out = flat.to(device, copy=True).as_strided(t.shape, t.stride(), t.storage_offset())
    assert (out.shape, out.stride(), out.storage_offset()) == (t.shape, t.stride(), t.storage_offset())
    return out


def to_device(t, device):
    """``t`` (a CPU tensor drawn by the case) as normkit gets it on ``device``: ``t`` itself on the CPU, a
    ``strided_copy`` elsewhere (not a leaf; ``leaf()`` it where the test makes leaves)"""
    if t is None or t.device == torch.device(device):
        return t
    return strided_copy(t.detach(), device)


def d64(t):
    """float64 CPU copy (contiguous: torch 2.13's CPU batch-norm backward is wrong for an ambiguous
    channels_last-like input, e.g. (1, 3, 1, 3) strides (1, 1, 3, 3), with a contiguous grad_output)"""
    return None if t is None else t.detach().cpu().double().contiguous().requires_grad_(t.requires_grad)


def grad_of(t):
    return None if t is None else t.grad


def _y_den(y64, w, x=None, eps=None):
    """||y_ref||, floored at 1e-6·sqrt(numel)·max|w|: a group of one element normalizes to exactly 0 (then
    only the float64 oracle's own rounding is left: up to eps64·|x|/sqrt(eps) an element)"""
    wmax = 1.0 if w is None else w.double().abs().max().item()
    rel = 1e-6
    if x is not None and eps:
        rel = max(rel, 1e6 * torch.finfo(F64).eps * x.detach().double().abs().max().item() / math.sqrt(eps))
    return max(torch.linalg.vector_norm(y64.detach()).item(), rel * math.sqrt(y64.numel()) * wmax)


def same_layout(a, b):
    """the same strides wherever the size is > 1 (size-1 dims' strides carry no layout)"""
    return all(sa == sb for sa, sb, n in zip(a.stride(), b.stride(), a.shape) if n > 1)


def suggest_format(t):
    return normkit.reference.suggest_memory_format(t)


def spread(x64, dims):
    """max over the normalized groups of |mean| / std: how many digits a float32 mean loses."""
    m = x64.mean(dims, keepdim=True)
    s = ((x64 - m) ** 2).mean(dims, keepdim=True).sqrt()
    ratio = m.abs() / s.clamp_min(1e-300)
    return ratio.max().item()


def shift_cancellation(x64, dims, like):
    """max over channels of 1 + ((mean - shift) / std)^2, shift = the median of three samples of the channel: its
    first, middle and last element in the view the kernels take for ``like`` (the tensor they were given; x64 is its
    float64 contiguous copy; the view is the kernels' own choice, ``_View``): rows view rows 0, (M - 1) // 2 and
    M - 1, flat row n * S + s; ncs view
    (n, s) = (0, 0), ((N - 1) // 2, (S - 1) // 2), (N - 1, S - 1), s the flattened spatial index. The batch-norm
    kernels sum x - shift and (x - shift)^2 in fp32 across programs (the contract's shifted one-pass form), so the
    fp32 rounding of those sums reaches the variance amplified by this factor. Shifted by the first element it was
    ~10 for a first element 3 std out (found by this test: fp32 running_var 7e-6 off at n = 490 there;
    NOTES-batch_norm.md, sessions 12 and 13); a median of three is never a lone outlier."""
    N, C = x64.shape[:2]
    S = math.prod(x64.shape[2:])
    x3 = x64.reshape(N, C, S)
    if KB._View(like.detach()).kind == "rows":
        M = N * S
        picks = [divmod(r, S) for r in (0, (M - 1) // 2, M - 1)]
    else:
        picks = [(0, 0), ((N - 1) // 2, (S - 1) // 2), (N - 1, S - 1)]
    shift = torch.stack([x3[n, :, sp] for n, sp in picks]).median(0).values
    m = x64.mean(dims)
    s = x64.var(dims, unbiased=False).sqrt().clamp_min(1e-300)
    return (1 + ((m - shift) / s) ** 2).max().item()


def blend_mean_den(old, mean, std, momentum):
    """The running mean's error scale after a training step: the size of the blend's terms, |1 - m|·|old| +
    |m|·(|mean| + std) per channel (the batch mean may cancel the old running mean, and its rounding is relative to
    the channel's spread, as tests/kernels)."""
    return torch.linalg.vector_norm(abs(1 - momentum) * old.double().abs() + abs(momentum) * (mean.abs() + std)).item()


def check_param_grads(ctx, pairs, dtype, tol_table, extra, abs_sum, xhat_max):
    """Parameter gradients are sums over the batch (dw = Σ g·x̂, db = Σ g) that may cancel: the
    denominator is floored at 1e-2 of the sum of the terms' sizes (A = ||Σ|g|·max|x̂|||, as for grad_input),
    and the rounding of the float32 mean (``extra``, relative to x̂) is allowed on A."""
    for name, p, p64 in pairs:
        if p is None:
            continue
        ctx.check(p.grad is not None, f"{name}.grad missing")
        ctx.check(p.grad.dtype == p.dtype, f"{name}.grad dtype {p.grad.dtype} != {p.dtype}")
        tol = max(tol_table[dtype], tol_table[p.dtype])
        # (x̂ ≡ 0 for rows of one element: the floor keeps the oracle's own 1e-16s from counting)
        A = torch.linalg.vector_norm(abs_sum).item() * (max(xhat_max, 1e-3) if name == "weight" else 1.0)
        den = max(torch.linalg.vector_norm(p64.grad).item(), 1e-2 * A)
        ctx.close(p.grad, p64.grad, tol, f"{name}.grad", den=den, slack=extra * A)


def chan_abs_sum(gout):
    """Σ |grad_out| over every dim but the channel dim 1"""
    gd = gout.double().abs()
    return gd.sum([0] + list(range(2, gd.dim())))


def row_abs_sum(gout, ns):
    """Σ |grad_out| over the leading (row) dims"""
    return gout.double().abs().reshape((-1,) + tuple(ns)).sum(0)


def xhat_max(x64, dims, eps, rms=False):
    x = x64.detach()
    if rms:
        return (x.abs() / torch.sqrt((x * x).mean(dims, keepdim=True) + eps)).max().item()
    m = x.mean(dims, keepdim=True)
    return ((x - m).abs() / torch.sqrt(((x - m) ** 2).mean(dims, keepdim=True) + eps)).max().item()


def maybe_strided(r, t):
    """``t``, or (1 time in 4) the same values as a strided view: every other element of a larger tensor
    (parameters and running statistics are not always dense: slices of a packed buffer, views)."""
    if t is None or r.random() >= 0.25:
        return t
    big = torch.zeros(tuple(t.shape[:-1]) + (2 * t.shape[-1],), dtype=t.dtype)
    view = big[..., ::2]
    view.copy_(t)
    return view


def draw_params(r, g, C_shape, dtype, affine=None, scale=1.0):
    pdt = r.choice([dtype, F32])
    if affine is None:
        affine = r.choice(["both", "both", "weight", "bias", "none"])
    w = (positive(g, C_shape) * r.choice([1.0, -1.0])).to(pdt) if affine in ("both", "weight") else None
    b = randn(g, C_shape).to(pdt) if affine in ("both", "bias") else None
    return pdt, affine, maybe_strided(r, w), maybe_strided(r, b)


# ------------------------------------------------------------------------------------------- batch norm


def draw_bn_shape(r, training):
    while True:
        nd = r.choice([2, 3, 4, 4, 5])
        C = r.choice([1, 3, 7, 65] if nd <= 3 else [1, 3, 7])
        N = r.choice([1, 2, 3, 5, 17])
        sp = [r.choice([1, 1, 2, 3, 5, 7, 9]) for _ in range(nd - 2)]
        if r.random() < 0.15:  # N·HW = 2, the smallest training batch
            N, sp = r.choice([(2, [1] * (nd - 2)), (1, [2] + [1] * (nd - 3))]) if nd > 2 else (2, [])
        elif r.random() < 0.15:  # unaligned planes in rows of 16-element multiples (batch norm's spread view; 81 and
            # 75 elements: odd planes past 64, spread in the elementwise pass only)
            C, sp = r.choice([16, 32]), r.choice([[3, 3], [5, 5], [7, 7], [9], [25], [9, 9], [5, 15]])
            N, nd = r.choice([1, 2, 3, 5]), 2 + len(sp)
        elif r.random() < 0.12:  # rows of a small odd C, a multiple of 16 of them (batch norm's folded rows view)
            C = r.choice([3, 5, 7, 9, 15])
            if r.random() < 0.5:
                N, sp = r.choice([2, 3, 4]), r.choice([[4, 4], [2, 8], [4, 12]])
            else:
                N, sp = 16 * r.choice([2, 3, 6, 9]), []
            nd = 2 + len(sp)
        shape = (N, C, *sp)
        n = N * math.prod(sp)
        if training and n < 2:
            continue
        if math.prod(shape) <= 2500:
            return shape


def _layouts(nd):
    opts = ["contig", "contig", "sliced", "permuted", "offset", "transposed01"]
    if nd in (4, 5):
        opts += ["cl", "cl", "cl_sliced"]
    return opts


def run_batch_norm(case_id, device):
    """One random batch-norm case; half of them through the split path (reduction, combine, elementwise pass) that
    the one-launch kernels would otherwise take for every shape this small (``fused_max_rows``)."""
    saved = KB._TUNE["fused_max_rows"]
    try:
        _run_batch_norm(case_id, device)
    finally:
        KB._TUNE["fused_max_rows"] = saved


def _run_batch_norm(case_id, device):
    r = random.Random(_seed(case_id))
    g = torch.Generator().manual_seed(_seed(case_id))
    dtype = r.choice([F32, BF16, F16])
    training = r.random() < 0.7
    shape = draw_bn_shape(r, training)
    nd, C = len(shape), shape[1]
    n = math.prod(shape) // C
    layout = r.choice(_layouts(nd) + (["expanded"] if shape[0] > 1 and not training else []))
    scale, offset = draw_values(r, dtype)
    pdt, affine, w, b = draw_params(r, g, (C,), dtype)
    if pdt == F16:  # the running variance must fit in fp16
        scale = min(scale, 30.0)
    stats = (not training) or r.random() < 0.7
    momentum = r.choice([0.1, 0.1, 0.0, 0.5, 1.0, 1.3, -0.4])
    eps = r.choice([1e-5, 1e-5, 1e-3, 0.1, 1e-8] + ([0.0] if not training else []))
    grad_layout = r.choice(["same", "contig"])
    split = r.random() < 0.5
    desc = dict(shape=shape, dtype=dtype, pdt=pdt, affine=affine, training=training, stats=stats,
                momentum=momentum, eps=eps, layout=layout, grad_layout=grad_layout, scale=scale, offset=offset,
                path="split" if split else "default")
    ctx = Ctx(case_id, desc, device)
    if split:
        KB._TUNE["fused_max_rows"] = 0

    x = make_input(g, shape, dtype, layout, scale, offset)
    if stats:
        if training:
            rm, rv = maybe_strided(r, randn(g, (C,)).to(pdt)), maybe_strided(r, positive(g, (C,)).to(pdt))
        else:  # running statistics of data like this batch
            rm = maybe_strided(r, (offset + randn(g, (C,), 0.3 * scale)).to(pdt))
            rv = maybe_strided(r, (positive(g, (C,)) * scale * scale).to(pdt))
    else:
        rm = rv = None
    gout = make_input(g, shape, dtype, layout if grad_layout == "same" and layout != "expanded" else "contig",
                      1.0, 0.0)

    x_d, w_d, b_d = to_device(x, device), to_device(w, device), to_device(b, device)
    xl, wl, bl = leaf(x_d), None if w is None else leaf(w_d), None if b is None else leaf(b_d)
    rmn, rvn = (None, None) if rm is None else (strided_copy(rm, device), strided_copy(rv, device))
    try:  # torch's (CPU) output layout for this input's strides, or its error (eps = 0 in eval: torch 2.11)
        with torch.no_grad():
            y_layout = F.batch_norm(x.double(), None if rm is None else rm.double(),
                                    None if rv is None else rv.double(), training=training, eps=eps)
    except ValueError as error:
        with pytest.raises(ValueError) as raised:
            normkit.batch_norm(xl, rmn, rvn, wl, bl, training=training, momentum=momentum, eps=eps)
        assert str(raised.value) == str(error), ctx.msg("error message")
        if rm is not None:
            assert torch.equal(rmn.cpu(), rm) and torch.equal(rvn.cpu(), rv), ctx.msg("running stats touched")
        return
    # normkit (on ``device``: the running statistics are updated in place there and read back from there)
    y = normkit.batch_norm(xl, rmn, rvn, wl, bl, training=training, momentum=momentum, eps=eps)
    y.backward(to_device(gout, device))
    # float64 oracle: torch on the same rounded values
    x64, w64, b64 = d64(xl), d64(wl), d64(bl)
    rm64, rv64 = (None, None) if rm is None else (rm.double(), rv.double())
    y64 = F.batch_norm(x64, rm64, rv64, w64, b64, training=training, momentum=momentum, eps=eps)
    y64.backward(gout.double().contiguous())

    dims = [0] + list(range(2, nd))
    extra = 4 * EPS32 * spread(x64.detach(), dims) if training else 0.0
    # the variance's rounding (relative), and what it does to invstd and everything scaled by it
    var_extra = 8 * EPS32 * shift_cancellation(x64.detach(), dims, xl) if training else 0.0
    extra += var_extra / 2
    ctx.check(y.dtype == dtype and y.shape == x.shape, f"y dtype/shape {y.dtype} {tuple(y.shape)}")
    ctx.check(same_layout(y, y_layout), f"y strides {y.stride()}, torch's {y_layout.stride()}")
    ctx.close(y, y64.detach(), TOL[dtype] + extra, "y", den=_y_den(y64, w, x, eps))
    if stats:
        xd = x64.detach()
        batch = {"running_mean": xd.mean(dims), "running_var": xd.var(dims, unbiased=True)}
        for name, got, want, r0 in (("running_mean", rmn, rm64, rm), ("running_var", rvn, rv64, rv)):
            ctx.check(got.dtype == pdt, f"{name} dtype {got.dtype}")
            # relative to the size of the two terms (a negative momentum makes them cancel)
            if training and name == "running_mean":
                den = blend_mean_den(r0, batch[name], batch["running_var"].sqrt(), momentum)
            else:
                terms = abs(1 - momentum) * r0.double().abs() + abs(momentum) * batch[name].abs() if training else r0.double()
                den = torch.linalg.vector_norm(terms).item()
            ctx.close(got, want, TOL_RUNNING[pdt] + (extra if name == "running_mean" else var_extra), name, den=den)
    if training:
        invstd = 1 / torch.sqrt(x64.detach().var(dims, unbiased=False) + eps)
    else:
        invstd = 1 / torch.sqrt(rv.double() + eps)
    wd = w64.detach() if w64 is not None else torch.ones(C, dtype=F64)
    sh = [1, C] + [1] * (nd - 2)
    cancel = torch.linalg.vector_norm(gout.double() * (invstd * wd).view(sh)).item()
    ctx.check(xl.grad is not None and xl.grad.dtype == dtype, "x.grad dtype")
    if training:
        ctx.close(xl.grad, x64.grad, TOL_BWD_BN[dtype] + extra, "x.grad", den=cancel)
        xm = xhat_max(x64, dims, eps)
    else:
        ctx.close(xl.grad, x64.grad, TOL[dtype], "x.grad")
        xm = ((x64.detach() - rm64.view(sh)).abs() * invstd.view(sh)).max().item()
    check_param_grads(ctx, [("weight", wl, w64), ("bias", bl, b64)], dtype, TOL_BWD_BN, extra, chan_abs_sum(gout), xm)

    if training and r.random() < 0.4:  # the saved statistics of the aten-named op (no running stats)
        _, sm, si = normkit.ops.native_batch_norm(x_d, w_d, b_d, None, None, True, momentum, eps)
        ctx.check(sm.dtype == F32 and si.dtype == F32 and sm.shape == (C,), "saved stats dtype/shape")
        m64 = x64.detach().mean(dims)
        std = 1 / invstd
        err_m = ((sm.cpu().double() - m64).abs() / (std + m64.abs() * 4 * EPS32 / TOL_STAT)).max().item()
        ctx.check(err_m <= TOL_STAT, f"save_mean error {err_m:.3g} (relative to the channel's std)")
        ctx.close(si, invstd, TOL_STAT + 2.5 * extra, "save_invstd")


# ------------------------------------------------------------------------------------ layer and RMS norm

WIDTHS = [1, 3, 17, 63, 65, 100, 257, 320, 768, 1025]


def draw_rows_shape(r, rms):
    """(shape, normalized_shape): widths of the issue, leading dims [B, S, H], multi-dim normalized shapes."""
    kind = r.choice(["2d", "2d", "bsh", "multi", "4d"])
    Nw = r.choice(WIDTHS)
    rows_cap = max(1, 3000 // Nw)
    if kind == "2d":
        return (r.randint(1, min(9, rows_cap)), Nw), [Nw]
    if kind == "bsh":
        while True:
            B, S = r.choice([1, 2, 3]), r.choice([1, 2, 3, 5])
            if B * S <= rows_cap:
                return (B, S, Nw), [Nw]
    if kind == "multi":
        a, c = r.choice([(2, 3), (3, 17), (4, 16), (5, 7), (1, 65), (7, 1)])
        B = r.choice([1, 2, 3, 4])
        return (B, a, c), [a, c]
    # 4-D (N, C, H, W), normalized over the last one or two dims (RMS keeps channels_last)
    N, C, H, W = r.choice([1, 2, 3]), r.choice([1, 3, 4]), r.choice([1, 2, 5]), r.choice([3, 8, 17])
    return (N, C, H, W), r.choice([[W], [H, W]])


def _row_layouts(nd):
    opts = ["contig", "contig", "sliced", "offset", "permuted"]
    if nd >= 3:
        opts += ["transposed01"]
    if nd == 4:
        opts += ["cl", "cl"]
    return opts


def run_layer_norm(case_id, device):
    r = random.Random(_seed(case_id))
    g = torch.Generator().manual_seed(_seed(case_id))
    dtype = r.choice([F32, BF16, F16])
    shape, ns = draw_rows_shape(r, False)
    layout = r.choice(_row_layouts(len(shape)))
    scale, offset = draw_values(r, dtype)
    pdt, affine, w, b = draw_params(r, g, tuple(ns), dtype)
    eps = r.choice([1e-5, 1e-5, 1e-6, 1e-3, 0.1, 0.0 if scale >= 0.05 and math.prod(ns) > 1 else 1e-5])
    desc = dict(shape=shape, ns=ns, dtype=dtype, pdt=pdt, affine=affine, eps=eps, layout=layout, scale=scale,
                offset=offset)
    ctx = Ctx(case_id, desc, device)
    x = make_input(g, shape, dtype, layout, scale, offset)
    gout = randn(g, shape).to(dtype)

    x_d, w_d, b_d = to_device(x, device), to_device(w, device), to_device(b, device)
    xl, wl, bl = leaf(x_d), None if w is None else leaf(w_d), None if b is None else leaf(b_d)
    y = normkit.layer_norm(xl, ns, wl, bl, eps)
    y.backward(to_device(gout, device))
    x64, w64, b64 = d64(xl), d64(wl), d64(bl)
    y64 = F.layer_norm(x64, ns, w64, b64, eps)
    y64.backward(gout.double().contiguous())

    dims = list(range(len(shape) - len(ns), len(shape)))
    extra = 4 * EPS32 * spread(x64.detach(), dims) if math.prod(ns) > 1 else 0.0
    ctx.check(y.dtype == dtype and y.shape == x.shape and y.is_contiguous(), f"y dtype/shape/strides {y.stride()}")
    ctx.close(y, y64.detach(), TOL[dtype] + extra, "y", den=_y_den(y64, w, x, eps))
    rstd = 1 / torch.sqrt(x64.detach().var(dims, unbiased=False, keepdim=True) + eps)
    wd = 1.0 if w64 is None else w64.detach()
    cancel = torch.linalg.vector_norm(gout.double() * wd * rstd).item()
    den = max(torch.linalg.vector_norm(x64.grad).item(), 1e-2 * cancel)
    ctx.check(xl.grad.dtype == dtype, "x.grad dtype")
    ctx.close(xl.grad, x64.grad, TOL_BWD[dtype], "x.grad", den=den, slack=extra * cancel)
    check_param_grads(ctx, [("weight", wl, w64), ("bias", bl, b64)], dtype, TOL_BWD, extra, row_abs_sum(gout, ns),
                      xhat_max(x64, dims, eps))

    if r.random() < 0.3:  # saved statistics of aten's native_layer_norm
        _, mean, rs = normkit.ops.native_layer_norm(x_d, ns, w_d, b_d, eps)
        stat_shape = tuple(shape[:len(shape) - len(ns)]) + (1,) * len(ns)
        ctx.check(mean.dtype == F32 and rs.dtype == F32 and tuple(mean.shape) == stat_shape, "saved stats")
        m64 = x64.detach().mean(dims, keepdim=True)
        err_m = ((mean.cpu().double() - m64).abs() / (1 / rstd + m64.abs() * 4 * EPS32 / TOL_STAT)).max().item()
        ctx.check(err_m <= TOL_STAT * (1 + math.prod(ns) / 32768) + 1e-7, f"mean error {err_m:.3g}")
        ctx.close(rs, rstd, TOL[F32] + 2.5 * extra, "rstd")


def run_rms_norm(case_id, device):
    r = random.Random(_seed(case_id))
    g = torch.Generator().manual_seed(_seed(case_id))
    dtype = r.choice([F32, BF16, F16])
    shape, ns = draw_rows_shape(r, True)
    layout = r.choice(_row_layouts(len(shape)))
    scale, offset = draw_values(r, dtype)
    pdt, affine, w, _ = draw_params(r, g, tuple(ns), dtype, affine=r.choice(["weight", "weight", "none"]))
    eps = r.choice([None, None, 1e-6, 1e-5, 0.1])
    desc = dict(shape=shape, ns=ns, dtype=dtype, pdt=pdt, affine=affine, eps=eps, layout=layout, scale=scale,
                offset=offset)
    ctx = Ctx(case_id, desc, device)
    x = make_input(g, shape, dtype, layout, scale, offset)
    gout = randn(g, shape).to(dtype)

    x_d, w_d = to_device(x, device), to_device(w, device)
    xl, wl = leaf(x_d), None if w is None else leaf(w_d)
    y = normkit.rms_norm(xl, ns, wl, eps)
    y.backward(to_device(gout, device))
    x64, w64 = d64(xl), d64(wl)
    eps64 = EPS32 if eps is None else eps  # rms_norm's default: finfo(fp32).eps for 16/32-bit inputs
    y64 = F.rms_norm(x64, ns, w64, eps64)
    y64.backward(gout.double().contiguous())

    ctx.check(y.dtype == dtype and y.shape == x.shape, "y dtype/shape")
    fmt = suggest_format(x)  # x: the CPU original, xl's strides
    want = fmt if fmt in (torch.channels_last, torch.channels_last_3d) else torch.contiguous_format
    ctx.check(y.is_contiguous(memory_format=want), f"y strides {y.stride()} not {want}")
    ctx.close(y, y64.detach(), TOL[dtype], "y", den=_y_den(y64, w))
    dims = list(range(len(shape) - len(ns), len(shape)))
    rstd = 1 / torch.sqrt((x64.detach() ** 2).mean(dims, keepdim=True) + eps64)
    wd = 1.0 if w64 is None else w64.detach()
    cancel = torch.linalg.vector_norm(gout.double() * wd * rstd).item()
    den = max(torch.linalg.vector_norm(x64.grad).item(), 1e-2 * cancel)
    ctx.check(xl.grad.dtype == dtype, "x.grad dtype")
    ctx.close(xl.grad, x64.grad, TOL_BWD[dtype], "x.grad", den=den)
    check_param_grads(ctx, [("weight", wl, w64)], dtype, TOL_BWD, 0.0, row_abs_sum(gout, ns),
                      xhat_max(x64, dims, eps64, rms=True))

    if r.random() < 0.3:
        _, rs = normkit.ops._fused_rms_norm(x_d, ns, w_d, eps)
        ctx.check(rs.dtype == F32, "rstd dtype")
        ctx.close(rs, rstd, TOL[F32], "rstd")


def run_add_norm(case_id, device):
    """``normkit.add_layer_norm`` / ``add_rms_norm``: s = x + residual rounded to the dtype (compared with
    torch's add within an ulp: the interpreter truncates fp32 -> bf16), y = the norm of that s, and the
    gradients of x and residual (equal: s's gradient) with s itself used downstream too."""
    r = random.Random(_seed(case_id))
    g = torch.Generator().manual_seed(_seed(case_id))
    rms = r.random() < 0.5
    dtype = r.choice([F32, BF16, F16])
    shape, ns = draw_rows_shape(r, rms)
    layout, res_layout = r.choice(_row_layouts(len(shape))), r.choice(_row_layouts(len(shape)))
    scale, offset = draw_values(r, dtype)
    pdt, affine, w, b = draw_params(r, g, tuple(ns), dtype,
                                    affine=r.choice(["weight", "weight", "none"]) if rms else None)
    if rms:
        b = None
        eps = r.choice([None, 1e-6, 1e-5])
    else:
        eps = r.choice([1e-5, 1e-6, 1e-3])
    desc = dict(op="add_rms_norm" if rms else "add_layer_norm", shape=shape, ns=ns, dtype=dtype, pdt=pdt,
                affine=affine, eps=eps, layout=layout, res_layout=res_layout, scale=scale, offset=offset)
    ctx = Ctx(case_id, desc, device)
    x = make_input(g, shape, dtype, layout, scale, offset)
    res = make_input(g, shape, dtype, res_layout, 0.5 * scale, 0.0)
    gy, gs = randn(g, shape).to(dtype), randn(g, shape).to(dtype)

    x_d, res_d, w_d, b_d = (to_device(t, device) for t in (x, res, w, b))
    xl, rl = leaf(x_d), leaf(res_d)
    wl, bl = None if w is None else leaf(w_d), None if b is None else leaf(b_d)
    if rms:
        y, s_out = normkit.add_rms_norm(xl, rl, ns, wl, eps)
    else:
        y, s_out = normkit.add_layer_norm(xl, rl, ns, wl, bl, eps)
    torch.autograd.backward([y, s_out], [to_device(gy, device), to_device(gs, device)])

    s_ref = x + res  # torch's add in the dtype
    ctx.check(s_out.dtype == dtype and s_out.shape == x.shape, "s dtype/shape")
    ulp = torch.finfo(dtype).eps * s_ref.double().abs().clamp_min(torch.finfo(dtype).tiny)
    ctx.check(bool(((s_out.detach().cpu().double() - s_ref.double()).abs() <= ulp).all()), "s != x + residual")
    s64 = s_out.detach().cpu().double().contiguous().requires_grad_(True)  # the norm of normkit's s
    w64, b64 = d64(wl), d64(bl)
    eps64 = (EPS32 if eps is None else eps) if rms else eps
    y64 = F.rms_norm(s64, ns, w64, eps64) if rms else F.layer_norm(s64, ns, w64, b64, eps64)
    torch.autograd.backward([y64, s64], [gy.double().contiguous(), gs.double().contiguous()])

    dims = list(range(len(shape) - len(ns), len(shape)))
    sd = s64.detach()
    extra = 0.0 if rms or math.prod(ns) == 1 else 4 * EPS32 * spread(sd, dims)
    ctx.check(y.dtype == dtype and y.shape == x.shape, "y dtype/shape")
    ctx.close(y, y64.detach(), TOL[dtype] + extra, "y", den=_y_den(y64, w, None if rms else s_out, eps64))
    centred = sd if rms else sd - sd.mean(dims, keepdim=True)
    rstd = 1 / torch.sqrt((centred ** 2).mean(dims, keepdim=True) + eps64)
    wd = 1.0 if w64 is None else w64.detach()
    cancel = torch.linalg.vector_norm(gy.double() * wd * rstd).item()
    den = max(torch.linalg.vector_norm(s64.grad).item(), 1e-2 * cancel)
    for name, leaf_t in (("x.grad", xl), ("residual.grad", rl)):
        ctx.check(leaf_t.grad is not None and leaf_t.grad.dtype == dtype, f"{name} dtype")
        ctx.close(leaf_t.grad, s64.grad, TOL_BWD[dtype], name, den=den, slack=extra * cancel)
    check_param_grads(ctx, [("weight", wl, w64), ("bias", bl, b64)], dtype, TOL_BWD, extra, row_abs_sum(gy, ns),
                      xhat_max(s64, dims, eps64, rms=rms))


# ------------------------------------------------------------------------------------------- group norm


def run_group_norm(case_id, device):
    r = random.Random(_seed(case_id))
    g = torch.Generator().manual_seed(_seed(case_id))
    dtype = r.choice([F32, BF16, F16])
    while True:
        nd = r.choice([2, 3, 4, 4, 5])
        C = r.choice([1, 3, 6, 7, 12, 32] if nd <= 4 else [1, 3, 6])
        G = r.choice([d for d in range(1, C + 1) if C % d == 0])
        N = r.choice([1, 2, 3, 5])
        sp = [r.choice([1, 2, 3, 5, 7, 9]) for _ in range(nd - 2)]
        shape = (N, C, *sp)
        if N * (C // G) * math.prod(sp) >= 2 and (C // G) * math.prod(sp) >= 1 and math.prod(shape) <= 3000:
            break
    layout = r.choice(_layouts(nd))
    scale, offset = draw_values(r, dtype)
    pdt, affine, w, b = draw_params(r, g, (C,), dtype)
    eps = r.choice([1e-5, 1e-5, 1e-6, 1e-3, 0.1])
    grad_layout = r.choice(["same", "contig"])
    desc = dict(shape=shape, G=G, dtype=dtype, pdt=pdt, affine=affine, eps=eps, layout=layout,
                grad_layout=grad_layout, scale=scale, offset=offset)
    ctx = Ctx(case_id, desc, device)
    x = make_input(g, shape, dtype, layout, scale, offset)
    gout = make_input(g, shape, dtype, layout if grad_layout == "same" else "contig", 1.0, 0.0)

    x_d, w_d, b_d = to_device(x, device), to_device(w, device), to_device(b, device)
    xl, wl, bl = leaf(x_d), None if w is None else leaf(w_d), None if b is None else leaf(b_d)
    y = normkit.group_norm(xl, G, wl, bl, eps)
    y.backward(to_device(gout, device))
    x64, w64, b64 = d64(xl), d64(wl), d64(bl)
    if w is None and b is not None:
        # torch's own backward raises here ("tensor does not have a device", torch 2.13 CPU):
        # the reference (plain differentiable torch) is the oracle
        y64 = normkit.reference.native_group_norm(x64, w64, b64, shape[0], C, math.prod(sp), G, eps)[0]
    else:
        y64 = F.group_norm(x64, G, w64, b64, eps)
    y64.backward(gout.double().contiguous())
    with torch.no_grad():  # torch's (CPU) output layout for this input's strides (x: xl's strides, on the CPU)
        y_layout = F.group_norm(x.double(), G, eps=eps)

    xg = x64.detach().reshape(shape[0], G, -1)
    size = xg.shape[-1]
    sp_ratio = spread(xg, [2]) if size > 1 else 0.0
    extra = 4 * EPS32 * sp_ratio
    # 16-bit inputs without mixed parameters save (and backpropagate with) mean / rstd rounded to the input
    # dtype (contract §5, as aten): x̂ in backward is off by up to half an ulp of each
    mixed = any(p is not None and p.dtype != dtype for p in (w, b))
    sdt = F32 if (mixed or dtype == F32) else dtype
    extra_b = extra + (torch.finfo(sdt).eps * (sp_ratio + 1) if sdt != F32 else 0.0)
    ctx.check(y.dtype == dtype and y.shape == x.shape, "y dtype/shape")
    ctx.check(same_layout(y, y_layout), f"y strides {y.stride()}, torch's {y_layout.stride()}")
    ctx.close(y, y64.detach(), TOL[dtype] + extra, "y", den=_y_den(y64, w, x, eps))
    rstd = 1 / torch.sqrt(xg.var(-1, unbiased=False, keepdim=True) + eps)
    wd = torch.ones(C, dtype=F64) if w64 is None else w64.detach()
    gw = (gout.double() * wd.view([1, C] + [1] * (nd - 2))).reshape(shape[0], G, -1)
    cancel = torch.linalg.vector_norm(gw * rstd).item()
    den = max(torch.linalg.vector_norm(x64.grad).item(), 1e-2 * cancel)
    ctx.check(xl.grad.dtype == dtype, "x.grad dtype")
    ctx.close(xl.grad, x64.grad, TOL_BWD[dtype], "x.grad", den=den, slack=extra_b * cancel)
    xg_hat = ((xg - xg.mean(-1, keepdim=True)) * rstd).abs().max().item()
    check_param_grads(ctx, [("weight", wl, w64), ("bias", bl, b64)], dtype, TOL_BWD, extra_b, chan_abs_sum(gout),
                      xg_hat)

    if r.random() < 0.3:  # saved statistics: (N, G), input dtype or fp32 when mixed
        _, mean, rs = normkit.ops.native_group_norm(x_d, w_d, b_d, shape[0], C, math.prod(sp), G, eps)
        ctx.check(mean.dtype == sdt and rs.dtype == sdt and mean.shape == (shape[0], G), "saved stats")
        m64 = xg.mean(-1)
        half_ulp = torch.finfo(sdt).eps if sdt != F32 else 0.0  # rounding to the 16-bit dtype
        bound = TOL_STAT / rstd[..., 0] + (4 * EPS32 + half_ulp) * m64.abs()
        err_m = ((mean.cpu().double() - m64).abs() / bound).max().item()
        ctx.check(err_m <= 1, f"mean error {err_m:.3g} of the bound")
        ctx.close(rs, rstd[..., 0], (TOL[F32] + 2.5 * extra) if sdt == F32 else half_ulp + 2.5 * extra, "rstd")


# ---------------------------------------------------------------------------------------- instance norm


def run_instance_norm(case_id, device):
    r = random.Random(_seed(case_id))
    g = torch.Generator().manual_seed(_seed(case_id))
    dtype = r.choice([F32, BF16, F16])
    use_input_stats = r.random() < 0.75
    while True:
        nd = r.choice([3, 4, 4, 5])
        C = r.choice([1, 3, 7, 16])
        N = r.choice([1, 2, 3])
        sp = [r.choice([1, 2, 3, 5, 8]) for _ in range(nd - 2)]
        shape = (N, C, *sp)
        if (math.prod(sp) > 1 or not use_input_stats) and math.prod(shape) <= 2500:
            break
    layout = r.choice(_layouts(nd))
    scale, offset = draw_values(r, dtype)
    pdt, affine, w, b = draw_params(r, g, (C,), dtype)
    if pdt == F16:  # the running variance must fit in fp16
        scale = min(scale, 30.0)
    stats = (not use_input_stats) or r.random() < 0.5
    momentum = r.choice([0.1, 0.0, 0.5, 1.0])
    eps = r.choice([1e-5, 1e-3, 0.1])
    desc = dict(shape=shape, dtype=dtype, pdt=pdt, affine=affine, use_input_stats=use_input_stats, stats=stats,
                momentum=momentum, eps=eps, layout=layout, scale=scale, offset=offset)
    ctx = Ctx(case_id, desc, device)
    x = make_input(g, shape, dtype, layout, scale, offset)
    if stats:
        rm = maybe_strided(r, (offset + randn(g, (C,), 0.3 * scale)).to(pdt))
        rv = maybe_strided(r, (positive(g, (C,)) * scale * scale).to(pdt))
    else:
        rm = rv = None
    gout = randn(g, shape).to(dtype)

    x_d, w_d, b_d = to_device(x, device), to_device(w, device), to_device(b, device)
    xl, wl, bl = leaf(x_d), None if w is None else leaf(w_d), None if b is None else leaf(b_d)
    rmn, rvn = (None, None) if rm is None else (strided_copy(rm, device), strided_copy(rv, device))
    y = normkit.instance_norm(xl, rmn, rvn, wl, bl, use_input_stats, momentum, eps)
    y.backward(to_device(gout, device))
    x64, w64, b64 = d64(xl), d64(wl), d64(bl)
    rm64, rv64 = (None, None) if rm is None else (rm.double(), rv.double())
    y64 = F.instance_norm(x64, rm64, rv64, w64, b64, use_input_stats, momentum, eps)
    y64.backward(gout.double().contiguous())

    dims = list(range(2, nd))
    extra = 4 * EPS32 * spread(x64.detach(), dims) if use_input_stats else 0.0
    ctx.check(y.dtype == dtype and y.shape == x.shape, "y dtype/shape")
    ctx.close(y, y64.detach(), TOL[dtype] + extra, "y", den=_y_den(y64, w, x, eps))
    if stats:
        xd = x64.detach()
        for name, got, want in (("running_mean", rmn, rm64), ("running_var", rvn, rv64)):
            ctx.check(got.dtype == pdt, f"{name} dtype")
            den = None
            if use_input_stats and name == "running_mean":
                den = blend_mean_den(rm, xd.mean(dims).mean(0), xd.var(dims, unbiased=False).sqrt().mean(0), momentum)
            ctx.close(got, want, TOL_RUNNING[pdt] + (extra if name == "running_mean" else 0), name, den=den)
    if use_input_stats:
        rstd = 1 / torch.sqrt(x64.detach().var(dims, unbiased=False, keepdim=True) + eps)
    else:
        rstd = (1 / torch.sqrt(rv.double() + eps)).view([1, C] + [1] * (nd - 2))
    wd = torch.ones(C, dtype=F64) if w64 is None else w64.detach()
    cancel = torch.linalg.vector_norm(gout.double() * wd.view([1, C] + [1] * (nd - 2)) * rstd).item()
    den = max(torch.linalg.vector_norm(x64.grad).item(), 1e-2 * cancel)
    ctx.check(xl.grad.dtype == dtype, "x.grad dtype")
    tol_bwd = TOL_BWD if use_input_stats else TOL_BWD_BN
    ctx.close(xl.grad, x64.grad, tol_bwd[dtype], "x.grad", den=den, slack=extra * cancel)
    if use_input_stats:
        xm = xhat_max(x64, dims, eps)
    else:
        xm = ((x64.detach() - rm64.view([1, C] + [1] * (nd - 2))).abs() * rstd).max().item()
    check_param_grads(ctx, [("weight", wl, w64), ("bias", bl, b64)], dtype, tol_bwd, extra, chan_abs_sum(gout), xm)


# ------------------------------------------------------------------------------------------------ modules


def _module_case(r, g):
    kind = r.choice(["bn", "bn", "ln", "gn", "rms", "in"])
    if kind == "bn":
        nd = r.choice([2, 3, 4, 5])
        C = r.choice([1, 3, 7])
        N = r.choice([2, 3, 4])
        sp = [r.choice([1, 2, 3, 5]) for _ in range(nd - 2)]
        shape = (N, C, *sp)
        cls = {2: "BatchNorm1d", 3: "BatchNorm1d", 4: "BatchNorm2d", 5: "BatchNorm3d"}[nd]
        kw = dict(momentum=r.choice([None, 0.1, 0.3]), affine=r.random() < 0.8,
                  track_running_stats=r.random() < 0.8, eps=r.choice([1e-5, 1e-3]))
        return cls, (C,), kw, shape
    if kind == "ln":
        Nw = r.choice([3, 17, 65, 320])
        shape = (r.choice([1, 2, 3]), r.choice([1, 3]), Nw)
        return "LayerNorm", (Nw,), dict(elementwise_affine=r.random() < 0.8, bias=r.random() < 0.7), shape
    if kind == "gn":
        C = r.choice([4, 6, 12])
        G = r.choice([d for d in range(1, C + 1) if C % d == 0])
        shape = (r.choice([1, 2, 3]), C, r.choice([2, 3]), r.choice([3, 5]))
        return "GroupNorm", (G, C), dict(affine=r.random() < 0.8, eps=r.choice([1e-5, 1e-3])), shape
    if kind == "rms":
        Nw = r.choice([3, 17, 65, 320])
        shape = (r.choice([1, 2, 3]), r.choice([1, 3]), Nw)
        return "RMSNorm", (Nw,), dict(eps=r.choice([None, 1e-6]), elementwise_affine=r.random() < 0.8), shape
    C = r.choice([1, 3, 5])
    shape = (r.choice([1, 2, 3]), C, r.choice([2, 3]), r.choice([3, 5]))
    return "InstanceNorm2d", (C,), dict(affine=r.random() < 0.6, track_running_stats=r.random() < 0.6,
                                        momentum=r.choice([0.1, None, 0.5])), shape


def _module_cancel(cls, ref, x64, gout, train, eps):
    """||g·rstd·w||: the size of the terms that cancel in grad_input, per module kind."""
    x = x64.detach()
    nd = x.dim()
    C = x.shape[1]
    w = getattr(ref, "weight", None)
    w = None if w is None else w.detach()
    if cls.startswith("Batch"):
        if train or not ref.track_running_stats:
            rstd = 1 / torch.sqrt(x.var([0] + list(range(2, nd)), unbiased=False) + eps)
        else:
            rstd = 1 / torch.sqrt(ref.running_var.detach() + eps)
        f = rstd * (1.0 if w is None else w)
        return torch.linalg.vector_norm(gout.double() * f.view([1, C] + [1] * (nd - 2))).item()
    if cls.startswith("Instance"):
        if train or not ref.track_running_stats:
            rstd = 1 / torch.sqrt(x.var(list(range(2, nd)), unbiased=False, keepdim=True) + eps)
        else:
            rstd = (1 / torch.sqrt(ref.running_var.detach() + eps)).view([1, C] + [1] * (nd - 2))
        f = rstd * (1.0 if w is None else w.view([1, C] + [1] * (nd - 2)))
        return torch.linalg.vector_norm(gout.double() * f).item()
    if cls == "GroupNorm":
        G = ref.num_groups
        xg = x.reshape(x.shape[0], G, -1)
        rstd = 1 / torch.sqrt(xg.var(-1, unbiased=False, keepdim=True) + eps)
        gw = gout.double() * (1.0 if w is None else w.view([1, C] + [1] * (nd - 2)))
        return torch.linalg.vector_norm(gw.reshape(xg.shape) * rstd).item()
    if cls == "LayerNorm":
        rstd = 1 / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)
    else:
        rstd = 1 / torch.sqrt((x * x).mean(-1, keepdim=True) + (EPS32 if eps is None else eps))
    return torch.linalg.vector_norm(gout.double() * rstd * (1.0 if w is None else w)).item()


def run_modules(case_id, device):
    """Two training steps and one eval step of a normkit.nn module against torch's module in float64
    (momentum None: cumulative average; buffers, outputs, gradients)."""
    r = random.Random(_seed(case_id))
    g = torch.Generator().manual_seed(_seed(case_id))
    dtype = r.choice([F32, BF16, F16])
    cls, args, kw, shape = _module_case(r, g)
    mixed = dtype != F32 and r.random() < 0.5
    layout = r.choice(["contig", "cl"] if len(shape) in (4, 5) else ["contig", "sliced"])
    scale, offset = draw_values(r, dtype)
    if not mixed and dtype == F16:
        scale = min(scale, 30.0)
    desc = dict(cls=cls, args=args, kw=kw, shape=shape, dtype=dtype, params_fp32=mixed, layout=layout,
                scale=scale, offset=offset)
    ctx = Ctx(case_id, desc, device)
    ref = getattr(torch.nn, cls)(*args, **kw).double()
    if cls == "RMSNorm" and ref.eps is None:
        ref.eps = EPS32  # eps=None is finfo(fp32).eps for 16/32-bit inputs; the float64 oracle would use fp64's
    with torch.no_grad():  # non-trivial parameters and buffers
        for name, p in ref.named_parameters():
            p.copy_(positive(g, p.shape) if name == "weight" else randn(g, p.shape))
        if getattr(ref, "running_var", None) is not None:
            ref.running_mean.copy_(offset + randn(g, ref.running_mean.shape, 0.3 * scale))
            ref.running_var.copy_(positive(g, ref.running_var.shape) * scale * scale)
        for t in list(ref.parameters()) + [bf for bf in ref.buffers() if bf.is_floating_point()]:
            t.copy_(t.to(F32 if mixed else dtype))  # the oracle gets the module's rounded values
    # (parameters and buffers are contiguous: Module.to keeps their strides)
    mod = normkit.nn.convert(copy.deepcopy(ref).to(F32 if mixed else dtype)).to(device)
    ctx.check(type(mod).__module__ == "normkit.nn", f"convert gave {type(mod)}")
    nd = len(shape)
    eps = getattr(ref, "eps", 1e-5)
    for step, train in enumerate([True, True, False]):
        mod.train(train)
        ref.train(train)
        x = make_input(g, shape, dtype, layout, scale, offset)
        gout = randn(g, shape).to(dtype)
        xl = leaf(to_device(x, device))
        rm_before = getattr(ref, "running_mean", None)  # the blend's old term (the module updates it in place)
        rm_before = None if rm_before is None else rm_before.detach().double().clone()
        y = mod(xl)
        y.backward(to_device(gout, device))
        x64 = d64(xl)
        cancel = _module_cancel(cls, ref, x64, gout, train, eps)
        y64 = ref(x64)
        y64.backward(gout.double().contiguous())
        xd = x64.detach()
        if cls.startswith("Batch"):
            red = [0] + list(range(2, nd))
            batch = train or not ref.track_running_stats
        elif cls.startswith("Instance"):
            red = list(range(2, nd))
            batch = train or not ref.track_running_stats
        else:
            red, batch = [nd - 1], True
        if cls == "GroupNorm":
            xs = xd.reshape(shape[0], ref.num_groups, -1)
            sp_ratio, xm = spread(xs, [2]), xhat_max(xs, [2], eps)
        elif cls == "RMSNorm":
            sp_ratio, xm = 0.0, xhat_max(xd, red, EPS32 if eps is None else eps, rms=True)
        elif batch:
            sp_ratio, xm = spread(xd, red), xhat_max(xd, red, eps)
        else:  # normalized with the running statistics
            cv = [1, shape[1]] + [1] * (nd - 2)
            sp_ratio = 0.0
            xm = ((xd - ref.running_mean.view(cv)).abs() / torch.sqrt(ref.running_var.view(cv) + eps)).max().item()
        extra = 4 * EPS32 * sp_ratio
        var_extra = 0.0
        if cls.startswith("Batch") and batch:  # the batch variance's rounding (see shift_cancellation)
            var_extra = 8 * EPS32 * shift_cancellation(xd, red, xl)
            extra += var_extra / 2
        extra_b = extra
        # 16-bit saved statistics (see run_group_norm): fp32 only where the module has fp32 parameters
        has_params = any(True for _ in mod.parameters())
        if cls == "GroupNorm" and not (mixed and has_params) and dtype != F32:
            extra_b += torch.finfo(dtype).eps * (sp_ratio + 1)
        tag = f"step {step} ({'train' if train else 'eval'})"
        w = getattr(ref, "weight", None)
        ctx.close(y, y64.detach(), TOL[dtype] + extra, f"{tag} y", den=_y_den(y64, w, x, eps))
        tb = TOL_BWD_BN if cls.startswith("Batch") else TOL_BWD
        den = cancel if cls.startswith("Batch") else max(torch.linalg.vector_norm(x64.grad).item(), 1e-2 * cancel)
        ctx.close(xl.grad, x64.grad, tb[dtype], f"{tag} x.grad", den=den, slack=extra_b * cancel)
        abs_sum = row_abs_sum(gout, args) if cls in ("LayerNorm", "RMSNorm") else chan_abs_sum(gout)
        pairs = [(name, p, p64) for (name, p), (_, p64) in zip(mod.named_parameters(), ref.named_parameters())]
        check_param_grads(ctx, pairs, dtype, tb, extra_b, abs_sum, xm)
        for _, p, p64 in pairs:
            p.grad = None
            p64.grad = None
        for (name, bf), (_, bf64) in zip(mod.named_buffers(), ref.named_buffers()):
            if name == "num_batches_tracked":
                ctx.check(int(bf) == int(bf64), f"{tag} num_batches_tracked {int(bf)} != {int(bf64)}")
                continue
            den = None
            if name == "running_mean" and train and cls.startswith(("Batch", "Instance")):
                if ref.momentum is not None:
                    m = ref.momentum
                else:  # batch norm's cumulative average; instance norm passes momentum 0
                    m = 0.0 if cls.startswith("Instance") else 1 / int(ref.num_batches_tracked)
                means, stds = xd.mean(red), xd.var(red, unbiased=False).sqrt()
                if cls.startswith("Instance"):  # the running mean moves towards the per-(n, c) statistics' average
                    means, stds = means.mean(0), stds.mean(0)
                den = blend_mean_den(rm_before, means, stds, m)
            ctx.close(bf, bf64, TOL_RUNNING[bf.dtype] + (extra if "mean" in name else var_extra), f"{tag} {name}",
                      den=den)
            with torch.no_grad():  # the next step starts from normkit's (rounded) buffers on both sides
                bf64.copy_(bf.cpu())


# ------------------------------------------------------------------------------------------- test entries

RUNNERS = {"batch_norm": run_batch_norm, "layer_norm": run_layer_norm, "rms_norm": run_rms_norm,
           "add_norm": run_add_norm, "group_norm": run_group_norm, "instance_norm": run_instance_norm,
           "module": run_modules}


def run_case(op, case_id, device):
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        pytest.skip("NORMKIT_RANDOM_DEVICE=cuda needs a CUDA device")
    RUNNERS[op](case_id, device)


@pytest.mark.parametrize("op,case_id", [pytest.param(op, cid, id=cid) for op in N_CASES for cid in _case_ids(op)])
def test_randomized(op, case_id):
    """One drawn case of ``op`` on NORMKIT_RANDOM_DEVICE (the CPU unless set). "module": two training steps
    and one eval step of a normkit.nn module against torch's module in float64 (momentum None: cumulative
    average; buffers, outputs, gradients)."""
    run_case(op, case_id, DEVICE)


# the same cases (the first N_CASES ids draw the same case as the CPU tests), CUDA_MULT times as many, on CUDA
_CUDA_CASES = [pytest.param(op, cid, id=cid) for op in N_CASES for cid in _case_ids(op, CUDA_MULT)]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("op,case_id", _CUDA_CASES)
def test_randomized_cuda(op, case_id):
    run_case(op, case_id, "cuda")


def _layout_inputs():
    """one tensor per layout make_input produces (and per dtype / rank that changes its strides)"""
    g = torch.Generator().manual_seed(0)
    for dtype in (F32, F16, BF16):
        for shape in ((3, 4), (2, 3, 5), (3, 2, 4, 5), (2, 3, 2, 3, 4)):
            for layout in ["contig", "sliced", "permuted", "offset", "transposed01", "expanded"] + (
                    ["cl", "cl_sliced"] if len(shape) in (4, 5) else []):
                yield make_input(g, shape, dtype, layout, 1.0, 0.0)
    yield torch.arange(24.0).view(2, 3, 4)[1:, ::2, 1::3]  # sliced along every dim, with an offset


def test_strided_copy():
    """to_device's copy reproduces sizes, strides, storage offset and values (checked here on the CPU; the
    CUDA test moves every input through it)"""
    for t in _layout_inputs():
        c = strided_copy(t, "cpu")
        assert c.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
        assert (c.shape, c.stride(), c.storage_offset(), c.dtype) == (t.shape, t.stride(), t.storage_offset(), t.dtype)
        assert torch.equal(c, t)
        for fmt in (torch.contiguous_format, torch.channels_last, torch.channels_last_3d):
            assert c.is_contiguous(memory_format=fmt) == t.is_contiguous(memory_format=fmt)
        lc = leaf(c)
        assert lc.is_leaf and lc.requires_grad
        assert (lc.stride(), lc.storage_offset()) == (t.stride(), t.storage_offset())
        assert to_device(t, "cpu") is t and to_device(None, "cuda") is None
