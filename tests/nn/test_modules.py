"""normkit.nn: drop-in modules (state_dict interchangeable with torch.nn), momentum None, rank errors,
convert(), torch.compile."""

import pytest
import torch

import normkit
from normkit import nn as nknn

PAIRS = [
    (nknn.BatchNorm1d, torch.nn.BatchNorm1d, (4,), (5, 4, 3)),
    (nknn.BatchNorm2d, torch.nn.BatchNorm2d, (4,), (3, 4, 5, 2)),
    (nknn.BatchNorm3d, torch.nn.BatchNorm3d, (4,), (2, 4, 3, 2, 2)),
    (nknn.LayerNorm, torch.nn.LayerNorm, ((3, 5),), (2, 4, 3, 5)),
    (nknn.RMSNorm, torch.nn.RMSNorm, ([5],), (2, 3, 5)),
    (nknn.GroupNorm, torch.nn.GroupNorm, (2, 4), (3, 4, 5)),
    (nknn.InstanceNorm1d, torch.nn.InstanceNorm1d, (4,), (3, 4, 6)),
    (nknn.InstanceNorm2d, torch.nn.InstanceNorm2d, (4,), (3, 4, 3, 5)),
    (nknn.InstanceNorm3d, torch.nn.InstanceNorm3d, (4,), (2, 4, 3, 2, 2)),
]


def _randomize(module):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p))
        for name, b in module.named_buffers():
            if b is not None and b.is_floating_point():
                b.copy_(torch.rand_like(b) + 0.5)


@pytest.mark.parametrize("ours, theirs, args, shape", PAIRS)
@pytest.mark.parametrize("training", [True, False])
def test_module_matches_torch_and_state_dict_round_trip(ours, theirs, args, shape, training):
    kwargs = {}
    if "InstanceNorm" in ours.__name__:
        kwargs = dict(affine=True, track_running_stats=True)
    a = ours(*args, dtype=torch.float64, **kwargs)
    _randomize(a)
    b = theirs(*args, dtype=torch.float64, **kwargs)
    b.load_state_dict(a.state_dict())  # normkit -> torch
    a2 = ours(*args, dtype=torch.float64, **kwargs)
    a2.load_state_dict(b.state_dict())  # torch -> normkit
    assert a.state_dict().keys() == b.state_dict().keys()
    a.train(training)
    b.train(training)
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    xa = x.detach().clone().requires_grad_()
    ya, yb = a(xa), b(x)
    torch.testing.assert_close(ya, yb)
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    torch.testing.assert_close(xa.grad, x.grad)
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, msg=na)
    for (na, ba), (nb, bb) in zip(a.named_buffers(), b.named_buffers()):
        torch.testing.assert_close(ba, bb, msg=na)
    assert isinstance(a, theirs)


def test_momentum_none_is_cumulative_average():
    m = nknn.BatchNorm2d(3, momentum=None, dtype=torch.float64)
    ref = torch.nn.BatchNorm2d(3, momentum=None, dtype=torch.float64)
    means, vars_ = [], []
    for _ in range(4):
        x = torch.randn(4, 3, 5, 5, dtype=torch.float64) * 3 + 1
        m(x)
        ref(x)
        means.append(x.mean(dim=(0, 2, 3)))
        vars_.append(x.var(dim=(0, 2, 3), unbiased=True))
    assert int(m.num_batches_tracked) == 4
    torch.testing.assert_close(m.running_mean, torch.stack(means).mean(0))
    torch.testing.assert_close(m.running_var, torch.stack(vars_).mean(0))
    torch.testing.assert_close(m.running_var, ref.running_var)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("momentum, compiled", [(0.1, False), (None, False), (0.1, True)])
def test_batch_norm_training_under_inference_mode(dtype, momentum, compiled):
    """A training-mode BatchNorm2d called under torch.inference_mode (e.g. recalibrating statistics) updates its
    running stats as torch's does: built there its buffers are inference tensors, and compiled (aot_eager) the op
    gets functionalized copies made there; both raised "Inference tensors do not track version counter".
    (momentum=None does not compile fullgraph, torch's module neither: 1 / num_batches_tracked is data-dependent.)"""
    torch.manual_seed(0)
    with torch.inference_mode(not compiled):
        ours = nknn.BatchNorm2d(3, momentum=momentum, dtype=dtype)
        theirs = torch.nn.BatchNorm2d(3, momentum=momentum, dtype=dtype)
        _randomize(ours)
        theirs.load_state_dict(ours.state_dict())
    run = torch.compile(ours, backend="aot_eager", fullgraph=True) if compiled else ours
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else {}
    for _ in range(2):
        x = torch.randn(4, 3, 5, 5, dtype=dtype) * 2 + 0.5
        with torch.inference_mode():
            torch.testing.assert_close(run(x), theirs(x), **tol)
    for (k, u), (_, v) in zip(ours.state_dict().items(), theirs.state_dict().items()):
        torch.testing.assert_close(u, v, msg=k, **tol)
    assert int(ours.num_batches_tracked) == 2


def test_not_tracking_stats_and_no_affine():
    m = nknn.BatchNorm1d(4, affine=False, track_running_stats=False).eval()
    ref = torch.nn.BatchNorm1d(4, affine=False, track_running_stats=False).eval()
    x = torch.randn(6, 4)
    torch.testing.assert_close(m(x), ref(x))
    assert m.running_mean is None


@pytest.mark.parametrize("cls, shape, msg", [
    (nknn.BatchNorm1d, (2, 3, 4, 5), "expected 2D or 3D input (got 4D input)"),
    (nknn.BatchNorm2d, (2, 3, 4), "expected 4D input (got 3D input)"),
    (nknn.BatchNorm3d, (2, 3, 4, 5), "expected 5D input (got 4D input)"),
])
def test_rank_errors_exact(cls, shape, msg):
    m = cls(3)
    with pytest.raises(ValueError) as info:
        m(torch.randn(shape))
    assert str(info.value) == msg


def test_error_leaves_every_buffer_untouched():
    m = nknn.BatchNorm1d(3)
    _randomize(m)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
        m(torch.randn(1, 3))
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.gn = torch.nn.GroupNorm(2, 4)
        self.body = torch.nn.Sequential(torch.nn.LayerNorm(6), torch.nn.RMSNorm(6))
        self.inorm = torch.nn.InstanceNorm2d(4)

    def forward(self, x):
        return self.body(self.inorm(self.gn(self.bn(self.conv(x)))))


def test_convert_swaps_and_shares_parameters():
    torch.manual_seed(0)
    net = _Net()
    ref = _Net()
    ref.load_state_dict(net.state_dict())
    bn_weight = net.bn.weight
    rm = net.bn.running_mean
    out = nknn.convert(net)
    assert out is net
    assert type(net.bn) is nknn.BatchNorm2d and type(net.gn) is nknn.GroupNorm
    assert type(net.body[0]) is nknn.LayerNorm and type(net.body[1]) is nknn.RMSNorm
    assert type(net.inorm) is nknn.InstanceNorm2d
    assert net.bn.weight is bn_weight and net.bn.running_mean is rm
    x = torch.randn(2, 3, 5, 6)
    torch.testing.assert_close(net(x), ref(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rm, ref.bn.running_mean)  # updated in place, shared
    assert net.state_dict().keys() == ref.state_dict().keys()
    single = torch.nn.LayerNorm(4)
    assert type(nknn.convert(single)) is nknn.LayerNorm


def test_modules_compile_fullgraph():
    torch.manual_seed(0)
    m = torch.nn.Sequential(nknn.BatchNorm2d(3), nknn.GroupNorm(1, 3), nknn.LayerNorm(6), nknn.RMSNorm(6))
    ref = torch.nn.Sequential(torch.nn.BatchNorm2d(3), torch.nn.GroupNorm(1, 3), torch.nn.LayerNorm(6),
                              torch.nn.RMSNorm(6))
    ref.load_state_dict(m.state_dict())
    compiled = torch.compile(m, backend="aot_eager", fullgraph=True)
    x = torch.randn(4, 3, 5, 6)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), ref(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m[0].running_var, ref[0].running_var)
    assert int(m[0].num_batches_tracked) == 2


def test_modules_compile_fullgraph_under_autocast(monkeypatch):
    """fullgraph compile of the modules under autocast with CUDA's policy (emulated on the CPU): layer / group /
    RMS norm in fp32 as torch's autocast runs them, batch norm in the input dtype."""
    from normkit import functional as NF

    monkeypatch.setattr(NF, "_AUTOCAST_OPS", NF._autocast_registrations({"cpu": "AutocastCUDA"}))
    torch.manual_seed(0)
    m = torch.nn.Sequential(nknn.BatchNorm2d(3), nknn.GroupNorm(1, 3), nknn.LayerNorm(6), nknn.RMSNorm(6))
    compiled = torch.compile(m, backend="aot_eager", fullgraph=True)
    x = torch.randn(4, 3, 5, 6).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = compiled(x)
        want = m(x)
    assert y.dtype == want.dtype == torch.float32
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("training", [True, False])
def test_empty_batch_with_other_channel_count_like_torch(training):
    # torch.batch_norm checks no sizes for an empty batch: the module returns an empty output (and counts it)
    ours, theirs = nknn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
    _randomize(ours)
    theirs.load_state_dict(ours.state_dict())
    ours.train(training)
    theirs.train(training)
    x = torch.randn(0, 4, 5, 5)
    y, yt = ours(x), theirs(x)
    assert y.shape == yt.shape
    for (k, a), (_, b) in zip(ours.state_dict().items(), theirs.state_dict().items()):
        assert torch.equal(a, b), k


def test_convert_shared_module_becomes_one_normkit_module():
    # a module under two names (weight tying, a block applied twice): named_children() lists it once
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(3, momentum=None, dtype=torch.float64)
    net = torch.nn.Sequential(bn, torch.nn.Tanh(), bn)
    ref = torch.nn.Sequential(torch.nn.BatchNorm2d(3, momentum=None, dtype=torch.float64), torch.nn.Tanh())
    ref.append(ref[0])
    nknn.convert(net)
    assert type(net[0]) is nknn.BatchNorm2d and net[2] is net[0]
    x = torch.randn(4, 3, 5, 2, dtype=torch.float64) * 2 + 1
    torch.testing.assert_close(net(x), ref(x))
    for (k, a), (_, b) in zip(net.state_dict().items(), ref.state_dict().items()):
        torch.testing.assert_close(a, b, msg=k)
    assert int(net[0].num_batches_tracked) == 2


def test_convert_keeps_hook_handles_working():
    bn = torch.nn.BatchNorm1d(3, dtype=torch.float64)
    calls = []
    handle = bn.register_forward_hook(lambda m, args, out: calls.append(out))
    net = nknn.convert(torch.nn.Sequential(bn))
    x = torch.randn(4, 3, dtype=torch.float64)
    y = net(x)
    assert len(calls) == 1 and calls[0] is y
    handle.remove()  # a handle from before convert() removes the hook from the converted module
    net(x)
    assert len(calls) == 1


@pytest.mark.parametrize("lazy, plain, ours, shape", [
    (torch.nn.LazyBatchNorm2d, torch.nn.BatchNorm2d, nknn.BatchNorm2d, (4, 3, 2, 5)),
    (torch.nn.LazyBatchNorm1d, torch.nn.BatchNorm1d, nknn.BatchNorm1d, (6, 3)),
    (torch.nn.LazyInstanceNorm1d, torch.nn.InstanceNorm1d, nknn.InstanceNorm1d, (2, 3, 7)),
])
def test_convert_lazy_modules_become_normkit_modules(lazy, plain, ours, shape):
    kwargs = dict(affine=True, track_running_stats=True, dtype=torch.float64)
    net = nknn.convert(torch.nn.Sequential(lazy(**kwargs)))
    ref = plain(shape[1], **kwargs)
    x = torch.randn(shape, dtype=torch.float64) * 3 + 1
    y = net(x)  # shape inference: the lazy module becomes normkit's, not torch's
    assert type(net[0]) is ours
    torch.testing.assert_close(y, ref(x))
    torch.testing.assert_close(net(x), ref(x))
    for (k, a), (_, b) in zip(net[0].state_dict().items(), ref.state_dict().items()):
        torch.testing.assert_close(a, b, msg=k)


def _traced_model():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, dtype=torch.float64), torch.nn.BatchNorm2d(4, dtype=torch.float64),
                               torch.nn.ReLU(), torch.nn.GroupNorm(2, 4, dtype=torch.float64),
                               torch.nn.InstanceNorm2d(4, affine=True, track_running_stats=True, dtype=torch.float64),
                               torch.nn.Flatten(), torch.nn.LayerNorm(144, dtype=torch.float64))


@pytest.mark.parametrize("how", ["trace", "script", "export"])
@pytest.mark.parametrize("training", [True, False])
def test_converted_model_traces_scripts_and_exports_like_torch(how, training):
    """torch.jit.trace / torch.jit.script / torch.export of a converted model against the same done to torch's
    own model: outputs, gradients and running statistics equal (float64), buffers never requiring grad. A trace
    used to record the autograd Function's inside without its no-grad context (calling the traced model made the
    running statistics require grad), scripting failed on normkit's Python forward, and an exported program held
    normkit's custom ops, which have no autograd formula (backward through it raised)."""
    import copy
    import warnings

    torch.manual_seed(0)
    ref = _traced_model()
    for m in ref.modules():
        if isinstance(m, (torch.nn.BatchNorm2d, torch.nn.GroupNorm, torch.nn.LayerNorm)):
            _randomize(m)
    nk = nknn.convert(copy.deepcopy(ref))
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    runners = []
    for model in (ref, nk):
        model.train(training)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if how == "trace":
                runner = torch.jit.trace(model, x, check_trace=False)
            elif how == "script":
                runner = torch.jit.script(model)
            else:
                runner = torch.export.export(model, (x,)).module()
        runners.append(runner)
    if how == "export":  # no normkit op left in the exported program
        assert "normkit" not in str(runners[1].graph)
    for _ in range(2):
        (y_ref, y), grads = [r(x) for r in runners], []
        torch.testing.assert_close(y, y_ref)
        for r, out in zip(runners, (y_ref, y)):
            grads.append(torch.autograd.grad(out.square().sum(), list(r.parameters())))
        for a, e in zip(grads[1], grads[0]):
            torch.testing.assert_close(a, e)
    buffers = [dict(r.named_buffers()) for r in runners]
    assert buffers[0].keys() == buffers[1].keys()
    for name, b in buffers[0].items():
        assert not buffers[1][name].requires_grad, name
        torch.testing.assert_close(buffers[1][name], b)


def _fx_model():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, dtype=torch.float64), torch.nn.BatchNorm2d(4, momentum=None, dtype=torch.float64),
        torch.nn.ReLU(), torch.nn.GroupNorm(2, 4, dtype=torch.float64),
        torch.nn.InstanceNorm2d(4, affine=True, track_running_stats=True, dtype=torch.float64),
        torch.nn.SyncBatchNorm(4, dtype=torch.float64), torch.nn.Flatten(), torch.nn.LayerNorm(144, dtype=torch.float64),
        torch.nn.RMSNorm(144, dtype=torch.float64))


def test_converted_model_fx_symbolic_traces_like_torch():
    """torch.fx.symbolic_trace of a converted model records each normkit module as one call_module node, as it does
    torch's (fx keeps torch.nn's modules whole); it used to trace into normkit's forward and fail ("symbolically
    traced variables cannot be used as inputs to control flow", or layer_norm(): argument 'input' must be Tensor, not
    Proxy). The GraphModule then runs normkit's modules: outputs, gradients and running statistics as torch's in
    float64. A tracer that traces through torch's modules (here: the root) traces torch's forward."""
    import copy

    torch.manual_seed(0)
    ref = _fx_model()
    for m in ref.modules():
        if m is not ref and not isinstance(m, (torch.nn.Conv2d, torch.nn.ReLU, torch.nn.Flatten)):
            _randomize(m)
    nk = nknn.convert(copy.deepcopy(ref))
    traced = [torch.fx.symbolic_trace(m) for m in (ref, nk)]
    nodes = [[(n.op, n.target) for n in g.graph.nodes] for g in traced]
    assert nodes[1] == nodes[0]
    assert [type(m) for m in traced[1].children()] == [type(m) for m in nk.children()]
    for training in (True, True, False):
        x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
        ys = []
        for g in traced:
            g.train(training)
            y = g(x)
            ys.append((y, torch.autograd.grad(y.square().sum(), list(g.parameters()))))
        torch.testing.assert_close(ys[1], ys[0])
    for (k, a), (_, b) in zip(traced[1].state_dict().items(), traced[0].state_dict().items()):
        torch.testing.assert_close(a, b, msg=k)
    assert int(nk[1].num_batches_tracked) == 2
    # as the traced root, layer / RMS / group norm record torch's functional call, as torch's modules do
    for ours, theirs in [(nknn.LayerNorm(4), torch.nn.LayerNorm(4)), (nknn.RMSNorm(4), torch.nn.RMSNorm(4)),
                         (nknn.GroupNorm(1, 4), torch.nn.GroupNorm(1, 4))]:
        graphs = [[(n.op, n.target, str(n.args), str(n.kwargs)) for n in torch.fx.symbolic_trace(m).graph.nodes]
                  for m in (ours, theirs)]
        assert graphs[0] == graphs[1]


@pytest.mark.parametrize("ours, theirs, args, shape", PAIRS)
def test_non_tensor_input_gets_torchs_error(ours, theirs, args, shape):
    """A module called with None, a list or a float raises torch's exception, type and text: LayerNorm / RMSNorm
    (None) raised AttributeError ('NoneType' object has no attribute 'is_cuda') where torch raises the argument
    parser's TypeError, and GroupNorm named another attribute than torch's 'dim'."""
    def error(module, value):
        with pytest.raises(Exception) as info:
            module(value)
        return type(info.value), str(info.value)

    for value in (None, torch.randn(shape).tolist(), 3.0):
        assert error(ours(*args), value) == error(theirs(*args), value)


@pytest.mark.parametrize("ours, theirs", [(nknn.InstanceNorm1d, torch.nn.InstanceNorm1d),
                                          (nknn.InstanceNorm2d, torch.nn.InstanceNorm2d)])
def test_instance_norm_eval_backward_survives_a_later_running_stats_update(ours, theirs):
    """Instance norm with running statistics (eval), then a training-mode call of the same module (updating them in
    place), then the backward of the eval output: torch's gradients are those of the eval call (aten normalizes
    with copies of the statistics); normkit saved the buffers themselves and raised "modified by an inplace
    operation"."""
    torch.manual_seed(0)
    kwargs = dict(affine=True, track_running_stats=True, dtype=torch.float64)
    a, b = ours(3, **kwargs), theirs(3, **kwargs)
    _randomize(a)
    b.load_state_dict(a.state_dict())
    shape = (2, 3, 5) if ours is nknn.InstanceNorm1d else (2, 3, 4, 5)
    x = torch.randn(shape, dtype=torch.float64)
    grads = []
    for m in (a, b):
        xx = x.clone().requires_grad_()
        m.eval()
        y = m(xx)
        m.train()
        m(x * 3 + 1)  # moves the running statistics
        grads.append(torch.autograd.grad(y.square().sum(), [xx] + list(m.parameters())))
    torch.testing.assert_close(grads[0], grads[1])
    for (k, u), (_, v) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(u, v, msg=k)


@pytest.mark.parametrize("ours, theirs, args, shape", PAIRS)
@pytest.mark.parametrize("training", [True, False])
def test_output_can_be_modified_in_place(ours, theirs, args, shape, training):
    """In-place ops on a module's output (nn.ReLU(inplace=True), `y += b`) work and differentiate as torch's: in
    float32 the kernels run (Triton's interpreter on the CPU), and LayerNorm / RMSNorm returned a view of the
    kernel's (rows, width) buffer made inside their autograd Function, which autograd forbids modifying in place
    ("Output 0 of _LayerNormFn is a view and is being modified inplace")."""
    torch.manual_seed(0)
    kwargs = dict(affine=True, track_running_stats=True) if "InstanceNorm" in ours.__name__ else {}
    a = ours(*args, **kwargs)
    _randomize(a)
    b = theirs(*args, **kwargs)
    b.load_state_dict(a.state_dict())
    x = torch.randn(shape)
    grads = []
    for m in (a, b):
        m.train(training)
        xx = x.clone().requires_grad_()
        y = m(xx)
        y.mul_(2)
        y.relu_()
        grads.append(torch.autograd.grad(y.square().sum(), [xx] + list(m.parameters())))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("ours, theirs, shape, fmt", [
    (nknn.InstanceNorm2d, torch.nn.InstanceNorm2d, (2, 3, 4, 5), torch.channels_last),
    (nknn.InstanceNorm3d, torch.nn.InstanceNorm3d, (2, 3, 2, 3, 4), torch.channels_last_3d)])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_instance_norm_of_channels_last_input_is_contiguous_like_torch(ours, theirs, shape, fmt, training, dtype):
    """aten's instance norm normalizes input.contiguous() (contract §6): the output of a channels_last input is
    contiguous, and a `.view(N, -1)` of it works. normkit's kept channels_last (group norm's rule), in both the
    batch-statistics and the running-statistics path; the values were right. In float32 and bf16 the kernels run
    (Triton's interpreter on the CPU)."""
    kwargs = dict(affine=True, track_running_stats=True)
    a, b, exact = ours(3, **kwargs), theirs(3, **kwargs), theirs(3, **kwargs)
    _randomize(a)
    b.load_state_dict(a.state_dict())
    exact.load_state_dict(a.state_dict())
    x = (torch.randn(shape, dtype=torch.float64) * 2 + 0.5).to(dtype).contiguous(memory_format=fmt)
    g = torch.randn(shape, dtype=torch.float64) + 0.5  # not y itself: the gradient of y.square().sum() cancels to 0
    results = []
    for m, inp in ((a.to(dtype), x), (b.to(dtype), x), (exact.double(), x.double())):
        m.train(training)
        xx = inp.clone().requires_grad_()
        y = m(xx)
        assert y.is_contiguous()
        y.view(shape[0], -1)
        (gx,) = torch.autograd.grad(y, [xx], g.to(y.dtype))
        results.append((y.double(), gx.double()))
    (y, gx), (y_torch, gx_torch), (y64, gx64) = results
    # judged against float64: normkit's error at most twice torch's in the same dtype (plus a rounding's worth)
    for got, theirs_, want in ((y, y_torch, y64), (gx, gx_torch, gx64)):
        ulp = want.abs().max().item() * (2 ** -7 if dtype == torch.bfloat16 else 1e-5)
        assert (got - want).abs().max().item() <= 2 * (theirs_ - want).abs().max().item() + ulp


@pytest.mark.parametrize("training", [True, False])
def test_instance_norm_backward_survives_an_in_place_weight_update(training):
    """An affine instance norm whose weight changes in place between forward and backward (an optimizer step,
    load_state_dict): aten's backward uses the forward's weight (it saves weight.repeat(N), a copy); normkit saved
    the parameter itself and raised "modified by an inplace operation"."""
    torch.manual_seed(0)
    kwargs = dict(affine=True, track_running_stats=True, dtype=torch.float64)
    a, b = nknn.InstanceNorm2d(3, **kwargs), torch.nn.InstanceNorm2d(3, **kwargs)
    _randomize(a)
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64) * 2 + 0.5
    grads = []
    for m in (a, b):
        m.train(training)
        xx = x.clone().requires_grad_()
        y = m(xx)
        with torch.no_grad():
            m.weight.mul_(2.0)
        grads.append(torch.autograd.grad(y.square().sum(), [xx] + list(m.parameters())))
    torch.testing.assert_close(grads[0], grads[1])


@pytest.mark.parametrize("layout", [torch.jagged, torch.strided])
def test_layer_and_rms_norm_of_nested_tensors_like_torch(layout):
    """torch's LayerNorm takes nested tensors (jagged and strided) and its RMSNorm jagged ones; normkit's raised
    from its shape checks (int() of a nested size). They now run torch's own op on them."""
    torch.manual_seed(0)
    parts = [torch.randn(3, 8, dtype=torch.float64), torch.randn(5, 8, dtype=torch.float64)]
    pairs = [(nknn.LayerNorm(8, dtype=torch.float64), torch.nn.LayerNorm(8, dtype=torch.float64))]
    if layout == torch.jagged:
        pairs.append((nknn.RMSNorm(8, dtype=torch.float64), torch.nn.RMSNorm(8, dtype=torch.float64)))
    for ours, theirs in pairs:
        _randomize(ours)
        theirs.load_state_dict(ours.state_dict())
        nt = torch.nested.nested_tensor(parts, layout=layout)
        for got, want in zip(ours(nt).unbind(), theirs(nt).unbind()):
            torch.testing.assert_close(got, want)


def test_script_says_it_swaps_the_eager_models_modules():
    """torch.jit.script writes what a child's __prepare_scriptable__ returns into its parent: normkit's modules
    become torch's in the eager model too (its results stay right, but it no longer runs normkit). That used to
    happen silently; it is now a UserWarning, and scripting a deepcopy keeps the eager model on normkit."""
    import copy

    model = nknn.convert(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4),
                                             torch.nn.LayerNorm([4, 5, 5])))
    kept = copy.deepcopy(model)
    with pytest.warns(UserWarning, match="copy.deepcopy"):
        torch.jit.script(copy.deepcopy(kept))
    assert type(kept[1]) is nknn.BatchNorm2d and type(kept[2]) is nknn.LayerNorm
    with pytest.warns(UserWarning, match="in the model it was given"):
        torch.jit.script(model)
    assert type(model[1]) is torch.nn.BatchNorm2d  # torch's own preparation did this
