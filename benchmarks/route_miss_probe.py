"""Why a model's layer / RMS norm calls miss their fast routes under ``enable()`` (CUDA).

``model_host_profile.py`` reports the share of calls a fast route answered per op; this says, for the calls it
did not, which condition of ``normkit.ops.layer_norm``'s ``_note_*`` / ``_*_route`` failed: x not contiguous,
no signature, no recorded plan for the launched views, or a noted route whose key the next call does not match.

    PYTHONPATH=src python benchmarks/route_miss_probe.py --models tv_vit_b_16,tv_convnext_tiny --out DIR
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_zoo as Z  # noqa: E402

import normkit  # noqa: E402
from normkit.kernels import _native, _plan  # noqa: E402
from normkit.ops import layer_norm as L  # noqa: E402


def _desc(t):
    if t is None:
        return None
    return {"shape": list(t.shape), "stride": list(t.stride()), "dtype": str(t.dtype).replace("torch.", ""),
            "contiguous": t.is_contiguous(), "offset": t.storage_offset()}


def instrument(log: Counter, examples: dict):
    """Wrap the layer-norm routes' note and lookup with a reason per call."""
    note_fwd, note_bwd, route_fwd, route_bwd = L._note_forward, L._note_backward, L._forward_route, L._backward_route

    def record(what, reason, **detail):
        log[(what, reason)] += 1
        examples.setdefault(f"{what}: {reason}", detail)

    def note_forward(op, x, normalized_shape, params, eps, rms):
        before = len(L._routes)
        note_fwd(op, x, normalized_shape, params, eps, rms)
        if len(L._routes) > before:
            return record(op + " note", "stored")
        if not (x.is_cuda and x.is_contiguous()):
            return record(op + " note", "x not contiguous", x=_desc(x))
        ns, m, n, _ = L._geometry(x, normalized_shape)
        sig = _plan.signature((x,) + params)
        launched = _plan.signature((x.view(m, n),) + params)
        if sig is None or launched is None:
            return record(op + " note", "no signature", x=_desc(x), params=[_desc(p) for p in params])
        mod = L.kernels_for("rms_norm" if rms else "layer_norm", x)
        run_eps = L.rms_norm_eps(x.dtype, eps) if rms else eps
        key = mod.forward_key(run_eps, rms)
        if not _plan.recorded(key, launched):
            same = [k for k in _plan._plans if k[1] == launched]
            return record(op + " note", "no plan recorded for the launched views", x=_desc(x),
                          params=[_desc(p) for p in params], key=repr(key)[:300],
                          plans_with_this_signature=[repr(k[0])[:300] for k in same][:4])
        record(op + " note", "already stored (same key)")

    def forward_route(op, x, normalized_shape, params, eps, rms):
        out = route_fwd(op, x, normalized_shape, params, eps, rms)
        if out is not None:
            record(op + " route", "taken")
        else:
            sig = _plan.signature((x,) + params)
            hit = sig is not None and (op, sig, tuple(normalized_shape), eps) in L._routes
            record(op + " route", "entry found, replay declined" if hit else "no entry", x=_desc(x),
                   eps=eps, ns=list(normalized_shape))
        return out

    def note_backward(op, grad_out, x, normalized_shape, stats, params, mask, bias_dtype, rms):
        before = len(L._routes)
        note_bwd(op, grad_out, x, normalized_shape, stats, params, mask, bias_dtype, rms)
        if len(L._routes) > before:
            return record(op + " note", "stored")
        record(op + " note", "not stored", grad_out=_desc(grad_out), x=_desc(x), stats=[_desc(s) for s in stats],
               params=[_desc(p) for p in params], mask=list(mask))

    def backward_route(op, grad_out, x, normalized_shape, stats, params, mask, bias_dtype, rms):
        out = route_bwd(op, grad_out, x, normalized_shape, stats, params, mask, bias_dtype, rms)
        record(op + " route", "taken" if out is not None else "no entry or declined", grad_out=_desc(grad_out),
               x=_desc(x))
        return out

    L._note_forward, L._note_backward = note_forward, note_backward
    L._forward_route, L._backward_route = forward_route, backward_route


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    Z.add_model_args(ap)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args(argv)
    meta, cases = Z.cuda_run(args, "route_miss_probe.py")
    _native.start()
    _native.wait(600)
    meta["native_replay"] = _native.status()
    print(f"native replay: {_native.status()}", flush=True)
    out = {"meta": meta, "models": {}}
    for name, layout in cases:
        log, examples = Counter(), {}
        step = Z.train_step(name, Z.MODELS[name], layout, "cuda", args.seed)
        orig = (L._note_forward, L._note_backward, L._forward_route, L._backward_route)
        instrument(log, examples)
        try:
            with normkit.enabled():
                for _ in range(args.steps):
                    step()
                torch.cuda.synchronize()
        finally:
            L._note_forward, L._note_backward, L._forward_route, L._backward_route = orig
        print(f"== {name} {layout} ({args.steps} steps)")
        for (what, reason), n in sorted(log.items()):
            print(f"  {what:40s} {reason:45s} {n}")
        for k, v in examples.items():
            print(f"  e.g. {k}: {json.dumps(v)[:600]}")
        out["models"][f"{name}-{layout}"] = {"counts": {f"{w}: {r}": n for (w, r), n in log.items()},
                                             "examples": examples}
    with open(os.path.join(args.out, "route_miss_probe.json"), "w") as f:
        json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
