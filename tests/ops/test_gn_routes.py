"""Group norm's fast routes under enable() (normkit.ops.group_norm.ROUTES, wired in normkit.aten with batch norm's,
under one switch, while ``ROUTES_ON``).

On the CPU the bookkeeping runs with stand-ins (as test_bn_routes.py): a Python signature, a kernels module whose
replays return markers, tensors that say they are on CUDA. On a GPU the CUDA test compares training steps with and
without routes bit for bit.
"""

import pytest
import torch

from normkit import aten
from normkit.ops import batch_norm as obn
from normkit.ops import group_norm as ogn
from route_fakes import CudaLike, fake_signature as _sig, grad_steps, install


class _Kernels:
    """The replays (recorded, answered with markers where ``planned`` holds their key) and the plan lookups."""

    def __init__(self):
        self.planned, self.calls = set(), []

    def gn_forward_replay(self, x, w, b, G, eps, sdt, sig):
        self.calls.append(("fwd", sig, G, eps, sdt))
        return ("y", "mean", "rstd") if ("fwd", sig, G, eps, sdt) in self.planned else None

    def gn_forward_planned(self, G, eps, sdt, sig):
        return ("fwd", sig, G, eps, sdt) in self.planned

    def gn_backward_replay(self, g, x, m, r, w, G, mask, pdt, sig):
        self.calls.append(("bwd", sig, G, mask, pdt))
        return ("dx", "dw", "db") if ("bwd", sig, G, mask, pdt) in self.planned else None

    def gn_backward_planned(self, G, mask, pdt, sig):
        return ("bwd", sig, G, mask, pdt) in self.planned


@pytest.fixture
def fakes(monkeypatch):
    k = _Kernels()
    install(monkeypatch, ogn, k)
    monkeypatch.setattr(ogn, "ROUTES_ON", True)
    return k


def _cuda(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype).as_subclass(CudaLike)


def test_off_by_default():
    assert ogn.ROUTES_ON is False  # on once the CUDA same-bits test has run (next_h200.sh PART=129)


def test_forward_route_after_a_planned_call(fakes):
    route, note = ogn.ROUTES["native_group_norm"]
    x, w, b = _cuda(2, 6, 5), _cuda(6), _cuda(6)
    args = (x, w, b, 2, 6, 5, 3, 1e-5)
    assert route(*args) is None
    note(*args)
    assert ogn._routes == set(), "no plan for it: not noted"
    fakes.planned.add(("fwd", _sig((x, w, b)), 3, 1e-5, torch.float32))
    note(*args)
    assert route(*args) == ("y", "mean", "rstd")
    # another group count, eps, parameter dtype (fp32 statistics for a mixed call: another plan key), a subclass
    assert route(x, w, b, 2, 6, 5, 2, 1e-5) is None
    assert route(x, w, b, 2, 6, 5, 3, 1e-3) is None
    assert route(x, w.double(), b, 2, 6, 5, 3, 1e-5) is None  # another signature
    sub = type("Sub", (torch.Tensor,), {})
    assert route(x.as_subclass(sub), w, b, 2, 6, 5, 3, 1e-5) is None


def test_forward_statistics_dtype_follows_the_parameters(fakes):
    route, note = ogn.ROUTES["native_group_norm"]
    x, w, b = _cuda(2, 4, 3, dtype=torch.bfloat16), _cuda(4), _cuda(4)  # fp32 parameters: fp32 statistics
    fakes.planned.add(("fwd", _sig((x, w, b)), 2, 1e-5, torch.float32))
    note(x, w, b, 2, 4, 3, 2, 1e-5)
    assert route(x, w, b, 2, 4, 3, 2, 1e-5) == ("y", "mean", "rstd")
    assert fakes.calls[-1][-1] == torch.float32


def test_no_route_for_another_factorisation_of_the_same_tensors(fakes):
    """A raw call whose N, C are not x's dims 0 and 1 passes the checks (only element counts) and takes the
    reference; the kernels' plan of x's signature (another geometry) must not answer it."""
    route, note = ogn.ROUTES["native_group_norm"]
    x = _cuda(2, 6, 5)
    fakes.planned.add(("fwd", _sig((x, None, None)), 3, 1e-5, torch.float32))
    note(x, None, None, 1, 12, 5, 3, 1e-5)
    assert ogn._routes == set() and route(x, None, None, 1, 12, 5, 3, 1e-5) is None
    route_b, note_b = ogn.ROUTES["native_group_norm_backward"]
    g, m, r = torch.randn_like(x), _cuda(2, 3), _cuda(2, 3)
    fakes.planned.add(("bwd", _sig((g, x, m, r, None)), 3, (True, True, True), torch.float32))
    note_b(g, x, m, r, None, 2, 3, 10, 3, [True, True, True])
    assert ogn._routes == set()
    note(x, None, None, 2, 6, 5, 3, 1e-5)  # x's own dims: noted
    assert len(ogn._routes) == 1 and route(x, None, None, 1, 12, 5, 3, 1e-5) is None


def test_backward_route(fakes):
    route, note = ogn.ROUTES["native_group_norm_backward"]
    x, w = _cuda(2, 6, 5), _cuda(6)
    g, m, r = torch.randn_like(x), _cuda(2, 3), _cuda(2, 3)
    fakes.planned.add(("bwd", _sig((g, x, m, r, w)), 3, (True, True, False), torch.float32))
    args = (g, x, m, r, w, 2, 6, 5, 3, [True, True, False])
    assert route(*args) is None
    note(*args)
    assert route(*args) == ("dx", "dw", "db")
    assert route(g, x, m, r, w, 2, 6, 5, 3, [True, True, True]) is None  # another mask
    assert route(g.double(), x, m, r, w, 2, 6, 5, 3, [True, True, False]) is None


def test_routes_capped(fakes, monkeypatch):
    monkeypatch.setattr(ogn, "MAX_ROUTES", 2)
    route, note = ogn.ROUTES["native_group_norm"]
    for c in (2, 4, 6):
        x = _cuda(2, c, 3)
        fakes.planned.add(("fwd", _sig((x, None, None)), 2, 1e-5, torch.float32))
        note(x, None, None, 2, c, 3, 2, 1e-5)
    assert len(ogn._routes) == 2


def test_wired_by_aten_with_batch_norms(monkeypatch):
    monkeypatch.setattr(obn, "_routes_on", True)
    assert set(ogn.ROUTES) <= set(aten._ops_routes()) <= {n for n, *_ in aten._table()}


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_routes_same_bits(layout, dtype, monkeypatch):
    """Training steps of a conv + group-norm net under enable() (``ROUTES_ON``): with routes (noted on the first step,
    taken after) the same outputs and gradients as without, and every group-norm call after the first step routed."""
    if not torch.cuda.is_available():
        pytest.skip("CUDA")
    from normkit.kernels import _native

    _native.start()
    assert _native.wait(300), _native.status()
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    torch.manual_seed(2)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3), torch.nn.GroupNorm(8, 32), torch.nn.SiLU(),
                              torch.nn.Conv2d(32, 16, 3), torch.nn.GroupNorm(4, 16))
    net = net.cuda().to(dtype=dtype, memory_format=fmt)
    x = torch.randn(4, 3, 16, 16, device="cuda", dtype=dtype).to(memory_format=fmt)
    grads = [torch.randn(4, 16, 12, 12, device="cuda", dtype=dtype).to(memory_format=fmt) for _ in range(3)]

    def steps(routes):
        ogn._routes.clear()
        monkeypatch.setattr(obn, "_routes_on", True)
        monkeypatch.setattr(ogn, "ROUTES_ON", routes)
        return grad_steps(net, x, grads)

    plain, _, routed0 = steps(False)
    routed, calls, taken = steps(True)
    assert not any(op.startswith("native_group_norm") for op in routed0)
    for a, b in zip(plain, routed):
        assert torch.equal(a, b)
    for op in ("native_group_norm", "native_group_norm_backward"):  # 2 calls a step, routed from the second step
        assert calls.get(op) == 6 and taken.get(op) == 4, (op, calls, taken)
