"""Instance norm, contract §6: aten's composite ``instance_norm`` as plain torch code.

Batch norm over the (1, N·C, *spatial) view of the contiguous input, with weight/bias/running stats
repeated N times; the running stats then receive the average over the batch of the per-instance updates.
The output is contiguous (also for channels_last input), as in aten.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from normkit import _checks
from normkit.reference.batch_norm import _forward

__all__ = ["instance_norm"]


def instance_norm(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                  running_mean: Optional[Tensor], running_var: Optional[Tensor], use_input_stats: bool,
                  momentum: float, eps: float, cudnn_enabled: bool = False) -> Tensor:
    """``aten::instance_norm`` → out. ``cudnn_enabled`` is accepted and ignored."""
    _checks.check_instance_norm(input, weight, bias, running_mean, running_var, use_input_stats)
    n, c = input.shape[0], input.shape[1]
    if input.numel() == 0:
        # aten's batch_norm returns early on empty input (nothing to normalize); instance_norm still writes back the
        # mean over the N = 0 instances of the repeated statistics: NaN (contract §6), with input statistics
        if use_input_stats and n == 0:
            _write_back_empty(running_mean, running_var)
        return input.clone(memory_format=torch.contiguous_format)
    x = input.contiguous().reshape([1, n * c] + list(input.shape[2:]))
    rep = [None if t is None else t.repeat(n) for t in (weight, bias, running_mean, running_var)]
    out, _, _ = _forward(x, rep[0], rep[1], rep[2], rep[3], use_input_stats, momentum, eps)
    if use_input_stats:
        with torch.no_grad():
            for stat, repeated in ((running_mean, rep[2]), (running_var, rep[3])):
                if stat is not None:
                    stat.copy_(repeated.reshape(n, c).mean(0))
    return out.reshape(input.shape)


def _write_back_empty(running_mean: Optional[Tensor], running_var: Optional[Tensor]) -> None:
    """What aten's instance_norm leaves in the running statistics after a batch of no instances: the mean over
    none of them, NaN."""
    with torch.no_grad():
        for stat in (running_mean, running_var):
            if stat is not None:
                stat.fill_(float("nan"))
