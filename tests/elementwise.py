"""The registry's elementwise ops, as the op-by-op tests take them: a test of "every unary
op" parametrizes over these lists, so an op is tested on every backend once it is declared.
cmp, select and cast (attributes, i1 operands) have tests of their own."""

from ember.ir import OPS
from ember.ir.opdef import ops_with


def _named(arity: tuple[int, int]) -> list[str]:
    return [n.removeprefix("ember.") for n in ops_with("elementwise", "ember")
            if OPS[n].arity == arity and not OPS[n].attrs]


BINARY = _named((2, 2))
UNARY = _named((1, 1))
UNARY_INT = [n for n in UNARY if not OPS[f"ember.{n}"].float_only]  # also on integers
POSITIVE = {"log", "sqrt", "rsqrt"}  # defined for x > 0 only; the others on every real
