"""Launch plans: a kernel launcher's call replayed without its Python.

A batch-norm forward spends most of its host time outside the GPU work: the view of the input, the grid
configuration, 5 allocations and, per launch, the cache key of ``_launch.launch`` (~20 arguments). For a
given call signature (shapes, strides, dtypes, which optional tensors are given, eps, flags, knobs) all of
that is the same every time except the data pointers and the momentum. ``planned(key, inputs, run)`` records the first
call with that key: every launch (its cached compiled kernel, grid, positional arguments) and every
tensor the launcher allocated through ``_launch.alloc``. Later calls replay it: allocate the same
tensors, then call each kernel's C launcher with the new data pointers put where the recorded call had
its inputs and allocations, and return the outputs in the same places.

A plan is only made when the recording shows nothing else happened: every tensor a kernel received is
(a view into) an input or a noted allocation (a copy made by the launcher, e.g. of a non-dense input,
means no plan), every output is one of those, and every launch could take the raw C-launcher call
(``_launch._raw_launcher``). What a recording cannot see is other GPU work on those tensors, so a
launcher must do none: a buffer it zeroes (arrival counters) is allocated without ``alloc``, and a call
that needs one gets no plan. A replay falls back to the launcher when an input's 16-byte alignment
differs from the recorded call's (another specialization), the current device is another one, or a
launch hook is installed. The caller's key must hold the rest of what the launcher's decisions depend
on (flags, knobs); a float the launcher passes as ``_launch.scalar(value, slot)`` is taken from each
call's ``scalars[slot]`` (the momentum: one plan for every value) and stays out of the key. A signature
that gives no plan is remembered, so its calls run the launcher without recording.

``planned`` adds every input's shape, strides and dtype to the caller's key (computed by the native module's
``signature`` once it is loaded): a launcher decides from
them (a strided weight is copied dense, a contiguous one is read in place), so a plan recorded for one
is wrong for another. A call that passes one tensor in two slots (weight as bias) is never recorded: its
kernels cannot say which slot a pointer came from, and a replay with two tensors would read one twice.

A replay runs in C++ once ``_native``'s extension (``_replay.cpp``) is built and loaded: the first CUDA
plan starts its build in a background thread; until it loads, and wherever it cannot pack a launch's
parameters, the Python replay below runs. Both fill the same holes with the same values (CUDA tests: same
bits). Measured on the H200 machine (session 25): a batch-norm launcher call 51 -> 34 µs (forward) and 40 ->
25 µs (backward), ``F.batch_norm`` forward + backward under ``enable()`` 427 -> 369 µs (NCHW), 527 -> 431
µs (channels_last).

Used by the batch-norm launchers (``bn_forward_train``, ``bn_forward_eval``, ``bn_backward``) and the
layer / RMS norm ones (``ln_forward``, ``rms_forward``, ``ln_backward``, ``rms_backward``), and group norm's
(``gn_forward``, ``gn_backward``) where its ``_CFG["plans"]`` is on (off until its CUDA test has run). On by default;
off with ``NORMKIT_LAUNCH_PLANS=0`` or ``set_plans(False)``. Measured on the H200 machine
(``benchmarks/host_overhead.py`` mode "plan", benchmarks/NOTES-host-overhead.md): the batch-norm forward
launcher 76 -> 36 µs, backward 69 -> 29 µs, ``F.batch_norm`` forward + backward under ``enable()`` 368 ->
214 µs.
"""

from __future__ import annotations

import ctypes
import os
import struct

import torch

from normkit.kernels import _launch, _native

_MISSING = object()
_plans: dict = {}
# keys hold eps, flags, shapes and knobs: a program that calls with ever new ones (shapes that change every
# step) would grow the table without end, so the number of plans is capped (calls past it run the launcher)
MAX_PLANS = 1024
_on = os.environ.get("NORMKIT_LAUNCH_PLANS", "1") != "0"


def enabled() -> bool:
    return _on


def set_plans(on: bool) -> None:
    global _on
    _on = bool(on)
    _plans.clear()


def clear() -> None:
    _plans.clear()


def planned(key, inputs: tuple, run, scalars: tuple = ()):
    """``run()`` (a launcher call on ``inputs``, CUDA tensors or None) through the plan recorded for
    ``key``; the first call with a key records it. ``scalars``: the floats the launcher passes as
    ``_launch.scalar(scalars[slot], slot)``, put into a replay's launches from this call."""
    mod = _native._module
    if mod is not None and _native._on:  # (the same key in C++: one call instead of ~3 per input)
        sig = mod.signature(inputs)
        if sig is None:
            return run()
        key = (key, sig)
    else:
        present = [t for t in inputs if t is not None]
        if len({id(t) for t in present}) != len(present):
            return run()
        key = (key, tuple(None if t is None else (t.shape, t.stride(), t.dtype) for t in inputs))
    plan = _plans.get(key, _MISSING)
    if plan is _MISSING:
        if len(_plans) >= MAX_PLANS:
            return run()
        rec = _launch.Recorder()
        _launch._recording.rec = rec
        try:
            out = run()
        finally:
            _launch._recording.rec = None
        _plans[key] = _build(rec, inputs, out, len(scalars))
        return out
    if plan is not None:
        out = plan.replay(inputs, scalars)
        if out is not None:
            return out
    return run()


def signature(inputs: tuple):
    """The native module's signature of ``inputs`` (device, dtype, sizes, strides per tensor; bytes), or None:
    no native module loaded (or off), aliased slots, a tensor that is not plain strided."""
    mod = _native._module
    return mod.signature(inputs) if mod is not None and _native._on else None


def recorded(key, sig: bytes) -> bool:
    """Whether ``planned`` holds a plan for ``key`` and inputs of signature ``sig``."""
    return _plans.get((key, sig)) is not None


def replay_only(key, inputs: tuple, sig: bytes, scalars: tuple = ()):
    """The outputs of the plan ``planned`` recorded for ``key`` and inputs of signature ``sig`` (``signature``),
    replayed; None where there is none (nothing is recorded) or its replay does not apply."""
    if not _on:
        return None
    plan = _plans.get((key, sig))
    return plan.replay(inputs, scalars) if plan is not None else None


class _Plan:
    """allocs: per noted allocation, (shape, stride, dtype) of an output tensor, or the byte offset of a
    scratch buffer inside one uint8 allocation of ``scratch`` bytes (one allocation instead of several:
    the kernels only see pointers). aligned: (input slot, byte offset mod 16, 16-byte aligned) per
    pointer a kernel got from an input, part of that kernel's binary. steps: per launch, the raw
    launcher, the grid, the arguments with a hole per pointer and per scalar, (position, slot, byte offset)
    per pointer hole and (position, scalar slot) per scalar hole."""

    __slots__ = ("device", "n_inputs", "aligned", "allocs", "scratch", "steps", "outs", "types", "native")

    def __init__(self, device, n_inputs, aligned, allocs, scratch, steps, outs, types):
        self.device, self.n_inputs, self.aligned, self.allocs, self.scratch = device, n_inputs, aligned, allocs, scratch
        self.steps, self.outs, self.types = steps, outs, types
        self.native = _MISSING  # the native plan (``_native``), None where it cannot take this one

    def replay(self, inputs, scalars=()):
        """The outputs, or None where the recorded call does not apply (module doc)."""
        if _launch.hooks_installed() or torch._C._cuda_getDevice() != self.device:
            return None
        if _native._on:
            native = self.native
            if native is _MISSING:
                native = self._make_native()
            if native is not None:
                stream = torch._C._cuda_getCurrentRawStream(self.device)
                return _native.module().replay(native, inputs, tuple(scalars), stream)
        ptrs = [None if t is None else t.data_ptr() for t in inputs]
        for slot, off, aligned in self.aligned:
            if ((ptrs[slot] + off) & 15 == 0) != aligned:
                return None
        dev = next(t for t in inputs if t is not None).device
        scratch = torch.empty((self.scratch,), dtype=torch.uint8, device=dev) if self.scratch else None
        base = scratch.data_ptr() if scratch is not None else 0
        new = []
        for a in self.allocs:
            if type(a) is int:
                new.append(None)
                ptrs.append(base + a)
            else:
                t = torch.empty_strided(a[0], a[1], dtype=a[2], device=dev)
                new.append(t)
                ptrs.append(t.data_ptr())
        stream = torch._C._cuda_getCurrentRawStream(self.device)
        for (fn, function, coop, pdl, packed), (g0, g1, g2), base, fill, fill_scalars, tail in self.steps:
            args = base.copy()
            for pos, slot, off in fill:
                args[pos] = ptrs[slot] + off
            for pos, slot in fill_scalars:
                args[pos] = scalars[slot]
            fn(g0, g1, g2, stream, function, coop, pdl, None, None, packed, None, None, None, *args, *tail)
        tensors = list(inputs) + new
        return tuple(None if slot is None else tensors[slot] for slot in self.outs)

    def _make_native(self):
        """This plan in ``_native``'s module (kept in ``self.native``; None where a launch has a parameter
        type or option it does not pack), or None, not kept, while the module is not loaded (the first
        call starts its build)."""
        mod = _native.module()
        if mod is None:
            _native.start()
            return None
        self.native = None
        steps = []
        for ((_, function, coop, pdl, packed), grid, base, fill, fill_scalars, tail), types in zip(self.steps,
                                                                                                  self.types):
            params = _native_params(types, base, fill, fill_scalars, tail)
            # (Triton 3.6's packed metadata: num_warps, num_ctas, shared memory; clusters are not packed here)
            if params is None or type(function) is not int or not (type(packed) is tuple and len(packed) == 3):
                return None
            num_warps, num_ctas, shared = packed
            if num_ctas != 1:
                return None
            steps.append((function, *grid, 32 * num_warps, shared, coop, pdl, params))
        allocs = [a if type(a) is int else (a[0], a[1], a[2]) for a in self.allocs]
        outs = [-1 if slot is None else slot for slot in self.outs]
        try:
            self.native = mod.make_plan(self.device, self.n_inputs, list(self.aligned), allocs, self.scratch, steps,
                                        outs)
        except (TypeError, ValueError, OverflowError):  # a value it cannot hold: the Python replay stays
            return None
        return self.native


_INT_BITS = {"i1": 8, "i8": 8, "i16": 16, "i32": 32, "i64": 64, "u1": 8, "u8": 8, "u16": 16, "u32": 32, "u64": 64}


def _const_bits(ty: str, v):
    """The bytes Triton 3.6's launcher passes for value ``v`` of signature type ``ty``, as an int (the
    little-endian value, zero above the type's width); None for a type the native replay does not pack."""
    if ty.startswith("*"):
        return 0 if v is None else int(v) if type(v) is int else None
    if ty in _INT_BITS:
        return int(v) & ((1 << _INT_BITS[ty]) - 1)
    if ty in ("fp32", "f32"):
        return int.from_bytes(bytes(ctypes.c_float(v)), "little")  # (float)v, inf past the range, as C
    if ty == "bf16":  # the launcher's pack_bf16: the fp32 bits' top half
        return int.from_bytes(bytes(ctypes.c_float(v)), "little") >> 16
    if ty == "fp64":
        return struct.unpack("<Q", struct.pack("<d", v))[0]
    return None


def _native_params(types, base, fill, fill_scalars, tail):
    """A launch's parameters for ``_native``'s ``make_plan``: per non-constexpr parameter of the kernel's
    signature, (0, bits, 0) a constant, (1, slot, offset) a pointer hole, (2 | 3, scalar slot, 0) an fp32 /
    fp64 scalar hole; None where the signature is unknown or holds a type the replay does not pack."""
    values = list(base) + list(tail)
    if types is None or len(types) != len(values):
        return None
    holes = {pos: (1, slot, off) for pos, slot, off in fill}
    scalar_holes = dict(fill_scalars)
    out = []
    for pos, (ty, v) in enumerate(zip(types, values)):
        if not isinstance(ty, str):
            return None  # a tuple parameter
        if ty == "constexpr":
            continue
        if pos in holes:
            if not ty.startswith("*"):
                return None
            out.append(holes[pos])
        elif pos in scalar_holes:
            kind = 2 if ty in ("fp32", "f32") else 3 if ty == "fp64" else None
            if kind is None:
                return None
            out.append((kind, scalar_holes[pos], 0))
        else:
            bits = _const_bits(ty, v)
            if bits is None:
                return None
            out.append((0, bits, 0))
    return out


def _build(rec, inputs, outputs, n_scalars=0):
    """The plan of a recorded call, or None where it cannot be replayed (module doc; a launch argument
    passed as a scalar slot the caller did not give is one)."""
    if not rec.replayable or not rec.launches:
        return None
    slots = {}
    for i, t in enumerate(inputs):
        if t is not None:
            slots.setdefault(id(t), i)
    returned = {id(t) for t in outputs if t is not None}
    allocs = []
    scratch = 0
    for j, t in enumerate(rec.allocs):
        slots[id(t)] = len(inputs) + j
        if id(t) in returned:
            allocs.append((tuple(t.shape), t.stride(), t.dtype))
        else:  # scratch: a 512-byte aligned piece of one buffer, as the allocator would align it
            allocs.append(scratch)
            scratch += -(-t.numel() * t.element_size() // 512) * 512
    # where each candidate's elements lie: a kernel may get a view of an input or allocation (a reshape,
    # a row of a scratch tensor), replayed as the same byte offset from the new pointer
    spans = [(t.data_ptr(), t.data_ptr() + _span(t), i) for i, t in enumerate(inputs) if t is not None]
    spans += [(t.data_ptr(), t.data_ptr() + _span(t), len(inputs) + j) for j, t in enumerate(rec.allocs)]
    aligned = {}  # (input slot, offset mod 16) -> whether the kernel's pointer was 16-byte aligned
    steps = []
    types = []  # per launch, its kernel's signature types (the native replay packs by them), or None
    device = None
    for key, args, grid in rec.launches:
        hit = _launch._cache.get(key)
        if hit is None or hit[2] is None:
            return None
        device = key[1]
        base, fill, fill_scalars = [], [], []
        for pos, a in enumerate(args):
            if type(a) is _launch.Scalar:
                if not 0 <= a.slot < n_scalars:
                    return None
                fill_scalars.append((pos, a.slot))
                base.append(None)
            elif isinstance(a, torch.Tensor):
                slot, off = slots.get(id(a)), 0
                if slot is None:
                    slot, off = _inside(a, spans)
                    if slot is None:
                        return None  # a tensor the launcher made without noting it (a copy): not replayable
                if slot < len(inputs):
                    aligned[(slot, off % 16)] = a.data_ptr() & 15 == 0
                fill.append((pos, slot, off))
                base.append(None)
            else:
                base.append(a)
        g = (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)
        steps.append((hit[2], g, base, tuple(fill), tuple(fill_scalars), hit[1]))
        types.append(_signature_types(hit[0]))
    outs = []
    for t in outputs:
        slot = None if t is None else slots.get(id(t))
        if t is not None and slot is None:
            return None
        outs.append(slot)
    checks = tuple((slot, off, ok) for (slot, off), ok in aligned.items())
    return _Plan(device, len(inputs), checks, tuple(allocs), scratch, tuple(steps), tuple(outs), tuple(types))


def _signature_types(compiled):
    """The types of a compiled kernel's parameters in order (Triton's ``src.signature``), or None."""
    sig = getattr(getattr(compiled, "src", None), "signature", None)
    return tuple(sig.values()) if isinstance(sig, dict) else None


def _span(t) -> int:
    """Bytes from a tensor's first element to the end of its last one."""
    if t.numel() == 0:
        return 0
    return (sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1) * t.element_size()


def _inside(a, spans):
    """(slot, byte offset) of the one input or allocation whose elements hold all of ``a``'s, else
    (None, 0): no such tensor (a copy), or several (aliased inputs: which one a replay should follow is
    unknown)."""
    lo, hi = a.data_ptr(), a.data_ptr() + _span(a)
    found = {slot: lo - start for start, end, slot in spans if start <= lo and hi <= end}
    if len(found) != 1:
        return None, 0
    return next(iter(found.items()))
