"""normkit: PyTorch's normalization operators, exact to the ATen contract and fast on NVIDIA GPUs."""

__version__ = "0.1.0"

from normkit import reference  # noqa: E402,F401
