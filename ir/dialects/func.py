"""The `func` ops ember uses: `func.return` (the graph's terminator)."""

from typing import Any

from ..opdef import OpDef, register
from ..types import TensorType, Type


@register
class Return(OpDef):
    name = "func.return"
    traits = frozenset({"terminator"})
    arity = (0, None)

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        return []
