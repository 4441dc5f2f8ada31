"""Batch norm with aten's names, signatures and return values (no autograd: `enable()` registers these
below ATen's autograd formulas).

Each function validates with `normkit._checks` before touching data (a call that raises leaves the
running statistics untouched), then runs the Triton kernels when `normkit.kernels.runs_kernels_on(x)`
and the kernel module's `supports(x)` say so, else `normkit.reference`.

Conventions (docs/ARCHITECTURE.md): saved statistics are `(mean, invstd)` of shape `(C,)` in training,
float32 for fp16/bf16/fp32 input and float64 for fp64; eval returns empty `(0,)` saved statistics; every
backward accepts empty or filled saved statistics in eval and then uses the running statistics.
"""

from __future__ import annotations

import os
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from normkit import _checks
from normkit.kernels import _plan, dense_param
from normkit.ops._select import PLAIN_TENSORS, kernels_for, params_ok, reference
from normkit.reference._common import acc_dtype, affine_grad_dtype, write_running_stat

__all__ = [
    "native_batch_norm",
    "_native_batch_norm_legit",
    "_native_batch_norm_legit_no_stats",
    "_native_batch_norm_legit_no_training",
    "_batch_norm_with_update",
    "_batch_norm_no_update",
    "native_batch_norm_backward",
    "batch_norm_backward",
    "cudnn_batch_norm",
    "cudnn_batch_norm_backward",
    "batch_norm_update_stats",
]


def _bn_kernels(x: Tensor, *params):
    mod = kernels_for("batch_norm", x)
    if mod is None or not mod.supports(x) or not params_ok(x, *params):
        return None
    return mod


# new_empty(0) rather than new_empty((0,)): the same tensor, and an int parses faster than a tuple (~0.5 us)
def _empty_stats(x: Tensor) -> Tuple[Tensor, Tensor]:
    dt = acc_dtype(x.dtype)
    return x.new_empty(0, dtype=dt), x.new_empty(0, dtype=dt)


def _empty_reserve(x: Tensor) -> Tensor:
    return x.new_empty(0, dtype=torch.uint8)


def _forward(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """Validated forward: `(out, save_mean, save_invstd)`, eval stats empty."""
    _checks.check_batch_norm(x, weight, bias, running_mean, running_var, training)
    return _forward_core(x, weight, bias, running_mean, running_var, training, momentum, eps)


def _forward_core(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """`_forward` without validation (for callers that validated already: normkit.functional)."""
    mod = _bn_kernels(x, weight, bias, running_mean, running_var)
    if mod is None:
        return tuple(reference().native_batch_norm(x, weight, bias, running_mean, running_var, training,
                                                   momentum, eps))
    weight, bias = dense_param(weight), dense_param(bias)
    if training:
        # non-contiguous running stats: update a dense copy, then write it back in place
        rm, rv = dense_param(running_mean), dense_param(running_var)
        out = tuple(mod.bn_forward_train(x, weight, bias, rm, rv, momentum, eps))
        if rm is not running_mean:
            write_running_stat(running_mean, rm)
        if rv is not running_var:
            write_running_stat(running_var, rv)
        return out
    y = mod.bn_forward_eval(x, weight, bias, dense_param(running_mean), dense_param(running_var), eps)
    return (y,) + _empty_stats(x)


def native_batch_norm(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                      running_mean: Optional[Tensor], running_var: Optional[Tensor], training: bool,
                      momentum: float, eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    return _forward(input, weight, bias, running_mean, running_var, training, momentum, eps)


def _native_batch_norm_legit(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                             running_mean: Tensor, running_var: Tensor, training: bool, momentum: float,
                             eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    return _forward(input, weight, bias, running_mean, running_var, training, momentum, eps)


def _native_batch_norm_legit_no_stats(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                                      training: bool, momentum: float, eps: float):
    """`_native_batch_norm_legit.no_stats`: batch statistics, nothing to update (eval raises: no stats)."""
    return _forward(input, weight, bias, None, None, training, momentum, eps)


def _native_batch_norm_legit_no_training(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                                         running_mean: Tensor, running_var: Tensor, momentum: float,
                                         eps: float):
    return _forward(input, weight, bias, running_mean, running_var, False, momentum, eps)


def _batch_norm_with_update(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                            running_mean: Tensor, running_var: Tensor, momentum: float, eps: float):
    """Training forward that updates the running stats; 4th output: the (empty) uint8 reserve."""
    return _forward(input, weight, bias, running_mean, running_var, True, momentum, eps) + (_empty_reserve(input),)


def _batch_norm_no_update(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                          running_mean: Optional[Tensor], running_var: Optional[Tensor], momentum: float,
                          eps: float):
    """Eval forward with the running stats (raw aten segfaults without them on CPU; normkit raises)."""
    return _forward(input, weight, bias, running_mean, running_var, False, momentum, eps) + (_empty_reserve(input),)


def _backward(grad_out, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
              output_mask, *, kernel_name="batch_norm_backward_cpu"):
    _checks.check_batch_norm_backward(grad_out, x, weight, running_mean, running_var, save_mean,
                                      save_invstd, train, kernel=kernel_name)
    return _backward_core(grad_out, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
                          output_mask)


def _backward_core(grad_out, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
                   output_mask):
    """`_backward` without validation."""
    mask = [bool(m) for m in output_mask]
    mod = _bn_kernels(x, weight, running_mean, running_var)
    if mod is None or grad_out.dtype != x.dtype:
        res = reference().native_batch_norm_backward(grad_out, x, weight, running_mean, running_var,
                                                     save_mean, save_invstd, train, eps, mask)
        return tuple(res)
    if train:
        mean, invstd = save_mean, save_invstd
    else:
        acc = acc_dtype(x.dtype)
        mean = running_mean.to(acc)
        invstd = torch.rsqrt(running_var.to(acc) + eps)
    gi, gw, gb = mod.bn_backward(grad_out, x, dense_param(weight), dense_param(mean), dense_param(invstd), train,
                                 mask)
    # grad_weight / grad_bias dtype (the reference's rule): the weight's, else the first statistic passed (fp32 in a
    # mixed call), else the input's. The kernels give the accumulation type for an absent weight: cast only where
    # that differs (a pure-bf16 eval call with bf16 running stats), once
    pdt = affine_grad_dtype(x, weight, running_mean, running_var, save_mean, save_invstd)
    if gw is not None and gw.dtype != pdt:
        gw = gw.to(pdt)
    if gb is not None and gb.dtype != pdt:
        gb = gb.to(pdt)
    return gi, gw, gb


def native_batch_norm_backward(grad_out: Tensor, input: Tensor, weight: Optional[Tensor],
                               running_mean: Optional[Tensor], running_var: Optional[Tensor],
                               save_mean: Optional[Tensor], save_invstd: Optional[Tensor], train: bool,
                               eps: float, output_mask: List[bool]):
    return _backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
                     output_mask)


def batch_norm_backward(grad_out: Tensor, input: Tensor, weight: Tensor, running_mean: Optional[Tensor],
                        running_var: Optional[Tensor], save_mean: Optional[Tensor],
                        save_var: Optional[Tensor], update: bool, eps: float, output_mask: List[bool],
                        reserve: Tensor):
    """`save_var` is, despite its name, the saved invstd; `reserve` is ignored (normkit keeps none)."""
    _checks.check_weight_required(weight, 3, "weight")
    return _backward(grad_out, input, weight, running_mean, running_var, save_mean, save_var, update, eps,
                     output_mask)


def cudnn_batch_norm(input: Tensor, weight: Tensor, bias: Optional[Tensor], running_mean: Optional[Tensor],
                     running_var: Optional[Tensor], training: bool, exponential_average_factor: float,
                     epsilon: float):
    """What fp32/fp16 `F.batch_norm` reaches on CUDA (contract §13): `(out, save_mean, save_invstd,
    reserve)`, reserve an empty uint8 tensor, eval saved stats empty (as cuDNN's)."""
    _checks.check_weight_required(weight, 2, "weight")
    return _forward(input, weight, bias, running_mean, running_var, training, exponential_average_factor,
                    epsilon) + (_empty_reserve(input),)


def cudnn_batch_norm_backward(input: Tensor, grad_output: Tensor, weight: Tensor,
                              running_mean: Optional[Tensor], running_var: Optional[Tensor],
                              save_mean: Optional[Tensor], save_var: Optional[Tensor], epsilon: float,
                              reserveSpace: Tensor):
    """cuDNN's backward (training only in ATen's autograd; `save_var` is the saved invstd). Returns all
    three gradients. Empty saved stats mean the forward ran in eval: the running stats are used."""
    _checks.check_weight_required(weight, 3, "weight")
    train = save_mean is not None and save_mean.numel() > 0
    return _backward(grad_output, input, weight, running_mean, running_var, save_mean, save_var, train,
                     epsilon, [True, True, True])


# --- fast routes (under enable(): the host time of small layers) ----------------------------------------------
# A training call from aten (normkit.aten) whose tensors (device, dtype, sizes and strides: ``_plan.signature``)
# passed every check and ran a launch plan is noted; a later call of that op with the same signature and flags
# skips the checks, the kernel selection and the launcher and replays the plan (``kernels.batch_norm.*_replay``).
# Eval forwards (inference) the same way, while ``EVAL_ROUTES`` is on.
# Everything the checks and the routing read is in the signature and the noted flags, but x's exact type, tested
# here as aten's predicate tests it. A route that answers None (nothing noted, no plan, a replay that does not
# apply) leaves the call to the normal path. ``ROUTES``: per aten op, (route, note) over the op's own arguments.

_routes: set = set()
MAX_ROUTES = 4096  # signatures that change every call would grow the set without end
# on by default since the H200 measured it (benchmarks/NOTES-host-overhead.md, session 26: routes on / off, interleaved
# in one process, resnet18 steps 0.86x / 0.88x, mobilenet_v3_small 0.90x / 0.95x, NCHW / channels_last); it switches
# layer / RMS norm's routes too (normkit.ops.layer_norm.ROUTES). NORMKIT_FAST_ROUTES=0 turns it off; enable() reads it.
_routes_on = os.environ.get("NORMKIT_FAST_ROUTES", "1") != "0"
# the eval forward's routes (session 43): CPU-tested with stand-ins; off until their CUDA same-bits test has run
# (benchmarks/next_h200.sh PART=129)
EVAL_ROUTES = False


def fast_routes_enabled() -> bool:
    return _routes_on


def set_fast_routes(on: bool) -> None:
    """Whether the next ``normkit.enable()`` wires the routes in (``NORMKIT_FAST_ROUTES=0`` at import: not)."""
    global _routes_on
    _routes_on = bool(on)


def _note(entry) -> None:
    if len(_routes) < MAX_ROUTES:
        _routes.add(entry)


def _forward_route(op, x, weight, bias, running_mean, running_var, momentum, eps, extra=()):
    """Op's training forward outputs ((y, save_mean, save_invstd) + extra) through its route, or None."""
    if type(x) not in PLAIN_TENSORS:
        return None
    sig = _plan.signature((x, weight, bias, running_mean, running_var))
    if sig is None or (op, sig, eps) not in _routes:
        return None
    out = kernels_for("batch_norm", x).bn_forward_train_replay(x, weight, bias, running_mean, running_var,
                                                               momentum, eps, sig)
    return None if out is None else tuple(out) + tuple(e(x) for e in extra)


def _note_forward(op, x, weight, bias, running_mean, running_var, eps) -> None:
    """After op's training forward returned: note its route where it ran a plan on these very tensors (a plan
    under their signature means they reached the launcher as they are: no copy, no reference path)."""
    mod = kernels_for("batch_norm", x) if x.is_cuda else None
    sig = _plan.signature((x, weight, bias, running_mean, running_var)) if mod is not None else None
    if sig is not None and mod.bn_train_planned(eps, sig):
        _note((op, sig, eps))


def _eval_route(op, x, weight, bias, running_mean, running_var, eps, extra=()):
    """Op's eval forward outputs ((y, empty saved statistics) + extra) through its route, or None."""
    if not EVAL_ROUTES or type(x) not in PLAIN_TENSORS:
        return None
    sig = _plan.signature((x, weight, bias, running_mean, running_var))
    if sig is None or (op, "eval", sig, eps) not in _routes:
        return None
    y = kernels_for("batch_norm", x).bn_forward_eval_replay(x, weight, bias, running_mean, running_var, eps, sig)
    return None if y is None else (y,) + _empty_stats(x) + tuple(e(x) for e in extra)


def _note_eval(op, x, weight, bias, running_mean, running_var, eps) -> None:
    """As _note_forward, for the eval forward (running statistics required: without them eval raises)."""
    if not EVAL_ROUTES or running_mean is None or running_var is None:
        return
    mod = kernels_for("batch_norm", x) if x.is_cuda else None
    sig = _plan.signature((x, weight, bias, running_mean, running_var)) if mod is not None else None
    if sig is not None and mod.bn_eval_planned(eps, sig):
        _note((op, "eval", sig, eps))


def _backward_route(op, grad_out, x, weight, running_mean, running_var, save_mean, save_invstd, mask):
    """Op's training backward (grad_input, grad_weight, grad_bias) through its route, or None."""
    if type(x) not in PLAIN_TENSORS:
        return None
    sig = _plan.signature((grad_out, x, weight, running_mean, running_var, save_mean, save_invstd))
    if sig is None or (op, sig, mask) not in _routes:
        return None
    launched = _plan.signature((grad_out, x, weight, save_mean, save_invstd))
    return kernels_for("batch_norm", x).bn_backward_train_replay(grad_out, x, weight, save_mean, save_invstd, mask,
                                                                 launched)


def _note_backward(op, grad_out, x, weight, running_mean, running_var, save_mean, save_invstd, mask) -> None:
    """As _note_forward; only where the gradients needed no dtype conversion after the kernels (a weight, or
    grad_weight / grad_bias in the accumulation dtype the kernels give for an absent weight: _backward_core's
    rule; the signature holds every dtype that rule reads)."""
    mod = kernels_for("batch_norm", x) if x.is_cuda else None
    if mod is None or (weight is None and affine_grad_dtype(x, running_mean, running_var, save_mean, save_invstd)
                       != acc_dtype(x.dtype)):
        return
    sig = _plan.signature((grad_out, x, weight, running_mean, running_var, save_mean, save_invstd))
    launched = _plan.signature((grad_out, x, weight, save_mean, save_invstd))
    if sig is not None and launched is not None and mod.bn_backward_train_planned(mask, launched):
        _note((op, sig, mask))


def _mask(output_mask):
    return tuple(bool(m) for m in output_mask)


def _trained(save_mean):
    return save_mean is not None and save_mean.numel() > 0


ROUTES = {
    "native_batch_norm": (
        lambda x, w, b, rm, rv, training, momentum, eps:
            _forward_route("native_batch_norm", x, w, b, rm, rv, momentum, eps) if training else
            _eval_route("native_batch_norm", x, w, b, rm, rv, eps),
        lambda x, w, b, rm, rv, training, momentum, eps:
            _note_forward("native_batch_norm", x, w, b, rm, rv, eps) if training else
            _note_eval("native_batch_norm", x, w, b, rm, rv, eps)),
    "_native_batch_norm_legit": (
        lambda x, w, b, rm, rv, training, momentum, eps:
            _forward_route("_native_batch_norm_legit", x, w, b, rm, rv, momentum, eps) if training else
            _eval_route("_native_batch_norm_legit", x, w, b, rm, rv, eps),
        lambda x, w, b, rm, rv, training, momentum, eps:
            _note_forward("_native_batch_norm_legit", x, w, b, rm, rv, eps) if training else
            _note_eval("_native_batch_norm_legit", x, w, b, rm, rv, eps)),
    "_native_batch_norm_legit_no_training": (
        lambda x, w, b, rm, rv, momentum, eps: _eval_route("_native_batch_norm_legit_no_training", x, w, b, rm, rv, eps),
        lambda x, w, b, rm, rv, momentum, eps: _note_eval("_native_batch_norm_legit_no_training", x, w, b, rm, rv, eps)),
    "_batch_norm_no_update": (
        lambda x, w, b, rm, rv, momentum, eps:
            _eval_route("_batch_norm_no_update", x, w, b, rm, rv, eps, (_empty_reserve,)),
        lambda x, w, b, rm, rv, momentum, eps: _note_eval("_batch_norm_no_update", x, w, b, rm, rv, eps)),
    "_native_batch_norm_legit.no_stats": (
        lambda x, w, b, training, momentum, eps:
            _forward_route("no_stats", x, w, b, None, None, momentum, eps) if training else None,
        lambda x, w, b, training, momentum, eps:
            _note_forward("no_stats", x, w, b, None, None, eps) if training else None),
    "_batch_norm_with_update": (
        lambda x, w, b, rm, rv, momentum, eps:
            _forward_route("_batch_norm_with_update", x, w, b, rm, rv, momentum, eps, (_empty_reserve,)),
        lambda x, w, b, rm, rv, momentum, eps: _note_forward("_batch_norm_with_update", x, w, b, rm, rv, eps)),
    "cudnn_batch_norm": (
        lambda x, w, b, rm, rv, training, factor, eps:
            _forward_route("cudnn_batch_norm", x, w, b, rm, rv, factor, eps, (_empty_reserve,)) if training else
            _eval_route("cudnn_batch_norm", x, w, b, rm, rv, eps, (_empty_reserve,)),
        lambda x, w, b, rm, rv, training, factor, eps:
            _note_forward("cudnn_batch_norm", x, w, b, rm, rv, eps) if training else
            _note_eval("cudnn_batch_norm", x, w, b, rm, rv, eps)),
    "native_batch_norm_backward": (
        lambda g, x, w, rm, rv, sm, si, train, eps, mask:
            _backward_route("native_batch_norm_backward", g, x, w, rm, rv, sm, si, _mask(mask)) if train else None,
        lambda g, x, w, rm, rv, sm, si, train, eps, mask:
            _note_backward("native_batch_norm_backward", g, x, w, rm, rv, sm, si, _mask(mask)) if train else None),
    "batch_norm_backward": (
        lambda g, x, w, rm, rv, sm, sv, update, eps, mask, reserve:
            _backward_route("batch_norm_backward", g, x, w, rm, rv, sm, sv, _mask(mask)) if update else None,
        lambda g, x, w, rm, rv, sm, sv, update, eps, mask, reserve:
            _note_backward("batch_norm_backward", g, x, w, rm, rv, sm, sv, _mask(mask)) if update else None),
    "cudnn_batch_norm_backward": (
        lambda x, g, w, rm, rv, sm, sv, eps, reserve:
            _backward_route("cudnn_batch_norm_backward", g, x, w, rm, rv, sm, sv, (True, True, True))
            if _trained(sm) else None,
        lambda x, g, w, rm, rv, sm, sv, eps, reserve:
            _note_backward("cudnn_batch_norm_backward", g, x, w, rm, rv, sm, sv, (True, True, True))
            if _trained(sm) else None),
}


def batch_norm_update_stats(input: Tensor, running_mean: Optional[Tensor], running_var: Optional[Tensor],
                            momentum: float):
    return tuple(reference().batch_norm_update_stats(input, running_mean, running_var, momentum))
