"""The convolutions of `nn.functional` (torch's arguments), re-exported by
frontend/functional.py: conv2d and its transpose are the `nn.conv2d` and
`ember.conv2d_grad_input` ops; conv1d is conv2d with H = 1; the 3-d ones are compositions
of the 2-d ones, so autodiff, every backend and ONNX export need nothing of their own.
"""

from __future__ import annotations

import numpy as np

from . import context
from .config import positive
from .indexing import window
from .tensor import Tensor
from .windows import HOW_MANY, batched, crop, gathered, ntuple

Padding = tuple[tuple[int, int], ...]


def conv_padding(padding, kernel: tuple[int, ...], stride: tuple[int, ...],
                 dilation: tuple[int, ...]) -> Padding:
    """(before, after) padding of each spatial dim from an int, one per dim, "valid" or
    "same"; "same" with an uneven total puts the extra one after (right, bottom), as torch."""
    n = len(kernel)
    if padding == "valid":
        return ((0, 0),) * n
    if padding == "same":
        if any(s != 1 for s in stride):
            raise ValueError(f"padding='same' needs stride 1, got stride {tuple(stride)}")
        totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return tuple((total // 2, total - total // 2) for total in totals)
    if isinstance(padding, str):
        raise ValueError(f"padding must be an int, {HOW_MANY[n]}, 'valid' or 'same', got "
                         f"{padding!r}")
    return tuple((p, p) for p in ntuple("padding", padding, n, lo=0))


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1) -> Tensor:
    """Convolution of [N, C, H, W] or [C, H, W] x, weight [c_out, c_in/groups, kh, kw]
    (`nn.conv2d`, after zeros for an uneven padding="same")."""
    t = context.current()
    x, w = t.lift(x), t.lift(weight)
    if w.ndim != 4:
        raise t.error(f"conv2d: weight must be [c_out, c_in/groups, kh, kw], got {list(w.shape)}")
    stride, dilation = ntuple("stride", stride, 2), ntuple("dilation", dilation, 2)
    pads = conv_padding(padding, w.shape[2:], stride, dilation)
    operands = [w] + ([] if bias is None else [t.lift(bias)])

    def conv(x4: Tensor) -> Tensor:
        for axis, (before, after) in enumerate(pads):
            x4 = crop(x4, 2 + axis, 0, x4.shape[2 + axis] + after - before)
        return t.op("nn.conv2d", x4, *operands, stride=list(stride),
                    padding=[before for before, _ in pads], dilation=list(dilation),
                    groups=groups)

    return batched("conv2d", x, 4, conv)


def conv1d(x, weight, bias=None, stride: int = 1, padding=0, dilation: int = 1,
           groups: int = 1) -> Tensor:
    """Convolution of [N, C, L] or [C, L] x, weight [c_out, c_in/groups, k]: conv2d with
    H = 1."""
    t = context.current()
    x, w = t.lift(x), t.lift(weight)
    if x.ndim not in (2, 3) or w.ndim != 3:
        raise t.error(f"conv1d: input {list(x.shape)} and weight {list(w.shape)} must be "
                      "[N, C, L] or [C, L], and [c_out, c_in/groups, k]")
    pad = padding if isinstance(padding, str) else (0, ntuple("padding", padding, 1, lo=0)[0])
    y = conv2d(x.reshape(*x.shape[:-1], 1, x.shape[-1]),
               w.reshape(w.shape[0], w.shape[1], 1, w.shape[2]), bias,
               (1, ntuple("stride", stride, 1)[0]), pad, (1, ntuple("dilation", dilation, 1)[0]),
               groups)
    return y.reshape(*y.shape[:-2], y.shape[-1])


def _fits(what: str, x: Tensor, w: Tensor, sizes: list[int], groups: int, c_in: int,
          grouped: int) -> None:
    """The checks nn.conv2d makes, made before the 3-d ones fold their input: groups that
    divide the weight's `grouped` channels, `c_in` input channels, output sizes >= 1."""
    positive(f"{what} groups", groups)
    if grouped % groups:
        raise x.trace.error(f"{what}: groups={groups} must divide the {grouped} channels of "
                            f"weight {list(w.shape)}")
    if x.shape[1] != c_in:
        raise x.trace.error(f"{what}: weight {list(w.shape)} with groups={groups} expects "
                            f"input {list(x.shape)} to have {c_in} channels")
    if min(sizes) < 1:
        raise x.trace.error(f"{what}: kernel {list(w.shape[2:])} does not fit input "
                            f"{list(x.shape)} with these padding and dilation (output sizes "
                            f"{sizes})")


def conv3d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1) -> Tensor:
    """Convolution of [N, C, D, H, W] or [C, D, H, W] x, weight [c_out, c_in/groups, kd, kh,
    kw]: one conv2d of the output depths folded into the batch, each depth's kd input
    planes stacked on the channels (one gather along D: the zero padding of D too)."""
    t = context.current()
    x, w = t.lift(x), t.lift(weight)
    if w.ndim != 5:
        raise t.error(f"conv3d: weight must be [c_out, c_in/groups, kd, kh, kw], got "
                      f"{list(w.shape)}")
    stride, dilation = ntuple("stride", stride, 3), ntuple("dilation", dilation, 3)
    pads = conv_padding(padding, w.shape[2:], stride, dilation)
    plane = padding if isinstance(padding, str) else [b for b, _ in pads[1:]]

    def conv(x5: Tensor) -> Tensor:
        (n, c, d, h, wd), (co, cg, kd, kh, kw) = x5.shape, w.shape
        sizes = [(size + b + a - dl * (k - 1) - 1) // s + 1 for size, k, s, (b, a), dl in
                 zip(x5.shape[2:], w.shape[2:], stride, pads, dilation)]
        _fits("conv3d", x5, w, sizes, groups, cg * groups, co)
        od = sizes[0]
        pos = np.arange(od)[:, None] * stride[0] - pads[0][0] + np.arange(kd) * dilation[0]
        valid = (pos >= 0) & (pos < d)
        if kd == 1 and valid.all():  # one tap: a strided slice
            taps = window(x5, [0, 0, int(pos[0, 0]), 0, 0], [1, 1, stride[0], 1, 1],
                          [n, c, od, h, wd]).reshape(n, groups, cg, od, 1, h, wd)
            taps = taps.transpose(0, 3, 1, 4, 2, 5, 6)
        else:  # [OD, kd, N, C, H, W]
            taps = gathered(x5, 2, pos, valid, 0.0).reshape(od, kd, n, groups, cg, h, wd)
            taps = taps.transpose(2, 0, 3, 1, 4, 5, 6)  # [N, OD, groups, kd, C/groups, H, W]
        w2 = w.transpose(0, 2, 1, 3, 4).reshape(co, kd * cg, kh, kw)
        y = conv2d(taps.reshape(n * od, c * kd, h, wd), w2, bias, stride[1:], plane,
                   dilation[1:], groups)
        return y.reshape(n, od, *y.shape[1:]).transpose(0, 2, 1, 3, 4)

    return batched("conv3d", x, 5, conv)


def conv_transpose2d(x, weight, bias=None, stride=1, padding=0, output_padding=0,
                     groups: int = 1, dilation=1) -> Tensor:
    """The transpose of conv2d on [N, C, H, W] or [C, H, W] x (PyTorch's weight layout
    [c_in, c_out/groups, kh, kw]); `output_padding` adds rows and columns after, each
    smaller than the stride or the dilation (torch's rule)."""
    t = context.current()
    x, w = t.lift(x), t.lift(weight)
    stride, pad, out_pad, dilation = _transpose_args("conv_transpose2d", w, 2, stride, padding,
                                                     output_padding, dilation)

    def transposed(x4: Tensor) -> Tensor:
        full = _unpadded(x4, w, stride, dilation)
        out = [f - 2 * p + o for f, p, o in zip(full, pad, out_pad)]
        if all(o < s for o, s in zip(out_pad, stride)):  # the op's own padding crops
            y = _conv_transpose(x4, w, stride, pad, dilation, groups, out)
        else:  # output_padding past the stride: crop the unpadded output, zeros past it
            y = _conv_transpose(x4, w, stride, (0, 0), dilation, groups, full)
            for axis in (0, 1):
                y = crop(y, 2 + axis, pad[axis], out[axis])
        return y if bias is None else y + t.lift(bias).reshape(1, -1, 1, 1)

    return batched("conv_transpose2d", x, 4, transposed)


def _transpose_args(what: str, w: Tensor, n: int, stride, padding, output_padding,
                    dilation) -> tuple[tuple[int, ...], ...]:
    """conv_transpose{n}d's stride, padding, output_padding (torch's rule) and dilation as
    n-tuples, its weight [c_in, c_out/groups, *kernel] checked."""
    stride, dilation = ntuple("stride", stride, n), ntuple("dilation", dilation, n)
    pad = ntuple("padding", padding, n, lo=0)
    out_pad = ntuple("output_padding", output_padding, n, 0)
    check_output_padding(what, out_pad, stride, dilation)
    if w.ndim != n + 2:
        taps = ", ".join(("kd", "kh", "kw")[3 - n:])
        raise w.trace.error(f"{what}: weight must be [c_in, c_out/groups, {taps}], got "
                            f"{list(w.shape)}")
    return stride, pad, out_pad, dilation


def _unpadded(x: Tensor, w: Tensor, stride, dilation) -> list[int]:
    """A transposed convolution's spatial sizes before its padding crops them."""
    return [(size - 1) * s + d * (k - 1) + 1 for size, s, d, k in
            zip(x.shape[2:], stride, dilation, w.shape[2:])]


def _conv_transpose(x: Tensor, w: Tensor, stride, padding, dilation, groups: int,
                    size: list[int]) -> Tensor:
    """conv2d's input gradient as a transposed convolution to [H, W] `size`."""
    return x.trace.op("ember.conv2d_grad_input", x, w, stride=list(stride),
                      padding=list(padding), dilation=list(dilation), groups=groups,
                      input_shape=[x.shape[0], w.shape[1] * groups, *size])


def conv_transpose3d(x, weight, bias=None, stride=1, padding=0, output_padding=0,
                     groups: int = 1, dilation=1) -> Tensor:
    """The transpose of conv3d on [N, C, D, H, W] or [C, D, H, W] x, weight [c_in,
    c_out/groups, kd, kh, kw]: one conv_transpose2d of the input depths folded into the
    batch, its kd depth taps as channels; each tap's planes are then placed at their output
    depths (a strided unslice) and the taps summed, D cropped by the padding last."""
    t = context.current()
    x, w = t.lift(x), t.lift(weight)
    stride, pad, out_pad, dilation = _transpose_args("conv_transpose3d", w, 3, stride, padding,
                                                     output_padding, dilation)

    def transposed(x5: Tensor) -> Tensor:
        (n, c, d, h, wd), (ci, cog, kd, kh, kw) = x5.shape, w.shape
        full = _unpadded(x5, w, stride, dilation)
        _fits("conv_transpose3d", x5, w, [f - 2 * p + o for f, p, o in
                                          zip(full, pad, out_pad)], groups, ci, ci)
        w2 = w.transpose(0, 2, 1, 3, 4).reshape(ci, kd * cog, kh, kw)
        y = conv_transpose2d(x5.transpose(0, 2, 1, 3, 4).reshape(n * d, c, h, wd), w2, None,
                             stride[1:], pad[1:], out_pad[1:], groups, dilation[1:])
        ho, wo, co = y.shape[2], y.shape[3], cog * groups
        y = y.reshape(n, d, groups, kd, cog, ho, wo).transpose(3, 0, 2, 4, 1, 5, 6)
        y = y.reshape(kd, n, co, d, ho, wo)
        total = None
        for i in range(kd):
            tap = window(y, [i, 0, 0, 0, 0, 0], [1] * 6, [1, n, co, d, ho, wo])
            placed = t.op("ember.unslice", tap.reshape(n, co, d, ho, wo),
                          start=[0, 0, i * dilation[0], 0, 0], step=[1, 1, stride[0], 1, 1],
                          shape=[n, co, full[0], ho, wo])
            total = placed if total is None else total + placed
        y = crop(total, 2, pad[0], full[0] - 2 * pad[0] + out_pad[0])
        return y if bias is None else y + t.lift(bias).reshape(1, -1, 1, 1, 1)

    return batched("conv_transpose3d", x, 5, transposed)


def check_output_padding(what: str, output_padding: tuple[int, ...],
                         stride: tuple[int, ...], dilation: tuple[int, ...]
                         ) -> tuple[int, ...]:
    """torch's rule: each output_padding smaller than its stride or its dilation."""
    if any(o >= max(s, d) for o, s, d in zip(output_padding, stride, dilation)):
        raise ValueError(f"{what} output_padding {output_padding} must be smaller than "
                         f"stride {stride} or dilation {dilation}")
    return output_padding
