"""The `plan-memory` pass: plans the arena (ir/memory_plan.py, where the planner lives so
that backends can place their buffers with it) and records the numbers on the graph.

`plan-memory` stores `ember.peak_bytes` and `ember.arena_bytes` on the graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..ir import Graph
from ..ir.memory_plan import plan_memory
from .manager import Pass, register_pass


@register_pass
@dataclass(frozen=True)
class PlanMemory(Pass):
    """Plans the arena and records `ember.peak_bytes` and `ember.arena_bytes`."""

    name: ClassVar[str] = "plan-memory"

    def apply(self, graph: Graph) -> Graph:
        p = plan_memory(graph)
        graph.attributes["ember.peak_bytes"] = p.peak_bytes
        graph.attributes["ember.arena_bytes"] = p.arena_bytes
        return graph

