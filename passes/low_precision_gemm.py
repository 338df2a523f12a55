"""`low-precision-gemm`: a matmul that `widen-low-precision` left on exact f32 copies of
bf16 values multiplies the bf16 values themselves, its result the f32 sums.

Widening runs every op on bf16 values in f32 (passes/widen.py), so a mixed-precision
Linear reaches the backend as `matmul(reshape(cast_f32(x)), transpose(cast_f32(w)))`.
A backend with a bf16 GEMM (AMX tiles, AVX512-BF16) appends this pass: where both operands are such
casts, through single-operand data movement, the movement is applied to the bf16 values
and the matmul reads them (`ember.matmul {dtype = "f32"}`): the same products (a bf16
times a bf16 is exact in f32), summed in f32 as before, at the tiles' speed and half the
operand bytes. Only matmuls whose second operand is a matrix (a weight, or a weight's
gradient) change: batched ones (attention's) stay f32, for the fused attention kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..ir import Builder, Graph, Operation, Value, has_trait
from ..ir.rewriter import Rewriter, apply_patterns
from .manager import Pass, register_pass
from .narrow import tensor_type


def low_source(v: Value, dtype: str) -> list[Operation] | None:
    """The ops from a cast of a `dtype` value to f32 down to `v` (cast first, then each
    single-operand movement op), or None when `v` is not such a value."""
    chain: list[Operation] = []
    while v.op is not None and has_trait(v.op.name, "movement") and len(v.op.operands) == 1:
        chain.append(v.op)
        v = v.op.operands[0]
    op = v.op
    if op is None or op.name != "ember.cast" or op.operands[0].type.dtype != dtype:
        return None
    return [op, *reversed(chain)]


def replay(b: Builder, chain: list[Operation]) -> Value:
    """The movement ops of `chain` (after its cast) applied to the cast's operand."""
    v = chain[0].operands[0]
    for op in chain[1:]:
        v = b.op(op.name, v, **op.attributes)
    return v


@register_pass
@dataclass(frozen=True)
class LowPrecisionGemm(Pass):
    name: ClassVar[str] = "low-precision-gemm"
    dtype: str = "bf16"

    def apply(self, graph: Graph) -> Graph:
        def rewrite(op: Operation, rw: Rewriter) -> bool:
            if "dtype" in op.attributes or tensor_type(op.operands[1]).rank != 2:
                return False
            a_chain, w_chain = (low_source(v, self.dtype) for v in op.operands)
            if a_chain is None or w_chain is None:
                return False
            b = rw.builder(op)
            a, w = replay(b, a_chain), replay(b, w_chain)
            return rw.replace(op, b.op("ember.matmul", a, w, dtype="f32", **op.attributes))

        apply_patterns(graph, {"ember.matmul": [rewrite]})
        return graph
