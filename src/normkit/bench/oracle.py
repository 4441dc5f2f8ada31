"""float64 answers for a case's inputs, and the comparison that marks an implementation WRONG.

The oracle is ``normkit.reference`` (aten names) run in float64 on the inputs the implementations see,
already rounded to their dtype. Where the reference lacks an op or raises, torch's own float64 kernels
answer instead and the row says so (``oracle`` field): the run never stops for a missing oracle.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from normkit.bench.cases import EPS, MOMENTUM, RMS_EPS, Case, Inputs

# Relative L2 error allowed, by the least precise dtype among input and parameters. Output rounding alone
# costs about 2e-3 in bf16, 3e-4 in fp16, 6e-8 in fp32; the margins (8-13x) also admit low-precision
# accumulation of dw/db (ATen CPU); a wrong kernel is off by O(1e-2) to O(1).
TOLERANCE = {"float64": 1e-9, "float32": 1e-4, "float16": 4e-3, "bfloat16": 1.6e-2}
_RANK = {"float64": 0, "float32": 1, "float16": 2, "bfloat16": 3}


def tolerance(case: Case) -> float:
    worst = max((case.dtype, case.params), key=lambda d: _RANK[d])
    return TOLERANCE[worst]


def _f64(t):
    return None if t is None else t.detach().to(torch.float64).contiguous()


def _ref_module():
    import normkit.reference as R

    return R


def _reference(case: Case, x, w, b, rm, rv, dy, want_bwd: bool) -> dict:
    R = _ref_module()
    out = {}
    train = case.mode == "train"
    if case.op == "batch_norm":
        y, sm, si = R.native_batch_norm(x, w, b, rm, rv, train, MOMENTUM, EPS)
        out["y"] = y
        if train and rm is not None:
            out["running_mean"], out["running_var"] = rm, rv
        if want_bwd:
            gi, gw, gb = R.native_batch_norm_backward(dy, x, w, rm, rv, sm, si, train, EPS, [True, True, True])
            out.update(dx=gi, dw=gw, db=gb)
    elif case.op == "layer_norm":
        shape = [x.shape[-1]]
        y, mean, rstd = R.native_layer_norm(x, shape, w, b, EPS)
        out["y"] = y
        if want_bwd:
            gi, gw, gb = R.native_layer_norm_backward(dy, x, shape, mean, rstd, w, b, [True, True, True])
            out.update(dx=gi, dw=gw, db=gb)
    elif case.op == "rms_norm":
        shape = [x.shape[-1]]
        y, rstd = R._fused_rms_norm(x, shape, w, RMS_EPS)
        out["y"] = y
        if want_bwd:
            gi, gw = R._fused_rms_norm_backward(dy, x, shape, rstd, w, [True, True])
            out.update(dx=gi, dw=gw)
    elif case.op == "group_norm":
        n, c = x.shape[0], x.shape[1]
        hxw = math.prod(x.shape[2:])
        y, mean, rstd = R.native_group_norm(x, w, b, n, c, hxw, case.groups, EPS)
        out["y"] = y
        if want_bwd:
            gi, gw, gb = R.native_group_norm_backward(dy, x, mean, rstd, w, n, c, hxw, case.groups,
                                                     [True, True, True])
            out.update(dx=gi, dw=gw, db=gb)
    elif case.op == "instance_norm":
        # instance norm = batch norm over a (1, N*C, *) view with the parameters repeated N times
        n, c = x.shape[0], x.shape[1]
        xr = x.reshape(1, n * c, *x.shape[2:])
        wr, br = w.repeat(n), b.repeat(n)
        y, sm, si = R.native_batch_norm(xr, wr, br, None, None, True, MOMENTUM, EPS)
        out["y"] = y.view_as(x)
        if want_bwd:
            gi, gw, gb = R.native_batch_norm_backward(dy.reshape_as(xr), xr, wr, None, None, sm, si, True, EPS,
                                                      [True, True, True])
            out.update(dx=gi.view_as(x), dw=gw.view(n, c).sum(0), db=gb.view(n, c).sum(0))
    else:
        raise ValueError(case.op)
    return out


def _torch64(case: Case, x, w, b, rm, rv, dy, want_bwd: bool) -> dict:
    train = case.mode == "train"
    leaves = [t.clone().requires_grad_(want_bwd) if t is not None else None for t in (x, w, b)]
    xl, wl, bl = leaves
    with torch.enable_grad():
        if case.op == "batch_norm":
            y = F.batch_norm(xl, rm, rv, wl, bl, train, MOMENTUM, EPS)
        elif case.op == "layer_norm":
            y = F.layer_norm(xl, (x.shape[-1],), wl, bl, EPS)
        elif case.op == "rms_norm":
            y = F.rms_norm(xl, (x.shape[-1],), wl, RMS_EPS)
        elif case.op == "group_norm":
            y = F.group_norm(xl, case.groups, wl, bl, EPS)
        elif case.op == "instance_norm":
            y = F.instance_norm(xl, None, None, wl, bl, True, MOMENTUM, EPS)
        else:
            raise ValueError(case.op)
        out = {"y": y.detach()}
        if case.op == "batch_norm" and train and rm is not None:
            out["running_mean"], out["running_var"] = rm, rv
        if want_bwd:
            got = [t for t in leaves if t is not None]
            grads = torch.autograd.grad(y, got, dy)
            names = ["dx", "dw", "db"][: len(grads)]
            out.update(dict(zip(names, grads)))
    return out


def oracle(case: Case, inp: Inputs, want_bwd: bool, prefer_reference: bool = True) -> tuple:
    """(answers, source): float64 tensors y, dx, dw, db, running_mean, running_var (as the op has them)."""
    def args():
        return (_f64(inp.x), _f64(inp.weight), _f64(inp.bias), _f64(inp.running_mean),
                _f64(inp.running_var), _f64(inp.dy))

    note = None
    if prefer_reference:
        try:
            with torch.no_grad():
                return _reference(case, *args(), want_bwd), "normkit.reference"
        except Exception as e:  # the reference is written concurrently: fall back, say so
            note = f"{type(e).__name__}: {e}"[:160]
    res = _torch64(case, *args(), want_bwd)
    return res, "torch-float64" + (f" (normkit.reference failed: {note})" if note else "")


def rel_l2(got, ref) -> float:
    """||got - ref|| / ||ref|| in float64; inf for a non-finite or mis-shaped result."""
    if got is None or ref is None:
        return float("nan")
    if tuple(got.shape) != tuple(ref.shape):
        return float("inf")
    g = got.detach().to(torch.float64)
    if not bool(torch.isfinite(g).all()):
        return float("inf")
    r = ref.to(device=g.device)
    den = torch.linalg.vector_norm(r).item()
    num = torch.linalg.vector_norm(g - r).item()
    return num / den if den > 0 else num


def compare(got: dict, ref: dict, tol: float, expect_dtype=None) -> tuple:
    """(ok, errors, reasons): errors per tensor name present in both."""
    errors, reasons = {}, []
    for name, r in ref.items():
        if name not in got or got[name] is None:
            continue
        e = rel_l2(got[name], r)
        errors[name] = e
        if not (e <= tol):
            reasons.append(f"{name} err {e:.2g} > {tol:g}")
    if expect_dtype is not None and "y" in got and got["y"] is not None and got["y"].dtype != expect_dtype:
        reasons.append(f"y dtype {got['y'].dtype} != {expect_dtype}")
    return not reasons, errors, reasons
