"""`decompose{linear=split|keep}`: lower `nn.*` ops to core `ember.*` ops.

Every backend then only needs core kernels. `linear=keep` leaves `nn.linear` whole (a
backend may call a fused GEMM+bias for it); the choice is recorded as the graph attribute
`ember.linear`, so a dump shows which lowering ran. Softmaxes subtract the max first, so
they never overflow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..ir import Builder, Graph, Operation, Value
from ..ir.rewriter import Rewriter, apply_patterns
from .manager import Pass, PipelineError, register_pass

LINEAR_CHOICES = ("split", "keep")


def shifted(b: Builder, x: Value, axis: int) -> tuple[Value, Value, Value]:
    """(x - max(x), exp of it, sum of that), reduced along `axis` with keepdims.

    The max only keeps exp from overflowing and cancels out of the result, so it is marked
    `stop_gradient` (as JAX does): autodiff emits no backward ops for it.
    """
    m = b.op("ember.reduce_max", x, axes=[axis], keepdims=True, stop_gradient=True)
    s = b.op("ember.sub", x, m)
    e = b.op("ember.exp", s)
    return s, e, b.op("ember.reduce_sum", e, axes=[axis], keepdims=True)


def log_softmax(b: Builder, x: Value, axis: int) -> Value:
    s, _, z = shifted(b, x, axis)
    return b.op("ember.sub", s, b.op("ember.log", z))


def softmax(b: Builder, x: Value, axis: int) -> Value:
    _, e, z = shifted(b, x, axis)
    return b.op("ember.div", e, z)


def matmul_2d(b: Builder, x: Value, w: Value) -> Value:
    """x[..., d] @ w[d, o] as one rank-2 matmul: leading dims are flattened (and restored)."""
    lead = x.type.shape[:-1]
    if len(lead) == 1:
        return b.op("ember.matmul", x, w)
    x2 = b.op("ember.reshape", x, shape=[int(np.prod(lead)), x.type.shape[-1]])
    y = b.op("ember.matmul", x2, w)
    return b.op("ember.reshape", y, shape=[*lead, w.type.shape[1]])


def cross_entropy(b: Builder, logits: Value, labels: Value) -> Value:
    """-mean over rows of sum(log_softmax(logits) * one_hot(labels))."""
    onehot = b.op("ember.one_hot", labels, num_classes=logits.type.shape[1],
                  dtype=logits.type.dtype)
    picked = b.op("ember.mul", log_softmax(b, logits, 1), onehot)
    rows = b.op("ember.reduce_sum", picked, axes=[1], keepdims=False)
    return b.op("ember.neg", b.op("ember.reduce_mean", rows, axes=[0], keepdims=False))


def _linear(b: Builder, op: Operation) -> Value:
    x, w, *bias = op.operands
    y = matmul_2d(b, x, w)
    return b.op("ember.add", y, bias[0]) if bias else y


def _axis(op: Operation) -> int:
    return op.attributes["axis"] % op.operands[0].type.rank


RULES = {
    "nn.linear": _linear,
    "nn.log_softmax": lambda b, op: log_softmax(b, op.operands[0], _axis(op)),
    "nn.softmax": lambda b, op: softmax(b, op.operands[0], _axis(op)),
    "nn.cross_entropy": lambda b, op: cross_entropy(b, *op.operands),
}


@register_pass
@dataclass(frozen=True)
class Decompose(Pass):
    name: ClassVar[str] = "decompose"
    linear: str = "split"

    def __post_init__(self):
        if self.linear not in LINEAR_CHOICES:
            raise PipelineError(f"decompose: linear={self.linear!r} is not one of "
                                f"{', '.join(LINEAR_CHOICES)}")

    def apply(self, graph: Graph) -> Graph:
        skip = {"nn.linear"} if self.linear == "keep" else set()

        def lower(op: Operation, rw: Rewriter) -> bool:
            b = rw.builder(op)
            return rw.replace(op, RULES[op.name](b, op))

        apply_patterns(graph, {name: [lower] for name in RULES if name not in skip})
        graph.attributes["ember.linear"] = self.linear
        return graph
