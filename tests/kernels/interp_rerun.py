"""Rerun a kernel test file's CPU checks under Triton's interpreter, in a fresh process.

Triton picks the interpreter when it decorates a kernel, so if another module imported normkit's kernels
compiled first (no TRITON_INTERPRET=1), the interpreter-marked tests of a file are skipped in this
process; each kernel test file then calls `rerun_cpu_checks(__file__, INTERPRETED)` from one test.
"""

import os
import subprocess
import sys

import pytest
import torch


def rerun_cpu_checks(test_file: str, interpreted: bool) -> None:
    if interpreted:
        pytest.skip("already running under the interpreter")
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the cuda-marked tests cover the compiled kernels")
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-m", "not cuda", "-p", "no:cacheprovider", test_file],
        env=env, capture_output=True, text=True, timeout=900,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
