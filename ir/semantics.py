"""The numpy meaning of the simple core ops: elementwise arithmetic, casts, shape ops and
reductions, as `(attrs, *operands) -> array`.

Kept in `ir`, next to the op definitions (an elementwise op's is its declaration's `ref`),
because two layers need it and may not import each other: constant folding
(passes/fold.py) evaluates these at compile time, and the reference interpreter
(backends/interpreter) builds its kernel table on them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import dialects  # noqa: F401  (registers the ops whose references this reads)
from .dialects.ember import Elementwise
from .opdef import OPS, ops_with

Folder = Callable[..., np.ndarray]


def _reduce(fn: Callable[..., np.ndarray]) -> Folder:
    return lambda a, x: fn(x, axis=tuple(a["axes"]), keepdims=a["keepdims"])


def _mean(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    """Sum over count, so that the mean of nothing is 0/0 = NaN without numpy's warning."""
    count = math.prod(x.shape[d] for d in axis)
    mean: np.ndarray = np.sum(x, axis=axis, keepdims=keepdims) / count
    return mean


def _max(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    """Starting from the lowest value, as the compiled backends' accumulators do, so that the
    max of nothing is -inf (the lowest integer, false) instead of numpy's error."""
    out: np.ndarray = np.max(x, axis=axis, keepdims=keepdims, initial=_lowest(x.dtype))
    return out


def _lowest(dtype: np.dtype) -> float | int | bool:
    if dtype.kind == "f":
        return -np.inf
    return np.iinfo(dtype).min if dtype.kind == "i" else False


def window(a: dict[str, Any], shape: Sequence[int]) -> tuple[slice, ...]:
    """The numpy index of a slice/unslice's elements: start::step, `shape` of them."""
    return tuple(slice(s, s + t * (n - 1) + 1 if n else s, t)
                 for s, t, n in zip(a["start"], a["step"], shape))


def _unslice(a: dict[str, Any], x: np.ndarray) -> np.ndarray:
    out = np.zeros(a["shape"], dtype=x.dtype)
    out[window(a, x.shape)] = x
    return out


def _ref(name: str) -> Folder:
    d = OPS[name]
    assert issubclass(d, Elementwise)  # an elementwise ember op is declared as one
    return d.ref


SIMPLE_OPS: dict[str, Folder] = {
    **{n: _ref(n) for n in ops_with("elementwise", "ember")},  # each declared with its op
    "ember.broadcast": lambda a, x: np.broadcast_to(x, a["shape"]),
    "ember.reshape": lambda a, x: x.reshape(a["shape"]),
    "ember.transpose": lambda a, x: x.transpose(a["perm"]),
    "ember.slice": lambda a, x: x[window(a, a["shape"])],
    "ember.unslice": _unslice,
    "ember.concat": lambda a, *xs: np.concatenate(xs, axis=a["axis"]),
    "ember.reduce_sum": _reduce(np.sum),
    "ember.reduce_mean": _reduce(_mean),
    "ember.reduce_max": _reduce(_max),
}
