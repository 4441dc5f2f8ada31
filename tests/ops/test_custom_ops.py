"""The torch.library custom ops: schemas and fake implementations (opcheck), autograd, torch.compile."""

import pytest
import torch

import normkit
from normkit.ops import custom

F64 = torch.float64


def _opcheck(op, args, **kw):
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck missing")
    torch.library.opcheck(op, args, **kw)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("channels_last", [False, True])
def test_opcheck_batch_norm(training, channels_last):
    x = torch.randn(4, 3, 5, 2)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(3), torch.randn(3)
    _opcheck(torch.ops.normkit.batch_norm.default, (x, w, b, torch.randn(3), torch.rand(3) + 1, training, 0.1, 1e-5),
             test_utils=("test_schema", "test_faketensor"))
    rm, rv = torch.randn(3), torch.rand(3) + 1
    y, s1, s2 = custom.batch_norm(x, w, b, rm, rv, training, 0.1, 1e-5)
    if not training:  # eval saves nothing: the backward takes the running stats
        assert s1.shape == (0,) and s2.shape == (0,)
        s1, s2 = rm, rv
    g = torch.randn_like(x)
    _opcheck(torch.ops.normkit.batch_norm_backward.default, (g, x, w, s1, s2, training, 1e-5, [True, False, True]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_norm_ambiguous_channels_last_layout(dtype):
    # (1, C, 1, W) with channels_last strides: suggest_memory_format says contiguous, torch's kernels keep
    # channels_last. normkit's eager path (the kernels), the reference, the custom op and its fake
    # implementation (what torch.compile plans with) must all give torch's layout (found by
    # tests/test_randomized.py: eager kept it, the custom op made it contiguous)
    x = torch.randn(3, 3, dtype=torch.float64).t().reshape(1, 3, 1, 3).to(dtype)  # strides (., 1, ., 3)
    assert x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    w, b = torch.rand(3) + 0.5, torch.randn(3)
    want = torch.nn.functional.batch_norm(x.double(), None, None, w.double(), b.double(), True)
    assert want.is_contiguous(memory_format=torch.channels_last)
    xg = x.detach().requires_grad_(True)
    y = normkit.batch_norm(xg, None, None, w, b, True)
    y.backward(torch.randn_like(y))
    yr = normkit.reference.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)[0]
    yc = custom.batch_norm(x, w, b, None, None, True, 0.1, 1e-5)[0]
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        yf = torch.ops.normkit.batch_norm(mode.from_tensor(x), mode.from_tensor(w), mode.from_tensor(b), None, None,
                                          True, 0.1, 1e-5)[0]
    for t in (y, yr, yc, yf):  # (x.grad: autograd gives the leaf's strides)
        assert t.is_contiguous(memory_format=torch.channels_last)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(y.double(), want, rtol=tol, atol=tol)


def test_rms_norm_ambiguous_channels_last_layout():
    # the same (1, C, 1, W) input: torch's rms_norm makes it contiguous (suggest_memory_format), unlike its batch
    # norm; eager, the custom op's fake implementation and the reference must agree (found by
    # tests/test_randomized.py: eager kept channels_last)
    x = torch.randn(3, 3, dtype=torch.float64).t().reshape(1, 3, 1, 3).to(torch.bfloat16)
    assert x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    want = torch.nn.functional.rms_norm(x.double(), (3,), eps=0.1)
    assert want.is_contiguous()
    y = normkit.rms_norm(x, (3,), None, 0.1)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        yf = torch.ops.normkit.rms_norm(mode.from_tensor(x), [3], None, 0.1)[0]
    for t in (y, normkit.reference.rms_norm(x, [3], None, 0.1), yf):  # (x.grad: autograd gives the leaf's strides)
        assert t.is_contiguous()
    torch.testing.assert_close(y.double(), want, rtol=2e-2, atol=2e-2)


def test_opcheck_layer_and_rms_norm():
    x = torch.randn(2, 3, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    b = torch.randn(8, requires_grad=True)
    _opcheck(torch.ops.normkit.layer_norm.default, (x, [8], w, b, 1e-5))
    _opcheck(torch.ops.normkit.rms_norm.default, (x, [8], w, 1e-6))
    _opcheck(torch.ops.normkit.add_layer_norm.default, (x, torch.randn(2, 3, 8), [8], w, b, 1e-5))
    _opcheck(torch.ops.normkit.add_rms_norm.default, (x, torch.randn(2, 3, 8), [8], None, 1e-6))
    y, mean, rstd = custom.layer_norm(x.detach(), [8], w.detach(), b.detach(), 1e-5)
    g = torch.randn_like(y)
    _opcheck(torch.ops.normkit.layer_norm_backward.default,
             (g, x.detach(), [8], mean, rstd, w.detach(), b.detach(), [True, True, False]))
    y, rstd = custom.rms_norm(x.detach(), [8], w.detach(), 1e-6)
    _opcheck(torch.ops.normkit.rms_norm_backward.default, (g, x.detach(), [8], rstd, w.detach(), [False, True]))


def test_layer_and_rms_norm_permuted_weight_grads_dense():
    # a permuted (3, 4) weight / bias: dw / db come back contiguous (as aten's), and the fake kernels must say
    # so, or inductor's stride assertion on the compiled backward fails
    torch.manual_seed(0)
    x = torch.randn(5, 3, 4)
    w, b = torch.randn(4, 3).t(), torch.randn(4, 3).t()
    g = torch.randn(5, 3, 4)
    _, mean, rstd = custom.layer_norm(x, [3, 4], w, b, 1e-5)
    _opcheck(torch.ops.normkit.layer_norm_backward.default, (g, x, [3, 4], mean, rstd, w, b, [True, True, True]))
    _, rstd2 = custom.rms_norm(x, [3, 4], w, 1e-5)
    _opcheck(torch.ops.normkit.rms_norm_backward.default, (g, x, [3, 4], rstd2, w, [True, True]))

    def loss(x, w, b):
        return (normkit.layer_norm(x, (3, 4), w, b).sin().sum()
                + normkit.rms_norm(x, (3, 4), w, 1e-5).cos().sum())

    xs = [t.clone().requires_grad_() for t in (x, w, b)]
    got = torch.autograd.grad(torch.compile(loss, backend="inductor", fullgraph=True)(*xs), xs)
    xd = [t.double().requires_grad_() for t in (x, w, b)]
    want = torch.autograd.grad(torch.nn.functional.layer_norm(xd[0], (3, 4), xd[1], xd[2]).sin().sum()
                               + torch.nn.functional.rms_norm(xd[0], (3, 4), xd[1], 1e-5).cos().sum(), xd)
    for a, e in zip(got, want):
        torch.testing.assert_close(a.double(), e, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("channels_last", [False, True])
def test_opcheck_group_norm(channels_last):
    x = torch.randn(2, 6, 4, 5) * 2 + 1
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(6), torch.randn(6)
    _opcheck(torch.ops.normkit.group_norm.default, (x, 3, w, b, 1e-5, False))
    _opcheck(torch.ops.normkit.group_norm.default, (x.bfloat16(), 2, None, None, 1e-5, True))
    y, mean, rstd = custom.group_norm(x, 3, w, b, 1e-5, False)
    g = torch.randn_like(y)
    _opcheck(torch.ops.normkit.group_norm_backward.default, (g, x, 3, mean, rstd, w, [True, True, False]))


@pytest.mark.parametrize("training", [True, False])
def test_opcheck_backward_without_weight_grad_dtypes(training):
    """weight None: grad_weight / grad_bias in the statistics' dtype (fp32 for a bf16 input with fp32 ones, a mixed
    call; bf16 for a pure-bf16 call's bf16 ones), in the real kernels and the fake ones alike."""
    x = (torch.randn(4, 3, 5, 2) * 2 + 0.5).bfloat16()
    g = torch.randn_like(x)
    mask = [True, True, True]
    if training:
        _, s1, s2 = custom.batch_norm(x, None, torch.randn(3), None, None, True, 0.1, 1e-5)
        pairs = [((s1, s2), torch.float32)]
    else:
        rm, rv = torch.randn(3), torch.rand(3) + 1
        pairs = [((rm, rv), torch.float32), ((rm.bfloat16(), rv.bfloat16()), torch.bfloat16)]
    for (a, b), want in pairs:
        _opcheck(torch.ops.normkit.batch_norm_backward.default, (g, x, None, a, b, training, 1e-5, mask))
        gi, gw, gb = custom.batch_norm_backward(g, x, None, a, b, training, 1e-5, mask)
        assert gi.dtype == torch.bfloat16 and gw.dtype == gb.dtype == want
    x = x.reshape(4, 6, 5)
    g = torch.randn_like(x)
    for bias, want in ((torch.randn(6), torch.float32), (torch.randn(6).bfloat16(), torch.bfloat16)):
        _, mean, rstd = custom.group_norm(x, 3, None, bias, 1e-5, False)
        _opcheck(torch.ops.normkit.group_norm_backward.default, (g, x, 3, mean, rstd, None, mask))
        gi, gw, gb = custom.group_norm_backward(g, x, 3, mean, rstd, None, mask)
        assert gi.dtype == torch.bfloat16 and gw.dtype == gb.dtype == want


def _gn_model_fn(x, gw, gb, iw):
    y = normkit.group_norm(x, 3, gw, gb)
    y = normkit.instance_norm(y, weight=iw, bias=None)
    return (y * y).sum()


@pytest.mark.parametrize("channels_last", [False, True])
def test_compile_fullgraph_group_and_instance_norm(channels_last):
    torch.manual_seed(0)
    x = torch.randn(4, 6, 5, 7) * 2 + 1
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    params = [torch.randn(6, requires_grad=True) for _ in range(3)]
    compiled = torch.compile(_gn_model_fn, backend="aot_eager", fullgraph=True)
    l1 = compiled(x, *params)
    g1 = torch.autograd.grad(l1, [x] + params)
    l2 = _gn_model_fn(x, *params)
    g2 = torch.autograd.grad(l2, [x] + params)
    torch.testing.assert_close(l1, l2, rtol=1e-5, atol=1e-4)
    for a, e in zip(g1, g2):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)


def _model_fn(x, rm, rv, w, b, lw, lb, rw, res):
    y = normkit.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1)
    y = normkit.layer_norm(y, (6,), lw, lb)
    y = normkit.rms_norm(y, (6,), rw)
    y2, s = normkit.add_rms_norm(y, res, (6,), rw)
    y3, s3 = normkit.add_layer_norm(y2, s, (6,), lw, None)
    e = normkit.batch_norm(y3, rm, rv, w, b, training=False)
    return (e * s3).sum()


def _check_compiled(backend):
    torch.manual_seed(0)
    x = torch.randn(4, 3, 5, 6, requires_grad=True)
    params = [torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True),
              torch.randn(6, requires_grad=True), torch.randn(6, requires_grad=True), torch.randn(6, requires_grad=True)]
    res = torch.randn(4, 3, 5, 6)
    rm, rv = torch.randn(3), torch.rand(3) + 0.5
    rm2, rv2 = rm.clone(), rv.clone()
    compiled = torch.compile(_model_fn, backend=backend, fullgraph=True)
    l1 = compiled(x, rm, rv, *params, res)
    g1 = torch.autograd.grad(l1, [x] + params)
    l2 = _model_fn(x, rm2, rv2, *params, res)
    g2 = torch.autograd.grad(l2, [x] + params)
    torch.testing.assert_close(l1, l2, rtol=1e-5, atol=1e-4)
    for a, e in zip(g1, g2):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(rm, rm2)  # the running-stat mutation survives functionalization
    torch.testing.assert_close(rv, rv2)


def test_compile_fullgraph_aot_eager():
    _check_compiled("aot_eager")


def test_compile_fullgraph_inductor():
    pytest.importorskip("triton")  # inductor's CPU backend needs a C++ compiler, not triton; keep it small
    _check_compiled("inductor")


@pytest.mark.cuda
@pytest.mark.parametrize("channels_last", [False, True])
def test_cuda_graph_capture_group_norm(channels_last):
    torch.manual_seed(0)
    dev = "cuda"
    x = torch.randn(8, 32, 16, 16, device=dev, dtype=torch.bfloat16)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    w = torch.randn(32, device=dev, requires_grad=True)
    b = torch.randn(32, device=dev, requires_grad=True)

    # the loss is a random projection: through two normalizations the gradient of sum(y^2) is ~0
    r = torch.randn(x.shape, device=dev)

    def step():
        y = normkit.instance_norm(normkit.group_norm(x, 8, w, b), weight=w, bias=b)
        (y.float() * r).sum().backward()

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm up (Triton compiles) outside the capture
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    x.grad = w.grad = b.grad = None
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    gx, gw = x.grad.clone(), w.grad.clone()
    # the replay computes what an uncaptured call computes, to the bit (the kernels are deterministic)
    x.grad = w.grad = b.grad = None
    step()
    torch.cuda.synchronize()
    assert torch.equal(gx, x.grad) and torch.equal(gw, w.grad)
    # and the bf16 chain is close to float64 (ATen's CUDA group norm rejects a bf16 input with fp32
    # parameters): relative error in norm, as two chained bf16 roundings leave a few elements far off
    xd = x.detach().double().requires_grad_()
    wd, bd = w.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    yd = torch.nn.functional.instance_norm(torch.nn.functional.group_norm(xd, 8, wd, bd), weight=wd, bias=bd)
    (yd * r.double()).sum().backward()
    for got, want in ((gx, xd.grad), (gw, wd.grad)):
        assert ((got.double() - want).norm() / want.norm()).item() < 1e-2


@pytest.mark.cuda
def test_cuda_graph_capture():
    torch.manual_seed(0)
    dev = "cuda"
    x = torch.randn(8, 16, 12, 12, device=dev, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    w = torch.randn(16, device=dev, requires_grad=True)
    b = torch.randn(16, device=dev, requires_grad=True)
    lw = torch.randn(12, device=dev, dtype=torch.bfloat16, requires_grad=True)
    rm, rv = torch.zeros(16, device=dev), torch.ones(16, device=dev)

    def step():
        y = normkit.batch_norm(x, rm, rv, w, b, training=True)
        y = normkit.rms_norm(normkit.layer_norm(y, (12,), lw, None), (12,), lw)
        y.float().square().sum().backward()

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm up (Triton compiles, autotuning) outside the capture
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    x.grad = w.grad = b.grad = lw.grad = None
    rm0, rv0 = rm.clone(), rv.clone()
    with torch.cuda.graph(graph):
        step()
    rm.copy_(rm0)
    rv.copy_(rv0)
    graph.replay()
    torch.cuda.synchronize()
    rm_e, rv_e = rm0.clone(), rv0.clone()
    xe = x.detach().clone().requires_grad_()
    ye = torch.nn.functional.batch_norm(xe, rm_e, rv_e, w, b, training=True)
    torch.testing.assert_close(rm, rm_e, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(rv, rv_e, rtol=1e-3, atol=1e-3)
    assert x.grad is not None and torch.isfinite(x.grad.float()).all()


def _penalty_cases():
    x3, x6 = torch.randn(4, 3, 5, dtype=F64), torch.randn(4, 5, 6, dtype=F64)
    rm, rv = torch.randn(3, dtype=F64), torch.rand(3, dtype=F64) + 0.5
    F = torch.nn.functional
    bn = (lambda f, train: lambda x, w, b: f(x, rm if not train else None, rv if not train else None, w, b, train))
    return [
        ("bn train", bn(normkit.batch_norm, True), bn(F.batch_norm, True), x3, 3),
        ("bn eval", bn(normkit.batch_norm, False), bn(F.batch_norm, False), x3, 3),
        ("ln", lambda x, w, b: normkit.layer_norm(x, (6,), w, b), lambda x, w, b: F.layer_norm(x, (6,), w, b), x6, 6),
        ("gn", lambda x, w, b: normkit.group_norm(x, 1, w, b), lambda x, w, b: F.group_norm(x, 1, w, b), x3, 3),
    ]


@pytest.mark.parametrize("case", range(4))
@pytest.mark.parametrize("wrt", ["x", "w", "b", "xw"])
def test_double_backward_graph_like_torch(case, wrt):
    """A gradient penalty (create_graph=True, then backward through the gradients): the gradients require grad
    where ATen's backward op makes them (any of its inputs requiring grad, e.g. weight's gradient of a training
    batch norm, whose value does not depend on weight), and the penalty's gradients equal torch's in float64
    (None where torch's are None). normkit's double-backward graph used to leave such gradients detached, so
    the penalty's backward raised."""
    name, nk, ref, x0, c = _penalty_cases()[case]
    torch.manual_seed(case)
    w0, b0 = torch.randn(c, dtype=F64), torch.randn(c, dtype=F64)
    results = []
    for fn in (ref, nk):
        x, w, b = (t.clone().requires_grad_(k in wrt) for t, k in ((x0, "x"), (w0, "w"), (b0, "b")))
        y = fn(x, w, b)
        wanted = [t for t in (x, w, b) if t.requires_grad]
        grads = torch.autograd.grad((y * torch.linspace(-1, 2, y.numel(), dtype=F64).view_as(y)).sum(), wanted,
                                    create_graph=True)
        flags = [g.requires_grad for g in grads]
        if any(flags):
            sum((g ** 2).sum() for g in grads if g.requires_grad).backward()
        results.append((flags, [None if t.grad is None else t.grad.clone() for t in wanted]))
    (flags_t, pen_t), (flags_n, pen_n) = results
    assert flags_n == flags_t, name
    for a, e in zip(pen_n, pen_t):
        assert (a is None) == (e is None), name
        if e is not None:
            torch.testing.assert_close(a, e, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("fmt, shape", [(torch.channels_last, (2, 3, 4, 4)), (torch.channels_last_3d, (2, 3, 2, 3, 4))])
@pytest.mark.parametrize("x_in_fmt", [True, False])
def test_batch_norm_double_backward_keeps_input_layout(fmt, shape, x_in_fmt):
    """A training batch norm's second-order gradient w.r.t. x is laid out as x, as torch's is, whatever the layout of
    the gradients flowing in (gO and the penalty's weighting, here in the other layout): autograd through the
    reference's ops made it follow theirs, so a channels_last x got a contiguous gradient and a contiguous x a
    channels_last one. Values against torch in float64."""
    x0, g0, m = (torch.randn(shape, dtype=F64) + 0.5 for _ in range(3))
    if x_in_fmt:
        x0 = x0.contiguous(memory_format=fmt)
    else:
        g0, m = g0.contiguous(memory_format=fmt), m.contiguous(memory_format=fmt)
    w0 = torch.randn(3, dtype=F64)
    results = []
    for bn in (torch.nn.functional.batch_norm, normkit.batch_norm):
        x, w, g = x0.clone().requires_grad_(), w0.clone().requires_grad_(), g0.clone().requires_grad_()
        (gx,) = torch.autograd.grad(bn(x, None, None, w, None, True), x, g, create_graph=True)
        results.append(torch.autograd.grad((gx * m).sum(), (x, w, g)))
    assert results[1][0].stride() == results[0][0].stride() == x0.stride()
    for a, e in zip(results[1], results[0]):
        torch.testing.assert_close(a, e, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("x_in_fmt, m_in_fmt", [(True, True), (True, False), (False, True)])
def test_eval_batch_norm_double_backward_layout_like_torch(x_in_fmt, m_in_fmt):
    """In eval, torch's second-order gradient w.r.t. x is contiguous whatever the layouts of x and the gradients
    flowing in (its formula's); normkit's had x's (channels_last). Values and every stride against torch."""
    fmt, shape = torch.channels_last, (2, 3, 4, 4)
    x0, g0, m = (torch.randn(shape, dtype=F64) + 0.5 for _ in range(3))
    if x_in_fmt:
        x0 = x0.contiguous(memory_format=fmt)
    else:
        g0 = g0.contiguous(memory_format=fmt)
    if m_in_fmt:
        m = m.contiguous(memory_format=fmt)
    w0, rm, rv = torch.randn(3, dtype=F64), torch.randn(3, dtype=F64), torch.rand(3, dtype=F64) + 0.5
    results = []
    for bn in (torch.nn.functional.batch_norm, normkit.batch_norm):
        x, w, g = x0.clone().requires_grad_(), w0.clone().requires_grad_(), g0.clone().requires_grad_()
        gx, gw = torch.autograd.grad(bn(x, rm.clone(), rv.clone(), w, None, False), (x, w), g, create_graph=True)
        results.append(torch.autograd.grad((gx * m).sum() + gw.square().sum(), (x, w, g)))
    for a, e in zip(results[1], results[0]):
        assert a.stride() == e.stride()
        torch.testing.assert_close(a, e, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("fn", [normkit.add_layer_norm, normkit.add_rms_norm])
def test_add_norm_sum_requires_grad_like_torch(fn):
    """s = x + residual requires grad only where x or residual does, as torch's sum (not when only weight does)."""
    x, r, w = torch.randn(3, 8, dtype=F64), torch.randn(3, 8, dtype=F64), torch.randn(8, dtype=F64)
    y, s = fn(x, r, (8,), w.requires_grad_())
    assert y.requires_grad and not s.requires_grad
    y, s = fn(x.requires_grad_(), r, (8,), w)
    assert s.requires_grad
