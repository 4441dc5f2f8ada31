"""Compile normkit's group-norm kernels for sm_90 without a GPU and report what the loads compile to.

    PYTHONPATH=<triton 3.6 site>:src python benchmarks/gn_offline_ptx.py

Needs a Triton with its NVIDIA backend (ptxas and cuobjdump ship in the wheel); no GPU, no CUDA driver.
Pointers and the ints Triton would see divisible by 16 (the row stride C, HxW, ...) are marked so, as
Triton's launcher specializes them; the unit stride is a constexpr 1. Prints, per kernel configuration,
the register count (cuobjdump) and how many global loads of each width the PTX holds: `ld.global.b16`
in a bf16 tile loop means element-by-element loads. Used for NOTES-group_norm.md ("Why the channels_last
forward partials are slow").
"""

import inspect
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from normkit.kernels import group_norm as K  # noqa: E402

LOADS = ("ld.global.v4.b32", "ld.global.v2.b32", "ld.global.b32", "ld.global.b16")


def compile_report(kernel, pointers, consts, warps, div16):
    names = list(inspect.signature(kernel.fn).parameters)
    sig = {n: pointers.get(n, "constexpr" if n in consts else ("fp32" if n == "eps" else "i32")) for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n].startswith("*") or n in div16}
    src = ASTSource(fn=kernel, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                    attrs=attrs)
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(c.asm["cubin"])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    res = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    regs = re.search(r"REG:(\d+)", res).group(1)
    ptx = c.asm["ptx"]
    counts = []
    for k in LOADS:
        n = len(re.findall(re.escape(k) + r"\b", ptx))
        counts.append(f"{k[len('ld.global.'):]} x{n}")
    return f"{regs} registers, loads " + ", ".join(counts)


def main():
    for dt in ("bf16", "fp32"):
        ptr = {"X": "*" + dt, "PART": "*fp32"}
        for bs, bc, gbp, warps in ((32, 128, 16, 4), (64, 64, 64, 8)):
            for align in (1, 16):
                consts = dict(BLOCK_S=bs, BLOCK_C=bc, GBP=gbp, SPLIT=False, CL=True, I64=False, SHIFT_ELEM=False,
                              CG1=False, ALIGN=align, sC=1)
                print(f"{dt} forward partials channels_last [{bs} x {bc}] {warps} warps ALIGN={align}:",
                      compile_report(K._fwd_partials_kernel, ptr, consts, warps, {"sN", "sS", "HW", "TOT", "SCH", "C"}))
        ptr = {"X": "*" + dt, "Y": "*" + dt, "W": "*" + dt, "B": "*" + dt, "MEAN32": "*fp32", "RSTD32": "*fp32"}
        consts = dict(HAS_W=True, HAS_B=True, BLOCK_S=32, BLOCK_C=128, CL=True, I64=False, sC=1)
        print(f"{dt} forward apply channels_last [32 x 128] 4 warps:",
              compile_report(K._fwd_apply_kernel, ptr, consts, 4, {"sN", "sS", "HW", "C"}))
        ptr = {"DY": "*" + dt, "X": "*" + dt, "MEAN": "*" + dt, "PB": "*fp32"}
        consts = dict(BLOCK_S=32, BLOCK_C=128, CL=True, I64=False, sC=1)
        print(f"{dt} backward partials channels_last [32 x 128] 4 warps:",
              compile_report(K._bwd_partials_kernel, ptr, consts, 4, {"sN", "sS", "HW", "C", "TOT", "SCH"}))


if __name__ == "__main__":
    sys.exit(main())
