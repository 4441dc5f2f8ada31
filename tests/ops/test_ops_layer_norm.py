"""normkit.ops layer norm / RMS norm: aten signatures and returns, checked against torch in float64."""

import pytest
import torch

from normkit import ops

F64 = torch.float64


@pytest.mark.parametrize("shape, ns", [((2, 3, 7), (7,)), ((2, 3, 4, 5), (4, 5)), ((5,), (5,)), ((3, 3000), (3000,))])
@pytest.mark.parametrize("affine", [True, False])
def test_native_layer_norm_forward_backward(shape, ns, affine):
    x = torch.randn(shape, dtype=F64) * 3 + 1
    w = torch.randn(ns, dtype=F64) if affine else None
    b = torch.randn(ns, dtype=F64) if affine else None
    got = ops.native_layer_norm(x, list(ns), w, b, 1e-5)
    exp = torch.ops.aten.native_layer_norm(x, list(ns), w, b, 1e-5)
    for a, e in zip(got, exp):
        assert a.shape == e.shape
        torch.testing.assert_close(a, e)
    g = torch.randn_like(x)
    mask = [True, affine, affine]
    gb = ops.native_layer_norm_backward(g, x, list(ns), got[1], got[2], w, b, mask)
    eb = torch.ops.aten.native_layer_norm_backward(g, x, list(ns), exp[1], exp[2], w, b, mask)
    for a, e in zip(gb, eb):
        assert (a is None) == (e is None)
        if a is not None:
            torch.testing.assert_close(a, e)


@pytest.mark.parametrize("dtype", [torch.float32, F64])  # the kernels' dtype and the reference's
def test_param_grads_asked_without_the_params_are_the_reference_sums(dtype):
    """A raw backward call asking for dw / db without weight / bias (aten raises, autograd never asks): both
    normkit paths return the same sums, Σ g·x̂ and Σ g, in the input's dtype."""
    x, g = torch.randn(6, 40, dtype=dtype) * 2 + 1, torch.randn(6, 40, dtype=dtype)
    _, mean, rstd = ops.native_layer_norm(x, [40], None, None, 1e-5)
    xhat = (x.double() - x.double().mean(1, keepdim=True)) / torch.sqrt(x.double().var(1, unbiased=False,
                                                                                        keepdim=True) + 1e-5)
    dx, dw, db = ops.native_layer_norm_backward(g, x, [40], mean, rstd, None, None, [True, True, True])
    tol = dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dw.double(), (g.double() * xhat).sum(0), **tol)
    torch.testing.assert_close(db.double(), g.double().sum(0), **tol)
    assert dw.dtype == db.dtype == dtype and dx.shape == x.shape
    _, rstd = ops._fused_rms_norm(x, [40], None, 1e-5)
    dx, dw = ops._fused_rms_norm_backward(g, x, [40], rstd, None, [True, True])
    xr = x.double() * torch.rsqrt(x.double().square().mean(1, keepdim=True) + 1e-5)
    torch.testing.assert_close(dw.double(), (g.double() * xr).sum(0), **tol)


def test_layer_norm_stats_dtype_and_contiguous_output():
    x = torch.randn(2, 4, 3, 3, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    y, mean, rstd = ops.native_layer_norm(x, [3, 3], None, None, 1e-5)
    assert y.dtype == torch.bfloat16 and y.is_contiguous()
    assert mean.dtype == torch.float32 and rstd.shape == (2, 4, 1, 1)


@pytest.mark.parametrize("shape, ns", [((2, 3, 8), (8,)), ((4, 2, 5), (2, 5))])
def test_fused_rms_norm_matches_torch_composite(shape, ns):
    x = torch.randn(shape, dtype=F64)
    w = torch.randn(ns, dtype=F64)
    y, rstd = ops._fused_rms_norm(x, list(ns), w, None)
    torch.testing.assert_close(y, torch.rms_norm(x, list(ns), w))
    assert rstd.shape == tuple(shape[: len(shape) - len(ns)]) + (1,) * len(ns)
    dims = tuple(range(len(shape) - len(ns), len(shape)))
    torch.testing.assert_close(rstd, torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + torch.finfo(F64).eps))
    xr = x.clone().requires_grad_()
    wr = w.clone().requires_grad_()
    g = torch.randn_like(x)
    ex, ew = torch.autograd.grad(torch.rms_norm(xr, list(ns), wr), (xr, wr), g)
    dx, dw = ops._fused_rms_norm_backward(g, x, list(ns), rstd, w, [True, True])
    torch.testing.assert_close(dx, ex)
    torch.testing.assert_close(dw, ew)
    torch.testing.assert_close(ops.rms_norm(x, list(ns), w), y)


def test_rms_eps_none_is_float32_machine_eps_for_bf16():
    x = torch.full((2, 4), 1e-3, dtype=torch.bfloat16) + torch.rand(2, 4, dtype=torch.bfloat16) * 1e-4
    y, rstd = ops._fused_rms_norm(x, [4], None, None)
    exp = torch.rms_norm(x, [4])
    torch.testing.assert_close(y, exp)


def test_add_norm_ops():
    x = torch.randn(3, 5, 16, dtype=F64)
    r = torch.randn(3, 5, 16, dtype=F64)
    w, b = torch.randn(16, dtype=F64), torch.randn(16, dtype=F64)
    y, s, mean, rstd = ops.add_layer_norm(x, r, [16], w, b, 1e-5)
    torch.testing.assert_close(s, x + r)
    torch.testing.assert_close(y, torch.layer_norm(x + r, [16], w, b, 1e-5))
    y, s, rstd = ops.add_rms_norm(x, r, [16], w, 1e-6)
    torch.testing.assert_close(y, torch.rms_norm(x + r, [16], w, 1e-6))
    with pytest.raises(RuntimeError, match="Expected residual to have the same shape"):
        ops.add_rms_norm(x, r[:1], [16], w, 1e-6)


@pytest.mark.parametrize("fn, args, msg", [
    ("native_layer_norm", ([], None, None, 1e-5), "Expected normalized_shape to be at least 1-dimensional"),
    ("native_layer_norm", ([4], torch.ones(5, dtype=F64), None, 1e-5),
     "Expected weight to be of same shape as normalized_shape"),
    ("native_layer_norm", ([4], None, None, 1e-5), r"Given normalized_shape=\[4\], expected input with shape \[\*, 4\]"),
    ("_fused_rms_norm", ([4], None, None), r"Given normalized_shape=\[4\], expected input with shape \[\*4\]"),
])
def test_layer_norm_errors(fn, args, msg):
    x = torch.randn(2, 3, 8, dtype=F64)
    with pytest.raises(RuntimeError, match=msg):
        getattr(ops, fn)(x, *args)


def _strided_rows(t: torch.Tensor) -> torch.Tensor:
    """t's values as a view with row stride 2 into a larger random buffer."""
    buf = torch.randn((2 * t.shape[0],) + tuple(t.shape[1:]), dtype=t.dtype)
    buf[::2] = t
    return buf[::2]


def test_backward_reads_strided_saved_stats():
    # aten accepts any strides for mean/rstd; the kernels read a dense (M,) array
    x = torch.randn(6, 8) * 2 + 0.5
    w, b, g = torch.randn(8), torch.randn(8), torch.randn(6, 8)
    _, mean, rstd = ops.native_layer_norm(x, [8], w, b, 1e-5)
    mean_s, rstd_s = _strided_rows(mean), _strided_rows(rstd)
    assert not mean_s.is_contiguous()
    xr, wr, br, gr = x.double(), w.double(), b.double(), g.double()
    _, m64, r64 = torch.ops.aten.native_layer_norm(xr, [8], wr, br, 1e-5)
    exp = torch.ops.aten.native_layer_norm_backward(gr, xr, [8], m64, r64, wr, br, [True] * 3)
    got = ops.native_layer_norm_backward(g, x, [8], mean_s, rstd_s, w, b, [True] * 3)
    for a, e in zip(got, exp):
        torch.testing.assert_close(a.double(), e, rtol=1e-4, atol=1e-4)
    _, rstd = ops._fused_rms_norm(x, [8], w, None)
    got = ops._fused_rms_norm_backward(g, x, [8], _strided_rows(rstd), w, [True, True])
    xr_, wr_ = xr.clone().requires_grad_(), wr.clone().requires_grad_()
    exp = torch.autograd.grad(torch.rms_norm(xr_, [8], wr_), (xr_, wr_), gr)
    for a, e in zip(got, exp):
        torch.testing.assert_close(a.double(), e, rtol=1e-4, atol=1e-4)
