"""Backward rules, one per op name, each next to what bounds the op, compute or
memory (burn's classes of ops for rematerialization).

A rule is `(builder, op, out_grads, needs) -> operand grads`: it emits the ops computing
the gradient of every operand whose `needs` entry is true and returns None for the others,
so no backward op is emitted for inputs or frozen params. What bounds an op says what a
rematerializing pass should do with the op's result: "compute" (expensive: keep it) or
"memory" (cheap: recompute it in the backward pass).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...ir import Builder, Operation, TensorType, Value
from ...ir.dialects.ember import softplus_params
from ...ir.opdef import normalize_axes
from ..decompose import (
    CONV_ATTRS,
    GELU_A,
    GELU_C,
    POOL_ATTRS,
    attention_probs,
    channel,
    const,
    kept_rows,
    normalize,
    pick,
    softmax,
)
from ..narrow import producer, tensor_type

Grads = list[Value | None]
Backward = Callable[[Builder, Operation, Grads, list[bool]], Grads]


@dataclass(frozen=True)
class Rule:
    backward: Backward
    bound: str  # "compute" | "memory"


RULES: dict[str, Rule] = {}


def rule(*names: str, bound: str = "memory") -> Callable[[Backward], Backward]:
    def register(fn: Backward) -> Backward:
        for n in names:
            RULES[n] = Rule(fn, bound)
        return fn
    return register


# --- helpers ---------------------------------------------------------------------------

def single(gs: Grads) -> Value:
    """The gradient of a one-result op's result: autodiff calls a rule only when some
    result has a gradient, here the only one."""
    (g,) = gs
    assert g is not None
    return g


def each(needs: list[bool], *grads: Callable[[], Value | None]) -> Grads:
    """Build only the operand gradients that are needed."""
    return [g() if n else None for n, g in zip(needs, grads)]


def unbroadcast(b: Builder, g: Value, t: TensorType) -> Value:
    """Sum `g` over the axes that broadcasting added or stretched, back to shape `t`."""
    gs, lead = tensor_type(g).shape, tensor_type(g).rank - t.rank
    axes = list(range(lead)) + [lead + i for i, d in enumerate(t.shape)
                                if d == 1 and gs[lead + i] != 1]
    if axes:  # keepdims only when a kept size-1 axis is summed
        g = b.op("ember.reduce_sum", g, axes=axes, keepdims=axes[-1] >= lead)
    return b.op("ember.reshape", g, shape=list(t.shape)) if tensor_type(g).shape != t.shape else g


def keepdims(b: Builder, v: Value, op: Operation) -> Value:
    """The result (or gradient) of reduction `op` with its reduced axes kept as size 1."""
    x = tensor_type(op.operands[0])
    axes = {a % x.rank for a in op.attributes["axes"]}
    shape = [1 if i in axes else d for i, d in enumerate(x.shape)]
    return v if list(tensor_type(v).shape) == shape else b.op("ember.reshape", v, shape=shape)


def mT(b: Builder, v: Value) -> Value:
    """Swap the last two axes."""
    r = tensor_type(v).rank
    return b.op("ember.transpose", v, perm=[*range(r - 2), r - 1, r - 2])


# --- elementwise -----------------------------------------------------------------------

@rule("ember.add")
def _add(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
    g, (x, y) = single(gs), op.operands
    return each(needs, lambda: unbroadcast(b, g, tensor_type(x)),
                lambda: unbroadcast(b, g, tensor_type(y)))


@rule("ember.sub")
def _sub(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
    g, (x, y) = single(gs), op.operands
    return each(needs, lambda: unbroadcast(b, g, tensor_type(x)),
                lambda: unbroadcast(b, b.op("ember.neg", g), tensor_type(y)))


@rule("ember.mul")
def _mul(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
    g, (x, y) = single(gs), op.operands
    return each(needs, lambda: unbroadcast(b, b.op("ember.mul", g, y), tensor_type(x)),
                lambda: unbroadcast(b, b.op("ember.mul", g, x), tensor_type(y)))


@rule("ember.div")
def _div(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
    g, (x, y), out = single(gs), op.operands, op.result
    return each(needs, lambda: unbroadcast(b, b.op("ember.div", g, y), tensor_type(x)),
                lambda: unbroadcast(b, b.op("ember.neg", b.op("ember.div", b.op(
                    "ember.mul", g, out), y)), tensor_type(y)))


@rule("ember.max", "ember.min")
def _max_min(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
    """The gradient goes to the operand that was chosen; ties go to the first one."""
    g, (x, y) = single(gs), op.operands
    mask = b.op("ember.cmp", x, y, predicate="ge" if op.name == "ember.max" else "le")
    zero = const(b, 0, g.type.dtype)
    return each(needs, lambda: unbroadcast(b, b.op("ember.select", mask, g, zero), tensor_type(x)),
                lambda: unbroadcast(b, b.op("ember.select", mask, zero, g), tensor_type(y)))


@rule("ember.pow")
def _pow(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
    g, (x, y), out = single(gs), op.operands, op.result

    def dx() -> Value:
        ym1 = b.op("ember.sub", y, const(b, 1, y.type.dtype))
        return unbroadcast(b, b.op("ember.mul", b.op("ember.mul", g, y),
                                   b.op("ember.pow", x, ym1)), tensor_type(x))

    return each(needs, dx, lambda: unbroadcast(b, b.op("ember.mul", b.op(
        "ember.mul", g, out), b.op("ember.log", x)), tensor_type(y)))


Unary = Callable[[Builder, Value, Value, Value], Value]


def unary(*names: str) -> Callable[[Unary], Unary]:
    """A rule `dx = f(b, g, x, out)` for a one-operand op."""
    def register(f: Unary) -> Unary:
        def backward(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
            g = gs[0]
            assert g is not None  # autodiff calls a rule only when a result has a gradient
            return [f(b, g, op.operands[0], op.result)]
        rule(*names)(backward)
        return f
    return register


@unary("ember.neg")
def _neg(b: Builder, g: Value, x: Value, out: Value) -> Value:
    return b.op("ember.neg", g)


@unary("ember.abs")
def _abs(b: Builder, g: Value, x: Value, out: Value) -> Value:
    zero = const(b, 0, x.type.dtype)
    neg = b.op("ember.select", b.op("ember.cmp", x, zero, predicate="lt"), b.op("ember.neg", g),
               zero)
    return b.op("ember.select", b.op("ember.cmp", x, zero, predicate="gt"), g, neg)


@unary("ember.exp")
def _exp(b: Builder, g: Value, x: Value, out: Value) -> Value:
    return b.op("ember.mul", g, out)


@unary("ember.log")
def _log(b: Builder, g: Value, x: Value, out: Value) -> Value:
    return b.op("ember.div", g, x)


@unary("ember.sqrt")
def _sqrt(b: Builder, g: Value, x: Value, out: Value) -> Value:
    return b.op("ember.div", g, b.op("ember.mul", out, const(b, 2, x.type.dtype)))


@unary("ember.rsqrt")
def _rsqrt(b: Builder, g: Value, x: Value, out: Value) -> Value:  # d/dx x^-1/2 = -x^-1/2 / (2x)
    return b.op("ember.mul", g, b.op("ember.div", b.op("ember.mul", out, const(
        b, -0.5, x.type.dtype)), x))


@unary("ember.tanh")
def _tanh(b: Builder, g: Value, x: Value, out: Value) -> Value:
    one = const(b, 1, x.type.dtype)
    return b.op("ember.mul", g, b.op("ember.sub", one, b.op("ember.mul", out, out)))


@unary("ember.sigmoid")
def _sigmoid(b: Builder, g: Value, x: Value, out: Value) -> Value:
    one = const(b, 1, x.type.dtype)
    return b.op("ember.mul", g, b.op("ember.mul", out, b.op("ember.sub", one, out)))


@unary("ember.relu")
def _relu(b: Builder, g: Value, x: Value, out: Value) -> Value:
    """Masked by the output (out > 0 exactly where x > 0), as PyTorch's threshold_backward:
    the backward then keeps the value the next layer keeps anyway, not the input too."""
    zero = const(b, 0, x.type.dtype)
    return b.op("ember.select", b.op("ember.cmp", out, zero, predicate="gt"), g, zero)


@unary("ember.softplus")
def _softplus(b: Builder, g: Value, x: Value, out: Value) -> Value:
    """g sigmoid(beta x), and g itself where beta x > threshold (the result is x there), as
    PyTorch's softplus_backward."""
    beta, threshold = softplus_params(producer(out).attributes)
    t = b.op("ember.mul", x, const(b, beta, x.type.dtype))
    above = b.op("ember.cmp", t, const(b, threshold, x.type.dtype), predicate="gt")
    return b.op("ember.select", above, g, b.op("ember.mul", g, b.op("ember.sigmoid", t)))


@rule("ember.sign")
def _sign(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
    """0 everywhere, as torch's sign_backward: no backward op; a param that reaches the
    loss only through a sign gets a gradient of zeros."""
    return [None]


@unary("ember.cast")
def _cast(b: Builder, g: Value, x: Value, out: Value) -> Value:
    return b.op("ember.cast", g, dtype=x.type.dtype)


@rule("ember.select")
def _select(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
    g, (c, x, y) = single(gs), op.operands
    zero = const(b, 0, g.type.dtype)
    return each(needs, lambda: None,
                lambda: unbroadcast(b, b.op("ember.select", c, g, zero), tensor_type(x)),
                lambda: unbroadcast(b, b.op("ember.select", c, zero, g), tensor_type(y)))


@rule("ember.cmp", "ember.one_hot", "ember.constant", "ember.param")
def _no_gradient(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
    return [None] * len(op.operands)


# Ops left without a rule on purpose, and why: a gradient that must flow through one is an
# AutodiffError naming it. tests/ir/test_registry.py holds every other op to having a rule.
NO_RULE = {"ember.max_pool2d_grad": "second order through max pooling is not supported",
           "ember.grads_ready": "placed after the backward (bucket-grads), which it ends",
           "ember.conv2d_nhwc": "made by the layout pass, in inference graphs only"}


# --- reductions and shapes -------------------------------------------------------------

@unary("ember.reduce_sum")
def _reduce_sum(b: Builder, g: Value, x: Value, out: Value) -> Value:
    return b.op("ember.broadcast", keepdims(b, g, producer(out)), shape=list(tensor_type(x).shape))


@unary("ember.reduce_mean")
def _reduce_mean(b: Builder, g: Value, x: Value, out: Value) -> Value:
    """g / count, broadcast; over nothing (count 0) the mean is NaN and its gradient empty,
    so the scale is NaN (as torch) rather than a division by zero at compile time."""
    count = tensor_type(x).size // max(tensor_type(out).size, 1)
    scale = 1 / count if count else math.nan
    return b.op("ember.mul", _reduce_sum(b, g, x, out), const(b, scale, x.type.dtype))


@unary("ember.reduce_max")
def _reduce_max(b: Builder, g: Value, x: Value, out: Value) -> Value:
    """To the positions equal to the max, split evenly among ties (as JAX and torch.amax)."""
    op = producer(out)
    hit = b.op("ember.cast", b.op("ember.cmp", x, keepdims(b, out, op), predicate="eq"),
               dtype=x.type.dtype)
    ties = b.op("ember.reduce_sum", hit, axes=op.attributes["axes"], keepdims=True)
    return b.op("ember.mul", hit, b.op("ember.div", keepdims(b, g, op), ties))


@unary("ember.broadcast")
def _broadcast(b: Builder, g: Value, x: Value, out: Value) -> Value:
    return unbroadcast(b, g, tensor_type(x))


@unary("ember.reshape")
def _reshape(b: Builder, g: Value, x: Value, out: Value) -> Value:
    return b.op("ember.reshape", g, shape=list(tensor_type(x).shape))


@unary("ember.transpose")
def _transpose(b: Builder, g: Value, x: Value, out: Value) -> Value:
    perm = np.argsort(producer(out).attributes["perm"])
    return b.op("ember.transpose", g, perm=[int(i) for i in perm])


def _window(op: Operation) -> dict[str, list[int]]:
    return {k: list(op.attributes[k]) for k in ("start", "step")}


@unary("ember.slice")
def _slice(b: Builder, g: Value, x: Value, out: Value) -> Value:
    return b.op("ember.unslice", g, shape=list(tensor_type(x).shape), **_window(producer(out)))


@unary("ember.unslice")
def _unslice(b: Builder, g: Value, x: Value, out: Value) -> Value:
    return b.op("ember.slice", g, shape=list(tensor_type(x).shape), **_window(producer(out)))


@rule("ember.concat")
def _concat(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
    """Each operand's gradient is its own window of g along the axis."""
    g = single(gs)
    axis = normalize_axes(op.name, [op.attributes["axis"]], tensor_type(g).rank)[0]
    starts = np.cumsum([0] + [tensor_type(v).shape[axis] for v in op.operands])

    def part(k: int) -> Callable[[], Value]:
        start = [0] * tensor_type(g).rank
        start[axis] = int(starts[k])
        return lambda: b.op("ember.slice", g, start=start, step=[1] * tensor_type(g).rank,
                            shape=list(tensor_type(op.operands[k]).shape))

    return each(needs, *map(part, range(len(op.operands))))


@rule("ember.matmul", bound="compute")
def _matmul(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
    g, (x, y) = single(gs), op.operands
    return each(needs, lambda: unbroadcast(b, b.op("ember.matmul", g, mT(b, y)), tensor_type(x)),
                lambda: unbroadcast(b, b.op("ember.matmul", mT(b, x), g), tensor_type(y)))


# --- nn ops: dedicated rules, cheaper and more stable than differentiating a lowering ---

@rule("nn.linear", bound="compute")
def _linear(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
    """x[..., d] @ w[d, o] + b[o]: leading dims of x and g are flattened into rows."""
    g, (x, w, *_) = single(gs), op.operands
    rows = math.prod(tensor_type(x).shape[:-1])  # not size // d: d may be 0

    def flat(v: Value) -> Value:
        shape = [rows, tensor_type(v).shape[-1]]
        return v if list(tensor_type(v).shape) == shape else b.op("ember.reshape", v, shape=shape)

    def dx() -> Value:
        dx = b.op("ember.matmul", flat(g), b.op("ember.transpose", w, perm=[1, 0]))
        t = tensor_type(x)
        return b.op("ember.reshape", dx, shape=list(t.shape)) if t.rank != 2 else dx

    return each(needs, dx,
                lambda: b.op("ember.matmul", b.op("ember.transpose", flat(x), perm=[1, 0]),
                             flat(g)),
                lambda: b.op("ember.reduce_sum", flat(g), axes=[0], keepdims=False))


@rule("nn.log_softmax")
def _log_softmax(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
    g, out, axis = single(gs), op.result, op.attributes["axis"]
    total = b.op("ember.reduce_sum", g, axes=[axis], keepdims=True)
    return [b.op("ember.sub", g, b.op("ember.mul", b.op("ember.exp", out), total))]


@rule("nn.softmax")
def _softmax(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
    g, out, axis = single(gs), op.result, op.attributes["axis"]
    dot = b.op("ember.reduce_sum", b.op("ember.mul", g, out), axes=[axis], keepdims=True)
    return [b.op("ember.mul", out, b.op("ember.sub", g, dot))]


@rule("nn.cross_entropy")
def _cross_entropy(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
    """d loss / d logits = (softmax(logits) - one_hot(labels)) / N * g; with ignore_index,
    ignored rows get no gradient and N counts the kept rows."""
    g, (logits, labels) = single(gs), op.operands
    n, c = tensor_type(logits).shape
    dtype = logits.type.dtype
    onehot = b.op("ember.one_hot", labels, num_classes=c, dtype=dtype)
    diff = b.op("ember.sub", softmax(b, logits, 1), onehot)
    ignore = op.attributes.get("ignore_index")
    if ignore is None:
        return [b.op("ember.mul", diff, b.op("ember.div", g, const(b, n, dtype))), None]
    keep = kept_rows(b, labels, ignore, dtype)
    count = b.op("ember.reduce_sum", keep, axes=[0], keepdims=False)
    per_row = b.op("ember.reshape", b.op("ember.mul", keep, b.op("ember.div", g, count)),
                   shape=[n, 1])
    return [b.op("ember.mul", diff, per_row), None]


# --- new core ops -------------------------------------------------------------------

@unary("ember.erf")
def _erf(b: Builder, g: Value, x: Value, out: Value) -> Value:  # d/dx erf(x) = 2/sqrt(pi) exp(-x^2)
    dtype = x.type.dtype
    e = b.op("ember.exp", b.op("ember.neg", b.op("ember.mul", x, x)))
    return b.op("ember.mul", g, b.op("ember.mul", e, const(b, 2 / math.sqrt(math.pi), dtype)))


@rule("ember.allreduce", bound="compute")
def _allreduce(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
    """Every rank's loss reads the sum: each rank's input gets the sum of their gradients."""
    return [b.op("ember.allreduce", single(gs))]


@rule("ember.dropout")
def _dropout(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
    """The same op (same seed, key and rng operand) on the gradient: the mask is drawn again
    from the counter, never stored."""
    g, rng = single(gs), op.operands[1]
    return each(needs, lambda: b.op("ember.dropout", g, rng, **pick(op, ("p", "seed", "key"))),
                lambda: None)


@rule("ember.gather")
def _gather(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
    g, (table, idx) = single(gs), op.operands
    return each(needs,
                lambda: b.op("ember.scatter_add", idx, g, shape=list(tensor_type(table).shape)),
                lambda: None)


@rule("ember.scatter_add")
def _scatter_add(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
    g, (idx, _) = single(gs), op.operands
    return each(needs, lambda: None, lambda: b.op("ember.gather", g, idx, axis=0))


def _conv(op: Operation, **extra: Any) -> dict[str, Any]:
    return {**pick(op, CONV_ATTRS), **extra}


@rule("ember.conv2d", bound="compute")
def _conv2d(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
    g, (x, w) = single(gs), op.operands[:2]
    return each(needs,
                lambda: b.op("ember.conv2d_grad_input", g, w,
                             **_conv(op, input_shape=list(tensor_type(x).shape))),
                lambda: b.op("ember.conv2d_grad_weight", x, g,
                             **_conv(op, weight_shape=list(tensor_type(w).shape))))


@rule("ember.conv2d_grad_input", bound="compute")
def _conv2d_grad_input(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
    """y = conv2d's adjoint in its input; linear in g (adjoint: conv2d) and in w."""
    dy, (g, w) = single(gs), op.operands
    return each(needs, lambda: b.op("ember.conv2d", dy, w, **_conv(op)),
                lambda: b.op("ember.conv2d_grad_weight", dy, g,
                             **_conv(op, weight_shape=list(tensor_type(w).shape))))


@rule("ember.conv2d_grad_weight", bound="compute")
def _conv2d_grad_weight(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
    dw, (x, g) = single(gs), op.operands
    return each(needs,
                lambda: b.op("ember.conv2d_grad_input", g, dw,
                             **_conv(op, input_shape=list(tensor_type(x).shape))),
                lambda: b.op("ember.conv2d", x, dw, **_conv(op)))


@unary("ember.max_pool2d")
def _max_pool2d(b: Builder, g: Value, x: Value, out: Value) -> Value:
    return b.op("ember.max_pool2d_grad", x, g, **pick(producer(out), POOL_ATTRS))


@unary("ember.avg_pool2d")
def _avg_pool2d(b: Builder, g: Value, x: Value, out: Value) -> Value:
    return b.op("ember.avg_pool2d_grad", g, **pick(producer(out), POOL_ATTRS),
                input_shape=list(tensor_type(x).shape))


@unary("ember.avg_pool2d_grad")
def _avg_pool2d_grad(b: Builder, g: Value, x: Value, out: Value) -> Value:
    # linear in its operand; the adjoint is the pool itself
    return b.op("ember.avg_pool2d", g, **pick(producer(out), POOL_ATTRS))


# --- new nn ops: dedicated rules -----------------------------------------------------

@rule("nn.conv2d", bound="compute")
def _nn_conv2d(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
    g = single(gs)
    dx, dw = _conv2d(b, op, gs, needs[:2])
    return [dx, dw] + ([b.op("ember.reduce_sum", g, axes=[0, 2, 3], keepdims=False)]
                       if len(needs) == 3 and needs[2] else [None] * (len(needs) - 2))


def _norm_input_grad(b: Builder, dxhat: Value, xhat: Value, rstd: Value, axes: list[int]) -> Value:
    """dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) over `axes`: the
    closed form of normalization's backward, with no division by small numbers."""
    m1 = b.op("ember.reduce_mean", dxhat, axes=axes, keepdims=True)
    m2 = b.op("ember.reduce_mean", b.op("ember.mul", dxhat, xhat), axes=axes, keepdims=True)
    centered = b.op("ember.sub", b.op("ember.sub", dxhat, m1), b.op("ember.mul", xhat, m2))
    return b.op("ember.mul", centered, rstd)


def _sum_to(b: Builder, v: Value, axes: list[int]) -> Value:
    return b.op("ember.reduce_sum", v, axes=axes, keepdims=False) if axes else v


@rule("nn.layer_norm")
def _layer_norm(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
    g, (x, *affine) = single(gs), op.operands
    rank = tensor_type(x).rank
    axes = sorted(a % rank for a in op.attributes["axes"])
    lead = list(range(axes[0]))
    xhat, rstd, _, _ = normalize(b, x, axes, op.attributes["eps"])  # CSE'd with the forward
    dxhat = b.op("ember.mul", g, affine[0]) if affine else g
    return each(needs, lambda: _norm_input_grad(b, dxhat, xhat, rstd, axes),
                lambda: _sum_to(b, b.op("ember.mul", g, xhat), lead),
                lambda: _sum_to(b, g, lead))


@rule("nn.batch_norm")
def _batch_norm(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
    """Only y (result 0) is differentiable; the running statistics get no gradient."""
    (g, *_), (x, gamma, *_), a = gs, op.operands, op.attributes
    if g is None:
        return [None] * 5
    rank = tensor_type(x).rank
    axes = [0, *range(2, rank)]
    if a["training"]:
        xhat, rstd, _, _ = normalize(b, x, axes, a["eps"])
    else:
        rm, rv = (channel(b, v, rank) for v in op.operands[3:])
        rstd = b.op("ember.rsqrt", b.op("ember.add", rv, const(b, a["eps"], x.type.dtype)))
        xhat = b.op("ember.mul", b.op("ember.sub", x, rm), rstd)
    dxhat = b.op("ember.mul", g, channel(b, gamma, rank))

    def dx() -> Value:
        if a["training"]:
            return _norm_input_grad(b, dxhat, xhat, rstd, axes)
        return b.op("ember.mul", dxhat, rstd)

    return each(needs, dx, lambda: _sum_to(b, b.op("ember.mul", g, xhat), axes),
                lambda: _sum_to(b, g, axes), lambda: None, lambda: None)


@unary("nn.gelu")
def _gelu(b: Builder, g: Value, x: Value, out: Value) -> Value:
    dtype = x.type.dtype

    def c(v: float) -> Value:
        return const(b, v, dtype)

    if producer(out).attributes["approximate"] == "tanh":
        # y = x/2 (1 + t), t = tanh(u), u = C (x + A x^3): y' = (1 + t)/2 + x/2 (1 - t^2) u'
        x2 = b.op("ember.mul", x, x)
        u = b.op("ember.mul", b.op("ember.add", x, b.op("ember.mul", b.op("ember.mul", x2, x),
                                                          c(GELU_A))), c(GELU_C))
        t = b.op("ember.tanh", u)
        du = b.op("ember.mul", b.op("ember.add", b.op("ember.mul", x2, c(3 * GELU_A * GELU_C)),
                                    c(GELU_C)), b.op("ember.sub", c(1), b.op("ember.mul", t, t)))
        d = b.op("ember.mul", b.op("ember.add", b.op("ember.add", t, c(1)),
                                   b.op("ember.mul", x, du)), c(0.5))
    else:
        # y = x Phi(x): y' = Phi(x) + x phi(x), phi(x) = exp(-x^2/2) / sqrt(2 pi)
        cdf = b.op("ember.mul", b.op("ember.add", b.op("ember.erf", b.op(
            "ember.mul", x, c(1 / math.sqrt(2)))), c(1)), c(0.5))
        pdf = b.op("ember.mul", b.op("ember.exp", b.op("ember.mul", b.op("ember.mul", x, x),
                                                       c(-0.5))), c(1 / math.sqrt(2 * math.pi)))
        d = b.op("ember.add", cdf, b.op("ember.mul", x, pdf))
    return b.op("ember.mul", g, d)


@rule("nn.attention", bound="compute")
def _attention(b: Builder, op: Operation, gs: Grads, needs: list[bool]) -> Grads:
    """p = softmax(q k^T s + mask) is recomputed (as the decomposition spells it, so CSE
    shares it with a decomposed forward); masked entries have p = 0 and get no gradient."""
    g, (q, k, v), a = single(gs), op.operands, op.attributes
    p = attention_probs(b, q, k, a["causal"], a["scale"])
    if not (needs[0] or needs[1]):
        return [None, None, b.op("ember.matmul", mT(b, p), g)]
    dp = b.op("ember.matmul", g, mT(b, v))
    dot = b.op("ember.reduce_sum", b.op("ember.mul", dp, p), axes=[tensor_type(p).rank - 1],
               keepdims=True)
    ds = b.op("ember.mul", b.op("ember.mul", p, b.op("ember.sub", dp, dot)),
              const(b, a["scale"], q.type.dtype))
    return each(needs, lambda: b.op("ember.matmul", ds, k),
                lambda: b.op("ember.matmul", mT(b, ds), q),
                lambda: b.op("ember.matmul", mT(b, p), g))


def bound_class(op_name: str) -> str | None:
    """"compute" (keep the result) or "memory" (recompute it); None for ops without a rule."""
    r = RULES.get(op_name)
    return r.bound if r else None
