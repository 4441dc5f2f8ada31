"""Checks of the group norm and instance norm families (`_run_group_norm`, `_run_instance_norm`).

``native_group_norm``: output (memory format included), saved (N, G) mean / rstd and the paired backward;
``F.group_norm`` with autograd and double backward. Instance norm (``F.instance_norm``, aten
``instance_norm``) against the oracle's batch norm on the (1, N*C, *) view, running stats included.
"""

from __future__ import annotations

import math

import torch

from normkit.conformance._util import _affine_grad_dtype, _clone, _f_torch, _f_with_running_stats_torch, _leaf, up
from normkit.conformance.cases import Case, make_inputs
from normkit.conformance.rules import suggested_format


class GroupNormChecks:
    """Mixin of `Runner` (whose judging helpers it uses): the group norm and instance norm families."""

    # ------------------------------------------------------------------ group norm
    def _run_group_norm(self, case: Case, fn):
        op = self._op = case.op
        I = make_inputs(case, self.device)
        x, w, b, g = I["x"], I["weight"], I["bias"], I["grad_out"]
        N, C = x.shape[0], x.shape[1]
        HxW = math.prod(x.shape[2:])
        G = case.groups
        x64 = up(x)
        ref = self._oracle("native_group_norm", x64, up(w), up(b), N, C, HxW, G, case.eps)
        mask = list(case.mask or (True, w is not None, b is not None))
        fmts = (suggested_format(x),) if self.dev_type == "cpu" else (suggested_format(x), "contiguous")
        if op == "F.group_norm":
            xi, wi, bi = _leaf(x), _leaf(w), _leaf(b)
            out = self._call(fn, xi, G, weight=wi, bias=bi, eps=case.eps)
            tb = self._baseline(lambda: _f_torch("group_norm", I, (G,), dict(eps=case.eps), bias=True))
            self._meta("out", out, x.shape, x.dtype, fmts)
            self._values("out", out, ref[0], tb and tb[0], None, case.sensitive)
            self._autograd(case, out, (xi, wi, bi), I, lambda: self._oracle(
                "native_group_norm_backward", up(g), x64, ref[1], ref[2], up(w), N, C, HxW, G, mask),
                tb and tb[1])
            self._gradgrad(case, fn, I, lambda f, a, c, d: f(a, G, weight=c, bias=d, eps=case.eps),
                           lambda a, c, d: self.O.native_group_norm(a, c, d, N, C, HxW, G, case.eps)[0])
            return
        got = self._call(fn, x, w, b, N, C, HxW, G, case.eps)
        tb = self._baseline(lambda: self.torch.aten(op)(x, w, b, N, C, HxW, G, case.eps))
        out, mean, rstd = got
        self._meta("out", out, x.shape, x.dtype, fmts)
        self._values("out", out, ref[0], tb and tb[0], None, case.sensitive)
        sdt = torch.float32 if case.mixed else case.input_dtype
        self._stats_meta(case, (("mean", mean), ("rstd", rstd)), (N, G), cpu_variant=False, expected=sdt)
        self._values("mean", mean, ref[1], tb and tb[1], None, case.sensitive, rule="saved_stats")
        self._values("rstd", rstd, ref[2], tb and tb[2], None, case.sensitive, rule="saved_stats")
        bname = "native_group_norm_backward"
        bfn = self.backend.aten(bname)
        if bfn is None:
            self.not_present.setdefault(bname, "not present")
            return
        if x.numel() == 0 or not case.backward:
            return
        self._op = bname
        gg = g.contiguous(memory_format=_mf(suggested_format(x)))
        grads = self._call(bfn, gg, x, mean, rstd, w, N, C, HxW, G, mask)
        ref_g = self._oracle(bname, up(g), x64, up(mean), up(rstd), up(w), N, C, HxW, G, mask)
        base = base_ref = None
        if tb is not None:
            base = self._baseline(lambda: self.torch.aten(bname)(gg, x, tb[1], tb[2], w, N, C, HxW, G, mask))
            if base is not None:
                base_ref = self._oracle(bname, up(g), x64, up(tb[1]), up(tb[2]), up(w), N, C, HxW, G, mask)
        # grad_weight / grad_bias: the weight's dtype, else that of the mean passed (fp32 when a bias made the call
        # mixed), as batch norm's rule
        pdt = _affine_grad_dtype(x, w, mean)
        metas = [(x.shape, x.dtype, self._grad_formats(x)), ((C,), pdt, ()), ((C,), pdt, ())]
        self._check_grads(("grad_input", "grad_weight", "grad_bias"), grads, ref_g, base, base_ref, metas, mask,
                          case.sensitive, "grads", bname)

    # ------------------------------------------------------------------ instance norm
    def _run_instance_norm(self, case: Case, fn):
        op = self._op = case.op
        I = make_inputs(case, self.device)
        x, w, b = I["x"], I["weight"], I["bias"]
        rm, rv = _clone(I["running_mean"]), _clone(I["running_var"])
        rm0 = _clone(rm)
        use_input_stats = case.training
        xi, wi, bi = _leaf(x), _leaf(w), _leaf(b)
        if op == "F.instance_norm":
            out = self._call(fn, xi, running_mean=rm, running_var=rv, weight=wi, bias=bi,
                             use_input_stats=use_input_stats, momentum=case.momentum, eps=case.eps,
                             mutable=(rm, rv) if use_input_stats else ())
        else:
            out = self._call(fn, xi, wi, bi, rm, rv, use_input_stats, case.momentum, case.eps, False,
                             mutable=(rm, rv) if use_input_stats else ())
        ref = self._in_oracle(case, I)
        tb = self._baseline(lambda: _f_with_running_stats_torch("instance_norm", I, case))
        self._meta("out", out, x.shape, x.dtype, ("contiguous",))  # aten normalizes input.contiguous() (§6)
        self._values("out", out, ref["out"], tb and tb[0], None, case.sensitive)
        if rm is not None:
            r = self._rule("running_stats")
            if not use_input_stats:
                same = torch.equal(rm, rm0) and torch.equal(rv, I["running_var"])
                r.add(same, "untouched when using running stats" if same else "running stats modified")
            else:
                self._values("running_mean", rm, ref["rm"], tb and tb[1][0], None, case.sensitive,
                             rule="running_stats")
                self._values("running_var", rv, ref["rv"], tb and tb[1][1], None, case.sensitive,
                             rule="running_stats")
        if op == "F.instance_norm":
            self._autograd(case, out, (xi, wi, bi), I, lambda: ref["grads"](), tb and tb[2])

    def _in_oracle(self, case, I):
        """Instance norm = batch norm on the (1, N*C, *) view (contract §6), evaluated by the oracle."""
        x64 = up(I["x"])
        N, C = x64.shape[0], x64.shape[1]
        xv = x64.contiguous().view(1, N * C, *x64.shape[2:])
        rep = (lambda t: None if t is None else up(t).repeat(N))
        w, b = rep(I["weight"]), rep(I["bias"])
        rm, rv = rep(I["running_mean"]), rep(I["running_var"])
        o = self._oracle("native_batch_norm", xv, w, b, rm, rv, case.training, case.momentum, case.eps)
        res = {"out": o[0].view(x64.shape)}
        if rm is not None:
            res["rm"], res["rv"] = rm.view(N, C).mean(0), rv.view(N, C).mean(0)

        def grads():
            mask = [True, w is not None, b is not None]
            gv = up(I["grad_out"]).contiguous().view(xv.shape)
            gi, gw, gb = self._oracle("native_batch_norm_backward", gv, xv, w, rep(I["running_mean"]),
                                      rep(I["running_var"]), o[1], o[2], case.training, case.eps, mask)
            return [gi.view(x64.shape), None if gw is None else gw.view(N, C).sum(0),
                    None if gb is None else gb.view(N, C).sum(0)]

        res["grads"] = grads
        return res


# ---------------------------------------------------------------------- invocation helpers


def _mf(fmt):
    return {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last,
            "channels_last_3d": torch.channels_last_3d}[fmt]

