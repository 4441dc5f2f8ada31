"""benchmarks/graphed_steps.py: its capture pre-check and its plot (the captured steps themselves run on the H200)."""
import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
gs = pytest.importorskip("graphed_steps")


def test_momentum_none_models_are_named_not_capturable():
    """torch.nn's momentum=None batch norm reads num_batches_tracked on the host every training step: reported as a
    property of the model (eager too), not left to fail inside the capture."""
    plain = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
    cma = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8, momentum=None))
    assert gs._not_capturable(plain) is None
    why = gs._not_capturable(cma)
    assert why and "1" in why and "momentum=None" in why
    assert gs._not_capturable(cma.eval()) is None, "eval uses the running statistics: no host read"


def test_plot_from_a_runs_json(tmp_path):
    row = {"model": "m", "layout": "contiguous", "eager": 12.3, "normkit": 11.4, "eager_graphed": 11.7,
           "normkit_graphed": 6.7, "speedup": 1.08, "speedup_graphed": 1.74}
    path = tmp_path / "graphed_steps.json"
    path.write_text(json.dumps({"meta": {}, "rows": [row, {"model": "x", "layout": "contiguous", "error": "e"}]}))
    gs.main(["--plot", str(path)])
    png = tmp_path / "graphed_steps.png"
    assert png.exists() and png.stat().st_size > 1000
