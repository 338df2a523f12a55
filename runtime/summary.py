"""`em.summary(model, *example_inputs)`: a torchinfo-style table of a model, one row per
module call, with its output shape, its params and the FLOPs of the ops it made.

The model is traced once (nothing is initialized or compiled). Each module call on the
trace's scope stack is a row; its ops are those recorded while it was called, nested
calls included, and its output shape is the result of the last of them (a call that
makes no op, such as Dropout in eval mode, shows none). It lives in runtime/ because it
traces, which the frontend's Module cannot do for itself.

FLOPs: 2 per multiply-add of the compute-bound ops (matmul, linear, convolutions,
attention); one per element read for elementwise ops, reductions and the other `nn.*`
layers (softmax, norms); none for the rest (layout ops, pooling, params, constants).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

from ..frontend import context
from ..frontend.module import Module
from ..frontend.trace import trace_function
from ..ir import Operation, has_trait, numpy_dtype


def _size(shape) -> int:
    return math.prod(shape)


def _conv_macs(op: Operation) -> int:  # output elements x (c_in / groups) x kh x kw
    out, w = op.results[0].type.shape, op.operands[1].type.shape
    return _size(out) * _size(w[1:])


def _attention_macs(op: Operation) -> int:  # q k^T, then weights @ v
    q, k, v = (t.type.shape for t in op.operands)
    return _size(q[:-1]) * k[-2] * (q[-1] + v[-1])


# the multiply-adds of each compute-bound op, one line per op (tests check none is missing)
MACS: dict[str, Callable[[Operation], int]] = {
    "ember.matmul": lambda op: _size(op.results[0].type.shape) * op.operands[0].type.shape[-1],
    "nn.linear": lambda op: _size(op.results[0].type.shape) * op.operands[1].type.shape[0],
    "ember.conv2d": _conv_macs,
    "nn.conv2d": _conv_macs,
    "ember.conv2d_nhwc": lambda op: (_size(op.results[0].type.shape)  # weight [kh, kw, c/g, o]
                                     * _size(op.operands[1].type.shape[:3])),
    "ember.conv2d_grad_input": lambda op: (_size(op.operands[0].type.shape)
                                           * _size(op.operands[1].type.shape[1:])),
    "ember.conv2d_grad_weight": lambda op: (_size(op.operands[1].type.shape)
                                            * _size(op.results[0].type.shape[1:])),
    "nn.attention": _attention_macs,
}


def flops(op: Operation) -> int:
    """The FLOPs of one op, as the module docstring counts them."""
    if op.name in MACS:
        return 2 * MACS[op.name](op)
    counted = (has_trait(op.name, "elementwise") or has_trait(op.name, "reduction")
               or op.dialect == "nn")
    return sum(_size(v.type.shape) for v in op.operands) if counted else 0


@dataclass
class Row:
    path: str  # "" for the model itself
    kind: str  # the module's class
    depth: int
    output: tuple | None  # shape of the last result the call made
    params: int
    flops: int


@dataclass
class Summary:
    rows: list[Row]
    params: int
    trainable: int
    buffers: int
    param_bytes: int
    flops: int  # of the whole forward, for the example inputs' batch

    def __str__(self) -> str:
        names = ["  " * r.depth + (f"{r.path} ({r.kind})" if r.path else r.kind)
                 for r in self.rows]
        shapes = [str(list(r.output)) if r.output is not None else "-" for r in self.rows]
        w0 = max(len("Layer (type)"), *map(len, names))
        w1 = max(len("Output shape"), *map(len, shapes))
        head = f"{'Layer (type)':<{w0}}  {'Output shape':<{w1}}  {'Params':>12}  {'FLOPs':>10}"
        rule = "=" * len(head)
        body = [f"{n:<{w0}}  {s:<{w1}}  {r.params:>12,}  {_si(r.flops):>10}"
                for n, s, r in zip(names, shapes, self.rows)]
        return "\n".join([rule, head, rule, *body, rule,
                          f"Total params: {self.params:,} ({self.trainable:,} trainable, "
                          f"{_si(self.param_bytes)}B)",
                          f"Buffers: {self.buffers:,}",
                          f"Forward FLOPs: {_si(self.flops)} for this batch", rule])


def _si(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def summary(model: Module, *example_inputs) -> Summary:
    """The table of `model` on inputs like these (arrays or TensorSpecs, as em.compile)."""
    paths = {id(m): path for path, m in reversed(model.named_modules())}
    calls: list[tuple[Module, int, int, int]] = []  # module, depth, first op, last op

    def record(*xs):
        trace = context.active()
        enter = trace.scope

        @contextmanager
        def scope(module: Module):
            at = len(calls)
            calls.append((module, len(trace.scopes), _made(trace), -1))
            with enter(module):
                yield
            calls[at] = (*calls[at][:3], _made(trace))

        trace.scope = scope  # this trace only: Module.__call__ enters it for every call
        return model(*xs)

    graph = trace_function(record, model, example_inputs)
    made = [op for op in graph.ops if op.name not in ("ember.param", "func.return")]
    rows = []
    for module, depth, start, stop in calls:
        ops = made[start:stop]
        output = ops[-1].results[0].type.shape if ops and ops[-1].results else None
        rows.append(Row(paths.get(id(module), "?"), type(module).__name__, depth, output,
                        module.num_params(), sum(map(flops, ops))))
    params = [p for _, p in model.named_parameters()]
    return Summary(rows, model.num_params(), sum(p.size for p in params if p.requires_grad),
                   model.num_buffers(),
                   sum(p.size * numpy_dtype(p.dtype).itemsize for p in params),
                   sum(map(flops, made)))


def _made(trace) -> int:
    """Ops the trace has made so far, params aside (they are inserted before all others)."""
    return len(trace.graph.body.ops) - len(trace.param_tensors)
