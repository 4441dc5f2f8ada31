"""The ATen contract (docs: ../shared/contract.md) as plain, readable torch code: normkit's oracle.

Aten names, positional signatures, return tuples, shapes, dtypes and memory formats; any device, float64
too; differentiable plain torch ops (the ops layer differentiates the backward functions for double
backward). Every function validates through ``normkit._checks`` before touching data or running stats.

normkit's choices where the contract leaves room:
* batch norm eval saved stats are empty (0,) tensors; backward accepts empty or filled ones in eval
  and then uses the running stats;
* statistics are computed and saved in float32 for fp16/bf16/fp32 inputs and float64 for float64 inputs
  (CUDA's acc type) on every device; group norm keeps aten's rule (input dtype, float32 when mixed);
* invstd/rstd = rsqrt(biased var + eps); running var gets the unbiased n/(n−1) variance;
* parameters of any floating dtype are accepted with any floating input (mixed precision everywhere);
* batch/group norm outputs and grad_input keep ``input``'s suggested memory format, layer norm is
  contiguous, RMS norm contiguous except channels_last(_3d) inputs;
* inputs aten does not check (wrong-size params, missing running stats, rank < 2) raise instead.
"""

from normkit.reference._common import acc_dtype, dense_memory_format, suggest_memory_format
from normkit.reference.batch_norm import (
    _batch_norm_no_update,
    _batch_norm_with_update,
    _native_batch_norm_legit,
    _native_batch_norm_legit_no_stats,
    _native_batch_norm_legit_no_training,
    batch_norm_backward,
    batch_norm_update_stats,
    cudnn_batch_norm,
    cudnn_batch_norm_backward,
    native_batch_norm,
    native_batch_norm_backward,
)
from normkit.reference.group_norm import native_group_norm, native_group_norm_backward
from normkit.reference.instance_norm import instance_norm
from normkit.reference.layer_norm import native_layer_norm, native_layer_norm_backward
from normkit.reference.rms_norm import _fused_rms_norm, _fused_rms_norm_backward, default_rms_eps, rms_norm
from normkit.reference.sync_batch_norm import (
    batch_norm_backward_elemt,
    batch_norm_backward_reduce,
    batch_norm_elemt,
    batch_norm_gather_stats,
    batch_norm_gather_stats_with_counts,
    batch_norm_stats,
)

__all__ = [
    "native_batch_norm",
    "_native_batch_norm_legit",
    "_native_batch_norm_legit_no_stats",
    "_native_batch_norm_legit_no_training",
    "_batch_norm_with_update",
    "_batch_norm_no_update",
    "native_batch_norm_backward",
    "batch_norm_backward",
    "batch_norm_update_stats",
    "cudnn_batch_norm",
    "cudnn_batch_norm_backward",
    "batch_norm_stats",
    "batch_norm_gather_stats",
    "batch_norm_gather_stats_with_counts",
    "batch_norm_elemt",
    "batch_norm_backward_reduce",
    "batch_norm_backward_elemt",
    "native_layer_norm",
    "native_layer_norm_backward",
    "_fused_rms_norm",
    "_fused_rms_norm_backward",
    "rms_norm",
    "default_rms_eps",
    "native_group_norm",
    "native_group_norm_backward",
    "instance_norm",
    "acc_dtype",
    "dense_memory_format",
    "suggest_memory_format",
]
