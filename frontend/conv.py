"""Convolution layers: Conv1d, Conv2d, Conv3d, ConvTranspose2d, ConvTranspose3d (burn's
names, PyTorch's arguments).

Weights default to KaimingUniform(gain=1/sqrt(3)), i.e. U(±1/sqrt(fan_in)), bias included,
with fan_in = c_in/groups * kernel volume (the transposed ones: c_out/groups * volume, as
PyTorch).
"""

from __future__ import annotations

import math

from . import functional as F
from .config import groups_divide, positive
from .convolution import check_output_padding, conv_padding
from .init import KaimingUniform
from .module import Module
from .param import Param
from .windows import ntuple


def _default(init):
    return init if init is not None else KaimingUniform(gain=1 / math.sqrt(3))


def _padding(layer: str, padding, kernel, stride, dilation):
    """Validate padding now (int, one per dim, "valid", "same"; "same" may be uneven, as
    torch's); forward resolves it the same way."""
    try:
        return conv_padding(padding, kernel, stride, dilation)
    except ValueError as e:
        raise ValueError(f"{layer}: {e}") from None


def _weights(layer: Module, shape: tuple[int, ...], c_out: int, fan_in: int, fan_out: int,
             bias: bool, init) -> None:
    """The lazy `weight` of `shape` and `bias` [c_out] (None without), with the fans for the
    initializer."""
    fans, init = {"fan_in": fan_in, "fan_out": fan_out}, _default(init)
    layer.weight = Param(shape, init, **fans)
    layer.bias = Param((c_out,), init, **fans) if bias else None


def _repr(m: Module, *extra: str) -> str:
    return ", ".join([f"c_in={m.c_in}", f"c_out={m.c_out}", f"kernel_size={m.kernel_size}",
                      f"stride={m.stride}", f"padding={m.padding!r}", *extra,
                      f"dilation={m.dilation}", f"groups={m.groups}",
                      f"bias={m.bias is not None}"])


class _Conv(Module):
    """Conv2d and Conv3d: `dims` spatial dims, `conv` their nn.functional op."""

    dims = 2
    conv = staticmethod(F.conv2d)

    def __init__(self, c_in: int, c_out: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, init=None):
        super().__init__()
        name, n = type(self).__name__, self.dims
        self.c_in, self.c_out = positive(f"{name} c_in", c_in), positive(f"{name} c_out", c_out)
        self.kernel_size = ntuple(f"{name} kernel_size", kernel_size, n)
        self.stride = ntuple(f"{name} stride", stride, n)
        self.dilation = ntuple(f"{name} dilation", dilation, n)
        self.groups = groups_divide(name, groups, c_in, c_out)
        self.padding = padding if isinstance(padding, str) else ntuple(f"{name} padding",
                                                                       padding, n, 0)
        _padding(name, self.padding, self.kernel_size, self.stride, self.dilation)
        volume = math.prod(self.kernel_size)
        _weights(self, (c_out, c_in // groups, *self.kernel_size), c_out,
                 c_in // groups * volume, c_out // groups * volume, bias, init)

    def forward(self, x):
        return self.conv(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                         self.groups)

    def extra_repr(self) -> str:
        return _repr(self)


class Conv2d(_Conv):
    """Convolution of [N, C, H, W] or [C, H, W]; weight [c_out, c_in/groups, kh, kw], bias
    [c_out]."""


class Conv3d(_Conv):
    """Convolution of [N, C, D, H, W] or [C, D, H, W]; weight [c_out, c_in/groups, kd, kh,
    kw], bias [c_out]."""

    dims = 3
    conv = staticmethod(F.conv3d)


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
        _weights(self, (c_out, c_in // groups, kernel_size), c_out, c_in // groups * kernel_size,
                 c_out // groups * kernel_size, bias, init)

    def forward(self, x):
        return F.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups)

    def extra_repr(self) -> str:
        return _repr(self)


class _ConvTranspose(Module):
    """ConvTranspose2d and ConvTranspose3d: `dims` spatial dims, `conv` their op."""

    dims = 2
    conv = staticmethod(F.conv_transpose2d)

    def __init__(self, c_in: int, c_out: int, kernel_size, stride=1, padding=0,
                 output_padding=0, groups: int = 1, bias: bool = True, dilation=1, init=None):
        super().__init__()
        name, n = type(self).__name__, self.dims
        self.c_in = positive(f"{name} c_in", c_in)
        self.c_out = positive(f"{name} c_out", c_out)
        self.kernel_size = ntuple(f"{name} kernel_size", kernel_size, n)
        self.stride = ntuple(f"{name} stride", stride, n)
        self.padding = ntuple(f"{name} padding", padding, n, 0)
        self.dilation = ntuple(f"{name} dilation", dilation, n)
        self.output_padding = check_output_padding(
            name, ntuple(f"{name} output_padding", output_padding, n, 0), self.stride,
            self.dilation)
        self.groups = groups_divide(name, groups, c_in, c_out)
        volume = math.prod(self.kernel_size)
        _weights(self, (c_in, c_out // groups, *self.kernel_size), c_out,
                 c_out // groups * volume, c_in // groups * volume, bias, init)

    def forward(self, x):
        return self.conv(x, self.weight, self.bias, self.stride, self.padding,
                         self.output_padding, self.groups, self.dilation)

    def extra_repr(self) -> str:
        return _repr(self, f"output_padding={self.output_padding}")


class ConvTranspose2d(_ConvTranspose):
    """The transpose of Conv2d; weight [c_in, c_out/groups, kh, kw] (PyTorch's layout)."""


class ConvTranspose3d(_ConvTranspose):
    """The transpose of Conv3d; weight [c_in, c_out/groups, kd, kh, kw] (PyTorch's layout)."""

    dims = 3
    conv = staticmethod(F.conv_transpose3d)
