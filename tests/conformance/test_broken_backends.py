"""Prove the checker can fail: deliberately broken backends must be caught under the right rule,
and a backend that delegates correctly to torch's CPU kernels must pass."""

import os
import sys
import types

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

import delegate_backend  # noqa: E402
import torch64_oracle  # noqa: E402

from normkit.conformance.backends import ModuleBackend  # noqa: E402
from normkit.conformance.runner import run_all  # noqa: E402

A = torch.ops.aten


def backend_with(name, **overrides):
    """The correct delegate with some functions replaced by broken ones."""
    mod = types.ModuleType(name)
    for k, v in vars(delegate_backend).items():
        if not k.startswith("__"):
            setattr(mod, k, v)
    for k, v in overrides.items():
        setattr(mod, k, v)
    return ModuleBackend(name, mod, delegate_backend.functional)


def run(backend, families=("batch_norm",), case=None):
    outcomes, runner = run_all(backend, "cpu", families, case, oracle=torch64_oracle)
    return outcomes


def failed_rules(outcomes):
    return {(r.rule, r.case) for o in outcomes for r in o.results if not r.passed}


def rules_of(outcomes):
    return {r.rule for o in outcomes for r in o.results if not r.passed}


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
    assert all("channels_last" in c for _, c in bad)
    assert any("channels_last_3d" in c for _, c in bad)


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


def test_missing_functions_are_reported_not_failed():
    mod = types.ModuleType("only_layer_norm")
    mod.native_layer_norm = delegate_backend.native_layer_norm
    outcomes, runner = run_all(ModuleBackend("only_layer_norm", mod), "cpu", ("layer_norm", "batch_norm"),
                               oracle=torch64_oracle)
    assert outcomes and all(o.passed for o in outcomes)
    assert all(o.op == "native_layer_norm" for o in outcomes)
    assert "native_layer_norm_backward" in runner.not_present
    assert "native_batch_norm" in runner.not_present


@pytest.mark.parametrize("family", ["batch_norm", "layer_norm", "rms_norm", "group_norm", "instance_norm"])
def test_correct_delegate_passes(family):
    out = run(backend_with("delegate"), families=(family,))
    assert len(out) > 20
    bad = [(r.rule, r.case, r.detail) for o in out for r in o.results if not r.passed]
    assert not bad, bad[:5]
