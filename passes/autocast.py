"""`autocast{dtype=bf16|f16}`: mixed precision as torch.autocast has it, on the traced forward.

Every op whose cost is its multiply-adds (the `compute_bound` trait: matmul, linear,
convolutions, attention) gets its f32 operands cast to `dtype`, so it runs, and returns its
result, in low precision (accumulating in f32: what an op on bf16/f16 means,
ir/precision.py). Data movement (the `movement` trait) on such results stays low; every
other op (elementwise ops, reductions, softmax, norms, losses) and the graph's results get
them cast back to f32, so statistics and losses stay f32. Only f32 values are cast: f64 ones,
and values that were bf16/f16 in the trace, are the user's choice.

It runs before autodiff, which differentiates through the casts: the backward of an op run
in low precision runs in it too, and the gradient of an f32 param comes out f32, so the
params, their update and the optimizer's state stay f32 (master weights).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..ir import Builder, Graph, Operation, Value, has_trait, lookup
from ..ir.types import LOW_PRECISION
from .manager import Pass, PipelineError, register_pass


@register_pass
@dataclass(frozen=True)
class Autocast(Pass):
    name: ClassVar[str] = "autocast"
    dtype: str = "bf16"

    def check(self, graph: Graph) -> None:
        if self.dtype not in LOW_PRECISION:
            listed = ", ".join(sorted(LOW_PRECISION))
            raise PipelineError(f"autocast: dtype must be one of {listed}, got {self.dtype!r}")
        if "ember.grads" in graph.attributes or "ember.updates" in graph.attributes:
            raise PipelineError("autocast runs on the forward: run it before autodiff")

    def apply(self, graph: Graph) -> Graph:
        self.check(graph)
        low: set[Value] = set()  # the values this pass made low precision
        casts: dict[tuple[Value, str], Value] = {}  # each value cast to each dtype once

        def cast(op: Operation, v: Value, dtype: str) -> Value:
            if (v, dtype) not in casts:
                casts[v, dtype] = Builder.before_op(op).op("ember.cast", v, dtype=dtype)
            return casts[v, dtype]

        for op in list(graph.ops):  # not the casts it adds
            floats = [v for v in op.operands if v.type.is_float]
            if has_trait(op.name, "compute_bound") and floats \
                    and all(v in low or v.type.dtype == "f32" for v in floats):
                for i, v in enumerate(op.operands):
                    if v.type.dtype == "f32":
                        op.set_operand(i, cast(op, v, self.dtype))
                low.update(_retyped(op))
            elif has_trait(op.name, "movement") and floats and all(v in low for v in floats):
                low.update(_retyped(op))
            elif op.name != "ember.cast":  # a cast takes any dtype
                for i, v in enumerate(op.operands):
                    if v in low:
                        op.set_operand(i, cast(op, v, "f32"))
        return graph


def _retyped(op: Operation) -> list[Value]:
    """`op`'s results, given the types its declaration infers from its (now low-precision)
    operands."""
    d = lookup(op.name)
    types = None if d is None else d.result_types([v.type for v in op.operands], op.attributes)
    assert types is not None, f"{op.name} is traced, so registered and inferring its types"
    for r, t in zip(op.results, types, strict=True):
        r.type = t
    return op.results
