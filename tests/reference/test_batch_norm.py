"""normkit.reference batch norm vs torch's CPU kernels (torch.ops.aten.*) in float64."""

import pytest
import torch

import normkit.reference as R
from refhelpers import F64, close, layouts_for, make

A = torch.ops.aten

# Contract §10 OpInfo/ModuleInfo shapes plus channels-last, 3d, N*HW == 2 and size-one channels.
SHAPES = [(5, 5, 5), (3, 2, 4), (3, 1), (3, 2, 3, 4), (2, 1), (1, 2, 3), (4, 10), (2, 3, 6, 6),
          (2, 3, 4, 4, 4), (2, 3), (1, 3, 2), (4, 1, 9, 9), (4, 9, 1, 1)]
CASES = [(s, layout) for s in SHAPES for layout in layouts_for(s)]


def _params(c, affine):
    w = torch.randn(c, dtype=F64) if affine in ("both", "weight") else None
    b = torch.randn(c, dtype=F64) if affine in ("both", "bias") else None
    return w, b


def _running(c):
    return torch.randn(c, dtype=F64), torch.rand(c, dtype=F64) + 0.5


def _check_format(out, x):
    fmt = R.suggest_memory_format(x)
    assert out.is_contiguous(memory_format=fmt), (out.stride(), x.stride())


@pytest.mark.parametrize("shape,layout", CASES, ids=str)
def test_forward_backward_match_aten(shape, layout):
    c = shape[1]
    # (training, momentum, affine, running stats, offset, eps): every value of each axis appears,
    # without the full product (kept small: the whole reference suite has a ~60 s CPU budget).
    grid = [
        (True, 0.1, "both", True, 0.0, 1e-5), (True, 0.0, "weight", True, 1000.0, 0.5),
        (True, -1.2, "bias", True, 0.0, 0.5), (True, 0.1, None, False, 1000.0, 1e-5),
        (True, 0.5, "both", False, 0.0, 0.5), (False, 0.1, "both", True, 1000.0, 1e-5),
        (False, -1.2, None, True, 0.0, 0.5), (False, 0.0, "weight", True, 0.0, 0.0),
    ]
    for training, momentum, affine, stats, offset, eps in grid:
        what = f"train={training} m={momentum} affine={affine} stats={stats} off={offset} eps={eps}"
        x = make(shape, layout, offset=offset, constant_channel=(offset == 0.0 and eps == 0.5))
        w, b = _params(c, affine)
        rm, rv = _running(c) if stats else (None, None)
        rm_a, rv_a = (rm.clone(), rv.clone()) if stats else (None, None)
        expected = A.native_batch_norm(x, w, b, rm_a, rv_a, training, momentum, eps)
        actual = R.native_batch_norm(x, w, b, rm, rv, training, momentum, eps)
        for name, a, e in zip(("out", "save_mean", "save_invstd"), actual, expected):
            close(a, e, what=f"{name} {what}")
        _check_format(actual[0], x)
        if stats:
            close(rm, rm_a, what=f"running_mean {what}")
            close(rv, rv_a, what=f"running_var {what}")

        g = make(shape, "contig")
        sm, si = expected[1], expected[2]
        masks = ([True, True, True], [True, False, False], [False, True, True]) if affine == "both" else (
            [True, True, True],)
        for mask in masks:
            e_grads = A.native_batch_norm_backward(g, x, w, rm_a, rv_a, sm, si, training, eps, mask)
            a_grads = R.native_batch_norm_backward(g, x, w, rm_a, rv_a, sm, si, training, eps, mask)
            for name, a, e in zip(("grad_input", "grad_weight", "grad_bias"), a_grads, e_grads):
                close(a, e, rtol=1e-6, atol=1e-6, what=f"{name} {what} mask={mask}")
            if mask[0]:
                _check_format(a_grads[0], x)


def test_eval_backward_ignores_saved_stats():
    x, g = make((3, 4, 5)), make((3, 4, 5))
    w = torch.randn(4, dtype=F64)
    rm, rv = _running(4)
    empty = torch.empty(0, dtype=F64)
    filled = (torch.randn(4, dtype=F64), torch.rand(4, dtype=F64))
    a = R.native_batch_norm_backward(g, x, w, rm, rv, empty, empty, False, 1e-5, [True] * 3)
    b = R.native_batch_norm_backward(g, x, w, rm, rv, *filled, False, 1e-5, [True] * 3)
    e = A.native_batch_norm_backward(g, x, w, rm, rv, empty, empty, False, 1e-5, [True] * 3)
    for t1, t2, t3 in zip(a, b, e):
        close(t1, t3)
        close(t2, t3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eval_running_var_plus_eps_rounds_like_aten(dtype):
    """running_var = -eps: aten's sum in the accumulation dtype (fp32) is 0, invstd infinite, the channel's outputs
    and input gradients non-finite; a float64 sum (2.5e-13) used to turn them into finite numbers. (torch's CPU
    kernel gives NaN where the x * alpha + beta form meets inf - inf, normkit inf as torch's CUDA formula does:
    the non-finite positions are compared.)"""
    eps = 1e-5
    x = (torch.randn(4, 3, 5, dtype=F64) * 2 + 0.5).to(dtype)
    g = torch.randn(4, 3, 5, dtype=F64).to(dtype)
    w = torch.rand(3) + 0.5
    rm, rv = torch.randn(3), torch.rand(3) + 0.5
    rv[1] = -eps
    y = R.native_batch_norm(x, w, None, rm, rv, False, 0.1, eps)[0]
    want = A.native_batch_norm(x, w, None, rm, rv, False, 0.1, eps)[0]
    assert not torch.isfinite(y[:, 1]).any()
    assert torch.equal(torch.isfinite(y), torch.isfinite(want))
    gx = R.native_batch_norm_backward(g, x, w, rm, rv, None, None, False, eps, [True, False, False])[0]
    assert not torch.isfinite(gx[:, 1]).any() and torch.isfinite(gx[:, [0, 2]]).all()


def test_legit_overloads_and_new_stack():
    x = make((4, 3, 5))
    w, b = _params(3, "both")
    rm, rv = _running(3)
    # _native_batch_norm_legit (stats), .no_stats, _no_training
    for training in (True, False):
        r1, r2, a1, a2 = rm.clone(), rv.clone(), rm.clone(), rv.clone()
        for t1, t2 in zip(R._native_batch_norm_legit(x, w, b, r1, r2, training, 0.3, 1e-5),
                          A._native_batch_norm_legit(x, w, b, a1, a2, training, 0.3, 1e-5)):
            close(t1, t2)
        close(r1, a1)
        close(r2, a2)
    for t1, t2 in zip(R._native_batch_norm_legit_no_stats(x, w, b, True, 0.3, 1e-5),
                      A._native_batch_norm_legit.no_stats(x, w, b, True, 0.3, 1e-5)):
        close(t1, t2)
    for t1, t2 in zip(R._native_batch_norm_legit_no_training(x, w, b, rm, rv, 0.3, 1e-5),
                      A._native_batch_norm_legit_no_training(x, w, b, rm, rv, 0.3, 1e-5)):
        close(t1, t2)
    # _batch_norm_with_update / _no_update + batch_norm_backward (the export stack)
    r1, r2, a1, a2 = rm.clone(), rv.clone(), rm.clone(), rv.clone()
    out = R._batch_norm_with_update(x, w, b, r1, r2, -1.0, 1e-5)
    exp = A._batch_norm_with_update(x, w, b, a1, a2, -1.0, 1e-5)
    for t1, t2 in zip(out, exp):
        close(t1, t2)
    assert out[3].dtype == torch.uint8 and out[3].shape == (0,)
    close(r1, a1)
    close(r2, a2)
    g = make((4, 3, 5))
    for t1, t2 in zip(R.batch_norm_backward(g, x, w, a1, a2, exp[1], exp[2], True, 1e-5, [True] * 3, exp[3]),
                      A.batch_norm_backward(g, x, w, a1, a2, exp[1], exp[2], True, 1e-5, [True] * 3, exp[3])):
        close(t1, t2, rtol=1e-6, atol=1e-6)
    out = R._batch_norm_no_update(x, w, b, rm, rv, 0.1, 1e-5)
    exp = A._batch_norm_no_update(x, w, b, rm, rv, 0.1, 1e-5)
    for t1, t2 in zip(out, exp):
        close(t1, t2)
    for t1, t2 in zip(R.batch_norm_backward(g, x, w, rm, rv, exp[1], exp[2], False, 1e-5, [True] * 3, exp[3]),
                      A.batch_norm_backward(g, x, w, rm, rv, exp[1], exp[2], False, 1e-5, [True] * 3, exp[3])):
        close(t1, t2)


def test_update_stats():
    for shape in [(4, 3), (2, 3, 5, 5), (2, 1)]:
        x = make(shape, offset=100.0)
        rm, rv = _running(shape[1])
        a1, a2 = rm.clone(), rv.clone()
        for t1, t2 in zip(R.batch_norm_update_stats(x, rm, rv, 0.4), A.batch_norm_update_stats(x, a1, a2, 0.4)):
            close(t1, t2)
        close(rm, a1)
        close(rv, a2)
        for t1, t2 in zip(R.batch_norm_update_stats(x, None, None, 0.4),
                          A.batch_norm_update_stats(x, None, None, 0.4)):
            close(t1, t2)


def test_cudnn_ops_follow_native():
    # No cuDNN on CPU: compare with native_batch_norm(_backward), the contract's semantics (§13).
    x, g = make((4, 3, 6, 6), "cl"), make((4, 3, 6, 6))
    w, b = _params(3, "both")
    rm, rv = _running(3)
    r1, r2 = rm.clone(), rv.clone()
    out, mean, invstd, reserve = R.cudnn_batch_norm(x, w, b, r1, r2, True, 0.1, 1e-5)
    exp = A.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5)
    for t1, t2 in zip((out, mean, invstd), exp):
        close(t1, t2)
    close(r1, rm)
    close(r2, rv)
    assert reserve.dtype == torch.uint8 and reserve.numel() == 0
    grads = R.cudnn_batch_norm_backward(x, g, w, r1, r2, mean, invstd, 1e-5, reserve)
    exp_g = A.native_batch_norm_backward(g, x, w, rm, rv, exp[1], exp[2], True, 1e-5, [True] * 3)
    for t1, t2 in zip(grads, exp_g):
        close(t1, t2, rtol=1e-6, atol=1e-6)
    # Eval: empty saved stats, backward falls back to running stats.
    out, mean, invstd, _ = R.cudnn_batch_norm(x, w, b, rm, rv, False, 0.1, 1e-5)
    assert mean.shape == (0,) and invstd.shape == (0,)
    grads = R.cudnn_batch_norm_backward(x, g, w, rm, rv, mean, invstd, 1e-5, reserve)
    exp_g = A.native_batch_norm_backward(g, x, w, rm, rv, mean, invstd, False, 1e-5, [True] * 3)
    for t1, t2 in zip(grads, exp_g):
        close(t1, t2)


def test_edge_cases():
    # n == 1 at aten level: invstd = 1/sqrt(eps), output = bias, running_var NaN.
    x = make((1, 3))
    w, b = _params(3, "both")
    rm, rv = _running(3)
    a1, a2 = rm.clone(), rv.clone()
    for t1, t2 in zip(R.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5),
                      A.native_batch_norm(x, w, b, a1, a2, True, 0.1, 1e-5)):
        close(t1, t2)
    close(rm, a1)
    assert torch.isnan(rv).all() and torch.isnan(a2).all()
    # eps == 0 and a constant channel in training: invstd 0 (aten's InvStd guard), out = bias.
    x = make((4, 3, 5), constant_channel=True)
    out, mean, invstd = R.native_batch_norm(x, w, b, None, None, True, 0.1, 0.0)
    exp = A.native_batch_norm(x, w, b, None, None, True, 0.1, 0.0)
    for t1, t2 in zip((out, mean, invstd), exp):
        close(t1, t2)
    assert invstd[0] == 0 and torch.equal(out[:, 0], b[0].expand(4, 5))
    # Empty batch in eval: empty output, empty saved stats, running stats untouched.
    x = make((0, 3, 4))
    rm, rv = _running(3)
    a1, a2 = rm.clone(), rv.clone()
    for t1, t2 in zip(R.native_batch_norm(x, w, b, rm, rv, False, 0.1, 1e-5),
                      A.native_batch_norm(x, w, b, a1, a2, False, 0.1, 1e-5)):
        close(t1, t2)
    assert torch.equal(rm, a1) and torch.equal(rv, a2)
    # Empty batch backward in eval: zeros for weight/bias grads.
    g = make((0, 3, 4))
    empty = torch.empty(0, dtype=F64)
    # (aten's CPU kernel dies with SIGFPE on this one, so compare with the contract's zeros.)
    gi, gw, gb = R.native_batch_norm_backward(g, x, w, rm, rv, empty, empty, False, 1e-5, [True] * 3)
    assert gi.shape == (0, 3, 4) and torch.equal(gw, torch.zeros(3, dtype=F64)) and torch.equal(gb, gw)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("mixed", [False, True])
def test_low_precision_conventions(dtype, mixed):
    """normkit saves fp32 stats for half inputs (CPU saves bf16/fp16 when not mixed) and accepts mixed."""
    x64 = make((4, 3, 5, 5), "cl", offset=2.0)
    x = x64.to(dtype)
    pdt = torch.float32 if mixed else dtype
    w, b = torch.randn(3, dtype=pdt), torch.randn(3, dtype=pdt)
    rm, rv = torch.randn(3, dtype=pdt), torch.rand(3, dtype=pdt) + 0.5
    r1, r2 = rm.clone(), rv.clone()
    out, mean, invstd = R.native_batch_norm(x, w, b, r1, r2, True, 0.1, 1e-5)
    assert out.dtype == dtype and mean.dtype == torch.float32 and invstd.dtype == torch.float32
    assert r1.dtype == pdt and out.is_contiguous(memory_format=torch.channels_last)
    # Statistics of the rounded input, computed in float64, agree to fp32 precision.
    ref = R.native_batch_norm(x.double(), w.double(), b.double(), rm.double(), rv.double(), True, 0.1, 1e-5)
    close(mean, ref[1].float(), rtol=1e-5, atol=1e-5)
    close(invstd, ref[2].float(), rtol=1e-5, atol=1e-5)
    tol = {torch.bfloat16: 1.6e-2, torch.float16: 1e-3, torch.float32: 1e-5}[dtype]
    close(out, ref[0].to(dtype), rtol=tol, atol=tol)
    # torch's CPU kernel agrees on the output and (up to its stat dtype) on the saved mean.
    exp = A.native_batch_norm(x, w, b, rm.clone(), rv.clone(), True, 0.1, 1e-5)
    close(out, exp[0], rtol=tol, atol=tol)
    close(mean, exp[1].float(), rtol=tol, atol=tol)
    # Eval: empty fp32 saved stats.
    _, m2, i2 = R.native_batch_norm(x, w, b, rm, rv, False, 0.1, 1e-5)
    assert m2.shape == (0,) and m2.dtype == torch.float32 and i2.dtype == torch.float32
    # Backward: grad_input in input dtype, grad_weight/bias in the weight's.
    gi, gw, gb = R.native_batch_norm_backward(out, x, w, rm, rv, mean, invstd, True, 1e-5, [True] * 3)
    assert gi.dtype == dtype and gw.dtype == pdt and gb.dtype == pdt
    assert gi.is_contiguous(memory_format=torch.channels_last)


def test_any_param_dtype_accepted():
    # fp32 input with fp64 params (CPU refuses: "mixed dtype (CPU)"); normkit computes in fp32.
    x = make((4, 3, 5)).float()
    w, b = torch.randn(3, dtype=F64), torch.randn(3, dtype=F64)
    rm, rv = _running(3)
    out, mean, invstd = R.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5)
    assert out.dtype == torch.float32 and mean.dtype == torch.float32 and rm.dtype == F64
    ref = R.native_batch_norm(x.double(), w, b, None, None, True, 0.1, 1e-5)
    close(out, ref[0].float(), rtol=1e-5, atol=1e-5)


def test_suggest_memory_format_matches_torch():
    torch_suggest = getattr(pytest.importorskip("torch._prims_common"), "suggest_memory_format", None)
    if torch_suggest is None:
        pytest.skip("this torch has no Python suggest_memory_format")

    tensors = [make(s, layout) for s, layout in CASES]
    tensors += [torch.randn(4, 1, 1, 1), torch.randn(2, 3, 1, 5).permute(0, 3, 1, 2),
                torch.randn(1, 3, 1, 4).transpose(1, 3), torch.randn(2, 3, 4, 5).expand(2, 3, 4, 5),
                torch.randn(3, 4, 5).unsqueeze(0).transpose(1, 3)]
    for t in tensors:
        assert R.suggest_memory_format(t) == torch_suggest(t), (t.shape, t.stride())
