"""`em.nn.functional`: stateless ops on tensors (Params and arrays accepted).

Layers call these; users may too, inside `forward` or a traced loss function. Each is
one `nn.*` or `ember.*` op where one exists, else a short composition of core ops.
Configuration errors (a bad kernel size, an unknown padding) raise ValueError naming the
value; shape errors raise `em.ShapeError` naming the module path and the shapes.

This module holds convolutions, pools, dropout, embedding and attention; the elementwise
and row-wise ops live in ops.py, the norms in normalization.py and the losses in
losses.py, re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import ir
from . import context
from .config import number, positive
from .config import pair as _pair
from .indexing import window
from .losses import (  # nn.functional's losses
    binary_cross_entropy_with_logits,
    cross_entropy,
    mse_loss,
    nll_loss,
)
from .normalization import (  # and the norms
    batch_norm,
    group_norm,
    layer_norm,
    rms_norm,
    rsqrt,
)
from .ops import (  # and elementwise ops
    _t,
    add,
    broadcast_to,
    clamp,
    div,
    erf,
    gelu,
    hardsigmoid,
    hardswish,
    leaky_relu,
    linear,
    log_softmax,
    maximum,
    minimum,
    relu,
    sigmoid,
    sign,
    silu,
    softmax,
    softplus,
    sub,
    tanh,
    where,
)
from .resize import interpolate  # nn.functional.interpolate
from .tensor import Tensor, axes_list

# -- convolutions and pools -------------------------------------------------------------------

def _batched(what: str, x: Tensor, rank: int, fn: Callable) -> Tensor | tuple:
    """fn on x [N, C, ...] of `rank` dims, or on x without its batch dim ([C, ...], as torch
    accepts): then on a batch of one, removed again from each result."""
    if x.ndim == rank:
        return fn(x)
    if x.ndim != rank - 1:
        raise x.trace.error(f"{what}: input must have {rank} dims (batched) or {rank - 1} "
                            f"(unbatched), got {list(x.shape)}")
    out = fn(x.reshape(1, *x.shape))
    return tuple(o.reshape(o.shape[1:]) for o in out) if isinstance(out, tuple) else (
        out.reshape(out.shape[1:]))


def _const(x: Tensor, a: np.ndarray) -> Tensor:
    """The array `a` as a constant of x's dtype."""
    return x.trace.constant(np.asarray(a, ir.numpy_dtype(x.dtype)))


def _take(x: Tensor, axis: int, index: np.ndarray, valid: np.ndarray, fill) -> Tensor:
    """x gathered along `axis` at the integer array `index`, whose dims replace that axis,
    and `fill` where `valid` is False: the windows and asymmetric padding that the core
    pool and conv ops cannot express, as one gather (its gradient a scatter_add)."""
    t, rest = x.trace, [a for a in range(x.ndim) if a != axis]
    at = t.lift(np.clip(index, 0, x.shape[axis] - 1).astype(np.int64))
    g = t.op("ember.gather", x.transpose([axis, *rest]), at, axis=0)
    if not valid.all():
        mask = t.lift(valid.reshape(valid.shape + (1,) * len(rest)))
        g = t.op("ember.select", mask, g, t.lift(fill, x.dtype))
    k = index.ndim
    return g.transpose([*range(k, k + axis), *range(k), *range(k + axis, g.ndim)])


Padding = tuple[tuple[int, int], tuple[int, int]]


def conv_padding(padding, kernel: tuple[int, int], stride: tuple[int, int],
                 dilation: tuple[int, int]) -> Padding:
    """(before, after) padding of H and W from an int, a pair, "valid" or "same"; "same"
    with an uneven total puts the extra one after (right, bottom), as torch."""
    if padding == "valid":
        return ((0, 0), (0, 0))
    if padding == "same":
        if stride != (1, 1):
            raise ValueError(f"padding='same' needs stride 1, got stride {stride}")
        totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return tuple((total // 2, total - total // 2) for total in totals)
    if isinstance(padding, str):
        raise ValueError(f"padding must be an int, a pair, 'valid' or 'same', got {padding!r}")
    ph, pw = _pair("padding", padding, lo=0)
    return ((ph, ph), (pw, pw))


def _crop(x: Tensor, axis: int, start: int, length: int) -> Tensor:
    """x[start : start + length] along `axis`, zeros past x's end (a slice or a padding)."""
    amounts = [(0, 0)] * x.ndim
    amounts[axis] = (-start, start + length - x.shape[axis])
    return _pad(x, amounts, "constant", 0.0)


PAD_MODES = {"constant": None, "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


def pad(x, pad, mode: str = "constant", value: float = 0.0) -> Tensor:
    """torch's F.pad: `pad` gives (before, after) amounts from the last dim backwards
    ((left, right, top, bottom, ...)); a negative amount crops. "constant" fills with
    `value` (one `ember.unslice`, its gradient a slice); "reflect", "replicate" and
    "circular" repeat x's own elements (a gather per padded dim)."""
    x = _t(x)
    if mode not in PAD_MODES:
        raise ValueError(f"pad: mode must be one of {', '.join(PAD_MODES)}, got {mode!r}")
    if len(pad) % 2 or len(pad) // 2 > x.ndim:
        raise x.trace.error(f"pad: {list(pad)} needs an even count of amounts, two per dim "
                            f"from the last, for at most the {x.ndim} dims of {list(x.shape)}")
    amounts = [(0, 0)] * x.ndim
    for k in range(len(pad) // 2):
        amounts[x.ndim - 1 - k] = (int(pad[2 * k]), int(pad[2 * k + 1]))
    return _pad(x, amounts, mode, value)


def _pad(x: Tensor, amounts: list[tuple[int, int]], mode: str, value) -> Tensor:
    """x padded by (before, after) per dim: crops (negative amounts) as one slice, then the
    growth by `mode`."""
    keep = [n - max(-b, 0) - max(-a, 0) for n, (b, a) in zip(x.shape, amounts)]
    if min(keep, default=0) < 0:
        raise x.trace.error(f"pad: {amounts} crops more than all of {list(x.shape)}")
    x = window(x, [max(-b, 0) for b, _ in amounts], [1] * x.ndim, keep)
    grow = [(max(b, 0), max(a, 0)) for b, a in amounts]
    if not any(b or a for b, a in grow):
        return x
    if mode != "constant":
        for axis, (b, a) in enumerate(grow):
            if b or a:
                index = np.pad(np.arange(x.shape[axis]), (b, a), mode=PAD_MODES[mode])
                x = _take(x, axis, index, np.ones(index.shape, bool), 0)
        return x
    shape = [n + b + a for n, (b, a) in zip(x.shape, grow)]
    start = [b for b, _ in grow]
    y = x.trace.op("ember.unslice", x, start=start, step=[1] * x.ndim, shape=shape)
    if value == 0:
        return y
    outside = np.full(shape, value)
    outside[tuple(slice(b, b + n) for b, n in zip(start, x.shape))] = 0
    return y + _const(x, outside)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1) -> Tensor:
    """Convolution of [N, C, H, W] or [C, H, W] x, weight [c_out, c_in/groups, kh, kw]
    (`nn.conv2d`, after zeros for an uneven padding="same")."""
    t = context.current()
    x, w = t.lift(x), t.lift(weight)
    if w.ndim != 4:
        raise t.error(f"conv2d: weight must be [c_out, c_in/groups, kh, kw], got {list(w.shape)}")
    stride, dilation = _pair("stride", stride), _pair("dilation", dilation)
    pads = conv_padding(padding, w.shape[2:], stride, dilation)
    operands = [w] + ([] if bias is None else [t.lift(bias)])

    def conv(x4: Tensor) -> Tensor:
        for axis, (before, after) in enumerate(pads):
            x4 = _crop(x4, 2 + axis, 0, x4.shape[2 + axis] + after - before)
        return t.op("nn.conv2d", x4, *operands, stride=list(stride),
                    padding=[before for before, _ in pads], dilation=list(dilation),
                    groups=groups)

    return _batched("conv2d", x, 4, conv)


def conv1d(x, weight, bias=None, stride: int = 1, padding=0, dilation: int = 1,
           groups: int = 1) -> Tensor:
    """Convolution of [N, C, L] or [C, L] x, weight [c_out, c_in/groups, k]: conv2d with
    H = 1."""
    t = context.current()
    x, w = t.lift(x), t.lift(weight)
    if x.ndim not in (2, 3) or w.ndim != 3:
        raise t.error(f"conv1d: input {list(x.shape)} and weight {list(w.shape)} must be "
                      "[N, C, L] or [C, L], and [c_out, c_in/groups, k]")
    pad = padding if isinstance(padding, str) else (0, _pair("padding", padding, lo=0)[0])
    y = conv2d(x.reshape(*x.shape[:-1], 1, x.shape[-1]),
               w.reshape(w.shape[0], w.shape[1], 1, w.shape[2]), bias,
               (1, _pair("stride", stride)[0]), pad, (1, _pair("dilation", dilation)[0]), groups)
    return y.reshape(*y.shape[:-2], y.shape[-1])


def conv_transpose2d(x, weight, bias=None, stride=1, padding=0, output_padding=0,
                     groups: int = 1, dilation=1) -> Tensor:
    """The transpose of conv2d on [N, C, H, W] or [C, H, W] x (PyTorch's weight layout
    [c_in, c_out/groups, kh, kw]); `output_padding` adds rows and columns after, each
    smaller than the stride or the dilation (torch's rule)."""
    t = context.current()
    x, w = t.lift(x), t.lift(weight)
    stride, dilation = _pair("stride", stride), _pair("dilation", dilation)
    pad, out_pad = _pair("padding", padding, lo=0), _pair("output_padding", output_padding, 0)
    check_output_padding("conv_transpose2d", out_pad, stride, dilation)
    if w.ndim != 4:
        raise t.error(f"conv_transpose2d: weight must be [c_in, c_out/groups, kh, kw], got "
                      f"{list(w.shape)}")

    def transposed(x4: Tensor) -> Tensor:
        full = [(size - 1) * s + d * (k - 1) + 1 for size, s, d, k in
                zip(x4.shape[2:], stride, dilation, w.shape[2:])]
        out = [f - 2 * p + o for f, p, o in zip(full, pad, out_pad)]
        if all(o < s for o, s in zip(out_pad, stride)):  # the op's own padding crops
            y = _conv_transpose(x4, w, stride, pad, dilation, groups, out)
        else:  # output_padding past the stride: crop the unpadded output, zeros past it
            y = _conv_transpose(x4, w, stride, (0, 0), dilation, groups, full)
            for axis in (0, 1):
                y = _crop(y, 2 + axis, pad[axis], out[axis])
        return y if bias is None else y + t.lift(bias).reshape(1, -1, 1, 1)

    return _batched("conv_transpose2d", x, 4, transposed)


def _conv_transpose(x: Tensor, w: Tensor, stride, padding, dilation, groups: int,
                    size: list[int]) -> Tensor:
    """conv2d's input gradient as a transposed convolution to [H, W] `size`."""
    return x.trace.op("ember.conv2d_grad_input", x, w, stride=list(stride),
                      padding=list(padding), dilation=list(dilation), groups=groups,
                      input_shape=[x.shape[0], w.shape[1] * groups, *size])


def check_output_padding(what: str, output_padding: tuple[int, int], stride: tuple[int, int],
                         dilation: tuple[int, int]) -> tuple[int, int]:
    """torch's rule: each output_padding smaller than its stride or its dilation."""
    if any(o >= max(s, d) for o, s, d in zip(output_padding, stride, dilation)):
        raise ValueError(f"{what} output_padding {output_padding} must be smaller than "
                         f"stride {stride} or dilation {dilation}")
    return output_padding


@dataclass(frozen=True)
class PoolWindows:
    """The windows of a 2-D pool as torch defines them; `of` checks the arguments."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int] = (1, 1)
    ceil_mode: bool = False

    @classmethod
    def of(cls, what: str, kernel_size, stride=None, padding=0, dilation=1,
           ceil_mode: bool = False) -> PoolWindows:
        kernel = _pair(f"{what} kernel_size", kernel_size)
        stride = kernel if stride is None else _pair(f"{what} stride", stride)
        pad, dil = _pair(f"{what} padding", padding, lo=0), _pair(f"{what} dilation", dilation)
        if any(2 * p > d * (k - 1) + 1 for p, k, d in zip(pad, kernel, dil)):
            raise ValueError(f"{what} padding {pad} must be at most half the kernel {kernel}"
                             + (f" (dilation {dil})" if dil != (1, 1) else ""))
        return cls(kernel, stride, pad, dil, bool(ceil_mode))

    def out(self, what: str, x: Tensor) -> tuple[int, int]:
        """torch's pooled sizes: with ceil_mode one more window where it would start inside
        the input or its left padding."""
        sizes = []
        for size, k, s, p, d in zip(x.shape[2:], self.kernel, self.stride, self.padding,
                                    self.dilation):
            span = size + 2 * p - d * (k - 1) - 1
            n = (span + (s - 1 if self.ceil_mode else 0)) // s + 1
            if self.ceil_mode and (n - 1) * s >= size + p:
                n -= 1
            if span < 0 or n < 1:
                raise x.trace.error(f"{what}: kernel {self.kernel} (dilation {self.dilation}) "
                                    f"does not fit input {list(x.shape)} padded by "
                                    f"{self.padding}")
            sizes.append(n)
        return sizes[0], sizes[1]

    def taps(self, axis: int, size: int, out: int) -> tuple[np.ndarray, np.ndarray]:
        """Input positions [out, k] of the windows' taps along `axis` (0: H, 1: W), and
        whether each lies inside the input."""
        k, s, p, d = self.kernel[axis], self.stride[axis], self.padding[axis], self.dilation[axis]
        pos = np.arange(out)[:, None] * s - p + np.arange(k) * d
        return pos, (pos >= 0) & (pos < size)

    def core(self, what: str, x: Tensor) -> bool:
        """Whether the core pool op (floor sizes, no dilation) computes these windows."""
        if self.dilation != (1, 1):
            return False
        floor = PoolWindows(self.kernel, self.stride, self.padding)
        return not self.ceil_mode or self.out(what, x) == floor.out(what, x)

    def attrs(self) -> dict:
        return {"kernel": list(self.kernel), "stride": list(self.stride),
                "padding": list(self.padding)}


def _window_max(x: Tensor, axis: int, taps, index: Tensor | None):
    """The max over windows along `axis` and, given `index` (each element's flat index into
    its input plane), the index of each window's first max: the smallest index among its
    maxima, torch's row-major first."""
    g = _take(x, axis, *taps, -math.inf)
    m = g.amax(axis + 1, keepdim=True)
    if index is None:
        return m.reshape(m.shape[:axis + 1] + m.shape[axis + 2:]), None
    hit = g == m
    negated = where(hit, -_take(index, axis, *taps, 0), -(2 ** 62))
    return m.reshape(m.shape[:axis + 1] + m.shape[axis + 2:]), -negated.amax(axis + 1)


def _max_pool(x: Tensor, win: PoolWindows, return_indices: bool):
    """Max pooling: the core op where it fits, else two separable window maxima (over W,
    then H) of gathers; these split the gradient among tied maxima, the core op gives it
    to the first."""
    if win.core("max_pool2d", x) and not return_indices:
        return x.trace.op("ember.max_pool2d", x, **win.attrs())
    (oh, ow), (h, w) = win.out("max_pool2d", x), x.shape[2:]
    index = x.trace.lift(np.arange(h * w, dtype=np.int64).reshape(1, 1, h, w))
    y, index = _window_max(x, 3, win.taps(1, w, ow), index if return_indices else None)
    y, index = _window_max(y, 2, win.taps(0, h, oh), index)
    return (y, index) if return_indices else y


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
               return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Max over windows of [N, C, H, W] or [C, H, W] x, torch's arguments (stride defaults
    to the kernel; padding never wins); `return_indices` adds each max's flat index into
    its input plane (i64), as torch's."""
    x, win = _t(x), PoolWindows.of("max_pool2d", kernel_size, stride, padding, dilation,
                                    ceil_mode)
    return _batched("max_pool2d", x, 4, lambda x4: _max_pool(x4, win, bool(return_indices)))


def _avg_divisor(win: PoolWindows, x: Tensor, count_include_pad: bool,
                 divisor_override: int | None) -> np.ndarray:
    """torch's divisor of each window [OH, OW]: `divisor_override`, else its taps inside the
    input or, with `count_include_pad`, inside the padded input (ceil_mode's extra taps
    never count)."""
    if divisor_override is not None:
        return np.full(win.out("avg_pool2d", x), float(divisor_override))
    counts = []
    for axis, out in enumerate(win.out("avg_pool2d", x)):
        pos, valid = win.taps(axis, x.shape[2 + axis], out)
        padded = pos < x.shape[2 + axis] + win.padding[axis]
        counts.append((padded if count_include_pad else valid).sum(1))
    return np.outer(*counts)


def _avg_pool(x: Tensor, win: PoolWindows, count_include_pad: bool,
              divisor_override: int | None) -> Tensor:
    """Window sums over the divisor: the core op (which divides by the kernel area)
    rescaled where it fits, else two separable window sums of gathers."""
    if win.core("avg_pool2d", x):
        y = x.trace.op("ember.avg_pool2d", x, **win.attrs())
        scale = math.prod(win.kernel) / _avg_divisor(win, x, count_include_pad,
                                                     divisor_override)
        return y if (scale == 1).all() else y * _const(x, scale)
    (oh, ow), (h, w) = win.out("avg_pool2d", x), x.shape[2:]
    y = _take(x, 3, *win.taps(1, w, ow), 0.0).sum(4)
    y = _take(y, 2, *win.taps(0, h, oh), 0.0).sum(3)
    return y / _const(x, _avg_divisor(win, x, count_include_pad, divisor_override))


def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> Tensor:
    """Mean over windows of [N, C, H, W] or [C, H, W] x, torch's arguments: zero padding is
    counted unless `count_include_pad=False`; `divisor_override` replaces the count."""
    x, win = _t(x), PoolWindows.of("avg_pool2d", kernel_size, stride, padding,
                                    ceil_mode=ceil_mode)
    if divisor_override is not None:
        positive("avg_pool2d divisor_override", divisor_override)
    return _batched("avg_pool2d", x, 4, lambda x4: _avg_pool(x4, win, bool(count_include_pad),
                                                             divisor_override))


def _adaptive_matrix(size: int, out: int) -> np.ndarray:
    """[out, size]: row i averages x[floor(i*size/out) : ceil((i+1)*size/out)] (PyTorch's)."""
    m = np.zeros((out, size))
    for i in range(out):
        lo, hi = (i * size) // out, -(-(i + 1) * size // out)
        m[i, lo:hi] = 1.0 / (hi - lo)
    return m


def adaptive_avg_pool2d(x, output_size) -> Tensor:
    """Mean over PyTorch's adaptive windows: one avg_pool2d when the sizes divide, else two
    constant averaging matmuls."""
    x = _t(x)
    oh, ow = _pair("output_size", output_size)
    if x.ndim != 4:
        raise x.trace.error(f"adaptive_avg_pool2d: input must be NCHW, got {list(x.shape)}")
    if 0 in x.shape[1:]:  # no window to average (torch's check too)
        raise x.trace.error(f"adaptive_avg_pool2d: input {list(x.shape)} is empty in a "
                            "non-batch dimension")
    h, w = x.shape[2:]
    if h % oh == 0 and w % ow == 0:
        return avg_pool2d(x, (h // oh, w // ow))
    dtype = np.dtype("f8") if x.dtype == "f64" else np.dtype("f4")
    ph, pw = (_adaptive_matrix(n, o).astype(dtype) for n, o in ((h, oh), (w, ow)))
    return x.trace.lift(ph, x.dtype) @ (x @ x.trace.lift(pw.T, x.dtype))


def flatten(x, start_dim: int = 1, end_dim: int = -1) -> Tensor:
    x = _t(x)
    a, b = axes_list((start_dim, end_dim), x.ndim)
    if not 0 <= a <= b < x.ndim:
        raise x.trace.error(f"flatten: dims {start_dim}..{end_dim} do not fit {list(x.shape)}")
    return x.reshape(*x.shape[:a], math.prod(x.shape[a:b + 1]), *x.shape[b + 1:])


# -- dropout, embedding, attention ----------------------------------------------------------

def check_dropout_p(p) -> float:
    return number("dropout probability p", p, 0, 1)


def dropout(x, p: float = 0.5, training: bool = True) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1-p), only when
    `training` and the trace is a training trace (`ember.dropout`, counter-based RNG)."""
    p = check_dropout_p(p)
    t = context.current()
    x = t.lift(x)
    if not (training and t.training) or p == 0:
        return x
    if p == 1:  # every element dropped (torch's p=1), with no 1/(1-p) to scale by
        return x * 0.0
    return t.op("ember.dropout", x, t.rng(), p=p, seed=t.seed, key=t.next_key())


def embedding(indices, weight) -> Tensor:
    """Rows of weight [num, d] at integer `indices`: shape indices.shape + [d] (`ember.gather`)."""
    t = context.current()
    return t.op("ember.gather", t.lift(weight), t.lift(indices), axis=0)


def _broadcast(*shapes) -> tuple[int, ...] | None:
    """numpy's broadcast of `shapes`, None where they do not broadcast."""
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        return None


def _same_batch(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q [..., Tq, d], k [..., Tk, d], v [..., Tk, dv] with their leading dims broadcast to
    one shape (torch's SDPA lets [H, T, d] queries meet [B, H, T, d] keys)."""
    batch = _broadcast(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if min(q.ndim, k.ndim, v.ndim) < 2 or batch is None:
        raise q.trace.error(f"attention: q {list(q.shape)}, k {list(k.shape)} and v "
                            f"{list(v.shape)} must be [..., T, d] with leading dims that "
                            "broadcast")
    return tuple(x if x.shape[:-2] == batch else broadcast_to(x, batch + x.shape[-2:])
                 for x in (q, k, v))


def _masked_scores(s: Tensor, mask: Tensor) -> Tensor:
    """Scores with torch SDPA's `attn_mask`: a bool mask keeps where True (-inf elsewhere),
    a float mask is added; it broadcasts to the scores [..., Tq, Tk]."""
    if _broadcast(mask.shape, s.shape) != s.shape:
        raise s.trace.error(f"attention: attn_mask {list(mask.shape)} does not broadcast to "
                            f"the scores [..., Tq, Tk] {list(s.shape)}")
    return where(mask, s, -math.inf) if mask.dtype == "i1" else s + mask


def scaled_dot_product_attention(q, k, v, causal: bool = False, scale: float | None = None,
                                 attn_mask=None) -> Tensor:
    """softmax(q k^T * scale + mask) v on [..., T, d], leading dims broadcast (`nn.attention`;
    with `attn_mask`, torch SDPA's: bool True = attend, or float added, composed of core
    ops); scale defaults to 1/sqrt(d)."""
    t = context.current()
    q, k, v = _same_batch(t.lift(q), t.lift(k), t.lift(v))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if attn_mask is None:
        return t.op("nn.attention", q, k, v, causal=bool(causal), scale=scale)
    if causal:
        raise ValueError("scaled_dot_product_attention: give attn_mask or causal, not both "
                         "(as torch)")
    s = (q @ k.mT) * scale
    return softmax(_masked_scores(s, t.lift(attn_mask)), -1) @ v


def multi_head_attention(query, key, value, num_heads: int, q_weight, k_weight, v_weight,
                         out_weight, q_bias=None, k_bias=None, v_bias=None, out_bias=None,
                         causal: bool = False, attn_mask=None) -> Tensor:
    """[B, T, D] inputs projected (weights [D, D]), split into heads, attended, merged and
    projected out. `attn_mask` broadcasts to [B, heads, Tq, Tk] with torch SDPA's meaning
    (bool True = attend), NOT torch.nn.MultiheadAttention's (True = masked out)."""
    t = context.current()
    query, key, value = t.lift(query), t.lift(key), t.lift(value)
    for name, x in (("query", query), ("key", key), ("value", value)):
        if x.ndim != 3:
            raise t.error(f"multi_head_attention: {name} must be [B, T, D], got {list(x.shape)}")

    def heads(x, w, b):
        y = linear(x, w, b)
        bsz, n, d = y.shape
        if d % num_heads:
            raise t.error(f"multi_head_attention: {num_heads} heads do not divide width {d}")
        return y.reshape(bsz, n, num_heads, d // num_heads).transpose(0, 2, 1, 3)

    q, k, v = heads(query, q_weight, q_bias), heads(key, k_weight, k_bias), heads(value,
                                                                                   v_weight,
                                                                                   v_bias)
    y = scaled_dot_product_attention(q, k, v, causal, attn_mask=attn_mask)
    bsz, _, n, dh = y.shape
    return linear(y.transpose(0, 2, 1, 3).reshape(bsz, n, num_heads * dh), out_weight, out_bias)

__all__ = ["adaptive_avg_pool2d", "add", "avg_pool2d", "batch_norm",
           "binary_cross_entropy_with_logits", "broadcast_to", "clamp", "conv1d", "conv2d",
           "conv_transpose2d", "cross_entropy", "div", "dropout", "embedding", "erf", "flatten",
           "gelu", "group_norm", "hardsigmoid", "hardswish", "interpolate", "layer_norm",
           "leaky_relu", "linear", "log_softmax", "max_pool2d", "maximum", "minimum", "mse_loss",
           "multi_head_attention", "nll_loss", "pad", "relu", "rms_norm", "rsqrt",
           "scaled_dot_product_attention", "sigmoid", "sign", "silu", "softmax", "softplus", "sub",
           "tanh", "where"]
