"""CPU stand-ins shared by the plan tests (test_plan.py, test_native_replay.py): tensors that say they are on
CUDA, so that ``_plan.planned`` records and replays them without a GPU."""

import torch


class CudaLike(torch.Tensor):
    @property
    def is_cuda(self):
        return True


def fake_cuda(n=8, offset=0, dtype=torch.float32):
    """A fresh random CudaLike vector of ``n`` elements, ``offset`` elements into its storage."""
    return torch.randn(n + offset, dtype=dtype)[offset:].as_subclass(CudaLike)
