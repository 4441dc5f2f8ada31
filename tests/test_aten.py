"""normkit.enable(): routing of unmodified models through normkit, per-input fallback, and restore.

CPU tests register at the CPU key (`enable(_dispatch_key="CPU")`, private, for tests); the cuda-marked
ones use the real CUDA key on the GPU machine."""

import pytest
import torch
import torch.nn.functional as F

import normkit
from normkit import aten

OPS = ["native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
       "_batch_norm_with_update", "_batch_norm_no_update", "native_batch_norm_backward", "batch_norm_backward",
       "cudnn_batch_norm", "cudnn_batch_norm_backward", "native_layer_norm", "native_layer_norm_backward",
       "_fused_rms_norm", "_fused_rms_norm_backward", "rms_norm", "native_group_norm",
       "native_group_norm_backward", "instance_norm", "batch_norm_stats", "batch_norm_elemt",
       "batch_norm_backward_reduce", "batch_norm_backward_elemt"]


@pytest.fixture(autouse=True)
def _always_disable():
    yield
    aten.disable()
    aten.reset_counts()


class SmallNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.ln = torch.nn.LayerNorm(6)
        self.w = torch.nn.Parameter(torch.randn(6))

    def forward(self, x):
        return F.rms_norm(self.ln(self.bn(self.conv(x))), (6,), self.w)


def _dumps():
    return {op: torch._C._dispatch_dump("aten::" + op) for op in OPS}


@pytest.mark.parametrize("op", ["batch_norm", "layer_norm", "rms_norm", "group_norm", "instance_norm"])
def test_torch_func_transforms_under_enable(op):
    """vmap, grad and forward-mode dual tensors through torch's functional ops with normkit enabled give torch's
    values: the Autograd-key overrides (rms_norm, instance_norm) step aside there (normkit's autograd Functions
    have no vmap / jvp rules) and the backend-key kernels take the unwrapped tensors."""
    from torch.func import grad, vmap

    torch.manual_seed(0)
    x = torch.randn(4, 2, 3, 6, dtype=torch.float64)
    w3, w6 = torch.randn(3, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    f = {"batch_norm": lambda t: F.batch_norm(t, None, None, w3, None, training=True),
         "layer_norm": lambda t: F.layer_norm(t, [6], w6),
         "rms_norm": lambda t: F.rms_norm(t, [6], w6),
         "group_norm": lambda t: F.group_norm(t, 3, w3),
         "instance_norm": lambda t: F.instance_norm(t, weight=w3)}[op]

    def loss(t):
        return (f(t) ** 3).sum()

    def tangent_of(t):  # forward mode with dual tensors
        with fwAD.dual_level():
            return fwAD.unpack_dual(f(fwAD.make_dual(x[0], t))).tangent

    import torch.autograd.forward_ad as fwAD

    t = torch.randn_like(x[0])
    want_v, want_g, want_t = vmap(f)(x), grad(loss)(x[0]), tangent_of(t)
    with normkit.enabled(_dispatch_key="CPU"):
        got_v, got_g, got_t = vmap(f)(x), grad(loss)(x[0]), tangent_of(t)
    torch.testing.assert_close(got_v, want_v)
    torch.testing.assert_close(got_g, want_g)
    torch.testing.assert_close(got_t, want_t)


def test_unmodified_model_routes_through_normkit_and_matches():
    torch.manual_seed(0)
    net, ref = SmallNet(), SmallNet()
    ref.load_state_dict(net.state_dict())
    x = torch.randn(4, 3, 5, 6)
    with normkit.enabled(_dispatch_key="CPU"):
        assert normkit.is_enabled()
        y = net(x)
        y.square().sum().backward()
        counts = aten.call_counts()
    assert not normkit.is_enabled()
    assert counts.get("native_batch_norm") == 1 and counts.get("native_batch_norm_backward") == 1
    assert counts.get("native_layer_norm") == 1 and counts.get("native_layer_norm_backward") == 1
    assert counts.get("rms_norm") == 1
    yr = ref(x)
    yr.square().sum().backward()
    torch.testing.assert_close(y, yr, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(net.bn.running_var, ref.bn.running_var)
    for (n, p), (_, q) in zip(net.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=n)


@pytest.mark.parametrize("channels_last", [False, True])
def test_group_norm_routes_through_normkit_and_matches(channels_last):
    torch.manual_seed(1)
    gn, ref = torch.nn.GroupNorm(4, 12), torch.nn.GroupNorm(4, 12)
    with torch.no_grad():
        gn.weight.normal_()
        gn.bias.normal_()
    ref.load_state_dict(gn.state_dict())
    x = torch.randn(3, 12, 5, 6) * 2 + 1
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    dy = torch.randn_like(x)
    with normkit.enabled(_dispatch_key="CPU"):
        y = gn(xa)
        y.backward(dy)
        counts = aten.call_counts()
    assert counts.get("native_group_norm") == 1 and counts.get("native_group_norm_backward") == 1
    yr = ref(xb)
    yr.backward(dy)
    torch.testing.assert_close(y, yr, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gn.weight.grad, ref.weight.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gn.bias.grad, ref.bias.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("track", [False, True])
def test_instance_norm_routes_through_normkit_and_matches(track):
    torch.manual_seed(2)
    m = torch.nn.InstanceNorm2d(6, affine=True, track_running_stats=track)
    ref = torch.nn.InstanceNorm2d(6, affine=True, track_running_stats=track)
    with torch.no_grad():
        m.weight.normal_()
        m.bias.normal_()
    ref.load_state_dict(m.state_dict())
    x = torch.randn(3, 6, 5, 7) * 2 + 1
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    dy = torch.randn_like(x)
    with normkit.enabled(_dispatch_key="CPU"):
        y = m(xa)
        y.backward(dy)
        counts = aten.call_counts()
        m.eval()
        y_eval = m(x)
    assert counts.get("instance_norm") == 1, counts
    yr = ref(xb)
    yr.backward(dy)
    ref.eval()
    torch.testing.assert_close(y, yr, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y_eval, ref(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(m.weight.grad, ref.weight.grad, rtol=1e-4, atol=1e-4)
    if track:
        torch.testing.assert_close(m.running_mean, ref.running_mean)
        torch.testing.assert_close(m.running_var, ref.running_var)


@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 1), (2, 3, 1, 1)])
def test_instance_norm_one_element_per_instance_running_var_like_torch(shape):
    """A direct aten instance_norm call (F.instance_norm refuses these inputs) with one element per instance: the
    unbiased variance is 0/0, so torch's running_var becomes NaN; normkit's enable() path once left 0 there."""
    torch.manual_seed(3)
    x = torch.randn(shape, dtype=torch.float64)
    want = [torch.randn(3, dtype=torch.float64), torch.rand(3, dtype=torch.float64) + 0.5]
    got = [t.clone() for t in want]
    y_want = torch.instance_norm(x, None, None, *want, True, 0.1, 1e-5, False)
    with normkit.enabled(_dispatch_key="CPU"):
        y_got = torch.instance_norm(x, None, None, *got, True, 0.1, 1e-5, False)
    assert aten.call_counts().get("instance_norm") == 1
    torch.testing.assert_close(y_got, y_want, rtol=0, atol=1e-12)
    torch.testing.assert_close(got[0], want[0], rtol=1e-12, atol=1e-12)
    assert torch.isnan(want[1]).all() and torch.isnan(got[1]).all()


def test_eval_backward_with_empty_saved_stats():
    net = SmallNet().eval()
    x = torch.randn(2, 3, 5, 6, requires_grad=True)
    ref = SmallNet().eval()
    ref.load_state_dict(net.state_dict())
    xr = x.detach().clone().requires_grad_()
    with normkit.enabled(_dispatch_key="CPU"):
        net(x).sum().backward()
    ref(xr).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-4, atol=1e-5)
    assert aten.call_counts()["native_batch_norm_backward"] == 1


def test_unhandled_inputs_fall_back_to_the_original_kernel():
    normkit.enable(_dispatch_key="CPU")
    with pytest.raises(NotImplementedError, match="\"batch_norm\" not implemented for 'Long'") as info:
        torch.ops.aten.native_batch_norm(torch.ones(2, 3, dtype=torch.long), None, None, None, None, True, 0.1, 1e-5)
    assert "batch_norm" in str(info.value)
    assert aten.fallback_counts().get("native_batch_norm") == 1
    z = torch.randn(2, 3, 8, dtype=torch.complex64)
    out = F.rms_norm(z, (8,))  # complex: normkit declines, the original composite answers
    assert aten.fallback_counts().get("rms_norm") == 1
    normkit.disable()
    torch.testing.assert_close(out, F.rms_norm(z, (8,)))


def _sync_primitives(x, w, b, g, counts):
    """torch.nn.SyncBatchNorm's per-rank calls, one rank's worth: forward and backward outputs."""
    mean, invstd = torch.batch_norm_stats(x, 1e-5)
    y = torch.batch_norm_elemt(x, w, b, mean, invstd, 1e-5)
    s1, s2, gw, gb = torch.batch_norm_backward_reduce(g, x, mean, invstd, w, True, True, True)
    dx = torch.batch_norm_backward_elemt(g, x, mean, invstd, w, s1, s2, counts)
    return mean, invstd, y, s1, s2, gw, gb, dx


def _sync_primitives_reference(x, w, b, g, counts):
    """_sync_primitives in float64 on the CPU (normkit.reference)."""
    r = normkit.reference
    xd, wd, bd, gd = (t.double().cpu() for t in (x, w, b, g))
    m, i = r.batch_norm_stats(xd, 1e-5)
    s1, s2, gw, gb = r.batch_norm_backward_reduce(gd, xd, m, i, wd, True, True, True)
    return (m, i, r.batch_norm_elemt(xd, wd, bd, m, i, 1e-5), s1, s2, gw, gb,
            r.batch_norm_backward_elemt(gd, xd, m, i, wd, s1, s2, counts.cpu()))


def test_sync_batch_norm_primitives_route_through_normkit():
    torch.manual_seed(0)
    x = torch.randn(4, 3, 5, 2) * 2 + 1
    w, b, g = torch.rand(3) + 0.5, torch.randn(3), torch.randn_like(x)
    counts = torch.tensor([40], dtype=torch.int32)
    normkit.enable(_dispatch_key="CPU")  # (torch's CPU build has no kernels for these: normkit's answer)
    got = _sync_primitives(x, w, b, g, counts)
    names = ("batch_norm_stats", "batch_norm_elemt", "batch_norm_backward_reduce", "batch_norm_backward_elemt")
    assert all(aten.call_counts().get(n) == 1 for n in names)
    want = _sync_primitives_reference(x, w, b, g, counts)
    for a, e in zip(got, want):
        torch.testing.assert_close(a.double(), e, rtol=1e-5, atol=1e-5)
    assert torch.batch_norm_backward_reduce(g, x, got[0], got[1], w, False, False, False) == (None,) * 4


def test_disable_restores_every_kernel():
    before = _dumps()
    normkit.enable(_dispatch_key="CPU")
    assert set(aten.registered_ops()) >= {"native_batch_norm", "cudnn_batch_norm", "_fused_rms_norm"}
    during = _dumps()
    assert during["native_batch_norm"] != before["native_batch_norm"]
    normkit.disable()
    assert _dumps() == before
    assert aten.registered_ops() == []
    aten.reset_counts()
    SmallNet()(torch.randn(2, 3, 4, 6)).sum().backward()
    assert aten.call_counts() == {} and aten.fallback_counts() == {}
    normkit.enable(_dispatch_key="CPU")  # and it can be enabled again
    SmallNet()(torch.randn(2, 3, 4, 6))
    assert aten.call_counts().get("native_batch_norm") == 1


def test_enabled_context_nests_and_restores_state():
    normkit.enable(_dispatch_key="CPU")
    with normkit.enabled(_dispatch_key="CPU"):
        assert normkit.is_enabled()
    assert normkit.is_enabled()  # enabled() leaves a prior enable() in place
    normkit.disable()
    normkit.disable()  # idempotent
    assert not normkit.is_enabled()


def test_enable_runs_backward_on_the_calling_thread_and_disable_restores():
    assert torch._C._is_multithreading_enabled()
    normkit.enable(_dispatch_key="CPU")
    assert not torch._C._is_multithreading_enabled()
    normkit.disable()
    assert torch._C._is_multithreading_enabled()
    with torch.autograd.set_multithreading_enabled(False):  # a user's own setting survives the pair
        normkit.enable(_dispatch_key="CPU")
        normkit.disable()
        assert not torch._C._is_multithreading_enabled()
    normkit.enable(backward_on_calling_thread=False, _dispatch_key="CPU")
    assert torch._C._is_multithreading_enabled()
    normkit.disable()
    with normkit.enabled(_dispatch_key="CPU"):
        x = torch.randn(4, 3, 5, requires_grad=True)
        F.batch_norm(x, None, None, training=True).sum().backward()  # the backward runs here
        assert not torch._C._is_multithreading_enabled()
    assert torch._C._is_multithreading_enabled()


def test_disable_in_another_thread_leaves_this_threads_flag_saved():
    import threading

    normkit.enable(_dispatch_key="CPU")
    t = threading.Thread(target=normkit.disable)
    t.start()
    t.join()
    assert not normkit.is_enabled()
    assert not torch._C._is_multithreading_enabled()  # thread-local: only this thread can restore it
    normkit.enable(_dispatch_key="CPU")
    normkit.disable()
    assert torch._C._is_multithreading_enabled()  # this thread's own setting, kept through the other's disable()


def test_enabled_blocks_in_two_threads_keep_normkit_on_until_the_last_closes():
    import threading

    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with normkit.enabled(_dispatch_key="CPU"):
            first_in.set()
            second_in.wait()
        first_out.set()

    def second():
        first_in.wait()
        with normkit.enabled(_dispatch_key="CPU"):
            second_in.set()
            first_out.wait()
            seen["on"] = normkit.is_enabled()
            seen["flag"] = torch._C._is_multithreading_enabled()
        seen["flag_after"] = torch._C._is_multithreading_enabled()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"on": True, "flag": False, "flag_after": True}
    assert not normkit.is_enabled()
    with normkit.enabled(_dispatch_key="CPU"):
        with normkit.enabled(_dispatch_key="CPU"):
            pass
        assert normkit.is_enabled() and not torch._C._is_multithreading_enabled()  # the outer block still holds
        normkit.enable(_dispatch_key="CPU")
    assert normkit.is_enabled()  # an explicit enable() outlives the blocks
    normkit.disable()
    assert torch._C._is_multithreading_enabled()


def test_cudnn_ops_contract_through_the_dispatcher():
    """At the CPU test key the cuDNN ops are reachable on CPU tensors: check their §13 semantics."""
    x = torch.randn(4, 3, 5, 2, dtype=torch.float64)
    w, b = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    rm, rv = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    rm_t, rv_t = rm.clone(), rv.clone()
    with normkit.enabled(_dispatch_key="CPU"):
        out, sm, si, reserve = torch.ops.aten.cudnn_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5)
        g = torch.randn_like(x)
        gi, gw, gb = torch.ops.aten.cudnn_batch_norm_backward(x, g, w, rm, rv, sm, si, 1e-5, reserve)
    out_t, sm_t, si_t = torch.ops.aten.native_batch_norm(x, w, b, rm_t, rv_t, True, 0.1, 1e-5)
    torch.testing.assert_close(out, out_t)
    torch.testing.assert_close(si, si_t)
    torch.testing.assert_close(rv, rv_t)
    assert reserve.dtype == torch.uint8 and reserve.numel() == 0
    exp = torch.ops.aten.native_batch_norm_backward(g, x, w, rm, rv, sm_t, si_t, True, 1e-5, [True] * 3)
    for a, e in zip((gi, gw, gb), exp):
        torch.testing.assert_close(a, e)
    assert aten.call_counts()["cudnn_batch_norm"] == 1 and aten.call_counts()["cudnn_batch_norm_backward"] == 1


def test_bad_input_through_enable_gets_the_contract_error_and_stats_stay():
    rm, rv = torch.randn(3), torch.rand(3) + 0.5
    rm0 = rm.clone()
    with normkit.enabled(_dispatch_key="CPU"):
        with pytest.raises(RuntimeError, match="weight should contain 3 elements not 4"):
            torch.ops.aten.native_batch_norm(torch.randn(4, 3), torch.ones(4), None, rm, rv, True, 0.1, 1e-5)
        with pytest.raises(RuntimeError, match="running_mean must be defined in evaluation mode"):
            torch.ops.aten._batch_norm_no_update(torch.randn(4, 3), None, None, None, None, 0.1, 1e-5)
    assert torch.equal(rm, rm0)


# ----------------------------------------------------------------------------------------------- GPU

def _norm_forward_calls(counts):
    return sum(counts.get(k, 0) for k in ("native_batch_norm", "cudnn_batch_norm", "_native_batch_norm_legit",
                                          "_batch_norm_with_update"))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_resnet50_every_batch_norm_through_normkit(dtype):
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet50().cuda().train()
    x = torch.randn(4, 3, 64, 64, device="cuda")
    with normkit.enabled():
        aten.reset_counts()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            loss = model(x).float().square().mean()
        loss.backward()
        counts = aten.call_counts()
    assert _norm_forward_calls(counts) == 53, counts
    assert sum(counts.get(k, 0) for k in ("native_batch_norm_backward", "cudnn_batch_norm_backward",
                                          "batch_norm_backward")) == 53, counts
    assert aten.fallback_counts() == {}, aten.fallback_counts()


def _cuda_x(shape, dtype, channels_last):
    """A fresh CUDA input (seeded: the tests compare two runs on it), values offset from zero."""
    torch.manual_seed(0)
    x = torch.randn(shape, device="cuda", dtype=dtype) * 2 + 1
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_cuda_group_norm_through_normkit_matches_eager(dtype, channels_last):
    x = _cuda_x((4, 64, 16, 16), dtype, channels_last)
    gn = torch.nn.GroupNorm(8, 64, device="cuda", dtype=dtype)
    with torch.no_grad():
        gn.weight.normal_()
        gn.bias.normal_()

    def run():
        inp = x.detach().clone().requires_grad_()
        gn.zero_grad()
        y = gn(inp)
        y.float().square().sum().backward()
        return y, inp.grad, gn.weight.grad.clone()

    with normkit.enabled():
        aten.reset_counts()
        y, gx, gw = run()
        counts = aten.call_counts()
        assert aten.fallback_counts() == {}, aten.fallback_counts()
    assert counts.get("native_group_norm") == 1 and counts.get("native_group_norm_backward") == 1, counts
    y_r, gx_r, gw_r = run()
    tol = dict(rtol=2e-2, atol=2e-2) if dtype != torch.float32 else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(y, y_r, **tol)
    # dx cancels (rstd·(g' - mean - x̂·mean)): in bf16 both sides round terms ~the gradient's scale, so
    # the absolute bound scales with it (H200, 2026-12-01: 0.049 off at one element of 65536, scale ~10)
    scale = gx_r.abs().max().item()
    torch.testing.assert_close(gx, gx_r, rtol=tol["rtol"], atol=tol["atol"] * max(1.0, scale))
    torch.testing.assert_close(gw.float(), gw_r.float(), rtol=tol["rtol"], atol=tol["atol"] * 50)


@pytest.mark.cuda
@pytest.mark.parametrize("channels_last", [False, True])
def test_cuda_instance_norm_through_normkit_matches_eager(channels_last):
    torch.manual_seed(0)
    x = torch.randn(4, 32, 24, 24, device="cuda") * 2 + 1
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    m = torch.nn.InstanceNorm2d(32, affine=True, track_running_stats=True, device="cuda")
    ref = torch.nn.InstanceNorm2d(32, affine=True, track_running_stats=True, device="cuda")
    with torch.no_grad():
        m.weight.normal_()
        m.bias.normal_()
    ref.load_state_dict(m.state_dict())

    def run(mod):
        inp = x.detach().clone().requires_grad_()
        y = mod(inp)
        y.square().sum().backward()
        return y, inp.grad

    with normkit.enabled():
        aten.reset_counts()
        y, gx = run(m)
        counts = aten.call_counts()
        assert aten.fallback_counts() == {}, aten.fallback_counts()
    assert counts.get("instance_norm") == 1, counts
    y_r, gx_r = run(ref)
    assert y.is_contiguous() and y.stride() == y_r.stride()  # aten normalizes input.contiguous() (contract §6)
    torch.testing.assert_close(y, y_r, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gx, gx_r, rtol=1e-4, atol=1e-4 * max(1.0, gx_r.abs().max().item()))
    torch.testing.assert_close(m.running_var, ref.running_var, rtol=1e-5, atol=1e-6)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_cuda_enable_matches_eager(dtype, channels_last):
    x = _cuda_x((8, 16, 10, 12), dtype, channels_last)
    bn = torch.nn.BatchNorm2d(16, device="cuda")
    ln_w = torch.randn(12, device="cuda", dtype=dtype, requires_grad=True)
    ref_bn = torch.nn.BatchNorm2d(16, device="cuda")
    ref_bn.load_state_dict(bn.state_dict())

    def run(m, inp):
        inp = inp.detach().clone().requires_grad_()
        z = m(inp)
        y = F.rms_norm(F.layer_norm(z, (12,), ln_w), (12,), ln_w)
        y.float().square().sum().backward()
        return z, y, inp.grad

    with normkit.enabled():
        z, y, gx = run(bn, x)
        assert aten.fallback_counts() == {}, aten.fallback_counts()
    z_r, y_r, gx_r = run(ref_bn, x)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype != torch.float32 else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(y, y_r, **tol)
    torch.testing.assert_close(gx, gx_r, **tol)
    torch.testing.assert_close(bn.running_var, ref_bn.running_var, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(z, z_r, **tol)
    assert z.is_contiguous(memory_format=torch.channels_last) == z_r.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_cuda_sync_batch_norm_primitives_through_normkit_match_aten(dtype, channels_last):
    x = _cuda_x((16, 24, 7, 9), dtype, channels_last)
    w, b = torch.rand(24, device="cuda") + 0.5, torch.randn(24, device="cuda")
    g = torch.randn_like(x)
    counts = torch.tensor([x.numel() // 24], device="cuda", dtype=torch.int32)
    with normkit.enabled():
        got = _sync_primitives(x, w, b, g, counts)
    assert all(aten.call_counts().get(n) == 1 for n in ("batch_norm_stats", "batch_norm_elemt",
                                                         "batch_norm_backward_reduce", "batch_norm_backward_elemt"))
    want = _sync_primitives(x, w, b, g, counts)  # ATen's kernels: the dtypes, shapes and strides to match
    # the values against float64, not ATen's: ATen's bf16 NCHW backward_reduce sums are off by bf16 rounding
    # (H200, torch 2.11: sum_dy 0.29 off of 78 on this input, normkit 1e-6)
    ref = _sync_primitives_reference(x, w, b, g, counts)
    for a, e, r in zip(got, want, ref):
        assert a.dtype == e.dtype and a.shape == e.shape
        bf16 = a.dtype == torch.bfloat16
        tol = dict(rtol=8e-3, atol=1e-2) if bf16 else dict(rtol=1e-5, atol=1e-6 * r.abs().max().item())
        torch.testing.assert_close(a.double().cpu(), r, **tol)
    for a, e in zip(got[2::5], want[2::5]):  # y and dx keep the input's layout, as ATen's
        assert a.stride() == e.stride()


def test_without_get_kernel_unhandled_inputs_use_the_reference(monkeypatch):
    """torch < 2.9 has no torch.library.get_kernel: enable() still works, declining inputs go to normkit's
    reference path (never a wrong answer) and non-floating dtypes raise ATen's error."""
    monkeypatch.delattr(torch.library, "get_kernel")
    before = _dumps()
    normkit.enable(_dispatch_key="CPU")
    x = torch.randn(4, 3, 5, dtype=torch.float64)
    out = torch.ops.aten.native_batch_norm(x, None, None, None, None, True, 0.1, 1e-5)[0]
    with pytest.raises(NotImplementedError, match="not implemented for 'Long'"):
        torch.ops.aten.native_batch_norm(torch.ones(2, 3, dtype=torch.long), None, None, None, None, True, 0.1, 1e-5)
    normkit.disable()
    assert _dumps() == before
    torch.testing.assert_close(out, torch.ops.aten.native_batch_norm(x, None, None, None, None, True, 0.1, 1e-5)[0])
