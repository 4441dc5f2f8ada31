"""Batch norm's fast routes under enable() (normkit.ops.batch_norm.ROUTES, wired in normkit.aten).

On the CPU the bookkeeping runs with stand-ins: a Python signature in place of the native one, a kernels
module whose replays return markers, tensors that say they are on CUDA. On the H200 the CUDA tests compare
whole training steps with and without routes bit for bit and check that a call the routes may not take still
gets torch's error.
"""

from types import SimpleNamespace as NS

import pytest
import torch

import normkit
from normkit import aten
from normkit.ops import batch_norm as obn
from route_fakes import CudaLike, fake_signature as _sig, install


class _Kernels:
    """What the routes call in kernels.batch_norm: the replays (recorded, answered with markers) and whether a
    plan exists for a signature (``planned``)."""

    def __init__(self):
        self.planned, self.calls = set(), []

    def bn_forward_train_replay(self, x, w, b, rm, rv, momentum, eps, sig):
        self.calls.append(("fwd", sig, momentum, eps))
        return ("y", "mean", "invstd") if ("fwd", sig, eps) in self.planned else None

    def bn_train_planned(self, eps, sig):
        return ("fwd", sig, eps) in self.planned

    def bn_backward_train_replay(self, g, x, w, sm, si, mask, sig):
        self.calls.append(("bwd", sig, mask))
        return ("dx", "dw", "db") if ("bwd", sig, mask) in self.planned else None

    def bn_backward_train_planned(self, mask, sig):
        return ("bwd", sig, mask) in self.planned

    def bn_forward_eval_replay(self, x, w, b, rm, rv, eps, sig):
        self.calls.append(("eval", sig, eps))
        return "y" if ("eval", sig, eps) in self.planned else None

    def bn_eval_planned(self, eps, sig):
        return ("eval", sig, eps) in self.planned


@pytest.fixture
def fakes(monkeypatch):
    k = _Kernels()
    install(monkeypatch, obn, k)
    return k


def _bn_args(dtype=torch.float32, c=4):
    x = torch.randn(3, c, 5).as_subclass(CudaLike)
    w, b, rm, rv = (torch.randn(c).as_subclass(CudaLike) for _ in range(4))
    return x, w, b, rm, rv


def test_forward_route_only_after_a_planned_call_is_noted(fakes):
    route, note = obn.ROUTES["native_batch_norm"]
    x, w, b, rm, rv = _bn_args()
    assert route(x, w, b, rm, rv, True, 0.1, 1e-5) is None  # nothing noted
    note(x, w, b, rm, rv, True, 0.1, 1e-5)
    assert obn._routes == set(), "no plan for it: not noted"
    fakes.planned.add(("fwd", _sig((x, w, b, rm, rv)), 1e-5))
    note(x, w, b, rm, rv, False, 0.1, 1e-5)
    assert obn._routes == set(), "eval calls have no route"
    note(x, w, b, rm, rv, True, 0.1, 1e-5)
    assert route(x, w, b, rm, rv, True, 0.3, 1e-5) == ("y", "mean", "invstd")
    assert fakes.calls[-1] == ("fwd", _sig((x, w, b, rm, rv)), 0.3, 1e-5)  # this call's momentum
    # another eps, eval, another weight dtype or shape, a plain subclass: the normal path
    assert route(x, w, b, rm, rv, True, 0.1, 1e-3) is None
    assert route(x, w, b, rm, rv, False, 0.1, 1e-5) is None
    assert route(x, w.double(), b, rm, rv, True, 0.1, 1e-5) is None
    assert route(x, w[:3], b, rm, rv, True, 0.1, 1e-5) is None
    assert route(x, w, None, rm, rv, True, 0.1, 1e-5) is None
    sub = type("Sub", (torch.Tensor,), {})
    assert route(x.as_subclass(sub), w, b, rm, rv, True, 0.1, 1e-5) is None
    # the route of one op is not another's
    assert obn.ROUTES["_native_batch_norm_legit"][0](x, w, b, rm, rv, True, 0.1, 1e-5) is None


def test_forward_routes_add_the_ops_reserve(fakes):
    x, w, b, rm, rv = _bn_args()
    fakes.planned.add(("fwd", _sig((x, w, b, rm, rv)), 1e-5))
    for name in ("_batch_norm_with_update", "cudnn_batch_norm"):
        route, note = obn.ROUTES[name]
        args = (x, w, b, rm, rv, 0.1, 1e-5) if name == "_batch_norm_with_update" else (x, w, b, rm, rv, True, 0.1, 1e-5)
        note(*args)
        out = route(*args)
        assert out[:3] == ("y", "mean", "invstd") and out[3].dtype == torch.uint8 and out[3].numel() == 0
    route, note = obn.ROUTES["_native_batch_norm_legit.no_stats"]
    fakes.planned.add(("fwd", _sig((x, w, b, None, None)), 1e-5))
    note(x, w, b, True, 0.1, 1e-5)
    assert route(x, w, b, True, 0.1, 1e-5) == ("y", "mean", "invstd")


def test_eval_routes_off_by_default(fakes):
    assert obn.EVAL_ROUTES is False  # on once the CUDA same-bits test has run (next_h200.sh PART=129)
    x, w, b, rm, rv = _bn_args()
    fakes.planned.add(("eval", _sig((x, w, b, rm, rv)), 1e-5))
    route, note = obn.ROUTES["_native_batch_norm_legit_no_training"]
    note(x, w, b, rm, rv, 0.1, 1e-5)
    assert obn._routes == set() and route(x, w, b, rm, rv, 0.1, 1e-5) is None


def test_eval_routes(fakes, monkeypatch):
    monkeypatch.setattr(obn, "EVAL_ROUTES", True)
    x, w, b, rm, rv = _bn_args()
    sig = _sig((x, w, b, rm, rv))
    calls = {  # op: its arguments in eval, the number of outputs (a uint8 reserve after the saved statistics)
        "native_batch_norm": ((x, w, b, rm, rv, False, 0.1, 1e-5), 3),
        "_native_batch_norm_legit": ((x, w, b, rm, rv, False, 0.1, 1e-5), 3),
        "_native_batch_norm_legit_no_training": ((x, w, b, rm, rv, 0.1, 1e-5), 3),
        "_batch_norm_no_update": ((x, w, b, rm, rv, 0.1, 1e-5), 4),
        "cudnn_batch_norm": ((x, w, b, rm, rv, False, 0.1, 1e-5), 4),
    }
    for name, (args, n_out) in calls.items():
        route, note = obn.ROUTES[name]
        assert route(*args) is None
        note(*args)
        assert (name, "eval", sig, 1e-5) not in obn._routes, "no plan for it: not noted"
    fakes.planned.add(("eval", sig, 1e-5))
    for name, (args, n_out) in calls.items():
        route, note = obn.ROUTES[name]
        note(*args)
        out = route(*args)
        assert len(out) == n_out and out[0] == "y" and fakes.calls[-1] == ("eval", sig, 1e-5)
        for t in out[1:3]:  # eval's saved statistics: empty, in the accumulation dtype
            assert t.shape == (0,) and t.dtype == torch.float32
        if n_out == 4:
            assert out[3].dtype == torch.uint8 and out[3].numel() == 0
    route, note = obn.ROUTES["native_batch_norm"]
    assert route(x, w, b, rm, rv, True, 0.1, 1e-5) is None, "an eval route does not answer a training call"
    assert route(x, w, b, rm, rv, False, 0.1, 1e-3) is None  # another eps
    assert route(x, w.double(), b, rm, rv, False, 0.1, 1e-5) is None
    fakes.planned.add(("eval", _sig((x, w, b, None, None)), 1e-5))
    n = len(obn._routes)
    note(x, w, b, None, None, False, 0.1, 1e-5)  # eval without running statistics raises: never noted
    assert len(obn._routes) == n


def test_backward_routes(fakes):
    x, w, b, rm, rv = _bn_args()
    g, sm, si = torch.randn_like(x), torch.randn(4).as_subclass(CudaLike), torch.randn(4).as_subclass(CudaLike)
    launched = _sig((g, x, w, sm, si))
    route, note = obn.ROUTES["native_batch_norm_backward"]
    fakes.planned.add(("bwd", launched, (True, True, False)))
    note(g, x, w, rm, rv, sm, si, True, 1e-5, [True, True, False])
    assert route(g, x, w, rm, rv, sm, si, True, 1e-5, [1, 1, 0]) == ("dx", "dw", "db")
    assert route(g, x, w, rm, rv, sm, si, True, 1e-5, [True, True, True]) is None  # another mask
    assert route(g, x, w, rm, rv, sm, si, False, 1e-5, [True, True, False]) is None  # eval
    assert route(g, x, w, None, None, sm, si, True, 1e-5, [True, True, False]) is None  # the stats are keyed
    # cuDNN's backward: training when the saved mean is not empty; all three gradients
    route, note = obn.ROUTES["cudnn_batch_norm_backward"]
    fakes.planned.add(("bwd", launched, (True, True, True)))
    note(x, g, w, rm, rv, sm, si, 1e-5, None)
    assert route(x, g, w, rm, rv, sm, si, 1e-5, None) == ("dx", "dw", "db")
    empty = torch.empty(0).as_subclass(CudaLike)
    assert route(x, g, w, rm, rv, empty, empty, 1e-5, None) is None


def test_no_backward_route_where_the_gradients_change_dtype(fakes):
    """weight None: the kernels give grad_weight / grad_bias in the accumulation type; _backward_core casts them to
    the dtype of the first statistic passed. A route (the kernels' outputs as they are) only where no cast follows."""
    x = torch.randn(3, 4, 5, dtype=torch.bfloat16).as_subclass(CudaLike)
    g = torch.randn_like(x)
    sm, si = torch.randn(4).as_subclass(CudaLike), torch.randn(4).as_subclass(CudaLike)
    rm, rv = (torch.randn(4, dtype=torch.bfloat16).as_subclass(CudaLike) for _ in range(2))
    route, note = obn.ROUTES["native_batch_norm_backward"]
    mask = [True, True, True]
    fakes.planned.add(("bwd", _sig((g, x, None, sm, si)), (True, True, True)))
    note(g, x, None, rm, rv, sm, si, True, 1e-5, mask)  # bf16 running stats: fp32 sums cast to bf16
    assert obn._routes == set()
    x64 = x.double()
    g64 = torch.randn_like(x64)
    fakes.planned.add(("bwd", _sig((g64, x64, None, sm, si)), (True, True, True)))
    note(g64, x64, None, None, None, sm, si, True, 1e-5, mask)  # fp32 saved stats: fp64 sums cast to fp32
    assert obn._routes == set()
    # no running stats: the fp32 saved stats make them fp32 (a mixed call), as the kernels give them
    note(g, x, None, None, None, sm, si, True, 1e-5, mask)
    assert route(g, x, None, None, None, sm, si, True, 1e-5, mask) == ("dx", "dw", "db")


def test_routes_capped(fakes, monkeypatch):
    monkeypatch.setattr(obn, "MAX_ROUTES", 2)
    route, note = obn.ROUTES["native_batch_norm"]
    for c in (2, 3, 4):
        x, w, b, rm, rv = _bn_args(c=c)
        fakes.planned.add(("fwd", _sig((x, w, b, rm, rv)), 1e-5))
        note(x, w, b, rm, rv, True, 0.1, 1e-5)
    assert len(obn._routes) == 2


def test_routes_are_wired_only_when_on(monkeypatch):
    monkeypatch.setattr(obn, "_routes_on", False)
    assert aten._ops_routes() == {}
    obn.set_fast_routes(True)  # (monkeypatch restores the flag)
    routes = aten._ops_routes()
    assert all(routes[name] is obn.ROUTES[name] for name in obn.ROUTES)
    assert set(routes) <= {n for n, *_ in aten._table()}


def test_aten_kernel_takes_a_route_before_its_predicate(monkeypatch):
    calls = []
    monkeypatch.setattr(aten, "_ops_routes", lambda: {"op": (lambda *a: ("routed",) if a[0] == 1 else None,
                                                             lambda *a: calls.append(("note", a)))})
    monkeypatch.setattr(aten, "_key", "CUDA")
    monkeypatch.setattr(aten, "_active", True)
    aten.reset_counts()
    impl = lambda *a: calls.append(("impl", a)) or ("impl",)  # noqa: E731
    takes = lambda *a: calls.append(("takes", a)) or True  # noqa: E731
    kernel = aten._make_kernel("op", impl, takes, NS(call_boxed=lambda *a: ("original",)))
    assert kernel(None, 1, 2) == ("routed",) and calls == []
    assert kernel(None, 0, 2) == ("impl",) and calls == [("takes", (0, 2)), ("impl", (0, 2)), ("note", (0, 2))]
    assert aten.call_counts() == {"op": 2} and aten.routed_counts() == {"op": 1}
    aten.reset_counts()
    assert aten.routed_counts() == {}


def _cuda_net(layout, dtype, seed):
    """(conv + batch-norm net, its input, the memory format) on CUDA, once the native replay (the routes' key) is
    loaded; skips without CUDA."""
    if not torch.cuda.is_available():
        pytest.skip("CUDA")
    from normkit.kernels import _native

    _native.start()
    assert _native.wait(300), _native.status()
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
                              torch.nn.Conv2d(16, 8, 3), torch.nn.BatchNorm2d(8))
    net = net.cuda().to(dtype=dtype, memory_format=fmt)
    x = torch.randn(4, 3, 12, 12, device="cuda", dtype=dtype).to(memory_format=fmt)
    return net, x, fmt


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_routes_same_bits_and_torchs_errors(layout, dtype, monkeypatch):
    """Training steps of a conv + batch-norm net under enable(): with routes (noted on the first steps, taken
    after) the same outputs, gradients and running statistics as without; calls the routes must not take
    (another weight shape) still raise torch's error."""
    net, x, fmt = _cuda_net(layout, dtype, seed=0)
    # y's gradient in y's layout on three steps, contiguous on the last two: a channels_last batch norm's backward
    # then gets a gradient in another layout, which its launcher moves into x's layout (the tile transpose, part of
    # the plan: noted and routed from the next such call; with torch's copy instead, not noted)
    grads = [torch.randn(4, 8, 8, 8, device="cuda", dtype=dtype).to(memory_format=fmt) for _ in range(3)]
    grads += [torch.randn(4, 8, 8, 8, device="cuda", dtype=dtype) for _ in range(2)]

    attempts = []  # every note: which op, x's strides, grad_out's (backward), whether it was noted

    def recording(note, fwd):
        def wrapped(op, *args):
            before = len(obn._routes)
            note(op, *args)
            x = args[0] if fwd else args[1]
            attempts.append((op, tuple(x.shape), x.stride(), None if fwd else args[0].stride(),
                             len(obn._routes) > before))
        return wrapped

    monkeypatch.setattr(obn, "_note_forward", recording(obn._note_forward, True))
    monkeypatch.setattr(obn, "_note_backward", recording(obn._note_backward, False))

    def steps(routes):
        obn._routes.clear()
        monkeypatch.setattr(obn, "_routes_on", routes)
        m = __import__("copy").deepcopy(net)
        out = []
        aten.reset_counts()
        with normkit.enabled():
            for g in grads:
                m.zero_grad()
                y = m(x)
                y.backward(g)
                out += [y] + [p.grad.clone() for p in m.parameters()] + [t.clone() for t in m.buffers()]
        routed = aten.routed_counts()
        fwd = sum(n for op, n in routed.items() if "backward" not in op)
        bwd = sum(n for op, n in routed.items() if "backward" in op)
        return out, len(obn._routes), (fwd, bwd)

    plain, n0, taken0 = steps(False)
    attempts.clear()
    routed, n1, taken1 = steps(True)
    # channels_last: the last batch norm's backward on steps 4-5 gets the contiguous gradient, a new signature,
    # where it reaches native_batch_norm_backward as it is (autograd's formula for cudnn_batch_norm_backward makes
    # it dense in x's layout first; the first batch norm's comes from the conv's backward, in x's layout)
    other = any("backward" in op and gs != xs for op, _, xs, gs, _ in attempts)
    other_noted = any(noted for op, _, xs, gs, noted in attempts if "backward" in op and gs != xs)
    assert other <= (layout == "channels_last"), attempts
    assert n0 == 0 and n1 == 4 + other_noted, f"both batch norms' forward and backward routes noted; {attempts}"
    # routed from the second call of a signature: forward steps 2-5; backward the same less the new signature's
    # first call (step 4), and its second (step 5) where it was not noted
    assert taken0 == (0, 0) and taken1 == (8, 8 - other * (1 + (not other_noted))), (taken1, attempts)
    for a, b in zip(plain, routed):
        assert torch.equal(a, b)
    monkeypatch.setattr(obn, "_routes_on", True)
    with normkit.enabled():
        bn = torch.nn.BatchNorm2d(16).cuda().to(dtype)
        h = torch.randn(4, 16, 5, 5, device="cuda", dtype=dtype)
        bn(h)
        bn(h)  # noted, then routed
        bad = torch.randn(15, device="cuda", dtype=dtype)
        with pytest.raises(RuntimeError, match="weight should contain 16 elements not 15|size"):
            torch.ops.aten.native_batch_norm(h, bad, bn.bias, bn.running_mean, bn.running_var, True, 0.1, 1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_cuda_routes_inside_a_captured_graph(layout):
    """Under enable() (routes on, noted in the warm-up), a training step captured in a CUDA graph takes the routes
    and its replay gives the bits of the same step run uncaptured: outputs, gradients, running statistics."""
    import copy

    net, x, fmt = _cuda_net(layout, torch.bfloat16, seed=1)
    g = torch.randn(4, 8, 8, 8, device="cuda", dtype=torch.bfloat16).to(memory_format=fmt)
    params = list(net.parameters())

    def step(m, ps):
        y = m(x)
        return [y, *torch.autograd.grad(y, ps, g)]

    was = obn.fast_routes_enabled()
    obn.set_fast_routes(True)  # enable() reads it
    try:
        with normkit.enabled():
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):  # compile, note the routes, take them
                    step(net, params)
            torch.cuda.current_stream().wait_stream(side)
            twin = copy.deepcopy(net)  # the state the captured step starts from
            graph = torch.cuda.CUDAGraph()
            aten.reset_counts()
            with torch.cuda.graph(graph):
                captured = step(net, params)
            routed = sum(aten.routed_counts().values())
            graph.replay()
            uncaptured = step(twin, list(twin.parameters()))
            torch.cuda.synchronize()
    finally:
        obn.set_fast_routes(was)
    assert routed == 4, aten.routed_counts()  # both batch norms, forward and backward
    for a, b in zip(captured + list(net.buffers()), uncaptured + list(twin.buffers())):
        assert torch.equal(a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_eval_routes_same_bits(layout, dtype, monkeypatch):
    """Eval forwards of a conv + batch-norm net under enable() (inference; ``EVAL_ROUTES`` on): with routes (noted
    on the first call, taken after) the same outputs as without, and every batch-norm call after the first routed."""
    net, x, fmt = _cuda_net(layout, dtype, seed=1)
    net.eval()
    inputs = [torch.randn_like(x) for _ in range(3)]

    def calls(routes):
        obn._routes.clear()
        monkeypatch.setattr(obn, "_routes_on", routes)
        monkeypatch.setattr(obn, "EVAL_ROUTES", routes)
        aten.reset_counts()
        with normkit.enabled(), torch.no_grad():
            out = [net(t) for t in inputs]
        return out, aten.call_counts(), aten.routed_counts()

    plain, _, routed0 = calls(False)
    routed, counts, taken = calls(True)
    assert routed0 == {}
    for a, b in zip(plain, routed):
        assert torch.equal(a, b) and a.is_contiguous(memory_format=fmt) == b.is_contiguous(memory_format=fmt)
    assert sum(counts.values()) == 6 and sum(taken.values()) == 4, (counts, taken)  # 2 layers, from the 2nd call
