"""normkit.kernels._plan: a launcher call recorded once, replayed with new pointers.

Without a GPU the replay is exercised with fake compiled kernels whose C launcher records its arguments
(as in test_launch.py) and CPU tensors that say they are on CUDA; the CUDA test compares plans with the
launchers on the H200, bit for bit.
"""

from types import SimpleNamespace as NS

import pytest
import torch

from normkit.kernels import _launch, _native, _plan
from plan_fakes import CudaLike, fake_cuda




class CudaLauncher:
    def __init__(self, log):
        self.log = log
        self.global_scratch_size = self.profile_scratch_size = 0
        self.launch_cooperative_grid, self.launch_pdl = False, False

    def launch(self, *args):
        self.log.append(args)


class _Kernel:
    """A JITFunction stand-in: ``kernel[grid](...)`` (Triton's path) returns a compiled kernel whose
    launcher is a CudaLauncher."""

    def __init__(self, log):
        def fn(x, y, out, n, scale, BLOCK: "tl.constexpr"):
            pass

        self.fn = fn
        self.compiled = NS(function="fn", packed_metadata="meta", run=CudaLauncher(log))
        self.triton_calls = 0

    def __getitem__(self, grid):
        def go(*args, **kwargs):
            self.triton_calls += 1
            return self.compiled

        return go


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 1234, raising=False)
    monkeypatch.setattr(_launch, "_RAW_TRITON", True)
    monkeypatch.setattr(_launch, "_runtime_knobs", NS(launch_enter_hook=None, launch_exit_hook=None))
    monkeypatch.setattr(_native, "_on", False)  # the Python replay (test_native_replay.py: the native one)
    _launch.set_direct(True)
    was = _plan.enabled()
    _plan.set_plans(True)
    log = []
    yield NS(log=log, kernel=_Kernel(log))
    _plan.set_plans(was)
    _launch.set_direct(True)


def _launcher(kernel, copy=False):
    """Two launches: out = f(x, y) into a new tensor, then a scratch tensor; returns (out, x)."""
    calls = []

    def run(x, y):
        calls.append(1)
        xx = (x * 1).as_subclass(CudaLike) if copy else x  # a copy the launcher does not note
        out = _launch.alloc(torch.empty(6, 4).as_subclass(CudaLike))
        scratch = _launch.alloc(torch.empty(3, dtype=torch.int32).as_subclass(CudaLike))
        _launch.launch(kernel, (2,), xx, y, out, 24, 0.5, BLOCK=32)
        _launch.launch(kernel, (1, 3), out, out, scratch, 3, 2.0, BLOCK=16)
        return out, x

    return run, calls


def _stored(key):
    """The plans recorded under a caller's key (one per signature of the inputs)."""
    return [plan for (k, _), plan in _plan._plans.items() if k == key]


def test_replay_passes_new_pointers_and_allocates_the_outputs(fake):
    run, calls = _launcher(fake.kernel)
    x, y = fake_cuda(), fake_cuda()
    _plan.planned("k", (x, y), lambda: run(x, y))  # records (its launches: Triton's path, then cached)
    assert len(calls) == 1
    x2, y2 = fake_cuda(), fake_cuda()
    made = []
    real_empty, real_strided = torch.empty, torch.empty_strided
    with pytest.MonkeyPatch.context() as mp:  # outputs one by one, every scratch buffer in one allocation
        mp.setattr(torch, "empty", lambda *a, **k: made.append("scratch") or real_empty(*a, **k))
        mp.setattr(torch, "empty_strided", lambda *a, **k: made.append("output") or real_strided(*a, **k))
        out, xr = _plan.planned("k", (x2, y2), lambda: run(x2, y2))
    assert made == ["scratch", "output"]
    assert len(calls) == 1, "replayed, not run"
    assert xr is x2 and out.shape == (6, 4) and out.dtype == torch.float32
    first, second = fake.log[-2:]
    head = (1234, "fn", False, False, None, None, "meta", None, None, None)
    assert first[:3] == (2, 1, 1) and first[3:13] == head
    assert first[13:] == (x2.data_ptr(), y2.data_ptr(), out.data_ptr(), 24, 0.5, 32)
    assert second[:3] == (1, 3, 1) and second[13:16] == (out.data_ptr(), out.data_ptr(), second[15])
    assert second[16:] == (3, 2.0, 16) and second[15] not in (out.data_ptr(), x2.data_ptr())


def test_no_plan_when_the_launcher_copies(fake):
    run, calls = _launcher(fake.kernel, copy=True)
    for _ in range(3):
        x, y = fake_cuda(), fake_cuda()
        _plan.planned("c", (x, y), lambda: run(x, y))
    assert len(calls) == 3 and _stored("c") == [None]


def test_views_replay_at_their_byte_offsets(fake):
    """A kernel may get a view of an input (a reshape, a slice) or of a scratch allocation (one row of
    it): the replay passes the new base pointer plus the recorded byte offset, and an input whose view's
    alignment would change falls back."""
    calls = []

    def run(x, y):
        calls.append(1)
        out = _launch.alloc(torch.empty(6, 4).as_subclass(CudaLike))
        scratch = _launch.alloc(torch.empty(2, 8, dtype=torch.int32).as_subclass(CudaLike))
        _launch.launch(fake.kernel, (2,), x.reshape(2, 4), y[4:], out, 24, 0.5, BLOCK=32)
        _launch.launch(fake.kernel, (1,), scratch[1], scratch[0], out, 3, 2.0, BLOCK=16)
        return (out,)

    x, y = fake_cuda(), fake_cuda(12)
    _plan.planned("v", (x, y), lambda: run(x, y))
    x2, y2 = fake_cuda(), fake_cuda(12)
    (out,) = _plan.planned("v", (x2, y2), lambda: run(x2, y2))
    assert len(calls) == 1, "replayed"
    first, second = fake.log[-2:]
    assert first[13:16] == (x2.data_ptr(), y2.data_ptr() + 16, out.data_ptr())
    assert second[13] - second[14] == 32, "the scratch rows keep their offsets"
    x3, y3 = fake_cuda(), fake_cuda(12, offset=2)  # y3[4:] now starts 8 bytes off a 16-byte boundary
    _plan.planned("v", (x3, y3), lambda: run(x3, y3))
    assert len(calls) == 2


def test_no_plan_for_aliased_inputs(fake):
    """A view that lies in two inputs at once (they share memory): which one a replay should follow is
    unknown, so there is no plan."""
    calls = []

    def run(x, y):
        calls.append(1)
        out = _launch.alloc(torch.empty(6, 4).as_subclass(CudaLike))
        _launch.launch(fake.kernel, (2,), x[2:6], y, out, 24, 0.5, BLOCK=32)
        return (out,)

    base = fake_cuda(16)
    x, y = base[:8], base[:12]
    _plan.planned("a", (x, y), lambda: run(x, y))
    assert _stored("a") == [None]


@pytest.mark.parametrize("other", ["strides", "shape", "dtype"])
def test_a_plan_is_for_its_inputs_shapes_strides_and_dtypes(fake, other):
    """A launcher decides from its inputs' metadata (a strided weight is copied dense, a contiguous one
    read in place): a call whose input differs in any of it is recorded on its own, never replayed
    from another's plan (session 15: a layer-norm plan of a contiguous weight replayed a strided one)."""
    run, calls = _launcher(fake.kernel)
    x, y = fake_cuda(), fake_cuda()
    _plan.planned("s", (x, y), lambda: run(x, y))
    y2 = {"strides": fake_cuda(16)[::2], "shape": fake_cuda(6), "dtype": fake_cuda(dtype=torch.float64)}[other]
    x2 = fake_cuda()
    _plan.planned("s", (x2, y2), lambda: run(x2, y2))
    assert len(calls) == 2, "recorded anew, not replayed"
    assert len(_stored("s")) == 2
    x3, y3 = fake_cuda(), fake_cuda()
    _plan.planned("s", (x3, y3), lambda: run(x3, y3))
    assert len(calls) == 2 and fake.log[-2][13:15] == (x3.data_ptr(), y3.data_ptr()), "the first plan replays"


def test_one_tensor_in_two_slots_is_never_recorded(fake):
    """weight passed as bias too: the kernels cannot tell the slots apart, so a plan of that call would
    read the weight twice when replayed with two tensors."""
    run, calls = _launcher(fake.kernel)
    x = fake_cuda()
    _plan.planned("w", (x, x), lambda: run(x, x))
    assert _stored("w") == []
    x2, y2 = fake_cuda(), fake_cuda()
    _plan.planned("w", (x2, y2), lambda: run(x2, y2))
    x3, y3 = fake_cuda(), fake_cuda()
    _plan.planned("w", (x3, y3), lambda: run(x3, y3))
    assert len(calls) == 2, "the call with two tensors is recorded, then replayed"
    assert fake.log[-2][13:15] == (x3.data_ptr(), y3.data_ptr())


@pytest.mark.parametrize("why", ["misaligned", "hook", "device"])
def test_replay_falls_back(fake, monkeypatch, why):
    run, calls = _launcher(fake.kernel)
    x, y = fake_cuda(), fake_cuda()
    _plan.planned("f", (x, y), lambda: run(x, y))
    x2, y2 = fake_cuda(), fake_cuda()
    if why == "misaligned":
        x2 = fake_cuda(offset=1)  # another specialization of the first kernel
    elif why == "hook":
        monkeypatch.setattr(_launch, "_runtime_knobs", NS(launch_enter_hook=print, launch_exit_hook=None))
    else:
        monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 1, raising=False)
    _plan.planned("f", (x2, y2), lambda: run(x2, y2))
    assert len(calls) == 2


def test_plan_scalars_come_from_each_call(fake):
    """A float passed as ``_launch.scalar`` (batch norm's momentum) is a hole of the plan filled from each
    call's scalars: one plan serves every value (a momentum=None module's 1/num_batches_tracked changes
    every step; keyed by value it recorded a plan a step and filled MAX_PLANS, session 23), and Triton's
    own path and the direct launches get plain floats."""
    calls = []

    def run(x, y, scale):
        calls.append(1)
        out = _launch.alloc(torch.empty(6, 4).as_subclass(CudaLike))
        _launch.launch(fake.kernel, (2,), x, y, out, 24, _launch.scalar(scale, 1), BLOCK=32)
        _launch.launch(fake.kernel, (1,), out, x, out, 3, 2.0, BLOCK=16)
        return (out,)

    x, y = fake_cuda(), fake_cuda()
    _plan.planned("s", (x, y), lambda: run(x, y, 0.5), scalars=(9.0, 0.5))  # compiles the kernels
    x, y = fake_cuda(), fake_cuda()
    _plan.planned("s2", (x, y), lambda: run(x, y, 0.75), scalars=(9.0, 0.75))  # recorded through direct launches
    assert fake.log[-2][13:] == (x.data_ptr(), y.data_ptr(), fake.log[-2][15], 24, 0.75, 32)
    assert type(fake.log[-2][17]) is float, "a plain float reaches the launcher while recording"
    for scale in (1 / 3, 0.125, 1 / 7):
        x2, y2 = fake_cuda(), fake_cuda()
        _plan.planned("s2", (x2, y2), lambda: run(x2, y2, scale), scalars=(9.0, scale))
        first, second = fake.log[-2:]
        assert first[13:15] == (x2.data_ptr(), y2.data_ptr()) and first[16:] == (24, scale, 32)
        assert second[16:] == (3, 2.0, 16), "an argument passed as a plain float keeps its recorded value"
    assert len(calls) == 2 and len(_stored("s2")) == 1 and _stored("s2")[0] is not None


def test_no_plan_when_a_scalar_slot_is_not_given(fake):
    """A launcher that passes ``_launch.scalar(v, slot)`` to a caller that gives no such slot gets no plan (a
    replay would have no value for it): every call runs the launcher, with its own value."""
    calls = []

    def run(x, y, scale):
        calls.append(1)
        out = _launch.alloc(torch.empty(6, 4).as_subclass(CudaLike))
        _launch.launch(fake.kernel, (2,), x, y, out, 24, _launch.scalar(scale, 0), BLOCK=32)
        return (out,)

    for scale in (0.5, 0.25, 0.125):
        x, y = fake_cuda(), fake_cuda()
        _plan.planned("ns", (x, y), lambda: run(x, y, scale))
    assert len(calls) == 3 and _stored("ns") == [None]
    assert fake.log[-1][16:] == (24, 0.125, 32)


def test_plans_capped(fake, monkeypatch):
    """Past MAX_PLANS new keys (e.g. shapes that change every step) run the launcher without recording, so
    memory stays bounded."""
    monkeypatch.setattr(_plan, "MAX_PLANS", 2)
    run, calls = _launcher(fake.kernel)
    for k in range(4):
        x, y = fake_cuda(), fake_cuda()
        _plan.planned(("m", k), (x, y), lambda: run(x, y))
    assert len(_plan._plans) == 2 and len(calls) == 4


def test_plans_off_or_direct_launch_off(fake):
    run, calls = _launcher(fake.kernel)
    _launch.set_direct(False)  # Triton's own path: the recording is not replayable
    for _ in range(2):
        x, y = fake_cuda(), fake_cuda()
        _plan.planned("d", (x, y), lambda: run(x, y))
    assert len(calls) == 2 and _stored("d") == [None]


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["contig", "cl", "strided"])
def test_cuda_plans_same_bits_as_the_launchers(layout):
    """Batch norm's training forward, backward (several output masks) and eval forward through plans
    give the bits of the launchers, on inputs at new addresses (misaligned too) and with the running
    statistics updated in place."""
    from normkit.kernels import batch_norm as B

    def inputs(offset):
        base = torch.randn(16 * 32 * 7 * 7 + offset, device="cuda", dtype=torch.bfloat16)
        x = base[offset:].view(16, 32, 7, 7) + 2
        if layout == "cl":
            x = x.contiguous(memory_format=torch.channels_last)
        elif layout == "strided":
            x = x[:, :, :, ::2]
        return x, torch.randn_like(x)

    w, b = torch.rand(32, device="cuda") + 0.5, torch.randn(32, device="cuda")

    def run(x, g):
        rm, rv = torch.zeros(32, device="cuda"), torch.ones(32, device="cuda")
        y, m, s = B.bn_forward_train(x, w, b, rm, rv, 0.1, 1e-5)
        outs = [y, m, s, rm, rv, B.bn_forward_eval(x, w, b, rm, rv, 1e-5)]
        for mask in ((True, True, True), (False, True, True), (True, False, False)):
            outs += [t for t in B.bn_backward(g, x, w, m, s, True, mask) if t is not None]
        return outs

    was = _plan.enabled()
    try:
        for offset in (0, 0, 1, 0, 1):
            x, g = inputs(offset)
            _plan.set_plans(False)
            ref = run(x, g)
            _plan.set_plans(True)
            for _ in range(2):  # records, then replays
                got = run(x, g)
                assert all(torch.equal(a, c) for a, c in zip(ref, got))
            made = [p is not None for p in _plan._plans.values()]
            assert all(made) if layout != "strided" else not any(made), "strided input: copied, no plan"
    finally:
        _plan.set_plans(was)


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(64, 96), (16, 32, 7, 7), (64, 256, 28, 28)])  # one launch, split
def test_cuda_plans_take_each_calls_momentum(shape, monkeypatch):
    """A momentum=None module's momentum (1/num_batches_tracked) changes every step: one plan replays
    every value, with the running statistics of the launcher's bits."""
    from normkit.kernels import batch_norm as B

    C = shape[1]
    x = torch.randn(shape, device="cuda") * 3 + 1
    w, b = torch.rand(C, device="cuda") + 0.5, torch.randn(C, device="cuda")
    was = _plan.enabled()
    _plan.set_plans(True)
    try:
        for step in range(1, 6):
            rm, rv = torch.randn(C, device="cuda"), torch.rand(C, device="cuda") + 0.5
            outs = []
            for plans in (False, True):
                monkeypatch.setattr(_plan, "enabled", lambda p=plans: p)  # (set_plans would drop the plan)
                rm_, rv_ = rm.clone(), rv.clone()
                outs.append([*B.bn_forward_train(x, w, b, rm_, rv_, 1.0 / step, 1e-5), rm_, rv_])
            assert all(torch.equal(a, c) for a, c in zip(*outs)), f"step {step}"
            assert not torch.equal(outs[1][3], rm), "the running mean was updated"
        assert sum(k[0][0] == "bn_forward_train" for k in _plan._plans) == 1
    finally:
        monkeypatch.undo()
        _plan.set_plans(was)


@pytest.mark.cuda
@pytest.mark.parametrize("n", [768, 5120])
def test_cuda_plans_layer_and_rms_norm_same_bits(n):
    """Layer and RMS norm's launchers through plans give the launchers' bits, on inputs at new
    addresses (misaligned too), every output mask."""
    from normkit.kernels import layer_norm as L

    w = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)

    def run(x, dy):
        y, m, r = L.ln_forward(x, w, b, 1e-5)
        ry, rr = L.rms_forward(x, w, 1e-6)
        outs = [y, m, r, ry, rr]
        for mask in ((True, True, True), (True, False, False), (False, True, True)):
            outs += [t for t in L.ln_backward(dy, x, m, r, w, mask) if t is not None]
            outs += [t for t in L.rms_backward(dy, x, rr, w, mask[:2]) if t is not None]
        return outs

    was = _plan.enabled()
    try:
        for offset in (0, 0, 1, 0):
            base = torch.randn(64 * n + offset, device="cuda", dtype=torch.bfloat16)
            x = base[offset:].view(64, n)
            dy = torch.randn_like(x)
            _plan.set_plans(False)
            ref = run(x, dy)
            _plan.set_plans(True)
            for _ in range(2):
                got = run(x, dy)
                assert all(torch.equal(a, c) for a, c in zip(ref, got))
            assert all(p is not None for p in _plan._plans.values()), "every launcher call has a plan"
    finally:
        _plan.set_plans(was)


@pytest.mark.cuda
@pytest.mark.parametrize("n", [10, 768])
def test_cuda_plans_follow_the_params_layout_and_identity(n):
    """A plan recorded with dense weight / bias is not replayed for strided ones (session 15's CUDA
    conformance run: layer / RMS norm's strided-params case read every other element as if dense, error
    1e6 of tolerance), nor one recorded for weight passed as bias for two tensors."""
    from normkit.kernels import layer_norm as L

    x = torch.randn(24, n, device="cuda")
    dy = torch.randn_like(x)
    wide_w, wide_b = torch.rand(2 * n, device="cuda") + 0.5, torch.randn(2 * n, device="cuda")
    w, b = wide_w[::2], wide_b[::2]  # strided views
    dense_w, dense_b = w.contiguous(), b.contiguous()

    def run(w, b):
        y, m, r = L.ln_forward(x, w, b, 1e-5)
        ry, rr = L.rms_forward(x, w, 1e-6)
        return [y, m, r, ry, rr, *L.ln_backward(dy, x, m, r, w, (True, True, True)),
                *L.rms_backward(dy, x, rr, w, (True, True))]

    was = _plan.enabled()
    try:
        _plan.set_plans(False)
        ref = run(dense_w, dense_b)
        ref_aliased = run(dense_w, dense_w)
        _plan.set_plans(True)
        for _ in range(2):
            assert all(torch.equal(a, c) for a, c in zip(ref, run(dense_w, dense_b)))
            assert all(torch.equal(a, c) for a, c in zip(ref, run(w, b))), "strided params"
            assert all(torch.equal(a, c) for a, c in zip(ref_aliased, run(dense_w, dense_w)))
            assert all(torch.equal(a, c) for a, c in zip(ref, run(dense_w.clone(), dense_b.clone())))
    finally:
        _plan.set_plans(was)
