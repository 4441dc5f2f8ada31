"""Python cost per call of ``normkit.enable()``'s layers above the kernel launchers, on the CPU.

What it measures: microseconds per ``torch.ops.aten.<op>.default(...)`` call when normkit is enabled at
the CPU key and the Triton kernel launchers are stubs that return preallocated outputs at once, so the
time is the dispatcher's part plus normkit's own Python: ``normkit.aten`` (the per-input predicate,
counting, the re-entrancy guard), ``normkit.ops`` (kernel selection, contiguity, output views) and
``normkit._checks`` (validation). The launches themselves are measured on the GPU by
``benchmarks/host_overhead.py``; this script isolates what sits above them.

The CPU key normally takes every floating input for normkit's reference; here the CPU key is made to
behave as the CUDA key does (``aten._key`` set to "CUDA", so the device / parameter-dtype predicate
runs) and ``kernels_for`` is replaced by a copy of its CUDA fast path that answers the stub module for
CPU tensors. Each path's ``floor`` is the same call with a trivial Python kernel (it returns the
outputs) registered at the same key the same way: the dispatcher's share (autograd kernel, boxing, the
call into Python and back) that no change in normkit can remove. ``normkit - floor`` is normkit's Python.

    cd /work/main && PYTHONPATH=src python benchmarks/host_python.py [--calls 2000] [--repeats 7]
        [--profile "cudnn_batch_norm nhwc"] [--json FILE]

Prints the median over ``--repeats`` of the per-call time of ``--calls`` back-to-back calls per path,
then a cProfile of one path (top 20 functions by own time). Runs in ~15 s.
"""

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
import warnings

import torch

import normkit
from normkit import aten
from normkit.ops import _select
from normkit.ops import batch_norm as ops_bn
from normkit.ops import group_norm as ops_gn
from normkit.ops import layer_norm as ops_ln

N, C, H, W = 32, 64, 8, 8
M, D = 64, 1024
G = 8


class Stub:
    """A kernel module whose launchers return preallocated outputs of the right shapes and dtypes."""

    def __init__(self):
        f32 = dict(dtype=torch.float32)
        self.bn_y = {fmt: torch.empty(N, C, H, W, **f32).contiguous(memory_format=fmt)
                     for fmt in (torch.contiguous_format, torch.channels_last)}
        self.c1, self.c2 = torch.empty(C, **f32), torch.empty(C, **f32)
        self.y2d, self.m1, self.m2 = torch.empty(M, D, **f32), torch.empty(M, **f32), torch.empty(M, **f32)
        self.d1, self.d2 = torch.empty(D, **f32), torch.empty(D, **f32)
        self.g1, self.g2 = torch.empty(N, G, **f32), torch.empty(N, G, **f32)

    def _y(self, x):
        cl = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
        return self.bn_y[torch.channels_last if cl else torch.contiguous_format]

    def supports(self, *a):
        return True

    def bn_forward_train(self, x, *a):
        return self._y(x), self.c1, self.c2

    def bn_forward_eval(self, x, *a):
        return self._y(x)

    def bn_backward(self, g, x, *a):
        return self._y(x), self.c1, self.c2

    def ln_forward(self, *a):
        return self.y2d, self.m1, self.m2

    def ln_backward(self, *a, **k):
        return self.y2d, self.d1, self.d2

    def rms_forward(self, *a):
        return self.y2d, self.m1

    def rms_backward(self, *a):
        return self.y2d, self.d1

    def gn_forward(self, x, *a):
        return self._y(x), self.g1, self.g2

    def gn_backward(self, g, x, *a):
        return self._y(x), self.c1, self.c2


STUB = Stub()


def stub_kernels_for(family, x):
    """`_select.kernels_for`'s CUDA fast path, with `x.is_cpu` standing in for `x.is_cuda`."""
    if not isinstance(x, torch.Tensor) or x.dtype == torch.float64:
        return None
    if family in _select._FAMILY_MODULE and x.is_cpu:
        return STUB
    return None


def paths():
    """name -> (aten overload, its arguments, outputs of the right shapes for the floor's kernel)."""
    f32 = dict(dtype=torch.float32)
    x = torch.randn(N, C, H, W, **f32)
    w, b = torch.rand(C, **f32) + 0.5, torch.randn(C, **f32)
    rm, rv = torch.zeros(C, **f32), torch.ones(C, **f32)
    sm, si = torch.zeros(C, **f32), torch.ones(C, **f32)
    reserve = torch.empty(0, dtype=torch.uint8)
    lx, lw, lb = torch.randn(M, D, **f32), torch.randn(D, **f32), torch.randn(D, **f32)
    lm, lr = torch.zeros(M, 1, **f32), torch.ones(M, 1, **f32)
    a = torch.ops.aten
    out = {}
    for tag, fmt in (("nchw", torch.contiguous_format), ("nhwc", torch.channels_last)):
        xx = x.contiguous(memory_format=fmt)
        y3 = (STUB.bn_y[fmt], STUB.c1, STUB.c2)
        out[f"cudnn_batch_norm {tag}"] = (a.cudnn_batch_norm.default, (xx, w, b, rm, rv, True, 0.1, 1e-5),
                                          y3 + (reserve,))
        out[f"native_batch_norm {tag}"] = (a.native_batch_norm.default, (xx, w, b, rm, rv, True, 0.1, 1e-5), y3)
        out[f"_batch_norm_with_update {tag}"] = (a._batch_norm_with_update.default, (xx, w, b, rm, rv, 0.1, 1e-5),
                                                 y3 + (reserve,))
        out[f"native_batch_norm_backward {tag}"] = (a.native_batch_norm_backward.default,
                                                    (xx, xx, w, rm, rv, sm, si, True, 1e-5, [True, True, True]), y3)
        out[f"cudnn_batch_norm_backward {tag}"] = (a.cudnn_batch_norm_backward.default,
                                                   (xx, xx, w, rm, rv, sm, si, 1e-5, reserve), y3)
    out["native_group_norm"] = (a.native_group_norm.default, (x, w, b, N, C, H * W, G, 1e-5),
                                (STUB.bn_y[torch.contiguous_format], STUB.g1, STUB.g2))
    out["native_group_norm_backward"] = (a.native_group_norm_backward.default,
                                         (x, x, STUB.g1, STUB.g2, w, N, C, H * W, G, [True, True, True]),
                                         (STUB.bn_y[torch.contiguous_format], STUB.c1, STUB.c2))
    out["native_layer_norm"] = (a.native_layer_norm.default, (lx, [D], lw, lb, 1e-5), (STUB.y2d, lm, lr))
    out["native_layer_norm_backward"] = (a.native_layer_norm_backward.default,
                                         (lx, lx, [D], lm, lr, lw, lb, [True, True, True]), (STUB.y2d, lw, lb))
    out["_fused_rms_norm"] = (a._fused_rms_norm.default, (lx, [D], lw, 1e-5), (STUB.y2d, lr))
    out["_fused_rms_norm_backward"] = (a._fused_rms_norm_backward.default, (lx, lx, [D], lr, lw, [True, True]),
                                       (STUB.y2d, lw))
    return out


def per_call_us(fn, calls, repeats):
    for _ in range(200):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def floors(todo, calls, repeats):
    """Per path: the call with a trivial Python kernel at the CPU key (registered with the dispatch key
    set, as enable() registers normkit's) that returns the outputs."""
    lib = torch.library.Library("aten", "IMPL")
    res = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
            for op, _, outs in {v[0]: v for v in todo.values()}.values():
                lib.impl(op._schema.name.split("::")[1], lambda keyset, *a, outs=outs: outs, "CPU",
                         with_keyset=True)
        for name, (op, args, _) in todo.items():
            res[name] = per_call_us(lambda: op(*args), calls, repeats)
    finally:
        lib._destroy()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--profile", default="cudnn_batch_norm nhwc", help="path to profile ('' for none)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    todo = paths()
    floor = floors(todo, args.calls, args.repeats)
    saved = {m: m.kernels_for for m in (_select, ops_bn, ops_ln, ops_gn)}
    normkit.enable(_dispatch_key="CPU")
    key = aten._key
    aten._key = "CUDA"  # the CUDA key's predicate (see the module doc)
    for m in saved:
        m.kernels_for = stub_kernels_for
    results = {}
    try:
        for name, (op, op_args, _) in todo.items():
            aten.reset_counts()
            op(*op_args)
            if aten.call_counts() != {name.split()[0]: 1} or aten.fallback_counts():
                raise SystemExit(f"{name}: not taken by normkit: {aten.call_counts()} {aten.fallback_counts()}")
            us = per_call_us(lambda: op(*op_args), args.calls, args.repeats)
            results[name] = {"normkit_us": us, "floor_us": floor[name], "python_us": us - floor[name]}
        if args.profile:
            op, op_args, _ = todo[args.profile]
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.calls):
                op(*op_args)
            prof.disable()
    finally:
        for m, f in saved.items():
            m.kernels_for = f
        aten._key = key
        normkit.disable()

    width = max(map(len, results))
    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}; us per call, median of "
          f"{args.repeats} x {args.calls} calls")
    print(f"  {'path':{width}s} {'normkit':>8s} {'floor':>8s} {'normkit - floor':>16s}")
    for name, r in results.items():
        print(f"  {name:{width}s} {r['normkit_us']:8.2f} {r['floor_us']:8.2f} {r['python_us']:16.2f}")
    if args.profile:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(20)
        print(f"\ncProfile of {args.profile} x {args.calls} (top 20 by own time):")
        print(s.getvalue())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
