"""`cse`: merge identical pure ops (same name, operands, attributes, result types).

Ops with regions or the `random` trait are never merged: two dropout masks with equal
attributes are still two draws. Nor are ops marked `ember.recompute` (the copies the
recompute pass makes on purpose, so that a value is recomputed instead of kept).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..ir import Block, Graph, Operation, has_trait
from ..ir.dense import dense_key
from .manager import Pass, register_pass


def freeze(v: Any) -> Any:
    """A hashable key for an attribute value; arrays compare by dtype, shape and bytes (a
    splat by its one element, so a huge splat is never materialized)."""
    if isinstance(v, np.ndarray):
        return dense_key(v)
    if isinstance(v, list | tuple):
        return (type(v).__name__, *map(freeze, v))
    if isinstance(v, dict):
        return ("dict", *sorted((k, freeze(x)) for k, x in v.items()))
    return (type(v).__name__, v)


def op_key(op: Operation) -> tuple[Any, ...] | None:
    if (op.regions or not has_trait(op.name, "pure") or has_trait(op.name, "random")
            or op.attributes.get("ember.recompute")):
        return None
    return (op.name, tuple(map(id, op.operands)), freeze(op.attributes),
            tuple(str(r.type) for r in op.results))


def cse_block(block: Block, seen: dict[tuple[Any, ...], Operation]) -> bool:
    """Nested blocks see the ops above them (they are dominated by them), not vice versa.
    Merged ops leave the block in one pass at the end (erasing each from the op list
    would rescan it, quadratic in the block's length)."""
    changed = False
    merged: set[Operation] = set()
    for op in block.ops:
        for region in op.regions:
            for b in region.blocks:
                changed |= cse_block(b, dict(seen))
        key = op_key(op)
        if key is None:
            continue
        if key in seen:
            for old, new in zip(op.results, seen[key].results):
                old.replace_all_uses_with(new)
            op.drop_operands()
            op.parent = None
            merged.add(op)
        else:
            seen[key] = op
    if merged:
        block.ops = [op for op in block.ops if op not in merged]
    return changed or bool(merged)


@register_pass
@dataclass(frozen=True)
class Cse(Pass):
    name: ClassVar[str] = "cse"

    def apply(self, graph: Graph) -> Graph:
        cse_block(graph.body, {})
        return graph
