"""benchmarks/model_host_profile.py: its settings and medians with a fake step (the timing itself runs on the H200)."""
import gc
import os
import sys

import pytest
import torch

import normkit

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
mhp = pytest.importorskip("model_host_profile")


def test_every_setting_measured_and_the_collector_restored(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    seen = []

    def step(times=None):
        seen.append((gc.isenabled(), torch.autograd.is_multithreading_enabled(), normkit.is_enabled()))
        if times is not None:
            times.append((1.0, 2.0))

    out = mhp.measure(step, rounds=5, steps=2)
    assert set(out) == set(mhp.SETTINGS)
    for row in out.values():
        assert row["fwd"] == 1.0 and row["bwd"] == 2.0 and row["step"] == 3.0 and row["gc"] >= 0
    # eager on the device thread and on the calling thread; normkit on the calling thread (enable()'s default), on
    # the device thread, and with the collector off
    assert set(seen) == {(True, True, False), (True, False, False), (True, False, True), (True, True, True),
                         (False, False, True)}
    assert gc.isenabled() and torch.autograd.is_multithreading_enabled() and not normkit.is_enabled()


def test_inside_kernels_clocks_each_registered_implementation(monkeypatch):
    """The clock wraps what enable() registers: here at the CPU test key, a batch norm's forward and backward."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    real_enabled = normkit.enabled
    monkeypatch.setattr(normkit, "enabled", lambda **k: real_enabled(_dispatch_key="CPU", **k))
    bn = torch.nn.BatchNorm1d(5)
    x = torch.randn(8, 5)

    def step():
        bn(x).square().mean().backward()

    real_empty, real_strided = torch.empty, torch.empty_strided
    out = mhp.inside_kernels(step, 3)
    assert out and all(v["calls_a_step"] == 1 and v["us_a_call"] > 0 for v in out.values()), out
    assert not normkit.is_enabled() and mhp_restored()
    assert torch.empty is real_empty and torch.empty_strided is real_strided
    assert "native_batch_norm" in mhp.format_inside(out)


def test_host_cache_probe_refuses_without_a_gpu(monkeypatch):
    probe = pytest.importorskip("host_cache_probe")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no GPU"):
        probe.main(["--models", "tv_resnet18"])


def mhp_restored():
    from normkit import aten

    return aten._make_kernel.__module__ == "normkit.aten" and aten._make_kernel.__name__ == "_make_kernel"
