"""Run cases against a backend and judge them with the rules.

For each case the runner builds fresh inputs, calls the backend, calls the float64 oracle
(`normkit.reference` by default) on the backend's exact rounded inputs upcast to float64, and, when
the backend is not torch itself, calls torch's own kernel on the same inputs for the "2x ATen"
criterion. Backward entry points are fed the forward's own saved statistics; the oracle backward
then sees those same statistics upcast (they are inputs of the backward). Gradients through the
functional API's autograd are compared with the oracle's exact gradient, and for the cases marked
``gradgrad`` their double backward with the oracle's.

The SyncBatchNorm primitives (family ``sync_batch_norm``) run on simulated ranks: each primitive is fed
what torch's ``SyncBatchNorm`` would feed it, computed by the oracle. torch has no CPU kernels for them;
like any op without a kernel on the device ("Could not run ..."), they are reported not present there.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
import traceback
import warnings

import torch

from normkit.conformance import rules
from normkit.conformance.backends import Backend, TorchBackend
from normkit.conformance.cases import SYNC_OPS, Case, ErrorCase, make_inputs, seed_of
from normkit.conformance.rules import Result, check_meta, judge, suggested_format

ORACLE_NEEDS = (
    "native_batch_norm", "native_batch_norm_backward", "batch_norm_update_stats",
    "native_layer_norm", "native_layer_norm_backward", "_fused_rms_norm", "_fused_rms_norm_backward",
    "native_group_norm", "native_group_norm_backward",
)


ORACLE_NEEDS_SYNC = SYNC_OPS  # only when the sync_batch_norm family is selected


def load_oracle(name: str = "normkit.reference", families=None):
    module = importlib.import_module(name)
    needs = ORACLE_NEEDS + (ORACLE_NEEDS_SYNC if families is not None and "sync_batch_norm" in families else ())
    missing = [n for n in needs if not callable(getattr(module, n, None))]
    return module, missing


def up(t):
    """Upcast to float64 on the CPU (exact for every float dtype); None stays None."""
    if t is None:
        return None
    return t.detach().to("cpu", torch.float64, copy=True)


def _clone(t):
    return None if t is None else t.detach().clone()


def _acc(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _not_on_device(exc: BaseException) -> bool:
    msg = str(exc)
    return isinstance(exc, NotImplementedError) and "Could not run" in msg


class _Rule:
    """Collects the checks of one rule for one case into a single Result."""

    def __init__(self):
        self.ok = True
        self.ratio = 0.0
        self.notes = []
        self.bad = []
        self.used = False

    def add(self, ok: bool, detail: str, ratio: float = 0.0):
        self.used = True
        self.ok &= bool(ok)
        if ratio == ratio:  # not NaN
            self.ratio = max(self.ratio, ratio)
        (self.notes if ok else self.bad).append(detail)

    def verdict(self, v: rules.Verdict):
        self.add(v.passed, v.detail, v.ratio)


@dataclasses.dataclass
class CaseOutcome:
    case: str
    family: str
    op: str
    results: list

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)


class Runner:
    def __init__(self, backend: Backend, device: str = "cpu", oracle=None):
        self.backend = backend
        self.device = device
        self.dev_type = torch.device(device).type
        if oracle is None:
            oracle, missing = load_oracle()
            if missing:
                raise RuntimeError(f"normkit.reference lacks {', '.join(missing)}")
        self.O = oracle
        self.torch = TorchBackend()
        self.self_baseline = backend.runs_torch_kernels
        self.not_present = {}  # op -> why

    # ------------------------------------------------------------------ public
    def run_case(self, case: Case):
        if case.devices and self.dev_type not in case.devices:
            return None
        fn = self.backend.get(case.op)
        if fn is None:
            self.not_present.setdefault(case.op, "not present")
            return None
        self._rules = {}
        self._op = case.op
        self._half = case.half
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                getattr(self, "_run_" + case.family)(case, fn)
        except _NotOnDevice as e:
            self.not_present.setdefault(e.op, f"not available on {self.dev_type}")
            if not self._rules:
                return None
        except Exception as e:  # a crash of the backend (or the oracle) is a failure, not a stop
            where = getattr(e, "_nk_where", "call")
            self._rule("crash" if where != "oracle" else "oracle").add(
                False, f"{where}: {type(e).__name__}: {_short(e)}")
            if where != "oracle" and "NK_TRACE" in os.environ:
                traceback.print_exc()
        results = []
        for (op, rule), acc in self._rules.items():
            if not acc.used:
                continue
            detail = "; ".join(acc.bad) if acc.bad else "; ".join(acc.notes)
            results.append(Result(op, case.name, rule, acc.ok, detail, acc.ratio, case.family))
        return CaseOutcome(case.name, case.family, case.op, results)

    def run_error(self, ec: ErrorCase):
        if ec.devices and self.dev_type not in ec.devices:
            return None
        if ec.torch_only and not self.backend.runs_torch_kernels:
            return None
        op, build, note = ec.op, ec.build, ""
        if self.backend.is_torch and ec.via:
            op, build = ec.via, ec.via_build
            note = f"raw aten {ec.op}: unchecked by aten (would crash); checked through {ec.via}; "
        fn = self.backend.get(op)
        if fn is None:
            self.not_present.setdefault(op, "not present")
            return None
        args, kwargs = build(self.device)
        tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
        before = [t.detach().clone() for t in tensors]
        results = []
        try:
            fn(*args, **kwargs)
            raised = None
        except Exception as e:  # noqa: BLE001 -- we judge whatever it raised
            raised = e
        if raised is not None and _not_on_device(raised):  # no kernel on this device: not present
            self.not_present.setdefault(op, f"not available on {self.dev_type}")
            return None
        if raised is None:
            results.append(Result(op, ec.name, "error", False,
                                  note + f"no error raised; expected {ec.exc}: {ec.message}", 0.0, ec.family))
        else:
            got_type = type(raised).__name__
            msg = str(raised)
            type_ok = ec.exc == "Exception" or got_type == ec.exc or any(
                c.__name__ == ec.exc for c in type(raised).__mro__)
            check_msg = ec.message is not None and self.dev_type in ec.message_devices
            msg_ok = (not check_msg) or msg.strip().startswith(ec.message)
            ok = type_ok and msg_ok
            detail = note + (f"raised {got_type}: {_short(raised)}" if ok else
                             f"raised {got_type}: {_short(raised)!r}; expected {ec.exc}: {ec.message!r}")
            results.append(Result(op, ec.name, "error", ok, detail, 0.0, ec.family))
        if tensors and raised is not None:
            changed = [i for i, (a, b) in enumerate(zip(tensors, before))
                       if a.shape != b.shape or not torch.equal(a.detach().nan_to_num(7.0), b.nan_to_num(7.0))]
            results.append(Result(op, ec.name, "error_state", not changed,
                                  "tensor arguments untouched" if not changed else
                                  f"tensor argument(s) {changed} modified by a call that raised", 0.0, ec.family))
        return CaseOutcome(ec.name, ec.family, op, results)

    # ------------------------------------------------------------------ helpers
    def _rule(self, name, op=None):
        key = (op or self._op, name)
        if key not in self._rules:
            self._rules[key] = _Rule()
        return self._rules[key]

    def _oracle(self, name, *args):
        try:
            return getattr(self.O, name)(*args)
        except Exception as e:
            _mark(e, "oracle")
            raise

    def _baseline(self, thunk):
        """Run torch's own kernel for criterion B; None where it has none or it refuses."""
        if self.self_baseline:
            return None
        try:
            return thunk()
        except Exception:  # noqa: BLE001 -- torch may not support this input on this device
            return None

    def _values(self, name, got, ref, base=None, base_ref=None, sensitive=False, rule="values", op=None):
        if got is None:
            self._rule(rule, op).add(False, f"{name}: missing (None)")
            return
        if base is not None and base_ref is not None and base_ref is not ref:
            # criterion B measures ATen against the oracle at ATen's own inputs
            base = _Shifted(base, base_ref, ref)
        v = judge(name, got, ref, base.value if isinstance(base, _Shifted) else base,
                  dtype=got.dtype, sensitive=sensitive, half=self._half, self_baseline=self.self_baseline)
        self._rule(rule, op).verdict(v)

    def _meta(self, name, got, shape, dtype, formats, rule="meta", op=None):
        if got is None:
            self._rule(rule, op).add(False, f"{name}: missing (None)")
            return
        ok, detail = check_meta(name, got, shape, dtype, formats)
        self._rule(rule, op).add(ok, detail)

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            if _not_on_device(e):
                raise _NotOnDevice(self._op) from e
            raise

    def _grad_formats(self, x):
        fmt = suggested_format(x)
        return (fmt,) if (self.dev_type == "cpu" or fmt == "contiguous") else (fmt, "contiguous")

    def _check_grads(self, names, got, ref, base, base_ref, expect_meta, mask, sensitive, rule, op):
        for i, name in enumerate(names):
            g = got[i] if got is not None and i < len(got) else None
            if not mask[i]:
                if g is not None and rule == "grads":
                    # CPU returns None for masked-out grads [CPU-verified, §2.6]; CUDA's batch_norm_backward
                    # returns them anyway: accepted as a device variant off the CPU
                    ok = self.dev_type != "cpu"
                    self._rule(rule, op).add(ok, f"{name}: masked out but returned" +
                                             (" [device variant]" if ok else " (expected None)"))
                continue
            if g is None:
                self._rule(rule, op).add(False, f"{name}: requested but None")
                continue
            shape, dtype, formats = expect_meta[i]
            self._meta(name, g, shape, dtype, formats, op=op)
            b = base[i] if base is not None else None
            br = base_ref[i] if base_ref is not None else None
            self._values(name, g, ref[i], b, br, sensitive, rule=rule, op=op)

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
        got = self._call(_bn_invoke, fn, op, I, rm, rv, tr, case)
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
        pdt = w.dtype if w is not None else (torch.float32 if case.mixed else case.param_dtype)
        metas = [(x.shape, x.dtype, self._grad_formats(x)), ((C,), pdt, ()),
                 ((C,), b.dtype if b is not None else pdt, ())]
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
        xi, wi, bi = _leaf(x), _leaf(w), _leaf(b)
        out = self._call(fn, xi, running_mean=rm, running_var=rv, weight=wi, bias=bi, training=case.training,
                         momentum=case.momentum, eps=case.eps)
        x64 = up(x)
        use_batch = case.training or rm is None
        ref = self._bn_oracle(x64, up(w), up(b), up(rm0), up(I["running_var"]), use_batch, case)
        tb = self._baseline(lambda: _f_bn_torch(I, case))
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

    def _autograd(self, case, out, leaves, I, oracle_grads, base_grads):
        """Backpropagate grad_out through `out`; compare leaf grads with the oracle's exact gradient."""
        if not case.backward:
            return
        r = self._rule("autograd")
        if out is None or not out.requires_grad:
            r.add(False, "output does not require grad (no autograd)")
            return
        g = I["grad_out"]
        try:
            with self.backend.scope():  # the backward of the backend's own graph
                out.backward(g)
        except Exception as e:
            _mark(e, "backward")
            raise
        ref = oracle_grads()
        x = I["x"]
        names = ("grad_input", "grad_weight", "grad_bias")
        for i, leaf in enumerate(leaves):
            if leaf is None:
                continue
            got = leaf.grad
            if got is None:
                r.add(False, f"{names[i]}: no gradient")
                continue
            src = (x, I["weight"], I["bias"])[i]
            fmts = self._grad_formats(x) if i == 0 else ()
            self._meta(names[i], got, src.shape, src.dtype, fmts)
            base = base_grads[i] if base_grads is not None else None
            self._values(names[i], got, ref[i], base, None, case.sensitive, rule="autograd")

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

    def _stats_meta(self, case, stats, shape, cpu_variant, expected=None, rule="saved_stats"):
        """Saved statistic shape/dtype: acc type (fp32 for half inputs); optionally the CPU input-dtype variant."""
        r = self._rule(rule)
        acc = expected or (torch.float32 if case.mixed else _acc(case.input_dtype))
        allowed = [acc]
        if cpu_variant and not case.mixed and acc != case.input_dtype:
            allowed.append(case.input_dtype)
        for name, t in stats:
            if t is None:
                r.add(False, f"{name}: missing (None)")
            elif tuple(t.shape) != tuple(shape):
                r.add(False, f"{name}: shape {tuple(t.shape)} != {tuple(shape)}")
            elif t.dtype not in allowed:
                r.add(False, f"{name}: dtype {t.dtype} not in {allowed}")
            elif t.dtype != acc:
                r.add(True, f"{name}: {t.dtype} [CPU variant: stats in input dtype]")
            else:
                r.add(True, f"{name}: ok")

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
        metas = [(x.shape, x.dtype, self._grad_formats(x)), ((C,), w.dtype if w is not None else x.dtype, ()),
                 ((C,), b.dtype if b is not None else x.dtype, ())]
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
                             use_input_stats=use_input_stats, momentum=case.momentum, eps=case.eps)
        else:
            out = self._call(fn, xi, wi, bi, rm, rv, use_input_stats, case.momentum, case.eps, False)
        ref = self._in_oracle(case, I)
        tb = self._baseline(lambda: _f_in_torch(I, case))
        self._meta("out", out, x.shape, x.dtype, ("contiguous", suggested_format(x)))
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
            got = self._call(fn, x, mean_all, invstd_all, rm, rv, m, eps, extra)
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

    # ------------------------------------------------------------------ double backward (contract §8)
    def _gradgrad(self, case: Case, fn, I, call, oracle_out):
        """grad of (grad_input · v) w.r.t. input, weight and grad_out, against the float64 oracle's autograd.

        `call(fn, x, w, b)` runs an F-style function; `oracle_out(x, w, b)` the oracle's forward (plain,
        differentiable torch). Backends without double backward fail the rule with the reason.
        """
        if not case.gradgrad:
            return
        r = self._rule("gradgrad")
        gen = torch.Generator().manual_seed(seed_of(case.name + "/v"))
        v64 = torch.randn(I["x"].shape, generator=gen, dtype=torch.float64)
        names = ("input", "weight", "grad_out")

        def second(out_fn, x, w, b, g, v):
            xi, wi, bi, gi_ = _leaf(x), _leaf(w), _leaf(b), _leaf(g)
            out = out_fn(xi, wi, bi)
            if not out.requires_grad:
                raise _NoDoubleBackward("output does not require grad")
            (gin,) = torch.autograd.grad(out, xi, gi_, create_graph=True)
            if not gin.requires_grad:
                raise _NoDoubleBackward("grad_input is not differentiable (backward is not itself differentiable)")
            wrt = [t for t in (xi, wi, gi_) if t is not None]
            res = torch.autograd.grad((gin * v).sum(), wrt, allow_unused=True)
            if all(t is None for t in res):
                raise _NoDoubleBackward("grad_input's graph reaches none of input, weight, grad_out "
                                        "(its backward is not differentiable)")
            res = list(res)
            return [res.pop(0) if t is not None else None for t in (xi, wi, gi_)]

        x, w, b, g = I["x"], I["weight"], I["bias"], I["grad_out"]
        v = v64.to(x.device, x.dtype)
        try:
            with self.backend.scope():
                got = second(lambda a, c, d: call(fn, a, c, d), x, w, b, g, v)
        except Exception as e:  # noqa: BLE001 -- a backend without double backward
            why = _short(e) if isinstance(e, _NoDoubleBackward) else f"{type(e).__name__}: {_short(e)}"
            r.add(False, f"no double backward: {why}")
            return
        try:
            ref = second(oracle_out, up(x), up(w), up(b), up(g), v64)
        except Exception as e:
            _mark(e, "oracle")
            raise
        base = None
        if not self.self_baseline:
            F = torch.nn.functional
            base = self._baseline(lambda: second(lambda a, c, d: call(getattr(F, case.op[2:]), a, c, d),
                                                 x, w, b, g, v))
        for i, name in enumerate(names):
            if ref[i] is None:  # unused in the oracle's graph (eval: grad_input is linear in grad_out): zero
                if got[i] is not None and bool(got[i].detach().ne(0).any()):
                    r.add(False, f"d(grad_input·v)/d{name}: nonzero where the oracle's is identically zero")
                continue
            if got[i] is None:
                r.add(False, f"d(grad_input·v)/d{name}: no gradient (None)")
                continue
            self._values(f"d(grad_input·v)/d{name}", got[i], ref[i], base and base[i], None, case.sensitive,
                         rule="gradgrad")


# ---------------------------------------------------------------------- invocation helpers


class _NoDoubleBackward(Exception):
    pass


class _NotOnDevice(Exception):
    def __init__(self, op):
        super().__init__(op)
        self.op = op


class _Shifted:
    """ATen's result measured against the oracle at ATen's own inputs, re-expressed at the impl's ref."""

    def __init__(self, base, base_ref, ref):
        # value whose error vs `ref` equals ATen's error vs `base_ref`
        self.value = up(ref) + (up(base) - up(base_ref))


def _mark(e: BaseException, where: str):
    try:
        e._nk_where = where
    except Exception:  # noqa: BLE001 -- some exception types refuse attributes
        pass


def _short(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0][:300] if s else ""


def _leaf(t):
    if t is None:
        return None
    return t.detach().clone().requires_grad_(True) if t.is_floating_point() else t


def _mf(fmt):
    return {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last,
            "channels_last_3d": torch.channels_last_3d}[fmt]


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


def _f_bn_torch(I, case):
    F = torch.nn.functional
    x, w, b = _leaf(I["x"]), _leaf(I["weight"]), _leaf(I["bias"])
    rm, rv = _clone(I["running_mean"]), _clone(I["running_var"])
    out = F.batch_norm(x, rm, rv, w, b, case.training, case.momentum, case.eps)
    out.backward(I["grad_out"])
    return out.detach(), (rm, rv), [t.grad if t is not None else None for t in (x, w, b)]


def _f_in_torch(I, case):
    F = torch.nn.functional
    x, w, b = _leaf(I["x"]), _leaf(I["weight"]), _leaf(I["bias"])
    rm, rv = _clone(I["running_mean"]), _clone(I["running_var"])
    out = F.instance_norm(x, rm, rv, w, b, case.training, case.momentum, case.eps)
    out.backward(I["grad_out"])
    return out.detach(), (rm, rv), [t.grad if t is not None else None for t in (x, w, b)]


def _f_torch(name, I, args, kwargs, bias):
    F = torch.nn.functional
    x, w = _leaf(I["x"]), _leaf(I["weight"])
    leaves = [x, w]
    if bias:
        b = _leaf(I["bias"])
        leaves.append(b)
        out = getattr(F, name)(x, *args, weight=w, bias=b, **kwargs)
    else:
        out = getattr(F, name)(x, *args, weight=w, **kwargs)
    out.backward(I["grad_out"])
    return out.detach(), [t.grad if t is not None else None for t in leaves]


def select(families=None, case=None, exact=False, errors=True):
    """The cases (and error cases) of `families` whose name contains (or, exact, equals) `case`."""
    from normkit.conformance.cases import FAMILIES, all_cases, error_cases

    fams = tuple(families or FAMILIES)

    def keep(c):
        if c.family not in fams:
            return False
        return case is None or (c.name == case if exact else case in c.name)

    return [c for c in all_cases() if keep(c)], ([c for c in error_cases() if keep(c)] if errors else [])


def run_all(backend: Backend, device="cpu", families=None, case=None, exact=False, errors=True, oracle=None,
            progress=None):
    """Run the selected cases; returns (outcomes, runner). `progress(name, failed)` is called per item."""
    cases, errs = select(families, case, exact, errors)
    runner = Runner(backend, device, oracle)
    outcomes = []
    for item in cases + errs:
        o = runner.run_error(item) if isinstance(item, ErrorCase) else runner.run_case(item)
        if o is not None:
            outcomes.append(o)
        if progress is not None:
            progress(item.name, o is not None and not o.passed)
    return outcomes, runner
