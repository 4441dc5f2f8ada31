"""benchmarks/knob_ab.py and graphed_steps.py: knob_ab's per-round summary, their refusal without a GPU (the timing
itself runs on the H200)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
knob_ab = pytest.importorskip("knob_ab")


def test_summary_medians_and_ratio_spread():
    rounds = {"eager": [(10.0, 9.0), (12.0, 11.0), (11.0, 10.0)],
              "A": [(8.0, 7.5), (9.0, 8.0), (20.0, 19.0)],  # one round hit by a host hiccup
              "B": [(6.0, 5.0), (7.2, 6.0), (7.0, 6.5)]}
    row = knob_ab.summarize(rounds)
    assert row["eager"] == 11.0 and row["A"] == 9.0 and row["B"] == 7.0
    assert row["A_issue"] == 8.0 and row["B_issue"] == 6.0
    # per-round ratios 0.75, 0.8, 0.35: the median is robust to the hiccup
    assert row["b_over_a"] == pytest.approx(0.75)
    lo, hi = row["b_over_a_iqr"]
    assert lo <= row["b_over_a"] <= hi
    assert row["b_over_eager"] == pytest.approx(7.0 / 11.0)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_refuses_without_gpu():
    with pytest.raises(SystemExit, match="no GPU"):
        knob_ab.main(["--models", "mlp_bn1d", "--a", "fused_max_rows=0"])


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_graphed_steps_refuses_without_gpu():
    graphed_steps = pytest.importorskip("graphed_steps")
    with pytest.raises(SystemExit, match="no GPU"):
        graphed_steps.main(["--models", "mlp_bn1d"])


def test_apply_sets_kernel_knobs_and_the_fast_routes_flag(monkeypatch):
    from normkit.kernels import batch_norm as kbn
    from normkit.ops import batch_norm as obn

    monkeypatch.setattr(obn, "_routes_on", True)
    monkeypatch.setitem(kbn._TUNE, "fused_max_rows", kbn._TUNE["fused_max_rows"])
    knob_ab.apply(["fused_max_rows=7", "fast_routes=0"])
    assert kbn._TUNE["fused_max_rows"] == 7 and not obn.fast_routes_enabled()
    knob_ab.apply(["fast_routes=1"])
    assert obn.fast_routes_enabled() and kbn._TUNE["fused_max_rows"] == 7
    with pytest.raises(ValueError, match="unknown knob"):
        knob_ab.apply(["no_such_knob=1"])
