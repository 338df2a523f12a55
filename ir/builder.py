"""Builds operations at an insertion point, inferring result types from op definitions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .core import Block, Location, Operation, Region, Value
from .opdef import InferenceError, lookup
from .types import Type


class Builder:
    """Creates ops at the end of a block, or before an anchor op in it."""

    def __init__(self, block: Block, before: Operation | None = None, loc: Location | None = None):
        self.block = block
        self.before = before
        self.loc = loc
        self._at = 0  # where `before` was last seen in the block, so a run of inserts is O(1)

    @classmethod
    def before_op(cls, op: Operation) -> Builder:
        assert op.parent is not None, f"{op.name} is not in a block"
        return cls(op.parent, before=op, loc=op.loc)

    def insert(self, op: Operation) -> Operation:
        if self.before is None:
            return self.block.append(op)
        ops = self.block.ops
        if not (self._at < len(ops) and ops[self._at] is self.before):
            self._at = ops.index(self.before)
        self.block.insert(self._at, op)
        self._at += 1
        return op

    def create(self, name: str, operands: Sequence[Value] = (),
               attrs: dict[str, Any] | None = None,
               result_types: Sequence[Type] | None = None, regions: Sequence[Region] = (),
               loc: Location | None = None) -> Operation:
        """Create and insert `name`; result types are inferred unless given."""
        attrs = dict(attrs or {})
        if result_types is None:
            d = lookup(name)
            if d is None:
                raise InferenceError(f"{name} is not a registered op: give its result types")
            result_types = d.result_types([v.type for v in operands], attrs)
            if result_types is None:
                raise InferenceError(f"{name} cannot infer its result types: give them")
        op = Operation(name, list(operands), list(result_types), attrs, list(regions),
                       loc or self.loc)
        return self.insert(op)

    def op(self, name: str, *operands: Value, **attrs: Any) -> Value:
        """Create a single-result op and return its result: `b.op("ember.add", x, y)`."""
        return self.create(name, list(operands), attrs).result
