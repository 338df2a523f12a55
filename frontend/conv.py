"""Convolution layers: Conv1d, Conv2d, ConvTranspose2d (burn's names, PyTorch's arguments).

Weights default to KaimingUniform(gain=1/sqrt(3)), i.e. U(±1/sqrt(fan_in)), bias included,
with fan_in = c_in/groups * kernel area (ConvTranspose2d: c_out/groups * area, as PyTorch).
"""

from __future__ import annotations

import math

from . import functional as F
from .config import groups_divide, pair, positive
from .init import KaimingUniform
from .module import Module
from .param import Param


def _default(init):
    return init if init is not None else KaimingUniform(gain=1 / math.sqrt(3))


def _padding(layer: str, padding, kernel, stride, dilation):
    """Validate padding now (int, pair, "valid", "same"; "same" may be uneven, as torch's);
    forward resolves it the same way."""
    try:
        return F.conv_padding(padding, kernel, stride, dilation)
    except ValueError as e:
        raise ValueError(f"{layer}: {e}") from None


class Conv2d(Module):
    """Convolution of [N, C, H, W] or [C, H, W]; weight [c_out, c_in/groups, kh, kw], bias
    [c_out]."""

    def __init__(self, c_in: int, c_out: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, init=None):
        super().__init__()
        self.c_in, self.c_out = positive("Conv2d c_in", c_in), positive("Conv2d c_out", c_out)
        self.kernel_size = pair("Conv2d kernel_size", kernel_size)
        self.stride, self.dilation = pair("Conv2d stride", stride), pair("Conv2d dilation",
                                                                        dilation)
        self.groups = groups_divide("Conv2d", groups, c_in, c_out)
        self.padding = padding if isinstance(padding, str) else pair("Conv2d padding", padding, 0)
        _padding("Conv2d", self.padding, self.kernel_size, self.stride, self.dilation)
        area = math.prod(self.kernel_size)
        fans = {"fan_in": c_in // groups * area, "fan_out": c_out // groups * area}
        init = _default(init)
        self.weight = Param((c_out, c_in // groups, *self.kernel_size), init, **fans)
        self.bias = Param((c_out,), init, **fans) if bias else None

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups)

    def extra_repr(self) -> str:
        return (f"c_in={self.c_in}, c_out={self.c_out}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding!r}, dilation={self.dilation}, "
                f"groups={self.groups}, bias={self.bias is not None}")


class Conv1d(Module):
    """Convolution of [N, C, L] or [C, L] (conv2d with H = 1); weight [c_out, c_in/groups, k],
    bias [c_out]."""

    def __init__(self, c_in: int, c_out: int, kernel_size: int, stride: int = 1, padding=0,
                 dilation: int = 1, groups: int = 1, bias: bool = True, init=None):
        super().__init__()
        self.c_in, self.c_out = positive("Conv1d c_in", c_in), positive("Conv1d c_out", c_out)
        self.kernel_size = positive("Conv1d kernel_size", kernel_size)
        self.stride, self.dilation = positive("Conv1d stride", stride), positive(
            "Conv1d dilation", dilation)
        self.groups = groups_divide("Conv1d", groups, c_in, c_out)
        if not isinstance(padding, str) and (not isinstance(padding, int)
                                             or isinstance(padding, bool) or padding < 0):
            raise ValueError(f"Conv1d padding must be an integer >= 0, 'valid' or 'same', "
                             f"got {padding!r}")
        self.padding = padding
        _padding("Conv1d", padding if isinstance(padding, str) else (0, padding),
                 (1, kernel_size), (1, stride), (1, dilation))
        fans = {"fan_in": c_in // groups * kernel_size, "fan_out": c_out // groups * kernel_size}
        init = _default(init)
        self.weight = Param((c_out, c_in // groups, kernel_size), init, **fans)
        self.bias = Param((c_out,), init, **fans) if bias else None

    def forward(self, x):
        return F.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups)

    def extra_repr(self) -> str:
        return (f"c_in={self.c_in}, c_out={self.c_out}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding!r}, dilation={self.dilation}, "
                f"groups={self.groups}, bias={self.bias is not None}")


class ConvTranspose2d(Module):
    """The transpose of Conv2d; weight [c_in, c_out/groups, kh, kw] (PyTorch's layout)."""

    def __init__(self, c_in: int, c_out: int, kernel_size, stride=1, padding=0,
                 output_padding=0, groups: int = 1, bias: bool = True, dilation=1, init=None):
        super().__init__()
        self.c_in = positive("ConvTranspose2d c_in", c_in)
        self.c_out = positive("ConvTranspose2d c_out", c_out)
        self.kernel_size = pair("ConvTranspose2d kernel_size", kernel_size)
        self.stride = pair("ConvTranspose2d stride", stride)
        self.padding = pair("ConvTranspose2d padding", padding, 0)
        self.dilation = pair("ConvTranspose2d dilation", dilation)
        self.output_padding = F.check_output_padding(
            "ConvTranspose2d", pair("ConvTranspose2d output_padding", output_padding, 0),
            self.stride, self.dilation)
        self.groups = groups_divide("ConvTranspose2d", groups, c_in, c_out)
        area = math.prod(self.kernel_size)
        fans = {"fan_in": c_out // groups * area, "fan_out": c_in // groups * area}
        init = _default(init)
        self.weight = Param((c_in, c_out // groups, *self.kernel_size), init, **fans)
        self.bias = Param((c_out,), init, **fans) if bias else None

    def forward(self, x):
        return F.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding,
                                  self.output_padding, self.groups, self.dilation)

    def extra_repr(self) -> str:
        return (f"c_in={self.c_in}, c_out={self.c_out}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, "
                f"output_padding={self.output_padding}, dilation={self.dilation}, "
                f"groups={self.groups}, bias={self.bias is not None}")
