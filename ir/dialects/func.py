"""The `func` ops ember uses: `func.return` (the graph's terminator)."""

from ..opdef import OpDef, register


@register
class Return(OpDef):
    name = "func.return"
    traits = frozenset({"terminator"})
    arity = (0, None)

    @classmethod
    def infer(cls, operand_types, attrs):
        return []
