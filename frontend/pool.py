"""Pooling layers on [N, C, H, W] or [C, H, W] input: MaxPool2d, AvgPool2d,
AdaptiveAvgPool2d (torch's arguments)."""

from __future__ import annotations

from . import functional as F
from .config import pair, positive
from .module import Module


class _Pool(Module):
    """The windows (checked at construction, as torch's arguments) and their repr."""

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1,
                 ceil_mode: bool = False):
        super().__init__()
        win = F.PoolWindows.of(type(self).__name__, kernel_size, stride, padding, dilation,
                               ceil_mode)
        self.kernel_size, self.stride, self.padding = win.kernel, win.stride, win.padding
        self.dilation, self.ceil_mode = win.dilation, win.ceil_mode

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"
                + (f", dilation={self.dilation}" if self.dilation != (1, 1) else "")
                + (", ceil_mode=True" if self.ceil_mode else ""))


class MaxPool2d(_Pool):
    """Max over windows (stride defaults to the kernel size); padding never wins. With
    `return_indices`, forward returns (values, flat indices into each input plane)."""

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1,
                 return_indices: bool = False, ceil_mode: bool = False):
        super().__init__(kernel_size, stride, padding, dilation, ceil_mode)
        self.return_indices = bool(return_indices)

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation,
                            self.ceil_mode, self.return_indices)


class AvgPool2d(_Pool):
    """Mean over windows; zero padding counts unless `count_include_pad=False`, and
    `divisor_override` replaces the count (torch's arguments)."""

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True, divisor_override: int | None = None):
        super().__init__(kernel_size, stride, padding, ceil_mode=ceil_mode)
        self.count_include_pad = bool(count_include_pad)
        self.divisor_override = (None if divisor_override is None else
                                 positive("AvgPool2d divisor_override", divisor_override))

    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad, self.divisor_override)


class AdaptiveAvgPool2d(Module):
    """Mean over PyTorch's adaptive windows, to a fixed output size."""

    def __init__(self, output_size):
        super().__init__()
        self.output_size = pair("AdaptiveAvgPool2d output_size", output_size)

    def forward(self, x):
        return F.adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"
