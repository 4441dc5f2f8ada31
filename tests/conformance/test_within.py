"""`check --within CONTEXT`: torch's ops checked while an override library is active, with torch's own
kernels (outside the context) as criterion B's baseline. The overrides sit at the CPU key here
(override_context.py; normkit.enabled's private CPU key), as FlagGems or normkit.enable() do on CUDA."""

import os
import sys
import warnings

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

import override_context  # noqa: E402

import normkit  # noqa: E402
from normkit.conformance import cli  # noqa: E402
from normkit.conformance.backends import ScopedBackend, TorchBackend, load_context  # noqa: E402
from normkit.conformance.runner import run_all  # noqa: E402


def check(make_context, families=("layer_norm",), case=None, with_runner=False):
    backend = ScopedBackend(TorchBackend(), make_context, "test")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
        outcomes, runner = run_all(backend, "cpu", families, case)
    return (outcomes, runner) if with_runner else outcomes


def failures(outcomes):
    return [(r.rule, r.case, r.detail) for o in outcomes for r in o.results if not r.passed]


def test_a_correct_override_passes_and_its_calls_are_made_inside_the_context():
    before = dict(override_context.calls)
    out = check(override_context.correct)
    assert len(out) > 50 and not failures(out), failures(out)[:3]
    assert override_context.calls["native_layer_norm"] > before["native_layer_norm"]
    assert override_context.calls["native_layer_norm_backward"] > before["native_layer_norm_backward"]


def test_a_broken_forward_is_caught():
    bad = failures(check(override_context.variance_as_rstd, case="native_layer_norm/"))
    rules = {rule for rule, _, _ in bad}
    assert "saved_stats" in rules and rules <= {"saved_stats", "grads"}, bad[:3]  # the backward takes rstd
    assert all("rstd" in detail for rule, _, detail in bad if rule == "saved_stats")


def test_the_baseline_is_torch_outside_the_context():
    """4 ulps off in 16-bit outputs: within "2x torch's error" only if torch were its own baseline."""
    bad = failures(check(override_context.few_ulps_off, case="native_layer_norm/"))
    cases = {case for _, case, _ in bad}
    assert bad and all(rule == "values" for rule, _, _ in bad), bad[:3]
    assert all("bf16" in c or "fp16" in c for c in cases), cases
    assert all("of tol" in detail and "ATen" in detail for _, _, detail in bad)


def test_backward_through_the_backends_outputs_runs_inside_the_context():
    """F.layer_norm's autograd reaches native_layer_norm_backward only during .backward(): a broken
    backward is caught in the autograd rule only if that runs inside the context too."""
    out = check(override_context.grad_input_scaled, case="F.layer_norm/")
    bad = failures(out)
    assert bad and {rule for rule, _, _ in bad} <= {"autograd", "gradgrad"}, bad[:3]
    assert any(rule == "autograd" and "grad_input" in detail for rule, _, detail in bad)


@pytest.mark.parametrize("family", ["batch_norm", "layer_norm", "rms_norm", "group_norm", "instance_norm",
                                    "sync_batch_norm"])
def test_torch_ops_under_normkit_enable_conform(family):
    """The path users take: torch's own ops with normkit.enable() active (here at the CPU test key; the
    SyncBatchNorm primitives, which torch's CPU build lacks, are normkit's answer there)."""
    out, runner = check(lambda: normkit.enabled(_dispatch_key="CPU"), families=(family,), with_runner=True)
    assert len(out) > 30
    assert not failures(out), failures(out)[:3]
    main_op = {"batch_norm": "native_batch_norm", "layer_norm": "native_layer_norm", "rms_norm": "_fused_rms_norm",
               "group_norm": "native_group_norm", "instance_norm": "instance_norm",
               "sync_batch_norm": "batch_norm_elemt"}[family]
    assert main_op not in runner.ops_with_torchs_bits()  # normkit computed them: not flagged as untouched


def test_an_override_that_changes_no_bit_is_named(capsys):
    """A context that overrides nothing here (normkit.enabled registers at the CUDA key) must not pass as
    a checked override silently: the ops whose outputs all equal torch's, bit for bit, are listed."""
    assert cli.main(["--impl", "torch", "--within", "normkit.enabled", "--ops", "layer_norm", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "same bits as torch's own kernels in every output compared: F.layer_norm, native_layer_norm" in text
    assert cli.main(["--impl", "torch", "--within", "override_context.few_ulps_off", "--ops", "layer_norm",
                     "--case", "native_layer_norm/", "--quiet"]) == 1
    assert "same bits" not in capsys.readouterr().out


def test_cli_within(capsys):
    rc = cli.main(["--impl", "torch", "--within", "override_context.variance_as_rstd", "--ops", "layer_norm",
                   "--case", "native_layer_norm/", "--quiet", "--max-failures", "1"])
    text = capsys.readouterr().out
    assert rc == 1
    assert "--impl torch --within override_context.variance_as_rstd" in text
    assert "repro: python -m normkit check --impl torch --within override_context.variance_as_rstd" in text


@pytest.mark.parametrize("path,why", [
    ("override_context.nothing", "has no attribute"),
    ("no_such_module_here.ctx", "No module named"),
    ("os.sep", "not callable"),
    ("torch.get_default_dtype", "is not a context manager"),
    ("not a name", "dotted name"),
    ("__import__('os').getcwd()", "dotted name"),
    ("override_context.overridden(kind=str(1))", "must be literals"),
    ("override_context.overridden(*['correct'])", "dotted name"),
    ("override_context.cannot_enter", "no device for this override library"),
])
def test_cli_within_usage_errors(path, why, capsys):
    assert cli.main(["--impl", "torch", "--within", path, "--quiet"]) == 2
    assert why in capsys.readouterr().err


def test_load_context_returns_the_named_callable():
    assert load_context("torch.no_grad") is torch.no_grad
    assert load_context("override_context.correct") is override_context.correct
    assert load_context("normkit.enabled") is normkit.enabled


def test_a_call_with_literal_arguments_makes_the_context():
    rc = cli.main(["--impl", "torch", "--within", "override_context.overridden(kind='variance_as_rstd')",
                   "--ops", "layer_norm", "--case", "native_layer_norm/", "--quiet", "--max-failures", "1"])
    assert rc == 1
    make = load_context("override_context.overridden('few_ulps_off')")
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    before = override_context.calls["native_layer_norm"]
    with make():  # each call of `make` opens the override anew
        inside = torch.ops.aten.native_layer_norm(x, [8], None, None, 1e-5)[0]
    assert override_context.calls["native_layer_norm"] == before + 1
    outside = torch.ops.aten.native_layer_norm(x, [8], None, None, 1e-5)[0]
    assert not torch.equal(inside, outside)  # the argument reached the context: 16-bit output shifted
