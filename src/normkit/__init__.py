"""normkit: PyTorch's normalization operators, exact to the ATen contract and fast on NVIDIA GPUs.

    import normkit
    normkit.enable()                      # route aten's norm ops on CUDA tensors through normkit
    y = normkit.batch_norm(x, rm, rv, w, b, training=True)    # like torch.nn.functional
    model = normkit.nn.convert(model)     # swap torch.nn norm modules for normkit's
    model = normkit.nn.SyncBatchNorm.convert_sync_batchnorm(model)   # batch norm across torch.distributed ranks

Importing normkit does not import Triton: the kernels load on first use.
"""

__version__ = "0.1.0"

from normkit import reference  # noqa: E402,F401
from normkit import ops  # noqa: E402,F401
from normkit import functional  # noqa: E402,F401
from normkit import nn  # noqa: E402,F401
from normkit import distributed  # noqa: E402,F401
from normkit.aten import disable, enable, enabled, is_enabled  # noqa: E402,F401
from normkit.functional import (  # noqa: E402,F401
    add_layer_norm,
    add_rms_norm,
    batch_norm,
    group_norm,
    instance_norm,
    layer_norm,
    rms_norm,
)

__all__ = [
    "__version__", "reference", "ops", "functional", "nn", "distributed", "enable", "disable", "enabled", "is_enabled",
    "batch_norm", "layer_norm", "rms_norm", "group_norm", "instance_norm", "add_layer_norm", "add_rms_norm",
]
