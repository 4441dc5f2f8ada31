"""Backends under test: where the aten-named and F-style entry points come from.

* ``torch``   torch's own kernels: ``torch.ops.aten.*`` and ``torch.nn.functional``
* ``normkit`` ``normkit.ops`` (aten names) and ``normkit.functional`` (F signatures)
* ``MODULE``  any importable module exposing aten-named functions, optionally F-style ones
              (its ``functional`` attribute, or F-signature functions of the module itself)

Any of them can run inside a context (``--within``, `ScopedBackend`): e.g. torch's ops inside
``normkit.enabled`` or ``flag_gems.use_gems``, which override aten's kernels at the dispatcher. Only the
backend's calls (and the backward passes through their outputs) run inside it; the float64 oracle and
torch's own kernels (criterion B's baseline) run outside.

Aten-style names follow the overload-free convention of normkit.reference: the ``.no_stats``
overload of ``_native_batch_norm_legit`` is ``_native_batch_norm_legit_no_stats``.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import inspect

import torch


class Backend:
    """`aten(name)` / `functional(name)` return a callable or None (not present).

    `is_torch`: the entry points are torch's dispatcher ops (raw-aten calls that would crash on bad input
    are checked through F.* instead). `runs_torch_kernels`: torch's own kernels compute the results (so
    criterion B holds by construction, and the torch-only error cases apply)."""

    name = "?"
    is_torch = False
    runs_torch_kernels = False

    def aten(self, name: str):
        raise NotImplementedError

    def functional(self, name: str):
        raise NotImplementedError

    def get(self, op: str):
        if op.startswith("F."):
            return self.functional(op[2:])
        return self.aten(op)

    def scope(self):
        """The context the backend's calls run in (also entered around backward passes through them)."""
        return contextlib.nullcontext()


class TorchBackend(Backend):
    name = "torch"
    is_torch = True
    runs_torch_kernels = True

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


class ScopedBackend(Backend):
    """`inner`'s functions, each call made inside `make_context()` (entered once however deeply nested)."""

    runs_torch_kernels = False  # an override runs, not torch's own kernels: torch is the baseline

    def __init__(self, inner: Backend, make_context, label: str):
        self.inner = inner
        self.name = f"{inner.name} within {label}"
        self.is_torch = inner.is_torch
        self._make_context = make_context
        self._depth = 0

    @contextlib.contextmanager
    def scope(self):
        with self._make_context() if self._depth == 0 else contextlib.nullcontext():
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1

    def _wrap(self, fn):
        if fn is None:
            return None

        @functools.wraps(fn)
        def inside(*args, **kwargs):
            with self.scope():
                return fn(*args, **kwargs)

        return inside

    def aten(self, name):
        return self._wrap(self.inner.aten(name))

    def functional(self, name):
        return self._wrap(self.inner.functional(name))


def load_context(spec: str):
    """A zero-argument callable returning a context manager, from `spec`: a dotted name (``normkit.enabled``)
    or a call of one with literal arguments (``flag_gems.use_gems(include=["native_layer_norm"])``), which
    is then made on each entry. Raises ValueError / ImportError saying what is wrong."""
    name, args, kwargs = _parse_call(spec)
    parts = name.split(".")
    obj, err = None, None
    for i in range(len(parts), 0, -1):  # the longest importable module prefix, then attributes
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError as e:
            err = err or e
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            raise ValueError(f"{'.'.join(parts[:i])} has no attribute {'.'.join(parts[i:])!r}") from None
        break
    else:
        raise err
    if not callable(obj):
        raise ValueError(f"{name} is not callable")
    make = functools.partial(obj, *args, **kwargs) if (args or kwargs) else obj
    if inspect.isclass(obj):
        made_one = hasattr(obj, "__enter__") and hasattr(obj, "__exit__")
    elif inspect.isgeneratorfunction(inspect.unwrap(obj)):  # @contextlib.contextmanager: calling runs nothing
        made_one = True
    else:  # any other callable: only calling it tells
        made = make()
        made_one = hasattr(made, "__enter__") and hasattr(made, "__exit__")
    if not made_one:
        raise ValueError(f"{spec} is not a context manager; --within takes a callable returning one, "
                         "e.g. normkit.enabled or flag_gems.use_gems")
    return make


def _parse_call(spec: str):
    """(dotted name, args, kwargs) of `name` or `name(literal, key=literal, ...)`; nothing is evaluated."""
    try:
        node = ast.parse(spec.strip(), mode="eval").body
    except SyntaxError:
        node = None
    call = node if isinstance(node, ast.Call) else None
    target = call.func if call is not None else node

    def dotted(n):
        if isinstance(n, ast.Name):
            return n.id
        if isinstance(n, ast.Attribute):
            head = dotted(n.value)
            return head and f"{head}.{n.attr}"
        return None

    name = dotted(target) if target is not None else None
    if name is None or (call is not None and any(isinstance(a, ast.Starred) for a in call.args)) or (
            call is not None and any(k.arg is None for k in call.keywords)):
        raise ValueError(f"{spec!r} is not a dotted name like normkit.enabled, or a call of one with literal "
                         "arguments like flag_gems.use_gems(include=['native_layer_norm'])")
    if call is None:
        return name, (), {}
    try:
        return (name, tuple(ast.literal_eval(a) for a in call.args),
                {k.arg: ast.literal_eval(k.value) for k in call.keywords})
    except ValueError:
        raise ValueError(f"{spec!r}: the arguments must be literals (numbers, strings, lists, ...)") from None


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
