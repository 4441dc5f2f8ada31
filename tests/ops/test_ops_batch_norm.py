"""normkit.ops batch norm: aten names, signatures, return values; checked against torch's CPU kernels in
float64 and against the contract's conventions (invstd saved, empty eval stats, reserve, errors)."""

import pytest
import torch

import normkit
from normkit import ops

F64 = torch.float64


def _inputs(shape=(4, 3, 5, 2), dtype=F64, channels_last=False, seed=None):
    g = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
    x = torch.randn(shape, generator=g, dtype=dtype) * 2 + 0.5
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last if len(shape) == 4 else torch.channels_last_3d)
    c = shape[1]
    w = torch.randn(c, generator=g, dtype=dtype)
    b = torch.randn(c, generator=g, dtype=dtype)
    rm = torch.randn(c, generator=g, dtype=dtype)
    rv = torch.rand(c, generator=g, dtype=dtype) + 0.5
    return x, w, b, rm, rv


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("momentum", [0.1, -1.2])
def test_native_batch_norm_matches_torch(training, channels_last, momentum):
    x, w, b, rm, rv = _inputs(channels_last=channels_last)
    rm_t, rv_t = rm.clone(), rv.clone()
    out, sm, si = ops.native_batch_norm(x, w, b, rm, rv, training, momentum, 1e-5)
    out_t, sm_t, si_t = torch.ops.aten.native_batch_norm(x, w, b, rm_t, rv_t, training, momentum, 1e-5)
    torch.testing.assert_close(out, out_t)
    torch.testing.assert_close(rm, rm_t)
    torch.testing.assert_close(rv, rv_t)
    assert out.is_contiguous(memory_format=torch.channels_last) == channels_last
    if training:
        torch.testing.assert_close(sm, sm_t)
        torch.testing.assert_close(si, si_t)  # invstd, not the variance
        var = x.var(dim=(0, 2, 3), unbiased=False)
        torch.testing.assert_close(si, torch.rsqrt(var + 1e-5))
    else:
        assert sm.shape == (0,) and si.shape == (0,)


def test_legit_overloads_and_update_variants():
    x, w, b, rm, rv = _inputs()
    rm0, rv0 = rm.clone(), rv.clone()
    ref = torch.ops.aten._native_batch_norm_legit(x, w, b, rm0.clone(), rv0.clone(), True, 0.1, 1e-5)
    got = ops._native_batch_norm_legit(x, w, b, rm, rv, True, 0.1, 1e-5)
    for a, e in zip(got, ref):
        torch.testing.assert_close(a, e)
    got = ops._native_batch_norm_legit_no_stats(x, w, b, True, 0.1, 1e-5)
    ref = torch.ops.aten._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-5)
    for a, e in zip(got, ref):
        torch.testing.assert_close(a, e)
    got = ops._native_batch_norm_legit_no_training(x, w, b, rm0, rv0, 0.1, 1e-5)
    torch.testing.assert_close(got[0], torch.ops.aten._native_batch_norm_legit_no_training(x, w, b, rm0, rv0, 0.1, 1e-5)[0])
    assert got[1].numel() == 0 and got[2].numel() == 0
    rm1, rv1 = rm0.clone(), rv0.clone()
    out = ops._batch_norm_with_update(x, w, b, rm1, rv1, 0.3, 1e-5)
    exp = torch.ops.aten._batch_norm_with_update(x, w, b, rm0.clone(), rv0.clone(), 0.3, 1e-5)
    assert len(out) == 4 and out[3].dtype == torch.uint8 and out[3].numel() == 0
    torch.testing.assert_close(out[0], exp[0])
    torch.testing.assert_close(out[2], exp[2])
    out = ops._batch_norm_no_update(x, w, b, rm0, rv0, 0.3, 1e-5)
    torch.testing.assert_close(out[0], torch.ops.aten._batch_norm_no_update(x, w, b, rm0, rv0, 0.3, 1e-5)[0])
    assert out[3].dtype == torch.uint8


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("mask", [(True, True, True), (True, False, False), (False, True, True)])
def test_native_batch_norm_backward(train, mask):
    x, w, b, rm, rv = _inputs(seed=3)
    g = torch.randn_like(x)
    _, sm, si = torch.ops.aten.native_batch_norm(x, w, b, rm.clone(), rv.clone(), train, 0.1, 1e-5)
    exp = torch.ops.aten.native_batch_norm_backward(g, x, w, rm, rv, sm, si, train, 1e-5, list(mask))
    got = ops.native_batch_norm_backward(g, x, w, rm, rv, sm, si, train, 1e-5, list(mask))
    for a, e, m in zip(got, exp, mask):
        if m:
            torch.testing.assert_close(a, e)
        else:
            assert a is None
    if not train:  # eval accepts filled saved stats too (the CUDA convention)
        filled = (rm.clone(), torch.rsqrt(rv + 1e-5))
        got2 = ops.native_batch_norm_backward(g, x, w, rm, rv, *filled, False, 1e-5, list(mask))
        for a, e in zip(got2, got):
            assert (a is None) == (e is None)
            if a is not None:
                torch.testing.assert_close(a, e)


def test_batch_norm_backward_needs_weight_and_ignores_reserve():
    x, w, b, rm, rv = _inputs()
    g = torch.randn_like(x)
    out, sm, si, reserve = ops._batch_norm_with_update(x, w, b, rm, rv, 0.1, 1e-5)
    got = ops.batch_norm_backward(g, x, w, rm, rv, sm, si, True, 1e-5, [True, True, True], reserve)
    exp = torch.ops.aten.native_batch_norm_backward(g, x, w, rm, rv, sm, si, True, 1e-5, [True, True, True])
    for a, e in zip(got, exp):
        torch.testing.assert_close(a, e)
    with pytest.raises(RuntimeError, match="Expected a proper Tensor but got None"):
        ops.batch_norm_backward(g, x, None, rm, rv, sm, si, True, 1e-5, [True, True, True], reserve)


def test_cudnn_batch_norm_contract_section_13():
    """(out, save_mean, save_invstd, reserve): reserve empty uint8; the backward's save_var is invstd."""
    x, w, b, rm, rv = _inputs(seed=5)
    rm_t, rv_t = rm.clone(), rv.clone()
    out, sm, si, reserve = ops.cudnn_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5)
    out_t, sm_t, si_t = torch.ops.aten.native_batch_norm(x, w, b, rm_t, rv_t, True, 0.1, 1e-5)
    torch.testing.assert_close(out, out_t)
    torch.testing.assert_close(si, si_t)
    torch.testing.assert_close(rv, rv_t)
    assert reserve.dtype == torch.uint8 and reserve.numel() == 0
    g = torch.randn_like(x)
    got = ops.cudnn_batch_norm_backward(x, g, w, rm, rv, sm, si, 1e-5, reserve)
    exp = torch.ops.aten.native_batch_norm_backward(g, x, w, rm, rv, sm_t, si_t, True, 1e-5, [True] * 3)
    for a, e in zip(got, exp):
        torch.testing.assert_close(a, e)
    out_e, sm_e, si_e, _ = ops.cudnn_batch_norm(x, w, b, rm, rv, False, 0.1, 1e-5)
    assert sm_e.numel() == 0 and si_e.numel() == 0
    with pytest.raises(RuntimeError, match="Expected a proper Tensor"):
        ops.cudnn_batch_norm(x, None, b, rm, rv, True, 0.1, 1e-5)


def test_batch_norm_update_stats():
    x, _, _, rm, rv = _inputs()
    rm_t, rv_t = rm.clone(), rv.clone()
    got = ops.batch_norm_update_stats(x, rm, rv, 0.2)
    exp = torch.batch_norm_update_stats(x, rm_t, rv_t, 0.2)
    for a, e in zip(got, exp):
        torch.testing.assert_close(a, e)
    torch.testing.assert_close(rv, rv_t)


def test_low_precision_stats_are_float32():
    x, w, b, rm, rv = _inputs(dtype=torch.bfloat16)
    out, sm, si = ops.native_batch_norm(x, w.float(), b.float(), rm.float(), rv.float(), True, 0.1, 1e-5)
    assert out.dtype == torch.bfloat16 and sm.dtype == torch.float32 and si.dtype == torch.float32


@pytest.mark.parametrize("case, exc, msg", [
    ("weight", RuntimeError, "weight should contain 3 elements not 4"),
    ("running_var", RuntimeError, "running_var should contain 3 elements not 2"),
    ("one_stat", ValueError, "running_mean and running_var must either both be None or neither be None"),
    ("eval_no_stats", RuntimeError, "running_mean must be defined in evaluation mode"),
    ("long", NotImplementedError, "\"batch_norm\" not implemented for 'Long'"),
])
def test_errors_leave_running_stats_untouched(case, exc, msg):
    x, w, b, rm, rv = _inputs()
    training = True
    if case == "weight":
        w = torch.randn(4, dtype=F64)
    elif case == "running_var":
        rv = torch.rand(2, dtype=F64) + 1
    elif case == "one_stat":
        rv = None
    elif case == "eval_no_stats":
        rm = rv = None
        training = False
    elif case == "long":
        x = torch.ones(4, 3, 2, dtype=torch.long)
    saved = [None if t is None else t.clone() for t in (rm, rv)]
    with pytest.raises(exc, match=msg.replace("(", r"\(").replace(")", r"\)")):
        ops.native_batch_norm(x, w, b, rm, rv, training, 0.1, 1e-5)
    for t, s in zip((rm, rv), saved):
        if t is not None:
            assert torch.equal(t, s)


def test_group_instance_and_sync_primitives_delegate_to_reference():
    x, w, b, rm, rv = _inputs(shape=(2, 6, 4, 3))
    out, mean, rstd = ops.native_group_norm(x, w, b, 2, 6, 12, 3, 1e-5)
    exp = torch.ops.aten.native_group_norm(x, w, b, 2, 6, 12, 3, 1e-5)
    torch.testing.assert_close(out, exp[0])
    g = torch.randn_like(x)
    got = ops.native_group_norm_backward(g, x, mean, rstd, w, 2, 6, 12, 3, [True, True, True])
    ref = torch.ops.aten.native_group_norm_backward(g, x, exp[1], exp[2], w, 2, 6, 12, 3, [True] * 3)
    for a, e in zip(got, ref):
        torch.testing.assert_close(a, e)
    y = ops.instance_norm(x, None, None, None, None, True, 0.1, 1e-5, False)
    torch.testing.assert_close(y, torch.instance_norm(x, None, None, None, None, True, 0.1, 1e-5, False))
    mean, invstd = ops.batch_norm_stats(x, 1e-5)
    torch.testing.assert_close(mean, x.mean(dim=(0, 2, 3)))
    y = ops.batch_norm_elemt(x, None, None, mean, invstd, 1e-5)
    torch.testing.assert_close(y, torch.ops.aten.native_batch_norm(x, None, None, None, None, True, 0.0, 1e-5)[0])


def _strided(t: torch.Tensor) -> torch.Tensor:
    """t's values as a stride-2 view into a larger random buffer (a non-contiguous (C,) tensor)."""
    buf = torch.randn(2 * t.numel(), dtype=t.dtype)
    buf[::2].copy_(t)
    return buf[::2]


@pytest.mark.parametrize("training", [True, False])
def test_noncontiguous_params_and_running_stats(training):
    """Strided weight/bias/running stats (e.g. slices of a bigger buffer): the Triton kernels index dense
    (C,) arrays, so ops must hand them dense copies, and write the running-stat update back in place."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    x = torch.randn(4, 3, 5, 2, generator=g) * 2 + 0.5
    w, b = _strided(torch.randn(3, generator=g)), _strided(torch.randn(3, generator=g))
    rm, rv = _strided(torch.randn(3, generator=g)), _strided(torch.rand(3, generator=g) + 0.5)
    assert not (w.is_contiguous() or rm.is_contiguous())
    rm64, rv64 = rm.double(), rv.double()
    others = rm._base[1::2].clone(), rv._base[1::2].clone()
    out, sm, si = ops.native_batch_norm(x, w, b, rm, rv, training, 0.1, 1e-5)
    ref = torch.ops.aten.native_batch_norm(x.double(), w.double(), b.double(), rm64, rv64, training, 0.1, 1e-5)
    tol = dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.double(), ref[0], **tol)
    torch.testing.assert_close(rm.double(), rm64, **tol)
    torch.testing.assert_close(rv.double(), rv64, **tol)
    assert torch.equal(rm._base[1::2], others[0]) and torch.equal(rv._base[1::2], others[1])
    go = torch.randn(x.shape, generator=g)
    got = ops.native_batch_norm_backward(go, x, w, rm, rv, sm, si, training, 1e-5, [True, True, True])
    exp = torch.ops.aten.native_batch_norm_backward(go.double(), x.double(), w.double(), rm.double(), rv.double(),
                                                    ref[1], ref[2], training, 1e-5, [True, True, True])
    for a, e in zip(got, exp):
        torch.testing.assert_close(a.double(), e, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("strided", [False, True])
def test_running_stats_updated_under_inference_mode(dtype, strided):
    """Running stats made under torch.inference_mode are inference tensors, which have no autograd version counter:
    the update's write without bumping it raised "Inference tensors do not track version counter" (the reference's
    update, fp64; the kernels' write-back of strided stats, fp32; SyncBatchNorm's gather). torch updates them."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    x = torch.randn(4, 3, 5, 2, generator=g, dtype=dtype) * 2 + 0.5
    x64 = x.double()
    with torch.inference_mode():
        rm = torch.randn(6, generator=g, dtype=dtype)
        rv = torch.rand(6, generator=g, dtype=dtype) + 0.5
        rm, rv = (rm[::2], rv[::2]) if strided else (rm[:3].clone(), rv[:3].clone())
        rm0, rv0 = rm.to(F64, copy=True), rv.to(F64, copy=True)
        rm64, rv64 = rm0.clone(), rv0.clone()
        out = ops.native_batch_norm(x, None, None, rm, rv, True, 0.3, 1e-5)
        ref = torch.ops.aten.native_batch_norm(x64, None, None, rm64, rv64, True, 0.3, 1e-5)
        # SyncBatchNorm's global step: two ranks' halves of x merged, the running stats moved to x's statistics
        halves = [ops.batch_norm_stats(h, 1e-5) for h in x.split(2)]
        grm, grv = rm0.to(dtype, copy=True), rv0.to(dtype, copy=True)
        ops.batch_norm_gather_stats_with_counts(x, torch.stack([m for m, _ in halves]),
                                                torch.stack([s for _, s in halves]), grm, grv, 0.5, 1e-5,
                                                torch.tensor([20.0, 20.0], dtype=dtype))
    assert rm.is_inference() and grm.is_inference()
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else {}
    torch.testing.assert_close(out[0].double(), ref[0], **tol)
    torch.testing.assert_close(rm.double(), rm64, **tol)
    torch.testing.assert_close(rv.double(), rv64, **tol)
    torch.testing.assert_close(grm.double(), 0.5 * rm0 + 0.5 * x64.mean((0, 2, 3)), **tol)
    torch.testing.assert_close(grv.double(), 0.5 * rv0 + 0.5 * x64.var((0, 2, 3)), **tol)


def _rel_err(got, exact):
    return ((got.double() - exact).abs() / exact.abs()).max().item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("training, stats", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("create_graph", [False, True])
def test_bias_grad_without_weight_keeps_fp32_precision(dtype, training, stats, create_graph):
    """A 16-bit input with an fp32 bias and no weight (a mixed call, contract §1.1): bias.grad is the fp32 sum of
    the upstream gradient, not a 16-bit-rounded one (grad_bias took the input's dtype, ~1e-3 relative off)."""
    seed = torch.seed() % 2**31
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(6, 4, 5, 3, generator=gen, dtype=F64) * 2 + 0.5).to(dtype)
    # an offset keeps every channel's sum away from 0: a relative error per channel means something
    g = (torch.randn(x.shape, generator=gen, dtype=F64) + 1.0).to(dtype)
    rm = torch.randn(4, generator=gen) if stats else None
    rv = torch.rand(4, generator=gen) + 0.5 if stats else None
    b = (torch.randn(4, generator=gen) + 0.5).requires_grad_()
    y = normkit.batch_norm(x, rm, rv, None, b, training=training)
    (gb,) = torch.autograd.grad(y, (b,), g, create_graph=create_graph)
    exact = g.double().sum((0, 2, 3))
    assert gb.dtype == torch.float32
    assert _rel_err(gb, exact) < 1e-6, seed


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_native_batch_norm_backward_grad_dtype_without_weight(dtype):
    """grad_weight / grad_bias with weight None take the dtype of the first statistic passed (running stats, then
    saved stats), as torch's CPU kernels: fp32 for fp32 ones, the input's for a pure 16-bit eval call."""
    seed = torch.seed() % 2**31
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(5, 3, 4, 2, generator=gen, dtype=F64) * 2 + 0.5).to(dtype)
    g = (torch.randn(x.shape, generator=gen, dtype=F64) + 1.0).to(dtype)
    rm, rv = torch.randn(3, generator=gen), torch.rand(3, generator=gen) + 0.5
    b = torch.randn(3, generator=gen) + 0.5
    exact = g.double().sum((0, 2, 3))
    mask = [True, True, True]
    A = torch.ops.aten
    # training, fp32 saved stats (normkit's for a 16-bit input; torch's for a mixed call), with / without fp32
    # running stats; eval with fp32 running stats
    _, sm, si = ops.native_batch_norm(x, None, b, None, None, True, 0.1, 1e-5)
    assert sm.dtype == torch.float32
    for args in ((None, None, sm, si, True), (rm, rv, sm, si, True), (rm, rv, sm[:0], si[:0], False)):
        got = ops.native_batch_norm_backward(g, x, None, *args, 1e-5, mask)
        want = A.native_batch_norm_backward(g, x, None, *args, 1e-5, mask)
        assert got[1].dtype == got[2].dtype == torch.float32 == want[2].dtype
        assert _rel_err(got[2], exact) < 1e-6, seed
        torch.testing.assert_close(got[1], want[1], rtol=1e-3, atol=1e-3)
    # pure 16-bit eval call: 16-bit running stats, grad_bias in the input's dtype (torch's too)
    rmh, rvh = rm.to(dtype), rv.to(dtype)
    got = ops.native_batch_norm_backward(g, x, None, rmh, rvh, None, None, False, 1e-5, mask)
    want = A.native_batch_norm_backward(g, x, None, rmh, rvh, None, None, False, 1e-5, mask)
    assert got[1].dtype == got[2].dtype == dtype == want[2].dtype
    torch.testing.assert_close(got[2].double(), exact, rtol=2 ** -7, atol=0)
    torch.testing.assert_close(got[2], want[2], rtol=2 ** -7, atol=0)
