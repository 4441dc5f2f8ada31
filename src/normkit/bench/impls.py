"""The implementations a row can run: normkit, ATen eager (cuDNN on / off), torch.compile, Liger-Kernel,
FlagGems. Each one says whether it supports a case (else the row reads "n/a" with the reason), opens a
context for its session (cuDNN flags), and builds ``fn(x, weight, bias, running_mean, running_var) -> y``
with autograd, with the op's constants (eps, momentum, groups, normalized_shape) bound in.

FlagGems is called through its own functions (``flag_gems.ops.*`` with autograd wrappers written here,
its ``RmsNorm`` and ``InstanceNorm`` autograd functions), not through ``use_gems()``: F.batch_norm on
CUDA reaches ``cudnn_batch_norm`` / ``_batch_norm_with_update``, which FlagGems does not override, so the
context would silently time ATen's kernels (``../shared/baselines`` saw exactly that).
"""

from __future__ import annotations

import contextlib
import importlib
import math

import torch
import torch.nn.functional as TF

from normkit.bench.cases import EPS, MOMENTUM, RMS_EPS, Case

# run (and column) order: the peers that compile or autotune per case ("scoped") come last, so that a
# budget-limited run drops them first (runner: ctx.scoped_reserve_s)
ALL_PEERS = ("aten", "aten-native", "liger", "compile", "flaggems")


def _version(dist: str):
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return None


def functional_call(F, case: Case, x, w, b, rm, rv):
    """The torch.nn.functional-style call of the case's op through module (or namespace) ``F``."""
    op = case.op
    if op == "batch_norm":
        return F.batch_norm(x, rm, rv, w, b, case.mode == "train", MOMENTUM, EPS)
    if op == "layer_norm":
        return F.layer_norm(x, (x.shape[-1],), w, b, EPS)
    if op == "rms_norm":
        return F.rms_norm(x, (x.shape[-1],), w, RMS_EPS)
    if op == "group_norm":
        return F.group_norm(x, case.groups, w, b, EPS)
    if op == "instance_norm":
        return F.instance_norm(x, None, None, w, b, True, MOMENTUM, EPS)
    raise ValueError(op)


class Impl:
    name = "?"
    scoped = False   # True: expensive first calls (compilation, autotuning); --peer-scope headline limits it
    ops = ("batch_norm", "layer_norm", "rms_norm", "group_norm", "instance_norm")
    cuda_only = False
    version = None
    note = ""

    def unavailable(self):
        """None when usable in this process, else the reason."""
        return None

    def supports(self, case: Case, device: str):
        """None when the case can run, else the reason ("n/a: ...")."""
        if case.op not in self.ops:
            return f"{self.name} has no {case.op}"
        if self.cuda_only and device != "cuda":
            return f"{self.name} needs CUDA"
        return None

    def skip(self, case: Case, direction: str):
        """None when the direction is run, else why it is not (the row reads "skipped" with that note):
        for cases an implementation could run but that would cost the run more time than it has."""
        return None

    def context(self):
        return contextlib.nullcontext()

    def build(self, case: Case):
        raise NotImplementedError

    def finish_case(self, case: Case):
        """Called after the case's rows are done."""


class NormkitImpl(Impl):
    name = "normkit"
    note = "normkit.functional (Triton kernels on CUDA, reference elsewhere)"

    def __init__(self):
        self._F = None
        self._err = None

    def _module(self):
        if self._F is None and self._err is None:
            try:
                self._F = importlib.import_module("normkit.functional")
            except Exception as e:
                try:  # the top-level names are the same functions
                    import normkit

                    if all(hasattr(normkit, n) for n in ("batch_norm", "layer_norm")):
                        self._F = normkit
                    else:
                        raise
                except Exception:
                    self._err = f"{type(e).__name__}: {e}"
        return self._F

    def unavailable(self):
        self._module()
        return self._err

    def supports(self, case, device):
        r = super().supports(case, device)
        if r:
            return r
        F = self._module()
        if F is not None and not hasattr(F, case.op):
            return f"normkit.functional has no {case.op}"
        return None

    def build(self, case):
        F = self._module()
        if F is None:
            raise RuntimeError(self._err)
        return lambda x, w, b, rm, rv: functional_call(F, case, x, w, b, rm, rv)


class AtenImpl(Impl):
    """Eager PyTorch: torch.nn.functional, cuDNN as torch picks it (on) or off."""

    def __init__(self, cudnn: bool = True):
        self.cudnn = cudnn
        self.name = "aten" if cudnn else "aten-native"
        self.note = ("eager torch.nn.functional, cuDNN enabled (torch picks cuDNN or native)" if cudnn
                     else "eager torch.nn.functional with torch.backends.cudnn.flags(enabled=False)")
        if not cudnn:
            self.ops = ("batch_norm", "instance_norm")

    def context(self):
        return torch.backends.cudnn.flags(enabled=self.cudnn)

    def build(self, case):
        return lambda x, w, b, rm, rv: functional_call(TF, case, x, w, b, rm, rv)


class CompileImpl(Impl):
    """torch.compile of the eager call. Compiled functions are cached per case key (dynamic=False) or per
    (op, mode, dtypes, layout, ndim) with --compile-dynamic."""

    name = "compile"
    scoped = True

    def __init__(self, dynamic: bool = False, mode=None):
        self.dynamic = dynamic
        self.mode = mode
        self._cache = {}
        self.note = (f"torch.compile(dynamic={dynamic}{', mode=' + repr(mode) if mode else ''}) of the eager "
                     "call, timed as every implementation is (CUDA-graph replay on a GPU: guard and launch "
                     "overhead excluded there); the first call (compilation) is reported as first_call_s")
        try:  # one code object serves every case: let its cache hold them all
            import torch._dynamo

            cfg = torch._dynamo.config
            for name, val in (("cache_size_limit", 256), ("recompile_limit", 256),
                              ("accumulated_cache_size_limit", 4096), ("accumulated_recompile_limit", 4096)):
                if hasattr(cfg, name):
                    setattr(cfg, name, max(getattr(cfg, name), val))
        except Exception:
            pass
        try:  # the backward is replayed with retain_graph=True: saved buffers must not be donated to it
            import torch._functorch.config as fconfig

            if hasattr(fconfig, "donated_buffer"):
                fconfig.donated_buffer = False
        except Exception:
            pass

    def build(self, case):
        if self.dynamic:
            key = (case.op, case.mode, case.dtype, case.params, case.layout, len(case.shape), case.groups)
        else:
            key = case
        fn = self._cache.get(key)
        if fn is None:
            def eager(x, w, b, rm, rv):
                return functional_call(TF, case, x, w, b, rm, rv)

            kwargs = {"dynamic": self.dynamic}
            if self.mode:
                kwargs["mode"] = self.mode
            fn = torch.compile(eager, **kwargs)
            self._cache[key] = fn
        return fn

    def finish_case(self, case):
        """Static compilation: the case's compiled code is not needed again; drop it so that dynamo's guard
        lists stay short."""
        if not self.dynamic:
            self._cache.pop(case, None)
            try:
                import torch._dynamo

                torch._dynamo.reset()
            except Exception:
                pass


class LigerImpl(Impl):
    name = "liger"
    ops = ("layer_norm", "rms_norm", "group_norm")
    cuda_only = True
    note = ("liger_kernel.ops: LigerLayerNormFunction, LigerRMSNormFunction (in_place=False), "
            "LigerGroupNormFunction (its ensure_contiguous copies a channels_last input: that copy is timed)")

    def __init__(self):
        self.version = _version("liger-kernel")
        self._err = None
        self._mods = None

    def unavailable(self):
        if self._mods is None and self._err is None:
            try:
                self._mods = {
                    "ln": importlib.import_module("liger_kernel.ops.layer_norm"),
                    "rms": importlib.import_module("liger_kernel.ops.rms_norm"),
                    "gn": importlib.import_module("liger_kernel.ops.group_norm"),
                }
            except Exception as e:
                self._err = f"liger-kernel not importable ({type(e).__name__}: {e})"[:200]
        return self._err

    def supports(self, case, device):
        r = super().supports(case, device)
        if r:
            return r
        if case.op in ("layer_norm", "rms_norm") and case.shape[-1] > 65536:
            return "Liger refuses rows wider than 65536"
        return None

    def build(self, case):
        m = self._mods
        if case.op == "layer_norm":
            f = m["ln"].LigerLayerNormFunction
            return lambda x, w, b, rm, rv: f.apply(x, w, b, EPS)
        if case.op == "rms_norm":
            f = m["rms"].LigerRMSNormFunction
            # (X, W, eps, offset, casting_mode, in_place): in_place=False keeps dy intact across calls
            return lambda x, w, b, rm, rv: f.apply(x, w, RMS_EPS, 0.0, "llama", False)
        if case.op == "group_norm":
            f = m["gn"].LigerGroupNormFunction
            c = case.shape[1]
            return lambda x, w, b, rm, rv: f.apply(x, w, b, c, case.groups, EPS)
        raise ValueError(case.op)


class _FGBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, rm, rv, training, fg):
        y, mean, invstd = fg["bn"].batch_norm(x, w, b, rm, rv, training, MOMENTUM, EPS)
        ctx.save_for_backward(x, w, rm, rv, mean, invstd)
        ctx.training, ctx.fg = training, fg
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, rm, rv, mean, invstd = ctx.saved_tensors
        mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]]
        gi, gw, gb = ctx.fg["bn"].batch_norm_backward(dy, x, w, rm, rv, mean, invstd, ctx.training, EPS, mask)
        return gi, gw, gb, None, None, None, None


class _FGLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, fg):
        shape = [x.shape[-1]]
        y, mean, rstd = fg["ln"].layer_norm(x, shape, w, b, EPS)
        ctx.save_for_backward(x, w, b, mean, rstd)
        ctx.fg = fg
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, b, mean, rstd = ctx.saved_tensors
        mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]]
        gi, gw, gb = ctx.fg["ln"].layer_norm_backward(dy, x, [x.shape[-1]], mean, rstd, w, b, mask)
        return gi, gw, gb, None


class _FGGroupNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, groups, fg):
        n, c = x.shape[0], x.shape[1]
        hxw = math.prod(x.shape[2:])
        y, mean, rstd = fg["gn"].group_norm(x, w, b, n, c, hxw, groups, EPS)
        ctx.save_for_backward(x, w, mean, rstd)
        ctx.dims, ctx.fg = (n, c, hxw, groups), fg
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, mean, rstd = ctx.saved_tensors
        n, c, hxw, groups = ctx.dims
        mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]]
        gi, gw, gb = ctx.fg["gn"].group_norm_backward(dy, x, mean, rstd, w, n, c, hxw, groups, mask)
        return gi, gw, gb, None, None


TRITON_MAX_NUMEL = 1 << 20   # Triton refuses a block (tl.arange product) larger than this
# FlagGems' rms_norm backward and group_norm kernels hold a whole row / group in one Triton block
# (next_pow2 of its size, no loop, 4 warps). Compiling such a kernel grows steeply with the block: Triton
# 3.9 compiled FlagGems' rms_norm_grad_dx_kernel for sm_90 (bf16) in 1.5 s at 16384 elements, 3.2 s at
# 32768, 14.7 s at 65536, ~100-190 s at 131072 and > 5 min at 262144 (CPU of the dev machine, no GPU
# needed to compile). Rows above FG_MAX_BLOCK are skipped, with this reason in their note, so that the
# run's budget is not spent in Triton's compiler.
FG_MAX_BLOCK = 1 << 15

# FlagGems' kernels autotune (triton.autotune / its LibTuner) on every new shape and dtype; each config is
# timed with triton.testing.do_bench, 25 ms warm-up + 100 ms by default, i.e. seconds per case for the
# 12-config layer/RMS norm kernels. While FlagGems rows run, do_bench's defaults are lowered to these (the
# autotuner passes neither): still >= 20 ms of calls per config, enough to rank configs.
FG_TUNE_WARMUP_MS = 5
FG_TUNE_REP_MS = 20


@contextlib.contextmanager
def fast_autotune(warmup_ms: float = FG_TUNE_WARMUP_MS, rep_ms: float = FG_TUNE_REP_MS):
    """Lower triton.testing.do_bench's default warm-up / rep (what triton.autotune uses) for the block."""
    try:
        import inspect

        import triton.testing as tt

        fn = tt.do_bench
        params = [p for p in inspect.signature(fn).parameters.values() if p.default is not inspect.Parameter.empty]
        old = fn.__defaults__
        names = [p.name for p in params]
        if old is None or len(old) != len(names) or "warmup" not in names or "rep" not in names:
            raise LookupError("unexpected do_bench signature")
        new = list(old)
        new[names.index("warmup")] = warmup_ms
        new[names.index("rep")] = rep_ms
    except Exception:
        yield
        return
    fn.__defaults__ = tuple(new)
    try:
        yield
    finally:
        fn.__defaults__ = old


def _pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


class FlagGemsImpl(Impl):
    name = "flaggems"
    cuda_only = True
    scoped = True   # triton.autotune on every new shape and dtype
    note = ("flag_gems.ops batch_norm/layer_norm/group_norm (+ their aten-style backward, wrapped in "
            "autograd here), flag_gems.ops.rms_norm, flag_gems.fused.instance_norm; its autotuning (first "
            f"call, not timed) with triton.testing.do_bench at {FG_TUNE_WARMUP_MS}/{FG_TUNE_REP_MS} ms "
            "warm-up/rep per config instead of 25/100")

    def __init__(self):
        self.version = _version("flag-gems") or _version("flag_gems")
        self._err = None
        self._fg = None

    def unavailable(self):
        if self._fg is None and self._err is None:
            try:
                import flag_gems  # noqa: F401

                self._fg = {
                    "bn": importlib.import_module("flag_gems.ops.batch_norm"),
                    "ln": importlib.import_module("flag_gems.ops.layernorm"),
                    "gn": importlib.import_module("flag_gems.ops.groupnorm"),
                    "rms": importlib.import_module("flag_gems.ops.rms_norm"),
                    "in": importlib.import_module("flag_gems.fused.instance_norm"),
                }
            except Exception as e:
                self._err = f"flag_gems not importable ({type(e).__name__}: {e})"[:200]
        return self._err

    def supports(self, case, device):
        r = super().supports(case, device)
        if r:
            return r
        if case.op == "group_norm":
            n, c = case.shape[0], case.shape[1]
            hxw = math.prod(case.shape[2:])
            block = max(_pow2(-(-c // case.groups)), _pow2(n)) * _pow2(hxw)
            if block > TRITON_MAX_NUMEL:
                return (f"FlagGems group_norm puts next_pow2(C/G or N) x next_pow2(H*W) = {block} elements in one "
                        f"Triton block (Triton's limit: {TRITON_MAX_NUMEL})")
        return None

    def skip(self, case, direction):
        if case.op == "rms_norm" and direction == "bwd":
            block = _pow2(case.shape[-1])
            if block > FG_MAX_BLOCK:
                return (f"FlagGems rms_norm backward holds a row in one Triton block of {block} elements: "
                        f"not run above {FG_MAX_BLOCK} (Triton compile time: 15 s at 65536, minutes above)")
        if case.op == "group_norm":
            n, c = case.shape[0], case.shape[1]
            hxw = _pow2(math.prod(case.shape[2:]))
            fwd = _pow2(-(-c // case.groups)) * hxw
            wb = _pow2(n) * hxw
            if fwd > FG_MAX_BLOCK or (direction == "bwd" and wb > FG_MAX_BLOCK):
                which = "forward" if fwd > FG_MAX_BLOCK else "weight/bias backward"
                return (f"FlagGems group_norm {which} holds a group in one Triton block of {max(fwd, wb)} "
                        f"elements: not run above {FG_MAX_BLOCK} (Triton compile time: 15 s at 65536, "
                        "minutes above)")
        return None

    def context(self):
        return fast_autotune()

    def build(self, case):
        fg = self._fg
        train = case.mode == "train"
        if case.op == "batch_norm":
            return lambda x, w, b, rm, rv: _FGBatchNorm.apply(x, w, b, rm, rv, train, fg)
        if case.op == "layer_norm":
            return lambda x, w, b, rm, rv: _FGLayerNorm.apply(x, w, b, fg)
        if case.op == "group_norm":
            return lambda x, w, b, rm, rv: _FGGroupNorm.apply(x, w, b, case.groups, fg)
        if case.op == "rms_norm":
            f = fg["rms"].rms_norm
            return lambda x, w, b, rm, rv: f(x, [x.shape[-1]], w, RMS_EPS)
        if case.op == "instance_norm":
            f = fg["in"].instance_norm
            return lambda x, w, b, rm, rv: f(x, w, b, None, None, True, MOMENTUM, EPS, False)
        raise ValueError(case.op)


def make_impls(peers, compile_dynamic: bool = False, compile_mode=None) -> list:
    """normkit first, then the requested peers in ALL_PEERS order."""
    impls = [NormkitImpl()]
    for p in ALL_PEERS:
        if p not in peers:
            continue
        if p == "aten":
            impls.append(AtenImpl(True))
        elif p == "aten-native":
            impls.append(AtenImpl(False))
        elif p == "compile":
            impls.append(CompileImpl(compile_dynamic, compile_mode))
        elif p == "liger":
            impls.append(LigerImpl())
        elif p == "flaggems":
            impls.append(FlagGemsImpl())
    return impls
