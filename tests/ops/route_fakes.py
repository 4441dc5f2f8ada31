"""Stand-ins shared by the fast-routes tests (test_bn_routes.py, test_ln_routes.py)."""

import torch


class CudaLike(torch.Tensor):
    """A CPU tensor that says it is on CUDA (the routes only note CUDA calls)."""

    @property
    def is_cuda(self):
        return True


def fake_signature(tensors):
    """What ``_plan.signature`` keys (dtype, sizes, strides, device kind per tensor), in Python."""
    return tuple(None if t is None else (t.dtype, tuple(t.shape), t.stride(), t.is_cuda) for t in tensors)
