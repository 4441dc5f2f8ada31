"""SyncBatchNorm primitives (a simulated world of ranks vs one batch norm) and gradcheck/gradgradcheck."""

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

import normkit.reference as R
from refhelpers import F64, close, make

A = torch.ops.aten


@pytest.mark.parametrize("layout", ["contig", "cl"])
def test_sync_primitives_equal_full_batch(layout):
    """Ranks with unequal batches (one empty, dropped as SyncBatchNorm does) == batch norm on the concat."""
    c, eps, momentum = 3, 1e-5, 0.1
    chunks = [make((n, c, 4, 5), layout, offset=50.0) for n in (3, 1, 5)]
    full = torch.cat(chunks)
    w, b = torch.randn(c, dtype=F64), torch.randn(c, dtype=F64)
    rm, rv = torch.randn(c, dtype=F64), torch.rand(c, dtype=F64) + 0.5
    r1, r2, a1, a2 = rm.clone(), rv.clone(), rm.clone(), rv.clone()
    exp_out, exp_mean, exp_invstd = A.native_batch_norm(full, w, b, a1, a2, True, momentum, eps)

    stats = [R.batch_norm_stats(x, eps) for x in chunks]
    counts = torch.tensor([x.numel() // c for x in chunks], dtype=F64)
    mean, invstd = R.batch_norm_gather_stats_with_counts(
        full, torch.stack([s[0] for s in stats]), torch.stack([s[1] for s in stats]), r1, r2, momentum, eps, counts)
    close(mean, exp_mean)
    close(invstd, exp_invstd)
    close(r1, a1)
    close(r2, a2)
    outs = [R.batch_norm_elemt(x, w, b, mean, invstd, eps) for x in chunks]
    close(torch.cat(outs), exp_out)
    assert all(o.is_contiguous(memory_format=R.suggest_memory_format(x)) for o, x in zip(outs, chunks))

    grads = [make(x.shape) for x in chunks]
    reduced = [R.batch_norm_backward_reduce(g, x, mean, invstd, w, True, True, True) for g, x in zip(grads, chunks)]
    sum_dy = sum(r[0] for r in reduced)
    sum_dy_xmu = sum(r[1] for r in reduced)
    count = counts.to(torch.int32)
    gis = [R.batch_norm_backward_elemt(g, x, mean, invstd, w, sum_dy, sum_dy_xmu, count)
           for g, x in zip(grads, chunks)]
    exp_gi, exp_gw, exp_gb = A.native_batch_norm_backward(torch.cat(grads), full, w, None, None, exp_mean,
                                                          exp_invstd, True, eps, [True] * 3)
    close(torch.cat(gis), exp_gi, rtol=1e-6, atol=1e-6)
    close(sum(r[2] for r in reduced), exp_gw, rtol=1e-6, atol=1e-6)  # local grads sum to the global one
    close(sum(r[3] for r in reduced), exp_gb, rtol=1e-6, atol=1e-6)
    # Masks: nothing requested → all None.
    assert R.batch_norm_backward_reduce(grads[0], chunks[0], mean, invstd, w, False, False, False) == (None,) * 4
    # Legacy equal-count gather.
    m2, i2 = R.batch_norm_gather_stats(full, torch.stack([stats[0][0]] * 2), torch.stack([stats[0][1]] * 2),
                                       None, None, momentum, eps, 12)
    close(m2, stats[0][0])
    close(i2, stats[0][1])


def test_sync_half_stats_are_float32():
    x = make((4, 3, 5), offset=1.0).half()
    mean, invstd = R.batch_norm_stats(x, 1e-5)
    assert mean.dtype == torch.float32 and invstd.dtype == torch.float32
    gm, gi = R.batch_norm_gather_stats_with_counts(x, mean[None].half(), invstd[None].half(), None, None, 0.1,
                                                   1e-5, torch.tensor([20.0]))
    assert gm.dtype == torch.float32
    assert R.batch_norm_elemt(x, None, None, gm, gi, 1e-5).dtype == torch.float16


def _leaf(*shape, offset=0.0):
    return (torch.randn(shape, dtype=F64) + offset).requires_grad_()


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_grad_and_gradgrad(training):
    x, w, b = _leaf(3, 2, 4), _leaf(2), _leaf(2)
    rm, rv = torch.randn(2, dtype=F64), torch.rand(2, dtype=F64) + 0.5

    def fwd(x, w, b):
        return R.native_batch_norm(x, w, b, rm.clone(), rv.clone(), training, 0.1, 1e-3)[0]

    assert gradcheck(fwd, (x, w, b))
    assert gradgradcheck(fwd, (x, w, b))

    # The backward function is differentiable too; with saved stats recomputed differentiably from x
    # (what the ops layer does for double backward), its derivative is torch's double backward.
    g = _leaf(3, 2, 4)

    def bwd(g, x, w):
        if training:
            mean, invstd = R.batch_norm_stats(x, 1e-3)
        else:
            mean = invstd = torch.empty(0, dtype=F64)
        return R.native_batch_norm_backward(g, x, w, rm, rv, mean, invstd, training, 1e-3, [True] * 3)

    assert gradcheck(bwd, (g, x, w))
    xt, wt, bt = (t.detach().clone().requires_grad_() for t in (x, w, b))
    out = torch.nn.functional.batch_norm(xt, rm.clone(), rv.clone(), wt, bt, training, 0.1, 1e-3)
    torch_grads = torch.autograd.grad(out, (xt, wt), g, create_graph=True)
    ours = bwd(g, x, w)
    v = torch.randn_like(x)
    second_torch = torch.autograd.grad((torch_grads[0] * v).sum() + torch_grads[1].sum(), (xt, wt))
    second_ours = torch.autograd.grad((ours[0] * v).sum() + ours[1].sum(), (x, w))
    for a, e in zip(second_ours, second_torch):
        close(a, e, rtol=1e-6, atol=1e-6)


def test_layer_rms_group_grad_and_gradgrad():
    x, w, b = _leaf(2, 3, 4), _leaf(3, 4), _leaf(3, 4)
    ln = lambda x, w, b: R.native_layer_norm(x, [3, 4], w, b, 1e-3)[0]  # noqa: E731
    assert gradcheck(ln, (x, w, b)) and gradgradcheck(ln, (x, w, b))
    rms = lambda x, w: R.rms_norm(x, [4], w[0], 1e-3)  # noqa: E731
    assert gradcheck(rms, (x, w)) and gradgradcheck(rms, (x, w))
    wc, bc = _leaf(6), _leaf(6)
    xg = _leaf(2, 6, 3)
    gn = lambda x, w, b: R.native_group_norm(x, w, b, 2, 6, 3, 2, 1e-3)[0]  # noqa: E731
    assert gradcheck(gn, (xg, wc, bc)) and gradgradcheck(gn, (xg, wc, bc))
    inorm = lambda x, w, b: R.instance_norm(x, w, b, None, None, True, 0.1, 1e-3)  # noqa: E731
    assert gradcheck(inorm, (xg, wc, bc)) and gradgradcheck(inorm, (xg, wc, bc))

    # Backward functions: first derivatives exist (used for double backward by the ops layer).
    g = _leaf(2, 3, 4)
    ln_b = lambda g, x, w: R.native_layer_norm_backward(  # noqa: E731
        g, x, [3, 4], *R.native_layer_norm(x, [3, 4], w, None, 1e-3)[1:], w, None, [True, True, False])[:2]
    assert gradcheck(ln_b, (g, x, w))
    rms_b = lambda g, x, w: R._fused_rms_norm_backward(  # noqa: E731
        g, x, [4], R._fused_rms_norm(x, [4], w[0], 1e-3)[1], w[0], [True, True])
    assert gradcheck(rms_b, (g, x, w))
    gg = _leaf(2, 6, 3)
    gn_b = lambda g, x, w: R.native_group_norm_backward(  # noqa: E731
        g, x, *R.native_group_norm(x, w, None, 2, 6, 3, 2, 1e-3)[1:], w, 2, 6, 3, 2, [True, True, True])
    assert gradcheck(gn_b, (gg, xg, wc))
