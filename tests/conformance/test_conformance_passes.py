"""The done-criteria of the checker itself: torch's CPU kernels and normkit both pass 300+ cases.

normkit runs twice: in this process, where tests/conftest.py turns Triton's interpreter on without a GPU
(so the Triton kernels run), and in a subprocess without it (the reference path users get on CPU).
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from normkit.conformance.cli import main as check_main

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def _report(path):
    with open(path) as f:
        report = json.load(f)
    failed = [r for r in report["results"] if not r["passed"]]
    return report, failed


@pytest.mark.parametrize("impl", ["torch", "normkit"])
def test_impl_passes_every_case(impl, tmp_path, capsys):
    out = tmp_path / "check.json"
    rc = check_main(["--impl", impl, "--device", "cpu", "--json", str(out)])
    capsys.readouterr()
    report, failed = _report(out)
    assert report["cases"] >= 300
    assert report["failed"] == 0 and not failed, failed[:5]
    assert rc == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU reference path; CUDA machines run kernels")
def test_normkit_reference_path_passes(tmp_path):
    out = tmp_path / "check.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([SRC, env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "normkit", "check", "--impl", "normkit", "--json", str(out)],
                          env=env, capture_output=True, text=True, timeout=600)
    report, failed = _report(out)
    assert report["cases"] >= 300
    assert proc.returncode == 0 and not failed, (proc.stdout[-2000:], failed[:5])
