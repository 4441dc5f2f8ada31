"""Drop-in normalization modules running normkit's ops, and `convert(model)`.

Each module subclasses its `torch.nn` counterpart: same constructor, parameters, buffers and
`state_dict` keys (interchangeable both ways), same rank checks and messages; only `forward` changes.
`isinstance(m, torch.nn.BatchNorm2d)` stays true, so code that special-cases norm layers keeps working.
"""

from __future__ import annotations

import warnings

import torch

from normkit import functional as _F

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm", "LayerNorm", "RMSNorm", "GroupNorm",
           "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "convert"]

_Proxy = torch.fx.Proxy


def _fx_traced(module: torch.nn.Module, input) -> object:
    """``module(input)`` while `torch.fx.symbolic_trace` records it (``input`` a Proxy), as the tracer would record
    torch's module. fx's default tracer keeps modules of the ``torch.nn`` namespace whole (`Tracer.is_leaf_module`
    reads ``__module__``, which normkit's classes do not share), so the call becomes one ``call_module`` node of this
    module whenever the tracer says torch's counterpart is a leaf; otherwise (a tracer that traces through it, or
    this module as the traced root) torch's own forward is traced, errors included."""
    tracer = input.tracer
    base = next(c for c in type(module).__mro__ if c.__module__.startswith("torch.nn"))
    if module is not getattr(tracer, "root", None) and type(module) in _TORCH_BASES:
        path = tracer.path_of_module(module)
        if tracer.is_leaf_module(_swapped(module, base), path):
            return tracer.create_proxy("call_module", path, (input,), {})
    return base.forward(module, input)


class _BatchNormMixin:
    """`torch.nn.modules.batchnorm._BatchNorm.forward` with normkit's batch norm.

    momentum=None is the cumulative moving average: the factor is `1 / num_batches_tracked` (read on the
    host, as torch does). Unlike torch, the input is validated before `num_batches_tracked` is bumped,
    so a call that raises changes no buffer at all.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if isinstance(input, _Proxy):
            return _fx_traced(self, input)
        self._check_input_dim(input)
        return self._batch_norm(input, *self._mode())

    def _batch_norm(self, input, bn_training, running_mean, running_var):
        """This process's batch norm (the mode and statistics from ``_mode``), input checked first."""
        if bn_training:
            from normkit import _checks

            _checks.verify_batch_size(input.size())
            _checks.check_batch_norm_eps(self.eps, True)
            self._check_training_input(input, running_mean, running_var)
        factor = self._factor()
        return _F.batch_norm(input, running_mean, running_var, self.weight, self.bias, bn_training, factor,
                             self.eps)

    def _mode(self):
        """(batch statistics?, running_mean, running_var) as torch's _BatchNorm.forward picks them."""
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        use_stats = not self.training or self.track_running_stats
        return bn_training, self.running_mean if use_stats else None, self.running_var if use_stats else None

    def _check_training_input(self, input, running_mean, running_var):
        """The checks before the batch statistics' running-stat update (F.batch_norm's eps rule is the caller's:
        torch's synchronized path has none)."""
        from normkit import _checks

        if input.numel() > 0:  # torch.batch_norm checks nothing more for an empty batch
            _checks.check_batch_norm(input, self.weight, self.bias, running_mean, running_var, True,
                                     allow_empty=True)

    def _factor(self) -> float:
        """The running statistics' momentum for this call; bumps num_batches_tracked in training."""
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        return factor


class BatchNorm1d(_BatchNormMixin, torch.nn.BatchNorm1d):
    pass


class BatchNorm2d(_BatchNormMixin, torch.nn.BatchNorm2d):
    pass


class BatchNorm3d(_BatchNormMixin, torch.nn.BatchNorm3d):
    pass


class SyncBatchNorm(_BatchNormMixin, torch.nn.SyncBatchNorm):
    """`torch.nn.SyncBatchNorm` on normkit (`normkit.distributed.sync_batch_norm`): in training, with an
    initialized process group of more than one rank, statistics over every rank of ``process_group``; otherwise
    normkit's batch norm. Any device the process group's backend serves (gloo: the CPU too, where torch's
    module refuses). The input is checked before any buffer changes."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if isinstance(input, _Proxy):
            return _fx_traced(self, input)
        self._check_input_dim(input)
        self._check_non_zero_input_channels(input)
        bn_training, running_mean, running_var = self._mode()
        import torch.distributed as dist

        sync = bn_training and self.training and dist.is_available() and dist.is_initialized()
        group = (self.process_group or dist.group.WORLD) if sync else None
        if not sync or dist.get_world_size(group) <= 1:  # (-1: this rank is not in the group)
            return self._batch_norm(input, bn_training, running_mean, running_var)
        self._check_training_input(input, running_mean, running_var)
        from normkit.distributed import sync_batch_norm

        return sync_batch_norm(input, running_mean, running_var, self.weight, self.bias, self._factor(), self.eps,
                               group)

    @classmethod
    def convert_sync_batchnorm(cls, module: torch.nn.Module, process_group=None) -> torch.nn.Module:
        """Every batch-norm module (torch's or normkit's, 1d / 2d / 3d, SyncBatchNorm too) becomes normkit's
        SyncBatchNorm sharing its parameters and buffers; the (possibly new) root is returned. A SyncBatchNorm,
        normkit's too, is made anew as torch does, so that it takes the given ``process_group``."""
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            new = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
                      process_group)
            if module.affine:
                new.weight, new.bias = module.weight, module.bias
            new.running_mean, new.running_var = module.running_mean, module.running_var
            new.num_batches_tracked = module.num_batches_tracked
            new.train(module.training)
            if hasattr(module, "qconfig"):
                new.qconfig = module.qconfig
            return new
        for name, child in list(module.named_children()):
            new = cls.convert_sync_batchnorm(child, process_group)
            if new is not child:
                setattr(module, name, new)
        return module


class LayerNorm(torch.nn.LayerNorm):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if isinstance(input, _Proxy):
            return _fx_traced(self, input)
        return _F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


if hasattr(torch.nn, "RMSNorm"):
    class RMSNorm(torch.nn.RMSNorm):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if isinstance(x, _Proxy):
                return _fx_traced(self, x)
            return _F.rms_norm(x, self.normalized_shape, self.weight, self.eps)
else:  # pragma: no cover - torch < 2.4
    class RMSNorm(torch.nn.Module):
        def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None):
            super().__init__()
            if isinstance(normalized_shape, int):
                normalized_shape = (normalized_shape,)
            self.normalized_shape = tuple(normalized_shape)
            self.eps = eps
            self.elementwise_affine = elementwise_affine
            if elementwise_affine:
                self.weight = torch.nn.Parameter(torch.ones(self.normalized_shape, device=device, dtype=dtype))
            else:
                self.register_parameter("weight", None)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return _F.rms_norm(x, self.normalized_shape, self.weight, self.eps)


class GroupNorm(torch.nn.GroupNorm):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if isinstance(input, _Proxy):
            return _fx_traced(self, input)
        return _F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)


class _InstanceNormMixin:
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if isinstance(input, _Proxy):
            return _fx_traced(self, input)
        return super().forward(input)

    def _apply_instance_norm(self, input: torch.Tensor) -> torch.Tensor:
        return _F.instance_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                                self.training or not self.track_running_stats,
                                self.momentum if self.momentum is not None else 0.0, self.eps)


class InstanceNorm1d(_InstanceNormMixin, torch.nn.InstanceNorm1d):
    pass


class InstanceNorm2d(_InstanceNormMixin, torch.nn.InstanceNorm2d):
    pass


class InstanceNorm3d(_InstanceNormMixin, torch.nn.InstanceNorm3d):
    pass


_SWAPS = {
    torch.nn.BatchNorm1d: BatchNorm1d,
    torch.nn.BatchNorm2d: BatchNorm2d,
    torch.nn.BatchNorm3d: BatchNorm3d,
    torch.nn.SyncBatchNorm: SyncBatchNorm,
    torch.nn.LayerNorm: LayerNorm,
    torch.nn.GroupNorm: GroupNorm,
    torch.nn.InstanceNorm1d: InstanceNorm1d,
    torch.nn.InstanceNorm2d: InstanceNorm2d,
    torch.nn.InstanceNorm3d: InstanceNorm3d,
}
if hasattr(torch.nn, "RMSNorm"):
    _SWAPS[torch.nn.RMSNorm] = RMSNorm


def _torch_module(self) -> torch.nn.Module:
    """``__prepare_scriptable__``: `torch.jit.script` compiles torch's own module in place of normkit's (whose
    forward is Python TorchScript cannot compile), sharing its parameters and buffers; under `enable()` the
    scripted aten ops still reach normkit's kernels. torch writes the module returned here into the parent's
    ``_modules``, so the eager model passed to `torch.jit.script` holds torch's module afterwards: said once."""
    base = _TORCH_BASES.get(type(self))
    if base is None:
        return self
    warnings.warn("torch.jit.script replaces normkit.nn modules by their torch.nn counterparts (same parameters and "
                  "buffers), in the scripted model and, through torch's module preparation, in the model it was "
                  "given; script a copy.deepcopy(model) to keep the eager model on normkit", UserWarning, stacklevel=2)
    return _swapped(self, base)


_TORCH_BASES = {normkit_cls: torch_cls for torch_cls, normkit_cls in _SWAPS.items()}
for _cls in _TORCH_BASES:
    _cls.__prepare_scriptable__ = _torch_module


_LAZY_SWAPS = {
    torch.nn.LazyBatchNorm1d: BatchNorm1d,
    torch.nn.LazyBatchNorm2d: BatchNorm2d,
    torch.nn.LazyBatchNorm3d: BatchNorm3d,
    torch.nn.LazyInstanceNorm1d: InstanceNorm1d,
    torch.nn.LazyInstanceNorm2d: InstanceNorm2d,
    torch.nn.LazyInstanceNorm3d: InstanceNorm3d,
}


def _swapped(module: torch.nn.Module, cls) -> torch.nn.Module:
    """A `cls` instance sharing `module`'s parameters, buffers and hooks (not copies: the same tensors)."""
    new = cls.__new__(cls)
    state = {}
    for key, value in module.__dict__.items():
        # containers are copied (so later registrations on one module don't leak into the other), their
        # contents (Parameters, buffers, hooks) are shared; the hook dicts themselves are shared, as a
        # RemovableHandle from before convert() removes its hook from the dict it was registered in
        copy = isinstance(value, (dict, set)) and "hooks" not in key
        state[key] = type(value)(value) if copy else value
    new.__dict__.update(state)
    return new


def convert(model: torch.nn.Module) -> torch.nn.Module:
    """Swap every `torch.nn` norm module (exact types only, not user subclasses) for normkit's.

    Parameters and buffers are shared with the originals, so optimizers built before the call keep
    working and `state_dict()` is unchanged. Children are replaced in place; the (possibly new) root is
    returned. A module reachable under several names becomes one normkit module under all of them. A lazy
    norm module (`LazyBatchNorm2d`, ...) stays itself and becomes normkit's module once it infers its shape.
    """
    return _convert(model, {})


def _convert(model: torch.nn.Module, memo: dict) -> torch.nn.Module:
    """convert() with ``memo``: id of every module seen -> what it became."""
    if id(model) in memo:
        return memo[id(model)]
    lazy = _LAZY_SWAPS.get(type(model))
    if lazy is not None:
        # its shape-inference hooks are bound to this very object: let it become normkit's class itself
        model.cls_to_become = lazy
        memo[id(model)] = model
        return model
    cls = _SWAPS.get(type(model))
    if cls is not None:
        memo[id(model)] = new = _swapped(model, cls)
        return new
    memo[id(model)] = model
    # _modules, not named_children(): that lists a shared child under its first name only
    for name, child in list(model._modules.items()):
        if child is None:
            continue
        new = _convert(child, memo)
        if new is not child:
            setattr(model, name, new)
    return model
