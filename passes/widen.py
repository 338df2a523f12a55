"""`widen-low-precision`: every op on bf16 or f16 values runs in f32, between casts.

A backend with f32 kernels only (cpu, cuda) needs this legalization: an op with a bf16 or
f16 operand or result becomes the same op on f32 operands (each cast up, exactly), its
bf16/f16 results cast back down. That is the meaning of the op (ir/precision.py: computed
in f32, the result rounded once), so no value changes, and an op without a low-precision
kernel is never refused. Casts stay, but one between bf16/f16 and a dtype other than f32
goes through f32 (as the cast's meaning does), so a backend converts only f32 <-> bf16/f16.
Data movement (the `movement` trait), constants and params keep their dtype: moving bits
needs no arithmetic, and half the bytes. `decompose` widens `nn.*` ops the same way
(`widen`) before lowering them, so their statistics stay in f32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..ir import Builder, Graph, Operation, Value, has_trait
from ..ir.rewriter import Rewriter, apply_patterns
from ..ir.types import LOW_PRECISION
from .manager import Pass, register_pass
from .narrow import tensor_type

KEPT = frozenset({"ember.constant", "ember.param", "func.return"})
RECOMPUTE = "ember.recompute"  # a recomputed op's casts are recomputed copies too


def is_low(v: Value) -> bool:
    return v.type.dtype in LOW_PRECISION


def needs_widening(op: Operation) -> bool:
    """Whether `op` computes on bf16/f16 values (or casts them to or from a dtype other
    than f32), so runs in f32 here."""
    if op.name in KEPT or op.regions or has_trait(op.name, "movement"):
        return False
    if op.name == "ember.cast":
        ends = {op.operands[0].type.dtype, op.result.type.dtype}
        return len(ends) == 2 and "f32" not in ends and bool(ends & LOW_PRECISION)
    return any(map(is_low, (*op.operands, *op.results)))


def widen(b: Builder, op: Operation) -> list[Value]:
    """`op`'s results, computed in f32: by its `twin` (the results cast back), or for a
    cast, by two casts through f32."""
    if op.name == "ember.cast":
        return [_cast(b, _cast(b, op.operands[0], "f32", op), op.result.type.dtype, op)]
    new = twin(b, op)
    return [_cast(b, n, r.type.dtype, op) if is_low(r) else n
            for n, r in zip(new.results, op.results)]


def twin(b: Builder, op: Operation) -> Operation:
    """A copy of `op` on f32: its bf16/f16 operands cast up (exactly), such results f32."""
    attrs = dict(op.attributes)
    if attrs.get("dtype") in LOW_PRECISION:  # the result dtype of a one_hot
        attrs["dtype"] = "f32"
    types = [tensor_type(r).with_dtype("f32") if is_low(r) else r.type for r in op.results]
    operands = [_cast(b, v, "f32", op) if is_low(v) else v for v in op.operands]
    return b.create(op.name, operands, attrs, types)


def _cast(b: Builder, v: Value, dtype: str, of: Operation) -> Value:
    """`v` cast to `dtype` for the op `of`: a recomputed copy where `of` is one."""
    mark = {RECOMPUTE: of.attributes[RECOMPUTE]} if RECOMPUTE in of.attributes else {}
    return b.create("ember.cast", [v], {"dtype": dtype, **mark}).result


@register_pass
@dataclass(frozen=True)
class WidenLowPrecision(Pass):
    name: ClassVar[str] = "widen-low-precision"

    def apply(self, graph: Graph) -> Graph:
        def rewrite(op: Operation, rw: Rewriter) -> bool:
            return needs_widening(op) and rw.replace(op, *widen(rw.builder(op), op))

        apply_patterns(graph, {"*": [rewrite]})
        return graph
