"""The `ember` dialect's windowed ops: convolutions and pools, and their gradients
(registered with the rest of the dialect by importing ir/dialects)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from ..opdef import SHAPE, InferenceError, OpDef, fmt_shape, register, same_dtype
from ..types import TensorType, Type
from .ember import _float


def _pair(op: str, attrs: dict[str, Any], key: str, lo: int) -> tuple[int, int]:
    """An attribute that must be a list of two integers >= lo ([sh, sw], [ph, pw], ...)."""
    v = attrs[key]
    if len(v) != 2 or min(v) < lo:
        raise InferenceError(f"{op}: '{key}' must be two integers >= {lo}, got {v}")
    return v[0], v[1]


def _rank4(op: str, what: str, t: TensorType) -> None:
    if t.rank != 4:
        layout = "NHWC" if op.endswith("_nhwc") else "NCHW"
        raise InferenceError(f"{op}: {what} must be {layout} (rank 4), got "
                             f"{fmt_shape(t.shape)}")


def window_out(size: int, k: int, stride: int, pad: int, dilation: int = 1) -> int:
    """Positions of a window (k taps, `dilation` apart) sliding over size + 2*pad elements."""
    return (size + 2 * pad - dilation * (k - 1) - 1) // stride + 1

class ConvBase(OpDef):
    traits = frozenset({"pure", "compute_bound"})
    arity: ClassVar[tuple[int, int | None]] = (2, 2)  # (kernel.conv2d: more)
    attrs = {"stride": list, "padding": list, "dilation": list, "groups": int}

    @classmethod
    def conv_out(cls, x: tuple[int, ...], w: tuple[int, ...], attrs: dict[str, Any]
                 ) -> tuple[int, ...]:
        """The output shape of conv2d(x, w), checking that the two fit these attributes."""
        op, g = cls.name, attrs["groups"]
        sh, sw = _pair(op, attrs, "stride", 1)
        ph, pw = _pair(op, attrs, "padding", 0)
        dh, dw = _pair(op, attrs, "dilation", 1)
        if g < 1 or x[1] % g or w[0] % g:
            raise InferenceError(f"{op}: groups={g} must divide input channels {x[1]} and "
                                 f"output channels {w[0]}")
        if w[1] * g != x[1]:
            raise InferenceError(f"{op}: input {fmt_shape(x)} has {x[1]} channels but weight "
                                 f"{fmt_shape(w)} expects {w[1] * g} (c_in/groups={w[1]}, "
                                 f"groups={g})")
        oh, ow = window_out(x[2], w[2], sh, ph, dh), window_out(x[3], w[3], sw, pw, dw)
        if oh < 1 or ow < 1:
            raise InferenceError(f"{op}: kernel {w[2]}x{w[3]} (dilation {dh}x{dw}) does not fit "
                                 f"input {fmt_shape(x)} padded by {ph}x{pw}")
        return (x[0], w[0], oh, ow)

    @classmethod
    def check_operands(cls, operand_types: list[TensorType], names: Sequence[str]) -> None:
        for t, n in zip(operand_types, names):
            _rank4(cls.name, n, t)
        same_dtype(cls.name, operand_types)
        _float(cls.name, operand_types[0])


class ForwardConv(ConvBase):
    """A conv of x by w, its result shape `output_shape` (kernel.py's conv kernels check
    their space by it too)."""

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        cls.check_operands(operand_types, ("input", "weight"))
        x, w = operand_types
        return [x.with_shape(cls.output_shape(x.shape, w.shape, attrs))]

    @classmethod
    def output_shape(cls, x: tuple[int, ...], w: tuple[int, ...], attrs: dict[str, Any]
                     ) -> tuple[int, ...]:
        return cls.conv_out(x, w, attrs)


@register
class Conv2d(ForwardConv):
    """`conv2d(x, w)`: NCHW x, weight [c_out, c_in/groups, kh, kw], zero padding, no bias."""

    name = "ember.conv2d"


def nchw_of_nhwc(shape: tuple[int, ...]) -> tuple[int, ...]:
    """An NHWC shape's NCHW twin."""
    return (shape[0], shape[3], shape[1], shape[2])


def oihw_of_hwio(shape: tuple[int, ...]) -> tuple[int, ...]:
    """An HWIO conv weight's shape as ember.conv2d's [c_out, c_in/groups, kh, kw]."""
    return (shape[3], shape[2], shape[0], shape[1])


@register
class Conv2dNhwc(ForwardConv):
    """`conv2d_nhwc(x, w)`: conv2d with the channels last: x [N, H, W, C], weight
    [kh, kw, c_in/groups, c_out] (HWIO), result [N, OH, OW, c_out]. The layout pass makes
    it (passes/layout.py) where a backend runs a conv faster that way."""

    name = "ember.conv2d_nhwc"

    @classmethod
    def output_shape(cls, x: tuple[int, ...], w: tuple[int, ...], attrs: dict[str, Any]
                     ) -> tuple[int, ...]:
        """The output shape [N, OH, OW, O], checking that x and w fit these attributes."""
        top, left, bottom, right = sides(cls.name, attrs["padding"])
        # (the conv of x padded by the extra bottom and right rows, its padding symmetric)
        grown = (x[0], x[3], x[1] + bottom - top, x[2] + right - left)
        n, o, oh, ow = cls.conv_out(grown, oihw_of_hwio(w), {**attrs, "padding": [top, left]})
        return (n, oh, ow, o)


def sides(op: str, padding: list[int]) -> tuple[int, int, int, int]:
    """A conv2d_nhwc's padding [top, left, bottom, right] (ONNX's order), or [ph, pw]
    for as much after as before."""
    if len(padding) not in (2, 4) or min(padding) < 0:
        raise InferenceError(f"{op}: 'padding' must be [ph, pw] or [top, left, bottom, "
                             f"right], integers >= 0, got {padding}")
    if len(padding) == 2:
        return padding[0], padding[1], padding[0], padding[1]
    return padding[0], padding[1], padding[2], padding[3]


@register
class Conv2dGradInput(ConvBase):
    """`conv2d_grad_input(g, w) {input_shape}`: the gradient of conv2d wrt its input (also
    ConvTranspose2d's forward)."""

    name = "ember.conv2d_grad_input"
    attrs = {**ConvBase.attrs, "input_shape": SHAPE}

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        cls.check_operands(operand_types, ("gradient", "weight"))
        g, w = operand_types
        x = tuple(attrs["input_shape"])
        if len(x) != 4 or cls.conv_out(x, w.shape, attrs) != g.shape:
            raise InferenceError(f"{cls.name}: gradient {fmt_shape(g.shape)} is not the output "
                                 f"shape of input_shape {fmt_shape(x)} with weight "
                                 f"{fmt_shape(w.shape)}")
        return [g.with_shape(x)]


@register
class Conv2dGradWeight(ConvBase):
    """`conv2d_grad_weight(x, g) {weight_shape}`: the gradient of conv2d wrt its weight."""

    name = "ember.conv2d_grad_weight"
    attrs = {**ConvBase.attrs, "weight_shape": SHAPE}

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        cls.check_operands(operand_types, ("input", "gradient"))
        x, g = operand_types
        w = tuple(attrs["weight_shape"])
        if len(w) != 4 or cls.conv_out(x.shape, w, attrs) != g.shape:
            raise InferenceError(f"{cls.name}: gradient {fmt_shape(g.shape)} is not the output "
                                 f"shape of input {fmt_shape(x.shape)} with weight_shape "
                                 f"{fmt_shape(w)}")
        return [x.with_shape(w)]


class PoolBase(OpDef):
    attrs = {"kernel": list, "stride": list, "padding": list}

    @classmethod
    def pool_out(cls, x: tuple[int, ...], attrs: dict[str, Any]) -> tuple[int, ...]:
        op = cls.name
        kh, kw = _pair(op, attrs, "kernel", 1)
        sh, sw = _pair(op, attrs, "stride", 1)
        ph, pw = _pair(op, attrs, "padding", 0)
        if 2 * ph > kh or 2 * pw > kw:
            raise InferenceError(f"{op}: padding {[ph, pw]} must be at most half the kernel "
                                 f"{[kh, kw]}")
        oh, ow = window_out(x[2], kh, sh, ph), window_out(x[3], kw, sw, pw)
        if oh < 1 or ow < 1:
            raise InferenceError(f"{op}: kernel {kh}x{kw} does not fit input {fmt_shape(x)} "
                                 f"padded by {ph}x{pw}")
        return (x[0], x[1], oh, ow)


@register
class MaxPool2d(PoolBase):
    """`max_pool2d(x) {kernel, stride, padding}` on NCHW; padding never wins a max."""

    name = "ember.max_pool2d"
    arity = (1, 1)

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        (x,) = operand_types
        _rank4(cls.name, "input", x)
        _float(cls.name, x)
        return [x.with_shape(cls.pool_out(x.shape, attrs))]


@register
class MaxPool2dGrad(PoolBase):
    """`max_pool2d_grad(x, g)`: g routed to the first max of each window (summed), x's shape."""

    name = "ember.max_pool2d_grad"
    arity = (2, 2)

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        x, g = operand_types
        _rank4(cls.name, "input", x)
        same_dtype(cls.name, operand_types)
        if cls.pool_out(x.shape, attrs) != g.shape:
            raise InferenceError(f"{cls.name}: gradient {fmt_shape(g.shape)} is not the pooled "
                                 f"shape of input {fmt_shape(x.shape)}")
        return [x]


@register
class AvgPool2d(MaxPool2d):
    """`avg_pool2d(x) {kernel, stride, padding}`: zero padding counted (count_include_pad)."""

    name = "ember.avg_pool2d"


@register
class AvgPool2dGrad(PoolBase):
    """`avg_pool2d_grad(g) {kernel, stride, padding, input_shape}`."""

    name = "ember.avg_pool2d_grad"
    arity = (1, 1)
    attrs = {**PoolBase.attrs, "input_shape": SHAPE}

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        (g,) = operand_types
        x = tuple(attrs["input_shape"])
        _float(cls.name, g)
        if len(x) != 4 or cls.pool_out(x, attrs) != g.shape:
            raise InferenceError(f"{cls.name}: gradient {fmt_shape(g.shape)} is not the pooled "
                                 f"shape of input_shape {fmt_shape(x)}")
        return [g.with_shape(x)]
