"""Tensor helpers the ONNX op table builds on: ops ember has no primitive for (take along an
axis, concatenate, pad, slice) as `ember.gather` and `ember.scatter_add` with constant
index arrays, which every backend runs and autodiff differentiates (each is the other's
gradient)."""

from __future__ import annotations

import numpy as np

from ..frontend import context
from ..frontend.tensor import Tensor
from ..ir import numpy_dtype


def tensor(v) -> Tensor:
    """A value of the node being lowered (a Tensor, or a numpy constant) as a Tensor."""
    return v if isinstance(v, Tensor) else context.current().lift(np.asarray(v))


def _front(x: Tensor, axis: int) -> tuple[Tensor, list[int]]:
    """x with `axis` moved first, and the permutation that did it."""
    perm = [axis] + [i for i in range(x.ndim) if i != axis]
    return (x.transpose(perm) if axis else x), perm


def gather(x: Tensor, indices, axis: int) -> Tensor:
    """numpy's `take(x, indices, axis)`: shape x.shape[:axis] + indices.shape +
    x.shape[axis+1:] (ember.gather takes rows, so the axis is moved first and back)."""
    t = x.trace
    idx = tensor(indices)
    y = t.op("ember.gather", _front(x, axis)[0], idx, axis=0)
    if axis == 0:
        return y
    k = idx.ndim
    return y.transpose(list(range(k, k + axis)) + list(range(k)) + list(range(k + axis, y.ndim)))


def take(x: Tensor, axis: int, index: np.ndarray) -> Tensor:
    """x at the positions `index` (1-D) of `axis`; x itself when that is all of it, in order."""
    if np.array_equal(index, np.arange(x.shape[axis])):
        return x
    return gather(x, np.asarray(index, np.int64), axis)


def place(x: Tensor, axis: int, start: int, size: int) -> Tensor:
    """x inside zeros of length `size` on `axis`, starting at `start`."""
    n = x.shape[axis]
    if start == 0 and n == size:
        return x
    y, perm = _front(x, axis)
    y = x.trace.op("ember.scatter_add", x.trace.lift(np.arange(start, start + n)), y,
                   shape=[size, *y.shape[1:]])
    return y.transpose(list(np.argsort(perm))) if axis else y


def concat(xs: list[Tensor], axis: int) -> Tensor:
    """numpy's concatenate, as a sum of each part placed into the whole."""
    total, start, out = sum(x.shape[axis] for x in xs), 0, None
    for x in xs:
        if x.shape[axis]:
            part = place(x, axis, start, total)
            out = part if out is None else out + part
        start += x.shape[axis]
    if out is None:  # every part is empty
        shape = list(xs[0].shape)
        shape[axis] = 0
        return xs[0].reshape(shape)
    return out


def pad(x: Tensor, pads: list[tuple[int, int]], mode: str = "constant", value=0) -> Tensor:
    """numpy's pad, per axis (before, after); negative amounts crop. `mode` is "constant"
    (with `value`), "edge", "reflect" or "wrap"."""
    for axis, (b, a) in enumerate(pads):
        n = x.shape[axis]
        if b < 0 or a < 0:
            x = take(x, axis, np.arange(max(-b, 0), n - max(-a, 0)))
    pads = [(max(b, 0), max(a, 0)) for b, a in pads]
    inner = x.shape
    for axis, (b, a) in enumerate(pads):
        if mode == "constant":
            x = place(x, axis, b, x.shape[axis] + b + a)
        elif b or a:
            x = take(x, axis, np.pad(np.arange(x.shape[axis]), (b, a), mode=mode))
    if mode == "constant" and value != 0 and any(b or a for b, a in pads):
        dtype = numpy_dtype(x.dtype)
        fill = np.pad(np.zeros(inner, dtype), pads, constant_values=np.asarray(value, dtype))
        x = x + x.trace.lift(fill)
    return x


def slice_axis(x: Tensor, axis: int, start: int, end: int, step: int) -> Tensor:
    """x[start:end:step] on `axis`, Python's (and ONNX's) clamping of out-of-range bounds."""
    return take(x, axis, np.arange(*slice(start, end, step).indices(x.shape[axis])))
