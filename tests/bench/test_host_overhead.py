"""benchmarks/host_overhead.py's fast-routes A/B (the timing itself runs on the H200): the settings alternate
within every round and the routes' switch is restored afterwards."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
host_overhead = pytest.importorskip("host_overhead")


def test_routes_ab_alternates_settings_and_restores_the_switch(monkeypatch):
    from normkit.ops import batch_norm as obn

    monkeypatch.setattr(obn, "_routes_on", True)
    seen = []

    def fake_per_call_us(fn, calls, repeats=3):
        on = obn.fast_routes_enabled()
        seen.append(on)
        return 10.0 if on else 20.0 + len(seen)  # the host drifts; routes halve the time

    monkeypatch.setattr(host_overhead, "per_call_us", fake_per_call_us)
    paths = {"eager": lambda: None, "under enable()": ("enable", lambda: None)}
    out = host_overhead.routes_ab(paths, calls=1, rounds=4)
    assert list(out) == ["under enable()"]  # only enable() paths
    assert seen == [False, True, True, False, False, True, True, False]  # rotated order each round
    row = out["under enable()"]
    assert row["on_us"] == 10.0 and row["off_us"] == 21.0 and 0.3 < row["on_over_off"] < 0.5
    assert obn.fast_routes_enabled()
