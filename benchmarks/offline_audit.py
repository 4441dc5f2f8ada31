"""Which of normkit's kernels load element by element on sm_90, found without a GPU.

    PYTHONPATH=<triton 3.6 site>:src python benchmarks/offline_audit.py [--ops batch_norm layer_norm group_norm]
        [--quick] [--json FILE]

The host launchers run on "meta" tensors of the public suite's shapes with `launch` replaced by a
recorder, so every launch the suite makes is captured with its real arguments. Each distinct
specialization is then compiled for sm_90 as Triton's launcher would specialize it (pointers 16-byte
aligned, ints equal to 1 as constants, ints divisible by 16 marked so, constexprs by value; the launch
options) and its PTX is scanned: registers (cuobjdump) and the global loads by width. Lines marked
NARROW hold more 2- / 4-byte loads than twice their vector loads: a tile loop loading element by element
(e.g. group norm's channels_last statistics at 40 channels a group, NOTES-group_norm.md), or only the
per-channel parameter loads of a small kernel (read the loop before concluding anything).

Needs a Triton with its NVIDIA backend (ptxas, cuobjdump ship in the wheel); no GPU. The layer-norm
launchers are run as on a 132-SM GPU (the H200). ``--arch 86`` (80, 89, 100, 120, ...) compiles for another GPU,
with the launchers sizing their pipeline stages to that arch's shared memory, and flags (SMEM) any program that
would ask for more than a block may take there: a launch that fails on that GPU.
"""

import argparse
import hashlib
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import types

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from normkit.kernels import batch_norm as B  # noqa: E402
from normkit.kernels import _launch, set_knobs  # noqa: E402
from normkit.kernels import group_norm as GN  # noqa: E402
from normkit.kernels import layer_norm as L  # noqa: E402

_DT = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64",
       torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8", torch.bool: "i1"}
_OPTIONS = ("num_warps", "num_stages", "enable_fp_fusion", "num_ctas", "maxnreg")
# the most dynamic shared memory a block may take, by compute capability (CUDA programming guide, table 21)
_SMEM_LIMIT = {75: 65536, 80: 166912, 86: 101376, 87: 166912, 89: 101376, 90: 232448, 100: 232448, 120: 101376}
_LOADS = ("v4.b32", "v2.b32", "b32", "b16", "v4.b16", "v2.b16")


def record_launches(ops, quick):
    """(kernel, args, kwargs) of every launch the suite's shapes make, on meta tensors."""
    seen = []

    def rec(kernel, grid, *args, **kw):
        seen.append((kernel, args, kw))

    for mod in (B, L, GN):
        mod.launch = rec
    L._num_sms = lambda t: 132
    real_coop = L._coop_chunk

    def coop(x, N, BLOCK_N):  # as on a GPU: the meta device would switch the cooperative kernel off
        proxy = types.SimpleNamespace(element_size=x.element_size, device=types.SimpleNamespace(type="cuda"))
        return real_coop(proxy, N, BLOCK_N)

    L._coop_chunk = coop
    meta = dict(device="meta")
    dtypes = [torch.bfloat16, torch.float32] if not quick else [torch.bfloat16]
    if "batch_norm" in ops:
        shapes = [(256, 64, 112, 112), (256, 64, 56, 56), (256, 256, 56, 56), (256, 512, 28, 28),
                  (256, 1024, 14, 14), (256, 2048, 7, 7), (65536, 1024), (1048576, 64), (16, 64, 32, 64, 64)]
        # shapes outside the suite (session 11's bench): odd channel counts, 17x17 planes, C = 3, N = 2, 2-D, 3-D
        shapes += [] if quick else [(256, 96, 56, 56), (128, 160, 17, 17), (128, 768, 17, 17), (64, 32, 112, 112),
                                    (32, 3, 224, 224), (128, 40, 28, 28), (8, 256, 128, 128), (2, 512, 64, 64),
                                    (4096, 512), (1024, 4096), (16, 64, 16, 16, 16),
                                    # rows / planes aligned to 2-8 elements (session 37: row_align, plane_align)
                                    (128, 24, 56, 56), (32, 512, 38, 38)]
        # sizes of 1 (C, HW, N * HW = 2), which Triton passes as compile-time constants: code that a size of 1 breaks
        # compiles only here, never under the interpreter (session 35: a group-norm `(HW - 1).to(...)`)
        shapes += [] if quick else [(2, 1), (2, 3), (2, 5, 1), (1, 7, 2), (2, 1, 1, 1), (2, 3, 1, 1)]
        for shape in shapes[:3] if quick else shapes:
            for cl in (False, True):
                if cl and len(shape) < 4:
                    continue
                for dt in dtypes:
                    x = torch.empty(shape, dtype=dt, **meta)
                    if cl:
                        x = x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
                    C = shape[1]
                    w, b, rm, rv = (torch.empty(C, **meta) for _ in range(4))
                    y, m, s = B.bn_forward_train(x, w, b, rm, rv, 0.1, 1e-5)
                    B.bn_backward(torch.empty_like(x), x, w, m, s, True, (True, True, True))
                    B.bn_forward_eval(x, w, b, rm, rv, 1e-5)
    if "layer_norm" in ops:
        shapes = [(1048576, 64), (262144, 256), (32768, 768), (16384, 1024), (16384, 4096), (8192, 8192),
                  (4096, 16384), (2048, 65536), (512, 262144)]
        # model widths outside the suite (session 11's bench), the two-part rows among them
        shapes += [(131072, 320), (32768, 1600), (16384, 3072), (16384, 5120), (8192, 6144), (8192, 9216),
                   (8192, 10240), (8192, 12288), (4096, 18432), (4096, 20480),
                   (8192, 3000)]  # a width of 8 x odd (session 37: row_align)
        for M, N in shapes[::3] if quick else shapes:
            for dt, pdt in [(dt, dt) for dt in dtypes] + ([] if quick else [(torch.bfloat16, torch.float32)]):
                x = torch.empty(M, N, dtype=dt, **meta)
                w, b = torch.empty(N, dtype=pdt, **meta), torch.empty(N, dtype=pdt, **meta)
                y, mean, rstd = L.ln_forward(x, w, b, 1e-5)
                L.ln_backward(torch.empty_like(x), x, mean, rstd, w, (True, True, True), bias_dtype=pdt)
                y, rstd = L.rms_forward(x, w, 1e-6)
                L.rms_backward(torch.empty_like(x), x, rstd, w, (True, True))
    if "group_norm" in ops:
        shapes = [((32, 256, 64, 64), 32), ((16, 512, 64, 64), 32), ((8, 128, 256, 256), 32),
                  ((64, 1280, 16, 16), 32), ((4, 64, 32, 128, 128), 8), ((16, 64, 128, 128), 64)]
        # sizes of 1 (HW, a group's channels, N), compile-time constants to Triton (see batch norm's)
        shapes += [] if quick else [((1, 3, 1, 1), 1), ((2, 4, 1, 1), 4), ((2, 6, 1, 1), 2), ((1, 8, 3, 3), 8)]
        for shape, G in shapes[:2] if quick else shapes:
            for cl in (False, True):
                for dt in dtypes:
                    x = torch.empty(shape, dtype=dt, **meta)
                    if cl:
                        x = x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
                    C = shape[1]
                    w, b = torch.empty(C, dtype=dt, **meta), torch.empty(C, dtype=dt, **meta)
                    y, mean, rstd = GN.gn_forward(x, w, b, G, 1e-5, dt)
                    GN.gn_backward(torch.empty_like(x), x, mean, rstd, w, G, (True, True, True), dt)
    return seen


def specialization(kernel, args, kw):
    """(signature, constexprs, attrs, options) as Triton's launcher would specialize this call."""
    params = list(inspect.signature(kernel.fn).parameters.values())
    values = {p.name: (args[i] if i < len(args) else kw.get(p.name, p.default)) for i, p in enumerate(params)}
    sig, consts, attrs = {}, {}, {}
    for i, p in enumerate(params):
        v = values[p.name]
        if "constexpr" in str(p.annotation):
            sig[p.name] = "constexpr"
            consts[(i,)] = v
        elif isinstance(v, torch.Tensor):
            sig[p.name] = "*" + _DT[v.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]  # fresh allocations: 256-byte aligned
        elif isinstance(v, bool):
            sig[p.name] = "i1"
        elif isinstance(v, int):
            if v == 1:
                sig[p.name] = "constexpr"
                consts[(i,)] = 1
            else:
                sig[p.name] = "i32" if -(1 << 31) <= v < (1 << 31) else "i64"
                if v % 16 == 0:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, float):
            sig[p.name] = "fp32"
        else:
            sig[p.name] = "constexpr"
            consts[(i,)] = v
    options = {k: kw[k] for k in _OPTIONS if k in kw}
    return sig, consts, attrs, options


def audit(kernel, sig, consts, attrs, options, arch=90):
    src = ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs)
    c = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(c.asm["cubin"])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    res = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    ptx = c.asm["ptx"]
    loads = {k: len(re.findall(r"ld\.global(?:\.[a-z]+)*\." + re.escape(k) + r"\s", ptx)) for k in _LOADS}
    # what software pipelining (tl.range num_stages) costs: shared memory, and whether loads became cp.async
    loads["cp.async"] = len(re.findall(r"cp\.async\.c", ptx))
    stack = int(re.search(r"STACK:(\d+)", res).group(1))
    return (int(re.search(r"REG:(\d+)", res).group(1)), stack, c.metadata.shared, loads,
            tile_conversions(c.asm["ttgir"]), code_digest(ptx))


def code_digest(ptx: str) -> str:
    """A digest of the PTX instructions alone: no debug sections, line info, comments or parameter loads (a
    parameter added or removed upstream renumbers them), so that two revisions' kernels compare equal when
    they would run the same instructions (benchmarks/ptx_compare.py)."""
    body = ptx[ptx.index("{"):]
    body = body.split(".section", 1)[0]
    skip = (".loc", "//", ".file", "$L__tmp")
    keep = [line.strip() for line in body.splitlines()
            if line.strip() and not line.strip().startswith(skip) and "ld.param" not in line]
    return hashlib.sha256("\n".join(keep).encode()).hexdigest()[:16]


def tile_conversions(ttgir: str) -> int:
    """Layout conversions of 2-D tiles of >= 256 elements in the TTGIR, each a round trip through shared
    memory (the two-part layer-norm forward at 10240 converted its 1x8192 tile twice a row; session 12).
    1-D conversions (a parameter vector into the slice layout of a tile) are the usual pattern, not counted."""
    n = 0
    for m in re.finditer(r"ttg\.convert_layout [^:]*: tensor<([0-9]+)x([0-9]+)x[a-z0-9]+,", ttgir):
        n += int(m.group(1)) * int(m.group(2)) >= 256
    return n


def _short(v):
    return v.name if isinstance(v, tl.dtype) else v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", nargs="+", default=["batch_norm", "layer_norm", "group_norm"])
    ap.add_argument("--quick", action="store_true", help="a few shapes, bf16 only")
    ap.add_argument("--json", default=None)
    ap.add_argument("--set", nargs="*", default=[], metavar="KNOB=INT",
                    help="knobs of batch norm's _TUNE / layer norm's _CFG / group norm's _CFG before recording")
    ap.add_argument("--arch", type=int, default=90,
                    help="compute capability to compile for (80: A100, 86 / 89: RTX 30xx / 40xx, 120: RTX 50xx); "
                         "shared memory past the arch's per-block limit is flagged SMEM")
    args = ap.parse_args()
    smem_limit = _SMEM_LIMIT.get(args.arch)
    if smem_limit:  # the launchers size their pipeline stages to the device's shared memory: this arch's
        _launch.shared_memory_per_block = lambda t: smem_limit
    set_knobs(args.set)
    launches = record_launches(set(args.ops), args.quick)
    done, rows = {}, []
    for kernel, a, kw in launches:
        sig, consts, attrs, options = specialization(kernel, a, kw)
        key = (kernel.fn.__name__, tuple(sorted(sig.items())), tuple(sorted((k, repr(v)) for k, v in consts.items())),
               tuple(sorted(attrs)), tuple(sorted(options.items())))
        if key in done:
            continue
        try:
            regs, stack, smem, loads, convs, digest = audit(kernel, sig, consts, attrs, options, args.arch)
        except Exception as e:  # report and go on: one kernel's failure should not hide the others
            done[key] = None
            # (Triton's message: the failing line and its source; the constants say which specialization)
            print(f"{kernel.fn.__name__}: compile failed: {type(e).__name__}: {str(e)[:400]}\n  constants {consts}",
                  flush=True)
            continue
        names = list(inspect.signature(kernel.fn).parameters)
        declared = {n for n, prm in inspect.signature(kernel.fn).parameters.items()
                    if "constexpr" in str(prm.annotation)}
        cx = {names[k[0]]: _short(v) for k, v in consts.items() if names[k[0]] in declared}
        ptrs = {n: t for n, t in sig.items() if t.startswith("*")}
        narrow = loads["b16"] + loads["b32"]
        wide = loads["v4.b32"] + loads["v2.b32"] + loads["v4.b16"] + loads["v2.b16"]
        row = dict(kernel=kernel.fn.__name__, registers=regs, stack=stack, shared=smem, loads=loads,
                   tile_conversions=convs, constexprs=cx, pointers=ptrs, options=options,
                   flag=narrow > 2 * max(wide, 1), code=digest, smem_over=bool(smem_limit and smem > smem_limit))
        done[key] = row
        rows.append(row)
        print(f"{'NARROW ' if row['flag'] else '       '}{'CONVERT ' if convs else ''}{'SMEM ' if row['smem_over'] else ''}"
              f"{row['kernel']} regs {regs} "
              f"stack {stack} smem {smem} loads "
              + " ".join(f"{k}:{n}" for k, n in loads.items() if n)
              + f" | {json.dumps({k: str(v) for k, v in cx.items()})} {options}", flush=True)
    flagged = sum(r["flag"] for r in rows)
    converting = sum(bool(r["tile_conversions"]) for r in rows)
    failed = sum(v is None for v in done.values())
    over = sum(r["smem_over"] for r in rows)
    print(f"sm_{args.arch}: {len(rows)} specializations compiled, {failed} failed to compile, {flagged} load mostly "
          f"2- or 4-byte elements, {converting} convert tiles between layouts (CONVERT), {over} need more shared "
          f"memory than a block gets ({smem_limit} bytes; SMEM)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)


if __name__ == "__main__":
    sys.exit(main())
