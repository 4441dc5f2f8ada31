"""Direct kernel launches: Triton's compiled kernel called without its per-call binder.

``kernel[grid](*args, **kw)`` costs 30-45 µs of host time per launch on the H200 machine (Triton 3.6):
it binds every argument, builds a cache key from strings, reads several knobs and checks globals before
the C launcher runs. Normalization calls launch 1-3 kernels each, so for models with many small norms
(channels_last ResNet-50, ViT) that host time, not the GPU, sets the step time.

``launch(kernel, grid, *args, **kw)`` keeps the ``CompiledKernel`` that Triton returns from the first
launch of each specialization and afterwards calls its launcher directly. The cache key holds everything
Triton specializes on, or more: each tensor's dtype and 16-byte alignment; for each int whether it is 1,
divisible by 16 and its integer type's range; the value of every constexpr, whether passed by keyword or
by position; every launch option. A key at least as fine as Triton's means a hit always reuses the binary
Triton itself would pick.

On Triton 3.6 (whose calling convention it follows) a hit goes one step further: it calls the C
launcher itself, skipping the Python wrapper that allocates scratch memory per launch (kernels that need
none), with tensors passed as data pointers: for a tensor the C launcher calls ``data_ptr()`` and asks the
driver whether the pointer is a device pointer, per argument and launch. normkit validated the devices
before launching. Launch hooks (e.g. a profiler's) still go through Triton's wrapper.

The direct path is taken on CUDA only (the interpreter runs kernels through ``kernel[grid]``). It is off
with ``NORMKIT_DIRECT_LAUNCH=0``; if a direct launch ever raises ``TypeError`` / ``AttributeError`` /
``ImportError`` (a Triton whose launcher takes other arguments, or without ``triton.knobs``), it
switches itself off for the process and that call goes through Triton's own path.
"""

from __future__ import annotations

import inspect
import os
import threading

import torch

_I32 = 1 << 31
_I64 = 1 << 63

_cache: dict = {}
_signatures: dict = {}
_raw_counts: dict = {"raw": 0}
_direct = os.environ.get("NORMKIT_DIRECT_LAUNCH", "1") != "0"
_raw = True  # within the direct path: Triton's C launcher called without its Python wrapper (set_direct)

try:  # grid dependency control, for programmatic dependent launch (pdl_on); absent in old Tritons
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:
    gdc_launch_dependents = gdc_wait = None
_sm90: dict = {}


def pdl_on(t, enabled) -> bool:
    """Whether a kernel that follows another kernel of the same call may be launched with programmatic
    dependent launch (``launch_pdl=True``, the kernel calling ``gdc_wait`` before it reads what its
    predecessor wrote): ``enabled`` (the kernel module's knob), a CUDA tensor on an NVIDIA sm_90+ device
    (not ROCm, whose capability numbers also reach 9), and a Triton with grid dependency control. Never for
    a call's first kernel: its inputs come from kernels that do not signal."""
    if not (enabled and t.is_cuda):
        return False
    return pdl_supported(t.device.index if t.device.index is not None else torch.cuda.current_device())


def pdl_trigger(pdl: bool) -> dict:
    """Launch kwargs of the kernel a PDL-launched kernel follows: its ``PDL`` constexpr, which makes it
    call ``gdc_launch_dependents`` first thing (none when ``pdl`` is off: the launch key stays as it was)."""
    return {"PDL": True} if pdl else {}


def pdl_follow(pdl: bool) -> dict:
    """Launch kwargs of a kernel launched with programmatic dependent launch: ``launch_pdl`` and its
    ``PDL`` constexpr (``gdc_wait`` before reading its predecessor's output)."""
    return {"PDL": True, "launch_pdl": True} if pdl else {}


def pdl_supported(index: int) -> bool:
    """Whether CUDA device ``index`` and this Triton support programmatic dependent launch (cached)."""
    if gdc_wait is None or torch.version.hip is not None:
        return False
    ok = _sm90.get(index)
    if ok is None:
        ok = _sm90[index] = torch.cuda.get_device_capability(index)[0] >= 9
    return ok


_smem: dict = {}
_H200_SMEM = 232448  # 227 KB: what the interpreter is sized as, so CPU tests take the H200's pipeline stages
_SMEM_SCRATCH = 4096  # a pipelined kernel's own shared memory beside its stages (reductions, layout changes)


def shared_memory_per_block(t) -> int:
    """The most shared memory one program may take on t's device, the number Triton's launcher checks (cached):
    227 KB on sm_90 / sm_100, 163 KB on sm_80, 99 KB on sm_86 / 89 / 120 (RTX 30xx-50xx, A10, L4, L40S)."""
    if not t.is_cuda:
        return _H200_SMEM
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    v = _smem.get(index)
    if v is None:
        from triton.runtime import driver

        v = _smem[index] = int(driver.active.utils.get_device_properties(index)["max_shared_mem"])
    return v


def fit_stages(t, stages: int, stage_bytes: int, budget: int = 0) -> int:
    """The most software-pipeline stages, at most ``stages``, whose buffers (``stages - 1`` of ``stage_bytes``
    in flight) fit in a program's shared memory on t's device and in ``budget`` bytes where given: the stages
    were chosen on the H200, and a launch asking for more shared memory than the device has fails."""
    room = shared_memory_per_block(t) - _SMEM_SCRATCH
    if budget:
        room = min(room, budget)
    return max(1, min(stages, 1 + room // max(1, stage_bytes)))


def direct_enabled() -> bool:
    """Whether CUDA launches bypass Triton's binder (see the module doc)."""
    return _direct


def set_direct(on: bool, raw: bool = True) -> None:
    """Turn the direct path on or off, and within it the call of Triton's C launcher without its Python
    wrapper (benchmarks compare all three); clears the cache."""
    global _direct, _raw
    _direct = bool(on)
    _raw = bool(raw)
    _cache.clear()
    from normkit.kernels import _plan  # (plans hold raw launchers taken from this cache)

    _plan.clear()


def _key_args(kernel, args) -> tuple:
    """(key, launch args). The key: what Triton specializes on in the positional arguments, a tensor's
    dtype and 16-byte alignment; an int's == 1, divisibility by 16 and integer type (i32 / i64 / u64); a
    constexpr's value. The launch args: ``args`` with every tensor replaced by its data pointer, which
    Triton's C launcher takes as is (a tensor costs it a ``data_ptr()`` call and a driver query each).
    One loop without helper calls: it runs for every argument of every launch (host time, module doc)."""
    consts = _signature(kernel)[1]
    key = []
    add = key.append
    out = []
    put = out.append
    for i, a in enumerate(args):
        t = type(a)
        if i in consts:
            add(("c", a))
        elif t is int:  # (bool is not int here: type(True) is bool)
            add((a == 1, a % 16 == 0, 32 if -_I32 <= a < _I32 else 64 if a < _I64 else 65))
        elif t is float:
            add("f")
        elif t is torch.Tensor or isinstance(a, torch.Tensor):
            ptr = a.data_ptr()
            add((a.dtype, ptr % 16 == 0))
            put(ptr)
            continue
        else:  # bool, None, anything else (e.g. a tl.dtype): by value, hashable
            add(("v", a))
        put(a)
    return tuple(key), out


def _signature(kernel) -> tuple:
    """(parameters, positions of the constexpr ones, the kernel) of a kernel, computed once and held by its
    id: constexprs are keyed by value (each value is its own binary), and the launcher takes every
    parameter in this order."""
    sig = _signatures.get(id(kernel))
    if sig is None:
        params = tuple(inspect.signature(kernel.fn).parameters.values())
        consts = frozenset(i for i, p in enumerate(params) if "constexpr" in str(p.annotation))
        consts |= frozenset(getattr(kernel, "constexprs", ()))  # Triton's own list, where it has one
        sig = _signatures[id(kernel)] = (params, consts, kernel)  # (the kernel keeps its id unique)
    return sig


def _tail(kernel, n_args: int, kwargs: dict) -> tuple:
    """The values of the parameters after the positional ones, in the kernel's parameter order:
    constexprs from kwargs, else their defaults."""
    out = []
    for p in _signature(kernel)[0][n_args:]:
        if p.name in kwargs:
            out.append(kwargs[p.name])
        elif p.default is not inspect.Parameter.empty:
            out.append(p.default)
        else:
            raise TypeError(f"{kernel.fn.__name__}: missing argument {p.name!r}")
    return tuple(out)


def launch(kernel, grid, *args, **kwargs):
    """``kernel[grid](*args, **kwargs)``, through the cached compiled kernel on CUDA (module doc).
    The first positional argument must be a tensor on the launch device."""
    global _direct
    # FMA contraction stated, not left to Triton's default: the kernels were measured and their bits tested with
    # it on (Triton <= 3.9's default), and Triton 3.10 turns the default off; a kernel that must not contract
    # (layer norm's backward) passes False
    kwargs.setdefault("enable_fp_fusion", True)
    rec = _recording.rec
    if rec is not None:  # (only a recorded call passes Scalar placeholders)
        held, args = args, tuple(a.value if type(a) is Scalar else a for a in args)
    if not (_direct and args[0].is_cuda):
        if rec is not None:
            rec.replayable = False
        kernel[grid](*args, **kwargs)
        return
    device = torch._C._cuda_getDevice()
    arg_key, launch_args = _key_args(kernel, args)
    # id(kernel): a JITFunction's hash is computed in Python from its source key (~1 µs a launch, twice);
    # _signatures holds every kernel seen, so an id is never reused for another one
    key = (id(kernel), device, arg_key, tuple(kwargs.items()))
    if rec is not None:
        rec.launches.append((key, held, grid))
    hit = _cache.get(key)
    if hit is None:
        compiled = kernel[grid](*args, **kwargs)
        if compiled is not None:
            _cache[key] = (compiled, _tail(kernel, len(args), kwargs), _raw_launcher(compiled))
        return
    compiled, tail, raw = hit
    try:
        _run_compiled(compiled, raw, grid, device, args, launch_args, tail)
    except (TypeError, AttributeError, ImportError):
        # a launcher with another calling convention, or no triton.knobs (another Triton version): use
        # Triton's path for good
        _direct = False
        _cache.clear()
        from normkit.kernels import _plan  # (plans hold raw launchers of this cache)

        _plan.clear()
        if rec is not None:
            rec.replayable = False
        kernel[grid](*args, **kwargs)


class _Recording(threading.local):
    rec = None  # the launcher call being recorded on this thread (normkit.kernels._plan), else None


_recording = _Recording()


class Recorder:
    """What one launcher call did: its launches (cache key, positional args, grid) and the tensors it
    allocated through ``alloc``; ``replayable`` turns False when a launch took Triton's own path."""

    __slots__ = ("launches", "allocs", "replayable")

    def __init__(self):
        self.launches, self.allocs, self.replayable = [], [], True


class Scalar:
    """A float argument a plan takes from each call (``_plan.planned``'s ``scalars[slot]``), not from the
    recorded one: a momentum of 1/num_batches_tracked changes every step, and keyed by value it would make
    a plan a step."""

    __slots__ = ("value", "slot")

    def __init__(self, value: float, slot: int):
        self.value, self.slot = float(value), slot


def scalar(value: float, slot: int):
    """``value`` for a kernel argument; while a call is recorded, a Scalar placeholder that tells the plan
    to take it from slot ``slot`` of each call's scalars."""
    return Scalar(value, slot) if _recording.rec is not None else value


def alloc(t):
    """A launcher's new tensor (an output or scratch), noted when the call is being recorded."""
    rec = _recording.rec
    if rec is not None:
        rec.allocs.append(t)
    return t


def _raw_launcher(compiled):
    """``(launch, function, cooperative, pdl, packed metadata)`` to call Triton's C launcher without its
    Python wrapper (``CudaLauncher.__call__``, which allocates scratch memory per launch), or None: only
    for the Triton whose calling convention this follows (3.6's ``driver.py``: grid, stream, function,
    cooperative, pdl, global and profile scratch, packed metadata, launch metadata, enter and exit hooks,
    then every parameter) and kernels that need no scratch memory. Why not, when not: ``raw_summary()``."""
    if not (_raw and _RAW_TRITON):
        return _no_raw("off" if not _raw else "triton version")
    run = getattr(compiled, "run", None)
    if type(run).__name__ != "CudaLauncher":
        return _no_raw(f"launcher {type(run).__name__}")
    try:
        if run.global_scratch_size or run.profile_scratch_size:
            return _no_raw("scratch memory")
        raw = (run.launch, compiled.function, bool(run.launch_cooperative_grid), bool(run.launch_pdl),
               compiled.packed_metadata)
    except AttributeError as e:
        return _no_raw(f"AttributeError {e}")
    _raw_counts["raw"] += 1
    return raw


def _no_raw(reason):
    _raw_counts[reason] = _raw_counts.get(reason, 0) + 1
    return None


def raw_summary() -> dict:
    """Compiled kernels cached since the process started, by whether a hit calls the C launcher itself
    ("raw") or, with the reason, Triton's launcher wrapper."""
    return dict(_raw_counts)


def _triton_minor() -> tuple:
    try:
        import triton

        return tuple(int(v) for v in triton.__version__.split(".")[:2])
    except (ImportError, ValueError):
        return ()


_RAW_TRITON = _triton_minor() == (3, 6)


def _no_hook(hook) -> bool:
    """No launch hook installed: None, or (Triton 3.6) an empty ``HookChain`` (never None there)."""
    return hook is None or not getattr(hook, "calls", True)
_runtime_knobs = None  # triton.knobs.runtime, imported on the first direct launch


def _knobs():
    """triton.knobs.runtime (the launch hooks), imported once."""
    global _runtime_knobs
    if _runtime_knobs is None:
        from triton import knobs

        _runtime_knobs = knobs.runtime
    return _runtime_knobs


def hooks_installed() -> bool:
    rt = _knobs()
    return not (_no_hook(rt.launch_enter_hook) and _no_hook(rt.launch_exit_hook))


def _run_compiled(compiled, raw, grid, device, args, launch_args, tail):
    rt = _knobs()
    stream = torch._C._cuda_getCurrentRawStream(device)
    g0 = grid[0]
    g1 = grid[1] if len(grid) > 1 else 1
    g2 = grid[2] if len(grid) > 2 else 1
    enter, exit_ = rt.launch_enter_hook, rt.launch_exit_hook
    if raw is not None and _no_hook(enter) and _no_hook(exit_):
        fn, function, coop, pdl, packed = raw
        fn(g0, g1, g2, stream, function, coop, pdl, None, None, packed, None, None, None, *launch_args, *tail)
        return
    all_args = args + tail
    meta = compiled.launch_metadata(grid, stream, *all_args)
    compiled.run(g0, g1, g2, stream, compiled.function, compiled.packed_metadata, meta, enter, exit_, *all_args)
