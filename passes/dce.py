"""`dce`: erase pure ops whose results are unused (unused `ember.param`s included)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..ir import Block, Graph, Operation, has_trait
from .manager import Pass, register_pass


def is_dead(op: Operation) -> bool:
    return has_trait(op.name, "pure") and not any(r.uses for r in op.results)


def erase_dead(block: Block) -> bool:
    """One backward sweep erases whole dead chains: users come after what they use."""
    changed = False
    for op in reversed(list(block.ops)):
        for region in op.regions:
            for b in region.blocks:
                changed |= erase_dead(b)
        if is_dead(op):
            op.erase()
            changed = True
    return changed


@register_pass
@dataclass(frozen=True)
class Dce(Pass):
    name: ClassVar[str] = "dce"

    def apply(self, graph: Graph) -> Graph:
        while erase_dead(graph.body):
            pass
        return graph
