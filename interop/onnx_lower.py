"""Tensor helpers the ONNX op table builds on: ember's windows `slice`, `unslice` and
`concat` (as torch's indexing, an unslice and `em.cat`), which copy only what they read,
for what they express (Slice with positive steps, Split, Concat, crops and zero padding);
`ember.gather` with a constant index array for what they do not (a negative step, edge,
reflect or wrap padding), which every backend runs and autodiff differentiates."""

from __future__ import annotations

import numpy as np

from ..frontend import context
from ..frontend.joining import cat
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


def place(x: Tensor, start: list[int], shape: list[int]) -> Tensor:
    """x inside zeros of `shape`, from `start` on each axis: one `ember.unslice` (x itself
    when it fills them)."""
    if tuple(shape) == x.shape:
        return x
    return x.trace.op("ember.unslice", x, start=list(start), step=[1] * x.ndim, shape=list(shape))


def concat(xs: list[Tensor], axis: int) -> Tensor:
    """numpy's concatenate: one `ember.concat` of the parts that are not empty."""
    return cat([x for x in xs if x.shape[axis]] or xs[:1], axis)


def pad(x: Tensor, pads: list[tuple[int, int]], mode: str = "constant", value=0) -> Tensor:
    """numpy's pad, per axis (before, after); negative amounts crop (one slice). `mode` is
    "constant" (with `value`: one unslice, and a constant added outside x unless the value
    is 0), "edge", "reflect" or "wrap" (a take per axis)."""
    x = x[tuple(slice(max(-b, 0), n - max(-a, 0)) for n, (b, a) in zip(x.shape, pads))]
    pads = [(max(b, 0), max(a, 0)) for b, a in pads]
    if mode != "constant":
        for axis, (b, a) in enumerate(pads):
            if b or a:
                x = take(x, axis, np.pad(np.arange(x.shape[axis]), (b, a), mode=mode))
        return x
    inner = x.shape
    x = place(x, [b for b, _ in pads], [n + b + a for n, (b, a) in zip(inner, pads)])
    if value != 0 and x.shape != inner:
        dtype = numpy_dtype(x.dtype)
        fill = np.pad(np.zeros(inner, dtype), pads, constant_values=np.asarray(value, dtype))
        x = x + x.trace.lift(fill)
    return x


def slice_axes(x: Tensor, bounds: dict[int, slice]) -> Tensor:
    """x[bounds[axis]] on each axis given, Python's (and ONNX's) clamping of out-of-range
    bounds: the positive steps as torch's indexing (one `ember.slice`), each negative one a
    take (ember.slice's steps are >= 1)."""
    backward = {axis: s for axis, s in bounds.items() if s.step < 0}
    x = x[tuple(slice(None) if a in backward else bounds.get(a, slice(None))
                for a in range(x.ndim))]
    for axis, s in backward.items():
        x = take(x, axis, np.arange(*s.indices(x.shape[axis])))
    return x


def strides(shape) -> list[int]:
    """The element strides of a C-ordered array of `shape`."""
    out = [1] * len(shape)
    for i in reversed(range(len(shape) - 1)):
        out[i] = out[i + 1] * shape[i + 1]
    return out


def element_base(shape, index_shape, axis: int) -> tuple[np.ndarray, int]:
    """For ONNX's GatherElements and ScatterElements: the flat position in an array of
    `shape` of each position of an index array of `index_shape` (no larger on any dim but
    `axis`) with its `axis` coordinate 0, and the stride of `axis`: the flat position of
    index value i there is base + i * stride."""
    st = strides(shape)
    base = np.zeros(index_shape, np.int64)
    for d, n in enumerate(index_shape):
        if d != axis:
            base += (np.arange(n, dtype=np.int64) * st[d]).reshape(
                [n if i == d else 1 for i in range(len(index_shape))])
    return base, st[axis]


def take_elements(x: Tensor, flat) -> Tensor:
    """x's elements at the flat positions `flat` (a numpy array or an integer Tensor, in
    range): one `ember.gather` of x flattened, shaped as `flat`; its gradient a
    scatter_add."""
    idx = tensor(flat)
    return x.trace.op("ember.gather", x.reshape(-1), idx.astype("i64"), axis=0)
