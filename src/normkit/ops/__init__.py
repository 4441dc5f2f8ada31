"""normkit's operators.

* aten-named functions (`native_batch_norm`, `native_layer_norm`, `_fused_rms_norm`, ...): aten's
  signatures and return values, no autograd. They validate (`normkit._checks`), then run the Triton
  kernels where they apply, else `normkit.reference`. `normkit.enable()` registers them below ATen's
  autograd.
* `normkit.ops.custom`: `torch.library` custom ops (`torch.ops.normkit.*`) with fake implementations and
  autograd, used by `normkit.functional` and `normkit.nn` (torch.compile, CUDA graphs).
"""

from normkit.ops.batch_norm import (  # noqa: F401
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
from normkit.ops.group_norm import (  # noqa: F401
    batch_norm_backward_elemt,
    batch_norm_backward_reduce,
    batch_norm_elemt,
    batch_norm_gather_stats,
    batch_norm_gather_stats_with_counts,
    batch_norm_stats,
    instance_norm,
    native_group_norm,
    native_group_norm_backward,
)
from normkit.ops.layer_norm import (  # noqa: F401
    _fused_rms_norm,
    _fused_rms_norm_backward,
    add_layer_norm,
    add_rms_norm,
    native_layer_norm,
    native_layer_norm_backward,
    rms_norm,
)
from normkit.ops import custom  # noqa: F401,E402

__all__ = [
    "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_stats",
    "_native_batch_norm_legit_no_training", "_batch_norm_with_update", "_batch_norm_no_update",
    "native_batch_norm_backward", "batch_norm_backward", "cudnn_batch_norm", "cudnn_batch_norm_backward",
    "batch_norm_update_stats", "native_layer_norm", "native_layer_norm_backward", "_fused_rms_norm",
    "_fused_rms_norm_backward", "rms_norm", "add_layer_norm", "add_rms_norm", "native_group_norm",
    "native_group_norm_backward", "instance_norm", "batch_norm_stats", "batch_norm_gather_stats",
    "batch_norm_gather_stats_with_counts", "batch_norm_elemt", "batch_norm_backward_reduce",
    "batch_norm_backward_elemt", "custom",
]
