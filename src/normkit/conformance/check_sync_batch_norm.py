"""Checks of the SyncBatchNorm primitives (family ``sync_batch_norm``, `_run_sync_batch_norm`).

``batch_norm_stats``, ``batch_norm_gather_stats(_with_counts)`` (running-stat update included),
``batch_norm_elemt``, ``batch_norm_backward_reduce`` and ``batch_norm_backward_elemt``, each on simulated
ranks and fed what torch's ``SyncBatchNorm`` would feed it, computed by the oracle (contract §3).
"""

from __future__ import annotations

import math

import torch

from normkit.conformance._util import _acc, _clone, up
from normkit.conformance.cases import Case, make_inputs
from normkit.conformance.rules import judge


class SyncBatchNormChecks:
    """Mixin of `Runner` (whose judging helpers it uses): the SyncBatchNorm primitives."""

    # ------------------------------------------------------------------ SyncBatchNorm primitives
    def _run_sync_batch_norm(self, case: Case, fn):
        """One primitive of the SyncBatchNorm pipeline (contract §3) on simulated ranks.

        Inputs are what torch's ``SyncBatchNorm`` would hand the primitive: per-rank stats from the oracle's
        batch_norm_stats, global stats from its gather, all-reduced backward sums; each rounded to the
        dtype SyncBatchNorm uses (stats in the acc dtype, counts in the running-stat dtype for the gather
        and int32 for backward_elemt, weight cast to the stats dtype for backward_elemt).
        """
        op = self._op = case.op
        I = make_inputs(case, self.device)
        x, w, b, g = I["x"], I["weight"], I["bias"], I["grad_out"]
        C = x.shape[1]
        ranks = case.ranks or (x.shape[0],)
        bounds = [sum(ranks[:i]) for i in range(len(ranks) + 1)]
        xs = [x[bounds[i]:bounds[i + 1]] for i in range(len(ranks))]
        gs = [g[bounds[i]:bounds[i + 1]] for i in range(len(ranks))]
        hw = math.prod(x.shape[2:])
        counts = [r * hw for r in ranks]
        acc = _acc(x.dtype)  # stats dtype: fp32 for fp16/bf16 inputs, else the input's (§3)
        eps, m = case.eps, case.momentum
        rm0, rv0 = I["running_mean"], I["running_var"]
        cdt = rm0.dtype if rm0 is not None else x.dtype  # counts of the gather: the running-stat dtype (§3)

        if op == "batch_norm_stats":
            for i, xr in enumerate(xs):
                mean, invstd = self._call(fn, xr, eps)
                ref = self._oracle(op, up(xr), eps)
                base = self._baseline(lambda: self.torch.aten(op)(xr, eps))
                for j, (name, t) in enumerate((("mean", mean), ("invstd", invstd))):
                    self._meta(f"rank{i}.{name}", t, (C,), acc, ())
                    self._values(f"rank{i}.{name}", t, ref[j], base and base[j], None, case.sensitive)
            return

        # the per-rank stats and global stats every later primitive starts from (oracle, rounded)
        local = [self._oracle("batch_norm_stats", up(xr), eps) for xr in xs]
        mean_all = torch.stack([s[0] for s in local]).to(self.device, acc)
        invstd_all = torch.stack([s[1] for s in local]).to(self.device, acc)

        if op in ("batch_norm_gather_stats_with_counts", "batch_norm_gather_stats"):
            rm, rv = _clone(rm0), _clone(rv0)
            if op == "batch_norm_gather_stats":
                if len(set(counts)) != 1:
                    raise ValueError(f"{case.name}: batch_norm_gather_stats needs equal counts, got {counts}")
                extra = counts[0]
                cnt64 = torch.full((len(counts),), float(counts[0]), dtype=torch.float64)
            else:
                extra = torch.tensor(counts, dtype=cdt, device=self.device)
                cnt64 = up(extra)
            got = self._call(fn, x, mean_all, invstd_all, rm, rv, m, eps, extra, mutable=(rm, rv))
            rm64, rv64 = _clone(up(rm0)), _clone(up(rv0))
            ref = self._oracle("batch_norm_gather_stats_with_counts", up(x), up(mean_all), up(invstd_all),
                               rm64, rv64, m, eps, cnt64)
            trm, trv = _clone(rm0), _clone(rv0)
            base = self._baseline(lambda: self.torch.aten(op)(x, mean_all, invstd_all, trm, trv, m, eps, extra))
            for j, name in enumerate(("mean", "invstd")):
                t = got[j] if got is not None and len(got) > j else None
                self._meta(name, t, (C,), acc, ())
                self._values(name, t, ref[j], base and base[j], None, case.sensitive)
            if rm is None:
                return
            r = self._rule("running_stats")
            for name, t, t0 in (("running_mean", rm, rm0), ("running_var", rv, rv0)):
                if t.dtype != t0.dtype or tuple(t.shape) != tuple(t0.shape):
                    r.add(False, f"{name}: dtype/shape changed to {t.dtype} {tuple(t.shape)}")
            self._values("running_mean", rm, rm64, base and trm, None, case.sensitive, rule="running_stats")
            before = r.ok
            self._values("running_var", rv, rv64, base and trv, None, case.sensitive, rule="running_stats")
            if before and not r.ok:
                n = cnt64.sum()
                m2 = (1.0 / ref[1].double() ** 2 - eps) * n
                biased = (1 - m) * up(rv0) + m * m2 / n
                if judge("rv", rv, biased, None, dtype=rv.dtype).passed:
                    r.add(False, "running_var updated with the biased variance M2/n (expected unbiased M2/(n-1))")
            return

        gathered = self._oracle("batch_norm_gather_stats_with_counts", up(x), up(mean_all), up(invstd_all), None,
                                None, m, eps, torch.tensor(counts, dtype=torch.float64))
        mean, invstd = gathered[0].to(self.device, acc), gathered[1].to(self.device, acc)

        if op == "batch_norm_elemt":
            for i, xr in enumerate(xs):
                out = self._call(fn, xr, w, b, mean, invstd, eps)
                ref = self._oracle(op, up(xr), up(w), up(b), up(mean), up(invstd), eps)
                base = self._baseline(lambda: self.torch.aten(op)(xr, w, b, mean, invstd, eps))
                self._meta(f"rank{i}.out", out, xr.shape, xr.dtype, self._grad_formats(xr))
                self._values(f"rank{i}.out", out, ref, base, None, case.sensitive)
            return

        wg, bg = w is not None, b is not None and w is not None  # CUDA needs weight for grad_bias (§3)
        if op == "batch_norm_backward_reduce":
            pdt = w.dtype if w is not None else x.dtype
            for i, (xr, gr) in enumerate(zip(xs, gs)):
                got = self._call(fn, gr, xr, mean, invstd, w, True, wg, bg)
                ref = self._oracle(op, up(gr), up(xr), up(mean), up(invstd), up(w), True, wg, bg)
                base = self._baseline(lambda: self.torch.aten(op)(gr, xr, mean, invstd, w, True, wg, bg))
                metas = [((C,), acc, ()), ((C,), acc, ()), ((C,), pdt, ()), ((C,), pdt, ())]
                self._check_grads([f"rank{i}.{n}" for n in ("sum_dy", "sum_dy_xmu", "grad_weight", "grad_bias")],
                                  got, ref, base, None, metas, [True, True, wg, bg], case.sensitive, "grads", op)
            return

        if op == "batch_norm_backward_elemt":
            sums = [self._oracle("batch_norm_backward_reduce", up(gr), up(xr), up(mean), up(invstd), up(w),
                                 True, False, False) for xr, gr in zip(xs, gs)]
            sum_dy = sum(s[0] for s in sums).to(self.device, acc)  # the all_reduce(SUM), rounded
            sum_dy_xmu = sum(s[1] for s in sums).to(self.device, acc)
            count = torch.tensor(counts, dtype=torch.int32, device=self.device)
            wa = w.to(acc) if w is not None else None  # SyncBatchNorm casts weight to the stats dtype
            for i, (xr, gr) in enumerate(zip(xs, gs)):
                gi = self._call(fn, gr, xr, mean, invstd, wa, sum_dy, sum_dy_xmu, count)
                ref = self._oracle(op, up(gr), up(xr), up(mean), up(invstd), up(wa), up(sum_dy), up(sum_dy_xmu),
                                   count.cpu())
                base = self._baseline(lambda: self.torch.aten(op)(gr, xr, mean, invstd, wa, sum_dy, sum_dy_xmu,
                                                                  count))
                self._check_grads((f"rank{i}.grad_input",), (gi,), (ref,), None if base is None else (base,), None,
                                  [(xr.shape, xr.dtype, self._grad_formats(xr))], [True], case.sensitive,
                                  "grads", op)
            return
        raise ValueError(f"unknown sync_batch_norm op {op}")
