"""Pooling layers on NCHW input: MaxPool2d, AvgPool2d, AdaptiveAvgPool2d."""

from __future__ import annotations

from . import functional as F
from .config import pair
from .module import Module


class _Pool(Module):
    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        name = type(self).__name__
        self.kernel_size = pair(f"{name} kernel_size", kernel_size)
        self.stride = self.kernel_size if stride is None else pair(f"{name} stride", stride)
        self.padding = pair(f"{name} padding", padding, 0)
        if any(2 * p > k for p, k in zip(self.padding, self.kernel_size)):
            raise ValueError(f"{name} padding {self.padding} must be at most half the kernel "
                             f"{self.kernel_size}")

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class MaxPool2d(_Pool):
    """Max over windows (stride defaults to the kernel size); padding never wins."""

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding)


class AvgPool2d(_Pool):
    """Mean over windows; zero padding counts (PyTorch's default count_include_pad)."""

    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding)


class AdaptiveAvgPool2d(Module):
    """Mean over PyTorch's adaptive windows, to a fixed output size."""

    def __init__(self, output_size):
        super().__init__()
        self.output_size = pair("AdaptiveAvgPool2d output_size", output_size)

    def forward(self, x):
        return F.adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"
