"""Backward rules, one per op name, each next to its checkpoint class (as in burn).

A rule is `(builder, op, out_grads, needs) -> operand grads`: it emits the ops computing
the gradient of every operand whose `needs` entry is true and returns None for the others,
so no backward op is emitted for inputs or frozen params. The checkpoint class says what a
rematerializing pass should do with the op's result: "compute" (expensive: keep it) or
"memory" (cheap: recompute it in the backward pass).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ...ir import Builder, Operation, TensorType, Value, dtype_of, numpy_dtype
from ..decompose import softmax

Grads = list[Value | None]
Backward = Callable[[Builder, Operation, Grads, list[bool]], Grads]


@dataclass(frozen=True)
class Rule:
    backward: Backward
    checkpoint: str  # "compute" | "memory"


RULES: dict[str, Rule] = {}


def rule(*names: str, checkpoint: str = "memory"):
    def register(fn: Backward) -> Backward:
        for n in names:
            RULES[n] = Rule(fn, checkpoint)
        return fn
    return register


# --- helpers ---------------------------------------------------------------------------

def const(b: Builder, value: float, dtype: str) -> Value:
    """A scalar constant of `dtype`."""
    arr = np.array(value, numpy_dtype(dtype))
    return b.op("ember.constant", value=arr,
                **({} if dtype_of(arr.dtype) == dtype else {"dtype": dtype}))


def each(needs: list[bool], *grads: Callable[[], Value | None]) -> Grads:
    """Build only the operand gradients that are needed."""
    return [g() if n else None for n, g in zip(needs, grads)]


def unbroadcast(b: Builder, g: Value, t: TensorType) -> Value:
    """Sum `g` over the axes that broadcasting added or stretched, back to shape `t`."""
    gs, lead = g.type.shape, g.type.rank - t.rank
    axes = list(range(lead)) + [lead + i for i, d in enumerate(t.shape)
                                if d == 1 and gs[lead + i] != 1]
    if axes:  # keepdims only when a kept size-1 axis is summed
        g = b.op("ember.reduce_sum", g, axes=axes, keepdims=axes[-1] >= lead)
    return b.op("ember.reshape", g, shape=list(t.shape)) if g.type.shape != t.shape else g


def keepdims(b: Builder, v: Value, op: Operation) -> Value:
    """The result (or gradient) of reduction `op` with its reduced axes kept as size 1."""
    x = op.operands[0].type
    axes = {a % x.rank for a in op.attributes["axes"]}
    shape = [1 if i in axes else d for i, d in enumerate(x.shape)]
    return v if list(v.type.shape) == shape else b.op("ember.reshape", v, shape=shape)


def mT(b: Builder, v: Value) -> Value:
    """Swap the last two axes."""
    r = v.type.rank
    return b.op("ember.transpose", v, perm=[*range(r - 2), r - 1, r - 2])


# --- elementwise -----------------------------------------------------------------------

@rule("ember.add")
def _add(b, op, gs, needs):
    (g,), (x, y) = gs, op.operands
    return each(needs, lambda: unbroadcast(b, g, x.type), lambda: unbroadcast(b, g, y.type))


@rule("ember.sub")
def _sub(b, op, gs, needs):
    (g,), (x, y) = gs, op.operands
    return each(needs, lambda: unbroadcast(b, g, x.type),
                lambda: unbroadcast(b, b.op("ember.neg", g), y.type))


@rule("ember.mul")
def _mul(b, op, gs, needs):
    (g,), (x, y) = gs, op.operands
    return each(needs, lambda: unbroadcast(b, b.op("ember.mul", g, y), x.type),
                lambda: unbroadcast(b, b.op("ember.mul", g, x), y.type))


@rule("ember.div")
def _div(b, op, gs, needs):
    (g,), (x, y), out = gs, op.operands, op.result
    return each(needs, lambda: unbroadcast(b, b.op("ember.div", g, y), x.type),
                lambda: unbroadcast(b, b.op("ember.neg", b.op("ember.div", b.op(
                    "ember.mul", g, out), y)), y.type))


@rule("ember.max", "ember.min")
def _max_min(b, op, gs, needs):
    """The gradient goes to the operand that was chosen; ties go to the first one."""
    (g,), (x, y) = gs, op.operands
    mask = b.op("ember.cmp", x, y, predicate="ge" if op.name == "ember.max" else "le")
    zero = const(b, 0, g.type.dtype)
    return each(needs, lambda: unbroadcast(b, b.op("ember.select", mask, g, zero), x.type),
                lambda: unbroadcast(b, b.op("ember.select", mask, zero, g), y.type))


@rule("ember.pow")
def _pow(b, op, gs, needs):
    (g,), (x, y), out = gs, op.operands, op.result

    def dx():
        ym1 = b.op("ember.sub", y, const(b, 1, y.type.dtype))
        return unbroadcast(b, b.op("ember.mul", b.op("ember.mul", g, y),
                                   b.op("ember.pow", x, ym1)), x.type)

    return each(needs, dx, lambda: unbroadcast(b, b.op("ember.mul", b.op(
        "ember.mul", g, out), b.op("ember.log", x)), y.type))


def unary(*names: str):
    """A rule `dx = f(b, g, x, out)` for a one-operand op."""
    def register(f):
        rule(*names)(lambda b, op, gs, needs: [f(b, gs[0], op.operands[0], op.result)])
        return f
    return register


@unary("ember.neg")
def _neg(b, g, x, out):
    return b.op("ember.neg", g)


@unary("ember.abs")
def _abs(b, g, x, out):
    zero = const(b, 0, x.type.dtype)
    neg = b.op("ember.select", b.op("ember.cmp", x, zero, predicate="lt"), b.op("ember.neg", g),
               zero)
    return b.op("ember.select", b.op("ember.cmp", x, zero, predicate="gt"), g, neg)


@unary("ember.exp")
def _exp(b, g, x, out):
    return b.op("ember.mul", g, out)


@unary("ember.log")
def _log(b, g, x, out):
    return b.op("ember.div", g, x)


@unary("ember.sqrt")
def _sqrt(b, g, x, out):
    return b.op("ember.div", g, b.op("ember.mul", out, const(b, 2, x.type.dtype)))


@unary("ember.rsqrt")
def _rsqrt(b, g, x, out):  # d/dx x^-1/2 = -x^-1/2 / (2x)
    return b.op("ember.mul", g, b.op("ember.div", b.op("ember.mul", out, const(
        b, -0.5, x.type.dtype)), x))


@unary("ember.tanh")
def _tanh(b, g, x, out):
    one = const(b, 1, x.type.dtype)
    return b.op("ember.mul", g, b.op("ember.sub", one, b.op("ember.mul", out, out)))


@unary("ember.sigmoid")
def _sigmoid(b, g, x, out):
    one = const(b, 1, x.type.dtype)
    return b.op("ember.mul", g, b.op("ember.mul", out, b.op("ember.sub", one, out)))


@unary("ember.relu")
def _relu(b, g, x, out):
    zero = const(b, 0, x.type.dtype)
    return b.op("ember.select", b.op("ember.cmp", x, zero, predicate="gt"), g, zero)


@unary("ember.cast")
def _cast(b, g, x, out):
    return b.op("ember.cast", g, dtype=x.type.dtype)


@rule("ember.select")
def _select(b, op, gs, needs):
    (g,), (c, x, y) = gs, op.operands
    zero = const(b, 0, g.type.dtype)
    return each(needs, lambda: None,
                lambda: unbroadcast(b, b.op("ember.select", c, g, zero), x.type),
                lambda: unbroadcast(b, b.op("ember.select", c, zero, g), y.type))


@rule("ember.cmp", "ember.one_hot", "ember.constant", "ember.param")
def _no_gradient(b, op, gs, needs):
    return [None] * len(op.operands)


# --- reductions and shapes -------------------------------------------------------------

@unary("ember.reduce_sum")
def _reduce_sum(b, g, x, out):
    return b.op("ember.broadcast", keepdims(b, g, out.op), shape=list(x.type.shape))


@unary("ember.reduce_mean")
def _reduce_mean(b, g, x, out):
    count = x.type.size // max(out.type.size, 1)
    return b.op("ember.mul", _reduce_sum(b, g, x, out), const(b, 1 / count, x.type.dtype))


@unary("ember.reduce_max")
def _reduce_max(b, g, x, out):
    """To the positions equal to the max, split evenly among ties (as JAX and torch.amax)."""
    op = out.op
    hit = b.op("ember.cast", b.op("ember.cmp", x, keepdims(b, out, op), predicate="eq"),
               dtype=x.type.dtype)
    ties = b.op("ember.reduce_sum", hit, axes=op.attributes["axes"], keepdims=True)
    return b.op("ember.mul", hit, b.op("ember.div", keepdims(b, g, op), ties))


@unary("ember.broadcast")
def _broadcast(b, g, x, out):
    return unbroadcast(b, g, x.type)


@unary("ember.reshape")
def _reshape(b, g, x, out):
    return b.op("ember.reshape", g, shape=list(x.type.shape))


@unary("ember.transpose")
def _transpose(b, g, x, out):
    return b.op("ember.transpose", g, perm=[int(i) for i in np.argsort(out.op.attributes["perm"])])


@rule("ember.matmul", checkpoint="compute")
def _matmul(b, op, gs, needs):
    (g,), (x, y) = gs, op.operands
    return each(needs, lambda: unbroadcast(b, b.op("ember.matmul", g, mT(b, y)), x.type),
                lambda: unbroadcast(b, b.op("ember.matmul", mT(b, x), g), y.type))


# --- nn ops: dedicated rules, cheaper and more stable than differentiating a lowering ---

@rule("nn.linear", checkpoint="compute")
def _linear(b, op, gs, needs):
    """x[..., d] @ w[d, o] + b[o]: leading dims of x and g are flattened into rows."""
    (g,), (x, w, *_) = gs, op.operands
    rows = x.type.size // x.type.shape[-1]

    def flat(v: Value) -> Value:
        shape = [rows, v.type.shape[-1]]
        return v if list(v.type.shape) == shape else b.op("ember.reshape", v, shape=shape)

    def dx():
        dx = b.op("ember.matmul", flat(g), b.op("ember.transpose", w, perm=[1, 0]))
        return b.op("ember.reshape", dx, shape=list(x.type.shape)) if x.type.rank != 2 else dx

    return each(needs, dx,
                lambda: b.op("ember.matmul", b.op("ember.transpose", flat(x), perm=[1, 0]),
                             flat(g)),
                lambda: b.op("ember.reduce_sum", flat(g), axes=[0], keepdims=False))


@rule("nn.log_softmax")
def _log_softmax(b, op, gs, needs):
    (g,), out, axis = gs, op.result, op.attributes["axis"]
    total = b.op("ember.reduce_sum", g, axes=[axis], keepdims=True)
    return [b.op("ember.sub", g, b.op("ember.mul", b.op("ember.exp", out), total))]


@rule("nn.softmax")
def _softmax(b, op, gs, needs):
    (g,), out, axis = gs, op.result, op.attributes["axis"]
    dot = b.op("ember.reduce_sum", b.op("ember.mul", g, out), axes=[axis], keepdims=True)
    return [b.op("ember.mul", out, b.op("ember.sub", g, dot))]


@rule("nn.cross_entropy")
def _cross_entropy(b, op, gs, needs):
    """d loss / d logits = (softmax(logits) - one_hot(labels)) / N * g."""
    (g,), (logits, labels) = gs, op.operands
    n, c = logits.type.shape
    dtype = logits.type.dtype
    onehot = b.op("ember.one_hot", labels, num_classes=c, dtype=dtype)
    diff = b.op("ember.sub", softmax(b, logits, 1), onehot)
    return [b.op("ember.mul", diff, b.op("ember.div", g, const(b, n, dtype))), None]


def checkpoint_class(op_name: str) -> str | None:
    """"compute" (keep the result) or "memory" (recompute it); None for ops without a rule."""
    r = RULES.get(op_name)
    return r.checkpoint if r else None
