"""The numpy reference of every op: the living definition of what an op computes."""

from __future__ import annotations

import numpy as np

from ...ir.types import numpy_dtype


def _reduce(fn):
    return lambda attrs, x: fn(x, axis=tuple(attrs["axes"]), keepdims=attrs["keepdims"])


def _cmp(attrs, a, b):
    return getattr(np, {"eq": "equal", "ne": "not_equal", "lt": "less", "le": "less_equal",
                        "gt": "greater", "ge": "greater_equal"}[attrs["predicate"]])(a, b)


def _log_softmax(x, axis):
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def _cross_entropy(attrs, logits, labels):
    logp = _log_softmax(logits, 1)
    return -logp[np.arange(len(labels)), labels].mean()


def _one_hot(attrs, labels):
    return np.arange(attrs["num_classes"]) == labels[..., None]


def _linear(attrs, x, w, b=None):
    y = x @ w
    return y if b is None else y + b


KERNELS = {
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
    "ember.cmp": _cmp,
    "ember.select": lambda a, c, x, y: np.where(c, x, y),
    "ember.cast": lambda a, x: x.astype(numpy_dtype(a["dtype"])),
    "ember.reduce_sum": _reduce(np.sum),
    "ember.reduce_mean": _reduce(np.mean),
    "ember.reduce_max": _reduce(np.max),
    "ember.broadcast": lambda a, x: np.broadcast_to(x, a["shape"]),
    "ember.reshape": lambda a, x: x.reshape(a["shape"]),
    "ember.transpose": lambda a, x: x.transpose(a["perm"]),
    "ember.matmul": lambda a, x, y: x @ y,
    "ember.one_hot": _one_hot,
    "ember.constant": lambda a: a["value"],
    "nn.linear": _linear,
    "nn.softmax": lambda a, x: np.exp(_log_softmax(x, a["axis"])),
    "nn.log_softmax": lambda a, x: _log_softmax(x, a["axis"]),
    "nn.cross_entropy": _cross_entropy,
}
