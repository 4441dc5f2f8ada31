"""Prove the checker can fail: deliberately broken backends must be caught under the right rule,
and a backend that delegates correctly to torch's CPU kernels must pass."""

import math
import os
import sys
import types

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

import delegate_backend  # noqa: E402
import torch64_oracle  # noqa: E402

from normkit.conformance.backends import ModuleBackend  # noqa: E402
from normkit.conformance.runner import run_all, select  # noqa: E402

A = torch.ops.aten


def backend_with(name, functional=None, **overrides):
    """The correct delegate with some functions (aten-named; F-style ones in `functional`) replaced."""
    mod = types.ModuleType(name)
    for k, v in vars(delegate_backend).items():
        if not k.startswith("__"):
            setattr(mod, k, v)
    for k, v in overrides.items():
        setattr(mod, k, v)
    fns = type("functional", (delegate_backend.functional,),
               {k: staticmethod(v) for k, v in (functional or {}).items()})
    return ModuleBackend(name, mod, fns)


def run(backend, families=("batch_norm",), case=None, errors=True):
    outcomes, runner = run_all(backend, "cpu", families, case, errors=errors, oracle=torch64_oracle)
    return outcomes


def failed_rules(outcomes):
    return {(r.rule, r.case) for o in outcomes for r in o.results if not r.passed}


def rules_of(outcomes):
    return {r.rule for o in outcomes for r in o.results if not r.passed}


def failed_cases(outcomes, rules=None):
    return {r.case for o in outcomes for r in o.results if not r.passed and (rules is None or r.rule in rules)}


def details(outcomes, rule):
    return [r.detail for o in outcomes for r in o.results if not r.passed and r.rule == rule]


def cases_where(family, case, pred):
    """Names of the (value) cases of `family` matching `case` for which pred(Case) holds."""
    return {c.name for c in select((family,), case, errors=False)[0] if pred(c)}


def _acc(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


# ----------------------------------------------------------------------------- broken backends

def _bn_variance_saved(input, weight, bias, running_mean, running_var, training, momentum, eps):
    out, mean, invstd = delegate_backend.native_batch_norm(input, weight, bias, running_mean, running_var,
                                                           training, momentum, eps)
    if training:
        return out, mean, 1.0 / invstd.float() ** 2 - eps  # the variance, not invstd (the MPS bug)
    return out, running_mean.clone(), running_var.clone()  # keeps (non-empty) eval stats: running_var


def _bn_biased_running_var(input, weight, bias, running_mean, running_var, training, momentum, eps):
    rv_before = None if running_var is None else running_var.clone()
    out, mean, invstd = delegate_backend.native_batch_norm(input, weight, bias, running_mean, running_var,
                                                           training, momentum, eps)
    if training and running_var is not None:
        dims = [0] + list(range(2, input.dim()))
        biased = input.float().var(dims, unbiased=False).to(running_var.dtype)
        running_var.copy_((1 - momentum) * rv_before + momentum * biased)
    return out, mean, invstd


def _bn_bwd_wrong_grad_weight(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd,
                              train, eps, output_mask):
    gi, gw, gb = delegate_backend.native_batch_norm_backward(grad_out, input, weight, running_mean, running_var,
                                                             save_mean, save_invstd, train, eps, output_mask)
    return gi, (gw * 1.01 if gw is not None else None), gb


def _bn_drops_channels_last(input, weight, bias, running_mean, running_var, training, momentum, eps):
    out, mean, invstd = delegate_backend.native_batch_norm(input, weight, bias, running_mean, running_var,
                                                           training, momentum, eps)
    return out.contiguous(), mean, invstd


def _bn_wrong_error(input, weight, bias, running_mean, running_var, training, momentum, eps):
    if weight is not None and weight.numel() != input.shape[1]:
        raise ValueError("weight has the wrong size")  # torch: RuntimeError "weight should contain 3 elements not 4"
    if (running_mean is None) != (running_var is None):
        raise RuntimeError("need both running stats")  # torch: ValueError with another message
    return delegate_backend.native_batch_norm(input, weight, bias, running_mean, running_var, training,
                                              momentum, eps)


def _bn_updates_then_raises(input, weight, bias, running_mean, running_var, training, momentum, eps):
    if running_mean is not None:
        running_mean.add_(1.0)  # mutates before validating
    return delegate_backend.native_batch_norm(input, weight, bias, running_mean, running_var, training,
                                              momentum, eps)


def test_variance_instead_of_invstd_and_kept_eval_stats():
    out = run(backend_with("broken_variance", native_batch_norm=_bn_variance_saved), case="native_batch_norm/")
    bad = failed_rules(out)
    train = [c for r, c in bad if r == "saved_stats" and "train" in c]
    evals = [c for r, c in bad if r == "saved_stats" and "eval" in c]
    assert train and evals, bad
    details = " ".join(r.detail for o in out for r in o.results if not r.passed and r.rule == "saved_stats")
    assert "variance" in details


def test_biased_running_variance():
    out = run(backend_with("broken_biased", native_batch_norm=_bn_biased_running_var), case="native_batch_norm/")
    bad = failed_rules(out)
    assert any(r == "running_stats" for r, _ in bad), bad
    details = " ".join(r.detail for o in out for r in o.results if not r.passed)
    assert "biased" in details
    assert rules_of(out) == {"running_stats"}


def _f_bn_bumping_running_stats(input, running_mean, running_var, *args, **kwargs):
    """F.batch_norm whose running-stat update goes through an autograd-visible in-place copy."""
    if running_mean is None or running_var is None:
        return torch.nn.functional.batch_norm(input, running_mean, running_var, *args, **kwargs)
    stats = (running_mean.clone(), running_var.clone())
    out = torch.nn.functional.batch_norm(input, *stats, *args, **kwargs)
    with torch.no_grad():
        running_mean.copy_(stats[0]), running_var.copy_(stats[1])
    return out


def test_running_stats_update_must_not_bump_their_autograd_version():
    out = run(backend_with("broken_version", functional={"batch_norm": _f_bn_bumping_running_stats}),
              case="F.batch_norm/")
    assert rules_of(out) == {"running_stats"}
    assert details(out, "running_stats") and all("autograd version" in d for d in details(out, "running_stats"))
    assert all("train" in c for c in failed_cases(out))


def test_wrong_grad_weight():
    out = run(backend_with("broken_grad", native_batch_norm_backward=_bn_bwd_wrong_grad_weight),
              case="native_batch_norm/")
    assert rules_of(out) == {"grads"}
    details = [r.detail for o in out for r in o.results if not r.passed]
    assert all("grad_weight" in d for d in details)
    # every case that requests grad_weight is caught
    assert len(details) >= 20


def test_drops_channels_last():
    out = run(backend_with("broken_cl", native_batch_norm=_bn_drops_channels_last), case="native_batch_norm/")
    bad = failed_rules(out)
    assert rules_of(out) == {"meta"}, bad
    assert all("channels_last" in c or "unsqueezed" in c for _, c in bad)  # unsqueezed inputs are channels_last
    assert any("channels_last_3d" in c for _, c in bad) and any("unsqueezed" in c for _, c in bad)


def test_wrong_error_type_and_message():
    out = run(backend_with("broken_error", native_batch_norm=_bn_wrong_error), case="/err_")
    bad = failed_rules(out)
    assert ("error", "native_batch_norm/err_weight_size_train") in bad
    assert ("error", "native_batch_norm/err_only_running_mean") in bad
    assert rules_of(out) == {"error"}


def test_call_that_raises_must_not_touch_running_stats():
    out = run(backend_with("broken_state", native_batch_norm=_bn_updates_then_raises),
              case="native_batch_norm/err_")
    assert ("error_state", "native_batch_norm/err_weight_size_train") in failed_rules(out)


def _bn_bwd_clobbers_input(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
                           output_mask):
    gi, gw, gb = delegate_backend.native_batch_norm_backward(grad_out, input, weight, running_mean, running_var,
                                                             save_mean, save_invstd, train, eps, output_mask)
    if gi is not None:
        input.copy_(gi)  # x's buffer, "dead after the backward", reused for grad_input (gradients still right)
        gi = gi.clone()
    return gi, gw, gb


def _bn_eval_saves_the_running_mean(input, weight, bias, running_mean, running_var, training, momentum, eps):
    out, mean, invstd = delegate_backend.native_batch_norm(input, weight, bias, running_mean, running_var,
                                                           training, momentum, eps)
    if not training:  # the CUDA convention's filled eval statistics, but the running mean itself, not a copy
        return out, running_mean, torch.rsqrt(running_var + eps)
    return out, mean, invstd


def test_a_call_that_writes_into_its_inputs():
    outcomes = run(backend_with("bwd_clobbers_input", native_batch_norm_backward=_bn_bwd_clobbers_input),
                   case="native_batch_norm/", errors=False)
    assert "inputs" in rules_of(outcomes) and any("changed by the call" in d for d in details(outcomes, "inputs"))


def test_outputs_aliasing_inputs():
    outcomes = run(backend_with("eval_saves_running_mean", native_batch_norm=_bn_eval_saves_the_running_mean),
                   case="native_batch_norm/", errors=False)
    assert failed_cases(outcomes, {"aliasing"}) == cases_where(
        "batch_norm", "native_batch_norm/", lambda c: not c.training and c.op == "native_batch_norm" and c.stats)


def test_missing_functions_are_reported_not_failed():
    mod = types.ModuleType("only_layer_norm")
    mod.native_layer_norm = delegate_backend.native_layer_norm
    outcomes, runner = run_all(ModuleBackend("only_layer_norm", mod), "cpu", ("layer_norm", "batch_norm"),
                               oracle=torch64_oracle)
    assert outcomes and all(o.passed for o in outcomes)
    assert all(o.op == "native_layer_norm" for o in outcomes)
    assert "native_layer_norm_backward" in runner.not_present
    assert "native_batch_norm" in runner.not_present


@pytest.mark.parametrize("family", ["batch_norm", "layer_norm", "rms_norm", "group_norm", "instance_norm",
                                    "sync_batch_norm"])
def test_correct_delegate_passes(family):
    out = run(backend_with("delegate"), families=(family,))
    assert len(out) > 20
    bad = [(r.rule, r.case, r.detail) for o in out for r in o.results if not r.passed]
    assert not bad, bad[:5]


# ----------------------------------------------------------------------------- layer norm

def _ln_std_saved(input, normalized_shape, weight, bias, eps):
    out, mean, rstd = delegate_backend.native_layer_norm(input, normalized_shape, weight, bias, eps)
    return out, mean, 1.0 / rstd  # sqrt(var + eps), not rstd


def _ln_eps_outside_sqrt(input, normalized_shape, weight, bias, eps):
    out, mean, rstd = delegate_backend.native_layer_norm(input, normalized_shape, weight, bias, eps)  # checks
    dims = list(range(input.dim() - len(normalized_shape), input.dim()))
    var, m = torch.var_mean(input.double(), dims, unbiased=False, keepdim=True)
    r = 1.0 / (var.sqrt() + eps)  # 1/(sqrt(var) + eps), not rsqrt(var + eps)
    y = (input.double() - m) * r * (1 if weight is None else weight.double()) + (0 if bias is None else bias.double())
    return y.to(out.dtype).contiguous(), mean, r.to(rstd.dtype)


def _ln_bwd_rows_of_dim0(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    # FlagGems #5392: the row count taken as input.shape[0], as for a 2-D input; for [B, S, H] only the
    # first B of the B*S rows get a gradient and dW/dB sum those B rows only
    N, M = math.prod(normalized_shape), input.shape[0]

    def rows(t, n):
        return t.reshape(-1, n)[:M]

    flat = [None if t is None else t.reshape(-1) for t in (weight, bias)]
    gi, gw, gb = A.native_layer_norm_backward(rows(grad_out, N), rows(input, N), [N], rows(mean, 1), rows(rstd, 1),
                                              *flat, output_mask)
    dx = None
    if gi is not None:
        dx = torch.zeros(input.shape, dtype=input.dtype)
        dx.view(-1, N)[:M] = gi
    return dx, *(None if t is None else t.view(normalized_shape) for t in (gw, gb))


def _ln_bwd_fp32_param_grads(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    def acc(t):
        return None if t is None else t.to(_acc(input.dtype))

    gi, gw, gb = A.native_layer_norm_backward(acc(grad_out), acc(input), normalized_shape, acc(mean), acc(rstd),
                                              acc(weight), acc(bias), output_mask)
    # dW/dB accumulated in fp32 and never cast back to the params' dtype
    return (None if gi is None else gi.to(input.dtype)), gw, gb


def _ln_bwd_every_grad(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    mask = [True, weight is not None, bias is not None]  # every gradient it can compute, whatever is asked
    return A.native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, mask)


def _gn_bwd_every_grad(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    mask = [True, weight is not None, weight is not None]
    return A.native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, mask)


def test_layer_norm_std_instead_of_rstd():
    out = run(backend_with("ln_std", native_layer_norm=_ln_std_saved), ("layer_norm",), "native_layer_norm/",
              errors=False)
    assert failed_cases(out, {"saved_stats"}) == cases_where("layer_norm", "native_layer_norm/",
                                                             lambda c: math.prod(c.shape) > 0)
    assert all(d.startswith("rstd") for d in details(out, "saved_stats"))
    assert rules_of(out) <= {"saved_stats", "grads"}  # the backward, fed those stats, may miss 2x ATen too


def test_layer_norm_eps_outside_sqrt():
    out = run(backend_with("ln_eps", native_layer_norm=_ln_eps_outside_sqrt), ("layer_norm",), "native_layer_norm/",
              errors=False)
    assert rules_of(out) <= {"values", "saved_stats", "grads"}
    # visible at any precision where eps is large against the variance, and for eps = 1e-5 at fp32/fp64
    # (unless the case is ill-conditioned, where the default tolerance alone suffices)
    seen = cases_where("layer_norm", "native_layer_norm/", lambda c: math.prod(c.shape) > 0 and (
        abs(c.eps) >= 0.5 or c.dtype in ("fp32", "fp64") and c.eps != 0 and not c.sensitive))
    assert seen <= failed_cases(out, {"values", "saved_stats"})
    assert any(d.startswith("rstd") for d in details(out, "saved_stats"))


def test_layer_norm_backward_assuming_2d_input():
    out = run(backend_with("ln_2d", native_layer_norm_backward=_ln_bwd_rows_of_dim0), ("layer_norm",),
              "native_layer_norm/", errors=False)
    assert rules_of(out) == {"grads", "crash"}
    # caught exactly where there are more rows than input.shape[0]; its reshape crashes on rows of width 0
    assert failed_cases(out, {"grads"}) == cases_where(
        "layer_norm", "native_layer_norm/", lambda c: math.prod(c.shape[:len(c.shape) - c.norm_ndim]) > c.shape[0])
    assert failed_cases(out, {"crash"}) == cases_where("layer_norm", "native_layer_norm/",
                                                       lambda c: c.shape[-1] == 0)


def test_layer_norm_param_grads_in_fp32():
    out = run(backend_with("ln_fp32", native_layer_norm_backward=_ln_bwd_fp32_param_grads), ("layer_norm",),
              "native_layer_norm/", errors=False)
    assert rules_of(out) == {"meta"}
    assert failed_cases(out) == cases_where("layer_norm", "native_layer_norm/", lambda c: c.dtype in ("fp16", "bf16"))
    assert all("grad_weight: dtype torch.float32" in d for d in details(out, "meta"))


def test_backward_ignoring_output_mask():
    """Gap found: no layer/group-norm case masked out a gradient of a defined parameter (or grad_input), so
    a backward computing every gradient it can passed; the *_mask100 / *_mask011 cases are new."""
    out = run(backend_with("ln_mask", native_layer_norm_backward=_ln_bwd_every_grad), ("layer_norm",),
              "native_layer_norm/", errors=False)
    assert rules_of(out) == {"grads"}
    assert failed_cases(out) == {"native_layer_norm/4x6x8_mask100/fp32", "native_layer_norm/4x6x8_mask011/fp32"}
    assert all("masked out but returned" in d for d in details(out, "grads"))
    out = run(backend_with("gn_mask", native_group_norm_backward=_gn_bwd_every_grad), ("group_norm",),
              "native_group_norm/", errors=False)
    assert rules_of(out) == {"grads"}
    assert {"native_group_norm/2x6x5_G3_mask100/fp32", "native_group_norm/2x6x5_G3_mask011/fp32"} <= failed_cases(out)


# ----------------------------------------------------------------------------- rms norm

def _rms_with_default_eps(default):
    """_fused_rms_norm, rms_norm and F.rms_norm whose eps=None means default(input)."""
    def fused(input, normalized_shape, weight, eps):
        return A._fused_rms_norm(input, normalized_shape, weight, default(input) if eps is None else eps)

    def composite(input, normalized_shape, weight=None, eps=None):
        return A.rms_norm(input, normalized_shape, weight, default(input) if eps is None else eps)

    return backend_with("rms_eps", _fused_rms_norm=fused, rms_norm=composite, functional={"rms_norm": composite})


@pytest.mark.parametrize("default, wrong_for, seen_by_all", [
    (lambda x: torch.finfo(x.dtype).eps, ("fp16", "bf16"), ("fp16", "bf16")),  # the input dtype's, not opmath's
    (lambda x: torch.finfo(torch.float64).eps, ("fp32", "fp16", "bf16"), ("fp32",)),  # what the oracle did
], ids=["finfo_input_dtype", "finfo_float64"])
def test_rms_norm_default_eps(default, wrong_for, seen_by_all):
    """Gaps found: (1) only _fused_rms_norm's fp32 rstd showed a half input's wrong default eps; rms_norm and
    F.rms_norm, which return only a half output, passed: the new small_eps_default case makes eps matter;
    (2) the oracle, fed float64, used float64's default eps, so correct fp32 results were judged against
    another eps: the runner now hands it the contract's."""
    out = run(_rms_with_default_eps(default), ("rms_norm",), "eps_default", errors=False)
    assert rules_of(out) <= {"values", "saved_stats", "autograd"}
    assert failed_cases(out) <= cases_where("rms_norm", "eps_default", lambda c: c.dtype in wrong_for)
    for op in ("_fused_rms_norm", "rms_norm", "F.rms_norm"):  # every entry point, in its output
        for dt in seen_by_all:
            assert f"{op}/4x5x32_small_eps_default/{dt}" in failed_cases(out, {"values"}), (op, dt)


def _rms_rstd_in_input_dtype(input, normalized_shape, weight, eps):
    out, rstd = A._fused_rms_norm(input, normalized_shape, weight, eps)
    return out, rstd.to(input.dtype)  # contract §7: rstd in the opmath type (fp32 for half inputs)


def _rms_subtracts_mean(input, normalized_shape, weight=None, eps=None):
    dims = list(range(input.dim() - len(normalized_shape), input.dim()))
    return A.rms_norm(input - input.mean(dims, keepdim=True), normalized_shape, weight, eps)  # a layer norm


class _RMSNormNoProjection(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, normalized_shape, w, eps):
        y, rstd = A._fused_rms_norm(x, normalized_shape, w, eps)
        ctx.save_for_backward(x, w, rstd)
        return y

    @staticmethod
    def backward(ctx, g):
        x, w, rstd = ctx.saved_tensors
        gw = g.to(rstd.dtype) * (1 if w is None else w.to(rstd.dtype))
        # misses the term from rstd's dependence on x: - x̂ · mean(g·w·x̂)
        dx = (gw * rstd).to(x.dtype)
        dw = None if w is None else (g.to(rstd.dtype) * x * rstd).reshape(-1, *w.shape).sum(0).to(w.dtype)
        return dx, None, dw, None


def _rms_f_no_projection(input, normalized_shape, weight=None, eps=None):
    eps = torch.finfo(_acc(input.dtype)).eps if eps is None else eps
    return _RMSNormNoProjection.apply(input, list(normalized_shape), weight, eps)


def test_rms_norm_rstd_in_input_dtype():
    out = run(backend_with("rms_rstd", _fused_rms_norm=_rms_rstd_in_input_dtype), ("rms_norm",), "_fused_rms_norm/",
              errors=False)
    assert rules_of(out) == {"saved_stats"}
    assert failed_cases(out) == cases_where("rms_norm", "_fused_rms_norm/", lambda c: c.half)
    assert all(d.startswith("rstd: dtype") for d in details(out, "saved_stats"))


def test_rms_norm_subtracting_the_mean():
    out = run(backend_with("rms_mean", rms_norm=_rms_subtracts_mean), ("rms_norm",), "rms_norm/", errors=False)
    assert rules_of(out) == {"values"}
    assert failed_cases(out) == cases_where("rms_norm", "rms_norm/",
                                            lambda c: c.op == "rms_norm" and math.prod(c.shape) > 0)


def test_rms_norm_backward_missing_a_term():
    out = run(backend_with("rms_bwd", functional={"rms_norm": _rms_f_no_projection}), ("rms_norm",), "F.rms_norm/",
              errors=False)
    assert rules_of(out) == {"autograd", "gradgrad"}
    assert failed_cases(out, {"autograd"}) == cases_where("rms_norm", "F.rms_norm/", lambda c: math.prod(c.shape) > 0)
    assert all(d.startswith("grad_input") and "grad_weight" not in d for d in details(out, "autograd"))


# ----------------------------------------------------------------------------- group norm

def _gn_flat_stats(input, weight, bias, N, C, HxW, group, eps):
    out, mean, rstd = delegate_backend.native_group_norm(input, weight, bias, N, C, HxW, group, eps)
    return out, mean.reshape(-1), rstd.reshape(-1)  # (N*G,), not (N, G); aten's backward still takes them


def _gn_bwd_instance_fast_path(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    gi, gw, gb = delegate_backend.native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group,
                                                             output_mask)
    if C == group and gi is not None:  # one channel per group: a fast path that drops the stats' terms
        shape = (N, C) + (1,) * (input.dim() - 2)
        gi = (grad_out * rstd.reshape(shape) * (1 if weight is None else weight.reshape(shape[1:]))).to(input.dtype)
    return gi, gw, gb


def _gn_bwd_spatial_sum(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    gi, gw, gb = delegate_backend.native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group,
                                                             output_mask)
    # dW/dB from per-(n, c) sums over dims 2.. written sum(dim=tuple(range(2, ndim))): for a 2-D input
    # (HxW == 1) that is sum(dim=()), which torch reads as every dim, not none
    shape = (N, C) + (1,) * (input.dim() - 2)
    m, r = (t.to(rstd.dtype).repeat_interleave(C // group, 1).view(shape) for t in (mean, rstd))
    spatial = tuple(range(2, input.dim()))
    g = grad_out.to(rstd.dtype)
    if gw is not None:
        gw = (g * (input - m) * r).sum(spatial).expand(N, C).sum(0).to(gw.dtype)
    if gb is not None:
        gb = g.sum(spatial).expand(N, C).sum(0).to(gb.dtype)
    return gi, gw, gb


def _gn_contiguous_out(input, weight, bias, N, C, HxW, group, eps):
    out, mean, rstd = delegate_backend.native_group_norm(input, weight, bias, N, C, HxW, group, eps)
    return out.contiguous(), mean, rstd  # CPU keeps the input's suggested memory format (contract §5)


def test_group_norm_stats_of_wrong_shape():
    out = run(backend_with("gn_flat", native_group_norm=_gn_flat_stats), ("group_norm",), "native_group_norm/",
              errors=False)
    assert rules_of(out) == {"saved_stats"}
    assert failed_cases(out) == cases_where("group_norm", "native_group_norm/", lambda c: True)
    assert all("mean: shape" in d and "rstd: shape" in d for d in details(out, "saved_stats"))


def test_group_norm_one_channel_per_group_backward():
    out = run(backend_with("gn_cpg1", native_group_norm_backward=_gn_bwd_instance_fast_path), ("group_norm",),
              "native_group_norm/", errors=False)
    assert rules_of(out) == {"grads"}
    assert failed_cases(out) == cases_where("group_norm", "native_group_norm/",
                                            lambda c: c.shape[1] == c.groups and c.backward and c.shape[0] > 0)
    assert all(d.startswith("grad_input") for d in details(out, "grads"))


def test_group_norm_hxw1_param_grads():
    out = run(backend_with("gn_hw1", native_group_norm_backward=_gn_bwd_spatial_sum), ("group_norm",),
              "native_group_norm/", errors=False)
    assert rules_of(out) == {"grads"}
    assert failed_cases(out) == cases_where("group_norm", "native_group_norm/",
                                            lambda c: len(c.shape) == 2 and c.backward and c.shape[0] > 0)
    assert all("grad_weight" in d and "grad_bias" in d for d in details(out, "grads"))


def test_group_norm_drops_channels_last():
    out = run(backend_with("gn_cl", native_group_norm=_gn_contiguous_out), ("group_norm",), "native_group_norm/",
              errors=False)
    assert rules_of(out) == {"meta"}
    assert failed_cases(out) == cases_where("group_norm", "native_group_norm/", lambda c: "channels_last" in c.layout)
    assert all("memory format contiguous" in d for d in details(out, "meta"))


# ----------------------------------------------------------------------------- instance norm

def _in_biased_running_var(input, weight, bias, running_mean, running_var, use_input_stats, momentum, eps,
                           cudnn_enabled=False):
    rv0 = None if running_var is None else running_var.clone()
    out = delegate_backend.instance_norm(input, weight, bias, running_mean, running_var, use_input_stats, momentum,
                                         eps, cudnn_enabled)
    if use_input_stats and running_var is not None:
        biased = input.double().var(list(range(2, input.dim())), unbiased=False).mean(0)
        running_var.copy_((1 - momentum) * rv0.double() + momentum * biased)
    return out


def _in_updates_in_eval(input, weight, bias, running_mean, running_var, use_input_stats, momentum, eps,
                        cudnn_enabled=False):
    out = delegate_backend.instance_norm(input, weight, bias, running_mean, running_var, use_input_stats, momentum,
                                         eps, cudnn_enabled)
    if not use_input_stats:  # updates the running stats from the batch although it normalized with them
        delegate_backend.instance_norm(input, weight, bias, running_mean, running_var, True, momentum, eps)
    return out


def _in_momentum_reversed(input, weight, bias, running_mean, running_var, use_input_stats, momentum, eps,
                          cudnn_enabled=False):
    # Keras' convention: running = momentum·running + (1 - momentum)·batch
    return delegate_backend.instance_norm(input, weight, bias, running_mean, running_var, use_input_stats,
                                          1 - momentum, eps, cudnn_enabled)


@pytest.mark.parametrize("fn, expect", [
    (_in_biased_running_var, lambda c: c.stats and c.training and c.momentum != 0),
    (_in_updates_in_eval, lambda c: c.stats and not c.training),
    (_in_momentum_reversed, lambda c: c.stats and c.training and c.momentum != 0.5),
], ids=["biased_running_var", "updates_in_eval", "momentum_reversed"])
def test_instance_norm_running_stats(fn, expect):
    out = run(backend_with("in_broken", instance_norm=fn), ("instance_norm",), "instance_norm/", errors=False)
    # (running statistics written in eval are also inputs a call changed)
    assert rules_of(out) == ({"running_stats", "inputs"} if fn is _in_updates_in_eval else {"running_stats"})
    assert failed_cases(out) == cases_where("instance_norm", "instance_norm/", lambda c: c.op == "instance_norm"
                                            and expect(c))
    assert all(d.startswith("running") for d in details(out, "running_stats"))


# ----------------------------------------------------------------------------- SyncBatchNorm primitives

def _gather_unweighted(input, mean, invstd, running_mean, running_var, momentum, eps, counts):
    # every rank weighted alike (right only for equal counts); the total count is kept
    alike = torch.full_like(counts, float(counts.double().mean()))
    return delegate_backend.batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var,
                                                                momentum, eps, alike)


def _reduce_means(grad_out, input, mean, invstd, weight, input_g, weight_g, bias_g):
    n = input.numel() // input.shape[1]  # means over the rank's values, not sums
    return tuple(None if t is None else t / n for t in delegate_backend.batch_norm_backward_reduce(
        grad_out, input, mean, invstd, weight, input_g, weight_g, bias_g))


def _elemt_rsqrt_of_invstd(input, weight, bias, mean, invstd, eps):
    # takes its invstd for the variance: rsqrt applied again (the FlagGems #5222 bug class)
    return delegate_backend.batch_norm_elemt(input, weight, bias, mean, torch.rsqrt(invstd + eps), eps)


@pytest.mark.parametrize("name, fn, expect_rules, culprit", [
    ("batch_norm_gather_stats_with_counts", _gather_unweighted, {"values", "running_stats"}, "mean"),
    ("batch_norm_backward_reduce", _reduce_means, {"grads"}, "sum_dy"),
    ("batch_norm_elemt", _elemt_rsqrt_of_invstd, {"values"}, "out"),
], ids=["unweighted_merge", "reduce_means", "elemt_invstd_as_var"])
def test_sync_batch_norm_primitive(name, fn, expect_rules, culprit):
    out = run(backend_with("sync_broken", **{name: fn}), ("sync_batch_norm",), name + "/", errors=False)
    assert rules_of(out) == expect_rules
    # every case of the primitive (all have uneven counts per rank)
    assert failed_cases(out) == cases_where("sync_batch_norm", name + "/", lambda c: True)
    assert all(culprit in d for r in expect_rules for d in details(out, r))
