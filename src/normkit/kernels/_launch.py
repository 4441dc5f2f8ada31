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

The direct path is taken on CUDA only (the interpreter runs kernels through ``kernel[grid]``). It is off
with ``NORMKIT_DIRECT_LAUNCH=0``; if a direct launch ever raises ``TypeError`` / ``AttributeError`` /
``ImportError`` (a Triton whose launcher takes other arguments, or without ``triton.knobs``), it
switches itself off for the process and that call goes through Triton's own path.
"""

from __future__ import annotations

import inspect
import os

import torch

_I32 = 1 << 31
_I64 = 1 << 63

_cache: dict = {}
_signatures: dict = {}
_direct = os.environ.get("NORMKIT_DIRECT_LAUNCH", "1") != "0"

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


def direct_enabled() -> bool:
    """Whether CUDA launches bypass Triton's binder (see the module doc)."""
    return _direct


def set_direct(on: bool) -> None:
    """Turn the direct path on or off (benchmarks compare both); clears the cache."""
    global _direct
    _direct = bool(on)
    _cache.clear()


def _key_args(kernel, args) -> tuple:
    """What Triton specializes on in the positional arguments: a tensor's dtype and 16-byte alignment; an
    int's == 1, divisibility by 16 and integer type (i32 / i64 / u64); a constexpr's value. One loop
    without helper calls: it runs for every argument of every launch (host time, module doc)."""
    consts = _signature(kernel)[1]
    key = []
    add = key.append
    for i, a in enumerate(args):
        t = type(a)
        if i in consts:
            add(("c", a))
        elif t is int:  # (bool is not int here: type(True) is bool)
            add((a == 1, a % 16 == 0, 32 if -_I32 <= a < _I32 else 64 if a < _I64 else 65))
        elif t is float:
            add("f")
        elif t is torch.Tensor or isinstance(a, torch.Tensor):
            add((a.dtype, a.data_ptr() % 16 == 0))
        else:  # bool, None, anything else (e.g. a tl.dtype): by value, hashable
            add(("v", a))
    return tuple(key)


def _signature(kernel) -> tuple:
    """(parameters, positions of the constexpr ones) of a kernel, computed once: constexprs are keyed by
    value (each value is its own binary), and the launcher takes every parameter in this order."""
    sig = _signatures.get(kernel)
    if sig is None:
        params = tuple(inspect.signature(kernel.fn).parameters.values())
        consts = frozenset(i for i, p in enumerate(params) if "constexpr" in str(p.annotation))
        consts |= frozenset(getattr(kernel, "constexprs", ()))  # Triton's own list, where it has one
        sig = _signatures[kernel] = (params, consts)
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
    if not (_direct and args[0].is_cuda):
        kernel[grid](*args, **kwargs)
        return
    device = torch.cuda.current_device()
    key = (kernel, device, _key_args(kernel, args), tuple(kwargs.items()))
    hit = _cache.get(key)
    if hit is None:
        compiled = kernel[grid](*args, **kwargs)
        if compiled is not None:
            _cache[key] = (compiled, _tail(kernel, len(args), kwargs))
        return
    compiled, tail = hit
    try:
        _run_compiled(compiled, grid, device, args + tail)
    except (TypeError, AttributeError, ImportError):
        # a launcher with another calling convention, or no triton.knobs (another Triton version): use
        # Triton's path for good
        _direct = False
        _cache.clear()
        kernel[grid](*args, **kwargs)


_runtime_knobs = None  # triton.knobs.runtime, imported on the first direct launch


def _run_compiled(compiled, grid, device, all_args):
    global _runtime_knobs
    if _runtime_knobs is None:
        from triton import knobs

        _runtime_knobs = knobs.runtime
    rt = _runtime_knobs
    stream = torch._C._cuda_getCurrentRawStream(device)
    g0 = grid[0]
    g1 = grid[1] if len(grid) > 1 else 1
    g2 = grid[2] if len(grid) > 2 else 1
    meta = compiled.launch_metadata(grid, stream, *all_args)
    compiled.run(g0, g1, g2, stream, compiled.function, compiled.packed_metadata, meta,
                 rt.launch_enter_hook, rt.launch_exit_hook, *all_args)
