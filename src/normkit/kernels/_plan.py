"""Launch plans: a kernel launcher's call replayed without its Python.

A batch-norm forward spends most of its host time outside the GPU work: the view of the input, the grid
configuration, 5 allocations and, per launch, the cache key of ``_launch.launch`` (~20 arguments). For a
given call signature (shapes, strides, dtypes, which optional tensors are given, scalars, knobs) all of
that is the same every time except the data pointers. ``planned(key, inputs, run)`` records the first
call with that key: every launch (its cached compiled kernel, grid, positional arguments) and every
tensor the launcher allocated through ``_launch.alloc``. Later calls replay it: allocate the same
tensors, then call each kernel's C launcher with the new data pointers put where the recorded call had
its inputs and allocations, and return the outputs in the same places.

A plan is only made when the recording shows nothing else happened: every tensor a kernel received is an
input or a noted allocation (a copy made by the launcher, e.g. of a non-dense input, means no plan),
every output is one of those, and every launch could take the raw C-launcher call
(``_launch._raw_launcher``). A replay falls back to the launcher when an input's 16-byte alignment
differs from the recorded call's (another specialization), the current device is another one, or a
launch hook is installed. The caller's key must hold everything else the launcher's decisions depend
on. A signature that gives no plan is remembered, so its calls run the launcher without recording.

Used by the batch-norm launchers (``bn_forward_train``, ``bn_forward_eval``, ``bn_backward``) and the
layer / RMS norm ones (``ln_forward``, ``rms_forward``, ``ln_backward``, ``rms_backward``). Off unless
``NORMKIT_LAUNCH_PLANS=1`` or ``set_plans(True)``: prepared in session 9, measured on the
GPU only in the next one (``benchmarks/host_overhead.py`` mode "plan").
"""

from __future__ import annotations

import os

import torch

from normkit.kernels import _launch

_MISSING = object()
_plans: dict = {}
# keys hold scalars: a momentum of 1/num_batches_tracked (momentum=None modules) is a new key every step,
# so the number of plans is capped (calls past it run the launcher)
MAX_PLANS = 1024
_on = os.environ.get("NORMKIT_LAUNCH_PLANS", "0") == "1"


def enabled() -> bool:
    return _on


def set_plans(on: bool) -> None:
    global _on
    _on = bool(on)
    _plans.clear()


def clear() -> None:
    _plans.clear()


def planned(key, inputs: tuple, run):
    """``run()`` (a launcher call on ``inputs``, CUDA tensors or None) through the plan recorded for
    ``key``; the first call with a key records it."""
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
        _plans[key] = _build(rec, inputs, out)
        return out
    if plan is not None:
        out = plan.replay(inputs)
        if out is not None:
            return out
    return run()


class _Plan:
    """allocs: per noted allocation, (shape, stride, dtype) of an output tensor, or the byte offset of a
    scratch buffer inside one uint8 allocation of ``scratch`` bytes (one allocation instead of several:
    the kernels only see pointers)."""

    __slots__ = ("device", "aligned", "allocs", "scratch", "steps", "outs")

    def __init__(self, device, aligned, allocs, scratch, steps, outs):
        self.device, self.aligned, self.allocs, self.scratch = device, aligned, allocs, scratch
        self.steps, self.outs = steps, outs

    def replay(self, inputs):
        """The outputs, or None where the recorded call does not apply (module doc)."""
        if _launch.hooks_installed() or torch._C._cuda_getDevice() != self.device:
            return None
        ptrs = []
        for t, aligned in zip(inputs, self.aligned):
            if t is None:
                ptrs.append(None)
                continue
            p = t.data_ptr()
            if aligned is not None and (p & 15 == 0) != aligned:
                return None
            ptrs.append(p)
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
        for (fn, function, coop, pdl, packed), (g0, g1, g2), base, fill, tail in self.steps:
            args = base.copy()
            for pos, slot in fill:
                args[pos] = ptrs[slot]
            fn(g0, g1, g2, stream, function, coop, pdl, None, None, packed, None, None, None, *args, *tail)
        tensors = list(inputs) + new
        return tuple(None if slot is None else tensors[slot] for slot in self.outs)


def _build(rec, inputs, outputs):
    """The plan of a recorded call, or None where it cannot be replayed (module doc)."""
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
    aligned = [None] * len(inputs)  # the alignment of each input a kernel received (part of its binary)
    steps = []
    device = None
    for key, args, grid in rec.launches:
        hit = _launch._cache.get(key)
        if hit is None or hit[2] is None:
            return None
        device = key[1]
        base, fill = [], []
        for pos, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                slot = slots.get(id(a))
                if slot is None:
                    return None  # a tensor the launcher made without noting it (a copy): not replayable
                if slot < len(inputs):
                    aligned[slot] = a.data_ptr() & 15 == 0
                fill.append((pos, slot))
                base.append(None)
            else:
                base.append(a)
        g = (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)
        steps.append((hit[2], g, base, tuple(fill), hit[1]))
    outs = []
    for t in outputs:
        slot = None if t is None else slots.get(id(t))
        if t is not None and slot is None:
            return None
        outs.append(slot)
    return _Plan(device, tuple(aligned), tuple(allocs), scratch, tuple(steps), tuple(outs))
