"""normkit.functional against the float64 reference (forward and grads), F-level errors, double backward,
and (when Triton imports) the Triton kernels through the interpreter in a subprocess."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import normkit
from normkit import reference

F64 = torch.float64


def _fresh(shape, dtype=torch.float32, scale=2.0, offset=0.5):
    return (torch.randn(shape, dtype=torch.float64) * scale + offset).to(dtype)


def _grads(out, inputs, g):
    return torch.autograd.grad(out, [t for t in inputs if t is not None], g)


def _tol(dtype):
    return {torch.float32: dict(rtol=1e-4, atol=1e-4), F64: dict(rtol=1e-7, atol=1e-7),
            torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}[dtype]


def _leaf(t):
    return None if t is None else t.detach().clone().requires_grad_()


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "3d"])
def test_batch_norm_vs_float64_reference(dtype, training, layout):
    shape = (3, 4, 5, 6) if layout != "3d" else (2, 4, 3, 5)
    x = _fresh(shape, dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    w, b = _fresh((4,), dtype), _fresh((4,), dtype)
    rm, rv = _fresh((4,), dtype), torch.rand(4, dtype=dtype) + 0.5
    rm64, rv64 = rm.double(), rv.double()
    xs, ws, bs = _leaf(x), _leaf(w), _leaf(b)
    y = normkit.batch_norm(xs, rm, rv, ws, bs, training=training, momentum=0.2, eps=1e-5)
    xr, wr, br = _leaf(x.double()), _leaf(w.double()), _leaf(b.double())
    yr = reference.native_batch_norm(xr, wr, br, rm64, rv64, training, 0.2, 1e-5)[0]
    assert y.dtype == dtype and y.shape == x.shape
    if layout == "channels_last":
        assert y.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y.double(), yr, **_tol(dtype))
    torch.testing.assert_close(rm.double(), rm64, **_tol(dtype))
    torch.testing.assert_close(rv.double(), rv64, **_tol(dtype))
    g = torch.randn_like(y)
    for a, e in zip(_grads(y, (xs, ws, bs), g), _grads(yr, (xr, wr, br), g.double())):
        torch.testing.assert_close(a.double(), e, **_tol(dtype))


def test_batch_norm_bf16_input_fp32_params():
    x = _fresh((4, 3, 6, 6), torch.bfloat16)
    w, b = _fresh((3,), torch.float32), _fresh((3,), torch.float32)
    rm, rv = torch.zeros(3), torch.ones(3)
    y = normkit.batch_norm(x, rm, rv, w, b, training=True)
    yr = reference.native_batch_norm(x.double(), w.double(), b.double(), None, None, True, 0.1, 1e-5)[0]
    assert y.dtype == torch.bfloat16 and rm.dtype == torch.float32
    torch.testing.assert_close(y.double(), yr, **_tol(torch.bfloat16))


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_and_rms_norm_vs_reference(affine):
    x = _fresh((2, 5, 3, 24))
    w = _fresh((3, 24)) if affine else None
    b = _fresh((3, 24)) if affine else None
    xs, ws, bs = _leaf(x), _leaf(w), _leaf(b)
    y = normkit.layer_norm(xs, (3, 24), ws, bs, eps=1e-5)
    xr, wr, br = _leaf(x.double()), _leaf(None if w is None else w.double()), _leaf(None if b is None else b.double())
    yr = reference.native_layer_norm(xr, [3, 24], wr, br, 1e-5)[0]
    torch.testing.assert_close(y.double(), yr, **_tol(torch.float32))
    g = torch.randn_like(y)
    for a, e in zip(_grads(y, (xs, ws, bs), g), _grads(yr, (xr, wr, br), g.double())):
        torch.testing.assert_close(a.double(), e, **_tol(torch.float32))
    y = normkit.rms_norm(xs, [24], None if ws is None else ws[0])
    yr = reference.rms_norm(xr, [24], None if wr is None else wr[0], None)
    torch.testing.assert_close(y.double(), yr, rtol=1e-4, atol=1e-4)
    for a, e in zip(_grads(y, (xs, ws), g), _grads(yr, (xr, wr), g.double())):
        torch.testing.assert_close(a.double(), e, **_tol(torch.float32))


def test_rms_norm_eps_none_and_channels_last():
    x = _fresh((2, 3, 4, 5)).contiguous(memory_format=torch.channels_last)
    y = normkit.rms_norm(x, [5])
    torch.testing.assert_close(y, F.rms_norm(x, [5]))
    assert y.is_contiguous(memory_format=torch.channels_last)
    xb = _fresh((4, 8), torch.bfloat16, scale=1e-3, offset=1e-3)
    torch.testing.assert_close(normkit.rms_norm(xb, [8]), F.rms_norm(xb, [8]))


def test_group_norm_and_instance_norm_match_torch():
    x = _fresh((3, 6, 4, 5), F64)
    w, b = _fresh((6,), F64), _fresh((6,), F64)
    xs, xt = _leaf(x), _leaf(x)
    torch.testing.assert_close(normkit.group_norm(xs, 3, w, b), F.group_norm(xt, 3, w, b))
    rm, rv = _fresh((6,), F64), torch.rand(6, dtype=F64) + 0.5
    rm_t, rv_t = rm.clone(), rv.clone()
    y = normkit.instance_norm(xs, rm, rv, w, b, use_input_stats=True, momentum=0.3)
    yt = F.instance_norm(xt, rm_t, rv_t, w, b, use_input_stats=True, momentum=0.3)
    torch.testing.assert_close(y, yt)
    torch.testing.assert_close(rm, rm_t)
    torch.testing.assert_close(rv, rv_t)
    g = torch.randn_like(y)
    torch.testing.assert_close(_grads(y, (xs,), g)[0], _grads(yt, (xt,), g)[0])
    torch.testing.assert_close(normkit.instance_norm(x, rm, rv, use_input_stats=False),
                               F.instance_norm(x, rm, rv, use_input_stats=False))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("create_graph", [False, True])
def test_group_and_instance_norm_bias_grad_without_weight_keeps_fp32_precision(dtype, create_graph):
    """A 16-bit input with an fp32 bias and no weight: the saved mean / rstd are fp32 (a mixed call, contract §5)
    and so are grad_bias / grad_weight of native_group_norm_backward, as batch norm's (aten's own kernels raise for
    weight None). bias.grad was the 16-bit-rounded sum (~1e-3 relative off), also under create_graph, whose
    statistics the double backward recomputed in the input's dtype."""
    seed = torch.seed() % 2**31
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(5, 4, 3, 2, generator=gen, dtype=F64) * 2 + 0.5).to(dtype)
    g = (torch.randn(x.shape, generator=gen, dtype=F64) + 1.0).to(dtype)  # channel sums away from 0
    exact = g.double().sum((0, 2, 3))
    for fn in (lambda b: normkit.group_norm(x, 2, None, b), lambda b: normkit.instance_norm(x, bias=b)):
        b = (torch.randn(4, generator=gen) + 0.5).requires_grad_()
        (gb,) = torch.autograd.grad(fn(b), (b,), g, create_graph=create_graph)
        assert gb.dtype == torch.float32
        assert ((gb.double() - exact).abs() / exact.abs()).max().item() < 1e-6, seed
    # aten level: fp32 statistics (mixed) -> fp32 grads; a pure 16-bit call's statistics and grads: the input's
    b = torch.randn(4, generator=gen) + 0.5
    for bias, want in ((b, torch.float32), (b.to(dtype), dtype)):
        _, mean, rstd = normkit.ops.native_group_norm(x, None, bias, 5, 4, 6, 2, 1e-5)
        assert mean.dtype == rstd.dtype == want
        gi, gw, gb = normkit.ops.native_group_norm_backward(g, x, mean, rstd, None, 5, 4, 6, 2, [True, True, True])
        assert gi.dtype == dtype and gw.dtype == gb.dtype == want
        torch.testing.assert_close(gb.double(), exact, rtol=1e-6 if want == torch.float32 else 2 ** -7, atol=0)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("entry", ["functional", "ops"])
def test_instance_norm_running_var_small_variance(entry, dtype, device):
    """Regressions (found by tests/test_randomized.py): the running variance was recovered from the saved
    rstd as rstd^-2 - eps, which loses everything once var << eps (x of scale 1e-6, eps 1e-5: 35 % off;
    scale 0.05, eps 0.1: 2e-6). It is now computed from the input, each instance shifted by its first element:
    on CUDA, fp32 torch.var of values near 1000 with std 0.1 was 9e-5 off, near 1 with std 1e-3 1.5e-5."""
    torch.manual_seed(0)
    for shape, scale, offset, eps in (((2, 3, 4, 5), 1e-6, 0, 1e-5), ((2, 3, 4, 5), 1e-5, 0, 1e-5),
                                      ((2, 3, 4, 5), 0.05, 0, 0.1), ((3, 16, 5, 1), 0.1, 1000, 1e-5),
                                      ((1, 7, 2, 2), 1e-3, 1, 1e-3), ((3, 3, 8), 1e-3, 1, 1e-5)):
        if dtype != torch.float32 and offset:  # 16-bit values near the offset carry no digits of the spread
            continue
        x = (torch.randn(shape, dtype=F64) * scale + offset).to(dtype).to(device)
        C = shape[1]
        rm, rv = torch.zeros(C, device=device), torch.ones(C, device=device)
        rm_t, rv_t = rm.double().cpu(), rv.double().cpu()
        if entry == "functional":
            normkit.instance_norm(x, rm, rv, use_input_stats=True, momentum=0.7, eps=eps)
        else:
            normkit.ops.instance_norm(x, None, None, rm, rv, True, 0.7, eps)
        F.instance_norm(x.double().cpu(), rm_t, rv_t, use_input_stats=True, momentum=0.7, eps=eps)
        torch.testing.assert_close(rv.double().cpu(), rv_t, rtol=1e-6, atol=0)
        torch.testing.assert_close(rm.double().cpu(), rm_t, rtol=1e-6, atol=1e-6 * scale)


def test_add_norms_return_sum_and_grads():
    x, r = _leaf(_fresh((2, 3, 16), F64)), _leaf(_fresh((2, 3, 16), F64))
    w, b = _leaf(_fresh((16,), F64)), _leaf(_fresh((16,), F64))
    y, s = normkit.add_layer_norm(x, r, (16,), w, b)
    torch.testing.assert_close(s, x + r)
    x2, r2, w2, b2 = (_leaf(t) for t in (x, r, w, b))
    s2 = x2 + r2
    y2 = F.layer_norm(s2, (16,), w2, b2)
    gy, gs = torch.randn_like(y), torch.randn_like(s)
    got = torch.autograd.grad((y, s), (x, r, w, b), (gy, gs))
    exp = torch.autograd.grad((y2, s2), (x2, r2, w2, b2), (gy, gs))
    for a, e in zip(got, exp):
        torch.testing.assert_close(a, e)
    y, s = normkit.add_rms_norm(x, r, [16], w, eps=1e-6)
    torch.testing.assert_close(y, F.rms_norm(x + r, [16], w, 1e-6))
    assert torch.autograd.gradcheck(lambda a, c, v: normkit.add_rms_norm(a, c, [16], v), (x, r, w))


@pytest.mark.parametrize("fn, torch_norm", [
    (normkit.add_layer_norm, lambda s, w: F.layer_norm(s, (16,), w)),
    (normkit.add_rms_norm, lambda s, w: F.rms_norm(s, (16,), w)),
])
def test_add_norms_promote_and_broadcast_as_torch_sum(fn, torch_norm):
    """x + residual in another dtype (an fp32 residual stream beside bf16 branches) or a broadcast residual: s is
    torch's sum (promoted, broadcast) and y its norm, gradients as torch's (compared in float64 where the sum is);
    same-shape, same-dtype pairs take the fused kernels. Unbroadcastable shapes get torch's error."""
    x, r, w = _leaf(_fresh((2, 3, 16), torch.float32)), _leaf(_fresh((2, 3, 16), F64)), _leaf(_fresh((16,), F64))
    y, s = fn(x, r, (16,), w)
    assert s.dtype == y.dtype == F64
    x2, r2, w2 = (_leaf(t) for t in (x, r, w))
    y2 = torch_norm(x2 + r2, w2)
    torch.testing.assert_close(s, x2 + r2, rtol=0, atol=0)
    torch.testing.assert_close(y, y2)
    gy = torch.randn_like(y)
    for a, e in zip(torch.autograd.grad(y, (x, r, w), gy), torch.autograd.grad(y2, (x2, r2, w2), gy)):
        torch.testing.assert_close(a, e)
    y, s = fn(x.double(), r[0, 0], (16,), w)  # a (16,) residual broadcast over the rows
    torch.testing.assert_close(y, torch_norm(x.double() + r[0, 0], w))
    assert s.shape == (2, 3, 16)
    with pytest.raises(RuntimeError, match="must match the size"):
        fn(x, r[:, :2].transpose(0, 1), (16,), w)


@pytest.mark.parametrize("fn, torch_norm", [(normkit.add_layer_norm, F.layer_norm), (normkit.add_rms_norm, F.rms_norm)])
@pytest.mark.parametrize("case", ["channels_last", "transposed", "complex"])
def test_add_norms_keep_torchs_layout_and_complex_grads(fn, torch_norm, case):
    """Pairs the fused kernels do not take (their outputs are contiguous and real): s keeps the layout torch's
    x + residual gives, y the norm's (RMS keeps channels_last), and complex pairs differentiate (the fused
    backward refused them)."""
    if case == "complex" and fn is normkit.add_layer_norm:
        pytest.skip("torch's layer_norm takes no complex input")
    shape, ns = {"channels_last": ((2, 3, 4, 5), [5]), "transposed": ((6, 4), [6]), "complex": ((4, 6), [6])}[case]
    x, r = _fresh(shape, F64), _fresh(shape, F64)
    if case == "channels_last":
        x, r = x.contiguous(memory_format=torch.channels_last), r.contiguous(memory_format=torch.channels_last)
    elif case == "transposed":
        x, r = x.t(), r.t()
    else:
        x, r = torch.complex(x, _fresh(shape, F64)), torch.complex(r, _fresh(shape, F64))
    x, r, x2, r2 = _leaf(x), _leaf(r), _leaf(x), _leaf(r)
    y, s = fn(x, r, ns)
    y2 = torch_norm(x2 + r2, ns)
    assert s.stride() == (x2 + r2).stride() and y.stride() == y2.stride()
    torch.testing.assert_close(y, y2)
    gy = torch.randn_like(y)
    for a, e in zip(torch.autograd.grad(y, (x, r), gy), torch.autograd.grad(y2, (x2, r2), gy)):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("call, norm_call", [
    (lambda x, w: normkit.add_layer_norm(x, x, [8], eps="a"), lambda x, w: normkit.layer_norm(x + x, [8], eps="a")),
    (lambda x, w: normkit.add_layer_norm(x, x, [8], [1.0] * 8), lambda x, w: normkit.layer_norm(x + x, [8], [1.0] * 8)),
    (lambda x, w: normkit.add_layer_norm(x, x, 8), lambda x, w: normkit.layer_norm(x + x, 8)),
    (lambda x, w: normkit.add_rms_norm(x, x, [8], w, "a"), lambda x, w: normkit.rms_norm(x + x, [8], w, "a")),
    (lambda x, w: normkit.add_rms_norm(x, x, [8], [1.0] * 8), lambda x, w: normkit.rms_norm(x + x, [8], [1.0] * 8)),
    (lambda x, w: normkit.add_rms_norm([1.0] * 8, x, [8]), lambda x, w: normkit.rms_norm([1.0] * 8 + x, [8])),
])
def test_add_norms_bad_arguments_get_the_norms_errors(call, norm_call):
    x, w = _fresh((2, 8)), _fresh((8,))
    with pytest.raises(Exception) as expected:
        norm_call(x, w)
    with pytest.raises(type(expected.value)) as got:
        call(x, w)
    assert str(got.value) == str(expected.value)


_AUTOCAST_CALLS = {  # (normkit's call, torch's), on a (4, 6, 5, 5) bf16 input and fp32 parameters
    "batch_norm": (lambda t, w: normkit.batch_norm(t, None, None, w[:6], None, training=True),
                   lambda t, w: F.batch_norm(t, None, None, w[:6], None, training=True)),
    "layer_norm": (lambda t, w: normkit.layer_norm(t, [5], w[:5]), lambda t, w: F.layer_norm(t, [5], w[:5])),
    "rms_norm": (lambda t, w: normkit.rms_norm(t, [5], w[:5]), lambda t, w: F.rms_norm(t, [5], w[:5])),
    "group_norm": (lambda t, w: normkit.group_norm(t, 3, w[:6]), lambda t, w: F.group_norm(t, 3, w[:6])),
    "instance_norm": (lambda t, w: normkit.instance_norm(t, weight=w[:6]),
                      lambda t, w: F.instance_norm(t, weight=w[:6])),
    "add_layer_norm": (lambda t, w: normkit.add_layer_norm(t, t, [5], w[:5])[0],
                       lambda t, w: F.layer_norm(t + t, [5], w[:5])),
    "add_rms_norm": (lambda t, w: normkit.add_rms_norm(t, t, [5], w[:5])[0],
                     lambda t, w: F.rms_norm(t + t, [5], w[:5])),
}


@pytest.mark.parametrize("policy", ["cpu", "cuda"])
@pytest.mark.parametrize("op", list(_AUTOCAST_CALLS))
def test_autocast_follows_torchs_policy(op, policy, monkeypatch):
    """Under autocast normkit's functions give torch's output dtype: torch's autocast runs layer / group / RMS
    norm in fp32 on CUDA and none of the norms on the CPU. "cuda": CUDA's lists emulated on the CPU (the
    CPU's autocast key mapped to CUDA's registrations), against torch's op on fp32 copies as CUDA's autocast
    would call it."""
    from normkit import functional as NF

    ours, theirs = _AUTOCAST_CALLS[op]
    if policy == "cuda":
        monkeypatch.setattr(NF, "_AUTOCAST_OPS", NF._autocast_registrations({"cpu": "AutocastCUDA"}))
    x = _fresh((4, 6, 5, 5), torch.bfloat16).requires_grad_()
    w = _fresh((6,), torch.float32, 0.3, 1.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = ours(x, w)
    upcast = policy == "cuda" and op not in ("batch_norm", "instance_norm")
    if upcast:
        want = theirs(x.float(), w)  # autocast's fp32 policy: fp32 tensors, autocast off inside
    else:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            want = theirs(x, w)
    assert y.dtype == want.dtype == (torch.float32 if upcast else torch.bfloat16)
    torch.testing.assert_close(y, want, **_tol(y.dtype))
    (gx,) = torch.autograd.grad(y.float().sum(), x)
    assert gx.dtype == torch.bfloat16


_TRANSFORM_CALLS = {  # (normkit's call, torch's call) on one sample of a (B, 3, 6) batch
    "batch_norm": (lambda t, w: normkit.batch_norm(t, None, None, w, None, training=True),
                   lambda t, w: F.batch_norm(t, None, None, w, None, training=True)),
    "layer_norm": (lambda t, w: normkit.layer_norm(t, [6], w.repeat(2)[:6]),
                   lambda t, w: F.layer_norm(t, [6], w.repeat(2)[:6])),
    "rms_norm": (lambda t, w: normkit.rms_norm(t, [6], w.repeat(2)[:6]),
                 lambda t, w: F.rms_norm(t, [6], w.repeat(2)[:6])),
    "group_norm": (lambda t, w: normkit.group_norm(t, 3, w),
                   lambda t, w: F.group_norm(t, 3, w)),
    "instance_norm": (lambda t, w: normkit.instance_norm(t, weight=w),
                      lambda t, w: F.instance_norm(t, weight=w)),
    "add_layer_norm": (lambda t, w: sum(normkit.add_layer_norm(t, t * 0.5, [6], w.repeat(2)[:6])),
                       lambda t, w: F.layer_norm(t * 1.5, [6], w.repeat(2)[:6]) + t * 1.5),
    "add_rms_norm": (lambda t, w: sum(normkit.add_rms_norm(t, t * 0.5, [6], w.repeat(2)[:6])),
                     lambda t, w: F.rms_norm(t * 1.5, [6], w.repeat(2)[:6]) + t * 1.5),
}


@pytest.mark.parametrize("op", list(_TRANSFORM_CALLS))
def test_torch_func_transforms_use_torchs_op(op):
    """vmap / grad / per-sample gradients (vmap of grad) / forward-mode dual tensors through normkit's functions
    give torch's values: there normkit calls torch's own op (its autograd Functions take plain tensors)."""
    from torch.func import grad, vmap

    ours, theirs = _TRANSFORM_CALLS[op]
    x = _fresh((4, 2, 3, 6), torch.float64)
    w = _fresh((3,), torch.float64)
    torch.testing.assert_close(vmap(ours, in_dims=(0, None))(x, w), vmap(theirs, in_dims=(0, None))(x, w))

    def loss(f):
        return lambda t, w: (f(t, w) ** 3).sum()

    torch.testing.assert_close(grad(loss(ours), argnums=(0, 1))(x[0], w), grad(loss(theirs), argnums=(0, 1))(x[0], w))
    per_sample = vmap(grad(loss(ours), argnums=1), in_dims=(0, None))(x, w)
    torch.testing.assert_close(per_sample, vmap(grad(loss(theirs), argnums=1), in_dims=(0, None))(x, w))
    assert not normkit.functional._in_transform(x, w)  # plain tensors still take normkit's path
    import torch.autograd.forward_ad as fwAD  # forward mode with dual tensors

    tangent = torch.randn_like(x[0])
    with fwAD.dual_level():
        got = fwAD.unpack_dual(ours(fwAD.make_dual(x[0], tangent), w)).tangent
        want = fwAD.unpack_dual(theirs(fwAD.make_dual(x[0], tangent), w)).tangent
        assert not normkit.functional._in_transform(x, w)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("op", list(_TRANSFORM_CALLS))
def test_compiled_torch_func_transforms(op):
    """The same per-sample gradients (vmap of grad) compiled with fullgraph: Dynamo must see the transform too
    (normkit's autograd Functions under a functorch transform failed to compile)."""
    from torch.func import grad, vmap

    ours, theirs = _TRANSFORM_CALLS[op]
    x, w = _fresh((4, 2, 3, 6), torch.float64), _fresh((3,), torch.float64)

    def per_sample(f):
        return vmap(grad(lambda t, w: (f(t, w) ** 3).sum(), argnums=1), in_dims=(0, None))(x, w)

    torch._dynamo.reset()
    got = torch.compile(lambda: per_sample(ours), fullgraph=True, backend="aot_eager")()
    torch.testing.assert_close(got, per_sample(theirs))


@pytest.mark.parametrize("training", [True, False])
def test_gradgradcheck_batch_norm(training):
    x = _leaf(_fresh((3, 2, 4), F64))
    w, b = _leaf(_fresh((2,), F64)), _leaf(_fresh((2,), F64))
    rm, rv = _fresh((2,), F64), torch.rand(2, dtype=F64) + 0.5
    assert torch.autograd.gradgradcheck(
        lambda x, w, b: normkit.batch_norm(x, rm.clone(), rv.clone(), w, b, training=training), (x, w, b))


def test_gradgradcheck_layer_norm_and_rms_norm():
    x = _leaf(_fresh((2, 3, 5), F64))
    w, b = _leaf(_fresh((5,), F64)), _leaf(_fresh((5,), F64))
    assert torch.autograd.gradgradcheck(lambda x, w, b: normkit.layer_norm(x, (5,), w, b), (x, w, b))
    assert torch.autograd.gradgradcheck(lambda x, w: normkit.rms_norm(x, (5,), w), (x, w))


@pytest.mark.parametrize("call, exc, msg", [
    (lambda rm, rv: normkit.batch_norm(torch.randn(1, 3), rm, rv, training=True), ValueError,
     "Expected more than 1 value per channel when training, got input size torch.Size([1, 3])"),
    (lambda rm, rv: normkit.batch_norm(torch.randn(2, 3), rm, rv, training=True, eps=0.0), ValueError,
     "batch_norm eps must be positive during training, but got 0.0"),
    (lambda rm, rv: normkit.batch_norm(torch.randn(2, 3), rm, rv, eps=-1.0), ValueError,
     "batch_norm eps must be non-negative, but got -1.0"),
    (lambda rm, rv: normkit.batch_norm(torch.randn(2, 3), rm, rv, torch.ones(4), training=True), RuntimeError,
     "weight should contain 3 elements not 4"),
    (lambda rm, rv: normkit.batch_norm(torch.randn(2, 3), rm, None, training=True), ValueError,
     "running_mean and running_var must either both be None or neither be None"),
    (lambda rm, rv: normkit.batch_norm(torch.randn(2, 3), None, None), RuntimeError,
     "running_mean must be defined in evaluation mode"),
    (lambda rm, rv: normkit.layer_norm(torch.randn(2, 3, 4, 5), [4]), RuntimeError,
     "Given normalized_shape=[4], expected input with shape [*, 4], but got input of size[2, 3, 4, 5]"),
    (lambda rm, rv: normkit.rms_norm(torch.randn(2, 3, 8), [4]), RuntimeError,
     "Given normalized_shape=[4], expected input with shape [*4], but got input of size[2, 3, 8]"),
    (lambda rm, rv: normkit.layer_norm(torch.randn(2, 5), 5), TypeError, "normalized_shape"),
    (lambda rm, rv: normkit.group_norm(torch.randn(2, 6, 4, 5), 4), RuntimeError,
     "Expected number of channels in input to be divisible by num_groups, but got input of shape [2, 6, 4, 5] and num_groups=4"),
    (lambda rm, rv: normkit.instance_norm(torch.randn(2, 3, 1)), ValueError,
     "Expected more than 1 spatial element when training, got input size torch.Size([2, 3, 1])"),
    (lambda rm, rv: normkit.batch_norm(torch.ones(2, 3, dtype=torch.long), rm, rv, training=True),
     NotImplementedError, "\"batch_norm\" not implemented for 'Long'"),
    (lambda rm, rv: normkit.batch_norm(_fresh((4, 3)), rm, rv, training=True, momentum=None), TypeError,
     "batch_norm(): argument 'momentum' (position 7) must be float, not NoneType"),
    (lambda rm, rv: normkit.instance_norm(_fresh((2, 3, 4)), rm, rv, momentum=None), TypeError,
     "instance_norm(): argument 'momentum' (position 7) must be float, not NoneType"),
    (lambda rm, rv: normkit.batch_norm(_fresh((4, 3)), rm.requires_grad_(), rv, training=True), RuntimeError,
     "The function 'native_batch_norm' is not differentiable with respect to argument 'running_mean'. "
     "This input cannot have requires_grad True."),
    (lambda rm, rv: normkit.batch_norm(_fresh((4, 3)), rm, rv.requires_grad_()), RuntimeError,
     "The function 'native_batch_norm' is not differentiable with respect to argument 'running_var'."),
    (lambda rm, rv: normkit.instance_norm(_fresh((2, 3, 4)), rm.requires_grad_(), rv), RuntimeError,
     "The function 'native_batch_norm' is not differentiable with respect to argument 'running_mean'."),
    (lambda rm, rv: normkit.instance_norm(_fresh((0, 3, 4)), rm.requires_grad_(), rv), RuntimeError,
     "a view of a leaf Variable that requires grad is being used in an in-place operation."),
])
def test_functional_errors_exact_and_stats_untouched(call, exc, msg):
    rm, rv = _fresh((3,)), torch.rand(3) + 0.5
    rm0, rv0 = rm.clone(), rv.clone()
    with pytest.raises(exc) as info:
        call(rm, rv)
    assert msg in str(info.value)
    assert torch.equal(rm, rm0) and torch.equal(rv, rv0)


@pytest.mark.parametrize("fn", ["batch_norm", "instance_norm"])
def test_running_stats_requiring_grad_are_updated_under_no_grad_like_torch(fn):
    x, rm, rv = _fresh((4, 3, 5)), _fresh((3,)), torch.rand(3) + 0.5
    rm0, expected = rm.clone(), [rm.clone(), rv.clone()]
    kwargs = {"training": True} if fn == "batch_norm" else {}
    with torch.no_grad():
        getattr(F, fn)(x, *expected, **kwargs)
        getattr(normkit, fn)(x, rm.requires_grad_(), rv.requires_grad_(), **kwargs)
    assert not torch.equal(rm.detach(), rm0)
    torch.testing.assert_close(rm.detach(), expected[0])
    torch.testing.assert_close(rv.detach(), expected[1])


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("strided_stats", [False, True])
def test_eval_backward_after_a_training_step_on_the_same_running_stats(dtype, strided_stats):
    """aten writes running stats without bumping their autograd version: an eval forward saves them, a training
    step updates them in place, and the eval output's backward still runs, with the updated values (as torch's).
    The reference path (fp64, CPU) and the kernel path's write-back of strided stats used to bump it and raise."""
    rm = _fresh((8,), dtype)[::2] if strided_stats else _fresh((4,), dtype)
    rv = (torch.rand(8, dtype=dtype) + 0.5)[::2] if strided_stats else torch.rand(4, dtype=dtype) + 0.5
    x, g = _leaf(_fresh((5, 4, 3), dtype)), _fresh((5, 4, 3), dtype)
    y = normkit.batch_norm(x, rm, rv, training=False, eps=1e-5)
    rv_before = rv.clone()
    normkit.batch_norm(_fresh((6, 4, 3), dtype), rm, rv, training=True, momentum=0.5)
    assert not torch.equal(rv, rv_before)
    (gx,) = torch.autograd.grad(y, x, g)
    expected = g.double() * torch.rsqrt(rv.double() + 1e-5).view(1, 4, 1)
    torch.testing.assert_close(gx.double(), expected, **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("strided_stats", [False, True])
def test_batch_norm_updates_running_stats_under_inference_mode(dtype, strided_stats):
    """Running stats made under torch.inference_mode (inference tensors, no autograd version counter) are updated
    in place as torch's F.batch_norm updates them; normkit's version-preserving write raised "Inference tensors do
    not track version counter"."""
    x = _fresh((5, 4, 3), dtype)
    with torch.inference_mode():
        rm = _fresh((8,), dtype)[::2] if strided_stats else _fresh((4,), dtype)
        rv = (torch.rand(8, dtype=dtype) + 0.5)[::2] if strided_stats else torch.rand(4, dtype=dtype) + 0.5
        rm_t, rv_t, rv0 = rm.clone(), rv.clone(), rv.clone()
        y = normkit.batch_norm(x, rm, rv, training=True, momentum=0.3)
        y_t = F.batch_norm(x, rm_t, rv_t, training=True, momentum=0.3)
    assert rv.is_inference() and not torch.equal(rv, rv0)
    torch.testing.assert_close(y, y_t, **_tol(dtype))
    torch.testing.assert_close(rm, rm_t, **_tol(dtype))
    torch.testing.assert_close(rv, rv_t, **_tol(dtype))


def _bad_argument_calls():
    np = pytest.importorskip("numpy")
    x, x3 = _fresh((2, 8)), _fresh((2, 8, 3))
    w, ints = torch.rand(8) + 0.5, torch.arange(1, 9)
    return [
        ("layer_norm", (x, (8.0,)), {}), ("layer_norm", (x, (True,)), {}), ("layer_norm", (x, (8,)), {"eps": "a"}),
        ("layer_norm", (x, (8,)), {"eps": None}), ("layer_norm", (x, (8,), [1.0] * 8), {}),
        ("layer_norm", (x, (8,), ints), {}), ("layer_norm", (x, (8,), w.to(torch.complex64)), {}),
        ("layer_norm", ([1.0] * 8, (8,)), {}), ("layer_norm", (x, (8,), np.ones(8, dtype=np.float32)), {}),
        ("layer_norm", (x, (np.int64(8),)), {}), ("layer_norm", (x, (torch.tensor(8),)), {}),
        ("rms_norm", (x, (8,)), {"eps": "a"}), ("rms_norm", (x, (8,), [1.0] * 8), {}),
        ("rms_norm", (x, (8.0,)), {}),
        ("batch_norm", (x, None, None), {"training": True, "momentum": "a"}),
        ("batch_norm", (x, None, None), {"training": True, "eps": torch.tensor([1e-5])}),
        ("batch_norm", (x, None, None), {"training": True, "eps": torch.tensor(1e-5)}),
        ("batch_norm", (x, None, None), {"training": 1}), ("batch_norm", (x, None, None), {"training": None}),
        ("batch_norm", (x, [0.0] * 8, [1.0] * 8), {}), ("batch_norm", ([1.0] * 8, None, None), {}),
        ("batch_norm", (x, None, None, ints), {"training": True}),
        ("batch_norm", (x.double(), None, None, ints), {"training": True}),
        ("group_norm", (x3, 2.0), {}), ("group_norm", (x3, True), {}), ("group_norm", (x3, np.int64(2)), {}),
        ("group_norm", (x3, 2), {"eps": "a"}), ("group_norm", (x3, 2, [1.0] * 8), {}),
        ("group_norm", (x3, 2, ints), {}),
        ("instance_norm", (x3,), {"momentum": "a"}), ("instance_norm", (x3,), {"use_input_stats": "yes"}),
        ("instance_norm", (x3,), {"weight": [1.0] * 8}),
    ]


@pytest.mark.parametrize("case", range(32))
def test_bad_arguments_get_torchs_error(case):
    """Arguments of the wrong Python type or dtype (a float in normalized_shape, a str eps, a list weight, a bool
    num_groups, an int or complex weight): torch's TypeError / RuntimeError with its text, as torch.nn.functional
    raises it on the CPU (normkit accepted several of them, computing with a float shape or casting an int or
    complex weight); accepted ones (numpy ints, 0-dim tensors) give torch's values."""
    calls = _bad_argument_calls()
    assert len(calls) == 32
    name, args, kwargs = calls[case]
    outcomes = []
    for fn in (getattr(F, name), getattr(normkit, name)):
        try:
            outcomes.append(("ok", fn(*args, **kwargs)))
        except Exception as e:  # noqa: BLE001 - the type and text are what is compared
            outcomes.append((type(e), str(e)))
    (kind_t, got_t), (kind_n, got_n) = outcomes
    assert kind_n == kind_t, (name, kwargs, got_t, got_n)
    if kind_t == "ok":
        torch.testing.assert_close(got_n, got_t)
    else:
        assert got_n == got_t


@pytest.mark.parametrize("name", ["batch_norm", "instance_norm", "layer_norm", "rms_norm"])
def test_none_input_gets_torchs_type_error(name):
    """input=None where torch's argument parser is the first to see it: its TypeError, not an AttributeError from
    normkit's checks (batch norm in eval, instance norm with running stats). Training-mode batch / instance norm and
    group norm read input.size() / .dim() in Python first: an AttributeError in torch too."""
    rm, rv = _fresh((4,)), torch.rand(4) + 0.5
    args, kwargs = {"batch_norm": ((rm, rv), {}), "instance_norm": ((rm, rv), {"use_input_stats": False}),
                    "layer_norm": (((4,),), {}), "rms_norm": (((4,),), {})}[name]
    msg = rf"^{name}\(\): argument 'input' \(position 1\) must be Tensor, not NoneType$"
    for fn in (getattr(F, name), getattr(normkit, name)):
        with pytest.raises(TypeError, match=msg):
            fn(None, *args, **kwargs)


def test_empty_batch_keeps_stats_and_gives_zero_param_grads():
    x = torch.randn(0, 3, 4, requires_grad=True)
    w, b = _leaf(torch.randn(3)), _leaf(torch.randn(3))
    rm, rv = torch.randn(3), torch.rand(3) + 0.5
    rm0 = rm.clone()
    y = normkit.batch_norm(x, rm, rv, w, b, training=True)
    assert y.shape == x.shape
    y.sum().backward()
    assert torch.equal(rm, rm0) and torch.equal(w.grad, torch.zeros(3)) and torch.equal(b.grad, torch.zeros(3))


def _kernels_importable():
    from normkit import kernels

    if not kernels.available():
        return False
    try:
        import normkit.kernels.batch_norm  # noqa: F401
        import normkit.kernels.layer_norm  # noqa: F401
    except Exception:
        return False
    return True


_INTERPRETER_SCRIPT = textwrap.dedent(
    """
    import torch, torch.nn.functional as F
    import normkit
    from normkit.ops import _select
    torch.manual_seed(0)
    assert _select.kernels_for("batch_norm", torch.empty(1)) is not None
    def check(a, e, tol=2e-5):
        torch.testing.assert_close(a, e, rtol=tol, atol=tol)
    for layout in ("contiguous", "channels_last"):
        x = torch.randn(3, 4, 5, 6) * 2 + 1
        if layout == "channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
        x.requires_grad_()
        w = torch.randn(4, requires_grad=True); b = torch.randn(4, requires_grad=True)
        rm, rv = torch.randn(4), torch.rand(4) + 0.5
        rm2, rv2 = rm.clone(), rv.clone()
        for training in (True, False):
            y = normkit.batch_norm(x, rm, rv, w, b, training=training)
            y2 = F.batch_norm(x, rm2, rv2, w, b, training=training)
            check(y, y2); check(rm, rm2); check(rv, rv2)
            g = torch.randn_like(y)
            for a, e in zip(torch.autograd.grad(y, (x, w, b), g), torch.autograd.grad(y2, (x, w, b), g)):
                check(a, e, 1e-4)
    x = torch.randn(2, 3, 40, requires_grad=True)
    w = torch.randn(40, requires_grad=True); b = torch.randn(40, requires_grad=True)
    y, y2 = normkit.layer_norm(x, (40,), w, b), F.layer_norm(x, (40,), w, b)
    g = torch.randn_like(y)
    check(y, y2)
    for a, e in zip(torch.autograd.grad(y, (x, w, b), g), torch.autograd.grad(y2, (x, w, b), g)):
        check(a, e, 1e-4)
    y, y2 = normkit.rms_norm(x, (40,), w), F.rms_norm(x, (40,), w)
    check(y, y2)
    for a, e in zip(torch.autograd.grad(y, (x, w), g), torch.autograd.grad(y2, (x, w), g)):
        check(a, e, 1e-4)
    r = torch.randn(2, 3, 40)
    y, s = normkit.add_layer_norm(x, r, (40,), w, b)
    check(s, x + r); check(y, F.layer_norm(x + r, (40,), w, b))
    y, s = normkit.add_rms_norm(x, r, (40,), w)
    check(y, F.rms_norm(x + r, (40,), w))
    xb = torch.randn(4, 3, 5, dtype=torch.bfloat16)
    yb = normkit.batch_norm(xb, None, None, torch.ones(3), torch.zeros(3), training=True)
    check(yb.float(), F.batch_norm(xb.float(), None, None, training=True), 2e-2)
    xh = torch.randn(4, 3, 5, dtype=torch.float16)
    rmh, rvh = torch.zeros(3, dtype=torch.float16), torch.ones(3, dtype=torch.float16)
    gi, gw, gb = normkit.ops.native_batch_norm_backward(torch.randn_like(xh), xh, None, rmh, rvh, None, None, False,
                                                        1e-5, [True, True, True])
    assert gw.dtype == gb.dtype == torch.float16, (gw.dtype, gb.dtype)  # an absent weight's grads: x's dtype
    print("INTERPRETER-OK")
    """
)


@pytest.mark.skipif(not _kernels_importable(), reason="Triton kernels not importable")
def test_functional_through_triton_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", _INTERPRETER_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "INTERPRETER-OK" in proc.stdout


# ----------------------------------------------------------------------------------------------- GPU

@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, F64])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_cuda_functional_vs_float64_reference(dtype, layout):
    torch.manual_seed(1)
    x = _fresh((6, 12, 9, 10), dtype).cuda()
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    pdt = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    w, b = _fresh((12,), pdt).cuda(), _fresh((12,), pdt).cuda()
    rm, rv = _fresh((12,), pdt).cuda(), (torch.rand(12, dtype=pdt) + 0.5).cuda()
    rm64, rv64 = rm.double(), rv.double()
    tol = {torch.float32: dict(rtol=1e-4, atol=1e-4), F64: dict(rtol=1e-9, atol=1e-9),
           torch.float16: dict(rtol=4e-3, atol=4e-3), torch.bfloat16: dict(rtol=3e-2, atol=3e-2)}[dtype]
    xs, ws, bs = _leaf(x), _leaf(w), _leaf(b)
    y = normkit.batch_norm(xs, rm, rv, ws, bs, training=True, momentum=0.2)
    xr, wr, br = _leaf(x.double()), _leaf(w.double()), _leaf(b.double())
    yr = reference.native_batch_norm(xr, wr, br, rm64, rv64, True, 0.2, 1e-5)[0]
    torch.testing.assert_close(y.double(), yr, **tol)
    torch.testing.assert_close(rv.double(), rv64, rtol=1e-4, atol=1e-4)
    assert y.is_contiguous(memory_format=torch.channels_last) == (layout == "channels_last")
    g = torch.randn_like(y)
    for a, e in zip(_grads(y, (xs, ws, bs), g), _grads(yr, (xr, wr, br), g.double())):
        torch.testing.assert_close(a.double(), e, **tol)
    lw = _fresh((10,), dtype).cuda()
    xs2, lws, xr2, lwr = _leaf(x), _leaf(lw), _leaf(x.double()), _leaf(lw.double())
    for fn, rfn in ((lambda t, v: normkit.layer_norm(t, (10,), v, None),
                     lambda t, v: reference.native_layer_norm(t, [10], v, None, 1e-5)[0]),
                    (lambda t, v: normkit.rms_norm(t, (10,), v),
                     lambda t, v: reference.rms_norm(t, [10], v, None))):
        y, yr = fn(xs2, lws), rfn(xr2, lwr)
        torch.testing.assert_close(y.double(), yr, **tol)
        g = torch.randn_like(y)
        for a, e in zip(_grads(y, (xs2, lws), g), _grads(yr, (xr2, lwr), g.double())):
            torch.testing.assert_close(a.double(), e, rtol=tol["rtol"] * 4, atol=tol["atol"] * 4)


@pytest.mark.cuda
@pytest.mark.parametrize("cls,args,shape", [
    ("LayerNorm", (64,), (8, 16, 64)), ("RMSNorm", (64,), (8, 16, 64)), ("GroupNorm", (4, 32), (8, 32, 6, 6)),
    ("BatchNorm2d", (32,), (8, 32, 6, 6)), ("InstanceNorm2d", (32,), (8, 32, 6, 6))])
def test_cuda_autocast_modules_match_torch(cls, args, shape):
    """normkit.nn modules under CUDA autocast give torch.nn's output dtype and values (layer / group / RMS
    norm in fp32, the others in the input's dtype), gradients in the input's dtype."""
    torch.manual_seed(0)
    ours, theirs = getattr(normkit.nn, cls)(*args).cuda(), getattr(torch.nn, cls)(*args).cuda()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y, want = ours(x), theirs(x2)
    assert y.dtype == want.dtype
    torch.testing.assert_close(y, want, **_tol(y.dtype if y.dtype != torch.float32 else torch.bfloat16))
    y.float().square().sum().backward()
    want.float().square().sum().backward()
    assert x.grad.dtype == x2.grad.dtype == torch.bfloat16
    torch.testing.assert_close(x.grad, x2.grad, rtol=3e-2, atol=3e-2)


@pytest.mark.cuda
def test_cuda_compile_inductor_functional_and_enable():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.LayerNorm(10),
                            torch.nn.RMSNorm(10)).cuda()
    x = torch.randn(4, 3, 10, 10, device="cuda")
    ref = m(x)
    ours = normkit.nn.convert(m)
    compiled = torch.compile(ours, fullgraph=True)
    m.eval()
    torch.testing.assert_close(compiled(x), m(x), rtol=1e-4, atol=1e-4)
    with normkit.enabled():  # compile under enable(): traced with fake tensors, normkit's kernels not called
        plain = torch.nn.Sequential(torch.nn.BatchNorm2d(3), torch.nn.LayerNorm(10)).cuda().eval()
        torch.testing.assert_close(torch.compile(plain)(x), plain(x), rtol=1e-4, atol=1e-4)
    assert ref.shape == x.shape[:1] + (8, 10, 10)


@pytest.mark.parametrize("call", [
    lambda x, ns: normkit.rms_norm(x, ns),
    lambda x, ns: normkit.add_rms_norm(x, x.clone(), ns),
    lambda x, ns: normkit.ops.rms_norm(x, ns),
    lambda x, ns: normkit.nn.RMSNorm(ns)(x),
])
@pytest.mark.parametrize("shape, ns", [((2, 3), [1, 2, 3]), ((), [1])])
def test_rms_norm_rank_error_is_torchs_value_error(call, shape, ns):
    # aten::rms_norm: "Input tensor must have at least k dimensions" (ValueError), not the shape RuntimeError
    x = _fresh(shape)
    with pytest.raises(ValueError) as expected:
        F.rms_norm(x, ns)
    with pytest.raises(ValueError) as got:
        call(x, ns)
    assert str(got.value) == str(expected.value)


@pytest.mark.parametrize("fmt, shape", [(torch.channels_last, (2, 3, 4, 5)), (torch.channels_last_3d, (2, 3, 2, 3, 4))])
def test_rms_norm_grad_input_keeps_channels_last(fmt, shape):
    # aten's rms_norm keeps a channels_last input's layout for the output; grad_input follows the incoming gradient
    x = _leaf(_fresh(shape).contiguous(memory_format=fmt))
    w = _leaf(_fresh(shape[-1:]))
    xr, wr = _leaf(x.double()), _leaf(w.double())
    y, yr = normkit.rms_norm(x, shape[-1:], w), F.rms_norm(xr, shape[-1:], wr)
    g = torch.randn(shape)
    gx, gw = _grads(y, (x, w), g)
    gxr, gwr = _grads(yr, (xr, wr), g.double())
    assert y.is_contiguous(memory_format=fmt) and gx.stride() == gxr.stride()
    torch.testing.assert_close(y.double(), yr, **_tol(torch.float32))
    torch.testing.assert_close(gx.double(), gxr, **_tol(torch.float32))
    torch.testing.assert_close(gw.double(), gwr, **_tol(torch.float32))


def test_instance_norm_empty_batch_with_weight_raises_torchs_error():
    # the (1, 0, *) view repeats weight 0 times; ATen's weight[0] is select(), whose IndexError text differs
    x, w = torch.randn(0, 3, 5), _fresh((3,))
    with pytest.raises(IndexError) as expected:
        F.instance_norm(x, weight=w)
    with pytest.raises(IndexError) as got:
        normkit.instance_norm(x, weight=w)
    assert str(got.value) == str(expected.value)


@pytest.mark.parametrize("case", ["weight_size", "running_size", "eval_no_stats", "one_stat", "long", "1d"])
def test_empty_batch_returns_before_any_check_like_torch(case):
    # torch.batch_norm returns for an empty input before its size / running-stat / dtype checks
    x, w, rm, rv, training = torch.randn(0, 3, 4), None, None, None, True
    if case == "weight_size":
        w = _fresh((4,))
    elif case == "running_size":
        rm, rv = _fresh((4,)), torch.rand(4) + 0.5
    elif case == "eval_no_stats":
        training = False
    elif case == "one_stat":
        rm = _fresh((3,))
    elif case == "long":
        x = x.long()
    else:
        x = torch.randn(0)
    saved = None if rm is None else rm.clone()
    expected = F.batch_norm(x, rm, rv, w, None, training)
    got = normkit.batch_norm(x, rm, rv, w, None, training)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    assert saved is None or torch.equal(rm, saved)


@pytest.mark.parametrize("fn", ["add_layer_norm", "add_rms_norm"])
def test_add_norm_sum_only_gives_no_param_grads(fn):
    # only s = x + residual used: like torch's `s = x + r; y = norm(s)`, weight/bias get no gradient (None)
    x, r, w, b = _leaf(_fresh((2, 3, 8))), _leaf(_fresh((2, 3, 8))), _leaf(_fresh((8,))), _leaf(_fresh((8,)))
    y, s = normkit.add_layer_norm(x, r, [8], w, b) if fn == "add_layer_norm" else normkit.add_rms_norm(x, r, [8], w)
    g = torch.randn(2, 3, 8)
    gx, gr, gw, gb = torch.autograd.grad(s, (x, r, w, b), g, allow_unused=True)
    assert gw is None and gb is None
    torch.testing.assert_close(gx, g)
    torch.testing.assert_close(gr, g)


def _aten_ops_in_backward(y, leaves):
    """The ops dispatched while autograd runs y's backward (a fresh gradient each time)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func.name())
            return func(*args, **(kwargs or {}))

    dy = torch.randn_like(y)
    with Log() as log:
        torch.autograd.grad(y, leaves, dy)
    return log.ops


def test_backward_launches_nothing_for_the_statistics_outputs():
    # mean / rstd / saved invstd get no gradient: autograd must not fill zero tensors for them (one
    # kernel launch each on a GPU, every backward); only normkit's backward op runs
    import normkit.ops.custom as CU

    x = torch.randn(6, 5, 4, 4, requires_grad=True)
    w, b = torch.rand(5, requires_grad=True), torch.randn(5, requires_grad=True)
    rm, rv = torch.zeros(5), torch.ones(5)
    x2 = torch.randn(6, 32, requires_grad=True)
    w2, b2 = torch.rand(32, requires_grad=True), torch.randn(32, requires_grad=True)
    cases = [
        (normkit.batch_norm(x, rm, rv, w, b, True, 0.1, 1e-5), [x, w, b], "normkit::batch_norm_backward"),
        (normkit.layer_norm(x2, [32], w2, b2), [x2, w2, b2], "normkit::layer_norm_backward"),
        (normkit.rms_norm(x2, [32], w2), [x2, w2], "normkit::rms_norm_backward"),
        # the custom ops' own autograd (direct callers of torch.ops.normkit.*)
        (CU.layer_norm(x2, [32], w2, b2, 1e-5)[0], [x2, w2, b2], "normkit::layer_norm_backward"),
        (CU.rms_norm(x2, [32], w2, 1e-6)[0], [x2, w2], "normkit::rms_norm_backward"),
    ]
    for y, leaves, op in cases:
        ops = _aten_ops_in_backward(y, leaves)
        assert [o for o in ops if o != "aten::detach"] == [op], ops


@pytest.mark.parametrize("use_input_stats", [True, False])
def test_instance_norm_of_no_instances_running_stats_like_torch(use_input_stats):
    """N = 0: with input statistics aten writes back the mean over no instances, NaN; with running statistics
    they stay as they were (normkit used to leave them untouched in both)."""
    x = torch.randn(0, 3, 4, dtype=F64)
    got = (torch.randn(3, dtype=F64), torch.rand(3, dtype=F64) + 0.5)
    exp = tuple(t.clone() for t in got)
    y = normkit.instance_norm(x, got[0], got[1], use_input_stats=use_input_stats)
    y_t = F.instance_norm(x, exp[0], exp[1], use_input_stats=use_input_stats)
    assert y.shape == y_t.shape == x.shape
    for a, e in zip(got, exp):
        torch.testing.assert_close(a, e, equal_nan=True)
    assert bool(got[0].isnan().all()) == use_input_stats


@pytest.mark.parametrize("fn", ["add_layer_norm", "add_rms_norm"])
def test_add_norm_outputs_can_be_modified_in_place(fn):
    """The fused pre-norm functions' outputs take in-place ops as torch's `s = x + r; y = norm(s)` do: with the
    kernels (float32; Triton's interpreter on the CPU) y and s were views of the kernel's 2-D buffers made inside
    the autograd Function, and `y.mul_(2)` raised "Output 0 of _AddLayerNormFn is a view and is being modified
    inplace"."""
    torch.manual_seed(0)
    x, r, w, b = torch.randn(2, 3, 8), torch.randn(2, 3, 8), torch.randn(8), torch.randn(8)
    grads = []
    for use_normkit in (True, False):
        xx = x.clone().requires_grad_()
        if use_normkit:
            y, s = (normkit.add_layer_norm(xx, r, (8,), w, b) if fn == "add_layer_norm"
                    else normkit.add_rms_norm(xx, r, (8,), w))
        else:
            s = xx + r
            y = (torch.nn.functional.layer_norm(s, (8,), w, b) if fn == "add_layer_norm"
                 else torch.nn.functional.rms_norm(s, (8,), w))
        y.mul_(2)
        y.relu_()
        grads.append(torch.autograd.grad(y.square().sum(), xx)[0])
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fn", ["add_layer_norm", "add_rms_norm"])
def test_add_norm_sum_modified_in_place_with_y_unused(fn):
    """Only the sum s used, and s changed in place before the backward: torch's `s = x + r; y = norm(s)` keeps
    working (y's backward never runs); normkit's Function read its saved s first and raised "modified by an
    inplace operation"."""
    x, r = _leaf(_fresh((4, 8))), _leaf(_fresh((4, 8)))
    w = _leaf(_fresh((8,)))
    y, s = normkit.add_layer_norm(x, r, (8,), w) if fn == "add_layer_norm" else normkit.add_rms_norm(x, r, (8,), w)
    s.add_(1.0)
    g = _fresh((4, 8))
    gx, gr = torch.autograd.grad(s, (x, r), g)
    torch.testing.assert_close(gx, g)
    torch.testing.assert_close(gr, g)


def _norm_calls():
    """(name, f(x, w, b), shape of x) for each family, in float32: the kernels run (Triton's interpreter here)."""
    return [
        ("layer_norm", lambda x, w, b: normkit.layer_norm(x, (8,), w, b), lambda x, w, b: F.layer_norm(x, (8,), w, b),
         (3, 8)),
        ("rms_norm", lambda x, w, b: normkit.rms_norm(x, (8,), w), lambda x, w, b: F.rms_norm(x, (8,), w), (3, 8)),
        ("add_layer_norm", lambda x, w, b: normkit.add_layer_norm(x, x * 0.5, (8,), w, b)[0],
         lambda x, w, b: F.layer_norm(x * 1.5, (8,), w, b), (3, 8)),
        ("batch_norm", lambda x, w, b: normkit.batch_norm(x, None, None, w, b, True),
         lambda x, w, b: F.batch_norm(x, None, None, w, b, True), (4, 3, 5)),
        ("group_norm", lambda x, w, b: normkit.group_norm(x, 3, w, b), lambda x, w, b: F.group_norm(x, 3, w, b),
         (2, 6, 5)),
    ]


@pytest.mark.parametrize("name, ours, theirs, shape", _norm_calls(), ids=[c[0] for c in _norm_calls()])
def test_batched_gradients_like_torch(name, ours, theirs, shape):
    """`torch.autograd.grad(..., is_grads_batched=True)` (what vectorized `jacobian` / `hessian` use) hands the
    backward a legacy-vmap batched gradient, which has no storage: the kernels' launch raised "Cannot access storage
    of BatchedTensorImpl". Such gradients now take the reference's plain torch ops; judged against float64."""
    C = shape[1] if name in ("batch_norm", "group_norm") else shape[-1]
    x, w, b = _fresh(shape), _fresh((C,)), _fresh((C,))
    G = _fresh((5,) + shape)
    leaves = [_leaf(t) for t in (x, w, b)]
    got = torch.autograd.grad(ours(*leaves), leaves, G, is_grads_batched=True, allow_unused=True)
    leaves64 = [_leaf(t.double()) for t in (x, w, b)]
    want = torch.autograd.grad(theirs(*leaves64), leaves64, G.double(), is_grads_batched=True, allow_unused=True)
    for a, e in zip(got, want):
        assert (a is None) == (e is None)
        if e is not None:
            torch.testing.assert_close(a.double(), e, rtol=1e-4, atol=1e-4 * max(1.0, e.abs().max().item()))
    jac = torch.autograd.functional.jacobian(lambda t: ours(t, w, b), x, vectorize=True)
    jac64 = torch.autograd.functional.jacobian(lambda t: theirs(t, w.double(), b.double()), x.double(), vectorize=True)
    torch.testing.assert_close(jac.double(), jac64, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("x_cl, g_cl", [(True, False), (True, True), (False, False)])
def test_rms_norm_input_gradient_layout_follows_the_incoming_gradient(x_cl, g_cl):
    """A channels_last input takes torch's composite rms_norm, whose input gradient is laid out like the incoming
    gradient: contiguous for a contiguous one. normkit's was channels_last whatever the incoming gradient (values
    right; seen through torch.autograd.grad, a leaf's .grad takes the leaf's layout either way)."""
    x, g, w = _fresh((2, 3, 4, 5)), _fresh((2, 3, 4, 5)), _fresh((5,))
    if x_cl:
        x = x.contiguous(memory_format=torch.channels_last)
    if g_cl:
        g = g.contiguous(memory_format=torch.channels_last)
    grads = []
    for f in (normkit.rms_norm, F.rms_norm):
        xx = _leaf(x)
        grads.append(torch.autograd.grad(f(xx, (5,), w), xx, g)[0])
    assert grads[0].stride() == grads[1].stride()
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-4)


_TIED = {  # normkit's call with one tensor in two places, torch's equivalent
    "batch_norm": (lambda x, w: normkit.batch_norm(x, None, None, w, w, True),
                   lambda x, w: F.batch_norm(x, None, None, w, w, True), 4),
    "group_norm": (lambda x, w: normkit.group_norm(x, 2, w, w), lambda x, w: F.group_norm(x, 2, w, w), 4),
    "layer_norm": (lambda x, w: normkit.layer_norm(x, (5,), w, w), lambda x, w: F.layer_norm(x, (5,), w, w), 5),
    "add_layer_norm": (lambda x, w: normkit.add_layer_norm(x, x, (5,), w, w)[0],
                       lambda x, w: F.layer_norm(x + x, (5,), w, w), 5),
    "add_rms_norm": (lambda x, w: normkit.add_rms_norm(x, x, (5,), w)[0], lambda x, w: F.rms_norm(x + x, (5,), w), 5),
}


@pytest.mark.parametrize("name", list(_TIED))
def test_compiled_fullgraph_with_one_tensor_in_two_arguments(name):
    """torch.compile(fullgraph=True) of a call given one tensor twice (a weight tied to the bias, x as its own
    residual): Dynamo refuses an autograd Function with a repeated tensor input, so normkit's call failed where
    torch's compiles. Values and gradients against torch in float64."""
    ours, theirs, C = _TIED[name]
    x, w = _fresh((3, 4, 5), F64), _fresh((C,), F64)
    results = []
    for f in (torch.compile(ours, backend="aot_eager", fullgraph=True), theirs):
        xx, ww = _leaf(x), _leaf(w)
        y = f(xx, ww)
        results.append((y, *torch.autograd.grad(y, (xx, ww), torch.ones_like(y) + x)))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want)


def test_batch_norm_compiled_fullgraph_with_one_buffer_for_both_running_stats():
    x = _fresh((4, 3, 5), F64)
    f = torch.compile(lambda x, s: normkit.batch_norm(x, s, s, None, None, False), backend="aot_eager",
                      fullgraph=True)
    s = torch.rand(3, dtype=F64) + 0.5
    xx = _leaf(x)
    y = f(xx, s)
    (gx,) = torch.autograd.grad(y, xx, torch.ones_like(y))
    xt = _leaf(x)
    yt = F.batch_norm(xt, s, s, None, None, False)
    torch.testing.assert_close(y, yt)
    torch.testing.assert_close(gx, torch.autograd.grad(yt, xt, torch.ones_like(yt))[0])


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_instance_norm_running_stats_in_one_buffer_like_torch(dtype):
    """running_mean and running_var one tensor: aten computes both updates from the values before the call and
    writes the mean, then the variance; normkit updated the mean first and blended the variance into that."""
    x = _fresh((4, 3, 5), dtype)
    ours, theirs = torch.rand(3, dtype=dtype) + 0.5, None
    theirs = ours.clone()
    normkit.instance_norm(x, ours, ours, use_input_stats=True, momentum=0.3)
    F.instance_norm(x, theirs, theirs, use_input_stats=True, momentum=0.3)
    torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("grad_dtype", [F64, torch.bfloat16])
def test_layer_norm_backward_op_rejects_a_gradient_of_another_dtype(grad_dtype):
    """aten's native_layer_norm_backward reads dY as X's type and raises; normkit's computed a result (batch and
    group norm's backward ops already raised torch's error)."""
    x, w, b = _fresh((3, 8)), _fresh((8,)), _fresh((8,))
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [8], w, b, 1e-5)
    g = _fresh((3, 8), grad_dtype)
    with pytest.raises(RuntimeError) as expected:
        torch.ops.aten.native_layer_norm_backward(g, x, [8], mean, rstd, w, b, [True, True, True])
    with pytest.raises(RuntimeError) as got:
        normkit.ops.native_layer_norm_backward(g, x, [8], mean, rstd, w, b, [True, True, True])
    assert str(got.value) == str(expected.value)


class _AllNorms(torch.nn.Module):
    """Every normkit function (or its torch.nn.functional counterpart) in one forward, for fx tracing."""

    def __init__(self, lib):
        super().__init__()
        self.lib = lib
        self.w = torch.nn.Parameter(torch.rand(8) + 0.5)
        self.b = torch.nn.Parameter(torch.randn(8))
        self.register_buffer("rm", torch.randn(8))
        self.register_buffer("rv", torch.rand(8) + 0.5)

    def forward(self, x):  # x: (N, 8, L)
        lib, rows = self.lib, x.transpose(1, 2)
        outs = [lib.batch_norm(x, self.rm, self.rv, self.w, self.b, True, 0.3),
                lib.group_norm(x, 2, self.w, self.b), lib.instance_norm(x, None, None, self.w, self.b),
                lib.layer_norm(rows, (8,), self.w, self.b), lib.rms_norm(rows, (8,), self.w)]
        if lib is normkit:
            y, s = normkit.add_layer_norm(rows, rows * 2, (8,), self.w, self.b)
            z, t = normkit.add_rms_norm(rows, rows * 2, (8,), self.w)
        else:
            s = t = rows + rows * 2
            y, z = F.layer_norm(s, (8,), self.w, self.b), F.rms_norm(t, (8,), self.w)
        return outs + [y, s, z, t]


def test_fx_symbolic_trace_records_normkit_functions_as_torchs():
    """torch.nn.functional's norms dispatch through __torch_function__, so fx records each as one call_function node;
    normkit's do the same (they raised on the Proxy), and the traced module computes what eager torch does."""
    torch.manual_seed(0)
    eager, traced_model = _AllNorms(F), _AllNorms(normkit)
    traced_model.load_state_dict(eager.state_dict())
    gm = torch.fx.symbolic_trace(traced_model)
    targets = {n.target.__name__ for n in gm.graph.nodes if n.op == "call_function" and
               getattr(n.target, "__module__", "").startswith("normkit")}
    assert targets == {"batch_norm", "group_norm", "instance_norm", "layer_norm", "rms_norm", "add_layer_norm",
                       "add_rms_norm"}
    x = torch.randn(3, 8, 5, dtype=torch.float64) * 2 + 0.5
    eager.double(), gm.double()
    for got, want in zip(gm(x), eager(x)):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(gm.rm, eager.rm)  # the training call updated the traced module's buffers
    torch.testing.assert_close(gm.rv, eager.rv)


def test_tensor_subclasses_see_normkit_calls_through_torch_function():
    seen = []

    class Logged(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", str(func)))
            return super().__torch_function__(func, types, args, kwargs or {})

    x = torch.randn(4, 6, dtype=torch.float64).as_subclass(Logged)
    y = normkit.layer_norm(x, (6,))
    assert seen[0] == "layer_norm" and type(y) is Logged
    torch.testing.assert_close(y.as_subclass(torch.Tensor), F.layer_norm(x.as_subclass(torch.Tensor), (6,)))
