"""Rows: for each case, each implementation, each direction: check against float64, time, peak memory.

A row is independent of every other: whatever one implementation raises is written into its own row
("error: ...") and the run continues. Only a lost CUDA context (a sticky device error) ends the device
work; the remaining rows then say so.
"""

from __future__ import annotations

import datetime
import gc
import os
import platform
import subprocess
import time
from dataclasses import dataclass, field

import torch

from normkit.bench import cases as C
from normkit.bench.impls import CompileImpl, Impl, NormkitImpl
from normkit.bench.oracle import compare, oracle, tolerance
from normkit.bench.timing import Progress, Timer


BUDGET_SKIP = "time budget"  # how the note of every row skipped for --budget begins


def skipped_for_budget(row: dict) -> bool:
    """Whether --budget cut this row (a run with any such row is incomplete)."""
    return row.get("status") == "skipped" and (row.get("note") or "").startswith(BUDGET_SKIP)


@dataclass
class Context:
    device: str
    timer: Timer
    copy_gbps: float | None = None
    l2_bytes: int | None = None
    seed: int = 0
    quick: bool = False
    budget_s: float | None = None
    t0: float = field(default_factory=time.time)
    peer_scope: str = "headline"   # headline: torch.compile and FlagGems only on each op's first suite dtype
    headline_dtypes: dict = field(default_factory=dict)
    cuda_dead: str | None = None
    rounds: int = 1  # timing rounds per case (the implementations in alternating order; fastest kept)

    deadline: float | None = None    # absolute time.time() by which the current op's slice ends
    # seconds the rest of the current op slice needs for its unscoped rows (normkit, eager ATen, Liger): a
    # scoped implementation (torch.compile, FlagGems) is skipped when running it would eat into that
    scoped_reserve_s: float = 0.0

    def over_budget(self) -> bool:
        if self.deadline is not None and time.time() > self.deadline:
            return True
        return self.budget_s is not None and time.time() - self.t0 > self.budget_s

    def scoped_over_budget(self) -> bool:
        """True when a compiling / autotuning peer should give way to the cheaper rows still to come."""
        if not self.scoped_reserve_s:
            return False
        ends = [t for t in (self.deadline, None if self.budget_s is None else self.t0 + self.budget_s)
                if t is not None]
        return bool(ends) and time.time() + self.scoped_reserve_s > min(ends)


def _err(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    first = msg[0] if msg else ""
    return f"error: {type(e).__name__}: {first}"[:300]


def _sync(ctx: Context):
    if ctx.device == "cuda":
        torch.cuda.synchronize()


def _cleanup(ctx: Context, full: bool = False):
    """After an implementation: free memory; detect a lost CUDA context. A full garbage collection costs
    ~0.15 s with torch loaded, so it runs only after an exception (tracebacks hold frames with tensors in
    reference cycles) and between large cases."""
    if full:
        gc.collect()
    if ctx.device == "cuda" and not ctx.cuda_dead:
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception as e:  # sticky device error: nothing on this device can run any more
            ctx.cuda_dead = _err(e)


def run_metadata(device: str) -> dict:
    """What a report (bench's, check's) records of the run's setting: date, git sha, device and host, versions."""
    import normkit

    info = device_info(device)
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git_sha": git_sha(), "device": info, "gpu_name": info["gpu_name"],
            "versions": {"torch": info["torch"], "triton": info["triton"], "normkit": normkit.__version__,
                         "python": info["python"]}}


def device_info(device: str) -> dict:
    info = {"device": device, "python": platform.python_version(), "torch": torch.__version__,
            "host": platform.node()}
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:
        info["triton"] = None
    if torch.device(device).type == "cuda":  # cuda or cuda:N
        p = torch.cuda.get_device_properties(device)
        info.update(gpu_name=torch.cuda.get_device_name(device), sm_count=p.multi_processor_count,
                    total_memory_bytes=p.total_memory,
                    capability=".".join(map(str, torch.cuda.get_device_capability(device))),
                    l2_cache_bytes=getattr(p, "L2_cache_size", None), cuda=torch.version.cuda,
                    cudnn=torch.backends.cudnn.version())
    else:
        info["gpu_name"] = None
        info["cpu"] = platform.processor() or platform.machine()
    return info


def git_sha() -> str | None:
    if os.environ.get("NORMKIT_GIT_SHA"):  # a copy of the tree without its .git: the caller's word, unchecked
        return os.environ["NORMKIT_GIT_SHA"] + " (NORMKIT_GIT_SHA; the tree was not checked against it)"
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (sha + ("-dirty" if dirty else "")) if sha else None
    except Exception:
        return None


def copy_nbytes(device: str, nbytes: int) -> int:
    """The bytes ``copy_bandwidth`` copies: the suite's on a GPU, at most 32 MiB on the CPU."""
    return nbytes if device == "cuda" else min(nbytes, 32 << 20)


def copy_bandwidth(ctx: Context, nbytes: int) -> float:
    """Device-to-device copy of ``copy_nbytes(nbytes)``, GB/s counting bytes read + written (the SOL ceiling)."""
    n = copy_nbytes(ctx.device, nbytes) // 4
    src = torch.randn(n, device=ctx.device, dtype=torch.float32)
    dst = torch.empty_like(src)
    _sync(ctx)
    # Eagerly: in a CUDA graph the copy runs on the copy engines at ~2.8 of the ~4.2 TB/s (H200).
    ms, _ = ctx.timer.time([lambda: dst.copy_(src)], graph=False)
    del src, dst
    _cleanup(ctx)
    return 2 * n * 4 / (ms * 1e-3) / 1e9


# ---------------------------------------------------------------------------------------------------------
def _base_row(case: C.Case, direction: str, impl: Impl) -> dict:
    row = case.key()
    row.update(direction=direction, impl=impl.name, status=None, note=None, ms=None, gbps=None, sol=None,
               bytes=C.min_bytes(case, direction), tensor_bytes=case.tensor_bytes, peak_mem_bytes=None,
               timer=None, rotation=None, calls_per_timing=None, estimate_ms=None, ms_rounds=[], errors=None,
               tol=tolerance(case), first_call_s=None, oracle=None)
    return row


def _leaves(inp: C.Inputs, train: bool, fresh_stats: bool):
    def leaf(t):
        return None if t is None else t.detach().requires_grad_(train)

    rm, rv = inp.running_mean, inp.running_var
    if fresh_stats and rm is not None:
        rm, rv = rm.clone(), rv.clone()
    return leaf(inp.x), leaf(inp.weight), leaf(inp.bias), rm, rv


def _peak(ctx: Context, call):
    """Peak device memory allocated by ``call`` beyond what was allocated before it."""
    if ctx.device != "cuda":
        out = call()
        del out
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with ctx.timer.stream_ctx():
        out = call()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return int(peak)


def _finish(row: dict, ms: float, timer_name: str, ctx: Context):
    row["ms_rounds"].append(ms)
    if row["ms"] is not None and row["ms"] <= ms:
        return
    row["ms"] = ms
    row["timer"] = timer_name
    why = getattr(ctx.timer, "last_graph_error", None) if timer_name == "cuda-events" else None
    if why and why not in (row["note"] or ""):
        row["note"] = ((row["note"] + "; ") if row["note"] else "") + "graph capture failed: " + why
    row["calls_per_timing"] = ctx.timer.last_calls
    row["estimate_ms"] = ctx.timer.last_estimate_ms
    if ms and ms > 0:
        row["gbps"] = row["bytes"] / (ms * 1e-3) / 1e9
        if ctx.copy_gbps:
            row["sol"] = row["gbps"] / ctx.copy_gbps


def _time_directions(case: C.Case, fn, sets, fwd: dict, bwd: dict | None, ctx: Context) -> bool:
    """Times the forward (and the backward unless ``bwd`` is None or errored) of ``fn`` over the input
    sets, filling the rows; True when the backward raised. Each call of this function is one round:
    ``ms_rounds`` collects every round's time and ``ms`` (with gbps / sol) keeps the fastest."""
    train = case.mode == "train"
    grad_ctx = torch.enable_grad if train else torch.no_grad
    timer = ctx.timer
    leaf_sets = [_leaves(s, train, fresh_stats=True) for s in sets]

    def make_fwd(a):
        def call():
            with grad_ctx():
                return fn(*a)
        return call

    ffns = [make_fwd(a) for a in leaf_sets]
    ms, tname = timer.time(ffns)
    _finish(fwd, ms, tname, ctx)
    if fwd.get("peak_mem_bytes") is None:
        fwd["peak_mem_bytes"] = _peak(ctx, ffns[0])
    del ffns
    _sync(ctx)
    if bwd is None or bwd["status"] == "error":
        return False
    try:
        graphs = []
        with torch.enable_grad():
            for a, s in zip(leaf_sets, sets):
                y = fn(*a)
                graphs.append((y, [t_ for t_ in a[:3] if t_ is not None], s.dy))

        def make_bwd(y, leaves, dy):
            return lambda: torch.autograd.grad(y, leaves, dy, retain_graph=True, allow_unused=True)

        bfns = [make_bwd(*g) for g in graphs]
        ms, tname = timer.time(bfns)
        _finish(bwd, ms, tname, ctx)
        if bwd.get("peak_mem_bytes") is None:
            bwd["peak_mem_bytes"] = _peak(ctx, bfns[0])
        del bfns, graphs
    except Exception as e:
        if bwd["ms_rounds"]:  # an earlier round timed it: keep its status (a WRONG stays WRONG), say what this hit
            bwd["note"] = ((bwd["note"] + "; ") if bwd["note"] else "") + \
                f"timing round {len(bwd['ms_rounds']) + 1}: {_err(e)}"
            return False
        bwd["status"], bwd["note"] = "error", _err(e)
        return True
    return False


def retime_impl_case(case: C.Case, impl: Impl, sets, rows: list, ctx: Context):
    """Another timing round of one implementation's rows (checked earlier by ``run_impl_case``)."""
    by_dir = {r["direction"]: r for r in rows}
    fwd, bwd = by_dir.get("fwd"), by_dir.get("bwd")
    # retimed when any of its rows is correct and timed: a correct backward behind a WRONG forward enters
    # the speedups too, and must get as many rounds as every other row
    if fwd is None or fwd["ms"] is None or ctx.cuda_dead or not any(
            r["status"] in ("ok", "unchecked") and r["ms"] is not None for r in rows):
        return
    if bwd is not None and bwd["ms"] is None:
        bwd = None
    try:
        with impl.context(), ctx.timer.stream_ctx():
            _time_directions(case, impl.build(case), sets, fwd, bwd, ctx)
    except Exception as e:  # the first round timed it: keep that, say what the second hit
        fwd["note"] = ((fwd["note"] + "; ") if fwd["note"] else "") + f"timing round 2: {_err(e)}"
        _cleanup(ctx, full=True)


def run_impl_case(case: C.Case, impl: Impl, sets, ref, ref_source, ctx: Context) -> list:
    """The rows (one per direction) of one implementation on one case."""
    train = case.mode == "train"
    rows = {d: _base_row(case, d, impl) for d in case.directions}
    for r in rows.values():
        r["rotation"] = len(sets)
        r["oracle"] = ref_source

    def set_all(status, note=None):
        for r in rows.values():
            if r["status"] is None:
                r["status"], r["note"] = status, note

    if ctx.cuda_dead:
        set_all("error", f"CUDA context lost earlier ({ctx.cuda_dead})")
        return list(rows.values())
    if ctx.over_budget():
        set_all("skipped", f"{BUDGET_SKIP} (--budget) spent")
        return list(rows.values())
    reason = impl.unavailable()
    if reason:
        set_all("error" if isinstance(impl, NormkitImpl) else "n/a", reason)
        return list(rows.values())
    reason = impl.supports(case, ctx.device)
    if reason:
        set_all("n/a", reason)
        return list(rows.values())
    if impl.scoped and ctx.peer_scope == "headline":
        head = ctx.headline_dtypes.get(case.op)
        if head and (case.dtype, case.params) != head:
            set_all("skipped", f"{impl.name} runs on each op's first suite dtype only (--peer-scope all)")
            return list(rows.values())
    if impl.scoped and ctx.scoped_over_budget():
        set_all("skipped", f"{BUDGET_SKIP}: left to the rows of normkit and the eager peers still to come")
        return list(rows.values())
    why = impl.skip(case, "fwd")
    if why:  # the backward needs the forward
        set_all("skipped", why)
        return list(rows.values())
    skip_bwd = impl.skip(case, "bwd") if "bwd" in rows else None

    failed = False
    fwd, bwd = rows["fwd"], rows.get("bwd")
    if skip_bwd:
        bwd["status"], bwd["note"] = "skipped", skip_bwd
        bwd = None
    grad_ctx = torch.enable_grad if train else torch.no_grad
    try:
        with impl.context(), ctx.timer.stream_ctx():
            fn = impl.build(case)
            # ---- check: first call on set 0 (compilation / JIT / autotuning happen here) ---------------
            x0, w0, b0, rm0, rv0 = _leaves(sets[0], train, fresh_stats=True)
            t = time.perf_counter()
            with grad_ctx():
                y0 = fn(x0, w0, b0, rm0, rv0)
            _sync(ctx)
            fwd["first_call_s"] = time.perf_counter() - t
            got = {"y": y0}
            if case.op == "batch_norm" and train:
                got.update(running_mean=rm0, running_var=rv0)
            if ref is None:
                fwd["status"], fwd["note"] = "unchecked", "no oracle"
            else:
                ok, errs, why = compare(got, {k: v for k, v in ref.items() if k in got}, fwd["tol"],
                                        C.DTYPES[case.dtype])
                fwd["errors"] = errs
                fwd["status"] = "ok" if ok else "WRONG"
                fwd["note"] = "; ".join(why) or None
            if bwd is not None:
                try:
                    leaves = [t_ for t_ in (x0, w0, b0) if t_ is not None]
                    t = time.perf_counter()
                    grads = torch.autograd.grad(y0, leaves, sets[0].dy, allow_unused=True)
                    _sync(ctx)
                    bwd["first_call_s"] = time.perf_counter() - t
                    names = ["dx", "dw", "db"][: len(grads)]
                    gotb = dict(zip(names, grads))
                    if ref is None:
                        bwd["status"], bwd["note"] = "unchecked", "no oracle"
                    else:
                        missing = [n for n in names if gotb[n] is None]
                        ok, errs, why = compare(gotb, {k: v for k, v in ref.items() if k in names},
                                                bwd["tol"])
                        if missing:
                            ok, why = False, why + [f"no gradient for {', '.join(missing)}"]
                        bwd["errors"] = errs
                        bwd["status"] = "ok" if ok else "WRONG"
                        bwd["note"] = "; ".join(why) or None
                    del grads, gotb
                except Exception as e:
                    bwd["status"], bwd["note"] = "error", _err(e)
            del y0, got

            # ---- timing --------------------------------------------------------------------------------
            failed = _time_directions(case, fn, sets, fwd, bwd, ctx)
    except Exception as e:
        failed = True
        for r in rows.values():
            if r["status"] in (None, "ok", "WRONG", "unchecked") and r["ms"] is None:
                r["status"], r["note"] = "error", _err(e)
    finally:
        _cleanup(ctx, full=failed)
    for r in rows.values():
        if r["status"] is None:
            r["status"] = "error"
    return list(rows.values())


def run_case(case: C.Case, impls, ctx: Context, progress: Progress | None = None) -> list:
    rows = []
    sets, ref, src = [], None, None
    try:
        if ctx.cuda_dead or ctx.over_budget():
            raise _Skip()
        if ctx.device == "cuda":
            k = C.rotation_count(case, ctx.l2_bytes, "fwd")
        else:
            k = 2 if ctx.quick else 1
        sets = [C.make_inputs(case, ctx.device, seed=ctx.seed + 7919 * i) for i in range(k)]
        try:
            ref, src = oracle(case, sets[0], want_bwd=case.mode == "train")
        except Exception as e:
            ref, src = None, _err(e)
        _sync(ctx)
    except _Skip:
        pass
    except Exception as e:  # inputs could not be made (out of memory, say): every row says so
        msg = _err(e)
        for impl in impls:
            for d in case.directions:
                r = _base_row(case, d, impl)
                r["status"], r["note"] = "error", f"inputs: {msg}"
                rows.append(r)
            if progress:
                progress.update(1, case.label())
        _cleanup(ctx, full=True)
        return rows
    per_impl = []
    for impl in impls:
        per_impl.append(run_impl_case(case, impl, sets, ref, src, ctx))
        if progress:
            progress.update(1, f"{case.label()} {impl.name}")
    del ref
    # Further rounds in alternating order, each row keeping its fastest: on the H200 whichever
    # implementation ran first after the float64 oracle read ~10 % slow (rms 16384x4096 bf16: normkit
    # 0.0748 first vs 0.0682 last, Liger 0.0740 first vs 0.0671 second), whichever it was.
    for rnd in range(1, ctx.rounds):
        order = list(zip(impls, per_impl))
        for impl, impl_rows in (order[::-1] if rnd % 2 else order):
            if not ctx.over_budget():
                retime_impl_case(case, impl, sets, impl_rows, ctx)
    for impl, impl_rows in zip(impls, per_impl):
        rows.extend(impl_rows)
        try:
            impl.finish_case(case)
        except Exception:
            pass
    del sets
    _cleanup(ctx, full=ctx.device == "cuda" and case.tensor_bytes >= (512 << 20))
    return rows


class _Skip(Exception):
    pass


def run_accuracy(ops, suite: dict, impls, ctx: Context, progress: Progress | None = None) -> list:
    """Error against float64 per op, dtype, input kind (randn, randn + 1000) and implementation."""
    out = []
    shapes = C.QUICK_ACCURACY_SHAPES if ctx.quick else C.ACCURACY_SHAPES
    for op in C.OPS:
        if op not in ops or op not in suite:
            continue
        raw = list(shapes[op])
        groups = 0
        if op == "group_norm":
            groups, raw = raw[-1], raw[:-1]
        for dt in suite[op]["dtypes"]:
            dtype, params = (dt, dt) if isinstance(dt, str) else dt
            case = C.Case(op, tuple(raw), C.canon_dtype(dtype), C.canon_dtype(params), "contiguous", "train",
                          groups)
            for kind, offset in (("randn", 0.0), ("randn+1000", 1000.0)):
                try:
                    inp = C.make_inputs(case, ctx.device, seed=ctx.seed + 17, offset=offset)
                    ref, src = oracle(case, inp, want_bwd=True)
                except Exception as e:
                    for impl in impls:
                        out.append(dict(case.key(), input=kind, impl=impl.name, status="error",
                                        note=f"inputs/oracle: {_err(e)}", errors=None))
                    continue
                for impl in impls:
                    row = dict(case.key(), input=kind, impl=impl.name, status=None, note=None, errors=None,
                               tol=tolerance(case), oracle=src)
                    try:
                        reason = impl.unavailable() or impl.supports(case, ctx.device)
                        skip = None if reason else (impl.skip(case, "fwd") or impl.skip(case, "bwd"))
                        if ctx.cuda_dead:
                            row["status"], row["note"] = "error", "CUDA context lost earlier"
                        elif ctx.over_budget():
                            row["status"], row["note"] = "skipped", f"{BUDGET_SKIP} (--budget) spent"
                        elif reason:
                            row["status"] = "error" if isinstance(impl, NormkitImpl) else "n/a"
                            row["note"] = reason
                        elif skip:
                            row["status"], row["note"] = "skipped", skip
                        else:
                            with impl.context(), ctx.timer.stream_ctx():
                                fn = impl.build(case)
                                x, w, b, rm, rv = _leaves(inp, True, fresh_stats=True)
                                with torch.enable_grad():
                                    y = fn(x, w, b, rm, rv)
                                leaves = [t for t in (x, w, b) if t is not None]
                                grads = torch.autograd.grad(y, leaves, inp.dy, allow_unused=True)
                                got = {"y": y}
                                got.update(zip(["dx", "dw", "db"], grads))
                                ok, errs, why = compare(got, ref, row["tol"], C.DTYPES[case.dtype])
                                row["errors"] = errs
                                row["status"] = "ok" if ok else "WRONG"
                                row["note"] = "; ".join(why) or None
                                del y, grads, got
                    except Exception as e:
                        row["status"], row["note"] = "error", _err(e)
                        _cleanup(ctx, full=True)
                    out.append(row)
                if progress:
                    progress.update(1, f"accuracy {case.label()} {kind}")
                del inp, ref
    return out


def accuracy_units(ops, suite) -> int:
    return sum(2 * len(suite[op]["dtypes"]) for op in C.OPS if op in ops and op in suite)


def headline_dtypes(suite: dict) -> dict:
    out = {}
    for op in C.OPS:
        if op in suite and suite[op].get("dtypes"):
            dt = suite[op]["dtypes"][0]
            d, p = (dt, dt) if isinstance(dt, str) else dt
            out[op] = (C.canon_dtype(d), C.canon_dtype(p))
    return out


# Wall-clock model of a suite run on an H200 (--dry-run, the budget's split between ops, the reserve kept
# for unscoped rows). Calibrated on the 2026-11-30 run (batch/layer/RMS norm at the headline dtype, normkit
# + ATen (2 ways) + Liger: 336 rows, 68 s): ~0.06 s per timed direction (check, warm-up, capture, replays,
# peak memory), ~0.1 s + bytes/4 GB/s per case for inputs and the float64 oracle, and first calls (Triton
# JIT, once per new dtype / block-size specialisation) of ~0.7 s per batch-norm case (25 s over 32 cases)
# and ~0.5 s per other case for normkit, ~0.5 s per case for Liger (group norm: ~5 s, its kernels loop
# over blocks of up to 65536 elements at 4 warps: Triton 3.9 compiled its forward for sm_90 in 5.7 s at
# 32768 and 18 s at 65536, fwd and bwd, per dtype). torch.compile: ~1.5 s per direction
# compiled (dynamo, AOTAutograd, Inductor, its Triton kernels in parallel; on CPU, --quick, a train graph
# took ~2.8 s fwd + bwd), ~0.1 s for a case whose dynamic graph exists; ~10 s of Inductor start-up.
# FlagGems: Triton JIT of its autotune configs plus their tuning (fast do_bench, see
# impls.fast_autotune): ~0.6 s per batch-norm case, ~2.5 s per layer-norm / group / instance-norm
# case, ~1.2 s per RMS-norm case. These are estimates (+-50%); the budget, not the model, ends a run.
PER_TIMING_S = 0.06
FIRST_CALL_S = {"normkit": {"batch_norm": 0.7}, "liger": {"group_norm": 5.0}}
FIRST_CALL_DEFAULT_S = {"normkit": 0.5, "liger": 0.5}
FLAGGEMS_CASE_S = {"batch_norm": 0.6, "layer_norm": 2.5, "rms_norm": 1.2, "group_norm": 1.5, "instance_norm": 2.5}
COMPILE_DIR_S = 1.5
COMPILE_STARTUP_S = 10.0


def _compile_key(impl, case):
    if getattr(impl, "dynamic", False):
        return (case.op, case.mode, case.dtype, case.params, case.layout, len(case.shape), case.groups)
    return case


def estimate_seconds(cases, impls, scope: str = "headline", heads: dict | None = None, device: str = "cuda",
                     seen_compile_keys: set | None = None, rounds: int = 2) -> float:
    """Estimated wall-clock seconds of ``cases`` x ``impls`` on an H200 (see the model above), with
    ``rounds`` timing rounds per case."""
    total = 0.0
    seen = set() if seen_compile_keys is None else seen_compile_keys
    started = bool(seen)
    for case in cases:
        total += 0.1 + case.tensor_bytes / 4e9   # inputs, float64 oracle
        for impl in impls:
            if case.op not in impl.ops:
                continue
            if impl.cuda_only and device != "cuda":
                continue
            if impl.name == "liger" and case.op in ("layer_norm", "rms_norm") and case.shape[-1] > 65536:
                continue
            n = len(case.directions)
            if impl.scoped and scope == "headline" and heads and (case.dtype, case.params) != heads.get(case.op):
                continue
            if isinstance(impl, CompileImpl):
                if not started:
                    total += COMPILE_STARTUP_S
                    started = True
                key = _compile_key(impl, case)
                total += 0.1 if key in seen else COMPILE_DIR_S * n
                seen.add(key)
            elif impl.name == "flaggems":
                total += FLAGGEMS_CASE_S.get(case.op, 2.0)
            elif impl.name in FIRST_CALL_DEFAULT_S:
                total += FIRST_CALL_S[impl.name].get(case.op, FIRST_CALL_DEFAULT_S[impl.name])
            total += PER_TIMING_S * n * rounds
    return total


def unscoped(impls) -> list:
    return [i for i in impls if not i.scoped]


def fmt_s(s: float) -> str:
    return f"{int(s // 60)}m{int(s % 60):02d}s"


__all__ = ["Context", "run_case", "run_accuracy", "copy_bandwidth", "copy_nbytes", "device_info", "git_sha",
           "run_metadata"]
