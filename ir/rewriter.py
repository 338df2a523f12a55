"""Pattern rewriting with a greedy driver, as in MLIR and tinygrad's PatternMatcher.

A pattern is a function `(op, rewriter) -> bool` registered for op names; it returns
True when it changed the IR. The driver applies patterns until nothing changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .builder import Builder
from .core import Graph, Operation, Value

Pattern = Callable[[Operation, "Rewriter"], bool]


class Rewriter:
    """What a pattern may do: build ops before the matched op and replace it."""

    def __init__(self) -> None:
        self.changed = False

    def builder(self, op: Operation) -> Builder:
        return Builder.before_op(op)

    def op(self, at: Operation, name: str, *operands: Value, **attrs: Any) -> Value:
        """Create a single-result op before `at` (inheriting its location)."""
        return self.builder(at).op(name, *operands, **attrs)

    def replace(self, op: Operation, *new_values: Value) -> bool:
        """Replace every result of `op` with `new_values` and erase it."""
        for old, new in zip(op.results, new_values, strict=True):
            if old.type != new.type:
                raise TypeError(f"replacing {op.name} result {old.type} with {new.type}")
            old.replace_all_uses_with(new)
        op.erase()
        self.changed = True
        return True


def apply_patterns(graph: Graph, patterns: dict[str, list[Pattern]],
                   max_rounds: int = 32) -> bool:
    """Apply `patterns` (keyed by op name, "*" for every op) to a fixpoint."""
    changed_any = False
    for _ in range(max_rounds):
        rw = Rewriter()
        for op in list(graph.walk()):
            if op.parent is None:  # erased by an earlier rewrite this round
                continue
            for pattern in patterns.get(op.name, []) + patterns.get("*", []):
                if pattern(op, rw):
                    break
        changed_any |= rw.changed
        if not rw.changed:
            return changed_any
    return changed_any
