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

The family checks are mixins of `Runner`, one module per family group: `check_batch_norm`,
`check_layer_norm` (layer + RMS norm), `check_group_norm` (group + instance norm) and
`check_sync_batch_norm`; the helpers they share with the runner are in `_util`.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import traceback
import warnings

import torch

from normkit.conformance import rules
from normkit.conformance._util import _NotOnDevice, _acc, _leaf, up
from normkit.conformance.backends import Backend, ScopedBackend, TorchBackend
from normkit.conformance.cases import SYNC_OPS, Case, ErrorCase, seed_of
from normkit.conformance.check_batch_norm import BatchNormChecks
from normkit.conformance.check_group_norm import GroupNormChecks
from normkit.conformance.check_layer_norm import LayerNormChecks
from normkit.conformance.check_sync_batch_norm import SyncBatchNormChecks
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


class Runner(BatchNormChecks, LayerNormChecks, GroupNormChecks, SyncBatchNormChecks):
    """Runs cases and judges them; the `_run_<family>` checks come from the family mixins."""

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
        # op -> [outputs compared with torch's on the same inputs, of them bit-identical], for a backend run
        # within a context: an override that never changes a bit (one that reaches nothing on this device) is
        # worth saying
        self.same_bits = {} if isinstance(backend, ScopedBackend) else None

    # ------------------------------------------------------------------ public
    def applies(self, item) -> bool:
        """Whether a case (or error case) is checked on this device and backend at all."""
        if item.devices and self.dev_type not in item.devices:
            return False
        return not (isinstance(item, ErrorCase) and item.torch_only and not self.backend.runs_torch_kernels)

    def applicable(self, items) -> list:
        """The items that apply (the ones a progress count or a case count counts)."""
        return [item for item in items if self.applies(item)]

    def run(self, items, progress=None):
        """The outcomes of ``items``, one at a time (a caller stopped midway keeps the ones before);
        ``progress(name, failed)`` is called per item."""
        for item in items:
            o = self.run_error(item) if isinstance(item, ErrorCase) else self.run_case(item)
            if progress is not None:
                progress(item.name, o is not None and not o.passed)
            if o is not None:
                yield o

    def run_case(self, case: Case):
        if not self.applies(case):
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
        if not self.applies(ec):
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
        if self.same_bits is not None and base is not None and (base_ref is None or base_ref is ref) \
                and base.shape == got.shape:
            tally = self.same_bits.setdefault(op or self._op, [0, 0])
            tally[0] += 1
            a, b = got.detach().cpu(), base.detach().cpu()
            tally[1] += bool(((a == b) | (a.isnan() & b.isnan())).all())
        if base is not None and base_ref is not None and base_ref is not ref:
            # criterion B measures ATen against the oracle at ATen's own inputs
            base = _Shifted(base, base_ref, ref)
        v = judge(name, got, ref, base.value if isinstance(base, _Shifted) else base,
                  dtype=got.dtype, sensitive=sensitive, half=self._half, self_baseline=self.self_baseline)
        self._rule(rule, op).verdict(v)

    def ops_with_torchs_bits(self):
        """Ops whose every output compared with torch's own kernel (same inputs) was bit-identical to it."""
        return sorted(op for op, (n, same) in (self.same_bits or {}).items() if n and same == n)

    def _meta(self, name, got, shape, dtype, formats, rule="meta", op=None):
        if got is None:
            self._rule(rule, op).add(False, f"{name}: missing (None)")
            return
        ok, detail = check_meta(name, got, shape, dtype, formats)
        self._rule(rule, op).add(ok, detail)

    def _call(self, fn, *args, mutable=(), **kwargs):
        """``fn(*args, **kwargs)``, judged besides by two rules every call obeys (contract: outputs are new tensors,
        inputs are read only): "inputs", every tensor argument (in dicts and sequences too) holds its values after
        the call, except ``mutable`` ones (running statistics a training call updates); "aliasing", no output
        shares memory with an argument (an eval call's saved statistics are copies of the running ones). Each
        rule shows only where it fails."""
        keep = {id(t) for t in mutable if t is not None}
        arguments = _tensors((args, kwargs))
        inputs = [t for t in arguments if id(t) not in keep]
        before = [t.detach().clone() for t in inputs]
        try:
            out = fn(*args, **kwargs)
        except Exception as e:
            if _not_on_device(e):
                raise _NotOnDevice(self._op) from e
            raise
        changed = [i for i, (t, b) in enumerate(zip(inputs, before)) if not _same_values(t, b)]
        if changed:
            self._rule("inputs").add(False, f"{len(changed)} input tensor(s) changed by the call (shapes "
                                            f"{[tuple(inputs[i].shape) for i in changed][:3]})")
        held = {_storage(t) for t in arguments} - {None}
        shared = [tuple(o.shape) for o in _tensors(out) if _storage(o) in held]
        if shared:
            self._rule("aliasing").add(False, f"output(s) of shape {shared[:3]} share memory with an argument")
        return out

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


class _Shifted:
    """ATen's result measured against the oracle at ATen's own inputs, re-expressed at the impl's ref."""

    def __init__(self, base, base_ref, ref):
        # value whose error vs `ref` equals ATen's error vs `base_ref`
        self.value = up(ref) + (up(base) - up(base_ref))


def _tensors(obj) -> list:
    """The tensors in obj (nested tuples, lists and dict values), each once."""
    found, seen, todo = [], set(), [obj]
    while todo:
        o = todo.pop()
        if isinstance(o, torch.Tensor):
            if id(o) not in seen:
                seen.add(id(o))
                found.append(o)
        elif isinstance(o, (tuple, list)):
            todo.extend(o)
        elif isinstance(o, dict):
            todo.extend(o.values())
    return found


def _same_values(t: torch.Tensor, before: torch.Tensor) -> bool:
    if t.shape != before.shape or t.dtype != before.dtype:
        return False
    if t.is_floating_point() or t.is_complex():
        return bool(torch.equal(t.isnan(), before.isnan()) and torch.equal(t.nan_to_num(0.0), before.nan_to_num(0.0)))
    return bool(torch.equal(t, before))


def _storage(t: torch.Tensor):
    """The address of t's memory, or None for an empty tensor (which may share a null or cached allocation)."""
    if t.numel() == 0 or t.device.type == "meta":
        return None
    return (t.device, t.untyped_storage().data_ptr())


def _mark(e: BaseException, where: str):
    try:
        e._nk_where = where
    except Exception:  # noqa: BLE001 -- some exception types refuse attributes
        pass


def _short(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0][:300] if s else ""


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
    """Run the selected cases that apply; returns (outcomes, runner). `progress(name, failed)` is called per
    case run."""
    cases, errs = select(families, case, exact, errors)
    runner = Runner(backend, device, oracle)
    return list(runner.run(runner.applicable(cases + errs), progress)), runner
