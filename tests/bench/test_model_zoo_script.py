"""benchmarks/model_zoo.py on the CPU: the built-in models through normkit at the CPU key (the Triton kernels under
the interpreter, as conftest sets TRITON_INTERPRET=1 for the subprocess too), and the agreement check catching a
wrong normalization."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

ZOO = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "model_zoo.py")


def _load():
    spec = importlib.util.spec_from_file_location("model_zoo", ZOO)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_zoo_dry_run_every_builtin_model_agrees(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(ZOO), "..", "src"))
    run = subprocess.run([sys.executable, ZOO, "--dry", "--out", str(tmp_path)], capture_output=True, text=True,
                         timeout=600, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "model_zoo.jsonl").read_text().splitlines()]
    zoo = _load()
    assert {r["model"] for r in rows} == set(zoo.BUILTIN)
    for r in rows:
        a = r["agreement"]
        assert r["status"] == "ok" and a["agree"], r
        assert sum(a["calls"].values()) > 0, r  # the model's norms really went through normkit
        assert 0 < a["normkit_err"]["out"] < 1e-5 and 0 < a["eager_err"]["out"] < 1e-5
        assert r["timing"]["eager"] > 0 and r["timing"]["normkit"] > 0
    # the families the built-in models are there for
    ops = set().union(*(r["agreement"]["calls"] for r in rows))
    assert {"native_batch_norm", "native_layer_norm", "native_group_norm", "instance_norm", "rms_norm"} <= ops
    # "yes" or "yes, gradients unverified (...)"
    assert (tmp_path / "model_zoo.md").read_text().count("| yes") == len(rows)
    assert (tmp_path / "model_zoo.png").stat().st_size > 1000


@pytest.mark.parametrize("scale", [1.0 + 3e-4, 1.0])
def test_agreement_catches_a_slightly_wrong_batch_norm(monkeypatch, scale):
    """A batch norm whose output is off by 3e-4 relative (far inside bf16 noise, far outside fp32's) must fail;
    the correct one must pass on the same model."""
    from normkit.ops import batch_norm as ops_bn

    zoo = _load()
    real = ops_bn._forward_core

    def skewed(*args, **kwargs):
        out = real(*args, **kwargs)
        return (out[0] * scale,) + tuple(out[1:])

    monkeypatch.setattr(ops_bn, "_forward_core", skewed)
    torch.manual_seed(0)
    row = zoo.agreement("mlp_bn1d", zoo.BUILTIN["mlp_bn1d"], "contiguous", "cpu", seed=int(torch.randint(0, 9999, ())),
                        dispatch_key="CPU")
    assert row["calls"].get("native_batch_norm", 0) > 0
    assert row["agree"] is (scale == 1.0), row


def test_kink_sides_count_activation_inputs_across_a_kink():
    """The sides recorded per activation call, and a flip counted where fp32 and float64 disagree on a side."""
    zoo = _load()
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 6), torch.nn.Hardswish(),
                              torch.nn.Linear(6, 3))
    x = torch.randn(5, 4)
    out = zoo.one_step(net, x, cot_seed=3)
    sides = out[4]
    assert [s.shape for s in sides] == [(5, 6), (5, 6)]  # one entry per activation call, in call order
    h = net[0](x)
    assert torch.equal(sides[0], (h > 0).to(torch.int8))
    assert int(sides[1].max()) <= 2 and int(sides[1].min()) >= 0  # Hardswish: below -3, between, above 3
    moved = [s.clone() for s in sides]
    moved[1].view(-1)[:3] = (moved[1].view(-1)[:3] + 1) % 3
    assert zoo._kink_flips(sides, sides) == 0 and zoo._kink_flips(moved, sides) == 3


def test_kink_sides_see_functional_and_inplace_activations():
    """``F.relu`` inside a forward, an in-place ReLU (sides taken before it overwrites its input) and a
    Hardtanh's own bounds count as much as module activations."""
    zoo = _load()

    class Functional(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 6)

        def forward(self, x):
            h = self.lin(x)
            a = torch.nn.functional.relu(h)
            b = torch.nn.ReLU(inplace=True)(h.clone())
            c = torch.nn.functional.hardtanh(h, -0.25, 0.5)
            return a + b + c

    torch.manual_seed(2)
    net, x = Functional(), torch.randn(7, 4)
    sides = zoo.one_step(net, x, cot_seed=4)[4]
    h = net.lin(x).detach()
    assert len(sides) == 3
    assert torch.equal(sides[0], (h > 0).to(torch.int8)) and torch.equal(sides[1], sides[0])
    assert torch.equal(sides[2], (h > -0.25).to(torch.int8) + (h > 0.5).to(torch.int8))


def test_kink_sides_record_max_pooling_picks():
    """Each max-pooling call (module, functional with positional arguments, adaptive) records the indices its
    windows pick, and a window that picks another element counts as a flip."""
    zoo = _load()
    F = torch.nn.functional

    class Pools(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(2, 3, 3, padding=1)
            self.pool = torch.nn.MaxPool2d(3, stride=2, padding=1)

        def forward(self, x):
            h = self.conv(x)
            return self.pool(h).sum((2, 3)) + F.max_pool2d(h, 2, 2).sum((2, 3)) + F.adaptive_max_pool2d(h, 1)[..., 0, 0]

    torch.manual_seed(5)
    net, x = Pools(), torch.randn(2, 2, 6, 6)
    sides = zoo.one_step(net, x, cot_seed=6)[4]
    h = net.conv(x).detach()
    assert len(sides) == 3
    assert torch.equal(sides[0], F.max_pool2d(h, 3, 2, 1, return_indices=True)[1])
    assert torch.equal(sides[1], F.max_pool2d(h, 2, 2, return_indices=True)[1])
    assert torch.equal(sides[2], F.adaptive_max_pool2d(h, 1, return_indices=True)[1])
    moved = [t.clone() for t in sides]
    moved[1].view(-1)[0] += 1
    assert zoo._kink_flips(moved, sides) == 1
