"""Pooling layers on [N, C, ...] or unbatched [C, ...] input, torch's arguments:
MaxPool1d/2d/3d, AvgPool1d/2d/3d, AdaptiveAvgPool1d/2d/3d, AdaptiveMaxPool1d/2d/3d."""

from __future__ import annotations

from . import functional as F
from .config import positive
from .module import Module
from .pooling import PoolWindows, output_sizes


class _Pool(Module):
    """The windows over `dims` spatial dims (checked at construction, as torch's
    arguments) and their repr."""

    dims = 2

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1,
                 ceil_mode: bool = False):
        super().__init__()
        win = PoolWindows.of(type(self).__name__, kernel_size, stride, padding, dilation,
                             ceil_mode, self.dims)
        self.kernel_size, self.stride, self.padding = win.kernel, win.stride, win.padding
        self.dilation, self.ceil_mode = win.dilation, win.ceil_mode

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"
                + (f", dilation={self.dilation}" if set(self.dilation) != {1} else "")
                + (", ceil_mode=True" if self.ceil_mode else ""))


class _MaxPool(_Pool):
    """Max over windows (stride defaults to the kernel size); padding never wins. With
    `return_indices`, forward returns (values, flat indices into each input plane or
    volume)."""

    pool = staticmethod(F.max_pool2d)

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1,
                 return_indices: bool = False, ceil_mode: bool = False):
        super().__init__(kernel_size, stride, padding, dilation, ceil_mode)
        self.return_indices = bool(return_indices)

    def forward(self, x):
        return self.pool(x, self.kernel_size, self.stride, self.padding, self.dilation,
                         self.ceil_mode, self.return_indices)


class MaxPool1d(_MaxPool):
    """Max pooling of [N, C, L] or [C, L]."""

    dims, pool = 1, staticmethod(F.max_pool1d)


class MaxPool2d(_MaxPool):
    """Max pooling of [N, C, H, W] or [C, H, W]."""


class MaxPool3d(_MaxPool):
    """Max pooling of [N, C, D, H, W] or [C, D, H, W]."""

    dims, pool = 3, staticmethod(F.max_pool3d)


class _AvgPool(_Pool):
    """Mean over windows; zero padding counts unless `count_include_pad=False`, and
    `divisor_override` replaces the count (torch's arguments; AvgPool1d has none)."""

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True, divisor_override: int | None = None):
        super().__init__(kernel_size, stride, padding, ceil_mode=ceil_mode)
        self.count_include_pad = bool(count_include_pad)
        self.divisor_override = (None if divisor_override is None else positive(
            f"{type(self).__name__} divisor_override", divisor_override))

    pool = staticmethod(F.avg_pool2d)

    def forward(self, x):
        return self.pool(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                         self.count_include_pad, self.divisor_override)


class AvgPool1d(_AvgPool):
    """Average pooling of [N, C, L] or [C, L] (no divisor_override, as torch's)."""

    dims = 1

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True):
        super().__init__(kernel_size, stride, padding, ceil_mode, count_include_pad)

    def forward(self, x):
        return F.avg_pool1d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad)


class AvgPool2d(_AvgPool):
    """Average pooling of [N, C, H, W] or [C, H, W]."""


class AvgPool3d(_AvgPool):
    """Average pooling of [N, C, D, H, W] or [C, D, H, W]."""

    dims, pool = 3, staticmethod(F.avg_pool3d)


class _Adaptive(Module):
    """A pool over PyTorch's adaptive windows, to a fixed output size (None keeps a dim's)."""

    dims = 2

    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_sizes(f"{type(self).__name__} output_size", output_size,
                                        self.dims)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class _AdaptiveAvg(_Adaptive):
    pool = staticmethod(F.adaptive_avg_pool2d)

    def forward(self, x):
        return self.pool(x, self.output_size)


class AdaptiveAvgPool1d(_AdaptiveAvg):
    """Adaptive average pooling of [N, C, L] or [C, L]."""

    dims, pool = 1, staticmethod(F.adaptive_avg_pool1d)


class AdaptiveAvgPool2d(_AdaptiveAvg):
    """Adaptive average pooling of [N, C, H, W] or [C, H, W]."""


class AdaptiveAvgPool3d(_AdaptiveAvg):
    """Adaptive average pooling of [N, C, D, H, W] or [C, D, H, W]."""

    dims, pool = 3, staticmethod(F.adaptive_avg_pool3d)


class _AdaptiveMax(_Adaptive):
    """With `return_indices`, forward returns (values, flat indices into each input plane
    or volume)."""

    pool = staticmethod(F.adaptive_max_pool2d)

    def __init__(self, output_size, return_indices: bool = False):
        super().__init__(output_size)
        self.return_indices = bool(return_indices)

    def forward(self, x):
        return self.pool(x, self.output_size, self.return_indices)


class AdaptiveMaxPool1d(_AdaptiveMax):
    """Adaptive max pooling of [N, C, L] or [C, L]."""

    dims, pool = 1, staticmethod(F.adaptive_max_pool1d)


class AdaptiveMaxPool2d(_AdaptiveMax):
    """Adaptive max pooling of [N, C, H, W] or [C, H, W]."""


class AdaptiveMaxPool3d(_AdaptiveMax):
    """Adaptive max pooling of [N, C, D, H, W] or [C, D, H, W]."""

    dims, pool = 3, staticmethod(F.adaptive_max_pool3d)
