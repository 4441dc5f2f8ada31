"""`torch.nn.functional`-style normalization with autograd, through normkit's custom ops.

Signatures and the Python-side checks are `torch.nn.functional`'s (contract §2.5, §4-§7): the batch of
one, eps sign, spatial size and group checks raise the same `ValueError`s, then the aten-level checks of
`normkit._checks` run before any kernel launch (running statistics stay untouched when a call raises).

Batch, layer and RMS norm go through `normkit.ops.custom`'s autograd Functions (double backward too),
which call the `torch.ops.normkit.*` custom ops inside `torch.compile` (fullgraph works) and the same
implementations directly in eager; both are CUDA-graph capturable (no host synchronisation). Group norm goes
through `normkit::group_norm` the same way; instance norm through it too, with one group per channel (or
through batch norm's eval mode when it uses running statistics).

On CPU without `TRITON_INTERPRET=1` the ops run the reference; with it (set before Triton is imported)
they run the Triton kernels through the interpreter. Inside `torch.func` transforms (vmap, grad, jvp, ...) and
on forward-mode dual tensors every function here calls torch's own (`_in_transform`). Under autocast, layer /
group / RMS norm cast to fp32 where torch's autocast would (`_autocast_fp32`: CUDA).
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import List, Optional, Sequence, Tuple

import torch
import torch.autograd.forward_ad as _forward_ad
from torch import Tensor
from torch.overrides import handle_torch_function, has_torch_function

from normkit import _checks

__all__ = ["batch_norm", "layer_norm", "rms_norm", "group_norm", "instance_norm", "add_layer_norm",
           "add_rms_norm"]


def _torch_function_aware(fn):
    """``fn`` dispatching through ``__torch_function__`` first, as torch.nn.functional's functions do: under
    `torch.fx.symbolic_trace` a Proxy argument records one ``call_function`` node of ``fn``, and a tensor subclass
    that overrides it sees the call."""
    @functools.wraps(fn)
    def dispatching(*args, **kwargs):
        given = (*args, *kwargs.values())
        if has_torch_function(given):
            return handle_torch_function(dispatching, given, *args, **kwargs)
        return fn(*args, **kwargs)
    return dispatching


def _ops():
    from normkit.ops import custom

    return custom


_functorch_level = getattr(getattr(torch._C, "_functorch", None), "maybe_current_level", None)
_is_exporting = getattr(torch.compiler, "is_exporting", lambda: False)


@torch.compiler.assume_constant_result  # Dynamo runs it while tracing (it guards the functorch stack it traced under)
def _in_functorch() -> bool:
    return _functorch_level is not None and _functorch_level() is not None  # wrapped tensors exist only in there


def _in_transform(*tensors: Optional[Tensor]) -> bool:
    """Whether a `torch.func` transform (vmap, grad, jvp, jacrev, ...) is active, `torch.jit.trace` is
    recording, or any of these tensors is a forward-mode dual tensor (`torch.autograd.forward_ad`) or a nested
    tensor (whose layer / RMS norm torch implements on the packed values; normkit's kernels take dense tensors). normkit's
    autograd Functions and kernels take plain tensors, and a trace would record the Function's inside without
    its no-grad context (its running-statistics update then carried a graph), so such calls go to torch's own
    functional op (whose batching and derivative rules exist; under `enable()` its CUDA kernels still reach
    normkit's). `torch.export` gets torch's ops too: an exported program then holds aten ops only (it loads and
    differentiates without normkit; under `enable()` they still run normkit's kernels)."""
    if any(isinstance(t, Tensor) and t.is_nested for t in tensors):
        return True
    if torch.compiler.is_compiling():  # Dynamo cannot trace the jit and forward-AD checks (nor needs them)
        return _is_exporting() or _in_functorch()
    if torch._C._is_tracing() or _in_functorch():
        return True
    return _forward_ad._current_level >= 0 and any(
        t is not None and _forward_ad.unpack_dual(t).tangent is not None for t in tensors)


_AUTOCAST_KEYS = {"cuda": "AutocastCUDA", "cpu": "AutocastCPU", "xpu": "AutocastXPU", "mps": "AutocastMPS"}


def _autocast_registrations(keys: dict) -> frozenset:
    """(op, device type) pairs for which torch registers an autocast kernel of the norms that have one
    (``keys``: device type -> its autocast dispatch key)."""
    return frozenset((op, dev) for op in ("layer_norm", "group_norm", "rms_norm") for dev, key in keys.items()
                     if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", key))


# looked up once: Dynamo traces a set lookup, not the dispatcher query
_AUTOCAST_OPS = _autocast_registrations(_AUTOCAST_KEYS)


def _autocast_fp32(op: str, x: Tensor) -> bool:
    """Whether torch's autocast would run ``aten::<op>`` on x in fp32: autocast on for x's device and the op
    in that device's autocast lists (CUDA: layer_norm, group_norm and rms_norm, all with the fp32 policy;
    CPU: none of the norms). normkit's layer / group / RMS norm then do what torch's would: fp16 / bf16
    tensors cast to fp32, an fp32 output (a drop-in module must not change the dtype autocast gives)."""
    dev = "cuda" if x.is_cuda else ("cpu" if x.is_cpu else x.device.type)
    return (op, dev) in _AUTOCAST_OPS and torch.is_autocast_enabled(dev)


def _fp32(t: Optional[Tensor]) -> Optional[Tensor]:
    """autocast's fp32 cast: fp16 / bf16 tensors to fp32, anything else as it is."""
    return t.float() if t is not None and t.dtype in (torch.float16, torch.bfloat16) else t


# torch's argument parser on these functions' arguments (python_arg_parser): what each kind accepts and the
# TypeError it raises, e.g. "layer_norm(): argument 'eps' (position 5) must be float, not str"

def _type_name(v) -> str:
    t = type(v)  # as torch prints it: "list", "Tensor", "numpy.ndarray"
    return t.__qualname__ if t.__module__ in ("builtins", "torch") else f"{t.__module__}.{t.__qualname__}"


def _int_like(v) -> bool:
    """An int argument: a Python or numpy integer (not a bool), a SymInt, or a one-element integer tensor."""
    if type(v) is int:  # (the common case first: isinstance against the numbers ABCs costs ~0.5 us)
        return True
    if isinstance(v, Tensor):
        return v.numel() == 1 and not (v.is_floating_point() or v.is_complex() or v.dtype == torch.bool)
    return isinstance(v, (numbers.Integral, torch.SymInt)) and not isinstance(v, bool)


def _check_args(fn: str, tensors=(), floats=(), bools=(), ints=()) -> None:
    """``(name, position, value)`` triples by kind, checked as torch's parser checks them. Tensor arguments may
    be None, except ``input`` (the parser's TypeError for None too); a float is any real number or a 0-dim
    tensor."""
    for name, pos, v in tensors:
        if not isinstance(v, Tensor) and (v is not None or name == "input"):
            _arg_error(fn, name, pos, "Tensor", v)
    for name, pos, v in floats:
        if type(v) is not float and not isinstance(v, (numbers.Real, torch.SymFloat, torch.SymInt)) and not (
                isinstance(v, Tensor) and v.dim() == 0):
            _arg_error(fn, name, pos, "float", v)
    for name, pos, v in bools:
        if type(v) is not bool:
            _arg_error(fn, name, pos, "bool", v)
    for name, pos, v in ints:
        if not _int_like(v) or (isinstance(v, Tensor) and v.dim() != 0):
            _arg_error(fn, name, pos, "int", v)


def _arg_error(fn: str, name: str, pos: int, kind: str, v) -> None:
    if torch.compiler.is_compiling():  # Dynamo's symbolic values: nothing to say about them here
        return
    raise TypeError(f"{fn}(): argument '{name}' (position {pos}) must be {kind}, not {_type_name(v)}")


def _shape_list(normalized_shape, name="layer_norm") -> List[int]:
    if isinstance(normalized_shape, (list, tuple, torch.Size)):
        for i, s in enumerate(normalized_shape):
            if not _int_like(s):
                raise TypeError(f"{name}(): argument 'normalized_shape' (position 2) must be tuple of ints, but "
                                f"found element of type {_type_name(s)} at pos {i}")
        return [int(s) for s in normalized_shape]
    raise TypeError(f"{name}(): argument 'normalized_shape' (position 2) must be tuple of ints, "
                    f"not {type(normalized_shape).__name__}")


def _fuses(x: Tensor, residual: Tensor) -> bool:
    """Whether the fused kernels take ``x + residual``: two contiguous tensors of one shape and one real dtype.
    Other pairs (a residual stream kept in fp32 beside 16-bit branches, a broadcast residual, channels_last or
    transposed tensors, complex ones) get torch's sum, with its promotion, broadcasting and memory format, then
    the plain norm: the fused kernels' outputs are contiguous."""
    return (isinstance(x, Tensor) and isinstance(residual, Tensor) and residual.shape == x.shape
            and residual.dtype == x.dtype and not x.dtype.is_complex and x.is_contiguous()
            and residual.is_contiguous())


def _empty_batch_output(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor]) -> Tensor:
    # torch's _batch_norm_impl_index for an empty input: no view of the input, no gradient-chain break.
    # select(), not [0]: ATen's `weight[0]` raises select()'s IndexError text for an empty weight
    # (instance norm of an empty batch repeats the parameters zero times).
    out = input.clone()
    if weight is not None:
        out = out * weight.select(0, 0)
    if bias is not None:
        out = out + bias.select(0, 0)
    return out


@_torch_function_aware
def batch_norm(input: Tensor, running_mean: Optional[Tensor], running_var: Optional[Tensor],
               weight: Optional[Tensor] = None, bias: Optional[Tensor] = None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Like `torch.nn.functional.batch_norm`; running statistics are updated in place in training."""
    if _in_transform(input, running_mean, running_var, weight, bias):
        return torch.nn.functional.batch_norm(input, running_mean, running_var, weight, bias, training, momentum,
                                              eps)
    if training:
        _checks.verify_batch_size(input.size())
    _checks.check_batch_norm_eps(eps, training)
    _check_args("batch_norm", tensors=(("input", 1, input), ("weight", 2, weight), ("bias", 3, bias),
                                       ("running_mean", 4, running_mean), ("running_var", 5, running_var)),
                bools=(("training", 6, training),), floats=(("momentum", 7, momentum), ("eps", 8, eps)))
    if input.numel() == 0:
        # torch.batch_norm (`_batch_norm_impl_index`) returns for an empty input before any other check:
        # no rank, size, running-stat or dtype error, and no running-stat update.
        return _empty_batch_output(input, weight, bias)
    _checks.check_batch_norm(input, weight, bias, running_mean, running_var, training, allow_empty=True,
                             functional=True)
    y, _, _ = _ops().batch_norm_autograd(input, weight, bias, running_mean, running_var, bool(training),
                                float(momentum), float(eps))
    return y


@_torch_function_aware
def layer_norm(input: Tensor, normalized_shape: Sequence[int], weight: Optional[Tensor] = None,
               bias: Optional[Tensor] = None, eps: float = 1e-5) -> Tensor:
    """Like `torch.nn.functional.layer_norm` (output contiguous, as ATen's)."""
    if _in_transform(input, weight, bias):
        return torch.nn.functional.layer_norm(input, normalized_shape, weight, bias, eps)
    if not isinstance(input, Tensor):  # required: None too gets the parser's TypeError
        _arg_error("layer_norm", "input", 1, "Tensor", input)
    if _autocast_fp32("layer_norm", input):
        with torch.autocast(input.device.type, enabled=False):
            return layer_norm(_fp32(input), normalized_shape, _fp32(weight), _fp32(bias), eps)
    ns = _shape_list(normalized_shape)
    _check_args("layer_norm", tensors=(("weight", 3, weight), ("bias", 4, bias)), floats=(("eps", 5, eps),))
    _checks.check_layer_norm(input, ns, weight, bias)
    return _ops().layer_norm_autograd(input, ns, weight, bias, float(eps))[0]


def _rms_eps(dtype: torch.dtype, eps: Optional[float]) -> float:
    if eps is not None:
        return float(eps)
    return float(torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps)


@_torch_function_aware
def rms_norm(input: Tensor, normalized_shape: Sequence[int], weight: Optional[Tensor] = None,
             eps: Optional[float] = None) -> Tensor:
    """Like `torch.nn.functional.rms_norm`: eps=None means the machine epsilon of the compute type (fp32,
    fp64 for fp64 input); `x * rstd * weight` is computed in the compute type, then cast."""
    if _in_transform(input, weight):
        return torch.nn.functional.rms_norm(input, normalized_shape, weight, eps)
    if not isinstance(input, Tensor):
        _arg_error("rms_norm", "input", 1, "Tensor", input)
    if _autocast_fp32("rms_norm", input):
        with torch.autocast(input.device.type, enabled=False):
            return rms_norm(_fp32(input), normalized_shape, _fp32(weight), eps)
    from normkit.ops.layer_norm import check_rms_norm_rank, keep_channels_last

    ns = _shape_list(normalized_shape, "rms_norm")
    _check_args("rms_norm", tensors=(("weight", 3, weight),), floats=() if eps is None else (("eps", 4, eps),))
    check_rms_norm_rank(input, ns, weight)
    _checks.check_rms_norm(input, ns, weight)
    if input.dtype.is_complex:
        from normkit import reference

        return reference.rms_norm(input, ns, weight, eps)
    y = _ops().rms_norm_autograd(input, ns, weight, _rms_eps(input.dtype, eps))[0]
    return keep_channels_last(y, input)


@_torch_function_aware
def add_layer_norm(x: Tensor, residual: Tensor, normalized_shape: Sequence[int], weight: Optional[Tensor] = None,
                   bias: Optional[Tensor] = None, eps: float = 1e-5) -> Tuple[Tensor, Tensor]:
    """Pre-norm residual fusion: returns `(layer_norm(x + residual), x + residual)`, one kernel on GPU where x and
    residual are contiguous, of one shape and one real dtype (else torch's sum, with its broadcasting, type
    promotion and memory format, then the norm)."""
    if _in_transform(x, residual, weight, bias) or not _fuses(x, residual) or _autocast_fp32("layer_norm", x):
        s = x + residual  # autocast: the sum in the input dtype, its norm in fp32 (as torch's)
        return layer_norm(s, normalized_shape, weight, bias, eps), s
    ns = _shape_list(normalized_shape)  # the same checks and errors as layer_norm(x + residual)
    _check_args("layer_norm", tensors=(("weight", 3, weight), ("bias", 4, bias)), floats=(("eps", 5, eps),))
    _checks.check_layer_norm(x, ns, weight, bias)
    y, s, _, _ = _ops().add_layer_norm_autograd(x, residual, ns, weight, bias, float(eps))
    return y, s


@_torch_function_aware
def add_rms_norm(x: Tensor, residual: Tensor, normalized_shape: Sequence[int], weight: Optional[Tensor] = None,
                 eps: Optional[float] = None) -> Tuple[Tensor, Tensor]:
    """Pre-norm residual fusion: returns `(rms_norm(x + residual), x + residual)`, fused as `add_layer_norm`."""
    if _in_transform(x, residual, weight) or not _fuses(x, residual) or _autocast_fp32("rms_norm", x):
        s = x + residual
        return rms_norm(s, normalized_shape, weight, eps), s
    from normkit.ops.layer_norm import check_rms_norm_rank

    ns = _shape_list(normalized_shape, "rms_norm")  # the same checks and errors as rms_norm(x + residual)
    _check_args("rms_norm", tensors=(("weight", 3, weight),), floats=() if eps is None else (("eps", 4, eps),))
    check_rms_norm_rank(x, ns, weight)
    _checks.check_rms_norm(x, ns, weight)
    y, s, _ = _ops().add_rms_norm_autograd(x, residual, ns, weight, _rms_eps(x.dtype, eps))
    return y, s


@_torch_function_aware
def group_norm(input: Tensor, num_groups: int, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
               eps: float = 1e-5) -> Tensor:
    """Like `torch.nn.functional.group_norm`; the output keeps the input's suggested memory format."""
    if _in_transform(input, weight, bias):
        return torch.nn.functional.group_norm(input, num_groups, weight, bias, eps)
    _checks.check_group_norm_functional(input, num_groups)  # F.group_norm's checks come first (input.dim() ...)
    if _autocast_fp32("group_norm", input):
        with torch.autocast(input.device.type, enabled=False):
            return group_norm(_fp32(input), num_groups, _fp32(weight), _fp32(bias), eps)
    _check_args("group_norm", tensors=(("input", 1, input), ("weight", 3, weight), ("bias", 4, bias)),
                ints=(("num_groups", 2, num_groups),), floats=(("eps", 5, eps),))
    _checks.check_group_norm(input, weight, bias, input.shape[0], input.shape[1], math.prod(input.shape[2:]),
                             num_groups)
    return _ops().group_norm_autograd(input, int(num_groups), weight, bias, float(eps))[0]


@_torch_function_aware
def instance_norm(input: Tensor, running_mean: Optional[Tensor] = None, running_var: Optional[Tensor] = None,
                  weight: Optional[Tensor] = None, bias: Optional[Tensor] = None, use_input_stats: bool = True,
                  momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Like `torch.nn.functional.instance_norm`. With input statistics it is group norm with one group per
    channel (the same arithmetic as ATen's batch norm on the `(1, N*C, *)` view, without repeating the
    parameters), with fp32 saved statistics; running statistics, when given, move towards the batch
    average of the per-instance mean and unbiased variance. With running statistics it is batch norm's
    eval mode on the input itself."""
    if _in_transform(input, running_mean, running_var, weight, bias):
        return torch.nn.functional.instance_norm(input, running_mean, running_var, weight, bias, use_input_stats,
                                                 momentum, eps)
    if use_input_stats:
        _checks.verify_spatial_size(input.size())
    _check_args("instance_norm", tensors=(("input", 1, input), ("weight", 2, weight), ("bias", 3, bias),
                                          ("running_mean", 4, running_mean), ("running_var", 5, running_var)),
                bools=(("use_input_stats", 6, use_input_stats),), floats=(("momentum", 7, momentum), ("eps", 8, eps)))
    _checks.check_instance_norm(input, weight, bias, running_mean, running_var, use_input_stats)
    return _instance_norm_checked(input, running_mean, running_var, weight, bias, use_input_stats, momentum, eps)


def _instance_norm_checked(input, running_mean, running_var, weight, bias, use_input_stats, momentum, eps):
    """instance_norm after its checks (also what `enable()` routes `aten::instance_norm` to).

    As aten's (contract §6), it normalizes ``input.contiguous()``: the output, and the input's gradient, are
    contiguous for a channels_last input too. Its backward uses a copy of the weight (aten's saves
    ``weight.repeat(N)``), so the weight may change in place before it, as an optimizer step does."""
    n, c = input.shape[0], input.shape[1]
    input = _ops().contiguous_autograd(input)
    if weight is not None and torch.is_grad_enabled() and (input.requires_grad or weight.requires_grad):
        weight = weight.clone()
    if input.numel() == 0:
        if use_input_stats and n == 0 and (running_mean is not None or running_var is not None):
            # aten writes back the mean over no instances (contract §6): the batch average of an empty batch, NaN
            from normkit.ops.group_norm import update_instance_running_stats

            no_means = input.new_empty((0, c), dtype=torch.float32)
            update_instance_running_stats(running_mean, running_var, no_means, input, float(momentum))
        x = input.view((1, n * c) + tuple(input.shape[2:]))
        w = None if weight is None else weight.repeat(n)
        b = None if bias is None else bias.repeat(n)
        return _empty_batch_output(x, w, b).view(input.shape)
    if not use_input_stats:
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (input, weight, bias)):
            # aten normalizes with copies (repeated N times) of the running statistics: its backward keeps this
            # call's values when they change in place before it (a training-mode call, load_state_dict); saved as
            # they are they would fail autograd's version check
            running_mean, running_var = running_mean.clone(), running_var.clone()
        return _ops().batch_norm_autograd(input, weight, bias, running_mean, running_var, False, float(momentum),
                                          float(eps))[0]
    y, mean, _ = _ops().group_norm_autograd(input, c, weight, bias, float(eps), True)
    if running_mean is not None or running_var is not None:
        from normkit.ops.group_norm import update_instance_running_stats

        update_instance_running_stats(running_mean, running_var, mean, input, float(momentum))
    return y
