"""The numpy meaning of the simple core ops: elementwise arithmetic, casts, shape ops and
reductions, as `(attrs, *operands) -> array`.

Declared once, next to the op definitions, because two layers need it and may not import
each other: constant folding (passes/fold.py) evaluates these at compile time, and the
reference interpreter (backends/interpreter) builds its kernel table on them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .types import numpy_dtype

Folder = Callable[..., np.ndarray]


def _reduce(fn) -> Folder:
    return lambda a, x: fn(x, axis=tuple(a["axes"]), keepdims=a["keepdims"])


def _mean(x, axis, keepdims):
    """Sum over count, so that the mean of nothing is 0/0 = NaN without numpy's warning."""
    count = math.prod(x.shape[d] for d in axis)
    return np.sum(x, axis=axis, keepdims=keepdims) / count


def _max(x, axis, keepdims):
    """Starting from the lowest value, as the compiled backends' accumulators do, so that the
    max of nothing is -inf (the lowest integer, false) instead of numpy's error."""
    return np.max(x, axis=axis, keepdims=keepdims, initial=_lowest(x.dtype))


def _lowest(dtype: np.dtype):
    if dtype.kind == "f":
        return -np.inf
    return np.iinfo(dtype).min if dtype.kind == "i" else False


_CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
        "gt": np.greater, "ge": np.greater_equal}

SIMPLE_OPS: dict[str, Folder] = {
    "ember.add": lambda a, x, y: x + y,
    "ember.sub": lambda a, x, y: x - y,
    "ember.mul": lambda a, x, y: x * y,
    "ember.div": lambda a, x, y: x / y,
    "ember.max": lambda a, x, y: np.maximum(x, y),
    "ember.min": lambda a, x, y: np.minimum(x, y),
    "ember.pow": lambda a, x, y: np.power(x, y),
    "ember.neg": lambda a, x: -x,
    "ember.abs": lambda a, x: np.abs(x),
    "ember.exp": lambda a, x: np.exp(x),
    "ember.log": lambda a, x: np.log(x),
    "ember.sqrt": lambda a, x: np.sqrt(x),
    "ember.rsqrt": lambda a, x: 1 / np.sqrt(x),
    "ember.tanh": lambda a, x: np.tanh(x),
    "ember.sigmoid": lambda a, x: 1 / (1 + np.exp(-x)),
    "ember.relu": lambda a, x: np.maximum(x, 0),
    "ember.cmp": lambda a, x, y: _CMP[a["predicate"]](x, y),
    "ember.select": lambda a, c, x, y: np.where(c, x, y),
    "ember.cast": lambda a, x: x.astype(numpy_dtype(a["dtype"])),
    "ember.broadcast": lambda a, x: np.broadcast_to(x, a["shape"]),
    "ember.reshape": lambda a, x: x.reshape(a["shape"]),
    "ember.transpose": lambda a, x: x.transpose(a["perm"]),
    "ember.reduce_sum": _reduce(np.sum),
    "ember.reduce_mean": _reduce(_mean),
    "ember.reduce_max": _reduce(_max),
}
