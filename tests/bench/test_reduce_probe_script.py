"""benchmarks/bn_reduce_probe.py end to end on the CPU (--dry: the Triton interpreter, tiny shapes), then --plot."""

import json
import os
import subprocess
import sys

PROBE = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "bn_reduce_probe.py")


def test_probe_dry_run_and_plot(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(PROBE), "..", "src"))
    run = subprocess.run([sys.executable, PROBE, "--dry", "--out", str(tmp_path)], capture_output=True, text=True,
                         timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "bn_reduce_probe.jsonl").read_text().splitlines()]
    impls = {(r["layout"], r["impl"]) for r in rows}
    # every reference and both directions of the default reduction
    for want in [("cl", "stream"), ("nchw", "torch_sum"), ("cl", "nk:fwd:default"), ("nchw", "nk:bwd:default")]:
        assert want in impls
    # the TMA reductions (channels_last only) are timed only after their sums matched float64
    assert "WRONG" not in run.stdout
    for want in [("cl", "tma:fwd:tma16k_s3"), ("cl", "tma:bwd:tma16k_s4p264")]:
        assert want in impls
    assert all(r["err"] < 1e-4 for r in rows if r["impl"].startswith("tma:"))
    assert all(r["ms"] > 0 and r["copy_gbps"] > 0 for r in rows)
    plot = subprocess.run([sys.executable, PROBE, "--plot", str(tmp_path / "bn_reduce_probe.jsonl"),
                           "--impls", "stream,nk:fwd:default"], capture_output=True, text=True, timeout=120, env=env)
    assert plot.returncode == 0, plot.stderr[-2000:]
    assert (tmp_path / "bn_reduce_probe.png").stat().st_size > 1000
