"""`normkit.enable()`: normkit's ops at the CUDA dispatch key of ``aten``.

How it works
------------
``enable()`` opens one ``torch.library.Library("aten", "IMPL")`` and registers a Python kernel at the
backend key (``CUDA``) for every normalization op that eager PyTorch reaches on that device
(``../shared/contract.md`` §13): the batch-norm family including ``cudnn_batch_norm`` /
``cudnn_batch_norm_backward`` (what fp32/fp16 ``F.batch_norm`` calls when cuDNN is on),
``native_layer_norm(_backward)``, ``_fused_rms_norm(_backward)``, ``native_group_norm(_backward)``, and the
per-rank SyncBatchNorm primitives ``batch_norm_stats``, ``batch_norm_elemt``, ``batch_norm_backward_reduce``,
``batch_norm_backward_elemt`` (what ``torch.nn.SyncBatchNorm`` runs between its collectives; the C-sized
``batch_norm_gather_stats_with_counts`` stays ATen's).  Because the kernels sit at the
backend key, ATen's own autograd formulas still run above them and call normkit's backward ops.
``rms_norm`` itself is CompositeImplicitAutograd and never reaches ``_fused_rms_norm`` for a weight whose
dtype differs from the input's (contract §13) nor on CPU, so it is also overridden at the Autograd key
of the device (``AutogradCUDA``), routed to ``normkit.rms_norm`` (normkit's autograd). ``instance_norm``
(also CompositeImplicitAutograd, batch norm on the (1, N*C, *) view underneath) is overridden there
too, routed to ``normkit.instance_norm`` (group norm with one group per channel).

Per-input fallback
------------------
Before registering, the kernel that was active at that key is captured with
``torch.library.get_kernel(op, key)`` (torch >= 2.9; present on 2.11-2.13).  Each normkit kernel first
asks whether normkit handles the input (floating dtype, strided layout, the Triton kernels importable
for the device); if not, it calls the captured kernel with the same dispatch key set, so the answer is
exactly ATen's.  On a torch without ``get_kernel`` the unhandled inputs go to normkit's reference
implementation instead (slower, never wrong), and unsupported dtypes raise ATen's
``NotImplementedError``.  Calls made while a normkit kernel is already running (re-entrancy) always go
to the captured kernel.

Restore
-------
``disable()`` calls ``Library._destroy()`` (torch >= 2.5), which deregisters every kernel normkit added
and brings back the previous ones.  Where ``_destroy`` is missing, the registrations stay but turn into
pass-throughs to the captured kernels (the observable behaviour is restored).

Backward on the calling thread
------------------------------
On CUDA, autograd runs the backward pass on a per-device worker thread, where every Python kernel pays
for taking the GIL and cold caches: on an H200 (torch 2.11) a normkit batch-norm forward + backward
cost 982 us of host time per call with the worker thread and 469 us on the calling thread, 338 us
against 154 us of it inside normkit's backward itself (``benchmarks/host_overhead.py
--diagnose-worker-thread``). ATen's own C++ backward kernels do not pay this. So ``enable()`` also turns
autograd's multithreaded backward off for the thread that calls it
(``torch.autograd.set_multithreading_enabled(False)``, thread-local) and ``disable()`` restores the
previous setting; ``enable(backward_on_calling_thread=False)`` leaves it alone. Results are the same
either way: only the thread that executes the backward changes (one device's backward is serial on its
worker thread anyway; with several GPUs in one process their backward passes no longer overlap).

Fast routes
-----------
Batch norm's training ops (forward and backward, every entry point above) first ask their route
(``normkit.ops.batch_norm.ROUTES``): a call whose tensors have the device, dtype, sizes and strides of an
earlier call of the same op (and the same flags) that passed every check and ran a launch plan replays that
plan directly, skipping the predicate, the checks, the kernel selection and the launcher (~20-50 µs a call
of Python in small models on the H200). Active once the native replay is loaded (its ``signature`` is the
key); a route that does not apply leaves the call to the path above. Layer and RMS norm's four ops have routes
of their own (``normkit.ops.layer_norm.ROUTES``: 1-D or no parameters), under the same switch; so do batch norm's
eval forwards and group norm's two ops (``normkit.ops.group_norm.ROUTES``), each while its own flag is on
(``batch_norm.EVAL_ROUTES``, ``group_norm.ROUTES_ON``: off until their CUDA same-bits tests have run).
On by default; ``NORMKIT_FAST_ROUTES=0``
or ``normkit.ops.batch_norm.set_fast_routes(False)`` before ``enable()`` turns it off.

Only private for tests: ``enable(_dispatch_key="CPU")`` registers at the CPU key (``rms_norm`` at
``AutogradCPU``) so that routing, fallback and restore can be proven without a GPU; at that key every
floating input is taken (normkit's reference runs), not only those the Triton kernels take.

Counting: ``call_counts()`` / ``fallback_counts()`` per aten op name, ``reset_counts()``. Under
``torch.compile`` the ops are traced with fake tensors, which normkit declines (the original kernels
trace as usual): ``enable()`` is the eager path; use ``normkit.nn`` / ``normkit.functional`` to compile.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections import Counter

import torch

from normkit.ops import _select

__all__ = ["enable", "disable", "enabled", "is_enabled", "call_counts", "fallback_counts", "reset_counts",
           "registered_ops"]

_FLOATING = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64))
_PLAIN = _select.PLAIN_TENSORS


class _State(threading.local):
    """Per thread: how many normkit kernels are running (the re-entrancy guard). A class default rather
    than getattr(local, "depth", 0): every thread starts at 0, and the read is ~10x cheaper."""

    depth = 0
    blocks = 0  # `with enabled():` blocks open in this thread


_state = _State()
_lock = threading.RLock()
_lib = None
_key = None
_active = False
_registered: list = []
_saved_multithreading: dict = {}  # thread id -> autograd's multithreading setting there before enable() changed it
_open_blocks = 0  # `with enabled():` blocks open in any thread
_on_for_blocks = False  # normkit is on only for those blocks (the last one to close turns it off)
_counts: Counter = Counter()
_fallbacks: Counter = Counter()
_routed: Counter = Counter()  # of _counts, the calls a fast route answered


def _run_inside(impl, args, kwargs):
    """impl(*args, **kwargs) with the re-entrancy guard up (try/finally: a contextmanager costs ~1 us)."""
    _state.depth += 1
    try:
        return impl(*args, **kwargs)
    finally:
        _state.depth -= 1


def _plain_float(t) -> bool:
    # the exact-type test first: it also rules out non-tensors before any attribute is read
    return type(t) in _PLAIN and t.dtype in _FLOATING and t.layout == torch.strided and not t.is_nested


def _takes(family: str, x, *others) -> bool:
    """Whether normkit takes this call: a plain floating strided x, the other tensors strided (or None);
    outside the CPU test key also the others on x's device in x's dtype or float32 (what the kernels
    take: anything else, e.g. fp64 params with a bf16 input, goes to the original kernel rather than the
    slow reference) and the family's kernels available for x."""
    if not _plain_float(x):
        return False
    kernels = _key != "CPU"  # at the CPU test key the reference runs every floating input
    dev, dt = x.get_device(), x.dtype
    for o in others:
        if o is None:
            continue
        if not (isinstance(o, torch.Tensor) and o.layout == torch.strided and not o.is_nested):
            return False
        if kernels and (o.get_device() != dev or (o.dtype is not dt and o.dtype is not torch.float32)):
            return False
    return not kernels or _select.kernels_for(family, x) is not None


# --- the table: aten overload -> (normkit implementation, predicate over the call's arguments) ---------

def _table():
    from normkit import ops

    bn = "batch_norm"
    ln = "layer_norm"
    rms = "rms_norm"
    gn = "group_norm"
    return [
        ("native_batch_norm", ops.native_batch_norm, lambda x, w, b, rm, rv, *a: _takes(bn, x, w, b, rm, rv)),
        ("_native_batch_norm_legit", ops._native_batch_norm_legit,
         lambda x, w, b, rm, rv, *a: _takes(bn, x, w, b, rm, rv)),
        ("_native_batch_norm_legit.no_stats", ops._native_batch_norm_legit_no_stats,
         lambda x, w, b, *a: _takes(bn, x, w, b)),
        ("_native_batch_norm_legit_no_training", ops._native_batch_norm_legit_no_training,
         lambda x, w, b, rm, rv, *a: _takes(bn, x, w, b, rm, rv)),
        ("_batch_norm_with_update", ops._batch_norm_with_update,
         lambda x, w, b, rm, rv, *a: _takes(bn, x, w, b, rm, rv)),
        ("_batch_norm_no_update", ops._batch_norm_no_update,
         lambda x, w, b, rm, rv, *a: _takes(bn, x, w, b, rm, rv)),
        ("native_batch_norm_backward", ops.native_batch_norm_backward,
         lambda g, x, w, rm, rv, sm, si, *a: _takes(bn, x, g, w, rm, rv, sm, si)),
        ("batch_norm_backward", ops.batch_norm_backward,
         lambda g, x, w, rm, rv, sm, sv, *a: _takes(bn, x, g, w, rm, rv, sm, sv)),
        ("cudnn_batch_norm", ops.cudnn_batch_norm, lambda x, w, b, rm, rv, *a: _takes(bn, x, w, b, rm, rv)),
        ("cudnn_batch_norm_backward", ops.cudnn_batch_norm_backward,
         lambda x, g, w, rm, rv, sm, sv, *a: _takes(bn, x, g, w, rm, rv, sm, sv)),
        ("native_layer_norm", ops.native_layer_norm, lambda x, ns, w, b, *a: _takes(ln, x, w, b)),
        ("native_layer_norm_backward", ops.native_layer_norm_backward,
         lambda g, x, ns, m, r, w, b, *a: _takes(ln, x, g, m, r, w, b)),
        ("_fused_rms_norm", ops._fused_rms_norm, lambda x, ns, w, *a: _takes(rms, x, w)),
        ("_fused_rms_norm_backward", ops._fused_rms_norm_backward,
         lambda g, x, ns, r, w, *a: _takes(rms, x, g, r, w)),
        # SyncBatchNorm's per-rank primitives (what torch.nn.SyncBatchNorm runs between its collectives)
        ("batch_norm_stats", ops.batch_norm_stats, lambda x, eps: _takes(bn, x)),
        ("batch_norm_elemt", ops.batch_norm_elemt, lambda x, w, b, m, i, *a: _takes(bn, x, w, b, m, i)),
        ("batch_norm_backward_reduce", ops.batch_norm_backward_reduce,
         lambda g, x, m, i, w, *a: _takes(bn, x, g, m, i, w)),
        ("batch_norm_backward_elemt", ops.batch_norm_backward_elemt,
         lambda g, x, m, i, w, s1, s2, n: _takes(bn, x, g, m, i, w, s1, s2)),
        ("native_group_norm", ops.native_group_norm, lambda x, w, b, *a: _takes(gn, x, w, b)),
        ("native_group_norm_backward", ops.native_group_norm_backward,
         lambda g, x, m, r, w, *a: _takes(gn, x, g, m, r, w)),
    ]


def registered_ops() -> list:
    """The aten overloads normkit currently overrides (empty when disabled)."""
    return [name for name, _ in _registered]


def call_counts() -> dict:
    """Calls normkit handled since the last `reset_counts()`, per aten op name."""
    return dict(_counts)


def fallback_counts() -> dict:
    """Calls that went to the original kernel, per aten op name."""
    return dict(_fallbacks)


def routed_counts() -> dict:
    """Of `call_counts()`, the calls a fast route answered (batch norm's training ops, layer / RMS norm), per aten
    op name."""
    return dict(_routed)


def reset_counts() -> None:
    _counts.clear()
    _fallbacks.clear()
    _routed.clear()


def is_enabled() -> bool:
    return _active


def _lookup_original(qualname: str, key: str):
    getter = getattr(torch.library, "get_kernel", None)
    if getter is None:
        return None
    try:
        return getter("aten::" + qualname, key)
    except Exception:  # op missing on this build, or no kernel at that key
        return None


def _make_kernel(name, impl, takes, original):
    # batch norm's training ops have fast routes (normkit.ops.batch_norm.ROUTES): a signature that passed the
    # checks and ran a launch plan once replays it directly; `note` records that after a call
    route, note = _ops_routes().get(name, (None, None)) if _key != "CPU" else (None, None)

    def kernel(keyset, *args, **kwargs):
        if _active and not _state.depth:
            if route is not None and not kwargs:
                out = route(*args)
                if out is not None:
                    _counts[name] += 1
                    _routed[name] += 1
                    return out
            if takes(*args, **kwargs):
                _counts[name] += 1
                _state.depth = 1  # from 0 (tested above); inline rather than _run_inside: ~0.3 us a call
                try:
                    out = impl(*args, **kwargs)
                finally:
                    _state.depth = 0
                if note is not None and not kwargs:
                    note(*args)
                return out
        _fallbacks[name] += 1
        if original is not None:
            return original.call_boxed(keyset, *args, **kwargs)
        # No captured kernel (torch without get_kernel): normkit.ops' reference path is correct for every
        # floating input, and its validation raises ATen's NotImplementedError for the other dtypes.
        return _run_inside(impl, args, kwargs)

    kernel.__name__ = "normkit_" + name.replace(".", "_")
    return kernel


def _ops_routes() -> dict:
    from normkit.ops import batch_norm, group_norm, layer_norm

    return {**batch_norm.ROUTES, **layer_norm.ROUTES, **group_norm.ROUTES} if batch_norm.fast_routes_enabled() else {}


def _make_rms_norm_autograd(original):
    """`aten::rms_norm` is CompositeImplicitAutograd: on devices without a fused kernel, and for a weight
    whose dtype differs from the input's, it never reaches `_fused_rms_norm`.  Overriding it at the
    Autograd key routes it through normkit's custom op, which carries its own autograd."""

    def kernel(keyset, x, normalized_shape, weight=None, eps=None):
        from normkit import functional

        # inside torch.func transforms / on dual tensors the original (composite) kernel runs: normkit's
        # autograd Functions have no vmap / jvp rules; its backend-key kernels below still take the tensors
        if (_active and not _state.depth and not functional._in_transform(x, weight)
                and _takes("rms_norm", x, weight)):
            _counts["rms_norm"] += 1
            return _run_inside(functional.rms_norm, (x, list(normalized_shape), weight, eps), {})
        _fallbacks["rms_norm"] += 1
        return original.call_boxed(keyset, x, normalized_shape, weight, eps)

    return kernel


def _instance_norm(x, weight, bias, running_mean, running_var, use_input_stats, momentum, eps):
    from normkit import _checks, functional

    _checks.check_instance_norm(x, weight, bias, running_mean, running_var, use_input_stats)
    return functional._instance_norm_checked(x, running_mean, running_var, weight, bias, bool(use_input_stats),
                                             float(momentum), float(eps))


def _make_instance_norm_autograd(original):
    """`aten::instance_norm` is CompositeImplicitAutograd: it reaches batch norm on the (1, N*C, *) view,
    which leaves the batch-norm kernels too little parallelism. Overriding it at the Autograd key routes
    it through `normkit.instance_norm` (group norm with one group per channel, its own autograd)."""

    def kernel(keyset, x, weight, bias, running_mean, running_var, use_input_stats, momentum, eps,
               cudnn_enabled):
        from normkit import functional

        if (_active and not _state.depth and not functional._in_transform(x, weight, bias, running_mean, running_var)
                and _takes("group_norm", x, weight, bias, running_mean, running_var)):
            _counts["instance_norm"] += 1
            return _run_inside(_instance_norm, (x, weight, bias, running_mean, running_var, use_input_stats,
                                                momentum, eps), {})
        _fallbacks["instance_norm"] += 1
        return original.call_boxed(keyset, x, weight, bias, running_mean, running_var, use_input_stats, momentum,
                                   eps, cudnn_enabled)

    return kernel


def _register(lib, name, kernel, key, original) -> None:
    if original is not None:
        lib.impl(name, kernel, key, with_keyset=True)
        return
    # torch without get_kernel (< 2.9): nothing to call back into, so no dispatch key set is needed
    # (older Library.impl may not even take with_keyset); unhandled inputs use normkit's reference path.
    lib.impl(name, lambda *args, **kwargs: kernel(None, *args, **kwargs), key)


def _backward_on_calling_thread(on: bool) -> None:
    """Set (on) or restore (off) autograd's multithreading flag of the calling thread. The flag is thread-local:
    each thread's own setting is kept until that thread restores it (a disable() in another thread cannot reach
    it; the thread's next enable() / disable() finds it still saved)."""
    me = threading.get_ident()
    if on:
        _saved_multithreading.setdefault(me, torch._C._is_multithreading_enabled())
        torch._C._set_multithreading_enabled(False)
    elif me in _saved_multithreading:
        torch._C._set_multithreading_enabled(_saved_multithreading.pop(me))


def enable(*, backward_on_calling_thread: bool = True, _dispatch_key: str = "CUDA") -> None:
    """Route aten's normalization ops on CUDA tensors through normkit (idempotent).

    ``backward_on_calling_thread``: run autograd's backward on this thread instead of the CUDA worker
    thread (see the module doc: halves normkit's host cost per backward); restored by ``disable()``."""
    global _lib, _key, _active, _on_for_blocks
    with _lock:
        _on_for_blocks = False  # on until disable(), whatever blocks close
        _backward_on_calling_thread(backward_on_calling_thread)
        if _active:
            if _dispatch_key != _key:
                raise RuntimeError(f"normkit is already enabled at the {_key} key; disable() first")
            return
        if _lib is not None and _key == _dispatch_key and _registered:
            # torch without Library._destroy: the old registrations are pass-throughs; reactivate them.
            _active = True
            return
        if _lib is not None:
            raise RuntimeError("normkit cannot re-register at another key on a torch without Library._destroy")
        _key = _dispatch_key
        lib = torch.library.Library("aten", "IMPL")
        registered = []
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel.*")
            warnings.filterwarnings("ignore", message=".*Warning only once for all operators.*")
            for name, impl, takes in _table():
                try:
                    torch._C._dispatch_find_schema_or_throw("aten::" + name.split(".")[0],
                                                            name.split(".")[1] if "." in name else "")
                except Exception:
                    continue  # op absent on this torch
                original = _lookup_original(name, _dispatch_key)
                _register(lib, name, _make_kernel(name, impl, takes, original), _dispatch_key, original)
                registered.append((name, original))
            autograd_key = "Autograd" + _dispatch_key
            for name, make in (("rms_norm", _make_rms_norm_autograd), ("instance_norm", _make_instance_norm_autograd)):
                original = _lookup_original(name, autograd_key)
                if original is not None:
                    lib.impl(name, make(original), autograd_key, with_keyset=True)
                    registered.append((name, original))
        _lib = lib
        _registered[:] = registered
        _active = True


def disable() -> None:
    """Restore every kernel that `enable()` replaced (idempotent)."""
    global _lib, _active, _on_for_blocks
    with _lock:
        _active = _on_for_blocks = False
        _backward_on_calling_thread(False)
        if _lib is None:
            return
        destroy = getattr(_lib, "_destroy", None)
        if destroy is not None:
            destroy()
            _lib = None
            _registered.clear()
        # else: registrations stay in place as pass-throughs to the captured kernels (see module doc).


@contextlib.contextmanager
def enabled(*, backward_on_calling_thread: bool = True, _dispatch_key: str = "CUDA"):
    """`with normkit.enabled(): ...` — enable() for the block, then restore the previous state. Blocks in several
    threads share the one (process-wide) registration: normkit stays on until the last of them closes, unless
    enable() or disable() was called meanwhile. The block's thread runs backward passes on itself, as enable()'s."""
    global _open_blocks, _on_for_blocks
    with _lock:
        if not _active:
            enable(backward_on_calling_thread=backward_on_calling_thread, _dispatch_key=_dispatch_key)
            _on_for_blocks = True
        elif backward_on_calling_thread and _on_for_blocks:
            _backward_on_calling_thread(True)
        _open_blocks += 1
        _state.blocks += 1
    try:
        yield
    finally:
        with _lock:
            _open_blocks -= 1
            _state.blocks -= 1
            if _on_for_blocks:
                if _open_blocks == 0:
                    disable()
                elif _state.blocks == 0:
                    _backward_on_calling_thread(False)
