"""The done-criteria of the checker itself: torch's CPU kernels and normkit both pass 300+ cases, torch all but
the cases where the checker caught its CPU kernels wrong (TORCH_CPU_WRONG).

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


# torch 2.13's CPU batch-norm backward on (N, C, L, 1) inputs of strides (L*C, 1, C, 1) (x.transpose(1, 2)
# .unsqueeze(-1)) with a contiguous grad_out: grad_input / weight / bias off by O(1) in fp32 and fp64 (bf16 with fp32
# params takes another kernel and passes). normkit passes these cases on both of its CPU paths.
TORCH_CPU_WRONG = "3x4x5x1_unsqueezed_"


@pytest.mark.parametrize("impl", ["torch", "normkit"])
def test_impl_passes_every_case(impl, tmp_path, capsys):
    out = tmp_path / "check.json"
    rc = check_main(["--impl", impl, "--device", "cpu", "--json", str(out)])
    capsys.readouterr()
    report, failed = _report(out)
    assert report["cases"] >= 300
    if impl == "torch":
        failed = [r for r in failed if TORCH_CPU_WRONG not in r["case"]]
    assert not failed, failed[:5]
    assert rc == (1 if report["failed"] else 0)


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
