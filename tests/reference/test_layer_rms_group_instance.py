"""normkit.reference layer/RMS/group/instance norm vs torch's CPU kernels in float64."""

import warnings

import pytest
import torch

import normkit.reference as R
from normkit import ops
from refhelpers import F64, close, make

A = torch.ops.aten

# (input shape, normalized_shape, eps): contract §10 OpInfo samples plus larger and offset rows.
LN_CASES = [((1, 2, 3), (1, 2, 3), 0.5), ((2, 2, 3), (2, 3), -0.5), ((1,), (1,), 1e-5), ((1, 2), (2,), 1e-5),
            ((0, 1), (1,), 1e-5), ((2, 3, 4, 5), (4, 5), 1e-5), ((3, 8), (8,), 0.0), ((2, 0), (0,), 1e-5),
            ((4, 6, 5), (5,), 1e-6)]


def _ln_params(ns, which):
    w = torch.randn(ns, dtype=F64) if which in ("both", "weight") else None
    b = torch.randn(ns, dtype=F64) if which in ("both", "bias") else None
    return w, b


@pytest.mark.parametrize("shape,ns,eps", LN_CASES, ids=str)
def test_layer_norm(shape, ns, eps):
    for layout, offset, which in [("contig", 0.0, "both"), ("noncontig", 1000.0, "weight"),
                                  ("contig", 0.0, "bias"), ("contig", 1000.0, None)]:
        x = make(shape, layout, offset=offset)
        if eps == 0.0:
            x[0].normal_()  # eps 0 on a constant row is NaN everywhere; keep rows random
        w, b = _ln_params(ns, which)
        exp = A.native_layer_norm(x, ns, w, b, eps)
        act = R.native_layer_norm(x, ns, w, b, eps)
        for name, a, e in zip(("out", "mean", "rstd"), act, exp):
            close(a, e, rtol=1e-6, atol=1e-6, what=f"{name} {layout} {which}")
        assert act[0].is_contiguous()
        g = make(shape)
        # aten errors on a masked-in grad of an absent param; ask only for what exists.
        mask = [True, w is not None, b is not None]
        exp_g = A.native_layer_norm_backward(g, x, ns, exp[1], exp[2], w, b, mask)
        act_g = R.native_layer_norm_backward(g, x, ns, exp[1], exp[2], w, b, mask)
        for name, a, e in zip(("grad_input", "grad_weight", "grad_bias"), act_g, exp_g):
            close(a, e, rtol=1e-6, atol=1e-6, what=f"{name} {layout} {which}")


def test_layer_norm_channels_last_and_low_precision():
    x = make((2, 6, 3, 3), "cl")
    out = R.native_layer_norm(x, [3], None, None, 1e-5)
    close(out[0], A.native_layer_norm(x, [3], None, None, 1e-5)[0])
    assert out[0].is_contiguous()
    xb = make((4, 16), offset=3.0).bfloat16()
    w = torch.randn(16)
    out, mean, rstd = R.native_layer_norm(xb, [16], w, None, 1e-5)
    assert out.dtype == torch.bfloat16 and mean.dtype == torch.float32 and mean.shape == (4, 1)
    ref = R.native_layer_norm(xb.double(), [16], w.double(), None, 1e-5)
    close(rstd, ref[2].float(), rtol=1e-5, atol=1e-5)
    close(out, A.native_layer_norm(xb, [16], w, None, 1e-5)[0], rtol=1.6e-2, atol=1e-2)


RMS_CASES = [((1, 2, 3), (1, 2, 3), 0.5), ((2, 2, 3), (2, 3), None), ((1,), (1,), 1e-5), ((1, 2), (2,), None),
             ((0, 1), (1,), 1e-5), ((2, 3, 4, 5), (4, 5), 1e-6), ((2, 6, 3, 3), (3,), None)]


@pytest.mark.parametrize("shape,ns,eps", RMS_CASES, ids=str)
def test_rms_norm(shape, ns, eps):
    layouts = ["contig", "noncontig"] + (["cl"] if len(shape) == 4 else [])
    for layout in layouts:
        for offset, with_w in [(0.0, True), (1000.0, False)]:
            x = make(shape, layout, offset=offset)
            w = torch.randn(ns, dtype=F64) if with_w else None
            exp = A.rms_norm(x, ns, w, eps)
            out, rstd = R._fused_rms_norm(x, ns, w, eps)
            close(out, exp, rtol=1e-6, atol=1e-6, what=layout)
            close(R.rms_norm(x, ns, w, eps), exp, rtol=1e-6, atol=1e-6)
            fmt = torch.channels_last if layout == "cl" else torch.contiguous_format
            assert out.is_contiguous(memory_format=fmt) and exp.is_contiguous(memory_format=fmt)
            exp_f = A._fused_rms_norm(x, ns, w, eps)
            close(rstd, exp_f[1], rtol=1e-6, atol=1e-6)
            # Backward (aten's fused backward is CUDA-only): compare with autograd through torch's op.
            xr = x.clone().requires_grad_()
            wr = None if w is None else w.clone().requires_grad_()
            g = make(shape)
            A.rms_norm(xr, ns, wr, eps).backward(g)
            gi, gw = R._fused_rms_norm_backward(g, x, ns, rstd, w, [True, w is not None])
            close(gi, xr.grad, rtol=1e-6, atol=1e-6)
            close(gw, None if w is None else wr.grad, rtol=1e-6, atol=1e-6)


def test_rms_norm_default_eps_and_mixed():
    # eps=None is finfo(opmath).eps: float32's for bf16 (contract §7), float64's for float64.
    assert R.default_rms_eps(torch.bfloat16) == torch.finfo(torch.float32).eps
    assert R.default_rms_eps(torch.float64) == torch.finfo(torch.float64).eps
    x = (torch.randn(3, 8) * 1e-3).bfloat16()
    w = torch.randn(8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns once about the mixed-dtype composite path
        exp = A.rms_norm(x, [8], w, None)
    out, rstd = R._fused_rms_norm(x, [8], w, None)
    assert out.dtype == torch.bfloat16 and rstd.dtype == torch.float32 and rstd.shape == (3, 1)
    close(out, exp, rtol=1.6e-2, atol=1e-5)
    xc = torch.randn(2, 4, dtype=torch.complex128)
    close(R.rms_norm(xc, [4], None, None), A.rms_norm(xc, [4], None, None))


# (shape, groups, eps): contract §10 group_norm samples plus channels_last/3d and G = C / G = 1.
GN_CASES = [((1, 6, 3), 2, 0.5), ((2, 6, 3), 2, -0.5), ((1, 3), 1, 1e-5), ((0, 2), 1, 1e-5), ((5, 5, 5), 1, 0.5),
            ((4, 6, 5, 5), 3, 1e-5), ((4, 6, 5, 5), 6, 1e-5), ((2, 4, 3, 2, 2), 2, 1e-5), ((2, 4, 0), 2, 1e-5)]


@pytest.mark.parametrize("shape,G,eps", GN_CASES, ids=str)
def test_group_norm(shape, G, eps):
    n, c = shape[0], shape[1]
    hxw = 1
    for s in shape[2:]:
        hxw *= s
    layouts = ["contig"] + (["cl"] if len(shape) in (4, 5) else [])
    for layout in layouts:
        for offset, which in [(0.0, "both"), (1000.0, "weight"), (0.0, "bias"), (0.0, None)]:
            x = make(shape, layout, offset=offset)
            w, b = _ln_params((c,), which)
            exp = A.native_group_norm(x, w, b, n, c, hxw, G, eps)
            act = R.native_group_norm(x, w, b, n, c, hxw, G, eps)
            for name, a, e in zip(("out", "mean", "rstd"), act, exp):
                close(a, e, rtol=1e-6, atol=1e-6, what=f"{name} {layout} {which}")
            assert act[0].is_contiguous(memory_format=R.suggest_memory_format(x))
            g = make(shape, layout)
            mask = [True, w is not None, w is not None]
            exp_g = A.native_group_norm_backward(g, x, exp[1], exp[2], w, n, c, hxw, G, mask)
            act_g = R.native_group_norm_backward(g, x, exp[1], exp[2], w, n, c, hxw, G, mask)
            if hxw == 0 and w is not None:
                # aten's CPU kernel gives NaN (0·NaN rstd) here; the contract's choice is zeros.
                assert torch.equal(act_g[1], torch.zeros(c, dtype=F64))
                exp_g = (exp_g[0], act_g[1], exp_g[2])
            for name, a, e in zip(("grad_input", "grad_weight", "grad_bias"), act_g, exp_g):
                close(a, e, rtol=1e-6, atol=1e-6, what=f"{name} {layout} {which}")
    # Non-contiguous input: aten's CPU kernel refuses it; normkit accepts it and matches the contiguous copy.
    if len(shape) >= 3 and shape[-1] > 0:
        x = make(shape, "noncontig")
        for a, e in zip(R.native_group_norm(x, None, None, n, c, hxw, G, eps),
                        A.native_group_norm(x.contiguous(), None, None, n, c, hxw, G, eps)):
            close(a, e, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("impl", [R, ops], ids=["reference", "ops"])
@pytest.mark.parametrize("shape", [(2, 120), (4, 3, 20), (240,), (2, 6, 20)], ids=str)
def test_group_norm_reads_the_callers_dims_by_element_count(shape, impl):
    """aten takes any input of N*C*HxW elements as (N, C, HxW), and in the backward any weight of C elements;
    results keep the input's and the weight's shapes."""
    n, c, hxw, g = 2, 6, 20, 3
    x, dy = make(shape, offset=1.0, dtype=torch.float32), make(shape, dtype=torch.float32)
    w, b = torch.randn(c), torch.randn(c)
    exp = A.native_group_norm(x, w, b, n, c, hxw, g, 1e-5)
    act = impl.native_group_norm(x, w, b, n, c, hxw, g, 1e-5)
    for name, a, e in zip(("out", "mean", "rstd"), act, exp):
        assert a.shape == e.shape
        close(a, e, rtol=1e-5, atol=1e-5, what=name)
    w2 = w.reshape(2, 3)
    exp = A.native_group_norm_backward(dy, x, exp[1], exp[2], w2, n, c, hxw, g, [True] * 3)
    act = impl.native_group_norm_backward(dy.reshape(n, c, hxw), x, act[1], act[2], w2, n, c, hxw, g, [True] * 3)
    for name, a, e in zip(("grad_input", "grad_weight", "grad_bias"), act, exp):
        assert a.shape == e.shape
        close(a, e, rtol=1e-4, atol=1e-4, what=name)


def test_group_norm_stat_dtypes():
    x = make((2, 6, 4), offset=1.0).bfloat16()
    _, mean, rstd = R.native_group_norm(x, None, None, 2, 6, 4, 3, 1e-5)
    assert mean.dtype == torch.bfloat16 and mean.shape == (2, 3)
    w = torch.randn(6)
    out, mean, rstd = R.native_group_norm(x, w, None, 2, 6, 4, 3, 1e-5)
    assert mean.dtype == torch.float32 and out.dtype == torch.bfloat16
    exp = A.native_group_norm(x, w, None, 2, 6, 4, 3, 1e-5)
    close(out, exp[0], rtol=1.6e-2, atol=1e-2)
    close(rstd, exp[2], rtol=1e-4, atol=1e-4)


IN_CASES = [((5, 5, 5), 0.5, 0.6), ((3, 2, 4), -1.2, 1e-5), ((3, 2, 4), 0.0, 1e-5), ((3, 2, 3, 4), -1.0, 0.5),
            ((1, 2, 3), 0.1, 1e-5), ((2, 3, 2, 2, 2), 0.1, 1e-5)]


@pytest.mark.parametrize("shape,momentum,eps", IN_CASES, ids=str)
def test_instance_norm(shape, momentum, eps):
    c = shape[1]
    layouts = ["contig", "noncontig"] + (["cl"] if len(shape) in (4, 5) else [])
    for layout in layouts:
        for use_input_stats, which, stats in [(True, "both", True), (True, "weight", False), (True, None, True),
                                              (False, "both", True), (False, None, True)]:
            x = make(shape, layout, offset=10.0 if which is None else 0.0)
            w, b = _ln_params((c,), which)
            rm, rv = (torch.randn(c, dtype=F64), torch.rand(c, dtype=F64) + 0.5) if stats else (None, None)
            a1, a2 = (rm.clone(), rv.clone()) if stats else (None, None)
            exp = A.instance_norm(x, w, b, a1, a2, use_input_stats, momentum, eps, False)
            act = R.instance_norm(x, w, b, rm, rv, use_input_stats, momentum, eps, False)
            close(act, exp, rtol=1e-6, atol=1e-6, what=f"{layout} {use_input_stats} {which}")
            assert act.is_contiguous()
            if stats:
                close(rm, a1, what="running_mean")
                close(rv, a2, what="running_var")
    # Empty batch: empty output; with input statistics aten writes back the mean over no instances (NaN), with
    # running statistics they stay as they were
    for use_input_stats in (True, False):
        rm, rv = torch.randn(c, dtype=F64), torch.rand(c, dtype=F64)
        (r1, r2), (a1, a2) = (rm.clone(), rv.clone()), (rm.clone(), rv.clone())
        out = R.instance_norm(make((0,) + shape[1:]), None, None, r1, r2, use_input_stats, momentum, eps)
        exp = A.instance_norm(make((0,) + shape[1:]), None, None, a1, a2, use_input_stats, momentum, eps, False)
        assert out.shape == exp.shape == (0,) + shape[1:]
        assert torch.equal(r1, a1) or (r1.isnan().all() and a1.isnan().all())
        assert torch.equal(r2, a2) or (r2.isnan().all() and a2.isnan().all())
        assert r1.isnan().all() == use_input_stats


def test_layer_norm_backward_grad_bias_is_a_new_tensor_without_row_dims():
    """normalized_shape covering the whole input (no row dims): grad_bias was grad_out itself (an alias), where
    aten's outputs are new tensors (the conformance checker's "aliasing" rule found it)."""
    x, g = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)
    w, b = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)
    _, mean, rstd = R.native_layer_norm(x, [2, 3], w, b, 1e-5)
    gi, gw, gb = R.native_layer_norm_backward(g, x, [2, 3], mean, rstd, w, b, [True, True, True])
    assert gb.untyped_storage().data_ptr() != g.untyped_storage().data_ptr() and torch.equal(gb, g)
