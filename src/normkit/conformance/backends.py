"""Backends under test: where the aten-named and F-style entry points come from.

* ``torch``   torch's own kernels: ``torch.ops.aten.*`` and ``torch.nn.functional``
* ``normkit`` ``normkit.ops`` (aten names) and ``normkit.functional`` (F signatures)
* ``MODULE``  any importable module exposing aten-named functions, optionally F-style ones
              (its ``functional`` attribute, or F-signature functions of the module itself)

Aten-style names follow the overload-free convention of normkit.reference: the ``.no_stats``
overload of ``_native_batch_norm_legit`` is ``_native_batch_norm_legit_no_stats``.
"""

from __future__ import annotations

import importlib
import inspect

import torch


class Backend:
    """`aten(name)` / `functional(name)` return a callable or None (not present)."""

    name = "?"
    is_torch = False

    def aten(self, name: str):
        raise NotImplementedError

    def functional(self, name: str):
        raise NotImplementedError

    def get(self, op: str):
        if op.startswith("F."):
            return self.functional(op[2:])
        return self.aten(op)


class TorchBackend(Backend):
    name = "torch"
    is_torch = True

    def aten(self, name):
        if name == "_native_batch_norm_legit_no_stats":
            return torch.ops.aten._native_batch_norm_legit.no_stats
        packet = getattr(torch.ops.aten, name, None)
        return getattr(packet, "default", None) if packet is not None else None

    def functional(self, name):
        return getattr(torch.nn.functional, name, None)


class ModuleBackend(Backend):
    def __init__(self, name: str, aten_module, functional_module=None):
        self.name = name
        self._aten = aten_module
        self._functional = functional_module

    def aten(self, name):
        fn = getattr(self._aten, name, None)
        if fn is None or not callable(fn):
            return None
        if name in ("instance_norm",) and _looks_f_style(fn, name):
            return None
        return fn

    def functional(self, name):
        if self._functional is not None:
            fn = getattr(self._functional, name, None)
            return fn if callable(fn) else None
        fn = getattr(self._aten, name, None)
        if fn is None or not callable(fn):
            return None
        return fn if _looks_f_style(fn, name) else None


def _looks_f_style(fn, name: str) -> bool:
    """F.batch_norm / F.instance_norm take running stats second; aten takes weight second."""
    if name not in ("batch_norm", "instance_norm"):
        return True
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return len(params) > 1 and params[1] == "running_mean"


def load_backend(impl: str) -> Backend:
    if impl == "torch":
        return TorchBackend()
    if impl == "normkit":
        ops = importlib.import_module("normkit.ops")
        try:
            functional = importlib.import_module("normkit.functional")
        except ImportError:
            functional = None
        return ModuleBackend("normkit", ops, functional)
    module = importlib.import_module(impl)
    functional = getattr(module, "functional", None)
    if functional is not None and not (inspect.ismodule(functional) or inspect.isclass(functional)):
        functional = None
    return ModuleBackend(impl, module, functional)
