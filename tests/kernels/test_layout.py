"""The tile transpose between contiguous and channels_last(_3d) layouts (`normkit.kernels.layout`), and instance
norm's contiguous input and group norm's incoming gradient through it (knob `tile_transpose`). A copy: every element
must arrive bit for bit. Without CUDA the kernel runs through Triton's interpreter."""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

triton = pytest.importorskip("triton")

import normkit  # noqa: E402
from normkit.kernels import layout as K  # noqa: E402
from normkit.ops import custom  # noqa: E402
from normkit.ops import group_norm as gn_ops  # noqa: E402
from interp_rerun import rerun_cpu_checks  # noqa: E402

INTERPRETED = type(K._transpose_kernel).__name__ == "InterpretedFunction"
interp = pytest.mark.skipif(not INTERPRETED, reason="kernels were imported compiled; see test_cpu_checks_in_subprocess")
CL = {4: torch.channels_last, 5: torch.channels_last_3d}
SHAPES = [(2, 3, 5, 7), (1, 64, 8, 8), (3, 70, 9, 1), (2, 5, 3, 4, 6), (4, 130, 3, 3)]


def _check_both_ways(shape, dtype, device):
    x = (torch.randn(shape, dtype=torch.float64) * 3 + 0.5).to(dtype).to(device)
    cl = CL[len(shape)]
    to_cl = K.to_memory_format(x, cl)
    assert to_cl.is_contiguous(memory_format=cl) and torch.equal(to_cl, x)
    back = K.to_memory_format(to_cl, torch.contiguous_format)
    assert back.is_contiguous() and torch.equal(back, x)


@interp
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_transpose_copies_every_element(shape, dtype):
    _check_both_ways(shape, dtype, "cpu")


@interp
def test_in_layout_takes_the_kernel_only_between_the_two_dense_layouts(monkeypatch):
    """A strided view or fp64 goes through torch's copy; a dense channels_last input through the kernel."""
    calls = []
    monkeypatch.setattr(K, "to_memory_format", lambda t, fmt: calls.append(fmt) or t.contiguous(memory_format=fmt))
    x = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    assert gn_ops.in_layout(x, torch.contiguous_format).is_contiguous() and calls == [torch.contiguous_format]
    gn_ops.in_layout(x.double(), torch.contiguous_format)
    gn_ops.in_layout(x[:, :, ::2], torch.contiguous_format)
    assert gn_ops.in_layout(x, torch.channels_last) is x
    assert calls == [torch.contiguous_format]
    from normkit.kernels import group_norm

    monkeypatch.setitem(group_norm._CFG, "tile_transpose", 0)  # off: torch's copy
    assert gn_ops.in_layout(x, torch.contiguous_format).is_contiguous() and calls == [torch.contiguous_format]


@interp
@pytest.mark.parametrize("dim", [4, 5])
def test_contiguous_autograd_returns_the_gradient_in_the_inputs_layout(dim):
    shape = (2, 3, 4, 5) if dim == 4 else (2, 3, 2, 3, 4)
    x = torch.randn(shape).contiguous(memory_format=CL[dim]).requires_grad_()
    y = custom.contiguous_autograd(x)
    assert y.is_contiguous() and torch.equal(y, x)
    g = torch.randn(shape)
    (gx,) = torch.autograd.grad(y, x, g)
    assert gx.is_contiguous(memory_format=CL[dim]) and torch.equal(gx, g)


@interp
@pytest.mark.parametrize("use_input_stats", [True, False])
def test_instance_norm_of_channels_last_input_twice_differentiable(use_input_stats):
    """A gradient penalty through instance norm of a channels_last input: the first-order input gradient is
    differentiable (the tile transpose is not: the backward takes torch's copy under create_graph), and the
    second-order gradients are as close to float64 torch's as torch's own fp32 ones (the penalty cancels: with
    input statistics its x-gradient is ~1e-2 of the terms')."""
    torch.manual_seed(1)
    x = (torch.randn(2, 4, 3, 5, dtype=torch.float64) * 2 + 0.5).contiguous(memory_format=torch.channels_last)
    w, b = torch.rand(4, dtype=torch.float64) + 0.5, torch.randn(4, dtype=torch.float64)
    rm, rv = torch.randn(4, dtype=torch.float64), torch.rand(4, dtype=torch.float64) + 0.5
    F = torch.nn.functional
    grads = []
    for fn, dt in ((normkit.instance_norm, torch.float32), (F.instance_norm, torch.float32),
                   (F.instance_norm, torch.float64)):
        xx, ww = x.to(dt).requires_grad_(), w.to(dt).requires_grad_()
        y = fn(xx, rm.to(dt).clone(), rv.to(dt).clone(), ww, b.to(dt), use_input_stats=use_input_stats)
        gx, gw = torch.autograd.grad(y.square().sum(), (xx, ww), create_graph=True)
        assert gx.requires_grad
        grads.append(torch.autograd.grad(gx.square().sum() + gw.square().sum(), (xx, ww)))
    for nk, t32, ref in zip(*grads):
        err, err32 = ((a.double() - ref).norm() for a in (nk, t32))
        assert err <= 2 * err32 + 1e-6 * ref.norm(), (err, err32)


@interp
@pytest.mark.parametrize("training", [True, False])
def test_instance_norm_of_channels_last_input_against_float64(training):
    """Instance norm of a channels_last input (its copy to contiguous through the kernel): values and gradients
    against float64 torch; the output contiguous, the leaf's gradient channels_last."""
    torch.manual_seed(0)
    x = (torch.randn(2, 6, 5, 7, dtype=torch.float64) * 2 + 0.5).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    rm, rv = torch.randn(6, dtype=torch.float64), torch.rand(6, dtype=torch.float64) + 0.5
    g = torch.randn(x.shape, dtype=torch.float64)
    outs = []
    for fn, dt in ((normkit.instance_norm, torch.float32), (torch.nn.functional.instance_norm, torch.float64)):
        xx = x.to(dt).requires_grad_()
        y = fn(xx, rm.to(dt).clone(), rv.to(dt).clone(), w.to(dt), b.to(dt), use_input_stats=training)
        y.backward(g.to(dt))
        outs.append((y, xx.grad))
    (y, gx), (y64, gx64) = outs
    assert y.is_contiguous() and gx.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y.double(), y64, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gx.double(), gx64, rtol=1e-5, atol=1e-5 * gx64.abs().max().item())


@interp
@pytest.mark.parametrize("groups", [3, 6])
def test_group_norm_backward_takes_a_channels_last_gradient_through_the_kernel(monkeypatch, groups):
    """A contiguous input's channels_last incoming gradient (the next layer's) is moved to x's layout by the
    kernel; the gradients match float64 torch."""
    calls = []
    move = K.to_memory_format
    monkeypatch.setattr(K, "to_memory_format", lambda t, fmt: calls.append(fmt) or move(t, fmt))
    x = torch.randn(2, 6, 5, 7, dtype=torch.float64) * 2 + 0.5
    g = torch.randn(x.shape, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    grads = _grads_against_float64(lambda x, w, b: normkit.group_norm(x, groups, w, b),
                                   lambda x, w, b: torch.nn.functional.group_norm(x, groups, w, b), x, g, "cpu")
    assert calls == [torch.contiguous_format]
    _assert_grads_close(grads)
    assert grads[0][0].is_contiguous()


def _grads_against_float64(fn, ref, x, g, device):
    """(normkit's, float64 torch's) (dx, dw, db) for ``fn`` / ``ref`` called as f(x, w, b) with incoming ``g``."""
    C = x.shape[1]
    w, b = torch.randn(C, dtype=torch.float64) + 1.5, torch.randn(C, dtype=torch.float64)
    grads = []
    for f, dt in ((fn, torch.float32), (ref, torch.float64)):
        xx, ww, bb = (t.to(device, dt).requires_grad_() for t in (x, w, b))
        f(xx, ww, bb).backward(g.to(device, dt))
        grads.append((xx.grad, ww.grad, bb.grad))
    return grads


def _assert_grads_close(grads):
    for got, want in zip(*grads):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@interp
@pytest.mark.parametrize("dim", [4, 5])
def test_batch_norm_backward_takes_a_contiguous_gradient_of_a_channels_last_input_through_the_kernel(monkeypatch,
                                                                                                     dim):
    """A channels_last input's contiguous incoming gradient (a reshape after the layer) is moved to x's layout by
    the kernel; the gradients match float64 torch and dx keeps x's layout."""
    calls = []
    move = K.to_memory_format
    monkeypatch.setattr(K, "to_memory_format", lambda t, fmt: calls.append(fmt) or move(t, fmt))
    shape = (3, 5, 4, 6) if dim == 4 else (2, 5, 3, 2, 4)
    x = (torch.randn(shape, dtype=torch.float64) * 2 + 0.5).contiguous(memory_format=CL[dim])
    g = torch.randn(shape, dtype=torch.float64)
    bn = torch.nn.functional.batch_norm
    grads = _grads_against_float64(lambda x, w, b: normkit.batch_norm(x, None, None, w, b, training=True),
                                   lambda x, w, b: bn(x, None, None, w, b, training=True), x, g, "cpu")
    assert calls == [CL[dim]]
    _assert_grads_close(grads)
    assert grads[0][0].is_contiguous(memory_format=CL[dim])


def test_cpu_checks_in_subprocess():
    rerun_cpu_checks(__file__, INTERPRETED)


@pytest.mark.cuda
@pytest.mark.parametrize("shape", SHAPES + [(16, 64, 128, 128), (2, 32, 64, 64, 64), (3, 1000, 17, 19)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_transpose_copies_every_element(shape, dtype):
    _check_both_ways(shape, dtype, "cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(16, 64, 56, 56), (4, 37, 9, 11), (2, 32, 8, 16, 16)], ids=str)
@pytest.mark.parametrize("family", ["batch_norm", "group_norm"])
@pytest.mark.parametrize("x_cl", [True, False])
def test_cuda_backward_of_an_incoming_gradient_in_the_other_layout(shape, family, x_cl):
    """dy dense in the other layout than x (moved by the tile transpose): gradients against float64 torch."""
    cl = CL[len(shape)]
    x = torch.randn(shape, dtype=torch.float64) * 2 + 0.5
    g = torch.randn(shape, dtype=torch.float64)
    x, g = (x.contiguous(memory_format=cl), g) if x_cl else (x, g.contiguous(memory_format=cl))
    if family == "batch_norm":
        fn = lambda x, w, b: normkit.batch_norm(x, None, None, w, b, training=True)  # noqa: E731
        ref = lambda x, w, b: torch.nn.functional.batch_norm(x, None, None, w, b, training=True)  # noqa: E731
    else:
        groups = 1 if shape[1] % 4 else 4
        fn = lambda x, w, b: normkit.group_norm(x, groups, w, b)  # noqa: E731
        ref = lambda x, w, b: torch.nn.functional.group_norm(x, groups, w, b)  # noqa: E731
    _assert_grads_close(_grads_against_float64(fn, ref, x, g, "cuda"))
