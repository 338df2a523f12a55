"""`em.nn.functional`: stateless ops on tensors (Params and arrays accepted), one op each.

Layers call these; users may too, inside `forward` or a traced loss function.
"""

from __future__ import annotations

from . import context
from .tensor import Tensor, _axes


def _t(x) -> Tensor:
    return context.current().lift(x)


def _axis(axis: int, x: Tensor) -> int:
    return _axes((axis,), x.ndim)[0]


def relu(x) -> Tensor:
    return _t(x).relu()


def sigmoid(x) -> Tensor:
    return _t(x).sigmoid()


def tanh(x) -> Tensor:
    return _t(x).tanh()


def linear(x, weight, bias=None) -> Tensor:
    """x @ weight + bias, with weight [d_in, d_out] (`nn.linear`)."""
    t = context.current()
    operands = [t.lift(x), t.lift(weight)] + ([] if bias is None else [t.lift(bias)])
    return t.op("nn.linear", *operands)


def softmax(x, axis: int = -1) -> Tensor:
    x = _t(x)
    return x.trace.op("nn.softmax", x, axis=_axis(axis, x))


def log_softmax(x, axis: int = -1) -> Tensor:
    x = _t(x)
    return x.trace.op("nn.log_softmax", x, axis=_axis(axis, x))


def cross_entropy(logits, labels) -> Tensor:
    """Mean cross-entropy of logits [N, C] against integer labels [N]: a scalar."""
    logits = _t(logits)
    return logits.trace.op("nn.cross_entropy", logits, _t(labels))


def mse_loss(a, b) -> Tensor:
    """Mean of the squared difference: a scalar."""
    d = _t(a) - _t(b)
    return (d * d).mean()


__all__ = ["cross_entropy", "linear", "log_softmax", "mse_loss", "relu", "sigmoid", "softmax",
           "tanh"]
