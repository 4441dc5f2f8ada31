"""Checks of the layer norm and RMS norm families (`_run_layer_norm`, `_run_rms_norm`).

``native_layer_norm`` and ``_fused_rms_norm``: output, saved mean / rstd (shape and dtype included), and
the paired backward fed those statistics; ``F.layer_norm``, ``F.rms_norm`` and ``rms_norm`` through the
functional API, with autograd and double backward. RMS norm's default eps (None) is resolved to the
input's opmath eps before it reaches the oracle.
"""

from __future__ import annotations

import torch

from normkit.conformance._util import _NotOnDevice, _acc, _f_torch, _leaf, up
from normkit.conformance.cases import Case, make_inputs
from normkit.conformance.rules import suggested_format


class LayerNormChecks:
    """Mixin of `Runner` (whose judging helpers it uses): the layer norm and RMS norm families."""

    # ------------------------------------------------------------------ layer norm
    def _run_layer_norm(self, case: Case, fn):
        op = self._op = case.op
        I = make_inputs(case, self.device)
        x, w, b, g = I["x"], I["weight"], I["bias"], I["grad_out"]
        ns = list(case.param_shape())
        x64 = up(x)
        ref = self._oracle("native_layer_norm", x64, ns, up(w), up(b), case.eps)
        stat_shape = tuple(x.shape[: x.dim() - len(ns)]) + (1,) * len(ns)
        mask = list(case.mask or (True, w is not None, b is not None))
        if op == "F.layer_norm":
            xi, wi, bi = _leaf(x), _leaf(w), _leaf(b)
            out = self._call(fn, xi, ns, weight=wi, bias=bi, eps=case.eps)
            tb = self._baseline(lambda: _f_torch("layer_norm", I, (ns,), dict(eps=case.eps), bias=True))
            self._meta("out", out, x.shape, x.dtype, ("contiguous",))
            self._values("out", out, ref[0], tb and tb[0], None, case.sensitive)
            self._autograd(case, out, (xi, wi, bi), I, lambda: self._oracle(
                "native_layer_norm_backward", up(g), x64, ns, ref[1], ref[2], up(w), up(b), mask), tb and tb[1])
            self._gradgrad(case, fn, I, lambda f, a, c, d: f(a, ns, weight=c, bias=d, eps=case.eps),
                           lambda a, c, d: self.O.native_layer_norm(a, ns, c, d, case.eps)[0])
            return
        got = self._call(fn, x, ns, w, b, case.eps)
        tb = self._baseline(lambda: self.torch.aten(op)(x, ns, w, b, case.eps))
        out, mean, rstd = got
        self._meta("out", out, x.shape, x.dtype, ("contiguous",))
        self._values("out", out, ref[0], tb and tb[0], None, case.sensitive)
        self._stats_meta(case, (("mean", mean), ("rstd", rstd)), stat_shape, cpu_variant=True)
        self._values("mean", mean, ref[1], tb and tb[1], None, case.sensitive, rule="saved_stats")
        self._values("rstd", rstd, ref[2], tb and tb[2], None, case.sensitive, rule="saved_stats")
        bname = "native_layer_norm_backward"
        bfn = self.backend.aten(bname)
        if bfn is None:
            self.not_present.setdefault(bname, "not present")
            return
        self._op = bname
        grads = self._call(bfn, g, x, ns, mean, rstd, w, b, mask)
        ref_g = self._oracle(bname, up(g), x64, ns, up(mean), up(rstd), up(w), up(b), mask)
        base = base_ref = None
        if tb is not None:
            base = self._baseline(lambda: self.torch.aten(bname)(g, x, ns, tb[1], tb[2], w, b, mask))
            if base is not None:
                base_ref = self._oracle(bname, up(g), x64, ns, up(tb[1]), up(tb[2]), up(w), up(b), mask)
        pshape = tuple(ns)
        metas = [(x.shape, x.dtype, ("contiguous",)), (pshape, w.dtype if w is not None else x.dtype, ()),
                 (pshape, b.dtype if b is not None else x.dtype, ())]
        self._check_grads(("grad_input", "grad_weight", "grad_bias"), grads, ref_g, base, base_ref, metas, mask,
                          case.sensitive, "grads", bname)

    # ------------------------------------------------------------------ rms norm
    def _run_rms_norm(self, case: Case, fn):
        op = self._op = case.op
        I = make_inputs(case, self.device)
        x, w, g = I["x"], I["weight"], I["grad_out"]
        ns = list(case.param_shape())
        x64 = up(x)
        # eps None is finfo(opmath of the input dtype).eps (contract §7): the oracle, fed float64, is told it
        # (left to itself it would take float64's and not tell the fp32 default from any other tiny eps)
        eps64 = case.eps if case.eps is not None else torch.finfo(_acc(x.dtype)).eps
        ref = self._oracle("_fused_rms_norm", x64, ns, up(w), eps64)
        stat_shape = tuple(x.shape[: x.dim() - len(ns)]) + (1,) * len(ns)
        mask = list(case.mask or (True, w is not None))
        keep = (suggested_format(x),)
        if op in ("F.rms_norm", "rms_norm"):
            xi, wi = _leaf(x), _leaf(w)
            if op == "F.rms_norm":
                out = self._call(fn, xi, ns, weight=wi, eps=case.eps)
            else:
                out = self._call(fn, xi, ns, wi, case.eps)
            tb = self._baseline(lambda: _f_torch("rms_norm", I, (ns,), dict(eps=case.eps), bias=False))
            self._meta("out", out, x.shape, x.dtype, keep)
            self._values("out", out, ref[0], tb and tb[0], None, case.sensitive)
            if op == "F.rms_norm":
                self._autograd(case, out, (xi, wi), I, lambda: self._oracle(
                    "_fused_rms_norm_backward", up(g), x64, ns, ref[1], up(w), mask), tb and tb[1])
                self._gradgrad(case, fn, I, lambda f, a, c, d: f(a, ns, weight=c, eps=case.eps),
                               lambda a, c, d: self.O._fused_rms_norm(a, ns, c, eps64)[0])
            return
        got = self._call(fn, x, ns, w, case.eps)
        tb = self._baseline(lambda: self.torch.aten(op)(x, ns, w, case.eps))
        out, rstd = got
        self._meta("out", out, x.shape, x.dtype, keep + (("contiguous",) if keep[0] != "contiguous" else ()))
        self._values("out", out, ref[0], tb and tb[0], None, case.sensitive)
        self._stats_meta(case, (("rstd", rstd),), stat_shape, cpu_variant=False,
                         expected=_acc(case.input_dtype))
        self._values("rstd", rstd, ref[1], tb and tb[1], None, case.sensitive, rule="saved_stats")
        bname = "_fused_rms_norm_backward"
        bfn = self.backend.aten(bname)
        if bfn is None:
            self.not_present.setdefault(bname, "not present")
            return
        self._op = bname
        try:
            grads = self._call(bfn, g, x, ns, rstd, w, mask)
        except _NotOnDevice:
            self.not_present.setdefault(bname, f"not available on {self.dev_type}")
            return
        ref_g = self._oracle(bname, up(g), x64, ns, up(rstd), up(w), mask)
        base = base_ref = None
        if tb is not None:
            base = self._baseline(lambda: self.torch.aten(bname)(g, x, ns, tb[1], w, mask))
            if base is not None:
                base_ref = self._oracle(bname, up(g), x64, ns, up(tb[1]), up(w), mask)
        metas = [(x.shape, x.dtype, ("contiguous",)), (tuple(ns), w.dtype if w is not None else x.dtype, ())]
        self._check_grads(("grad_input", "grad_weight"), grads, ref_g, base, base_ref, metas, mask,
                          case.sensitive, "grads", bname)
