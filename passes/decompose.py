"""`decompose{linear=split|keep}`: lower every `nn.*` op to core `ember.*` ops.

Every backend then only needs core kernels. `linear=keep` leaves `nn.linear` whole (a
backend may call a fused GEMM+bias for it); the choice is recorded as the graph attribute
`ember.linear`, so a dump shows which lowering ran. Softmaxes subtract the max first, so
they never overflow. An op on bf16/f16 values is lowered in f32 between casts, so its
statistics and accumulations stay in f32 (as the interpreter computes the op). The helpers
here (`normalize`, `attention_probs`, ...) are also what the dedicated autodiff rules emit
to recompute forward intermediates, so after decomposition CSE merges the two.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..ir import Builder, Graph, Operation, Value, numpy_dtype
from ..ir.rewriter import Rewriter, apply_patterns
from .manager import Pass, PipelineError, register_pass
from .narrow import tensor_type
from .widen import needs_widening, widen

LINEAR_CHOICES = ("split", "keep")
CONV_ATTRS = ("stride", "padding", "dilation", "groups")
POOL_ATTRS = ("kernel", "stride", "padding")


def const(b: Builder, value: float, dtype: str) -> Value:
    """A scalar constant of `dtype`."""
    return b.op("ember.constant", value=np.array(value, numpy_dtype(dtype)))


def pick(op: Operation, keys: tuple[str, ...]) -> dict[str, Any]:
    """The attributes `keys` of `op` (never the pass-added ones such as `ember.recompute`)."""
    return {k: op.attributes[k] for k in keys}


def shifted(b: Builder, x: Value, axis: int) -> tuple[Value, Value, Value]:
    """(x - max(x), exp of it, sum of that), reduced along `axis` with keepdims.

    The max only keeps exp from overflowing and cancels out of the result, so it is marked
    `stop_gradient` (as JAX does): autodiff emits no backward ops for it.
    """
    s = x  # over an empty axis nothing can overflow, and there is no max of nothing
    if tensor_type(x).shape[axis]:
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
    lead = tensor_type(x).shape[:-1]
    if len(lead) == 1:
        return b.op("ember.matmul", x, w)
    x2 = b.op("ember.reshape", x, shape=[int(np.prod(lead)), tensor_type(x).shape[-1]])
    y = b.op("ember.matmul", x2, w)
    return b.op("ember.reshape", y, shape=[*lead, tensor_type(w).shape[1]])


def cross_entropy(b: Builder, logits: Value, labels: Value,
                  ignore_index: int | None = None) -> Value:
    """-mean over rows of sum(log_softmax(logits) * one_hot(labels)); the mean over the rows
    whose label is not `ignore_index` when one is given."""
    onehot = b.op("ember.one_hot", labels, num_classes=tensor_type(logits).shape[1],
                  dtype=logits.type.dtype)
    picked = b.op("ember.mul", log_softmax(b, logits, 1), onehot)
    rows = b.op("ember.reduce_sum", picked, axes=[1], keepdims=False)
    if ignore_index is None:
        return b.op("ember.neg", b.op("ember.reduce_mean", rows, axes=[0], keepdims=False))
    keep = kept_rows(b, labels, ignore_index, logits.type.dtype)
    total = b.op("ember.reduce_sum", b.op("ember.mul", rows, keep), axes=[0], keepdims=False)
    return b.op("ember.neg", b.op("ember.div", total, b.op("ember.reduce_sum", keep, axes=[0],
                                                         keepdims=False)))


def kept_rows(b: Builder, labels: Value, ignore_index: int, dtype: str) -> Value:
    """1 where a label is not `ignore_index`, else 0 (as `dtype`)."""
    ignored = b.op("ember.constant", value=np.array(ignore_index, numpy_dtype(labels.type.dtype)))
    return b.op("ember.cast", b.op("ember.cmp", labels, ignored, predicate="ne"), dtype=dtype)


def normalize(b: Builder, x: Value, axes: list[int],
              eps: float) -> tuple[Value, Value, Value, Value]:
    """(x - mean) * rsqrt(var + eps) over `axes` (kept as size 1): returns (xhat, rstd, mean,
    var), the biased variance computed from the centered values (two passes, stable)."""
    mean = b.op("ember.reduce_mean", x, axes=axes, keepdims=True)
    xc = b.op("ember.sub", x, mean)
    var = b.op("ember.reduce_mean", b.op("ember.mul", xc, xc), axes=axes, keepdims=True)
    rstd = b.op("ember.rsqrt", b.op("ember.add", var, const(b, eps, x.type.dtype)))
    return b.op("ember.mul", xc, rstd), rstd, mean, var


def channel(b: Builder, p: Value, rank: int) -> Value:
    """A per-channel [C] vector shaped to broadcast on axis 1 of a rank-`rank` tensor."""
    if rank == 2:
        return p
    return b.op("ember.reshape", p, shape=[tensor_type(p).shape[0]] + [1] * (rank - 2))


def layer_norm(b: Builder, op: Operation) -> Value:
    x, *affine = op.operands
    xhat = normalize(b, x, _axes(op), op.attributes["eps"])[0]
    if not affine:
        return xhat
    return b.op("ember.add", b.op("ember.mul", xhat, affine[0]), affine[1])


def batch_norm(b: Builder, op: Operation) -> tuple[Value, Value, Value]:
    """Training: batch statistics (biased var to normalize, unbiased for the running update,
    as PyTorch); inference: the running statistics, returned unchanged."""
    x, gamma, beta, rm, rv = op.operands
    a, rank, dtype = op.attributes, tensor_type(x).rank, x.type.dtype
    axes = [0, *range(2, rank)]
    if a["training"]:
        xhat, _, mean, var = normalize(b, x, axes, a["eps"])
        count = tensor_type(x).size // tensor_type(x).shape[1]
        keep, m = const(b, 1 - a["momentum"], dtype), const(b, a["momentum"], dtype)

        def update(old: Value, new: Value) -> Value:
            new = b.op("ember.reshape", new, shape=list(tensor_type(old).shape))
            return b.op("ember.add", b.op("ember.mul", old, keep), b.op("ember.mul", new, m))

        unbiased = b.op("ember.mul", var, const(b, count / (count - 1), dtype))
        stats = update(rm, mean), update(rv, unbiased)
    else:
        rstd = b.op("ember.rsqrt", b.op("ember.add", channel(b, rv, rank), const(b, a["eps"],
                                                                                 dtype)))
        xhat = b.op("ember.mul", b.op("ember.sub", x, channel(b, rm, rank)), rstd)
        stats = rm, rv
    y = b.op("ember.add", b.op("ember.mul", xhat, channel(b, gamma, rank)), channel(b, beta, rank))
    return (y, *stats)


GELU_C = math.sqrt(2 / math.pi)
GELU_A = 0.044715


def gelu(b: Builder, x: Value, approximate: str) -> Value:
    """0.5 x (1 + erf(x / sqrt 2)), or 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    dtype = x.type.dtype
    if approximate == "tanh":
        cube = b.op("ember.mul", b.op("ember.mul", x, x), x)
        inner = b.op("ember.add", x, b.op("ember.mul", cube, const(b, GELU_A, dtype)))
        phi = b.op("ember.tanh", b.op("ember.mul", inner, const(b, GELU_C, dtype)))
    else:
        phi = b.op("ember.erf", b.op("ember.mul", x, const(b, 1 / math.sqrt(2), dtype)))
    half_x = b.op("ember.mul", x, const(b, 0.5, dtype))
    return b.op("ember.mul", half_x, b.op("ember.add", phi, const(b, 1, dtype)))


def transpose_last(b: Builder, v: Value) -> Value:
    """Swap the last two axes."""
    r = tensor_type(v).rank
    return b.op("ember.transpose", v, perm=[*range(r - 2), r - 1, r - 2])


def attention_probs(b: Builder, q: Value, k: Value, causal: bool, scale: float) -> Value:
    """softmax(q k^T * scale + mask) over the last axis; the causal mask (key j hidden from
    query i when j > i) is built from two index vectors, never stored as a T x T constant."""
    dtype, (tq, tk) = q.type.dtype, (tensor_type(q).shape[-2], tensor_type(k).shape[-2])
    s = b.op("ember.mul", b.op("ember.matmul", q, transpose_last(b, k)), const(b, scale, dtype))
    if causal:
        rows = b.op("ember.constant", value=np.arange(tq, dtype=np.int64).reshape(tq, 1))
        cols = b.op("ember.constant", value=np.arange(tk, dtype=np.int64))
        hidden = b.op("ember.cmp", cols, rows, predicate="gt")
        s = b.op("ember.select", hidden, const(b, -np.inf, dtype), s)
    return softmax(b, s, tensor_type(s).rank - 1)


def attention(b: Builder, op: Operation) -> Value:
    q, k, v = op.operands
    p = attention_probs(b, q, k, op.attributes["causal"], op.attributes["scale"])
    return b.op("ember.matmul", p, v)


def conv2d(b: Builder, op: Operation) -> Value:
    x, w, *bias = op.operands
    y = b.op("ember.conv2d", x, w, **pick(op, CONV_ATTRS))
    return b.op("ember.add", y, channel(b, bias[0], 4)) if bias else y


def _axes(op: Operation) -> list[int]:
    rank = tensor_type(op.operands[0]).rank
    return sorted(a % rank for a in op.attributes["axes"])


def _linear(b: Builder, op: Operation) -> Value:
    x, w, *bias = op.operands
    y = matmul_2d(b, x, w)
    return b.op("ember.add", y, bias[0]) if bias else y


def _axis(op: Operation) -> int:
    axis: int = op.attributes["axis"]
    return axis % tensor_type(op.operands[0]).rank


def _cross_entropy(b: Builder, op: Operation) -> Value:
    logits, labels = op.operands
    return cross_entropy(b, logits, labels, op.attributes.get("ignore_index"))


# each returns the op's replacement: its one result, or a tuple of its results
Lowering = Callable[[Builder, Operation], Value | tuple[Value, ...]]

RULES: dict[str, Lowering] = {
    "nn.linear": _linear,
    "nn.log_softmax": lambda b, op: log_softmax(b, op.operands[0], _axis(op)),
    "nn.softmax": lambda b, op: softmax(b, op.operands[0], _axis(op)),
    "nn.cross_entropy": _cross_entropy,
    "nn.conv2d": conv2d,
    "nn.layer_norm": layer_norm,
    "nn.batch_norm": batch_norm,
    "nn.gelu": lambda b, op: gelu(b, op.operands[0], op.attributes["approximate"]),
    "nn.attention": attention,
}


@register_pass
@dataclass(frozen=True)
class Decompose(Pass):
    name: ClassVar[str] = "decompose"
    linear: str = "split"

    def __post_init__(self) -> None:
        if self.linear not in LINEAR_CHOICES:
            raise PipelineError(f"decompose: linear={self.linear!r} is not one of "
                                f"{', '.join(LINEAR_CHOICES)}")

    def apply(self, graph: Graph) -> Graph:
        skip = {"nn.linear"} if self.linear == "keep" else set()

        def lower(op: Operation, rw: Rewriter) -> bool:
            if needs_widening(op):  # bf16/f16: lowered in f32, its meaning (widen.py)
                return rw.replace(op, *widen(rw.builder(op), op))
            new = RULES[op.name](rw.builder(op), op)
            return rw.replace(op, *(new if isinstance(new, tuple) else (new,)))

        apply_patterns(graph, {name: [lower] for name in RULES if name not in skip})
        graph.attributes["ember.linear"] = self.linear
        return graph
