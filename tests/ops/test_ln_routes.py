"""Layer norm's and RMS norm's fast routes under enable() (normkit.ops.layer_norm.ROUTES, wired in normkit.aten
with batch norm's, under one switch).

On the CPU the bookkeeping runs with stand-ins (as tests/ops/test_bn_routes.py): a Python signature, a kernels
module that only names plan keys, a plan store that records replays and answers with fresh tensors. On the H200 the
CUDA test compares training steps with and without routes bit for bit.
"""

import pytest
import torch

from normkit import aten
from normkit.ops import batch_norm as obn
from normkit.ops import layer_norm as oln
from route_fakes import CudaLike, fake_signature as _sig, grad_steps, install


class _Fakes:
    """The kernels module's plan keys, and the plan store: ``recorded`` answers from ``planned``, ``replay_only``
    records its call and returns the outputs a plan of that key would (fresh tensors of the plan's shapes)."""

    def __init__(self):
        self.planned, self.replays = set(), []

    @staticmethod
    def forward_key(eps, rms):
        return ("fwd", eps, rms)

    @staticmethod
    def backward_key(x_dtype, weight, mask, bias_dtype, rms):
        return ("bwd", tuple(mask), weight is not None, bias_dtype, rms)

    def recorded(self, key, sig):
        return (key, sig) in self.planned

    def replay_only(self, key, inputs, sig, scalars=()):
        self.replays.append((key, inputs, sig))
        if (key, sig) not in self.planned:
            return None
        m, n = inputs[1].shape if key[0] == "bwd" else inputs[0].shape
        if key[0] == "fwd":
            return torch.randn(m, n), None, torch.randn(m), torch.randn(m)
        mask, rms = key[1], key[-1]
        return (torch.randn(m, n) if mask[0] else None, torch.randn(n) if mask[1] else None,
                torch.randn(n) if not rms and mask[2] else None)


@pytest.fixture
def fakes(monkeypatch):
    f = _Fakes()
    install(monkeypatch, oln, f)
    monkeypatch.setattr(oln._plan, "recorded", f.recorded)
    monkeypatch.setattr(oln._plan, "replay_only", f.replay_only)
    return f


def _cuda(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype).as_subclass(CudaLike)


def test_layer_norm_forward_route_after_a_planned_call(fakes):
    route, note = oln.ROUTES["native_layer_norm"]
    x, w, b = _cuda(2, 3, 8), _cuda(8), _cuda(8)
    launched = _sig((x.view(6, 8), w, b))
    assert route(x, [8], w, b, 1e-5) is None
    note(x, [8], w, b, 1e-5)
    assert oln._routes == {}, "no plan for its rows: not noted"
    fakes.planned.add((("fwd", 1e-5, False), launched))
    note(x, [8], w, b, 1e-5)
    y, mean, rstd = route(x, [8], w, b, 1e-5)
    assert y.shape == (2, 3, 8) and mean.shape == rstd.shape == (2, 3, 1)
    key, inputs, sig = fakes.replays[-1]
    assert key == ("fwd", 1e-5, False) and sig == launched and inputs[0].shape == (6, 8)
    assert inputs[0].data_ptr() == x.data_ptr() and inputs[1] is w and inputs[2] is b
    # another eps, normalized_shape, weight dtype, bias None, a subclass: the normal path
    assert route(x, [8], w, b, 1e-3) is None
    assert route(x, [3, 8], None, None, 1e-5) is None
    assert route(x, [8], w.double(), b, 1e-5) is None
    assert route(x, [8], w, None, 1e-5) is None
    sub = type("Sub", (torch.Tensor,), {})
    assert route(x.as_subclass(sub), [8], w, b, 1e-5) is None
    assert oln.ROUTES["_fused_rms_norm"][0](x, [8], w, 1e-5) is None  # one op's route is not another's


def test_forward_route_for_rows_that_are_not_a_view(fakes):
    """A transposed input (a batch_first attention's (B, S, H) output is (S, B, H) in memory): the ops give the
    kernels x.reshape(M, N), a dense copy, so the plan is keyed by a dense (M, N); the route replays on a copy too."""
    route, note = oln.ROUTES["native_layer_norm"]
    x = _cuda(3, 2, 8).transpose(0, 1)  # (2, 3, 8), rows not a view of it
    w = _cuda(8)
    fakes.planned.add((("fwd", 1e-5, False), _sig((x.reshape(6, 8), w, None))))
    note(x, [8], w, None, 1e-5)
    assert len(oln._routes) == 1
    y, mean, rstd = route(x, [8], w, None, 1e-5)
    assert y.shape == (2, 3, 8) and y.is_contiguous() and mean.shape == (2, 3, 1)
    rows = fakes.replays[-1][1][0]
    assert rows.is_contiguous() and rows.data_ptr() != x.data_ptr() and torch.equal(rows, x.reshape(6, 8))
    assert route(x.contiguous(), [8], w, None, 1e-5) is None  # other strides: another signature


def test_no_forward_route_for_multi_dim_params(fakes):
    route, note = oln.ROUTES["native_layer_norm"]
    x3, w2 = _cuda(2, 3, 8), _cuda(3, 8)  # 2-D weight: the launcher flattens it (another tensor)
    fakes.planned.add((("fwd", 1e-5, False), _sig((x3.view(2, 24), w2.view(24), None))))
    note(x3, [3, 8], w2, None, 1e-5)
    assert oln._routes == {}


def test_rms_forward_route_resolves_eps_none(fakes):
    route, note = oln.ROUTES["_fused_rms_norm"]
    x, w = _cuda(4, 16, dtype=torch.bfloat16), _cuda(16, dtype=torch.bfloat16)
    eps = torch.finfo(torch.float32).eps
    fakes.planned.add((("fwd", eps, True), _sig((x, w))))
    note(x, [16], w, None)
    y, rstd = route(x, [16], w, None)
    assert y.shape == (4, 16) and rstd.shape == (4, 1)
    assert fakes.replays[-1][0] == ("fwd", eps, True)
    assert route(x, [16], w, eps) is None  # eps None and eps given are separate entries (the raw argument)


def test_layer_norm_backward_route(fakes):
    route, note = oln.ROUTES["native_layer_norm_backward"]
    x, w, b = _cuda(2, 3, 8, dtype=torch.bfloat16), _cuda(8), _cuda(8)
    g = torch.randn_like(x)
    mean, rstd = _cuda(2, 3, 1), _cuda(2, 3, 1)
    launched = _sig((g.view(6, 8), x.view(6, 8), mean.view(6), rstd.view(6), w))
    key = ("bwd", (True, True, False), True, torch.float32, False)
    fakes.planned.add((key, launched))
    note(g, x, [8], mean, rstd, w, b, [True, True, False])
    dx, dw, db = route(g, x, [8], mean, rstd, w, b, [1, 1, 0])
    assert dx.shape == (2, 3, 8) and dw.shape == (8,) and db is None
    assert fakes.replays[-1][0] == key and fakes.replays[-1][2] == launched
    assert route(g, x, [8], mean, rstd, w, b, [True, True, True]) is None  # another mask
    assert route(g.double(), x, [8], mean, rstd, w, b, [True, True, False]) is None


def test_backward_route_for_a_transposed_gradient_not_for_16_bit_statistics(fakes):
    route, note = oln.ROUTES["native_layer_norm_backward"]
    x, w = _cuda(2, 3, 8, dtype=torch.bfloat16), _cuda(8, dtype=torch.bfloat16)
    mean, rstd = _cuda(2, 3, 1), _cuda(2, 3, 1)
    g_t = _cuda(3, 2, 8, dtype=torch.bfloat16).transpose(0, 1)  # rows not a view: the ops reshape it into a copy
    key = ("bwd", (True, True, False), True, None, False)
    fakes.planned.add((key, _sig((g_t.reshape(6, 8), x.view(6, 8), mean.view(6), rstd.view(6), w))))
    mean16 = mean.to(torch.bfloat16)  # 16-bit statistics: converted to fp32 by the launcher
    note(torch.randn_like(x), x, [8], mean16, rstd.to(torch.bfloat16), w, None, [True, True, False])
    assert oln._routes == {}
    note(g_t, x, [8], mean, rstd, w, None, [True, True, False])
    assert len(oln._routes) == 1
    dx, dw, db = route(g_t, x, [8], mean, rstd, w, None, [True, True, False])
    assert dx.shape == (2, 3, 8) and dw.shape == (8,)
    rows = fakes.replays[-1][1][0]
    assert rows.is_contiguous() and torch.equal(rows, g_t.reshape(6, 8))


def test_no_backward_route_for_a_gradient_of_an_absent_parameter(fakes, monkeypatch):
    """A raw call asking dw (db) of an absent weight (bias) takes the reference; the kernels' key of the same call
    without that gradient is the same (their real ``backward_key``), so it must not be noted."""
    import normkit.kernels.layer_norm as L

    monkeypatch.setattr(fakes, "backward_key", L.backward_key)
    x, g = _cuda(6, 8), _cuda(6, 8)
    mean, rstd = _cuda(6, 1), _cuda(6, 1)
    route, note = oln.ROUTES["native_layer_norm_backward"]
    key = L.backward_key(x.dtype, None, (True, False, False), None, False)
    assert key == L.backward_key(x.dtype, None, (True, True, False), None, False)
    for asked in ([True, True, False], [True, False, True]):  # dw of no weight, db of no bias
        fakes.planned.add((L.backward_key(x.dtype, None, tuple(asked), None, False),
                           _sig((g, x, mean.view(6), rstd.view(6), None))))
        note(g, x, [8], mean, rstd, None, None, asked)
        assert oln._routes == {} and route(g, x, [8], mean, rstd, None, None, asked) is None
    route, note = oln.ROUTES["_fused_rms_norm_backward"]
    fakes.planned.add((L.backward_key(x.dtype, None, (True, False), None, True), _sig((g, x, rstd.view(6), None))))
    note(g, x, [8], rstd, None, [True, True])
    assert oln._routes == {}


def test_rms_backward_route(fakes):
    route, note = oln.ROUTES["_fused_rms_norm_backward"]
    x, w = _cuda(4, 16), _cuda(16)
    g, rstd = torch.randn_like(x), _cuda(4, 1)
    key = ("bwd", (True, False), True, None, True)
    fakes.planned.add((key, _sig((g, x, rstd.view(4), w))))
    note(g, x, [16], rstd, w, [True, False])
    dx, dw = route(g, x, [16], rstd, w, [True, False])
    assert dx.shape == (4, 16) and dw is None
    assert route(g, x, [16], rstd, w, [True, True]) is None


def test_routes_capped(fakes, monkeypatch):
    monkeypatch.setattr(oln, "MAX_ROUTES", 2)
    route, note = oln.ROUTES["native_layer_norm"]
    for n in (4, 5, 6):
        x = _cuda(3, n)
        fakes.planned.add((("fwd", 1e-5, False), _sig((x, None, None))))
        note(x, [n], None, None, 1e-5)
    assert len(oln._routes) == 2


def test_wired_by_aten_with_batch_norms_under_one_switch(monkeypatch):
    monkeypatch.setattr(obn, "_routes_on", True)
    routes = aten._ops_routes()
    assert set(oln.ROUTES) <= set(routes) and set(obn.ROUTES) <= set(routes)
    assert set(routes) <= {n for n, *_ in aten._table()}
    monkeypatch.setattr(obn, "_routes_on", False)
    assert aten._ops_routes() == {}


class _SequenceFirst(torch.nn.Module):
    """The same (B, S, H) values laid out (S, B, H) in memory, as a batch_first attention's output is."""

    def forward(self, x):
        return x.transpose(0, 1).contiguous().transpose(0, 1)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_routes_same_bits(dtype, monkeypatch):
    """Training steps of a Linear + LayerNorm + RMSNorm block under enable(), the first layer norm's input laid out
    sequence-first: with routes (noted on the first step, taken after) the same outputs and gradients as without,
    and every layer-norm call after the first step routed."""
    if not torch.cuda.is_available():
        pytest.skip("CUDA")
    from normkit.kernels import _native

    _native.start()
    assert _native.wait(300), _native.status()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 96), _SequenceFirst(), torch.nn.LayerNorm(96), torch.nn.GELU(),
                              torch.nn.Linear(96, 96), torch.nn.RMSNorm(96), torch.nn.LayerNorm(96, bias=False))
    net = net.cuda().to(dtype)
    x = torch.randn(4, 33, 64, device="cuda", dtype=dtype)
    grads = [torch.randn(4, 33, 96, device="cuda", dtype=dtype) for _ in range(3)]

    def steps(routes):
        oln._routes.clear()
        monkeypatch.setattr(obn, "_routes_on", routes)
        return grad_steps(net, x, grads)

    plain, _, routed0 = steps(False)
    routed, calls, taken = steps(True)
    assert routed0 == {}
    for a, b in zip(plain, routed):
        assert torch.equal(a, b)
    for op in ("native_layer_norm", "native_layer_norm_backward"):  # 2 calls a step, routed from the second
        assert calls.get(op) == 6 and taken.get(op) == 4, (op, calls, taken)
    for op in ("_fused_rms_norm", "_fused_rms_norm_backward"):  # where F.rms_norm reaches it on this torch
        if calls.get(op):
            assert taken.get(op) == calls[op] - calls[op] // 3, (op, calls, taken)
