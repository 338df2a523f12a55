"""What convolutions and pools of every rank share, below both (frontend/convolution.py,
frontend/pooling.py): their n-tuple arguments, unbatched input, windows' taps gathered
along an axis, and padding and crops (`nn.functional.pad`)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .. import ir
from .indexing import window
from .ops import _t
from .tensor import Tensor

HOW_MANY = {1: "a tuple of one", 2: "a pair", 3: "a triple"}


def ntuple(name: str, value, n: int, lo: int = 1) -> tuple[int, ...]:
    """An int or n ints >= lo (a kernel size, strides, paddings of n spatial dims), as n."""
    t = (value,) * n if isinstance(value, int) else value
    if not (isinstance(t, (tuple, list)) and len(t) == n
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= lo for d in t)):
        raise ValueError(f"{name} must be an integer >= {lo} or {HOW_MANY[n]} of them, got "
                         f"{value!r}")
    return tuple(t)


def batched(what: str, x: Tensor, rank: int, fn: Callable) -> Tensor | tuple:
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


def const(x: Tensor, a: np.ndarray) -> Tensor:
    """The array `a` as a constant of x's dtype."""
    return x.trace.constant(np.asarray(a, ir.numpy_dtype(x.dtype)))


def gathered(x: Tensor, axis: int, index: np.ndarray, valid: np.ndarray, fill) -> Tensor:
    """x gathered along `axis` at the integer array `index`, and `fill` where `valid` is
    False: [*index.shape, *x's other dims], the windows and asymmetric padding that the core
    pool and conv ops cannot express, as one gather (its gradient a scatter_add)."""
    t, rest = x.trace, [a for a in range(x.ndim) if a != axis]
    at = t.lift(np.clip(index, 0, x.shape[axis] - 1).astype(np.int64))
    g = t.op("ember.gather", x.transpose([axis, *rest]), at, axis=0)
    if not valid.all():
        mask = t.lift(valid.reshape(valid.shape + (1,) * len(rest)))
        g = t.op("ember.select", mask, g, t.lift(fill, x.dtype))
    return g


def to_axis(x: Tensor, k: int, axis: int) -> Tensor:
    """x's first k dims moved to `axis` (of the others): gathered's layout undone."""
    return x.transpose([*range(k, k + axis), *range(k), *range(k + axis, x.ndim)])


def take(x: Tensor, axis: int, index: np.ndarray, valid: np.ndarray, fill) -> Tensor:
    """x gathered along `axis` at `index` (see gathered), whose dims replace that axis."""
    return to_axis(gathered(x, axis, index, valid, fill), index.ndim, axis)


def crop(x: Tensor, axis: int, start: int, length: int) -> Tensor:
    """x[start : start + length] along `axis`, zeros past x's end (a slice or a padding)."""
    amounts = [(0, 0)] * x.ndim
    amounts[axis] = (-start, start + length - x.shape[axis])
    return pad_dims(x, amounts, "constant", 0.0)


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
    return pad_dims(x, amounts, mode, value)


def pad_dims(x: Tensor, amounts: list[tuple[int, int]], mode: str, value) -> Tensor:
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
                x = take(x, axis, index, np.ones(index.shape, bool), 0)
        return x
    shape = [n + b + a for n, (b, a) in zip(x.shape, grow)]
    start = [b for b, _ in grow]
    y = x.trace.op("ember.unslice", x, start=start, step=[1] * x.ndim, shape=shape)
    if value == 0:
        return y
    outside = np.full(shape, value)
    outside[tuple(slice(b, b + n) for b, n in zip(start, x.shape))] = 0
    return y + const(x, outside)
