import os

import torch

# Without a GPU, normkit's Triton kernels run on CPU tensors through Triton's interpreter. Triton reads
# TRITON_INTERPRET when a kernel is decorated, so it is set here, before any test imports normkit's
# kernels: every test then sees the same mode, whatever order pytest collects the files in.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
