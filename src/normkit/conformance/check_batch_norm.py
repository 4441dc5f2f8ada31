"""Checks of the batch norm family (`_run_batch_norm`).

The aten forwards (``native_batch_norm``, ``_native_batch_norm_legit*``, ``_batch_norm_with_update`` /
``_no_update``, ``batch_norm_update_stats``) with their output, saved statistics (invstd, not variance;
the eval-mode conventions) and the in-place running-stat update (unbiased variance), each forward's
paired backward fed its own saved statistics, and ``F.batch_norm`` with its autograd and double backward.
"""

from __future__ import annotations

import torch

from normkit.conformance._util import _acc, _affine_grad_dtype, _clone, _f_with_running_stats_torch, _leaf, up
from normkit.conformance.cases import Case, make_inputs
from normkit.conformance.rules import judge, suggested_format


class BatchNormChecks:
    """Mixin of `Runner` (whose judging helpers it uses): the batch norm family."""

    # ------------------------------------------------------------------ batch norm
    def _run_batch_norm(self, case: Case, fn):
        op = self._op = case.op
        I = make_inputs(case, self.device)
        x, w, b = I["x"], I["weight"], I["bias"]
        C = x.shape[1]
        if op == "F.batch_norm":
            return self._functional_bn(case, fn, I)
        tr = {"_native_batch_norm_legit_no_training": False, "_batch_norm_no_update": False,
              "_batch_norm_with_update": True}.get(op, case.training)
        rm, rv = _clone(I["running_mean"]), _clone(I["running_var"])
        rm0, rv0 = _clone(rm), _clone(rv)
        got = self._call(_bn_invoke, fn, op, I, rm, rv, tr, case, mutable=(rm, rv) if tr else ())
        rm64, rv64 = up(rm0), up(rv0)
        x64 = up(x)
        tb = self._baseline(lambda: _bn_forward_with_stats(self.torch.aten(op), op, I, tr, case))

        if op == "batch_norm_update_stats":
            ref = self._oracle("batch_norm_update_stats", x64, rm64, rv64, case.momentum)
            self._stats_meta(case, (("mean", got[0]), ("var", got[1])), (C,), cpu_variant=True, rule="meta")
            for i, name in enumerate(("mean", "var")):
                self._values(name, got[i], ref[i], tb and tb[0][i], None, case.sensitive)
            self._running(case, rm, rv, rm0, rv0, None, None, tb and tb[1], training=True)
            return

        out, sm, si = got[0], got[1], got[2]
        ref = self._bn_oracle(x64, up(w), up(b), rm64, rv64, tr, case)
        # meta: output keeps the input's suggested memory format, dtype = input dtype
        self._meta("out", out, x.shape, x.dtype, (suggested_format(x),))
        if op in ("_batch_norm_with_update", "_batch_norm_no_update"):
            res = got[3] if len(got) > 3 else None
            self._meta("reserve", res, res.shape if res is not None else (0,), torch.uint8, ())
        self._values("out", out, ref[0], tb and tb[0][0], None, case.sensitive)
        self._saved_stats_bn(case, x, sm, si, ref, tr, rm0, rv0, tb)
        self._running(case, rm, rv, rm0, rv0, ref[3], ref[4], tb and tb[1], training=tr)

        # backward paired with this forward, fed its own saved statistics
        bname = "batch_norm_backward" if op.startswith("_batch_norm_") else "native_batch_norm_backward"
        bfn = self.backend.aten(bname)
        if bfn is None:
            self.not_present.setdefault(bname, "not present")
            return
        if bname == "batch_norm_backward" and w is None:
            return  # batch_norm_backward requires weight (contract §2.6)
        if x.numel() == 0:
            return
        mask = list(case.mask or (True, w is not None, b is not None))
        g = I["grad_out"]
        self._op = bname
        reserve = got[3] if len(got) > 3 else None
        grads = self._call(_bn_backward_invoke, bfn, bname, g, x, w, rm, rv, sm, si, tr, case.eps, mask, reserve)
        g64 = up(g)
        ref_g = self._oracle("native_batch_norm_backward", g64, x64, up(w), up(rm), up(rv), up(sm), up(si), tr,
                             case.eps, mask)
        base = base_ref = None
        if tb is not None:
            tfn = self.torch.aten(bname)
            t_out, t_stats = tb
            tg = self._baseline(lambda: _bn_backward_invoke(
                tfn, bname, g, x, w, t_stats[0], t_stats[1], t_out[1], t_out[2], tr, case.eps, mask,
                t_out[3] if len(t_out) > 3 else None))
            if tg is not None:
                base = tg
                base_ref = self._oracle("native_batch_norm_backward", g64, x64, up(w), up(t_stats[0]),
                                        up(t_stats[1]), up(t_out[1]), up(t_out[2]), tr, case.eps, mask)
        # grad_weight and grad_bias: the dtype of the first of (weight, running stats, this implementation's own
        # saved stats) passed to the backward (the bias is not: a bf16 one of a pure-bf16 call may get an fp32
        # gradient from fp32 saved stats, which autograd rounds once)
        pdt = _affine_grad_dtype(x, w, rm, rv, sm, si)
        metas = [(x.shape, x.dtype, self._grad_formats(x)), ((C,), pdt, ()), ((C,), pdt, ())]
        self._check_grads(("grad_input", "grad_weight", "grad_bias"), grads, ref_g, base, base_ref, metas, mask,
                          case.sensitive, "grads", bname)

    def _bn_oracle(self, x64, w64, b64, rm64, rv64, training, case):
        """(out, save_mean, save_invstd, running_mean_after, running_var_after) in float64."""
        rm64, rv64 = _clone(rm64), _clone(rv64)
        if x64.numel() == 0:
            e = x64.new_empty((0,))
            return torch.empty_like(x64), e, e, rm64, rv64
        o = self._oracle("native_batch_norm", x64, w64, b64, rm64, rv64, training, case.momentum, case.eps)
        return o[0], o[1], o[2], rm64, rv64

    def _saved_stats_bn(self, case, x, sm, si, ref, training, rm0, rv0, tb):
        r = self._rule("saved_stats")
        C = x.shape[1]
        if sm is None or si is None:
            r.add(False, "saved mean/invstd missing (None)")
            return
        if not training:
            if sm.numel() == 0 and si.numel() == 0:
                r.add(True, "eval saved stats empty (0,) [CPU/MPS convention]")
                return
            rm64, rv64 = up(rm0), up(rv0)
            exp_invstd = torch.rsqrt(rv64 + case.eps)
            if tuple(sm.shape) == (C,) and tuple(si.shape) == (C,):
                vm = judge("save_mean", sm, rm64, None, dtype=sm.dtype)
                vi = judge("save_invstd", si, exp_invstd, None, dtype=si.dtype)
                if vm.passed and vi.passed:
                    r.add(True, "eval saved stats filled = (running_mean, rsqrt(running_var+eps)) [CUDA variant]")
                    return
                why = vm.detail if not vm.passed else vi.detail
                if judge("save_invstd", si, rv64, None, dtype=si.dtype).passed:
                    why = "save_invstd holds the running variance, not rsqrt(running_var+eps)"
                r.add(False, f"eval saved stats neither empty (0,) nor (running_mean, invstd): {why}")
            else:
                r.add(False, f"eval saved stats have shapes {tuple(sm.shape)}, {tuple(si.shape)}; "
                             "expected empty (0,) or (C,) [CUDA variant]")
            return
        # training: (C,), invstd not variance; fp32 stats for half inputs, CPU keeps the input dtype
        acc = torch.float32 if case.mixed else _acc(case.input_dtype)
        allowed = (acc,) if (case.mixed or acc == case.input_dtype) else (acc, case.input_dtype)
        for name, t in (("save_mean", sm), ("save_invstd", si)):
            if tuple(t.shape) != (C,):
                r.add(False, f"{name}: shape {tuple(t.shape)} != ({C},)")
            elif t.dtype not in allowed:
                r.add(False, f"{name}: dtype {t.dtype} not in {list(allowed)}")
            elif t.dtype != acc:
                r.add(True, f"{name}: {t.dtype} [CPU variant: stats in input dtype]")
        if r.bad:
            return
        tbo = tb[0] if tb is not None else None
        self._values("save_mean", sm, ref[1], tbo and tbo[1], None, case.sensitive, rule="saved_stats")
        before = r.ok
        self._values("save_invstd", si, ref[2], tbo and tbo[2], None, case.sensitive, rule="saved_stats")
        if before and not r.ok:
            var = 1.0 / ref[2].double() ** 2 - case.eps
            if judge("var", si, var, None, dtype=si.dtype).passed or judge("var", si, 1.0 / ref[2].double() ** 2,
                                                                          None, dtype=si.dtype).passed:
                r.add(False, "save_invstd holds the variance, not invstd = rsqrt(var + eps)")

    def _running(self, case, rm, rv, rm0, rv0, ref_rm, ref_rv, tbs, training):
        """Running stats: in-place update with the unbiased variance in training; untouched in eval."""
        if rm is None:
            return
        r = self._rule("running_stats")
        if not training:
            same = torch.equal(rm, rm0) and torch.equal(rv, rv0)
            r.add(same, "untouched in eval" if same else "running stats modified in eval mode")
            return
        x64 = up(make_inputs(case, self.device)["x"])
        dims = [0] + list(range(2, x64.dim()))
        n = x64.numel() // x64.shape[1]
        m = case.momentum
        if ref_rm is None:  # batch_norm_update_stats: the contract's update formula (§2.3)
            ref_rm = (1 - m) * up(rm0) + m * x64.mean(dims)
            ref_rv = (1 - m) * up(rv0) + m * x64.var(dims, unbiased=False) * n / (n - 1)
        if rm.dtype != rm0.dtype:
            r.add(False, f"running stats dtype changed to {rm.dtype}")
        tbs = tbs or (None, None)
        self._values("running_mean", rm, ref_rm, tbs[0], None, case.sensitive, rule="running_stats")
        before = r.ok
        self._values("running_var", rv, ref_rv, tbs[1], None, case.sensitive, rule="running_stats")
        if before and not r.ok:
            biased = (1 - m) * up(rv0) + m * x64.var(dims, unbiased=False)
            if judge("rv", rv, biased, None, dtype=rv.dtype).passed:
                r.add(False, "running_var updated with the biased variance (expected unbiased n/(n-1))")

    def _functional_bn(self, case, fn, I):
        x, w, b = I["x"], I["weight"], I["bias"]
        rm, rv = _clone(I["running_mean"]), _clone(I["running_var"])
        rm0 = _clone(rm)
        versions = None if rm is None else (rm._version, rv._version)
        xi, wi, bi = _leaf(x), _leaf(w), _leaf(b)
        out = self._call(fn, xi, running_mean=rm, running_var=rv, weight=wi, bias=bi, training=case.training,
                         momentum=case.momentum, eps=case.eps, mutable=(rm, rv) if case.training else ())
        if versions is not None and case.training:
            # aten's kernels write running stats without bumping their autograd version: an eval-mode call saved
            # them for its backward, which a training step in between must not make raise
            same = (rm._version, rv._version) == versions
            self._rule("running_stats").add(same, "autograd version unchanged by the update" if same else
                                            "the update bumped the running stats' autograd version (an eval-mode "
                                            "backward that saved them then raises)")
        x64 = up(x)
        use_batch = case.training or rm is None
        ref = self._bn_oracle(x64, up(w), up(b), up(rm0), up(I["running_var"]), use_batch, case)
        tb = self._baseline(lambda: _f_with_running_stats_torch("batch_norm", I, case))
        self._meta("out", out, x.shape, x.dtype, (suggested_format(x),))
        self._values("out", out, ref[0], tb and tb[0], None, case.sensitive)
        if rm is not None:
            if x.numel() == 0:
                ok = torch.equal(rm, rm0)
                self._rule("running_stats").add(ok, "untouched for an empty batch" if ok else
                                                "running stats changed by an empty batch")
            else:
                self._running(case, rm, rv, rm0, I["running_var"], ref[3], ref[4], tb and tb[1],
                              training=case.training)
        self._autograd(case, out, (xi, wi, bi), I, lambda: self._bn_oracle_grads(case, I, ref, use_batch),
                       tb and tb[2])
        rs = (I["running_mean"], I["running_var"])
        self._gradgrad(case, fn, I, lambda f, a, c, d: f(
            a, running_mean=_clone(rs[0]), running_var=_clone(rs[1]), weight=c, bias=d, training=case.training,
            momentum=case.momentum, eps=case.eps), lambda a, c, d: self.O.native_batch_norm(
            a, c, d, up(rs[0]), up(rs[1]), use_batch, case.momentum, case.eps)[0])

    def _bn_oracle_grads(self, case, I, ref, use_batch):
        x, w, b, g = I["x"], I["weight"], I["bias"], I["grad_out"]
        mask = [True, w is not None, b is not None]
        if x.numel() == 0:
            C = x.shape[1]
            z = torch.zeros(C, dtype=torch.float64)
            return [torch.empty(x.shape, dtype=torch.float64), z, z]
        return self._oracle("native_batch_norm_backward", up(g), up(x), up(w), up(I["running_mean"]),
                            up(I["running_var"]), ref[1], ref[2], use_batch, case.eps, mask)


# ---------------------------------------------------------------------- invocation helpers


def _bn_invoke(fn, op, I, rm, rv, training, case):
    x, w, b, m, eps = I["x"], I["weight"], I["bias"], case.momentum, case.eps
    if op in ("native_batch_norm", "_native_batch_norm_legit"):
        return tuple(fn(x, w, b, rm, rv, training, m, eps))
    if op == "_native_batch_norm_legit_no_stats":
        return tuple(fn(x, w, b, training, m, eps))
    if op in ("_native_batch_norm_legit_no_training", "_batch_norm_with_update", "_batch_norm_no_update"):
        return tuple(fn(x, w, b, rm, rv, m, eps))
    if op == "batch_norm_update_stats":
        return tuple(fn(x, rm, rv, m))
    raise ValueError(op)


def _bn_forward_with_stats(fn, op, I, training, case):
    rm, rv = _clone(I["running_mean"]), _clone(I["running_var"])
    return _bn_invoke(fn, op, I, rm, rv, training, case), (rm, rv)


def _bn_backward_invoke(fn, name, g, x, w, rm, rv, sm, si, training, eps, mask, reserve):
    if name == "batch_norm_backward":
        if reserve is None:
            reserve = torch.empty(0, dtype=torch.uint8, device=x.device)
        return tuple(fn(g, x, w, rm, rv, sm, si, training, eps, mask, reserve))
    return tuple(fn(g, x, w, rm, rv, sm, si, training, eps, mask))

