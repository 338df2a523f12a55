"""Ops torch has that ember composes from its core ops: `tril`/`triu` (a select with a
constant mask), `cumsum` (a log-depth scan of windows), `argmax`/`argmin` and
`max`/`min` along a dim with their indices (a compare with the max and an integer max)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .context import lift
from .indexing import along
from .tensor import Tensor, _axis, implements


def _triangle(x: Tensor, keep: np.ndarray) -> Tensor:
    if x.ndim < 2:
        raise x.trace.error(f"tril/triu need at least 2 dims, got {list(x.shape)}")
    return x.trace.op("ember.select", x.trace.lift(keep), x, x.trace.lift(0, x.dtype))


def tril(x: Tensor, diagonal: int = 0) -> Tensor:
    """torch.tril: the elements on and below the `diagonal`-th diagonal of the last two
    dims, zeros above."""
    x = lift(x)
    r, c = x.shape[-2:]
    return _triangle(x, np.arange(c)[None, :] - np.arange(r)[:, None] <= diagonal)


def triu(x: Tensor, diagonal: int = 0) -> Tensor:
    """torch.triu: the elements on and above the `diagonal`-th diagonal, zeros below."""
    x = lift(x)
    r, c = x.shape[-2:]
    return _triangle(x, np.arange(c)[None, :] - np.arange(r)[:, None] >= diagonal)


@implements
def cumsum(x: Tensor, dim: int, dtype=None) -> Tensor:
    """torch.cumsum along `dim` (in `dtype` when given): log2(n) steps of y += y shifted by
    1, 2, 4, ... (a window and its zero-padded placement), so each sum is a tree of depth
    log2(n), rounding no worse than a sequential scan; the gradient follows the windows."""
    y = lift(x) if dtype is None else lift(x).astype(dtype)
    if y.ndim == 0:
        return y
    d = _axis(y, dim)
    n, shift = y.shape[d], 1
    while shift < n:
        part = along(y, d, 0, n - shift)
        start = [shift if i == d else 0 for i in range(y.ndim)]
        y = y + y.trace.op("ember.unslice", part, start=start, step=[1] * y.ndim,
                           shape=list(y.shape))
        shift *= 2
    return y


@implements
def argmax(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """torch.argmax: the first index of the largest value along `dim` (of the flattened
    tensor when None), NaN counting as the largest; i64, no gradient."""
    x = lift(x)
    if dim is None:
        return argmax(x.reshape(-1), 0, False).reshape((1,) * x.ndim if keepdim else ())
    d = _axis(x, dim)
    n = x.shape[d]
    if not n:
        raise x.trace.error(f"argmax: dim {d} of {list(x.shape)} is empty")
    t = x.trace
    m = x.amax(d, keepdim=True)
    hit = t.op("ember.select", m != m, x != x, x == m) if x.dtype != "i1" else x == m
    iota = np.arange(n, dtype=np.int64).reshape([n if i == d else 1 for i in range(x.ndim)])
    neg = t.op("ember.select", hit, t.lift(-iota), t.lift(np.int64(-n)))
    return -neg.amax(d, keepdim)


@implements
def argmin(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """torch.argmin: the first index of the smallest value (the argmax of -x)."""
    return argmax(-lift(x), dim, keepdim)


class ValuesIndices(NamedTuple):
    """What torch's `max(dim)` and `min(dim)` return."""

    values: Tensor
    indices: Tensor


@implements
def max_along(x: Tensor, dim: int, keepdim: bool = False) -> ValuesIndices:
    return ValuesIndices(x.amax(dim, keepdim), argmax(x, dim, keepdim))


@implements
def min_along(x: Tensor, dim: int, keepdim: bool = False) -> ValuesIndices:
    return ValuesIndices(x.amin(dim, keepdim), argmin(x, dim, keepdim))
