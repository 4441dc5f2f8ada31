"""The sync_batch_norm family (contract §3) and the gradgrad rule (contract §8): normkit passes both,
deliberately broken backends are caught under the right rule, and torch's CPU build, which has no
SyncBatchNorm kernels, reports them as not present and still exits 0."""

import json
import os
import sys
import types

import torch

sys.path.insert(0, os.path.dirname(__file__))

import delegate_backend  # noqa: E402
import torch64_oracle  # noqa: E402

import normkit.ops  # noqa: E402
from normkit.conformance.backends import ModuleBackend, load_backend  # noqa: E402
from normkit.conformance.cases import SYNC_OPS, all_cases, error_cases  # noqa: E402
from normkit.conformance.cli import main  # noqa: E402
from normkit.conformance.runner import run_all  # noqa: E402

GRADGRAD_FAMILIES = ("batch_norm", "layer_norm", "rms_norm", "group_norm")


def failed(outcomes):
    return [(r.rule, r.case, r.detail) for o in outcomes for r in o.results if not r.passed]


def sync_backend(name, **overrides):
    """normkit's own SyncBatchNorm primitives, some replaced by broken ones."""
    mod = types.ModuleType(name)
    for op in SYNC_OPS:
        setattr(mod, op, getattr(normkit.ops, op))
    for k, v in overrides.items():
        setattr(mod, k, v)
    return ModuleBackend(name, mod)


def run_sync(backend, case=None):
    outcomes, runner = run_all(backend, "cpu", ("sync_batch_norm",), case, oracle=torch64_oracle)
    return outcomes, runner


# ----------------------------------------------------------------------------- the case library

def test_sync_library():
    cases = [c for c in all_cases() if c.family == "sync_batch_norm"]
    assert 30 <= len(cases) <= 60
    assert {c.op for c in cases} == set(SYNC_OPS)
    assert {c.dtype for c in cases} >= {"fp64", "fp32", "fp16", "bf16", "bf16+fp32"}
    assert {c.layout for c in cases} >= {"contiguous", "channels_last", "channels_last_3d"}
    assert all(c.ranks and sum(c.ranks) == c.shape[0] for c in cases)
    assert any(len(set(c.ranks)) > 1 for c in cases)
    assert any(1 in c.ranks and len(c.shape) == 2 for c in cases)  # a rank with count 1
    assert any(c.offset >= 1000 for c in cases) and any(not c.weight and not c.bias for c in cases)
    assert any(e.message == "mean and invstd need to have the same data types" for e in error_cases()
               if e.family == "sync_batch_norm")
    gg = [c for c in all_cases() if c.gradgrad]
    assert {c.family for c in gg} == set(GRADGRAD_FAMILIES)
    assert all(c.dtype == "fp64" and c.op.startswith("F.") for c in gg)
    assert any(c.family == "batch_norm" and c.training for c in gg)
    assert any(c.family == "batch_norm" and not c.training for c in gg)


# ----------------------------------------------------------------------------- normkit passes

def test_normkit_passes_sync_and_gradgrad():
    nk = load_backend("normkit")
    outcomes, runner = run_all(nk, "cpu", ("sync_batch_norm",))
    assert len(outcomes) >= 40 and not failed(outcomes), failed(outcomes)[:5]
    rules = {r.rule for o in outcomes for r in o.results}
    assert rules >= {"values", "meta", "grads", "running_stats", "error"}
    assert not any(op in runner.not_present for op in SYNC_OPS)
    outcomes, _ = run_all(nk, "cpu", GRADGRAD_FAMILIES, "gradgrad", errors=False)
    assert not failed(outcomes), failed(outcomes)[:5]
    gg = {o.family for o in outcomes for r in o.results if r.rule == "gradgrad"}
    assert gg == set(GRADGRAD_FAMILIES)


def test_correct_sync_backend_passes_independent_oracle():
    outcomes, _ = run_sync(sync_backend("sync_ok"))
    assert len(outcomes) >= 40 and not failed(outcomes), failed(outcomes)[:5]


# ----------------------------------------------------------------------------- broken SyncBN backends

def _elemt_local_count(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
    local = torch.tensor([input.numel() // input.shape[1]], dtype=torch.int32)
    return normkit.ops.batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, local)


def _gather_biased(input, mean, invstd, running_mean, running_var, momentum, eps, counts):
    rv0 = None if running_var is None else running_var.clone()
    gmean, ginvstd = normkit.ops.batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean,
                                                                     running_var, momentum, eps, counts)
    if running_var is not None:
        biased = 1.0 / ginvstd.double() ** 2 - eps
        running_var.copy_((1 - momentum) * rv0.double() + momentum * biased)
    return gmean, ginvstd


def _stats_half(input, eps):
    mean, invstd = normkit.ops.batch_norm_stats(input, eps)
    if input.dtype in (torch.float16, torch.bfloat16):
        return mean.to(input.dtype), invstd.to(input.dtype)  # stats not in the acc dtype
    return mean, invstd


def test_backward_elemt_with_local_count_is_caught():
    outcomes, _ = run_sync(sync_backend("sync_local_count", batch_norm_backward_elemt=_elemt_local_count))
    bad = failed(outcomes)
    assert bad and {r for r, _, _ in bad} == {"grads"}, bad[:5]
    assert {c.split("/")[0] for _, c, _ in bad} == {"batch_norm_backward_elemt"}
    n_cases = sum(1 for o in outcomes if o.op == "batch_norm_backward_elemt" and o.case.count("/") == 2)
    assert len({c for _, c, _ in bad}) == n_cases  # every backward_elemt case (all have several ranks)
    assert all("grad_input" in d for _, _, d in bad)


def test_gather_with_biased_running_var_is_caught():
    outcomes, _ = run_sync(sync_backend("sync_biased", batch_norm_gather_stats_with_counts=_gather_biased))
    bad = failed(outcomes)
    assert bad and {r for r, _, _ in bad} == {"running_stats"}, bad[:5]
    assert all(c.startswith("batch_norm_gather_stats") for _, c, _ in bad)
    assert any("biased" in d for _, _, d in bad)


def test_stats_in_half_dtype_is_caught():
    outcomes, _ = run_sync(sync_backend("sync_half_stats", batch_norm_stats=_stats_half), case="batch_norm_stats/")
    bad = failed(outcomes)
    assert ("meta" in {r for r, _, _ in bad}) and all("fp16" in c or "bf16" in c for _, c, _ in bad), bad[:5]


def test_missing_dtype_check_is_caught():
    def reduce_unchecked(grad_out, input, mean, invstd, weight, input_g, weight_g, bias_g):
        return normkit.ops.batch_norm_backward_reduce(grad_out, input, mean, invstd.to(mean.dtype), weight,
                                                      input_g, weight_g, bias_g)

    outcomes, _ = run_sync(sync_backend("sync_unchecked", batch_norm_backward_reduce=reduce_unchecked),
                           case="/err_")
    assert ("error", "batch_norm_backward_reduce/err_mean_invstd_dtype") in {(r, c) for r, c, _ in failed(outcomes)}


# ----------------------------------------------------------------------------- torch on the CPU

def test_torch_cpu_reports_sync_not_present_and_exits_0(tmp_path, capsys):
    path = tmp_path / "r.json"
    rc = main(["--impl", "torch", "--device", "cpu", "--ops", "rms_norm,sync_batch_norm", "--quiet",
               "--json", str(path)])
    out = capsys.readouterr().out
    assert rc == 0
    data = json.loads(path.read_text())
    assert data["failed"] == 0 and data["cases"] > 50
    assert not any(r["op"] in SYNC_OPS for r in data["results"])
    absent = {d["op"]: d["why"] for d in data["not_present"]}
    for op in SYNC_OPS:
        assert absent.get(op) == "not available on cpu", absent
        assert op in out.split("not present: ")[1].splitlines()[0]
    assert "sync_batch_norm" not in out.split("not present: ")[0]  # no row for a family that never ran


# ----------------------------------------------------------------------------- gradgrad

class _OnceBN(torch.autograd.Function):
    """F.batch_norm whose backward is not itself differentiable (no double backward)."""

    @staticmethod
    def forward(ctx, x, w, b, rm, rv, training, momentum, eps):
        y, sm, si = torch.ops.aten.native_batch_norm(x, w, b, rm, rv, training, momentum, eps)
        ctx.save_for_backward(x, w, rm, rv, sm, si)
        ctx.training, ctx.eps = training, eps
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        x, w, rm, rv, sm, si = ctx.saved_tensors
        gi, gw, gb = torch.ops.aten.native_batch_norm_backward(g, x, w, rm, rv, sm, si, ctx.training, ctx.eps,
                                                               [True, w is not None, w is not None])
        return gi, gw, gb, None, None, None, None, None


def _bn_once(input, running_mean=None, running_var=None, weight=None, bias=None, training=False, momentum=0.1,
             eps=1e-5):
    use_batch = training or running_mean is None
    return _OnceBN.apply(input, weight, bias, running_mean, running_var, use_batch, momentum, eps)


class _LNInputDetached(torch.autograd.Function):
    """layer_norm with a right first derivative whose double backward misses the input: its backward
    runs aten's (differentiable) layer-norm backward on a detached input."""

    @staticmethod
    def forward(ctx, x, ns, w, b, eps):
        y, mean, rstd = torch.ops.aten.native_layer_norm(x, ns, w, b, eps)
        ctx.save_for_backward(x, w, b, mean, rstd)
        ctx.ns = ns
        return y

    @staticmethod
    def backward(ctx, g):
        x, w, b, mean, rstd = ctx.saved_tensors
        gi, gw, gb = torch.ops.aten.native_layer_norm_backward(g, x.detach(), ctx.ns, mean, rstd, w, b,
                                                               [True, True, True])
        return gi, None, gw, gb, None


def _ln_detached(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return _LNInputDetached.apply(input, list(normalized_shape), weight, bias, eps)


class _functional_no_gradgrad(delegate_backend.functional):
    batch_norm = staticmethod(_bn_once)


def test_backend_without_double_backward_fails_gradgrad():
    backend = ModuleBackend("no_gradgrad", delegate_backend, _functional_no_gradgrad)
    outcomes, _ = run_all(backend, "cpu", ("batch_norm",), "gradgrad", errors=False, oracle=torch64_oracle)
    bad = failed(outcomes)
    gg = [c for o in outcomes for c in [o.case] if c.startswith("F.batch_norm/gradgrad")]
    assert len(gg) >= 2
    assert {r for r, _, _ in bad} == {"gradgrad"}, bad
    assert {c for _, c, _ in bad} == set(gg)
    assert all("no double backward" in d for _, _, d in bad), bad


def test_wrong_double_backward_is_caught():
    class functional(delegate_backend.functional):
        layer_norm = staticmethod(_ln_detached)

    backend = ModuleBackend("ln_detached", delegate_backend, functional)
    outcomes, _ = run_all(backend, "cpu", ("layer_norm",), "F.layer_norm/gradgrad", errors=False,
                          oracle=torch64_oracle)
    bad = failed(outcomes)
    assert bad and {r for r, _, _ in bad} == {"gradgrad"}, bad  # values and first derivatives are right
    assert all("dinput: no gradient" in d for _, _, d in bad), bad


def test_torch_passes_gradgrad():
    outcomes, _ = run_all(load_backend("torch"), "cpu", GRADGRAD_FAMILIES, "gradgrad", errors=False,
                          oracle=torch64_oracle)
    assert len(outcomes) >= 8 and not failed(outcomes), failed(outcomes)[:5]
