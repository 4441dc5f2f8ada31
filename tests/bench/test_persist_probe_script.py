"""benchmarks/bn_persist_probe.py end to end on the CPU (--dry: the Triton interpreter, one program, tiny shapes): the
persistent forward, plain and TMA loads, against normkit's training forward in every output it checks."""

import json
import os
import subprocess
import sys

PROBE = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "bn_persist_probe.py")


def test_persist_probe_dry_run_matches_normkits_forward(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(PROBE), "..", "src"))
    run = subprocess.run([sys.executable, PROBE, "--dry", "--out", str(tmp_path), "--variants", "p4w4u4,tma2s4"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "WRONG" not in run.stdout, run.stdout[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "bn_persist_probe.jsonl").read_text().splitlines()]
    timed = {(tuple(r["shape"]), r["layout"], r["impl"]) for r in rows if "ms" in r}
    # a row is recorded only after check() passed: y, mean, invstd and the running statistics against normkit's
    for shape, layout in [((6, 8, 3, 5), "cl"), ((4, 8, 3, 5), "nchw"), ((40, 24), "cl")]:
        assert (shape, layout, "p4w4u4") in timed
    for shape in [(6, 8, 3, 5), (40, 24)]:  # TMA: rows view, rows of 16-byte multiples only
        assert (shape, "cl", "tma2s4") in timed
    for r in rows:
        if r["impl"] in ("p4w4u4", "tma2s4"):
            assert r["errs"]["mean"] < 1e-5 and r["errs"]["invstd"] < 1e-5 and r["errs"]["rv"] < 1e-5
            assert r["errs"]["cnt"] == [0, 0] and r["errs"]["flag"] == 0  # the barrier's counters reset
