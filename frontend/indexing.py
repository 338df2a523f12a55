"""`Tensor.__getitem__` as torch reads it: ints (negative too), slices with steps, None,
`...`, one integer array (a numpy array, a list or a traced integer tensor) and a boolean
numpy mask.

Ints and slices become one `ember.slice` (its gradient an `ember.unslice`) and a reshape
that drops the int dims and inserts the None ones; an integer index is then one
`ember.gather` along its dim (its gradient a `scatter_add`); a static mask is the integer
index of its true elements. A traced boolean mask has a data-dependent shape: refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .tensor import Tensor, implements

INDEXING_FORMS = ("ints, slices with steps >= 1, None, ..., one integer array or list, or a "
                  "boolean numpy mask")


@dataclass
class _Plan:
    """What a key does to x, dim by dim of x: the window (start, step, size) of each dim,
    the dims an int drops, where None inserts a dim (positions in the sliced result), and
    the advanced index with the dim it runs along."""

    start: list[int] = field(default_factory=list)
    step: list[int] = field(default_factory=list)
    size: list[int] = field(default_factory=list)
    out: list = field(default_factory=list)  # per result dim: an x dim, (first, end), None
    index: object = None
    index_dim: int = -1  # the result dim (before the gather) the index runs along


def _is_index_array(k) -> bool:
    return isinstance(k, (list, np.ndarray, Tensor)) and not isinstance(k, bool)


def _consumes(k) -> int:
    """How many dims of x one entry of the key indexes."""
    if k is None:
        return 0
    if isinstance(k, np.ndarray) and k.dtype == bool:
        return k.ndim
    return 1


def _expand_ellipsis(x: Tensor, key: tuple) -> tuple:
    dots = [i for i, k in enumerate(key) if k is Ellipsis]
    if len(dots) > 1:
        raise x.trace.error("an index can have only one ellipsis (...)")
    used = sum(_consumes(k) for k in key if k is not Ellipsis)
    if used > x.ndim:
        raise x.trace.error(f"too many indices for a tensor of shape {list(x.shape)}: {used} "
                            f"dims indexed")
    fill = (slice(None),) * (x.ndim - used)
    if not dots:
        return key + fill
    return key[:dots[0]] + fill + key[dots[0] + 1:]


def _int(x: Tensor, k: int, d: int) -> int:
    n = x.shape[d]
    if not -n <= k < n:
        raise x.trace.error(f"index {k} is out of range for dim {d} of {list(x.shape)}")
    return k % n


def _plan(x: Tensor, key: tuple) -> _Plan:
    p, d = _Plan(), 0
    for k in key:
        if k is None:
            p.out.append(None)
            continue
        if isinstance(k, (bool, np.bool_)):
            raise x.trace.error("a python bool as an index is not supported; index with "
                                + INDEXING_FORMS)
        if isinstance(k, (int, np.integer)):
            p.start.append(_int(x, int(k), d))
            p.step.append(1)
            p.size.append(1)
            d += 1
            continue
        if isinstance(k, slice):
            start, stop, step = k.indices(x.shape[d])
            if step < 1:
                raise x.trace.error(f"slice step {k.step} in dim {d}: steps must be >= 1 "
                                    "(as torch's)")
            p.start.append(start)
            p.step.append(step)
            p.size.append(len(range(start, stop, step)))
            p.out.append(d)
            d += 1
            continue
        if _is_index_array(k):
            if p.index is not None:
                raise x.trace.error("more than one integer array in an index is not "
                                    "supported; index with " + INDEXING_FORMS)
            n = _consumes(k)
            p.index, p.index_dim = _index_array(x, k, d), len(p.out)
            for dd in range(d, d + n):
                p.start.append(0)
                p.step.append(1)
                p.size.append(x.shape[dd])
            p.out.append(d if n == 1 else (d, d + n))
            d += n
            continue
        raise x.trace.error(f"cannot index with a {type(k).__name__}; index with "
                            + INDEXING_FORMS)
    return p


def _index_array(x: Tensor, k, d: int):
    """The integer index of entry k at dim d: a numpy array (negatives made positive and
    bounds checked now), or a traced integer tensor (negatives wrapped in the graph)."""
    if isinstance(k, Tensor):
        if k.dtype == "i1":
            raise x.trace.error("indexing with a traced boolean mask gives a shape that "
                                "depends on the data; use x.masked_fill(~mask, 0) or "
                                "em.where(mask, x, 0), or a numpy mask known at trace time")
        if k.dtype not in ("i64", "i32"):
            raise x.trace.error(f"an index tensor must be integer, got {k.dtype}")
        n = x.shape[d]
        return k.trace.op("ember.select", k < 0, k + n, k) if n else k
    a = np.asarray(k)
    if a.dtype == bool:
        want = tuple(x.shape[d:d + a.ndim])
        if a.shape != want:
            raise x.trace.error(f"boolean mask of shape {list(a.shape)} does not match dims "
                                f"{d}..{d + a.ndim - 1} of {list(x.shape)} ({list(want)})")
        return np.flatnonzero(a)
    if a.size and a.dtype.kind not in "iu":
        raise x.trace.error(f"an index array must be integer or boolean, got {a.dtype}")
    a = a.astype(np.int64)
    n = x.shape[d]
    bad = a[(a < -n) | (a >= n)]
    if bad.size:
        raise x.trace.error(f"index {int(bad[0])} is out of range for dim {d} of "
                            f"{list(x.shape)}")
    return a % n if n else a


def window(x: Tensor, start: list[int], step: list[int], size: list[int]) -> Tensor:
    """x[start::step] with `size` elements per dim: one `ember.slice`, none when whole."""
    if list(size) == list(x.shape) and all(s == 1 for s in step):
        return x
    return x.trace.op("ember.slice", x, start=list(start), step=list(step), shape=list(size))


def along(x: Tensor, dim: int, start: int, size: int) -> Tensor:
    """x's elements start..start+size-1 of dim `dim` (split, chunk, unbind)."""
    starts, sizes = [0] * x.ndim, list(x.shape)
    starts[dim], sizes[dim] = start, size
    return window(x, starts, [1] * x.ndim, sizes)


@implements
def getitem(x: Tensor, key) -> Tensor:
    key = _expand_ellipsis(x, key if isinstance(key, tuple) else (key,))
    p = _plan(x, key)
    y = window(x, p.start, p.step, p.size)
    # the dims that stay (slices, the index's) and the inserted ones; ints drop theirs
    shape = []
    for o in p.out:
        if o is None:
            shape.append(1)
        elif isinstance(o, tuple):  # a boolean mask over several dims: flattened to one
            shape.append(int(np.prod(y.shape[o[0]:o[1]])))
        else:
            shape.append(y.shape[o])
    if tuple(shape) != y.shape:
        y = y.reshape(shape)
    if p.index is None:
        return y
    return _gather(y, p.index, p.index_dim)


def _gather(y: Tensor, index, dim: int) -> Tensor:
    """y indexed along `dim` by an integer array, whose dims replace `dim` (torch's rule:
    an int is a basic index, so one array's dims stay in place even beside ints)."""
    t = y.trace
    rest = [a for a in range(y.ndim) if a != dim]
    front = y if dim == 0 else y.transpose([dim, *rest])
    g = t.op("ember.gather", front, t.lift(index), axis=0)
    k = g.ndim - len(rest)
    if dim == 0:
        return g
    return g.transpose([*range(k, k + dim), *range(k), *range(k + dim, g.ndim)])
