"""Checks the IR's rules: SSA order, registered ops, inferred types, terminators."""

from __future__ import annotations

from .core import Block, Graph, Operation, Value
from .opdef import InferenceError, VerifyError, lookup

# Dialects ember defines: an unknown op name in one of these is an error. Ops of other
# dialects are opaque, as with mlir-opt --allow-unregistered-dialect.
OWN_DIALECTS = frozenset({"ember", "nn", "kernel", "func"})


def verify(graph: Graph) -> Graph:
    """Raise VerifyError naming the first broken op; return the graph when it is valid."""
    defined: set[Value] = set()
    _verify_block(graph.body, defined, top=True)
    return graph


def _where(op: Operation) -> str:
    return f"'{op.name}'" + (f" at {op.loc}" if op.loc else "")


def _verify_block(block: Block, defined: set[Value], top: bool) -> None:
    defined.update(block.args)
    if not block.ops:
        raise VerifyError("empty block: a block must end with a terminator")
    for i, op in enumerate(block.ops):
        for j, v in enumerate(op.operands):
            if v not in defined:
                raise VerifyError(f"op {_where(op)} uses operand #{j} before it is defined")
        d = lookup(op.name)
        is_last = i == len(block.ops) - 1
        if d is None:
            if op.dialect in OWN_DIALECTS:
                raise VerifyError(f"unknown op {_where(op)}: dialect '{op.dialect}' has no such op")
        else:
            if ("terminator" in d.traits) != is_last:
                what = "must end its block" if is_last is False else "is not a terminator"
                raise VerifyError(f"op {_where(op)} {what}"
                                  if "terminator" in d.traits else
                                  f"block ends with {_where(op)}, which is not a terminator")
            try:
                inferred = d.result_types([v.type for v in op.operands], op.attributes)
            except InferenceError as e:
                raise VerifyError(f"op {_where(op)}: {e}") from None
            actual = [r.type for r in op.results]
            if inferred is not None and list(inferred) != actual:
                raise VerifyError(f"op {_where(op)}: result types "
                                  f"({', '.join(map(str, actual))}) differ from inferred "
                                  f"({', '.join(map(str, inferred))})")
            if inferred is None and len(actual) != 1:
                raise VerifyError(f"op {_where(op)} must have exactly one result")
        if top and is_last and op.name != "func.return":
            raise VerifyError(f"graph must end with func.return, not {_where(op)}")
        for region in op.regions:
            for b in region.blocks:
                _verify_block(b, set(defined), top=False)
        defined.update(op.results)
