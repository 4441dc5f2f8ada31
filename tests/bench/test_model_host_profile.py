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
