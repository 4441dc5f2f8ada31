"""normkit.kernels._launch: the direct launch path (cached compiled kernel, Triton's binder skipped).

Without a GPU the hit path is exercised with a fake kernel and a fake CUDA tensor: what matters is which
launches go through Triton's own path (misses: a new specialization) and what the compiled kernel's
launcher receives on a hit (every parameter, constexprs and defaults included, in parameter order). On
the H200 the same path runs every normkit kernel (pytest -m cuda, conformance); the CUDA test below
checks it gives the same bits as Triton's path.
"""

import pytest
import torch

from normkit.kernels import _launch


class _CudaLike(torch.Tensor):
    """A CPU tensor that says it is on CUDA (only `is_cuda` is read before the launch)."""

    @property
    def is_cuda(self):
        return True


def _t(n=8, dtype=torch.float32, offset=0):
    base = torch.randn(n + offset, dtype=dtype)
    return base[offset:].as_subclass(_CudaLike)


class _Compiled:
    def __init__(self, log, fail=False):
        self.log, self.fail = log, fail
        self.function, self.packed_metadata = "fn", "meta"

    def launch_metadata(self, grid, stream, *args):
        return None

    def run(self, g0, g1, g2, stream, function, packed, meta, enter, exit_, *args):
        if self.fail:
            raise TypeError("launcher takes other arguments")
        self.log.append(("direct", (g0, g1, g2), args))


class _FakeKernel:
    """Stands in for a JITFunction: `kernel[grid](...)` is Triton's path and returns the compiled kernel."""

    def __init__(self, fail=False):
        self.log = []
        self.compiled = _Compiled(self.log, fail)
        self.triton_calls = 0

        def fn(x, y, n, eps, BLOCK: "tl.constexpr", FLAG: "tl.constexpr" = True):  # the launcher's order
            pass

        self.fn = fn

    def __getitem__(self, grid):
        def go(*args, **kwargs):
            self.triton_calls += 1
            self.log.append(("triton", tuple(grid), args, kwargs))
            return self.compiled

        return go


@pytest.fixture
def direct(monkeypatch):
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 1234, raising=False)
    _launch.set_direct(True)
    yield
    _launch.set_direct(True)


def test_hit_passes_every_parameter_in_order(direct):
    k = _FakeKernel()
    x, y = _t(), _t()
    _launch.launch(k, (3,), x, y, 100, 0.5, BLOCK=64, num_warps=4)
    assert k.triton_calls == 1
    x2, y2 = _t(), _t()
    _launch.launch(k, (5, 2), x2, y2, 132, 0.25, BLOCK=64, num_warps=4)
    assert k.triton_calls == 1, "same specialization: no second trip through Triton's binder"
    kind, grid, args = k.log[-1]
    assert kind == "direct" and grid == (5, 2, 1)
    assert args[0] is x2 and args[1] is y2 and args[2:] == (132, 0.25, 64, True)  # BLOCK, FLAG default


@pytest.mark.parametrize("change", ["misaligned", "dtype", "int_one", "int_div16", "int64", "uint64", "bool",
                                    "constexpr", "option"])
def test_new_specialization_goes_through_triton(direct, change):
    k = _FakeKernel()
    base = dict(x=_t(), y=_t(), n=100, BLOCK=64, num_warps=4)
    _launch.launch(k, (1,), base["x"], base["y"], base["n"], 0.5, BLOCK=64, num_warps=4)
    x, y, n, block, warps = _t(), _t(), 100, 64, 4
    if change == "misaligned":
        y = _t(offset=1)  # 4 bytes past a 16-byte boundary
        assert y.data_ptr() % 16 != 0
    elif change == "dtype":
        x = _t(dtype=torch.bfloat16)
    elif change == "int_one":
        n = 1
    elif change == "int_div16":
        n = 96
    elif change == "int64":
        n = 2**31 + 5
    elif change == "uint64":
        n = 2**63 + 5
    elif change == "bool":  # keyed by value, never as the int class of 1
        n = True
    elif change == "constexpr":
        block = 128
    else:
        warps = 8
    _launch.launch(k, (1,), x, y, n, 0.5, BLOCK=block, num_warps=warps)
    assert k.triton_calls == 2


def test_constexpr_passed_by_position_is_keyed_by_value(direct):
    """A constexpr given positionally (like batch norm's compiled-in plane length S) must not share a
    binary with another value of the same int class: that reused a 5-element-plane kernel for 10."""
    k = _FakeKernel()
    _launch.launch(k, (1,), _t(), _t(), 100, 0.5, 64)
    _launch.launch(k, (1,), _t(), _t(), 100, 0.5, 48)  # 64 and 48: both divisible by 16
    assert k.triton_calls == 2
    _launch.launch(k, (1,), _t(), _t(), 100, 0.5, 48)
    assert k.triton_calls == 2 and k.log[-1][0] == "direct" and k.log[-1][2][4:] == (48, True)


def test_ints_in_the_same_class_share_a_binary(direct):
    k = _FakeKernel()
    for n in (100, 3, 2**31 - 1):  # none is 1, none divisible by 16, all i32
        _launch.launch(k, (1,), _t(), _t(), n, 0.5, BLOCK=64)
    assert k.triton_calls == 1


class CudaLauncher:
    """Named as Triton 3.6's launcher class: the raw path calls its C ``launch`` directly."""

    def __init__(self, log, scratch=0):
        self.log = log
        self.global_scratch_size, self.profile_scratch_size = scratch, 0
        self.launch_cooperative_grid, self.launch_pdl = False, True

    def launch(self, *args):
        self.log.append(("raw", args))

    def __call__(self, g0, g1, g2, stream, function, packed, meta, enter, exit_, *args):
        self.log.append(("wrapper", (g0, g1, g2), args))


class HookChain:
    """Triton 3.6's launch hooks: a chain, never None; empty means no hook."""

    def __init__(self, calls=()):
        self.calls = list(calls)


@pytest.mark.parametrize("scratch,hook", [(0, None), (0, HookChain()), (64, None), (0, HookChain([print]))])
def test_raw_launcher_takes_pointers_and_every_parameter(direct, monkeypatch, scratch, hook):
    """On Triton 3.6 a hit calls the C launcher with Triton's leading arguments (grid, stream, function,
    cooperative, pdl, no scratch, packed metadata, no launch metadata, no hooks), then each tensor's data
    pointer and every other parameter in order; a kernel that needs scratch memory, or a launch hook
    installed, keeps the wrapper."""
    from types import SimpleNamespace as NS

    monkeypatch.setattr(_launch, "_RAW_TRITON", True)
    monkeypatch.setattr(_launch, "_runtime_knobs", NS(launch_enter_hook=hook, launch_exit_hook=HookChain()))
    k = _FakeKernel()
    k.compiled.run = CudaLauncher(k.log, scratch)
    _launch.launch(k, (3,), _t(), _t(), 100, 0.5, BLOCK=64)
    x, y = _t(), _t()
    _launch.launch(k, (5, 2), x, y, 132, 0.25, BLOCK=64)
    if scratch or (hook is not None and hook.calls):
        assert k.log[-1][0] == "wrapper" and k.log[-1][2][0] is x
        return
    kind, args = k.log[-1]
    assert kind == "raw"
    assert args[:13] == (5, 2, 1, 1234, "fn", False, True, None, None, "meta", None, None, None)
    assert args[13:] == (x.data_ptr(), y.data_ptr(), 132, 0.25, 64, True)


def test_launcher_mismatch_falls_back_for_good(direct):
    k = _FakeKernel(fail=True)
    _launch.launch(k, (1,), _t(), _t(), 100, 0.5, BLOCK=64)
    _launch.launch(k, (1,), _t(), _t(), 100, 0.5, BLOCK=64)  # hit -> TypeError -> Triton's path
    assert k.triton_calls == 2 and not _launch.direct_enabled()
    _launch.launch(k, (1,), _t(), _t(), 100, 0.5, BLOCK=64)
    assert k.triton_calls == 3


def test_off_means_tritons_path(direct):
    _launch.set_direct(False)
    k = _FakeKernel()
    for _ in range(3):
        _launch.launch(k, (1,), _t(), _t(), 100, 0.5, BLOCK=64)
    assert k.triton_calls == 3


def test_cpu_tensors_use_tritons_path():
    k = _FakeKernel()
    for _ in range(2):
        _launch.launch(k, (1,), torch.randn(4), torch.randn(4), 100, 0.5, BLOCK=64)
    assert k.triton_calls == 2


@pytest.mark.cuda
@pytest.mark.parametrize("planes", [(7, 5), (5, 7), (14, 10)])
def test_cuda_direct_launch_compiled_in_plane_lengths(planes):
    """Short unaligned planes compile S in (a positional constexpr): each length needs its own binary."""
    from normkit.kernels import batch_norm as B

    for h in planes:
        x = torch.randn(6, 3, h, h, device="cuda", dtype=torch.float32) + 3
        y, m, s = B.bn_forward_train(x, None, None, None, None, 0.1, 1e-5)
        xd = x.double()
        ref = (xd - xd.mean((0, 2, 3), keepdim=True)) / torch.sqrt(xd.var((0, 2, 3), unbiased=False,
                                                                           keepdim=True) + 1e-5)
        assert torch.allclose(y.double(), ref, atol=1e-4), h


@pytest.mark.cuda
def test_cuda_direct_launch_same_bits_as_triton_path():
    from normkit.kernels import batch_norm as B
    from normkit.kernels import layer_norm as L

    x = torch.randn(32, 96, 14, 14, device="cuda", dtype=torch.bfloat16) + 2
    w, b = torch.rand(96, device="cuda") + 0.5, torch.randn(96, device="cuda")
    h = torch.randn(300, 3000, device="cuda", dtype=torch.bfloat16)
    lw = torch.rand(3000, device="cuda", dtype=torch.bfloat16) + 0.5
    dy = torch.randn_like(h)

    def run():
        y, m, s = B.bn_forward_train(x, w, b, None, None, 0.1, 1e-5)
        gi, gw, gb = B.bn_backward(y, x, w, m, s, True, [True, True, True])  # y as the upstream grad
        ly, lm, lr = L.ln_forward(h, lw, None, 1e-5)
        lg = L.ln_backward(dy, h, lm, lr, lw, [True, True, False])
        return [y, m, s, gi, gw, gb, ly, lm, lr, *[t for t in lg if t is not None]]

    _launch.set_direct(False)
    ref = run()
    _launch.set_direct(True)
    first, second = run(), run()  # misses, then hits
    for a, c, d in zip(ref, first, second):
        assert torch.equal(a, c) and torch.equal(a, d)


def test_pdl_only_on_nvidia_sm90_cuda_tensors(monkeypatch):
    """Programmatic dependent launch is asked for only where it exists: the knob on, a CUDA tensor, an
    NVIDIA device of compute capability 9 or more (not ROCm), a Triton with grid dependency control."""
    from types import SimpleNamespace as NS

    assert not _launch.pdl_on(torch.ones(2), True)  # CPU tensors (the interpreter) never
    cuda = NS(is_cuda=True, device=torch.device("cuda", 0))
    assert not _launch.pdl_on(cuda, False)  # knob off
    monkeypatch.setattr(_launch, "_sm90", {0: True})  # as on an H200
    if _launch.gdc_wait is not None and torch.version.hip is None:
        assert _launch.pdl_on(cuda, True)
    monkeypatch.setattr(_launch, "_sm90", {0: False})  # an A100
    assert not _launch.pdl_on(cuda, True)
    monkeypatch.setattr(_launch, "_sm90", {0: True})
    monkeypatch.setattr(_launch, "gdc_wait", None)  # an old Triton
    assert not _launch.pdl_on(cuda, True)


@pytest.mark.cuda
def test_cuda_shared_memory_per_block_is_the_devices():
    """fit_stages sizes pipeline stages to this number: the opt-in shared memory a block may take."""
    from normkit.kernels import _launch

    x = torch.empty(1, device="cuda")
    smem = _launch.shared_memory_per_block(x)
    props = torch.cuda.get_device_properties(x.device)
    if hasattr(props, "shared_memory_per_block_optin"):
        assert smem == props.shared_memory_per_block_optin
    assert 48 * 1024 <= smem <= 256 * 1024
    assert _launch.fit_stages(x, 3, smem) == 1 and _launch.fit_stages(x, 3, 1024) == 3
