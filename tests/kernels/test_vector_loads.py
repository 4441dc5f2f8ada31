"""The offline sm_90 compile of launches whose rows are aligned only to 2-8 elements: their loads must be vectors.

Triton marks an int argument as divisible by 16 or by nothing, so a row length or stride of 24 / 40 / 1000 / 3000
elements gave element-by-element loads (session 37: batch norm's channels_last rows ran 1.3-2x slower in bf16). The
kernels now take the power of two the host knows (``_jit.known_multiple``). The interpreter cannot see load widths,
so these tests compile the launches for sm_90 without a GPU (``benchmarks/offline_audit.py``, in a subprocess: it
imports the kernels compiled, which the interpreter tests of this process must not see) and count the loads.
"""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")

SCRIPT = r"""
import json, sys
import torch
import offline_audit as A

B, L = A.B, A.L
seen = []
B.launch = L.launch = lambda kernel, grid, *a, **kw: seen.append((kernel, a, kw))
L._num_sms = lambda t: 132
op, shape, cl, dtype, knob = sys.argv[1], tuple(json.loads(sys.argv[2])), sys.argv[3] == "1", sys.argv[4], sys.argv[5]
dt = getattr(torch, dtype)
x = torch.empty(shape, dtype=dt, device="meta")
if op == "bn":
    if knob == "0":  # the hints off (the defaults have them on)
        B._TUNE["row_align"] = B._TUNE["plane_align"] = B._TUNE["fold_max_c"] = 0
    if cl:
        x = x.contiguous(memory_format=torch.channels_last)
    w = torch.empty(shape[1], device="meta")
    y, m, s = B.bn_forward_train(x, w, w, w.clone(), w.clone(), 0.1, 1e-5)
    B.bn_backward(torch.empty_like(x), x, w, m, s, True, (True, True, True))
else:
    if knob == "0":
        L._CFG["row_align"] = 0
    w = torch.empty(shape[1], dtype=dt, device="meta")
    y, mean, rstd = L.ln_forward(x, w, w, 1e-5)
    L.ln_backward(torch.empty_like(x), x, mean, rstd, w, (True, True, True), bias_dtype=dt)
for kernel, a, kw in seen:
    sig, consts, attrs, options = A.specialization(kernel, a, kw)
    loads = A.audit(kernel, sig, consts, attrs, options)[3]
    print(json.dumps({"kernel": kernel.fn.__name__, "loads": loads}))
"""


def _loads(op, shape, cl, dtype, knob):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), os.path.join(ROOT, "benchmarks")]))
    env.pop("TRITON_INTERPRET", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT, op, json.dumps(shape), "1" if cl else "0", dtype, str(knob)],
                         capture_output=True, text=True, timeout=600, env=env)
    if out.returncode != 0:
        if "ptxas" in out.stderr or "backend" in out.stderr.lower() or "cuobjdump" in out.stderr:
            pytest.skip("this Triton cannot compile for sm_90 offline: " + out.stderr.strip().splitlines()[-1])
        raise AssertionError(out.stderr[-3000:])
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def _scalar_and_vector(row, dtype):
    """(scalar loads of the input's element width, vector loads): per-channel fp32 coefficient loads of a bf16
    input's kernels are not the tile's (a folded row gathers its columns' coefficients one by one)."""
    ld = row["loads"]
    return ld["b16" if dtype == "bfloat16" else "b32"], ld["v4.b32"] + ld["v2.b32"] + ld["v4.b16"] + ld["v2.b16"]


# the big kernels (x / dy tiles), not the per-channel combine kernels
def _tile_kernels(rows, skip=("combine", "_reduce_partials")):
    return [r for r in rows if not any(s in r["kernel"] for s in skip)]


@pytest.mark.parametrize("op,shape,cl,dtype,knob", [
    ("bn", (128, 24, 56, 56), True, "bfloat16", 1),  # C % 16 == 8: 16-byte vectors
    ("bn", (128, 40, 28, 28), True, "float32", 1),
    ("bn", (32, 512, 38, 38), False, "bfloat16", 1),  # run-time plane 1444 = 4 x 361 (plane_align)
    ("bn", (64, 3, 224, 224), True, "bfloat16", 1),  # odd C folded (fold_max_c)
    ("ln", (8192, 3000), False, "bfloat16", 1),  # layer norm's row_align
])
def test_rows_aligned_to_a_few_elements_load_vectors(op, shape, cl, dtype, knob):
    rows = _tile_kernels(_loads(op, shape, cl, dtype, knob))
    assert rows
    for r in rows:
        scalar, vector = _scalar_and_vector(r, dtype)
        assert vector > 0 and scalar <= 2 * vector, r


def test_without_the_hint_they_load_elements():
    """The defect these tests guard against, reproduced with the hint off: the batch-norm rows kernels at C = 24."""
    rows = _tile_kernels(_loads("bn", (128, 24, 56, 56), True, "bfloat16", 0))
    assert any(_scalar_and_vector(r, "bfloat16")[1] == 0 for r in rows), rows
